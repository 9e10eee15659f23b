"""Two simulated devices in one process (``ds4lab.sim.devices``): streams per device, the unsafe-call rule
across devices, peer copies, NCCL all-reduce eagerly and captured, and every way a collective fails to
complete (each rule of ``RULES`` whose name starts ``nccl_``, ``peer_`` or ``memcpy_peer`` is asserted
here), and the conformance runner's skip for two-GPU scenarios on a smaller machine. CPU only, seconds."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.errors import CollectiveError, CudaError
from ds4lab.sim.devices import LinkModel, SimNode
from ds4lab.sim.rules import RULES

f32 = np.float32
TIMEOUT = 0.25


@pytest.fixture
def node():
    n = SimNode(2, collective_timeout_s=TIMEOUT)
    for be in n.devices:
        be.rt.record_rules = True
    return n


def both(fn):
    """``fn(rank)`` on two threads; returns ``[result or exception, ...]``."""
    out = [None, None]

    def run(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out[r] = e

    ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert not any(t.is_alive() for t in ts), "a rank thread hung"
    return out


def fired(be, rule):
    return any(r == rule for r, _ in be.rt.fired)


def kern(be, stream, fn, nbytes=4000):
    be.launch(stream, "k", (1,), (32,), (), 0, fn, nbytes)


def test_every_device_rule_is_in_the_table_with_a_source():
    names = ("peer_copy", "peer_copy_capture", "memcpy_peer_implicit", "memcpy_peer_escape", "nccl_capture",
             "nccl_pair", "nccl_mismatch", "nccl_nonuniform", "nccl_timeout", "nccl_global_multithread")
    for n in names:
        assert n in RULES and RULES[n].source, n
    # the behaviours no source states are marked so, for the two-GPU machine to settle
    for n in ("peer_copy_capture", "memcpy_peer_implicit", "memcpy_peer_escape", "nccl_mismatch", "nccl_nonuniform",
              "nccl_global_multithread"):
        assert "GUESS" in RULES[n].source, n


def test_a_stream_belongs_to_its_device(node):
    b0, b1 = node.devices
    s1 = b1.new_stream()
    assert s1.name.startswith("d1:")
    with pytest.raises(CudaError) as ei:
        kern(b0, s1, lambda: None)
    assert ei.value.name == "cudaErrorInvalidResourceHandle"


def test_unsafe_calls_follow_threads_across_devices(node):
    """Another thread's global capture on device 0 prohibits a cudaMalloc on device 1 (and is invalidated by
    it); a thread-local capture leaves the other thread alone."""
    b0, b1 = node.devices
    for mode, refused in (("global", True), ("thread_local", False)):
        s0 = b0.new_stream()
        b0.begin_capture(s0, mode)
        _, e = both(lambda r: b1.malloc((16,), f32) if r == 1 else None)
        assert (isinstance(e, CudaError) and e.name == "cudaErrorStreamCaptureUnsupported") == refused, (mode, e)
        assert b0.capture_status(s0) == ("invalidated" if refused else "active")
        if refused:
            with pytest.raises(CudaError):
                b0.end_capture(s0)
        else:
            b0.end_capture(s0)


def test_peer_copy_eager_and_captured(node):
    b0, b1 = node.devices
    x0, x1 = b0.zeros((8,), f32), b1.zeros((8,), f32)
    s0 = b0.new_stream()
    x0[...] = 3
    node.memcpy_peer_async(x1, 1, x0, 0, s0, 0)
    assert (x1 == 3).all() and fired(b0, "peer_copy")
    assert b0.stream_ready_us(s0) >= LinkModel().peer_us(32)
    b0.begin_capture(s0, "thread_local")
    kern(b0, s0, lambda: np.add(x0, 1, out=x0))
    node.memcpy_peer_async(x1, 1, x0, 0, s0, 0)
    g = b0.end_capture(s0)
    assert [n["kind"] for n in b0.graph_nodes(g)] == ["kernel", "memcpy"] and fired(b0, "peer_copy_capture")
    assert (x1 == 3).all()  # nothing ran at capture
    ex = b0.graph_instantiate(g)
    b0.graph_launch(ex, s0)
    b0.graph_launch(ex, s0)
    assert (x1 == 5).all()
    with pytest.raises(ValueError, match="neither"):
        node.memcpy_peer_async(x1, 1, x0, 0, b0.new_stream(), 3)


def test_ds4s_memcpy_peer_during_a_capture(node):
    """cudaMemcpyPeer while device 0 captures: refused on a blocking capture (invalidated), run at once and
    left out of the graph on a non-blocking one."""
    b0, b1 = node.devices
    x0, x1 = b0.zeros((8,), f32), b1.zeros((8,), f32)
    x0[...] = 2
    sb = b0.new_stream(non_blocking=False)
    b0.begin_capture(sb, "global")
    with pytest.raises(CudaError) as ei:
        node.memcpy_peer(x1, 1, x0, 0)
    assert ei.value.name == "cudaErrorStreamCaptureImplicit" and b0.capture_status(sb) == "invalidated"
    assert (x1 == 0).all()
    with pytest.raises(CudaError):
        b0.end_capture(sb)
    sn = b0.new_stream(non_blocking=True)
    b0.begin_capture(sn, "global")
    node.memcpy_peer(x1, 1, x0, 0)
    assert (x1 == 2).all() and fired(b0, "memcpy_peer_escape") and ("cudaMemcpyPeer", "memcpy PtoP") in b0.escapes
    assert b0.graph_nodes(b0.end_capture(sn)) == []


def _reduce_pair(node, comms, vals):
    def rank(r):
        be = node.devices[r]
        s = be.new_stream()
        x, y = be.zeros((vals[r].size,), f32), be.zeros((vals[r].size,), f32)
        x[...] = vals[r]
        comms[r].all_reduce(x, y, s)
        return y.copy(), be.stream_ready_us(s)
    return both(rank)


def test_allreduce_sums_in_rank_order_identically_on_both_ranks(node):
    comms = node.comm_init_all()
    rng = np.random.default_rng(0)
    vals = [(rng.standard_normal(257) * 10.0 ** rng.integers(-3, 3, 257)).astype(f32) for _ in range(2)]
    (y0, t0), (y1, t1) = _reduce_pair(node, comms, vals)
    want = vals[0] + vals[1]  # float32 + float32: NCCL's sum of two ranks
    assert y0.tobytes() == y1.tobytes() == want.astype(f32).tobytes()
    assert t0 == t1 > 0  # both ranks' devices start it when the later one is ready, and end together
    assert all(fired(be, "nccl_pair") for be in node.devices)
    assert node.groups[0].log[0][2] == "ok"


def test_allreduce_waits_for_the_later_rank(node):
    comms = node.comm_init_all()
    b0, b1 = node.devices

    def rank(r):
        be = node.devices[r]
        s = be.new_stream()
        x = be.zeros((4,), f32)
        if r == 1:
            be.launch(s, "slow", (1,), (32,), (), 0, lambda: None, 40_000_000)  # rank 1's stream busy first
        comms[r].all_reduce(x, x, s)
        return be.stream_ready_us(s)

    t = both(rank)
    assert t[0] == t[1] > b0.cal.kernel_us("slow", 40_000_000)


def test_captured_allreduce_is_a_node_and_meets_at_replay(node):
    comms = node.comm_init_all()
    gate = threading.Barrier(2)

    def rank(r):
        be = node.devices[r]
        s = be.new_stream()
        x, y = be.zeros((4,), f32), be.zeros((4,), f32)
        x[...] = r + 1
        be.begin_capture(s, "thread_local")
        kern(be, s, lambda: np.add(x, 1, out=x))
        comms[r].all_reduce(x, y, s)
        g = be.end_capture(s)
        kinds = [n["kind"] for n in be.graph_nodes(g)]
        assert (y == 0).all()  # nothing communicated at capture
        gate.wait()
        ex = be.graph_instantiate(g)
        be.graph_launch(ex, s)
        be.graph_launch(ex, s)
        return kinds, float(y[0])

    out = both(rank)
    assert out[0] == out[1] == (["kernel", "kernel"], 7.0), out
    assert all(fired(be, "nccl_capture") for be in node.devices)


@pytest.mark.parametrize("case", ["mismatch", "nonuniform"])
def test_collectives_that_never_complete_raise_at_once_on_both_ranks(node, case):
    comms = node.comm_init_all()

    def rank(r):
        be = node.devices[r]
        s = be.new_stream()
        n = 8 * (r + 1) if case == "mismatch" else 8
        x = be.zeros((n,), f32)
        if case == "nonuniform" and r == 0:
            be.begin_capture(s, "thread_local")
            comms[r].all_reduce(x, x, s)
            ex = be.graph_instantiate(be.end_capture(s))
            be.graph_launch(ex, s)
        else:
            comms[r].all_reduce(x, x, s)

    t = time.monotonic()
    out = both(rank)
    name = {"mismatch": "nccl:mismatch", "nonuniform": "nccl:nonuniform-capture"}[case]
    assert all(isinstance(e, CollectiveError) and e.name == name for e in out), out
    assert time.monotonic() - t < TIMEOUT  # decided when both arrived, not by the timeout
    assert all(fired(be, f"nccl_{case}") for be in node.devices)
    # the communicator stays broken (as after ncclCommAbort): the next collective raises too
    with pytest.raises(CollectiveError, match="broken"):
        comms[0].all_reduce(node.devices[0].zeros((8,), f32), node.devices[0].zeros((8,), f32), S.LEGACY_STREAM)


def test_a_peer_that_never_comes_times_out(node):
    comms = node.comm_init_all()
    b0 = node.devices[0]
    x = b0.zeros((8,), f32)
    t = time.monotonic()
    with pytest.raises(CollectiveError) as ei:
        comms[0].all_reduce(x, x, b0.new_stream())
    dt = time.monotonic() - t
    assert ei.value.name == "nccl:timeout" and TIMEOUT <= dt < TIMEOUT + 1.0 and fired(b0, "nccl_timeout")
    assert "rank(s) 1" in str(ei.value)


def test_one_thread_driving_both_ranks_times_out():
    """NCCL's multi-GPU-from-one-thread hang without group calls: the first rank's call waits for a peer the
    same thread would only call next."""
    node = SimNode(2, collective_timeout_s=TIMEOUT)
    comms = node.comm_init_all()
    xs = [be.zeros((4,), f32) for be in node.devices]
    with pytest.raises(CollectiveError) as ei:
        for r in range(2):
            comms[r].all_reduce(xs[r], xs[r], S.LEGACY_STREAM)
    assert ei.value.name == "nccl:timeout"


@pytest.mark.parametrize("mode,refused", [("global", True), ("thread_local", False), ("relaxed", False)])
def test_nccl_beside_another_threads_global_capture(node, mode, refused):
    comms = node.comm_init_all()
    b0, b1 = node.devices
    s0 = b0.new_stream()
    x1 = b1.zeros((4,), f32)
    b0.begin_capture(s0, mode)
    kern(b0, s0, lambda: None)

    def call(r):
        if r == 1:
            comms[1].all_reduce(x1, x1, b1.new_stream())

    _, e = both(call)
    if refused:
        assert isinstance(e, CollectiveError) and e.name == "nccl:ncclUnhandledCudaError", e
        assert b0.capture_status(s0) == "invalidated" and fired(b1, "nccl_global_multithread")
    else:  # accepted: the peer never comes (rank 0 is capturing), so it times out instead
        assert isinstance(e, CollectiveError) and e.name == "nccl:timeout", e
        assert b0.capture_status(s0) == "active"
    b0.rt._finish(b0.rt.live[0])


def test_allreduce_on_the_legacy_stream_during_a_blocking_capture_is_refused(node):
    comms = node.comm_init_all()
    b0 = node.devices[0]
    sb = b0.new_stream(non_blocking=False)
    b0.begin_capture(sb, "relaxed")
    x = b0.zeros((4,), f32)
    with pytest.raises(CudaError) as ei:
        comms[0].all_reduce(x, x, S.LEGACY_STREAM)
    assert ei.value.name == "cudaErrorStreamCaptureImplicit"


def test_enable_peer_access_twice(node):
    node.enable_peer_access(0, 1)
    with pytest.raises(CudaError) as ei:
        node.enable_peer_access(0, 1)
    assert ei.value.name == "cudaErrorPeerAccessAlreadyEnabled"
    with pytest.raises(CudaError):
        node.enable_peer_access(1, 1)


# ----------------------------------------------------------------------------- the runner's skip
class _OneGpu:
    """Stands in for the cupy backend on a host where the two-GPU scenarios cannot run."""

    name, is_gpu = "cupy", True

    def new_stream(self, non_blocking=True):
        return object()

    def synchronize(self):
        pass

    def capture_status(self, s):
        return "none"


def test_two_gpu_scenarios_are_skipped_with_a_reason_and_not_compared(monkeypatch):
    from ds4lab.backends import cupy_nccl
    from ds4lab.conformance import SCENARIOS, compare, run_scenarios
    from ds4lab.jobs.conformance import expectation_mismatches
    from ds4lab.sim.backend import SimBackend

    monkeypatch.setattr(cupy_nccl, "node_unavailable", lambda n=2: "needs 2 GPUs, this machine has 1")
    names = [s.name for s in SCENARIOS if s.name.startswith("tp_")]
    assert len(names) >= 12
    gpu = run_scenarios(_OneGpu(), names)
    assert all(gpu[n] == {"<skipped>": "two-GPU scenario: needs 2 GPUs, this machine has 1"} for n in names), gpu
    sim = run_scenarios(SimBackend(), names)
    df = compare({"cupy": gpu, "sim": sim})
    assert set(df.step) == {"<skipped>"} and df.agree.isna().all() and set(df.sim) == {"ran"}
    from ds4lab.conformance.runner import disagreeing

    assert disagreeing(df).empty  # not compared: neither agreeing nor disagreeing
    assert expectation_mismatches({"cupy": gpu}).empty


def test_hang_risk_scenarios_need_the_opt_in_on_a_gpu(monkeypatch):
    from ds4lab.backends import cupy_nccl
    from ds4lab.conformance import run_scenarios
    from ds4lab.conformance.tp import HANG_ENV

    monkeypatch.setattr(cupy_nccl, "node_unavailable", lambda n=2: None)
    monkeypatch.delenv(HANG_ENV, raising=False)
    got = run_scenarios(_OneGpu(), ["tp_allreduce_lone_rank"])
    assert HANG_ENV in got["tp_allreduce_lone_rank"]["<skipped>"]
