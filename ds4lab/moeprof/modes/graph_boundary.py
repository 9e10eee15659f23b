"""``graph-boundary``: two events between graph launches bracket each ``moe`` cluster run.

The MoE cluster is captured and replayed through a :class:`~ds4lab.capture.cache.GraphCache`; the events are recorded
outside the graph (never while the stream captures), so each replay is timed as a whole: ``total`` only, no stages."""

from __future__ import annotations

from ...errors import RuntimeApiError
from ..rows import Call, join_notes
from .base import ProfilingMode


class GraphBoundary(ProfilingMode):
    """A pool of ``(start, end)`` event pairs around each cluster run: one ``total`` row per call; NaN with a note
    when the stream was capturing and, unless ``raw``, for the capturing call (its time includes capture). A failed
    read goes to the profiler's ``errors``."""

    name = "graph-boundary"
    per_stage = False
    profile_points = False
    instruments_calls = False
    auto_regime = "replayed"

    def __init__(self, prof) -> None:
        super().__init__(prof)
        self.brackets: list[tuple] = []
        self._next = 0

    def allocate(self, window: int) -> None:
        be = self.prof.be
        while len(self.brackets) < window:
            self.brackets.append((be.new_event(), be.new_event()))

    def open_bracket(self, status: str) -> tuple[tuple | None, str]:
        """Record the next pair's start event on the stream, unless the stream captures (then a note)."""
        if status != "none":
            return None, f"stream capturing ({status}): no boundary events recorded"
        bracket = self.brackets[self._next % len(self.brackets)]
        self._next += 1
        self.prof.model.L.event_record("profile.boundary", bracket[0])
        return bracket, ""

    def close_bracket(self, bracket: tuple) -> None:
        """Record the pair's end event, unless the stream captures now (a capture began in the run)."""
        if self.prof.status() == "none":
            self.prof.model.L.event_record("profile.boundary", bracket[1])

    def rows(self, c: Call) -> list[dict]:
        prof = self.prof
        t = prof.table
        if c.bracket is None:
            return t.nan(c, "no boundary events", ("total",))
        if c.phase == "capture+replay" and not prof.raw:
            return t.nan(c, "capturing call: its boundary time includes capture and instantiation", ("total",))
        try:
            prof.be.event_synchronize(c.bracket[1])
            ms = prof.be.event_elapsed_ms(c.bracket[0], c.bracket[1])
        except RuntimeApiError as e:
            prof.read_error(c, e)
            return t.nan(c, f"read failed: {e.name}", ("total",))
        base = t.base(c)
        extra = {"eager": "eager call bracketed (no graph)",
                 "capture+replay": "includes capture and instantiation"}.get(c.phase, "")
        base["note"] = join_notes(base["note"], extra)
        return [{**base, "stage": "total", "ms": float(ms)}]
