"""Backends that run the decode token: ``cupy`` (GPU), ``sim`` (simulated CUDA runtime, modeled
times), ``numpy`` (CPU reference executor, no timing)."""

from __future__ import annotations

from .base import Backend, BackendUnavailable

BACKENDS = ("auto", "cupy", "numpy", "sim")


def make_backend(name: str = "auto", seed: int = 1234, *, timing_only: bool = False) -> Backend:
    """Create backend ``name``; ``auto`` picks ``cupy`` when a GPU is usable, else ``sim`` (the
    simulated runtime: its figures are modeled, and it says so). ``timing_only`` applies to ``sim``.

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
    if name in ("auto", "sim"):
        from ..sim.backend import SimBackend

        return SimBackend(seed=seed, timing_only=timing_only)
    from .numpy_backend import NumpyBackend

    return NumpyBackend(seed=seed)


__all__ = ["Backend", "BackendUnavailable", "BACKENDS", "make_backend"]
