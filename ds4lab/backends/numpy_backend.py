"""Forwarding module, to be removed: the CPU reference executor is :mod:`ds4lab.executor.numpy_backend`."""

from ..executor.numpy_backend import HostToken, LazyBank, NumpyBackend  # noqa: F401
