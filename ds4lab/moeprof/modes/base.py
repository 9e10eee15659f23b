"""The one interface every profiling mode implements: instrument a routed-MoE call, read back rows. The order of the
profiler's calls: ``docs/moe-profiler.md``, "A mode's calls"."""

from __future__ import annotations

from typing import ClassVar

from ..rows import Call, Probe


class ProfilingMode:
    """Base of the profiling modes (:data:`ds4lab.moeprof.MODES`); by default a mode places no points.

    Class attributes (asked instead of the mode's name): ``name``; ``per_stage`` (per-stage times);
    ``profile_points`` / ``host_timed`` (the ``TokenOptions`` set while attached); ``instruments_calls`` (a replay
    needs its capture's probe); ``auto_regime``; ``process_wide`` (stays loaded: run it last); ``accepts_fallback``;
    ``sim_prices`` (regimes whose cost the sim models) and ``sim_leaves_out`` (what it does not price)."""

    name: ClassVar[str] = ""
    #: The mode's trace source (:func:`ds4lab.trace.live.trace_source`), started and stopped with the mode, or None.
    trace = None
    per_stage: ClassVar[bool] = True
    profile_points: ClassVar[bool] = True
    host_timed: ClassVar[bool] = False
    instruments_calls: ClassVar[bool] = True
    auto_regime: ClassVar[str] = "eager"
    process_wide: ClassVar[bool] = False
    accepts_fallback: ClassVar[bool] = False
    sim_prices: ClassVar[tuple] = ("eager", "replayed")
    sim_leaves_out: ClassVar[str] = ""

    def __init__(self, prof) -> None:
        self.prof = prof

    @classmethod
    def build(cls, prof, *, guard: bool = True, fallback: "ProfilingMode | None" = None,
              slots: int | None = None) -> "ProfilingMode":
        """The mode for ``prof`` from the profiler's options (each mode takes the ones it uses)."""
        return cls(prof)

    # ------------------------------------------------------------------ availability
    @property
    def available(self) -> bool:
        """Whether the mode can record anything here (``cupti`` without CUPTI cannot)."""
        return True

    @property
    def unavailable_reason(self) -> str:
        """``""`` when available, else ``"unavailable: <reason>"``."""
        return ""

    # ------------------------------------------------------------------ life cycle
    def allocate(self, window: int) -> None:
        """At attach, outside any capture: allocate events or slots for ``window`` calls between reads."""

    def start(self) -> None:
        """After the profiler became the model's observer: the mode's :attr:`trace` starts."""
        if self.trace is not None and self.trace.available:
            self.trace.start()

    def stop(self) -> None:
        """At detach: the mode's :attr:`trace` stops (and an open NVTX range is closed)."""
        if self.trace is not None and self.trace.available:
            self.trace.stop()

    def begin_step(self) -> None:
        """Before the calls of a token (``prof.token`` already set)."""

    # ------------------------------------------------------------------ the moe cluster and its call
    def open_bracket(self, status: str) -> tuple[tuple | None, str]:
        """Before a ``moe`` cluster run (eager, capture or replay) with the stream's capture ``status``: ``(bracket,
        note)``; a bracket that is not None is closed with :meth:`close_bracket`."""
        return None, ""

    def close_bracket(self, bracket: tuple) -> None:
        """After the cluster run that :meth:`open_bracket` bracketed (even when it raised)."""

    def instrument(self, layer: int, T: int, status: str, phase: str) -> Probe:
        """The profiling points of one routed-MoE call of ``layer`` for ``T`` tokens, issued with the stream's capture
        ``status`` (``phase``: ``eager`` or ``capture``). May raise before the call
        (:class:`~ds4lab.moeprof.ProfilerCaptureError`, or RuntimeError when out of slots)."""
        return Probe("none", layer, T, phase, mode=self)

    def after_call(self, probe: Probe, log_index: int) -> None:
        """After the call ran: ``log_index`` is where its entry in ``model.moe_profile_log`` would be."""

    # ------------------------------------------------------------------ reading
    def event_sets(self) -> list[list]:
        """The event lists a read may use, for :meth:`~ds4lab.moeprof.MoeProfiler.poison`."""
        return []

    def stamp_slots(self):
        """The device stamp slots, or None, for :meth:`~ds4lab.moeprof.MoeProfiler.poison`."""
        return None

    def collect(self, calls: list[Call]) -> None:
        """Once per read, after the stream synchronized: fetch what the calls left on the device."""

    def read(self, calls: list[Call]) -> list[dict]:
        """The rows (:data:`~ds4lab.moeprof.ROW_COLUMNS`) of ``calls``, in call order."""
        self.collect(calls)
        return [r for c in calls for r in self.rows(c)]

    def rows(self, c: Call) -> list[dict]:
        """One call's rows: NaN rows (with why) without a working probe, else its probe's mode reads it."""
        p, t = c.probe, self.prof.table
        if p is None:
            return t.nan(c, "no instrumented call")
        if p.error:
            return t.nan(c, f"call failed: {p.error}")
        return p.mode.probe_rows(c, p)

    def probe_rows(self, c: Call, p: Probe) -> list[dict]:
        """The rows of call ``c`` from probe ``p``, which this mode placed."""
        return self.prof.table.nan(c, f"nothing recorded ({p.kind})")
