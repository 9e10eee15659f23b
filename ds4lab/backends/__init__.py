"""Backends that run the decode token: ``cupy`` (GPU), ``numpy`` (CPU reference executor)."""

from __future__ import annotations

from .base import Backend, BackendUnavailable

BACKENDS = ("auto", "cupy", "numpy")


def make_backend(name: str = "auto", seed: int = 1234) -> Backend:
    """Create backend ``name``; ``auto`` picks ``cupy`` when a GPU is usable, else ``numpy``.

    Raises:
        ValueError: unknown backend name (the message lists the known ones).
        BackendUnavailable: ``cupy`` asked for explicitly but no GPU is usable (says why).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    if name in ("auto", "cupy"):
        from .cupy_backend import CupyBackend, gpu_usable

        ok, why = gpu_usable()
        if ok:
            return CupyBackend(seed=seed)
        if name == "cupy":
            raise BackendUnavailable(f"backend 'cupy' unavailable: {why}")
    from .numpy_backend import NumpyBackend

    return NumpyBackend(seed=seed)


__all__ = ["Backend", "BackendUnavailable", "BACKENDS", "make_backend"]
