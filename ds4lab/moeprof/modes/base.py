"""The one interface every profiling mode implements: instrument a routed-MoE call, read back rows.

A mode works for one :class:`~ds4lab.moeprof.MoeProfiler` (``self.prof``), which owns what all modes share: attaching
to the model, the capture-status queries, the calls waiting to be read, the errors, and the rows' common columns
(``prof.table``, a :class:`~ds4lab.moeprof.rows.RowBuilder`). The profiler calls, in this order:

1. :meth:`~ProfilingMode.allocate` at attach (outside any capture), then :meth:`~ProfilingMode.start`;
2. per token :meth:`~ProfilingMode.begin_step`;
3. per ``moe`` cluster run :meth:`~ProfilingMode.open_bracket` / :meth:`~ProfilingMode.close_bracket` around it, and
   per routed-MoE call within it :meth:`~ProfilingMode.instrument`, which returns a :class:`~ds4lab.moeprof.rows.Probe`
   whose ``points`` the model fires at its 7 profiling points, then the probe's own mode's
   :meth:`~ProfilingMode.after_call`;
4. per read (after the token, the stream synchronized) :meth:`~ProfilingMode.read`, which returns the rows of the calls
   (:meth:`~ProfilingMode.collect` once, then :meth:`~ProfilingMode.rows` per call);
5. :meth:`~ProfilingMode.stop` at detach.

A mode may hand a call to another mode (``host-timed`` under capture, with a fallback): the probe names the mode that
placed it (``probe.mode``), and that mode reads it back (:meth:`~ProfilingMode.probe_rows`)."""

from __future__ import annotations

from typing import ClassVar

from ..rows import Call, Probe


class ProfilingMode:
    """Base of the profiling modes (:data:`ds4lab.moeprof.MODES`); by default a mode places no points.

    Class attributes (what the profiler and the jobs ask instead of testing the mode's name):
        name: the mode's name in :data:`~ds4lab.moeprof.MODES` and in the rows' ``mode`` column.
        per_stage: rows carry per-stage times (:data:`~ds4lab.moeprof.STAGE_MODES`).
        profile_points: ``TokenOptions.moe_profile`` while attached (the model's 7 profiling points
            are live; part of every ``moe`` graph's host decisions).
        host_timed: ``TokenOptions.moe_host_timed`` while attached (the model synchronizes and reads).
        instruments_calls: a replayed graph needs the probe of its capture (otherwise the row says the
            graph was captured before the profiler attached).
        auto_regime: the regime :func:`~ds4lab.moeprof.iter_profile` picks for ``regime="auto"``.
        process_wide: once started it stays loaded in the process (CUPTI): run it last.
        accepts_fallback: takes a fallback mode for calls it refuses (``host-timed``).
        sim_prices: the regimes (``eager``, ``replayed``) in which the sim's cost model prices what the
            mode costs a token; in the others its cost on the sim is "not modeled", never a measurement.
        sim_leaves_out: what the sim does not price where ``sim_prices`` leaves a regime out."""

    name: ClassVar[str] = ""
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
        """After the profiler became the model's observer (a trace starts here)."""

    def stop(self) -> None:
        """At detach (a trace stops, an open NVTX range is closed)."""

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
