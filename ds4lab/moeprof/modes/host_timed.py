"""``host-timed``: ds4's own profile (seven events, ``cudaEventSynchronize``, host read per call), guarded against
stream capture, where the synchronize would fail and invalidate it (``docs/moe-profiler.md``)."""

from __future__ import annotations

import warnings

from ...errors import RuntimeApiError
from ..rows import Call, Probe
from .base import ProfilingMode


class ProfilerCaptureError(RuntimeApiError):
    """Host-timed MoE profiling was asked for while the stream captures (the guard refused it); a
    :class:`~ds4lab.errors.RuntimeApiError`, so a graph cache ends the intact capture and runs eagerly."""

    NAME = "ds4lab:HostTimedProfileInCapture"

    def __init__(self, status: str, layer: int, tokens: int) -> None:
        super().__init__(
            self.NAME, "moe profile (host-timed)",
            f"layer {layer}, {tokens} token(s): the stream's capture status is {status!r}; "
            "cudaEventSynchronize / cudaEventElapsedTime on an event recorded in a capture fail with "
            "cudaErrorCapturedEvent and invalidate the capture. Use mode deferred, in-graph, graph-boundary "
            "or cupti, or pass fallback=True")
        self.status = status

    @property
    def source(self) -> str:
        return "ds4lab"


class HostTimed(ProfilingMode):
    """ds4's events, synchronize and host read per call, from ``model.moe_profile_log``.

    ``guard``: refuse with :class:`ProfilerCaptureError` while the stream captures (any status but ``none``), before
    any synchronize; ``False`` runs ds4's path as is. ``fallback``: the mode a refused call is handed to, with a
    ``RuntimeWarning`` once and a note on the rows; None: refuse."""

    name = "host-timed"
    host_timed = True
    accepts_fallback = True

    def __init__(self, prof, guard: bool = True, fallback: ProfilingMode | None = None) -> None:
        super().__init__(prof)
        self.guard, self.fallback = guard, fallback
        self.events: list = []
        self._warned = False

    @classmethod
    def build(cls, prof, *, guard=True, fallback=None, slots=None) -> "HostTimed":
        return cls(prof, guard, fallback)

    def _each(self):
        return (self.fallback,) if self.fallback is not None else ()

    def allocate(self, window: int) -> None:
        """The fallback's resources, then 7 events: the model's own when it has them, else new."""
        for f in self._each():
            f.allocate(window)
        m = self.prof.model
        self.events = m.profile_events if len(m.profile_events) == 7 else [m.be.new_event() for _ in range(7)]

    def start(self) -> None:
        for f in self._each():
            f.start()

    def stop(self) -> None:
        for f in self._each():
            f.stop()

    def begin_step(self) -> None:
        for f in self._each():
            f.begin_step()

    def instrument(self, layer: int, T: int, status: str, phase: str) -> Probe:
        """The model's own host-timed path; under capture the guard refuses (recording the error), or the fallback
        instruments the call."""
        if status != "none" and self.guard:
            prof = self.prof
            if self.fallback is None:
                err = ProfilerCaptureError(status, layer, T)
                prof.errors.append({"token": prof.token, "layer": layer, "tokens": T, "phase": phase,
                                    "error": err.name, "status_after": prof.status(), "where": "guard"})
                raise err
            note = (f"host-timed refused while the stream captures (status {status}): this call timed "
                    f"{self.fallback.name} instead")
            if not self._warned:
                # stacklevel: this frame, the profiler's hook, the model's routed_moe, its caller
                warnings.warn(f"ds4lab moe profile: {note}", RuntimeWarning, stacklevel=4)
                self._warned = True
            probe = self.fallback.instrument(layer, T, status, phase)
            probe.note = note
            return probe
        return Probe("host", layer, T, phase, mode=self, points=self.events, reads_on_host=True,
                     events=self.events)

    def after_call(self, probe: Probe, log_index: int) -> None:
        log = self.prof.model.moe_profile_log
        if len(log) > log_index:
            probe.host = log[log_index]

    def event_sets(self) -> list[list]:
        sets = [s for f in self._each() for s in f.event_sets()]
        return sets + ([self.events] if self.events else [])

    def stamp_slots(self):
        return self.fallback.stamp_slots() if self.fallback is not None else None

    def collect(self, calls: list[Call]) -> None:
        for f in self._each():
            f.collect(calls)

    def probe_rows(self, c: Call, p: Probe) -> list[dict]:
        """The model's log entry for the call (ms per stage and total), as rows."""
        if not p.host:
            return self.prof.table.nan(c, "no host-timed record")
        return self.prof.table.stages(c, p.host)
