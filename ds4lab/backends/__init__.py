"""Backends that run the decode token: ``cupy`` (GPU), ``sim`` (simulated CUDA runtime, modeled times), ``numpy`` (CPU
reference executor, no timing). :func:`make_backend` is the one factory."""

from __future__ import annotations

from ..executor.base import Backend, BackendUnavailable, DeviceClock, Executor, ModeledTime, RuntimeApi, can_capture

BACKENDS = ("auto", "cupy", "numpy", "sim")


def resolve(name: str, allowed=BACKENDS) -> str:
    """The concrete backend ``name`` stands for (``auto``: ``cupy`` when a GPU is usable, else ``sim``); builds none.
    Raises ValueError when ``name`` is unknown or not in ``allowed`` (the message lists the choices)."""
    if name not in BACKENDS or name not in allowed:
        raise ValueError(f"unknown backend {name!r} here; choose one of: {', '.join(allowed)}")
    if name != "auto":
        return name
    from .cupy_backend import gpu_usable

    return "cupy" if gpu_usable()[0] else "sim"


def make_backend(name: str = "auto", seed: int = 1234, *, timing_only: bool = False,
                 allowed=BACKENDS, compile_kernels: bool = False) -> Executor:
    """Create backend ``name`` (``auto``: ``cupy`` when a GPU is usable, else ``sim``, whose figures are modeled).
    ``seed``: weight seed (bit-identical weights on every backend); ``timing_only``: ``sim`` only, no numbers;
    ``allowed``: the names the caller accepts; ``compile_kernels``: ``cupy`` compiles every kernel now (no compile in
    a timed region).

    Raises:
        ValueError: unknown or disallowed backend name (the message lists the choices).
        BackendUnavailable: ``cupy`` asked for explicitly but no GPU is usable (says why)."""
    if name not in BACKENDS or name not in allowed:
        raise ValueError(f"unknown backend {name!r} here; choose one of: {', '.join(allowed)}")
    if name in ("auto", "cupy"):
        from .cupy_backend import CupyBackend, gpu_usable

        ok, why = gpu_usable()
        if ok:
            be = CupyBackend(seed=seed)
            if compile_kernels:
                be.compile_all()
            return be
        if name == "cupy":
            raise BackendUnavailable(f"backend 'cupy' unavailable: {why}")
    if name in ("auto", "sim"):
        from ..sim.backend import SimBackend

        return SimBackend(seed=seed, timing_only=timing_only)
    from ..executor.numpy_backend import NumpyBackend

    return NumpyBackend(seed=seed)


__all__ = ["Backend", "BackendUnavailable", "BACKENDS", "DeviceClock", "Executor", "ModeledTime", "RuntimeApi",
           "can_capture",
           "make_backend", "resolve"]
