"""ds4lab's one CUPTI session, on a stand-in ``cupti`` module: kinds enabled while asked for, records to
every subscription that asked, flushes, callbacks with Python stacks on the watched calls only, and
its users (the MoE profiler's trace source, ``bench --per-op``)."""

from __future__ import annotations

import sys
from types import SimpleNamespace as R

import pytest

import fake_cupti
from ds4lab.trace.cupti import AUDIT_KINDS, KERNEL_KINDS, CuptiSession, CuptiUnavailable
from ds4lab.trace.records import ApiCall, Kernel, Memset, api_base_name
from ds4lab.trace.stacks import python_stack, short_path


def kernel(name, start, graph=0, corr=1):
    return R(kind=fake_cupti.ActivityKind.CONCURRENT_KERNEL, name=name.encode(), start=start, end=start + 10,
             device_id=0, stream_id=7, correlation_id=corr, grid_x=2, grid_y=1, grid_z=1, block_x=64, block_y=1,
             block_z=1, static_shared_memory=16, dynamic_shared_memory=32, graph_id=graph, graph_node_id=graph * 3)


def memset(start):
    return R(kind=fake_cupti.ActivityKind.MEMSET, start=start, end=start + 2, device_id=0, stream_id=7,
             correlation_id=9, bytes=64, memory_kind=3, graph_id=0, graph_node_id=0)


def test_one_session_serves_two_users_with_their_kinds(monkeypatch):
    m = fake_cupti.install(monkeypatch)
    s = CuptiSession.get()
    assert CuptiSession.get() is s
    a = s.subscribe(KERNEL_KINDS)
    b = s.subscribe(("CONCURRENT_KERNEL", "RUNTIME"))
    assert m.log.count(("register",)) == 1  # one pair of buffer callbacks per process
    m.deliver([kernel("k", 100), memset(120)])
    m.call("cudaGetDevice_v3020")
    ka, kb = a.take(), b.take()
    assert [r.kind for r in ka] == ["kernel", "memset"] and [r.kind for r in kb] == ["kernel", "api"]
    assert ka[0] == Kernel(name="k", start_ns=100, end_ns=110, device=0, stream=7, correlation=1, grid=(2, 1, 1),
                           block=(64, 1, 1), shared_bytes=48, graph_id=0, graph_node_id=0)
    assert isinstance(ka[1], Memset) and ka[1].bytes == 64 and ka[1].name == "Memset (Device)"
    assert isinstance(kb[1], ApiCall) and kb[1].name == "cudaGetDevice" and kb[1].domain == "runtime"
    assert ("flush", 1) in m.log  # forced flush: records of work still running are delivered
    a.close()
    assert int(fake_cupti.ActivityKind.CONCURRENT_KERNEL) in m.enabled  # b still wants kernels
    assert int(fake_cupti.ActivityKind.MEMSET) not in m.enabled
    m.deliver([kernel("k2", 200)])
    assert a.take() == [] and [r.name for r in b.take()] == ["k2"]
    b.close()
    b.close()  # idempotent
    assert m.enabled == set()


def test_refused_kinds_are_named_and_all_refused_raises(monkeypatch):
    fake_cupti.install(monkeypatch, refuse=("MARKER",))
    s = CuptiSession.get()
    sub = s.subscribe(AUDIT_KINDS)
    assert "MARKER" not in sub.kinds and "CONCURRENT_KERNEL" in sub.kinds
    assert "CUPTI_ERROR_NOT_COMPATIBLE" in s.refused["MARKER"]
    with pytest.raises(CuptiUnavailable, match="refused every activity kind"):
        s.subscribe(("MARKER",))
    sub.close()


def test_missing_cupti_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)
    monkeypatch.setattr(CuptiSession, "_instance", None)
    with pytest.raises(CuptiUnavailable, match="pip install cupti-python"):
        CuptiSession.get()


def _caller(m):
    return m.call("cudaMalloc_v3020")


def test_watched_calls_record_the_callers_python_stack(monkeypatch):
    m = fake_cupti.install(monkeypatch)
    s = CuptiSession.get()
    w = s.watch_calls({"cudaMalloc", "cudaStreamSynchronize"}, skip_files=("fake_cupti.py",))  # CUPTI is C
    on = {cbid for _, cbid in m.callbacks_on}
    assert on == {20, 131, 232}  # every version and per-thread variant of the watched calls, nothing else
    corr = _caller(m)
    other = m.call("cudaLaunchKernel_v7000")
    stack = w.stacks[corr]
    assert stack.split(";")[-1].endswith(" _caller") and "test_cupti_session.py:" in stack.split(";")[-1]
    assert "test_watched_calls_record_the_callers_python_stack" in stack.split(";")[-2]
    assert "cupti.py" not in stack  # the session's own frames are left out
    assert other not in w.stacks
    w.close()
    assert m.subscribers == {}  # unsubscribed when the last watch closes


def test_stack_format_and_names():
    def inner():
        return python_stack(sys._getframe(), limit=2)

    st = inner()
    assert st.startswith("...;") and st.endswith(" inner") and st.count(";") == 2
    assert short_path("/usr/lib/python3.12/site-packages/transformers/generation/utils.py") == \
        "transformers/generation/utils.py"
    assert api_base_name("cudaMemcpyAsync_ptsz_v7000") == "cudaMemcpyAsync"
    assert api_base_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_base_name("cuMemcpyHtoD_v2_ptds") == "cuMemcpyHtoD" and api_base_name("cuLaunchKernel") == \
        "cuLaunchKernel"


def test_moe_trace_source_on_the_session(monkeypatch):
    from ds4lab.moeprof import record_stage
    from ds4lab.trace.live import CuptiTimeline

    m = fake_cupti.install(monkeypatch)
    t = CuptiTimeline()
    t.start()
    m.deliver([kernel("moe_gateup_q4", 10, graph=5), memset(30)])
    got = t.take()
    assert [(r.name, r.start_ns, r.end_ns, r.kind, r.graph_id) for r in got] == [
        ("moe_gateup_q4", 10, 20, "kernel", 5), ("Memset (Device)", 30, 32, "memset", 0)]
    assert [record_stage(r) for r in got] == ["gateup", "sort"]  # the counts-clear memset is the sort's
    t.stop()
    assert m.enabled == set() and t.take() == []


def test_per_op_cupti_path_on_the_session(monkeypatch):
    """``bench --per-op``'s CUPTI path: one token's kernel records matched to its launches."""
    from ds4lab.measure.perop import _cupti_launch_us

    m = fake_cupti.install(monkeypatch)
    names = ["a", "b"]

    class Model:
        def token(self, pos, tid):
            m.deliver([kernel("a", 100 + pos), kernel("b", 200 + pos)])

    be = R(synchronize=lambda: None)
    us, how = _cupti_launch_us(be, Model(), 0, 1, 2, 2, names)
    assert how == "cupti" and us.shape == (2, 2) and (us == 0.01).all()
    assert m.enabled == set()
    us, why = _cupti_launch_us(be, Model(), 0, 1, 1, 2, ["a", "c"])
    assert us is None and "record 1 is 'b'" in why
