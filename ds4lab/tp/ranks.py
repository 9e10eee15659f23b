"""Ranks as threads: :func:`make_node` (the sim's :class:`~ds4lab.sim.devices.SimNode` or the GPUs'
:class:`~ds4lab.backends.cupy_nccl.CupyNode`) and :func:`run_ranks`, one thread per rank with its device current
and its own thread-local stream accessor."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


class RankTimeout(TimeoutError):
    """A rank's thread did not finish in time (it is left behind as a daemon thread)."""


def make_node(backend: str = "sim", n_devices: int = 2, *, seed: int = 1234, timing_only: bool = False,
              calibration=None, collective_timeout_s: float | None = None):
    """A node of ``n_devices`` devices: ``backend`` ``"sim"`` or ``"cupy"`` (NCCL through CuPy);
    ``collective_timeout_s`` default 5 s on the sim, 20 s on a GPU.

    Raises:
        ValueError: another backend name.
        ds4lab.executor.base.BackendUnavailable: ``cupy`` on a host with fewer GPUs, no CuPy or no NCCL (the message
            says which)."""
    if backend == "sim":
        from ..sim.devices import SimNode

        return SimNode(n_devices, seed=seed, timing_only=timing_only, calibration=calibration,
                       collective_timeout_s=5.0 if collective_timeout_s is None else collective_timeout_s)
    if backend == "cupy":
        from ..backends.cupy_nccl import CupyNode

        return CupyNode(n_devices, seed=seed,
                        collective_timeout_s=20.0 if collective_timeout_s is None else collective_timeout_s)
    raise ValueError(f"backend {backend!r}: a node is 'sim' or 'cupy'")


def run_ranks(node, fn: Callable[[int], Any], *, timeout_s: float, raise_first: bool = False) -> list:
    """``fn(rank)`` in one thread per device of ``node`` (``node.on_device`` first). Returns each rank's result or
    exception; a thread still running after ``timeout_s`` is left behind (daemon) as :class:`RankTimeout`. With
    ``raise_first`` the first rank's exception is raised, the rank named in ``exc.__notes__``."""
    out: list[Any] = [None] * node.n_devices

    def run(r: int) -> None:
        try:
            node.on_device(r)
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller, per rank
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True, name=f"ds4lab-rank{r}")
               for r in range(node.n_devices)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for r, t in enumerate(threads):
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            out[r] = RankTimeout(f"rank {r} still running after {timeout_s:g} s")
    if raise_first:
        raise_first_failure(out)
    return out


def raise_first_failure(out: list) -> None:
    """Raise the first exception among the per-rank results ``out`` (rank order), noted with its rank; return when
    every rank returned a value."""
    for r, v in enumerate(out):
        if isinstance(v, BaseException):
            if hasattr(v, "add_note"):
                v.add_note(f"raised on rank {r}")
            raise v


def enable_peer_access(node) -> dict:
    """Peer access 0 → 1 and 1 → 0 on ``node``: ``{"01": "enabled" | error name, "10": ...}`` (enabled earlier in the
    process counts); a refusal is recorded, not raised (``cudaMemcpyPeer`` still copies, through the host)."""
    from ..errors import RuntimeApiError

    out = {}
    for a, b in ((0, 1), (1, 0)):
        try:
            node.enable_peer_access(a, b)
            out[f"{a}{b}"] = "enabled"
        except RuntimeApiError as e:
            out[f"{a}{b}"] = "enabled" if e.name == "cudaErrorPeerAccessAlreadyEnabled" else e.name
    return out


__all__ = ["RankTimeout", "enable_peer_access", "make_node", "run_ranks"]
