"""Scenarios of two devices: peer copies and NCCL all-reduce, eagerly and in each capture mode, each rank a thread
on a node of its own (:func:`ds4lab.tp.ranks.make_node`: sim or two GPUs; skipped with the reason where fewer than
two GPUs or no NCCL). A collective records whether it completed, per rank. Scenarios that could leave a collective
waiting on a GPU run there only with ``DS4LAB_TP_HANG_SCENARIOS=1``. Written from the CUDA and NCCL documentation
(``expect`` and ``source``; GUESS where none states it)."""

from __future__ import annotations

import os
import threading

import numpy as np

from ..capture import stream as S
from ..capture.launch import Launcher
from ..errors import RuntimeApiError
from .framework import MODES, N, Recorder, ScenarioSkipped, f32, i32, scenario

#: Set to 1 to run, on a GPU, the scenarios that could leave a collective waiting (watchdog-guarded).
HANG_ENV = "DS4LAB_TP_HANG_SCENARIOS"
#: How long a collective may wait for its peers: on the sim (a stand-in for a hang; short, so CI stays
#: quick) and on a GPU (the watchdog's limit before ncclCommAbort).
SIM_TIMEOUT_S, GPU_TIMEOUT_S = 0.3, 10.0
_NCCL = "NCCL User Guide, 'Using NCCL with CUDA Graphs'"
_RT = "CUDA Runtime API reference"


def _node(r: Recorder, hang_risk: bool = False):
    """The scenario's node of two devices, on the backend the run is on (see module docstring). Raises ScenarioSkipped
    where it cannot run."""
    from ..tp.ranks import make_node

    be = r.be
    if be.name == "sim":
        return make_node("sim", 2, calibration=getattr(be, "cal", None), collective_timeout_s=SIM_TIMEOUT_S)
    if getattr(be, "is_gpu", False):
        from ..backends.cupy_nccl import node_unavailable

        why = node_unavailable(2)
        if why:
            raise ScenarioSkipped(f"two-GPU scenario: {why}")
        if hang_risk and os.environ.get(HANG_ENV) != "1":
            raise ScenarioSkipped(f"could leave a collective waiting on the GPU: set {HANG_ENV}=1 to run it (a "
                                  f"watchdog aborts the communicators after {GPU_TIMEOUT_S:g} s)")
        return make_node("cupy", 2, collective_timeout_s=GPU_TIMEOUT_S)
    raise ScenarioSkipped(f"the {be.name} backend has no devices")


def _ranks(node, fn) -> None:
    """``fn(rank)`` on both ranks' threads (each device current in its thread). An exception a rank raised is raised
    here after both are done (the runner records it)."""
    from ..tp.ranks import run_ranks

    run_ranks(node, fn, timeout_s=8 * node.collective_timeout_s + 10, raise_first=True)


class _Turns:
    """Both ranks step through phases together; within a phase, rank 0 acts, then rank 1."""

    def __init__(self, node) -> None:
        self.barrier = threading.Barrier(2, timeout=4 * node.collective_timeout_s + 5)

    def sync(self) -> None:
        self.barrier.wait()

    def turn(self, rank: int, fn) -> None:
        for k in range(2):
            self.barrier.wait()
            if k == rank:
                fn()
        self.barrier.wait()


def _kernel(L: Launcher, stream, site: str, name: str, args: tuple, ref) -> None:
    with S.stream_override(stream):
        L.kernel(site, name, (N // 256,), (256,), args, ref, nbytes=8 * N)


def _fill(L: Launcher, x, v: float, stream) -> None:
    """``x[:] = v`` on ``stream`` (the probe kernel ``fill_value``)."""
    def ref():
        x[...] = v

    _kernel(L, stream, "probe.fill", "fill_value", (x, i32(N), f32(v)), ref)


def _add(L: Launcher, x, stream) -> None:
    """``x += 1`` on ``stream`` (the probe kernel ``tiny_add``)."""
    def ref():
        np.add(x, 1, out=x)

    _kernel(L, stream, "probe.add", "tiny_add", (x, i32(N)), ref)


def _buf(node, be, L, stream, v: float = 0.0):
    x = be.zeros((N,), f32)
    if v:
        _fill(L, x, v, stream)
    be.stream_synchronize(stream)
    return x


def _capture_on(r: Recorder, be, s, mode: str, body, tag: str):
    """begin → body → end on ``be`` through the one capture scope, recording ``<tag>begin_capture`` and
    ``<tag>end_capture``; returns the graph or None."""
    from ..capture.scope import capture_scope

    with capture_scope(be, s, mode, begin=lambda st, m: r.call(f"{tag}begin_capture", be.begin_capture, st, m),
                       end=lambda st: r.call(f"{tag}end_capture", be.end_capture, st)) as cap:
        body()
    return cap.graph


#: What a GPU can observe of a collective that never completes, whatever the sim names as its cause
#: (a peer that never came, collectives that differ, a capture that is not uniform): a hang, ended by
#: the watchdog. The sim's causes are held to their rules by tests/test_sim_devices.py.
NEVER_COMPLETES = ("nccl:timeout", "nccl:mismatch", "nccl:nonuniform-capture")


def _complete(r: Recorder, step: str, node, rank: int, stream, fn, *args) -> bool:
    """``fn(*args)`` (a collective, or a graph launch holding one), then a wait for ``stream``: records ``ok``, ``never
    completes`` (:data:`NEVER_COMPLETES`) or the error name under ``step``; True when it completed."""
    try:
        fn(*args)
        node.wait_stream(rank, stream)
    except RuntimeApiError as e:
        r.obs[step] = "never completes" if e.name in NEVER_COMPLETES else e.name
        return False
    r.obs[step] = "ok"
    return True


def _peer_access(r: Recorder, node) -> None:
    """Peer access 0 → 1 and 1 → 0 (``enabled``, or the error; enabled earlier in the process counts)."""
    from ..tp.ranks import enable_peer_access

    for ab, out in enable_peer_access(node).items():
        r.note(f"peer_access_{ab}", out)


def _in_thread(node, fn) -> None:
    """``fn()`` on one worker thread (which switches devices itself), so the runner's thread keeps its device."""
    from ..tp.ranks import run_ranks

    class _One:
        n_devices = 1

        @staticmethod
        def on_device(_):
            node.on_device(0)

    run_ranks(_One, lambda _: fn(), timeout_s=4 * node.collective_timeout_s + 10, raise_first=True)


# ----------------------------------------------------------------------------- peer copies
@scenario("peer copy between two devices (cudaMemcpyPeerAsync), eagerly",
          expect={"can_access_peer": "True", "peer_access_01": "enabled", "peer_copy": "ok", "copy_sync": "ok",
                  "dst_after_copy": "7"},
          source=f"{_RT}: cudaMemcpyPeerAsync, cudaDeviceEnablePeerAccess (rule peer_copy)")
def tp_peer_copy(r: Recorder) -> None:
    """A peer copy from device 0 to device 1 on a stream of device 0, eagerly."""
    with _node(r) as node:

        def body():
            b0 = node.on_device(0)
            L0, s0 = Launcher(b0), b0.new_stream(non_blocking=True)
            x0 = _buf(node, b0, L0, s0, 7.0)
            r.note("can_access_peer", node.can_access_peer(0, 1))
            _peer_access(r, node)
            b1 = node.on_device(1)
            x1 = b1.zeros((N,), f32)
            b1.synchronize()
            node.on_device(0)
            r.call("peer_copy", node.memcpy_peer_async, x1, 1, x0, 0, s0, 0)
            r.call("copy_sync", b0.stream_synchronize, s0)
            node.on_device(1)
            r.value("dst_after_copy", x1, b1)

        _in_thread(node, body)


@scenario("peer copy (cudaMemcpyPeerAsync) on a capturing stream", MODES,
          expect={"peer_copy": "ok", "status_in_capture": "active", "end_capture": "ok",
                  "nodes": "kernel:tiny_addx1,memcpyx1", "replay_sync": "ok", "dst_after_2_replays": "5"},
          source=f"GUESS (rule peer_copy_capture): PG 'Stream Capture' makes work on a capturing stream a node; "
                 f"no source speaks of peer copies; {_RT}: cudaMemcpyPeerAsync")
def tp_peer_copy_in_capture(r: Recorder, mode: str) -> None:
    """x0 += 1 then a peer copy of x0 into device 1's x1, captured on device 0 and replayed twice: each replay copies
    (x1 = 5 from x0 = 3)."""
    with _node(r) as node:

        def body():
            b0 = node.on_device(0)
            L0, s0 = Launcher(b0), b0.new_stream(non_blocking=True)
            x0 = _buf(node, b0, L0, s0, 3.0)
            _peer_access(r, node)
            b1 = node.on_device(1)
            x1 = b1.zeros((N,), f32)
            b1.synchronize()
            node.on_device(0)

            def cap():
                _add(L0, x0, s0)
                r.call("peer_copy", node.memcpy_peer_async, x1, 1, x0, 0, s0, 0)
                r.note("status_in_capture", b0.capture_status(s0))

            g = _capture_on(r, b0, s0, mode, cap, "")
            r.nodes("nodes", g, b0)
            if g is not None:
                ex = r.call("instantiate", b0.graph_instantiate, g)
                for i in range(2):
                    r.call(f"replay{i}", b0.graph_launch, ex, s0)
                r.call("replay_sync", b0.stream_synchronize, s0)
            node.on_device(1)
            r.value("dst_after_2_replays", x1, b1)

        _in_thread(node, body)


def _memcpy_peer_expect(kind: str) -> dict:
    if kind == "blocking":
        return {"memcpy_peer": "cudaErrorStreamCaptureImplicit", "status_in_capture": "invalidated",
                "end_capture": "cudaErrorStreamCaptureInvalidated", "nodes": "no graph", "dst": "0", "src": "3"}
    return {"memcpy_peer": "ok", "status_in_capture": "active", "end_capture": "ok", "nodes": "kernel:tiny_addx1",
            "replay_sync": "ok", "dst": "3", "src": "4"}


@scenario("ds4's synchronous peer copy (cudaMemcpyPeer) while device 0 captures, as its islands do (global mode)",
          ("blocking", "non_blocking"), expect=_memcpy_peer_expect,
          source=f"GUESS (rules memcpy_peer_implicit, memcpy_peer_escape): {_RT} cudaMemcpyPeer is serialized with all "
                 "work of the current, source and destination devices (the legacy stream's semantics)")
def tp_memcpy_peer_in_capture(r: Recorder, kind: str) -> None:
    """x0 += 1 captured on a ``kind`` stream of device 0 in global mode (ds4's islands capture on a blocking stream),
    then ``cudaMemcpyPeer`` of x0 into device 1: refused on a blocking capture (the capture invalidated), run at
    once and left out of the graph on a non-blocking one (the replay never copies)."""
    with _node(r) as node:

        def body():
            b0 = node.on_device(0)
            L0, s0 = Launcher(b0), b0.new_stream(non_blocking=kind == "non_blocking")
            x0 = _buf(node, b0, L0, s0, 3.0)
            b1 = node.on_device(1)
            x1 = b1.zeros((N,), f32)
            b1.synchronize()
            node.on_device(0)

            def cap():
                _add(L0, x0, s0)
                r.call("memcpy_peer", node.memcpy_peer, x1, 1, x0, 0)
                r.note("status_in_capture", b0.capture_status(s0))

            g = _capture_on(r, b0, s0, "global", cap, "")
            r.nodes("nodes", g, b0)
            if g is not None:
                ex = r.call("instantiate", b0.graph_instantiate, g)
                r.call("replay0", b0.graph_launch, ex, s0)
                r.call("replay_sync", b0.stream_synchronize, s0)
            r.value("src", x0, b0)
            node.on_device(1)
            r.value("dst", x1, b1)

        _in_thread(node, body)


    # ----------------------------------------------------------------------------- NCCL all-reduce
@scenario("NCCL all-reduce of two ranks (one thread per GPU), eagerly",
          expect={"r0.allreduce": "ok", "r1.allreduce": "ok", "r0.sum": "3", "r1.sum": "3"},
          source=f"{_NCCL}; NCCL API ncclAllReduce (rule nccl_pair)")
def tp_allreduce_eager(r: Recorder) -> None:
    """Rank k holds k + 1; after the all-reduce both hold 3."""
    with _node(r) as node:
        comms = node.comm_init_all()

        def rank(k: int) -> None:
            be = node.backend(k)
            L, s = Launcher(be), be.new_stream(non_blocking=True)
            x, y = _buf(node, be, L, s, k + 1.0), _buf(node, be, L, s)
            _complete(r, f"r{k}.allreduce", node, k, s, comms[k].all_reduce, x, y, s)
            r.value(f"r{k}.sum", y, be)

        _ranks(node, rank)


def _capture_expect(mode: str) -> dict:
    if mode == "global":
        return {"r0.allreduce": "nccl:ncclUnhandledCudaError", "r1.allreduce": "nccl:ncclUnhandledCudaError",
                "r0.end_capture": "cudaErrorStreamCaptureInvalidated",
                "r1.end_capture": "cudaErrorStreamCaptureInvalidated", "r0.nodes": "no graph", "r1.nodes": "no graph",
                "r0.sum": "0", "r1.sum": "0"}
    return {"r0.allreduce": "ok", "r1.allreduce": "ok", "r0.end_capture": "ok", "r1.end_capture": "ok",
            "r0.nodes": "kernelx1,kernel:tiny_addx1", "r1.nodes": "kernelx1,kernel:tiny_addx1", "r0.replay0": "ok",
            "r1.replay0": "ok",
            "r0.replay1": "ok", "r1.replay1": "ok", "r0.sum": "7", "r1.sum": "7"}


@scenario("NCCL all-reduce captured by both ranks (one thread per GPU) and replayed", MODES, expect=_capture_expect,
          source=f"{_NCCL} (rule nccl_capture; GUESS: one kernel node); NCCL 2.11-2.12 'Capture modes': a thread per "
                 "GPU needs thread-local capture (rule nccl_global_multithread, GUESS: the status and which "
                 "capture is invalidated)")
def tp_allreduce_in_capture(r: Recorder, mode: str) -> None:
    """Each rank captures ``x += 1`` and the all-reduce of x into y on its stream in ``mode`` (rank 0's call while rank
    1 already captures), then both replay twice: y = (1 + 2) + 2 + 2 = 7 on both."""
    with _node(r) as node:
        comms = node.comm_init_all()
        turns = _Turns(node)

        def rank(k: int) -> None:
            be = node.backend(k)
            L, s = Launcher(be), be.new_stream(non_blocking=True)
            x, y = _buf(node, be, L, s, k + 1.0), _buf(node, be, L, s)
            turns.sync()

            def cap():
                turns.sync()  # both ranks capture from here on
                _add(L, x, s)
                turns.turn(k, lambda: r.call(f"r{k}.allreduce", comms[k].all_reduce, x, y, s))

            g = _capture_on(r, be, s, mode, cap, f"r{k}.")
            r.nodes(f"r{k}.nodes", g, be)
            turns.sync()
            if g is not None:
                ex = r.call(f"r{k}.instantiate", be.graph_instantiate, g)
                for i in range(2):
                    _complete(r, f"r{k}.replay{i}", node, k, s, be.graph_launch, ex, s)
            r.value(f"r{k}.sum", y, be)

        _ranks(node, rank)


@scenario("NCCL all-reduce eagerly on one rank while another thread holds a global-mode capture",
          expect={"r1.allreduce_eager": "nccl:ncclUnhandledCudaError", "r0.status_after": "invalidated",
                  "r0.end_capture": "cudaErrorStreamCaptureInvalidated"},
          source="NCCL 2.11-2.12 'Capture modes' (a process with a thread per GPU needs thread-local capture); RT "
                 "cudaThreadExchangeStreamCaptureMode; GUESS (rule nccl_global_multithread): the status, and that "
                 "rank 0's capture is invalidated")
def tp_allreduce_beside_global_capture(r: Recorder) -> None:
    """Rank 0 captures a kernel in global mode; meanwhile rank 1 calls an eager all-reduce. If the call is accepted,
    rank 0 joins it eagerly after its capture, so nothing is left waiting."""
    with _node(r) as node:
        comms = node.comm_init_all()
        turns = _Turns(node)
        state = {}

        def rank(k: int) -> None:
            be = node.backend(k)
            L, s = Launcher(be), be.new_stream(non_blocking=True)
            x, y = _buf(node, be, L, s, k + 1.0), _buf(node, be, L, s)
            turns.sync()  # every buffer made before the capture (another thread's global capture prohibits cudaMalloc)
            if k == 0:
                def cap():
                    _add(L, x, s)
                    turns.sync()  # rank 1 calls now
                    turns.sync()
                    r.note("r0.status_after", be.capture_status(s))

                _capture_on(r, be, s, "global", cap, "r0.")
                turns.sync()
                if state.get("accepted"):
                    _complete(r, "r0.allreduce_after", node, 0, s, comms[0].all_reduce, x, y, s)
            else:
                turns.sync()
                r.call("r1.allreduce_eager", comms[1].all_reduce, x, y, s)
                state["accepted"] = r.obs["r1.allreduce_eager"] == "ok"
                turns.sync()
                turns.sync()
                if state["accepted"]:
                    _complete(r, "r1.complete", node, 1, s, lambda: None)

        _ranks(node, rank)


@scenario("NCCL all-reduce launched from a graph on one rank and eagerly on the other",
          expect={"r0.replay": "never completes", "r1.allreduce": "never completes"},
          source=f"{_NCCL}: whether an operation is graph-captured must be uniform over all ranks; GUESS (rule "
                 "nccl_nonuniform): what a GPU does otherwise, modeled as never completing")
def tp_allreduce_one_rank_captures(r: Recorder) -> None:
    """Rank 0 captures its all-reduce and launches the graph; rank 1 runs its all-reduce eagerly."""
    with _node(r, hang_risk=True) as node:
        comms = node.comm_init_all()
        turns = _Turns(node)

        def rank(k: int) -> None:
            be = node.backend(k)
            L, s = Launcher(be), be.new_stream(non_blocking=True)
            x, y = _buf(node, be, L, s, k + 1.0), _buf(node, be, L, s)
            turns.sync()
            if k == 0:
                g = _capture_on(r, be, s, "thread_local", lambda: r.call("r0.allreduce_captured", comms[0].all_reduce,
                                                                         x, y, s), "r0.")
                ex = be.graph_instantiate(g) if g is not None else None
                turns.sync()
                if ex is not None:
                    _complete(r, "r0.replay", node, 0, s, be.graph_launch, ex, s)
            else:
                turns.sync()
                _complete(r, "r1.allreduce", node, 1, s, comms[1].all_reduce, x, y, s)

        _ranks(node, rank)


@scenario("NCCL all-reduces issued in a different order on the two ranks (different sizes)",
          expect={"r0.first": "never completes", "r1.first": "never completes"},
          source="GUESS (rule nccl_mismatch): NCCL matches collectives in the order each rank executes them and does "
                 "not check they agree; a GPU hangs or computes wrong data")
def tp_allreduce_out_of_order(r: Recorder) -> None:
    """Rank 0 reduces a (N floats) then b (2N); rank 1 b then a: the first collectives differ in size."""
    with _node(r, hang_risk=True) as node:
        comms = node.comm_init_all()

        def rank(k: int) -> None:
            be = node.backend(k)
            L, s = Launcher(be), be.new_stream(non_blocking=True)
            a, b = be.zeros((N,), f32), be.zeros((2 * N,), f32)
            be.synchronize()
            first = (a, a) if k == 0 else (b, b)
            if _complete(r, f"r{k}.first", node, k, s, comms[k].all_reduce, *first, s):
                second = (b, b) if k == 0 else (a, a)
                _complete(r, f"r{k}.second", node, k, s, comms[k].all_reduce, *second, s)

        _ranks(node, rank)


@scenario("NCCL all-reduces of the same size issued in a different order on the two ranks",
          expect={"r0.first": "ok", "r0.second": "ok", "r1.first": "ok", "r1.second": "ok", "r0.a": "21", "r0.b": "12",
                  "r1.a": "12", "r1.b": "21"},
          source="rule nccl_pair (GUESS: matched by execution order): the k-th collectives meet whatever buffers "
                 "they name, so the sums mix a and b, silently (in order: a = 3, b = 30)")
def tp_allreduce_swapped_same_size(r: Recorder) -> None:
    """a = 1, b = 10 on rank 0 and a = 2, b = 20 on rank 1; rank 0 reduces a then b, rank 1 b then a."""
    with _node(r) as node:
        comms = node.comm_init_all()

        def rank(k: int) -> None:
            be = node.backend(k)
            L, s = Launcher(be), be.new_stream(non_blocking=True)
            a, b = _buf(node, be, L, s, k + 1.0), _buf(node, be, L, s, 10.0 * (k + 1))
            oa, ob = _buf(node, be, L, s), _buf(node, be, L, s)
            order = [(a, oa), (b, ob)] if k == 0 else [(b, ob), (a, oa)]
            for step, (src, dst) in zip(("first", "second"), order):
                _complete(r, f"r{k}.{step}", node, k, s, comms[k].all_reduce, src, dst, s)
            r.value(f"r{k}.a", oa, be)
            r.value(f"r{k}.b", ob, be)

        _ranks(node, rank)


@scenario("NCCL all-reduce on one rank only (the peer never takes part)",
          expect={"r0.allreduce": "never completes"},
          source="rule nccl_timeout: a collective blocks its GPU until every rank takes part (NCCL API: collectives "
                 "and ncclSend/ncclRecv block the GPU); the sim raises after its timeout, a GPU's watchdog aborts "
                 "the communicators (ncclCommAbort)")
def tp_allreduce_lone_rank(r: Recorder) -> None:
    """Rank 0 calls the all-reduce; rank 1 never does."""
    with _node(r, hang_risk=True) as node:
        comms = node.comm_init_all()

        def rank(k: int) -> None:
            be = node.backend(k)
            if k == 0:
                L, s = Launcher(be), be.new_stream(non_blocking=True)
                x = _buf(node, be, L, s, 1.0)
                _complete(r, "r0.allreduce", node, 0, s, comms[0].all_reduce, x, x, s)

        _ranks(node, rank)


__all__ = ["GPU_TIMEOUT_S", "HANG_ENV", "NEVER_COMPLETES", "SIM_TIMEOUT_S"]
