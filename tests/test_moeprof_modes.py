"""The profiler's seams on the ``sim`` backend (CPU only, ``tiny``): the mode classes behind one
interface, the facade's choice of class, ``host-timed``'s fallback by composition, and attaching
that restores exactly what it changed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ds4lab import moeprof as M
from ds4lab.token.config import get_preset
from ds4lab.token.model import ProfileMarker
from ds4lab.moeprof import modes as MD
from ds4lab.sim import SimBackend

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def wb():
    """A timing-only sim workbench with one layer."""
    return M.MoeWorkbench(SimBackend(seed=TINY.seed, timing_only=True), TINY, max_tokens=4, n_layers=1)


# ----------------------------------------------------------------------------- the facade's choice
def test_modes_come_from_the_mode_classes():
    assert M.MODES == tuple(MD.MODE_CLASSES) == ("host-timed", "deferred", "graph-boundary", "in-graph", "cupti",
                                                 "nvtx")
    assert M.STAGE_MODES == ("host-timed", "deferred", "in-graph", "cupti")
    assert all(cls.name == name and issubclass(cls, MD.ProfilingMode) for name, cls in MD.MODE_CLASSES.items())
    assert [MD.auto_regime(m) for m in M.MODES] == ["eager", "eager", "replayed", "replayed", "eager", "eager"]
    assert MD.auto_regime("perf") == "eager"
    assert sorted(M.MODES, key=MD.runs_last)[-1] == "cupti"


@pytest.mark.parametrize("mode", M.MODES)
def test_the_profiler_builds_its_mode_class(wb, mode):
    p = M.MoeProfiler(wb.model, mode, routing="r")
    assert type(p.impl) is MD.MODE_CLASSES[mode] and p.impl.prof is p
    assert p.available and p.unavailable_reason == ""  # sim: the modeled timeline stands in for CUPTI


@pytest.mark.parametrize("fallback,cls", [(True, MD.InGraph), ("in-graph", MD.InGraph), ("deferred", MD.Deferred),
                                          (False, type(None))])
def test_host_timed_composes_its_fallback(wb, fallback, cls):
    p = M.MoeProfiler(wb.model, "host-timed", fallback=fallback)
    assert isinstance(p.impl, MD.HostTimed) and type(p.impl.fallback) is cls
    if cls is MD.InGraph:
        assert not p.impl.fallback.every_step  # slots cleared only once the fallback stamps
    q = M.MoeProfiler(wb.model, "deferred", fallback=fallback)  # only host-timed takes a fallback
    assert type(q.impl) is MD.Deferred and not hasattr(q.impl, "fallback")


def test_bad_mode_and_fallback_are_refused_by_name(wb):
    with pytest.raises(ValueError, match="unknown profiling mode 'perf'; choose one of: host-timed"):
        MD.make_mode(None, "perf")
    with pytest.raises(ValueError, match=r"fallback='cupti': choose True, 'in-graph' or 'deferred'"):
        M.MoeProfiler(wb.model, "host-timed", fallback="cupti")
    with pytest.raises(ValueError, match="read_every=0"):
        M.MoeProfiler(wb.model, "deferred", read_every=0)


# ----------------------------------------------------------------------------- each mode instruments a call
POINTS = {"host-timed": ("host", 7, False), "deferred": ("events", 7, False), "in-graph": ("stamps", 7, True),
          "nvtx": ("nvtx", 7, True), "graph-boundary": ("none", 0, False), "cupti": ("none", 0, False)}


@pytest.mark.parametrize("mode", M.MODES)
def test_each_mode_instruments_one_call_and_reads_it_back(wb, mode, graphs_restored):
    p = M.MoeProfiler(wb.model, mode, routing="uniform")
    kind, n, markers = POINTS[mode]
    with wb.session(), p.attached(calls_per_read=1):
        probe = p.impl.instrument(0, 2, "none", "eager")
        assert probe.kind == kind and probe.mode is p.impl and len(probe.points) == n
        assert all(isinstance(x, ProfileMarker) for x in probe.points) == markers or n == 0
        assert probe.reads_on_host == (mode == "host-timed")
        p.begin_step(0)
        wb.prepare(0, 2, "uniform")
        wb.moe_call(0, 2)
        assert len(p._pending) == 1 and p._pending[0].probe.mode is p.impl
        calls = list(p._pending)
        rows = p.end_step()
    assert not p._pending and {r["mode"] for r in rows} == {mode} and {r["phase"] for r in rows} == {"eager"}
    assert [r["stage"] for r in rows] == (["total"] if mode == "graph-boundary" else list(M.STAGES))
    ms = np.array([r["ms"] for r in rows], dtype=float)
    assert np.isnan(ms).all() if mode == "nvtx" else (np.isfinite(ms).all() and ms[-1] > 0)
    assert calls[0].probe.kind == kind


def test_host_timed_under_capture_refuses_or_hands_the_call_to_its_fallback(wb, graphs_restored):
    ref = M.MoeProfiler(wb.model, "host-timed")
    with wb.session(), ref.attached():
        with pytest.raises(M.ProfilerCaptureError) as e:
            ref.impl.instrument(0, 2, "active", "capture")
    assert e.value.status == "active" and ref.errors[-1]["where"] == "guard"
    for fallback, cls, kind in (("in-graph", MD.InGraph, "stamps"), ("deferred", MD.Deferred, "events")):
        p = M.MoeProfiler(wb.model, "host-timed", fallback=fallback)
        with wb.session(), p.attached():
            with pytest.warns(RuntimeWarning, match=f"timed {fallback} instead"):
                probe = p.impl.instrument(0, 2, "active", "capture")
            assert type(probe.mode) is cls and probe.mode is p.impl.fallback and probe.kind == kind
            assert "host-timed refused while the stream captures (status active)" in probe.note
            eager = p.impl.instrument(0, 2, "none", "eager")  # not capturing: ds4's own path
            assert eager.mode is p.impl and eager.reads_on_host and not p.errors
    unguarded = M.MoeProfiler(wb.model, "host-timed", guard=False)
    with wb.session(), unguarded.attached():
        assert unguarded.impl.instrument(0, 2, "active", "capture").mode is unguarded.impl


def test_event_sets_and_slots_for_poison(wb):
    p = M.MoeProfiler(wb.model, "host-timed", fallback="deferred")
    with p.attached(calls_per_read=2):
        sets = p.impl.event_sets()
        assert len(sets) == 3 and sets[:2] == p.impl.fallback.pool and sets[2] is p.impl.events
        assert p.impl.stamp_slots() is None
    g = M.MoeProfiler(wb.model, "in-graph")
    with g.attached():
        assert g.impl.event_sets() == [] and g.impl.stamp_slots() is g.impl.slots is not None


# ----------------------------------------------------------------------------- attaching restores what it changed
def test_set_options_made_while_attached_survives_detach(wb, graphs_restored):
    m = wb.model
    before = m.opts
    assert not before.moe_profile and not before.moe_host_timed and before.counts_clear == "async"
    p = M.MoeProfiler(m, "host-timed")
    with p.attached():
        assert m.opts.moe_profile and m.opts.moe_host_timed  # what the mode needs while attached
        m.set_options(dataclasses.replace(m.opts, counts_clear="sync"))
    assert m.opts.counts_clear == "sync"  # the change made while attached stays
    assert not m.opts.moe_profile and not m.opts.moe_host_timed  # the profiler's own fields go back
    m.set_options(before)
    with p.attached():
        pass
    assert m.opts is before  # untouched while attached: the very object is restored


def test_a_profiler_field_changed_while_attached_stays(wb):
    m = wb.model
    before = m.opts
    p = M.MoeProfiler(m, "host-timed")
    try:
        with p.attached():
            m.set_options(dataclasses.replace(m.opts, moe_host_timed=False, scalars="device"))
        assert m.opts.scalars == "device" and not m.opts.moe_host_timed and not m.opts.moe_profile
        m.set_options(dataclasses.replace(before, moe_profile=True))
        c = M.MoeProfiler(m, "cupti")  # cupti turns the profiling points off while attached
        with c.attached():
            assert not m.opts.moe_profile
            m.set_options(dataclasses.replace(m.opts, moe_profile=True))  # turned back on meanwhile
        assert m.opts.moe_profile
    finally:
        m.set_options(before)


@pytest.mark.parametrize("mode", M.MODES)
def test_profile_events_are_swapped_for_each_call_only(wb, mode, graphs_restored):
    m = wb.model
    events = m.profile_events
    seen = []
    p = M.MoeProfiler(m, mode)
    with wb.session(), p.attached():
        real = m._routed_moe
        m._routed_moe = lambda *a: (seen.append(m.profile_events), real(*a))[1]
        try:
            wb.step(p, 0, 2, "uniform", [0])
        finally:
            del m._routed_moe
        assert m.profile_events is events and m.moe_observer is p  # between calls: the model's own
    assert len(seen) == 1 and len(seen[0]) == POINTS[mode][1]  # during the call: the probe's points
    assert m.profile_events is events and m.moe_observer is None


def test_falsy_fallbacks_are_checked_as_before(wb):
    for off in (False, None, 0):
        assert M.MoeProfiler(wb.model, "host-timed", fallback=off).impl.fallback is None
    with pytest.raises(ValueError, match="fallback=''"):
        M.MoeProfiler(wb.model, "host-timed", fallback="")
