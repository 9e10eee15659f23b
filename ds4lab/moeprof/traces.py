"""Trace sources: per-kernel records of the device work, for the ``cupti`` mode (and the in-graph
stamps of a timing-only sim, which compute no numbers).

On a GPU the records come from one process-wide CUPTI activity session (``cupti-python``, an
optional dependency imported lazily); on ``sim`` the modeled timeline plays their part. Every
source has ``available``/``reason``, ``start()``, ``stop()`` and ``take()``, which returns
``(name, start_ns, end_ns, kind, graph)`` tuples of the kernels and memsets since the last take.
"""

from __future__ import annotations

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


class CuptiSession:
    """One process-wide CUPTI activity session (``cupti-python``): kernel and memset records."""

    _instance: "CuptiSession | None" = None

    def __init__(self) -> None:
        from cupti import cupti  # optional dependency, imported only here

        self.c = cupti
        self.records: list[tuple] = []
        self.registered = False
        self.kinds = (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMSET)

    @classmethod
    def get(cls) -> "CuptiSession":
        """The process's session (created on first use; raises what ``cupti-python`` raises)."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _requested(self):
        return 8 << 20, 0

    def _completed(self, activities) -> None:
        K = self.c.ActivityKind
        for a in activities:
            if a.kind == K.CONCURRENT_KERNEL or a.kind == K.KERNEL:
                name = a.name.decode() if isinstance(a.name, bytes) else str(a.name)
                self.records.append((name, float(a.start), float(a.end), "kernel", int(a.graph_id)))
            elif a.kind == K.MEMSET:
                self.records.append(("memset", float(a.start), float(a.end), "memset", int(a.graph_id)))

    def start(self) -> None:
        for k in self.kinds:
            self.c.activity_enable(k)
        if not self.registered:
            self.c.activity_register_callbacks(self._requested, self._completed)
            self.registered = True

    def stop(self) -> None:
        self.c.activity_flush_all(1)
        for k in self.kinds:
            self.c.activity_disable(k)
        self.records = []

    def take(self) -> list[tuple]:
        self.c.activity_flush_all(1)
        out, self.records = self.records, []
        return out


class CuptiTrace:
    """The CUPTI session as a trace source (GPU)."""

    available, reason = True, ""

    def __init__(self) -> None:
        self.s = CuptiSession.get()

    def start(self) -> None:
        self.s.start()
        self.s.take()

    def stop(self) -> None:
        self.s.stop()

    def take(self) -> list[tuple]:
        return self.s.take()


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


def cupti_available() -> tuple[bool, str]:
    """Whether ``cupti-python`` imports (GPU side); the reason when not."""
    try:
        import importlib

        importlib.import_module("cupti.cupti")
    except Exception as e:  # ImportError, or a library that fails to load
        return False, f"cupti-python not importable ({type(e).__name__}: {e}); pip install cupti-python"
    return True, "ok"


def trace_source(be):
    """CUPTI on a GPU (when importable and it starts), the modeled timeline on ``sim``; otherwise an
    :class:`Unavailable` source saying why (never raises)."""
    if be.trace_records() is not None:  # a backend that keeps a (modeled) device timeline
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
