"""The routed-MoE profiler (:class:`MoeProfiler`): one object per model and mode, attached as the model's
``moe_observer``; it classifies each ``moe`` cluster run (eager, capture, replay, fallback), keeps calls until a read
and records errors. What depends on the mode: :mod:`ds4lab.moeprof.modes`."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from ..capture.cache import GraphCache
from ..errors import RuntimeApiError
from ..token.model import DecodeModel, MoeObserver
from .modes import check_mode, make_mode
from .rows import Call, Probe, RowBuilder, capture_status, is_modeled, join_notes


class MoeProfiler(MoeObserver):
    """Times the routed-MoE stages of one :class:`~ds4lab.token.model.DecodeModel` in one mode
    (:data:`~ds4lab.moeprof.MODES`); ``routing`` labels the rows.

    ``guard``, ``fallback`` (``host-timed`` only): refuse while the stream captures (default), or hand that call to
    ``"in-graph"`` (``True``) or ``"deferred"``, with a warning and a note. ``read_every``: calls between reads the
    pools are sized for (default: ``calls_per_read`` of :meth:`attach`, else the layers). ``raw``: report what the
    mechanism returns even where it cannot have timed the call (the exclusion matrix). ``slots``: stamp slots. Raises
    ValueError: an unknown mode, a fallback other than True/``"in-graph"``/``"deferred"``, or ``read_every`` < 1.

    Use :meth:`attached` around the calls, :meth:`begin_step` / :meth:`end_step` (its rows: :data:`ROW_COLUMNS`)
    around each token."""

    def __init__(self, model: DecodeModel, mode: str, *, routing: str = "", guard: bool = True,
                 fallback: bool | str = False, read_every: int | None = None, raw: bool = False,
                 slots: int | None = None) -> None:
        if fallback is True:
            fallback = "in-graph"
        check_mode(mode, fallback)
        if read_every is not None and read_every < 1:
            raise ValueError(f"read_every={read_every} must be >= 1")
        self.model, self.be = model, model.be
        self.mode, self.routing = mode, routing
        self.guard, self.fallback, self.raw = guard, (fallback or None), raw
        self.read_every = read_every
        self.modeled = is_modeled(self.be)
        self.timing_only = self.be.timing_only
        self.k = model.cfg.n_used
        self.token = 0
        self.errors: list[dict] = []
        self.notes: list[str] = []
        #: what :meth:`poison` read from each event set (``id`` of the list → 6 elapsed times)
        self.poisoned: dict[int, tuple] = {}
        self.table = RowBuilder(mode, self.be.name, routing, self.modeled, self.k)
        self._pending: list[Call] = []
        self._graph_probe: dict[tuple, Probe] = {}
        self._call_probes: list[Probe] = []
        self._attached = False
        self._restore: dict = {}
        #: the mode object (:class:`~ds4lab.moeprof.modes.base.ProfilingMode`)
        self.impl = make_mode(self, mode, guard=guard, fallback=self.fallback, slots=slots)

    # ------------------------------------------------------------------ availability
    @property
    def available(self) -> bool:
        """Whether the mode can record here (``cupti`` needs CUPTI on a GPU)."""
        return self.impl.available

    @property
    def unavailable_reason(self) -> str:
        """``""``, or ``"unavailable: <reason>"``."""
        return self.impl.unavailable_reason

    def status(self) -> str:
        """The capture status of the model's current stream (:func:`capture_status`)."""
        return capture_status(self.be, self.model.L.stream())

    # ------------------------------------------------------------------ attach / detach
    @contextlib.contextmanager
    def attached(self, calls_per_read: int | None = None) -> Iterator["MoeProfiler"]:
        """Install the profiler on the model for the ``with`` block (see :meth:`attach`, :meth:`detach`)."""
        self.attach(calls_per_read)
        try:
            yield self
        finally:
            self.detach()

    def attach(self, calls_per_read: int | None = None) -> None:
        """Allocate what the mode needs (outside any capture), become the model's ``moe_observer`` and set
        ``model.opts``' profiling flags; ``calls_per_read`` default: the model's layers. Raises ``RuntimeError``
        while the stream captures or another profiler is attached."""
        if self._attached:
            return
        m, be = self.model, self.be
        if m.moe_observer is not None:
            raise RuntimeError("another routed-MoE profiler is attached to this model: detach it first")
        if capture_status(be, m.L.stream()) != "none":
            raise RuntimeError("attach the profiler before any capture begins (it allocates events and slots)")
        self.impl.allocate(self.read_every or calls_per_read or m.n_layers)
        ours = {"moe_profile": self.impl.profile_points, "moe_host_timed": self.impl.host_timed}
        before = m.opts
        m.opts = dataclasses.replace(before, **ours)
        self._restore = {"before": before, "ours": ours, "installed": m.opts}
        m.moe_observer = self
        self.impl.start()
        self._attached = True

    def detach(self) -> None:
        """Stop observing the model and restore what :meth:`attach` changed: ``model.opts`` (a replacement made
        meanwhile stays, with ``moe_profile`` / ``moe_host_timed`` restored where they still hold the profiler's
        value); ``moe_observer`` cleared only if it is this profiler."""
        if not self._attached:
            return
        m = self.model
        if m.moe_observer is self:
            m.moe_observer = None
        r = self._restore
        if m.opts is r["installed"]:
            m.opts = r["before"]
        else:
            back = {f: getattr(r["before"], f) for f, v in r["ours"].items()
                    if getattr(m.opts, f) == v and getattr(r["before"], f) != v}
            if back:
                m.opts = dataclasses.replace(m.opts, **back)
        self.impl.stop()
        self._attached = False

    # ------------------------------------------------------------------ steps
    def begin_step(self, token: int) -> None:
        """Start token (step) ``token`` (in-graph: clear the stamp slots when the stream is not capturing)."""
        self.token = token
        self.impl.begin_step()

    def end_step(self) -> list[dict]:
        """Read what the token's calls left; returns rows. While the stream captures nothing is read (the calls wait
        for the next read)."""
        return self.read()

    # ------------------------------------------------------------------ hooks
    def around_moe_cluster(self, layer: int, T: int, run) -> None:
        """The model's hook around each ``moe`` cluster run (eager, capture or replay)."""
        m = self.model
        cache = m.executor if isinstance(m.executor, GraphCache) else None
        st0 = (cache.stats.captures, cache.stats.replays, cache.stats.eager_runs) if cache else None
        status = self.status()
        bracket, note = self.impl.open_bracket(status)
        self._call_probes = []
        try:
            run()
        finally:
            if bracket is not None:
                self.impl.close_bracket(bracket)
        probes = self._call_probes
        if cache is not None and cache.stats.replays > st0[1]:
            phase = "capture+replay" if cache.stats.captures > st0[0] else "replay"
            probe = self._graph_probe.get((layer, T))
            if probe is None and self.impl.instruments_calls:
                note = join_notes(note, "graph captured before the profiler attached: not instrumented")
        elif status != "none":
            phase, probe = "capture", (probes[-1] if probes else None)
            note = join_notes(note, "issued inside a capture: nothing ran (the graph's replays run it)")
        else:
            phase, probe = "eager", (probes[-1] if probes else None)
            failed = [p for p in probes[:-1] if p.error]
            if failed:
                note = join_notes(note, f"capture failed ({failed[0].error}, capture {failed[0].status_after}): "
                                        "graph retired, eager fallback")
            elif cache is not None and cache.stats.eager_runs > st0[2] and cache.retired():
                note = join_notes(note, "graph retired earlier: eager fallback")
        if probe is not None and probe.note:
            note = join_notes(note, probe.note)
        self._pending.append(Call(self.token, layer, T, phase, probe, bracket, note))

    def around_routed_moe(self, layer: int, T: int, run):
        """The model's hook around each routed-MoE call: ``model.profile_events`` holds the probe's points for the call
        (``moe_host_timed`` off unless the probe is ds4's path), restored after it. A failing call (RuntimeApiError)
        is recorded in :attr:`errors` and re-raised."""
        m = self.model
        status = self.status()
        phase = "eager" if status == "none" else "capture"
        probe = self.impl.instrument(layer, T, status, phase)
        opts_before, points_before = m.opts, m.profile_events
        if not probe.reads_on_host and m.opts.moe_host_timed:
            m.opts = dataclasses.replace(m.opts, moe_host_timed=False)
        opts_call = m.opts
        m.profile_events = probe.points
        n_log = len(m.moe_profile_log)
        try:
            y = run()
        except RuntimeApiError as e:
            probe.error, probe.status_after = e.name, self.status()
            self.errors.append({"token": self.token, "layer": layer, "tokens": T, "phase": phase, "error": e.name,
                                "status_after": probe.status_after, "where": "call"})
            self._call_probes.append(probe)
            raise
        finally:
            if m.opts is opts_call:
                m.opts = opts_before
            if m.profile_events is probe.points:
                m.profile_events = points_before
        probe.mode.after_call(probe, n_log)
        if phase == "capture":
            self._graph_probe[(layer, T)] = probe
        self._call_probes.append(probe)
        return y

    # ------------------------------------------------------------------ poison (stale-value detection)
    def poison(self) -> None:
        """Re-record every pooled event back to back and clear the stamp slots, now (not capturing), and remember what
        the events read: a later read that returns these values was not re-recorded. Raises RuntimeError while the
        stream captures."""
        be, stream = self.be, self.model.L.stream()
        if capture_status(be, stream) != "none":
            raise RuntimeError("poison() while the stream captures")
        sets = self.impl.event_sets()
        for evs in sets:
            for e in evs:
                be.event_record(stream, e)
        slots = self.impl.stamp_slots()
        if slots is not None:
            be.memset_async(stream, slots, 0)
        be.stream_synchronize(stream)
        self.poisoned = {}
        for evs in sets:
            try:
                self.poisoned[id(evs)] = tuple(be.event_elapsed_ms(evs[i], evs[i + 1]) for i in range(6))
            except RuntimeApiError:
                pass

    # ------------------------------------------------------------------ reading
    def read(self) -> list[dict]:
        """Rows (:data:`ROW_COLUMNS`) for every call waiting to be read, after synchronizing the stream (a failure is
        recorded in :attr:`errors`, ``where`` = ``read``); nothing while the stream captures."""
        if not self._pending:
            return []
        be, stream = self.be, self.model.L.stream()
        status = capture_status(be, stream)
        if status != "none":
            return []  # the guard: no synchronize, no read, while the stream captures
        calls, self._pending = self._pending, []
        try:
            be.stream_synchronize(stream)
        except RuntimeApiError as e:
            self.errors.append({"token": self.token, "layer": -1, "tokens": 0, "phase": "read", "error": e.name,
                                "status_after": capture_status(be, stream), "where": "read"})
        return self.impl.read(calls)

    def read_error(self, c: Call, e: RuntimeApiError) -> None:
        """Record a failed read of call ``c`` in :attr:`errors` (``where`` = ``read``)."""
        self.errors.append({"token": c.token, "layer": c.layer, "tokens": c.tokens, "phase": c.phase,
                            "error": e.name, "status_after": self.status(), "where": "read"})
