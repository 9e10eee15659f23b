"""``nvtx``: NVTX ranges per stage (domain ``ds4lab``, category ``profile``) and no timing.

The ranges are host calls: a tool (Nsight Systems) times them; the rows only say what was emitted (``ms`` NaN). A graph
replay emits none; ranges emitted while capturing mark the capture."""

from __future__ import annotations

from ...capture.annotate import NvtxAnnotator
from ...token.model import MOE_STAGES, ProfileMarker
from ..rows import Call, Probe
from .base import ProfilingMode


class NvtxMark(ProfileMarker):
    """Profiling point ``i`` of one call: closes the previous stage's range, opens stage ``i``'s."""

    def __init__(self, mode: "Nvtx", i: int, layer: int, probe: Probe) -> None:
        self.mode, self.i, self.layer, self.probe = mode, i, layer, probe

    def fire(self, site: str) -> None:
        self.mode.mark(self.i, self.layer, self.probe)


class Nvtx(ProfilingMode):
    """A range ``moe.<stage>`` (payload: the layer) between consecutive profiling points; rows NaN, the note saying
    how many ranges were emitted per call, why none, or what they mark."""

    name = "nvtx"
    sim_prices = ()
    sim_leaves_out = "NVTX range pushes and pops"
    per_stage = False

    def __init__(self, prof) -> None:
        super().__init__(prof)
        try:  # the launcher's NVTX ranges (domain ds4lab), category profile
            self.nvtx, self.why = NvtxAnnotator(), ""
        except Exception as e:
            self.nvtx, self.why = None, f"nvtx not importable ({type(e).__name__}: {e})"
        self._open = False

    def stop(self) -> None:
        if self._open:
            self.nvtx.pop()
            self._open = False

    def instrument(self, layer: int, T: int, status: str, phase: str) -> Probe:
        """7 :class:`NvtxMark` markers: ranges ``moe.<stage>`` between the call's profiling points."""
        probe = Probe("nvtx", layer, T, phase, mode=self)
        probe.points = [NvtxMark(self, i, layer, probe) for i in range(7)]
        return probe

    def mark(self, i: int, layer: int, probe: Probe) -> None:
        """Profiling point ``i`` (0..6): pop the open range, push stage ``i``'s (none after the last)."""
        if i > 0 and self._open:
            self.nvtx.pop()
            self._open = False
        if i < len(MOE_STAGES):
            if self.nvtx is not None:
                self.nvtx.push(f"moe.{MOE_STAGES[i]}", "profile", layer)
            self._open = self.nvtx is not None
            probe.nvtx_ranges += 1 if self.nvtx is not None else 0
            probe.nvtx_capturing = probe.phase == "capture"

    def rows(self, c: Call) -> list[dict]:
        p, t = c.probe, self.prof.table
        if p is None or c.phase == "replay":
            return t.nan(c, "NVTX ranges are host calls: a graph replay emits none")
        if self.nvtx is None:
            return t.nan(c, f"no ranges: {self.why}")
        if p.nvtx_capturing:
            return t.nan(c, "NVTX ranges emitted at capture time: they mark the capture, not execution")
        return t.nan(c, f"NVTX ranges only ({p.nvtx_ranges} per call, domain ds4lab): no timing")
