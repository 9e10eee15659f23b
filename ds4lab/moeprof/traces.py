"""Trace sources: per-kernel records of the device work, for the ``cupti`` mode (and the in-graph
stamps of a timing-only sim, which compute no numbers).

On a GPU the records come from ds4lab's one process-wide CUPTI session
(:class:`ds4lab.backends.cupti.CuptiSession`: ``cupti-python``, an optional dependency imported
lazily); on ``sim`` the modeled timeline plays their part. Every
source has ``available``/``reason``, ``start()``, ``stop()`` and ``take()``, which returns
``(name, start_ns, end_ns, kind, graph)`` tuples of the kernels and memsets since the last take.
"""

from __future__ import annotations

from ..backends.cupti import KERNEL_KINDS, CuptiSession, cupti_available

__all__ = ["KERNEL_STAGE", "kernel_stage", "SimTrace", "CuptiTrace", "Unavailable", "cupti_available",
           "trace_source", "CuptiSession"]

#: Kernel name (prefix when it ends in ``_``) → stage, for trace records (CUPTI or the sim timeline).
KERNEL_STAGE = (("xq_quantize", "xq"), ("moe_count", "sort"), ("moe_prefix", "sort"), ("moe_scatter", "sort"),
                ("moe_tiles", "sort"), ("memset", "sort"), ("moe_gateup_", "gateup"), ("moe_midq", "midq"),
                ("moe_down_", "down"), ("moe_sum", "sum"),
                # ds4's path (kernels/moe_ds4.cu); its gate/up and down kernels match the prefixes above.
                ("xq_quantize_q8k", "xq"), ("moe_midq_q8k", "midq"), ("moe_sum_slots", "sum"))


def kernel_stage(name: str) -> str | None:
    """The MoE stage a kernel (or the counts-clear ``memset``) belongs to; None for any other kernel."""
    for prefix, stage in KERNEL_STAGE:
        if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
            return stage
    return None


class SimTrace:
    """The sim's modeled timeline as trace records (the role CUPTI plays on a GPU): modeled."""

    available, reason = True, ""

    def __init__(self, be) -> None:
        self.be = be
        self._seen = be.trace_records(0)[1]

    def start(self) -> None:
        self._seen = self.be.trace_records(0)[1]

    def stop(self) -> None:
        pass

    def take(self) -> list[tuple]:
        """``(name, start_ns, end_ns, kind, graph)`` of the device work since the last take."""
        new, self._seen = self.be.trace_records(self._seen)
        return [(r[1], r[2] * 1e3, r[3] * 1e3, r[4], r[5]) for r in new if r[4] in ("kernel", "memset")]


def _tuple(rec: tuple) -> tuple:
    """A session record (:mod:`ds4lab.backends.cupti`) as ``(name, start_ns, end_ns, kind, graph)``."""
    if rec[0] == "kernel":
        return (rec[1], float(rec[2]), float(rec[3]), "kernel", int(rec[10]))
    return ("memset", float(rec[2]), float(rec[3]), "memset", int(rec[8]))


class CuptiTrace:
    """Kernel and memset records of ds4lab's one CUPTI session (:class:`ds4lab.backends.cupti.CuptiSession`)
    as a trace source (GPU). Raises :class:`~ds4lab.backends.cupti.CuptiUnavailable` when CUPTI is not there."""

    available, reason = True, ""

    def __init__(self) -> None:
        self.s = CuptiSession.get()
        self.sub = None

    def start(self) -> None:
        """Start receiving (a fresh subscription: earlier records are not seen)."""
        if self.sub is None or self.sub.closed:
            self.sub = self.s.subscribe(KERNEL_KINDS)
        else:
            self.sub.take()

    def stop(self) -> None:
        if self.sub is not None:
            self.sub.close()

    def take(self) -> list[tuple]:
        """``(name, start_ns, end_ns, kind, graph)`` of the kernels and memsets since the last take."""
        if self.sub is None or self.sub.closed:
            return []
        return [_tuple(r) for r in self.sub.take()]


class Unavailable:
    """No trace here; ``reason`` says why (no records, every call a no-op)."""

    available = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def take(self) -> list:
        return []


def trace_source(be):
    """CUPTI on a GPU (when importable and it starts), the modeled timeline on ``sim``; otherwise an
    :class:`Unavailable` source saying why (never raises)."""
    from ..backends.base import ModeledTime

    if isinstance(be, ModeledTime):  # a backend that keeps a (modeled) device timeline
        return SimTrace(be)
    if not be.is_gpu:
        return Unavailable(f"no trace on the {be.name} backend")
    ok, why = cupti_available()
    if not ok:
        return Unavailable(why)
    try:
        t = CuptiTrace()
    except Exception as e:
        return Unavailable(f"CUPTI did not start ({type(e).__name__}: {e})")
    return t
