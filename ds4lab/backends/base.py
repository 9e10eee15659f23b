"""Forwarding module, to be removed: the backend contract is :mod:`ds4lab.executor.base`."""

from ..executor.base import (HOST_QUERIES, Backend, BackendUnavailable, DeviceClock, Executor,  # noqa: F401
                             ModeledTime, RuntimeApi, can_capture)
