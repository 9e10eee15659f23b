"""``in-graph``: %globaltimer written into device slots at each stage boundary, inside the graph; folded into the
stage kernels or fired by a stamp kernel: ``docs/moe-profiler.md``, "in-graph"."""

from __future__ import annotations

import numpy as np

from ...token.model import MOE_STAGES, ProfileMarker
from ...token.ops import KernelStamp
from ...trace.live import trace_source
from ..rows import Call, Probe, capture_status
from .base import ProfilingMode


class Stamp(ProfileMarker):
    """One profiling point of the in-graph mode: folded into the stage kernel that follows it, or the stamp kernel for
    one slot. ``carrier``: the kernel that wrote it (set when issued)."""

    def __init__(self, mode: "InGraph", slot: int) -> None:
        self.mode, self.slot = mode, slot
        self.carrier = "stamp_time"
        self._fold = None

    def fire(self, site: str) -> None:
        self.carrier = "stamp_time"
        self.mode.stamp(self.slot)

    def fold(self) -> KernelStamp | None:
        if not self.mode.fold:
            return None
        if self._fold is None:
            self._fold = KernelStamp(self.mode.slots, self.slot, 1, self.mode.stamp_ref(self.slot))
        return self._fold

    def folded_into(self, kernel: str) -> None:
        self.carrier = kernel


class InGraph(ProfilingMode):
    """Stamp slots on the device (``uint64`` ns), 7 per distinct ``(layer, tokens)`` key.

    ``slots``: capacity (default 7 × max(16, 2 × layers)); a key beyond it raises RuntimeError. ``every_step``:
    clear the slots at every :meth:`begin_step` (as a fallback only once stamps are in use). ``fold``: the stage
    kernels write their boundaries (None: :attr:`FOLD`). Rows: ms per stage, ``total`` = last − first; NaN with a note
    for a call captured (not run yet) or whose slots were not written."""

    name = "in-graph"
    auto_regime = "replayed"

    #: The default of ``fold`` (``docs/moe-profiler.md``).
    FOLD = True

    def __init__(self, prof, slots: int | None = None, every_step: bool = True, fold: bool | None = None) -> None:
        super().__init__(prof)
        self.every_step = every_step
        #: stage boundaries written by the stage kernels themselves (``docs/moe-profiler.md``)
        self.fold = self.FOLD if fold is None else fold
        self.capacity = slots or 7 * max(16, 2 * prof.model.n_layers)
        self.slots = None
        self.slot_of: dict[tuple, int] = {}
        self.trace = trace_source(prof.be) if prof.timing_only else None
        self._host = None

    @classmethod
    def build(cls, prof, *, guard=True, fallback=None, slots=None) -> "InGraph":
        return cls(prof, slots)

    @classmethod
    def as_fallback(cls, prof, slots: int | None = None) -> "InGraph":
        """The mode as ``host-timed``'s fallback: slots cleared only once stamps are in use."""
        return cls(prof, slots, every_step=False)

    def allocate(self, window: int) -> None:
        if self.slots is None:
            self.slots = self.prof.be.zeros((self.capacity,), np.uint64)

    def begin_step(self) -> None:
        """Clear the slots (when the stream is not capturing)."""
        prof = self.prof
        stream = prof.model.L.stream()
        if self.slots is not None and (self.every_step or self.slot_of) and capture_status(prof.be, stream) == "none":
            prof.be.memset_async(stream, self.slots, 0)

    def instrument(self, layer: int, T: int, status: str, phase: str) -> Probe:
        """7 :class:`Stamp` markers on the slots of the call's ``(layer, T)`` key (the same slots for every call of
        that key: a replayed graph writes them again). RuntimeError when out of slots."""
        probe = Probe("stamps", layer, T, phase, mode=self, slot=self._slot_base(layer, T))
        probe.points = [Stamp(self, probe.slot + i) for i in range(7)]
        return probe

    def _slot_base(self, layer: int, T: int) -> int:
        key = (layer, T)
        base = self.slot_of.get(key)
        if base is None:
            base = 7 * len(self.slot_of)
            if base + 7 > self.capacity:
                raise RuntimeError(f"in-graph profile: {len(self.slot_of)} (layer, tokens) keys exhaust "
                                   f"{self.capacity} stamp slots; pass slots= larger")
            self.slot_of[key] = base
        return base

    def stamp_ref(self, slot: int):
        """What the NumPy reference writes for ``slot`` where a GPU writes %globaltimer: on the sim the modeled device
        time (ns) at which the kernel that carries it starts, elsewhere 0."""
        prof = self.prof
        stream = prof.model.L.stream()
        modeled = prof.modeled

        def ref():
            self.slots[slot] = np.uint64(round(self._sim_now_us(stream) * 1e3)) if modeled else np.uint64(0)

        return ref

    def stamp(self, slot: int) -> None:
        """Launch the stamp kernel for ``slot`` on the current stream (a kernel node when captured)."""
        L = self.prof.model.L
        L.kernel("profile.stamp", "stamp_time", (1,), (32,), (self.slots, np.int32(slot)), self.stamp_ref(slot),
                 nbytes=8)

    def _sim_now_us(self, stream) -> float:
        """When a stamp kernel issued now starts on the modeled device: no earlier than the host's submit time, the
        stream's previous work and the device's previous kernel (one at a time)."""
        return self.prof.be.modeled_start_us(stream)

    def stamp_slots(self):
        return self.slots

    def collect(self, calls: list[Call]) -> None:
        """The slots as host float64 ns (timing-only sim: from the trace)."""
        records = self.trace.take() if (self.trace is not None and self.trace.available) else None
        if self.slots is None:
            self._host = None
        elif not self.prof.timing_only:
            self._host = np.asarray(self.prof.be.to_host(self.slots)).astype(np.float64)
        else:
            self._host = self._stamps_from_trace(calls, records)

    def _stamps_from_trace(self, calls, records) -> np.ndarray:
        """Timing-only sim (no numbers are computed, so nothing writes the slots): each point's time is the modeled
        start of the kernel that carried it, found in the trace in issue order (points folded together share their
        kernel's record)."""
        out = np.zeros(self.capacity, dtype=np.float64)
        recs = [(r.name, r.start_ns) for r in (records or [])]
        j = 0
        for c in calls:
            if c.phase == "capture" or c.probe is None or c.probe.mode is not self:
                continue
            prev = None
            for i, pt in enumerate(c.probe.points):
                if prev is not None and pt.carrier == prev.carrier and pt.carrier != "stamp_time":
                    out[c.probe.slot + i] = out[c.probe.slot + i - 1]
                    prev = pt
                    continue
                while j < len(recs) and recs[j][0] != pt.carrier:
                    j += 1
                if j < len(recs):
                    out[c.probe.slot + i] = recs[j][1]
                    j += 1
                prev = pt
        return out

    def probe_rows(self, c: Call, p: Probe) -> list[dict]:
        t = self.prof.table
        if c.phase == "capture":
            return t.nan(c, "stamps captured: they run when the graph is replayed")
        s = self._host[p.slot:p.slot + 7] if self._host is not None else np.zeros(7)
        if not np.all(s > 0):
            return t.nan(c, "stamp slots not written")
        ms = {st: (s[i + 1] - s[i]) / 1e6 for i, st in enumerate(MOE_STAGES)}
        ms["total"] = (s[6] - s[0]) / 1e6
        src = ("modeled device clock (start of the kernel that stamps)" if self.prof.modeled else
               "%globaltimer (ns; update step: globaltimer_resolution)")
        how = ("stages from their first kernel's start; one stamp kernel per call (end)" if self.fold
               else "each stage includes one stamp kernel")
        return t.stages(c, ms, f"in-graph stamps: {src}; {how}")
