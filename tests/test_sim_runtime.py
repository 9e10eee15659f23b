"""The ``sim`` backend's runtime: streams, events, stream-capture rules, graphs, memory, modeled time.

Every capture rule of ``ds4lab.sim.runtime.RULES`` has a test here: the error name, whether the
work is in the graph or escaped, invalidation followed by ``end_capture``'s error, and replays.
CPU only: nothing here needs a GPU.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.errors import CAPTURE_ERRORS, COLLECTIVE_ERRORS, CUPY_ERRORS, LIBRARY_ERRORS, CudaError, CupyRefusal
from ds4lab.sim import RULES, SimBackend
from ds4lab.sim.costmodel import Calibration, default_calibration_path
from ds4lab.sim.memory import is_phantom

f32, i32 = np.float32, np.int32
CAL = {"name": "test", "device": "test device", "source": "unit test", "measured": False,
       "host_launch_us": 10.0, "host_graph_launch_us": 8.0, "host_api_us": 1.0, "kernel_fixed_us": 2.0,
       "graph_node_us": 0.5, "bandwidth_GBps": 1000.0, "memset_us": 1.0, "copy_GBps": 2000.0, "h2d_GBps": 10.0,
       "kernels": {"spin": {"fixed_us": 500.0}, "special": {"fixed_us": 7.0, "bandwidth_GBps": 100.0}}}


@pytest.fixture
def be():
    return SimBackend(calibration=CAL)


@pytest.fixture
def accessor():
    """Flag and this thread's override restored after the test."""
    was, prev = S.graphs_flag(), S.capture_get_override()
    S.set_graphs_enabled(True)
    yield
    S.set_graphs_enabled(was)
    S.capture_set_stream(prev)


def kern(be, stream, fn=None, name="k", nbytes=4000):
    """Launch a kernel whose effect is ``fn`` (its NumPy reference)."""
    be.launch(stream, name, (1,), (32,), (), 0, fn or (lambda: None), nbytes)


def add(buf, v=1):
    def ref():
        buf[...] += v
    return ref


def raises(name, fn, *a):
    with pytest.raises((CudaError, CupyRefusal)) as ei:
        fn(*a)
    assert ei.value.name == name, f"expected {name}, got {ei.value}"
    return ei.value


def in_thread(fn):
    """Run ``fn`` on another thread; return (result, exception)."""
    out = {}

    def run():
        try:
            out["r"] = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out.get("r"), out.get("e")


# ----------------------------------------------------------------------------- the table
def test_rules_table_is_complete_and_cited():
    names = (set(CAPTURE_ERRORS) | set(CUPY_ERRORS) | set(LIBRARY_ERRORS) | set(COLLECTIVE_ERRORS)
             | {"cudaErrorStreamCaptureMerge"})
    for key, r in RULES.items():
        assert r.source and r.when, key
        assert r.error is None or r.error in names, (key, r.error)
        assert r.outcome in ("node", "marks", "joins", "escapes", "raises", "returns", "drops", "frees",
                             "updates"), key
        assert (r.error is not None) == (r.outcome == "raises"), key
        # every rule names its source: the Programming Guide (PG), the Runtime API reference (RT),
        # gpu-facts.md (facts), a CUDA library's reference (cuBLAS), the NCCL User Guide (NCCL) or a
        # measurement on the H200
        assert re.search(r"\b(PG|RT|facts|cuBLAS|NCCL|Measured|measured)\b", r.source), key


def test_info_and_calibration_are_modeled(be):
    info = be.info()
    assert info["device"] == "simulated GPU (calibration: test)" and info["modeled"] is True
    assert be.models_time is True and be.measures_time is False and be.is_gpu is False and be.name == "sim"
    assert be.calibration["name"] == "test" and be.calibration["provenance"] == "unit test"
    d = SimBackend()
    assert d.calibration["path"] == str(default_calibration_path())
    assert d.calibration["measured"] is True  # the shipped calibration is the H200's, measured


def test_calibration_rejects_missing_key_and_keeps_extra_kernel_keys():
    bad = dict(CAL)
    del bad["bandwidth_GBps"]
    with pytest.raises(ValueError, match="bandwidth_GBps"):
        Calibration.load(bad)
    extra = dict(CAL, kernels={"k": {"fixed_us": 3.0, "samples": 12, "median_us": 3.1}})
    assert Calibration.load(extra).kernel_us("k", 0) == 3.0


# ----------------------------------------------------------------------------- eager and captured work
def test_eager_runs_at_enqueue(be):
    x = be.zeros((4,), f32)
    kern(be, S.LEGACY_STREAM, add(x))
    s = be.new_stream()
    kern(be, s, add(x))
    be.memset_async(s, x, 0)
    assert (x == 0).all()
    be.copy_h2d(s, x, np.arange(4, dtype=f32))
    assert (x == np.arange(4)).all()


def test_captured_work_is_nodes_and_replays(be):
    s = be.new_stream(non_blocking=True)
    x = be.zeros((4,), f32)
    src = np.full(4, 3, f32)
    be.begin_capture(s, "thread_local")
    assert be.capture_status(s) == "active"
    be.memset_async(s, x, 0)
    kern(be, s, add(x, 2), name="add2")
    be.copy_h2d(s, x, src)
    kern(be, s, add(x, 1), name="add1")
    assert (x == 0).all()  # nothing ran
    g = be.end_capture(s)
    assert be.capture_status(s) == "none"
    assert be.graph_nodes(g) == [{"kind": "memset", "name": "memset"}, {"kind": "kernel", "name": "add2"},
                                 {"kind": "memcpy", "name": "memcpy HtoD"}, {"kind": "kernel", "name": "add1"}]
    ge = be.graph_instantiate(g)
    be.graph_launch(ge, s)
    assert (x == 4).all()
    src[...] = 10  # the memcpy node holds the host array by reference (a pointer)
    x[...] = 0
    be.graph_launch(ge, be.new_stream())  # replay on any stream
    assert (x == 11).all()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_graph_launch_into_a_capture_is_refused_and_invalidates(be, mode):
    """H200 (gpu-facts.md, 2026-11-30): cudaErrorStreamCaptureUnsupported, capture invalidated."""
    s = be.new_stream()
    x = be.zeros((1,), f32)
    be.begin_capture(s, "thread_local")
    kern(be, s, add(x))
    inner = be.graph_instantiate(be.end_capture(s))
    be.begin_capture(s, mode)
    raises("cudaErrorStreamCaptureUnsupported", be.graph_launch, inner, s)
    assert be.capture_status(s) == "invalidated"
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)
    assert x[0] == 0  # neither captured nor run
    be.graph_launch(inner, s)  # the stream is an ordinary stream again
    assert x[0] == 1


def test_child_graph_node_runs_its_clone(be):
    s = be.new_stream()
    x = be.zeros((1,), f32)
    be.begin_capture(s, "thread_local")
    kern(be, s, add(x))
    child = be.end_capture(s)
    parent = be.graph_create()
    be.graph_add_child(parent, child)
    be.graph_add_child(parent, child)
    be.graph_destroy(child)  # cloned at cudaGraphAddChildGraphNode
    assert [n["kind"] for n in be.graph_nodes(parent)] == ["graph", "graph"]
    be.graph_launch(be.graph_instantiate(parent), s)
    assert x[0] == 2
    be.begin_capture(s, "thread_local")
    buf = be.malloc_async(s, (4,), f32)
    be.free_async(s, buf)
    raises("cudaErrorNotSupported", be.graph_add_child, parent, be.end_capture(s))  # as on the H200


def _mem_graph(be, s, free):
    be.begin_capture(s, "thread_local")
    buf = be.malloc_async(s, (4,), f32)
    kern(be, s, lambda: buf.__setitem__(Ellipsis, 3.0))
    if free:
        be.free_async(s, buf)
    return be.end_capture(s), buf


def test_unfreed_graph_allocation_blocks_relaunch_until_freed(be):
    s = be.new_stream()
    g, buf = _mem_graph(be, s, free=False)
    ge = be.graph_instantiate(g)
    be.graph_launch(ge, s)
    raises("cudaErrorInvalidValue", be.graph_launch, ge, s)  # RT cudaGraphLaunch; H200 facts
    be.free_async(s, buf)  # freed outside the graph: the graph's memory, not the arena's
    be.graph_launch(ge, s)
    assert (buf == 3).all()
    raises("cudaErrorNotSupported", be.graph_instantiate, g)  # one executable per graph with memory nodes
    be.graph_exec_destroy(ge)
    auto = be.graph_instantiate(g, 1)  # AutoFreeOnLaunch
    be.graph_launch(auto, s)
    be.graph_launch(auto, s)


def test_graph_with_alloc_and_free_relaunches(be):
    s = be.new_stream()
    g, _ = _mem_graph(be, s, free=True)
    ge = be.graph_instantiate(g)
    for _ in range(3):
        be.graph_launch(ge, s)
    raises("cudaErrorNotSupported", be.graph_instantiate, g)  # one executable while it lives (RT; H200)


@pytest.mark.parametrize("flags,why", [(1 << 10, "unknown bit"), (2, "Upload without params"),
                                       (4 | 1, "DeviceLaunch + AutoFree")])
def test_instantiate_flags_refused(be, flags, why):
    s = be.new_stream()
    be.begin_capture(s, "thread_local")
    kern(be, s)
    raises("cudaErrorInvalidValue", be.graph_instantiate, be.end_capture(s), flags)


def test_device_launch_only_for_kernel_memset_memcpy_child_graphs(be):
    s = be.new_stream()
    raises("cudaErrorInvalidValue", be.graph_instantiate, be.graph_create(), 4)  # empty
    g, _ = _mem_graph(be, s, free=True)
    raises("cudaErrorInvalidValue", be.graph_instantiate, g, 4)
    be.begin_capture(s, "thread_local")
    kern(be, s)
    be.graph_launch(be.graph_instantiate(be.end_capture(s), 4), s)


def _captured(be, s, *fns):
    be.begin_capture(s, "thread_local")
    for f in fns:
        f()
    return be.end_capture(s)


def test_exec_update_reports_cuda_result_and_node_type(be):
    from ds4lab.errors import GraphExecUpdateError

    s = be.new_stream()
    x = be.zeros((1,), f32)
    ge = be.graph_instantiate(_captured(be, s, lambda: kern(be, s, add(x), name="a")))
    with pytest.raises(GraphExecUpdateError) as ei:
        be.graph_exec_update(ge, _captured(be, s, lambda: kern(be, s, name="a"), lambda: kern(be, s, name="b")))
    assert ei.value.name == "cudaErrorGraphExecUpdateFailure"
    assert (ei.value.result, ei.value.node_type) == ("cudaGraphExecUpdateErrorTopologyChanged", None)
    with pytest.raises(GraphExecUpdateError) as ei:
        be.graph_exec_update(ge, _captured(be, s, lambda: be.memset_async(s, x, 0)))
    assert (ei.value.result, ei.value.node_type) == ("cudaGraphExecUpdateErrorNodeTypeChanged", "memset")
    be.graph_launch(ge, s)
    assert x[0] == 1  # refused updates left the executable as it was
    be.graph_exec_update(ge, _captured(be, s, lambda: kern(be, s, add(x, 10), name="other")))  # function change
    be.graph_launch(ge, s)
    assert x[0] == 11


def test_external_event_record_and_wait_are_nodes(be):
    s, s0 = be.new_stream(), be.new_stream()
    e, ew = be.new_event(), be.new_event()
    be.event_record(s0, ew)
    g = _captured(be, s, lambda: be.stream_wait_event_external(s, ew), lambda: kern(be, s),
                  lambda: be.event_record_external(s, e))
    assert [n["kind"] for n in be.graph_nodes(g)] == ["wait_event", "kernel", "event_record"]
    be.graph_launch(be.graph_instantiate(g), s)
    be.event_synchronize(e)
    assert be.event_query(e) is True


# ----------------------------------------------------------------------------- escaping work (legacy stream)
def test_sync_memset_escapes_nonblocking_capture_and_replay_skips_it(be):
    s = be.new_stream(non_blocking=True)
    counts = be.zeros((8,), i32)
    counts[...] = 5
    be.begin_capture(s, "global")
    be.memset_sync(counts, 0)  # cudaMemset: legacy stream, runs now
    assert (counts == 0).all()
    kern(be, s, add(counts), name="count")
    assert (counts == 0).all()
    g = be.end_capture(s)
    assert [n["kind"] for n in be.graph_nodes(g)] == ["kernel"]
    assert ("cudaMemset", "memset") in be.escapes
    counts[...] = 5
    be.graph_launch(be.graph_instantiate(g), s)
    assert (counts == 6).all()  # the clear was skipped: stale counts + 1
    # The fix: memsetAsync on the capturing stream is in the graph.
    be.begin_capture(s, "global")
    be.memset_async(s, counts, 0)
    kern(be, s, add(counts), name="count")
    ge = be.graph_instantiate(be.end_capture(s))
    counts[...] = 5
    be.graph_launch(ge, s)
    assert (counts == 1).all()


def test_legacy_kernel_escapes_nonblocking_capture(be):
    s = be.new_stream(non_blocking=True)
    x = be.zeros((1,), f32)
    be.begin_capture(s, "thread_local")
    kern(be, S.LEGACY_STREAM, add(x), name="bypass")
    assert x[0] == 1
    g = be.end_capture(s)
    assert be.graph_nodes(g) == []
    be.graph_launch(be.graph_instantiate(g), s)
    assert x[0] == 1


@pytest.mark.parametrize("what", ["memset_sync", "kernel", "event_record", "stream_sync"])
def test_legacy_use_while_blocking_stream_captures_is_implicit(be, what):
    s = be.new_stream(non_blocking=False)
    x = be.zeros((2,), f32)
    be.begin_capture(s, "thread_local")
    x[...] = 7
    call = {"memset_sync": lambda: be.memset_sync(x, 0),
            "kernel": lambda: kern(be, S.LEGACY_STREAM, add(x)),
            "event_record": lambda: be.event_record(S.LEGACY_STREAM, be.new_event()),
            "stream_sync": lambda: be.stream_synchronize(S.LEGACY_STREAM)}[what]
    raises("cudaErrorStreamCaptureImplicit", call)
    assert (x == 7).all()  # not executed
    assert be.capture_status(s) == "invalidated"
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)
    assert be.capture_status(s) == "none"


def test_per_thread_stream_is_blocking_wrt_legacy(be):
    pt = be.per_thread_stream()
    assert pt is be.per_thread_stream()
    other, _ = in_thread(be.per_thread_stream)
    assert other is not pt
    x = be.zeros((1,), f32)
    be.begin_capture(pt, "thread_local")
    raises("cudaErrorStreamCaptureImplicit", be.memset_sync, x, 0)
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, pt)


# ----------------------------------------------------------------------------- unsafe calls (malloc)
@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_malloc_in_capture_refused(be, mode):
    s = be.new_stream()
    be.begin_capture(s, mode)
    raises("cudaErrorStreamCaptureUnsupported", be.malloc, (16,), f32)
    assert be.capture_status(s) == "invalidated"
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)


def test_malloc_in_relaxed_capture_allowed(be):
    s = be.new_stream()
    be.begin_capture(s, "relaxed")
    buf = be.malloc((16,), f32)
    kern(be, s, add(buf))
    g = be.end_capture(s)
    assert be.capture_status(s) == "none" and len(be.graph_nodes(g)) == 1


def test_pool_growth_in_capture_refused_but_reuse_allowed(be):
    s = be.new_stream()
    a = be.malloc((64,), f32)
    be.free(a)
    be.begin_capture(s, "thread_local")
    b = be.empty((64,), f32)  # a freed block of that size: no cudaMalloc
    assert be.address(b) == be.address(a)
    raises("cudaErrorStreamCaptureUnsupported", be.empty, (1000,), f32)  # the pool must grow
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)


def test_global_capture_refuses_malloc_from_any_thread(be):
    s = be.new_stream()
    be.begin_capture(s, "global")
    _, err = in_thread(lambda: be.malloc((16,), f32))
    assert isinstance(err, CudaError) and err.name == "cudaErrorStreamCaptureUnsupported"
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)


def test_thread_local_capture_ignores_other_threads(be):
    s = be.new_stream()
    be.begin_capture(s, "thread_local")
    buf, err = in_thread(lambda: be.malloc((16,), f32))
    assert err is None and buf.shape == (16,)
    kern(be, s)
    assert len(be.graph_nodes(be.end_capture(s))) == 1


def test_other_thread_in_relaxed_interaction_mode_may_malloc_during_global_capture(be):
    s = be.new_stream()
    be.begin_capture(s, "global")

    def relaxed_malloc():
        prev = be.exchange_capture_mode("relaxed")
        try:
            return be.malloc((16,), f32)
        finally:
            be.exchange_capture_mode(prev)

    buf, err = in_thread(relaxed_malloc)
    assert err is None and buf is not None
    be.end_capture(s)


def test_malloc_async_and_free_async_are_memory_nodes(be):
    s = be.new_stream()
    be.begin_capture(s, "global")
    tmp = be.malloc_async(s, (32,), f32)
    kern(be, s, add(tmp), name="use")
    be.free_async(s, tmp)
    g = be.end_capture(s)
    assert [n["kind"] for n in be.graph_nodes(g)] == ["mem_alloc", "kernel", "mem_free"]
    be.graph_launch(be.graph_instantiate(g), s)


# ----------------------------------------------------------------------------- events in capture
def test_event_synchronize_on_captured_event(be):
    s = be.new_stream()
    e = be.new_event()
    be.begin_capture(s, "relaxed")
    kern(be, s)
    be.event_record(s, e)
    raises("cudaErrorCapturedEvent", be.event_synchronize, e)
    assert be.capture_status(s) == "invalidated"
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)


def test_event_elapsed_on_captured_event_does_not_invalidate(be):
    s = be.new_stream()
    e0, e1 = be.new_event(), be.new_event()
    be.event_record(s, e0)
    be.begin_capture(s, "global")
    kern(be, s)
    be.event_record(s, e1)
    raises("cudaErrorCapturedEvent", be.event_elapsed_ms, e0, e1)
    assert be.capture_status(s) == "active"
    g = be.end_capture(s)
    assert [n["kind"] for n in be.graph_nodes(g)] == ["kernel"]  # a captured record is no node


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("which", ["event", "stream"])
def test_query_in_capture_raises_and_invalidates(be, which, mode):
    """gpu-facts.md: cudaStreamQuery on a capturing stream returns 900 and invalidates (every mode)."""
    s = be.new_stream()
    e = be.new_event()
    be.begin_capture(s, mode)
    kern(be, s)
    be.event_record(s, e)
    if which == "event":
        raises("cudaErrorCapturedEvent", be.event_query, e)
    else:
        raises("cudaErrorStreamCaptureUnsupported", be.stream_query, s)
    assert be.capture_status(s) == "invalidated"
    raises("cudaErrorInvalidValue", be.event_query, e)  # facts: event of an invalidated capture
    raises("cudaErrorStreamCaptureUnsupported", be.stream_query, s)  # H200 2026-11-30: 900 on an invalidated capture too
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)
    assert be.stream_query(s) is True  # ended: an ordinary stream again
    raises("cudaErrorInvalidValue", be.event_query, e)  # last recorded in an ended capture


def test_queries_answer_not_ready_while_work_is_pending(be):
    s = be.new_stream()
    e = be.new_event()
    kern(be, s, name="spin", nbytes=0)  # 500 µs of modeled GPU time
    be.event_record(s, e)
    assert be.stream_query(s) is False and be.event_query(e) is False
    be.synchronize()
    assert be.stream_query(s) is True and be.event_query(e) is True


@pytest.mark.parametrize("which", ["device", "stream"])
def test_synchronize_in_capture_refused(be, which):
    s = be.new_stream()
    be.begin_capture(s, "relaxed")
    raises("cudaErrorStreamCaptureUnsupported", be.synchronize if which == "device" else be.stream_synchronize,
           *(() if which == "device" else (s,)))
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)


def test_device_synchronize_refused_while_another_thread_captures(be):
    s = be.new_stream()

    def begin():
        be.begin_capture(s, "relaxed")

    in_thread(begin)
    raises("cudaErrorStreamCaptureUnsupported", be.synchronize)
    assert be.capture_status(s) == "invalidated"


# ----------------------------------------------------------------------------- CuPy-level refusals
def test_read_and_matmul_refused_while_current_stream_captures(be, accessor):
    s = be.new_stream()
    x = be.from_host(np.arange(6, dtype=f32).reshape(2, 3))
    y = be.from_host(np.ones((3, 2), f32))
    with S.stream_override(s):
        np.testing.assert_array_equal(be.read(x), np.arange(6).reshape(2, 3))
        np.testing.assert_array_equal(be.read(be.matmul(s, x, y)), np.arange(6).reshape(2, 3) @ np.ones((3, 2)))
        be.begin_capture(s, "thread_local")
        raises("cupy:D2HDisallowed", be.read, x)
        raises("cupy:CublasInCapture", be.matmul, s, x, y)
        raises("cupy:CublasInCapture", be.matmul, None, x, y)
        assert be.capture_status(s) == "active"  # CuPy refuses before CUDA sees anything
        be.end_capture(s)
    be.read(x)


# ----------------------------------------------------------------------------- fork / join
def test_fork_join(be):
    s1, s2 = be.new_stream(), be.new_stream()
    e1, e2 = be.new_event(), be.new_event()
    order = []
    be.begin_capture(s1, "thread_local")
    kern(be, s1, lambda: order.append("A"), name="A")
    be.event_record(s1, e1)
    be.stream_wait_event(s2, e1)  # fork: s2 joins the capture
    assert be.capture_status(s2) == "active"
    kern(be, s1, lambda: order.append("B"), name="B")
    kern(be, s2, lambda: order.append("C"), name="C")
    be.event_record(s2, e2)
    be.stream_wait_event(s1, e2)  # join back
    kern(be, s1, lambda: order.append("D"), name="D")
    assert order == []
    g = be.end_capture(s1)
    assert be.capture_status(s1) == be.capture_status(s2) == "none"
    assert [n["name"] for n in be.graph_nodes(g)] == ["A", "B", "C", "D"]
    deps = {n.name: sorted(g.nodes[d].name for d in n.deps) for n in g.nodes}
    assert deps == {"A": [], "B": ["A"], "C": ["A"], "D": ["B", "C"]}
    be.graph_launch(be.graph_instantiate(g), s1)
    assert order == ["A", "B", "C", "D"]


def test_unjoined_fork(be):
    s1, s2 = be.new_stream(), be.new_stream()
    e1 = be.new_event()
    be.begin_capture(s1, "thread_local")
    kern(be, s1)
    be.event_record(s1, e1)
    be.stream_wait_event(s2, e1)
    kern(be, s2)  # never joined back
    kern(be, s1)
    raises("cudaErrorStreamCaptureUnjoined", be.end_capture, s1)
    assert be.capture_status(s1) == be.capture_status(s2) == "none"


def test_end_capture_on_forked_stream_is_unmatched(be):
    s1, s2 = be.new_stream(), be.new_stream()
    e1 = be.new_event()
    be.begin_capture(s1, "thread_local")
    be.event_record(s1, e1)
    be.stream_wait_event(s2, e1)
    raises("cudaErrorStreamCaptureUnmatched", be.end_capture, s2)
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s1)


def test_wait_on_event_of_another_capture_is_a_merge(be):
    s1, s3 = be.new_stream(), be.new_stream()
    e = be.new_event()
    be.begin_capture(s1, "relaxed")
    be.begin_capture(s3, "relaxed")
    kern(be, s1)
    be.event_record(s1, e)
    raises("cudaErrorStreamCaptureMerge", be.stream_wait_event, s3, e)
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s3)
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s1)


def test_wait_on_uncaptured_event_is_isolation(be):
    s1, s4 = be.new_stream(), be.new_stream()
    e = be.new_event()
    kern(be, s4)
    be.event_record(s4, e)  # eager
    be.begin_capture(s1, "thread_local")
    raises("cudaErrorStreamCaptureIsolation", be.stream_wait_event, s1, e)
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s1)


# ----------------------------------------------------------------------------- begin / end
@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_end_capture_from_another_thread(be, mode):
    s = be.new_stream()
    be.begin_capture(s, mode)
    _, err = in_thread(lambda: be.end_capture(s))
    assert isinstance(err, CudaError) and err.name == "cudaErrorStreamCaptureWrongThread"
    # Measured on the H200 (conformance end_capture_wrong_thread): the capture is gone afterwards.
    assert be.capture_status(s) == "none"
    raises("cudaErrorIllegalState", be.end_capture, s)


def test_end_capture_from_another_thread_relaxed(be):
    s = be.new_stream()
    be.begin_capture(s, "relaxed")
    kern(be, s)
    g, err = in_thread(lambda: be.end_capture(s))
    assert err is None and len(be.graph_nodes(g)) == 1


def test_begin_end_misuse(be):
    s = be.new_stream()
    raises("cudaErrorIllegalState", be.end_capture, s)
    raises("cudaErrorStreamCaptureUnsupported", be.begin_capture, S.LEGACY_STREAM, "global")
    raises("cudaErrorInvalidValue", be.begin_capture, s, "sometimes")
    be.begin_capture(s, "global")
    raises("cudaErrorIllegalState", be.begin_capture, s, "global")
    be.end_capture(s)


def test_ops_after_invalidation_are_dropped():
    be = SimBackend(calibration=CAL, invalidated_ops="drop")
    s = be.new_stream()
    x = be.zeros((1,), f32)
    be.begin_capture(s, "global")
    kern(be, s, add(x), name="before")
    raises("cudaErrorStreamCaptureUnsupported", be.malloc, (4,), f32)
    kern(be, s, add(x), name="after")
    be.memset_async(s, x, 0)
    assert x[0] == 0 and be.capture_status(s) == "invalidated"
    assert be.capture_info(s)["nodes"] == 1  # "after" and the memset were not recorded
    assert [d[1] for d in be.dropped] == ["after", "memset"]
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)
    kern(be, s, add(x))  # out of capture mode again: eager
    assert x[0] == 1


def test_ops_after_invalidation_can_raise():
    be = SimBackend(calibration=CAL, invalidated_ops="raise")
    s = be.new_stream()
    be.begin_capture(s, "global")
    raises("cudaErrorStreamCaptureUnsupported", be.malloc, (4,), f32)
    raises("cudaErrorStreamCaptureInvalidated", kern, be, s)
    raises("cudaErrorStreamCaptureInvalidated", be.end_capture, s)


# ----------------------------------------------------------------------------- replay hazards
def test_stale_by_value_scalar_vs_device_buffer_scalar(be):
    s = be.new_stream()
    out = be.zeros((2,), i32)
    scal = be.zeros((1,), i32)

    def issue(pos: int):
        p = int(pos)  # by value: the ref closure (and a kernel node) keeps the value

        def by_value():
            out[0] = p

        def by_device():
            out[1] = scal[0]

        be.launch(s, "by_value", (1,), (1,), (out, np.int32(p)), 0, by_value, 8)
        be.launch(s, "by_device", (1,), (1,), (out, scal), 0, by_device, 8)

    be.copy_h2d(s, scal, np.array([3], i32))
    be.begin_capture(s, "thread_local")
    issue(3)
    ge = be.graph_instantiate(be.end_capture(s))
    be.copy_h2d(s, scal, np.array([7], i32))  # "position 7" written before the replay
    be.graph_launch(ge, s)
    assert out.tolist() == [3, 7]  # by value: stale; from the device buffer: current


def test_freed_and_reallocated_buffer_is_corrupted_by_replay(be):
    s = be.new_stream()
    a = be.malloc((16,), f32)

    def fill():
        a[...] = 42

    be.begin_capture(s, "relaxed")
    be.launch(s, "fill", (1,), (16,), (a,), 0, fill, 64)
    ge = be.graph_instantiate(be.end_capture(s))
    addr = be.address(a)
    be.free(a)
    b = be.malloc((16,), f32)  # same size: the same memory
    assert be.address(b) == addr
    b[...] = 1
    be.graph_launch(ge, s)
    be.synchronize()
    assert (be.read(b) == 42).all()  # the graph wrote through the stale pointer into b
    c = be.malloc((1024,), f32)  # another size: other memory
    assert be.address(c) != addr


def test_double_free_is_invalid_value(be):
    a = be.malloc((4,), f32)
    be.free(a)
    raises("cudaErrorInvalidValue", be.free, a)


# ----------------------------------------------------------------------------- modeled time
def test_elapsed_equals_modeled_kernel_time(be):
    s = be.new_stream()
    e0, e1 = be.new_event(), be.new_event()
    kern(be, s, name="spin", nbytes=0)  # 500 µs: the next launches queue behind it
    be.event_record(s, e0)
    kern(be, s, nbytes=3_000_000)  # 2 + 3e6 / (1000 * 1e3) = 5 µs
    kern(be, s, name="special", nbytes=100_000)  # 7 + 1e5 / (100 * 1e3) = 8 µs
    be.event_record(s, e1)
    raises("cudaErrorNotReady", be.event_elapsed_ms, e0, e1)  # host is far ahead of the device: not yet
    be.event_synchronize(e1)
    assert be.event_elapsed_ms(e0, e1) == pytest.approx((5.0 + 8.0) / 1e3)
    assert be.event_query(e1) is True


def test_eager_launches_are_launch_bound_and_graphs_are_not(be):
    s = be.new_stream()
    x = be.zeros((1,), f32)
    be.synchronize()
    t0 = be.host_time_us
    for _ in range(100):
        kern(be, s, add(x), nbytes=1000)  # 2.001 µs of GPU work each, 10 µs of host each
    be.synchronize()
    eager = be.host_time_us - t0
    assert eager == pytest.approx(100 * 10.0 + 2.001, rel=1e-6)  # the last kernel ends after the last launch
    be.begin_capture(s, "thread_local")
    for _ in range(100):
        kern(be, s, add(x), nbytes=1000)
    ge = be.graph_instantiate(be.end_capture(s))
    be.synchronize()
    t0 = be.host_time_us
    be.graph_launch(ge, s)
    be.synchronize()
    replay = be.host_time_us - t0
    # Nodes paced at graph_node_us = 0.5, each 2.001 µs long: device-bound, 100 back to back.
    assert replay == pytest.approx(8.0 + 100 * 2.001, rel=1e-6)
    assert x[0] == 200
    g = [t for t in be.timeline if t[5] is not None]
    assert len(g) == 100 and all(t[5] == ge.graph.id for t in g)


def test_graph_replay_of_tiny_kernels_is_paced_by_graph_node_us():
    be = SimBackend(calibration=dict(CAL, kernel_fixed_us=0.1))
    s = be.new_stream()
    be.begin_capture(s, "thread_local")
    for _ in range(50):
        kern(be, s, nbytes=0)
    ge = be.graph_instantiate(be.end_capture(s))
    be.synchronize()
    t0 = be.host_time_us
    be.graph_launch(ge, s)
    be.synchronize()
    assert be.host_time_us - t0 == pytest.approx(8.0 + 49 * 0.5 + 0.1, rel=1e-6)


@pytest.mark.parametrize("blocking", [True, False])
def test_legacy_stream_implicit_sync(be, blocking):
    s = be.new_stream(non_blocking=not blocking)
    dst = be.zeros((1024,), f32)
    kern(be, s, name="spin", nbytes=0)  # 500 µs on s
    spin_end = be.stream_ready_us(s)
    be.copy_h2d(S.LEGACY_STREAM, dst, np.ones(1024, f32))  # a copy engine: does not need the SMs
    copy = [t for t in be.timeline if t[4] == "memcpy"][-1]
    if blocking:
        assert copy[2] >= spin_end  # the legacy stream waited for the blocking stream
    else:
        assert copy[2] < spin_end  # no implicit sync with a non-blocking stream
    # ... and a blocking stream's next work waits for the legacy stream's.
    kern(be, S.LEGACY_STREAM, name="spin", nbytes=0)
    kern(be, s, name="after")
    after = be.timeline[-1]
    assert after[2] >= be.stream_ready_us(S.LEGACY_STREAM) or not blocking


def test_stream_wait_event_orders_streams(be):
    a, b = be.new_stream(), be.new_stream()
    e = be.new_event()
    be.copy_h2d(a, be.zeros((1 << 20,), f32), np.zeros(1 << 20, f32))  # ~420 µs on a copy engine
    be.event_record(a, e)
    be.stream_wait_event(b, e)
    be.copy_h2d(b, be.zeros((4,), f32), np.zeros(4, f32))
    assert be.timeline[-1][2] >= be.stream_ready_us(a)


# ----------------------------------------------------------------------------- timing only
def test_timing_only_has_no_numbers():
    be = SimBackend(calibration=CAL, timing_only=True)
    x = be.empty((1 << 20,), f32)
    assert is_phantom(x) and x.nbytes == 4 << 20 and x.shape == (1 << 20,)
    with pytest.raises(ValueError):
        x[0] = 1  # read-only: nothing may write into a phantom
    called = []
    s = be.new_stream()
    be.launch(s, "k", (1,), (1,), (x,), 0, lambda: called.append(1), 0)
    be.memset_async(s, x, 0)
    be.copy_h2d(s, be.zeros((4,), f32), np.zeros(4, f32))
    assert called == []
    kern_line = [t for t in be.timeline if t[1] == "k"][0]
    assert kern_line[3] - kern_line[2] == pytest.approx(2.0 + (4 << 20) / 1e6)  # nbytes of the array args
    assert np.isnan(be.read(x)).all()
    assert be.memory_used() > 4 << 20


def test_eager_gap_idles_the_device_before_each_eager_kernel_and_spares_graph_nodes():
    """``eager_gap_us``: the device's own idle before an eager kernel when the host ran ahead (a
    calibration fitted from another engine's recorded tokens); a replayed graph's nodes do not pay it."""
    gap = 3.0
    be = SimBackend(calibration={**CAL, "eager_gap_us": gap})
    s = be.new_stream()
    for _ in range(3):
        kern(be, s, name="spin")  # 500 µs each, the host 10 µs per launch: far ahead
    be.synchronize()
    eager = [t for t in be.timeline if t[1] == "spin"]
    assert [round(b[2] - a[3], 6) for a, b in zip(eager, eager[1:])] == [gap, gap]
    be.begin_capture(s, "thread_local")
    for _ in range(3):
        kern(be, s, name="spin")
    ge = be.graph_instantiate(be.end_capture(s))
    be.graph_launch(ge, s)
    be.synchronize()
    nodes = [t for t in be.timeline if t[1] == "spin"][3:]
    assert len(nodes) == 3 and all(b[2] - a[3] < gap for a, b in zip(nodes, nodes[1:]))
    plain = SimBackend(calibration=CAL)  # without it: back to back
    s2 = plain.new_stream()
    for _ in range(2):
        kern(plain, s2, name="spin")
    plain.synchronize()
    a, b = [t for t in plain.timeline if t[1] == "spin"]
    assert b[2] == a[3]
