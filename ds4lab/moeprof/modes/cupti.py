"""``cupti``: per-kernel activity records, attributed to stages by kernel name and to calls by order.

The records come from a trace source (:func:`ds4lab.trace.live.trace_source`): CUPTI activity records on a GPU
(``cupti-python``, imported lazily; "unavailable: <reason>" when it is missing), the modeled timeline on ``sim``.
Nothing is placed in the routed MoE itself."""

from __future__ import annotations

from ...token.model import MOE_STAGES
from ...trace.live import trace_source
from ..rows import Call, record_stage
from .base import ProfilingMode


class Cupti(ProfilingMode):
    """Kernel records split into MoE calls at each ``xq_quantize`` (:func:`~ds4lab.moeprof.record_stage`). Rows: per
    stage the kernels' busy ms, ``total`` first start to last end; NaN with a note when the trace is unavailable or a
    call has no records; a mismatch of groups and calls is noted in the profiler's ``notes``."""

    name = "cupti"
    sim_prices = ()
    sim_leaves_out = "CUPTI's activity buffers and callbacks"
    profile_points = False
    instruments_calls = False
    process_wide = True

    def __init__(self, prof) -> None:
        super().__init__(prof)
        self.trace = trace_source(prof.be)
        self._group_of: dict[int, list | None] = {}

    @property
    def available(self) -> bool:
        return self.trace.available

    @property
    def unavailable_reason(self) -> str:
        return "" if self.available else f"unavailable: {self.trace.reason}"

    def collect(self, calls: list[Call]) -> None:
        """Take the trace's records since the last read and assign one group of MoE kernels to each call."""
        records = self.trace.take() if self.trace.available else None
        self._group_of = {id(c): g for c, g in zip(calls, self._groups(calls, records))}

    def _groups(self, calls, records) -> list:
        """Trace records split into MoE calls at each ``xq_quantize``, assigned to the calls that ran."""
        if records is None:
            return [None] * len(calls)
        recs = sorted((r for r in records if record_stage(r)), key=lambda r: r.start_ns)
        groups, cur = [], None
        for r in recs:
            if record_stage(r) == "xq" or cur is None:
                cur = []
                groups.append(cur)
            cur.append(r)
        out, j = [], 0
        for c in calls:
            if c.phase == "capture":
                out.append([])
            else:
                out.append(groups[j] if j < len(groups) else [])
                j += 1
        if j != len(groups):
            self.prof.notes.append(f"trace: {len(groups)} MoE kernel groups for {j} executed calls")
        return out

    def rows(self, c: Call) -> list[dict]:
        t = self.prof.table
        if not self.trace.available:
            return t.nan(c, self.unavailable_reason)
        group = self._group_of.get(id(c))
        if not group:
            captured = " (captured, not run)" if c.phase == "capture" else ""
            return t.nan(c, "no kernel records for this call" + captured)
        ms = {s: 0.0 for s in MOE_STAGES}
        for r in group:
            ms[record_stage(r)] += r.dur_ns / 1e6
        ms["total"] = (max(r.end_ns for r in group) - min(r.start_ns for r in group)) / 1e6
        src = "modeled timeline" if self.prof.modeled else "CUPTI activity records"
        return t.stages(c, ms, f"{src}: stage = kernel busy time, total = first start to last end")
