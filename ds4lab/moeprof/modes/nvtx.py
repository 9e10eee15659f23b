"""``nvtx``: NVTX ranges per stage (domain ``ds4lab``, category ``profile``) and no timing.

The ranges are host calls: a tool (Nsight Systems) times them; the rows only say what was emitted (``ms`` NaN). A graph
replay emits none; ranges emitted while capturing mark the capture."""

from __future__ import annotations

from ...token.model import MOE_STAGES, ProfileMarker
from ..rows import Call, Probe
from .base import ProfilingMode


class NvtxDomain:
    """NVTX ranges in the ``ds4lab`` domain, category ``profile``; records why when unavailable (``ok`` False, ``why``:
    the import error)."""

    def __init__(self) -> None:
        try:
            import nvtx

            self.domain = nvtx.get_domain("ds4lab")
            self.category = self.domain.get_category_id("profile")
            self.ok, self.why = True, ""
        except Exception as e:
            self.domain, self.ok, self.why = None, False, f"nvtx not importable ({type(e).__name__}: {e})"
        self._attrs: dict = {}

    def push(self, message: str, payload: int) -> None:
        if not self.ok:
            return
        key = (message, payload)
        a = self._attrs.get(key)
        if a is None:
            a = self.domain.get_event_attributes(message=message, color=0x17BECF, category=self.category,
                                                 payload=payload)
            self._attrs[key] = a
        self.domain.push_range(a)

    def pop(self) -> None:
        if self.ok:
            self.domain.pop_range()


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
        self.nvtx = NvtxDomain()
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
            self.nvtx.push(f"moe.{MOE_STAGES[i]}", layer)
            self._open = self.nvtx.ok
            probe.nvtx_ranges += 1 if self.nvtx.ok else 0
            probe.nvtx_capturing = probe.phase == "capture"

    def rows(self, c: Call) -> list[dict]:
        p, t = c.probe, self.prof.table
        if p is None or c.phase == "replay":
            return t.nan(c, "NVTX ranges are host calls: a graph replay emits none")
        if not self.nvtx.ok:
            return t.nan(c, f"no ranges: {self.nvtx.why}")
        if p.nvtx_capturing:
            return t.nan(c, "NVTX ranges emitted at capture time: they mark the capture, not execution")
        return t.nan(c, f"NVTX ranges only ({p.nvtx_ranges} per call, domain ds4lab): no timing")
