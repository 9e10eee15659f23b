"""``deferred``: ds4's seven events per call, each call its own from a pool, read after the token; eager only
(``docs/moe-profiler.md``)."""

from __future__ import annotations

from ...errors import RuntimeApiError
from ...token.model import MOE_STAGES
from ..rows import Call, Probe
from .base import ProfilingMode


class Deferred(ProfilingMode):
    """A pool of 7-event sets, one per call between reads. Rows: ms per stage, ``total`` their sum; NaN (with a note)
    for a call recorded inside a capture unless ``raw``; note ``stale`` for events still holding what
    :meth:`~ds4lab.moeprof.MoeProfiler.poison` recorded. A failed read goes to ``errors`` (``where`` = ``read``)."""

    name = "deferred"
    sim_prices = ("eager",)
    sim_leaves_out = "what events recorded inside a capture cost the replayed token"

    def __init__(self, prof) -> None:
        super().__init__(prof)
        self.pool: list[list] = []
        self._next = 0

    @classmethod
    def as_fallback(cls, prof, slots: int | None = None) -> "Deferred":
        """The mode as ``host-timed``'s fallback (the same mode)."""
        return cls(prof)

    def allocate(self, window: int) -> None:
        """``window`` sets of 7 events (kept across attaches, grown when a larger window needs more)."""
        be = self.prof.be
        while len(self.pool) < window:
            self.pool.append([be.new_event() for _ in range(7)])

    def instrument(self, layer: int, T: int, status: str, phase: str) -> Probe:
        """The next event set of the pool (7 new events when none was allocated) as the call's points."""
        events = self.pool[self._next % len(self.pool)] if self.pool else \
            [self.prof.be.new_event() for _ in range(7)]
        self._next += 1
        return Probe("events", layer, T, phase, mode=self, points=events, events=events)

    def event_sets(self) -> list[list]:
        return list(self.pool)

    def probe_rows(self, c: Call, p: Probe) -> list[dict]:
        prof = self.prof
        be, t = prof.be, prof.table
        in_graph = c.phase != "eager" or p.phase == "capture"
        if in_graph and not prof.raw:
            return t.nan(c, "events recorded inside a capture are not graph nodes: nothing was timed")
        try:
            be.event_synchronize(p.events[6])
            vals = tuple(be.event_elapsed_ms(p.events[i], p.events[i + 1]) for i in range(6))
        except RuntimeApiError as e:
            prof.read_error(c, e)
            return t.nan(c, f"read failed: {e.name}")
        note = ""
        if prof.poisoned.get(id(p.events)) == vals:
            note = "stale: the events still hold their previous (eager) record"
        ms = dict(zip(MOE_STAGES, vals))
        ms["total"] = sum(vals)
        return t.stages(c, ms, note)
