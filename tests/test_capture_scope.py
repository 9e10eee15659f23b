"""Capture that always ends: ``capture_scope`` and the graph cache under exceptions that are not
CUDA errors (``KeyboardInterrupt`` from Ctrl-C, a ``KeyError`` in a cluster), on the sim and the GPU."""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.capture.cache import CapturePolicy, GraphCache
from ds4lab.capture.scope import capture_scope
from ds4lab.token.config import get_preset
from ds4lab.errors import CudaError
from ds4lab.token.model import DecodeModel, TokenOptions

TINY = get_preset("tiny")
pytestmark = pytest.mark.usefixtures("graphs_on")




def _interrupt_once_while_capturing(model, layer: int, exc: BaseException, eager_at: int | None = None):
    """Make ``model``'s shared cluster of ``layer`` switch the thread's override to a stray stream
    and raise ``exc`` the first time it runs inside a capture (after issuing its launches, which
    the discarded graph holds and nothing executes). ``eager_at``: instead raise, before any
    launch, on the ``eager_at``-th eager call: the same device state, for a reference model."""
    orig = model._shared
    stray = model.be.new_stream()
    state = {"raised": False, "calls": 0}

    def shared(l, y):
        if l == layer and not state["raised"]:
            state["calls"] += 1
            if eager_at is not None and state["calls"] == eager_at:
                state["raised"] = True
                raise exc
            if eager_at is None and model.L.capturing:
                state["raised"] = True
                orig(l, y)  # these launches land in the partial graph, never executed
                S.capture_set_stream(stray)
                raise exc
        orig(l, y)

    model._shared = shared
    return state


from helpers import decode_hidden as _tokens  # noqa: E402


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), KeyError("router")], ids=["KeyboardInterrupt", "KeyError"])
def test_graph_cache_ends_capture_on_any_exception_sim(sim, exc):
    r = DecodeModel(TINY, sim, TokenOptions(vocab=True))  # eager, interrupted at the same point
    _interrupt_once_while_capturing(r, 1, exc, eager_at=2)
    _tokens(r, S.LEGACY_STREAM, [100])
    with pytest.raises(type(exc)):
        r.token(101, 101 % TINY.vocab)
    ref = _tokens(r, S.LEGACY_STREAM, [102, 103])
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True))
    m.executor = cache = GraphCache(sim, CapturePolicy(("shared",), warmup=1))
    s = sim.new_stream()
    state = _interrupt_once_while_capturing(m, 1, exc)
    got = _tokens(m, s, [100])  # token 1 warms every layer eagerly
    with S.stream_override(s):
        with pytest.raises(type(exc)):
            m.token(101, 101 % TINY.vocab)  # token 2 captures: layer 1's capture is interrupted
        # the capture ended, the partial graph is gone, the override is back to s
        assert state["raised"]
        assert sim.capture_status(s) == "none" and sim.rt.live == []
        assert S.capture_get_override() is s
        assert m.L.capturing is False and m.L.trace is None
    assert cache.stats.aborts == 1
    abort = [e for e in cache.log if e["event"] == "abort"]
    assert len(abort) == 1 and type(exc).__name__ in abort[0]["reason"] and abort[0]["status_after"] == "none"
    assert abort[0]["key"].site[:2] == ("shared", 1)
    assert not any(k.site[:2] == ("shared", 1) for k in cache.entries)  # left uncaptured, not retired
    # eager work on s runs now (not captured) and cudaMalloc is not refused
    x = sim.zeros((8,), np.float32)
    sim.memset_async(s, x, 0)
    sim.free(sim.malloc((16,), np.float32))
    # the run goes on: the interrupted key captures at its next call, results stay exact
    got = _tokens(m, s, [102, 103])
    assert cache.stats.captures == TINY.n_layers and cache.stats.retirements == 0
    assert cache.stats.replays > 0
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


def test_capture_scope_normal_exit_returns_the_graph(sim):
    s = sim.new_stream()
    x = sim.zeros((8,), np.float32)
    with capture_scope(sim, s, "global") as cap:
        sim.memset_async(s, x, 1)
    assert cap.graph is not None and [n["kind"] for n in sim.graph_nodes(cap.graph)] == ["memset"]
    assert cap.aborted_by == "" and sim.capture_status(s) == "none"


def test_capture_scope_records_the_end_error_and_raises_the_original(sim):
    s = sim.new_stream()
    before = S.capture_set_stream(None)
    S.capture_set_stream("outer")
    try:
        with pytest.raises(KeyError, match="boom"):
            with capture_scope(sim, s, "thread_local") as cap:
                with pytest.raises(CudaError):
                    sim.synchronize()  # invalidates the capture: ending it will fail
                S.capture_set_stream(s)
                raise KeyError("boom")
        assert cap.end_error.startswith("CudaError") and "cudaErrorStreamCaptureInvalidated" in cap.end_error
        assert cap.graph is None and cap.status_after == "none" and "KeyError" in cap.aborted_by
        assert S.capture_get_override() == "outer"
    finally:
        S.capture_set_stream(before)


def test_capture_scope_end_error_on_normal_exit_propagates(sim):
    s = sim.new_stream()
    with pytest.raises(CudaError, match="cudaErrorStreamCaptureInvalidated"):
        with capture_scope(sim, s, "thread_local"):
            try:
                sim.synchronize()
            except CudaError:
                pass
    assert sim.capture_status(s) == "none"


@pytest.mark.gpu
def test_graph_cache_ends_capture_on_keyboard_interrupt_gpu(cupy_backend):
    be = cupy_backend
    m = DecodeModel(TINY, be, TokenOptions(vocab=True))
    m.executor = cache = GraphCache(be, CapturePolicy(("shared",), warmup=1))
    s = be.new_stream()
    _interrupt_once_while_capturing(m, 1, KeyboardInterrupt())
    _tokens(m, s, [100])
    with S.stream_override(s):
        with pytest.raises(KeyboardInterrupt):
            m.token(101, 101 % TINY.vocab)
        assert be.capture_status(s) == "none"
        assert S.capture_get_override() is s
    assert cache.stats.aborts == 1
    # eager work on s runs (a capture left open would swallow it) and cudaMalloc is not refused
    x = be.zeros((8,), np.float32)
    be.memset_async(s, x, 0)
    be.stream_synchronize(s)
    be.free(be.malloc((16,), np.float32))
    r = DecodeModel(TINY, be, TokenOptions(vocab=True))
    _interrupt_once_while_capturing(r, 1, KeyboardInterrupt(), eager_at=2)
    _tokens(r, S.LEGACY_STREAM, [100])
    with pytest.raises(KeyboardInterrupt):
        r.token(101, 101 % TINY.vocab)
    ref = _tokens(r, S.LEGACY_STREAM, [102, 103])
    got = _tokens(m, s, [102, 103])
    assert cache.stats.captures == TINY.n_layers and cache.stats.replays > 0
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


def _cluster(m, x, n: int):
    """A cluster of ``n`` ``x += 1`` launches (its node count is the graph's topology)."""
    def ref():
        np.add(x, 1, out=x)

    def fn():
        for _ in range(n):
            m.L.kernel("probe.add", "tiny_add", (1,), (32,), (x, np.int32(x.size)), ref, nbytes=8 * x.size)
    return fn


def test_refused_update_reinstantiates_instead_of_retiring(sim):
    """Stage 3u's cache: an update CUDA refuses (cudaGraphExecUpdate: topology changed) instantiates
    the new graph and goes on; updates, re-instantiations and fallbacks are counted apart."""
    m = DecodeModel(TINY, sim, TokenOptions())
    cache = GraphCache(sim, CapturePolicy(("shared",), warmup=1, update=True, guard=False))
    x = sim.zeros((4,), np.float32)
    s = sim.new_stream()
    with S.stream_override(s):
        for n in (1, 1, 1, 2, 2, 3):  # warm-up, capture, update, refused ×2 ... 
            cache.run(m, "shared", 0, 1, None, _cluster(m, x, n))
            sim.synchronize()
    assert x[0] == 1 + 1 + 1 + 2 + 2 + 3  # every call ran its own launches, none stale
    st = cache.stats.as_dict()
    # every call after the warm-up captured (5 captures): one instantiated, 2 updates, 2 refused → re-instantiated
    assert (st["captures"], st["updates"], st["reinstantiations"], st["fallbacks"], st["retirements"]) == (5, 2, 2, 0, 0)
    assert st["update_results"] == {"cudaGraphExecUpdateErrorTopologyChanged/-": 2}
    assert st["replays"] == 5 and st["eager_runs"] == 0
    refused = [e for e in cache.log if e["event"] == "update refused"]
    assert [e["result"] for e in refused] == ["cudaGraphExecUpdateErrorTopologyChanged"] * 2


def test_failed_recapture_for_update_falls_back_and_is_counted(sim):
    m = DecodeModel(TINY, sim, TokenOptions())
    cache = GraphCache(sim, CapturePolicy(("shared",), warmup=0, update=True, guard=False))
    x = sim.zeros((4,), np.float32)
    s = sim.new_stream()
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        _cluster(m, x, 1)()
        if calls["n"] == 2 and m.L.capturing:
            sim.synchronize()  # refused in capture: the re-capture fails

    with S.stream_override(s):
        for _ in range(3):
            try:
                cache.run(m, "shared", 0, 1, None, fn)
            finally:
                sim.synchronize()
    st = cache.stats
    assert st.captures == 1 and st.fallbacks == 1 and st.retirements == 1 and st.updates == 0
    assert st.failures["cudaErrorStreamCaptureUnsupported"] == 1


def test_conformance_scenario_interrupted_inside_a_capture_ends_it(sim):
    """A scenario body raising KeyboardInterrupt inside ``_capture``: the capture ends, the
    interrupt reaches the caller (a run is stopped, not recorded as a scenario bug)."""
    from ds4lab import conformance as CF

    streams = []

    def interrupted(r):
        s = r.be.new_stream()
        streams.append(s)
        CF._capture(r, s, "global", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))

    CF.SCENARIOS.append(CF.Scenario("_interrupted", interrupted, "test"))
    try:
        with pytest.raises(KeyboardInterrupt):
            CF.run_scenarios(sim, ["_interrupted"])
    finally:
        CF.SCENARIOS.pop()
    assert sim.capture_status(streams[0]) == "none" and sim.rt.live == []
    assert "new_stream" not in vars(sim)  # the stream tracker is gone again


def test_conformance_ends_a_capture_a_scenario_left_open(sim):
    from ds4lab import conformance as CF

    streams = []

    def left_open(r):
        s = r.be.new_stream()
        streams.append(s)
        r.call("begin_capture", r.be.begin_capture, s, "relaxed")

    CF.SCENARIOS.append(CF.Scenario("_left_open", left_open, "test"))
    try:
        out = CF.run_scenarios(sim, ["_left_open"])
    finally:
        CF.SCENARIOS.pop()
    assert out["_left_open"]["<left capturing>"] == "active"
    assert sim.capture_status(streams[0]) == "none"


@pytest.mark.gpu
def test_capture_scope_on_a_raw_cupy_stream_gpu(cupy_backend):
    """The benchmarks' and calibration's captures (a bare ``cupy.cuda.Stream``)."""
    import cupy

    st = cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros(16, dtype=np.float32)
    with pytest.raises(KeyboardInterrupt):
        with capture_scope(None, st, "relaxed") as cap:
            with st:
                x += 1  # captured into the partial graph, which is dropped
            raise KeyboardInterrupt
    assert not st.is_capturing() and cap.end_error == "" and cap.status_after == "none"
    with capture_scope(None, st, "thread_local") as cap:
        with st:
            x += 1
    cap.graph.launch(st)
    st.synchronize()
    assert float(x[0]) == 1.0  # the aborted capture's add never ran; the graph's ran once
