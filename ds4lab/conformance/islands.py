"""Scenarios of ds4's decode islands as shipped (ds4 ``e50104f6``): capture on a dedicated blocking stream in global
mode beside eager work on the legacy stream, ds4's MoE profile inside such a capture, and the per-token kernel-node
update of ds4's attention graph (``36ee8c14``). Sources: CUDA Programming Guide, "Stream Capture"; CUDA Runtime API
(named in each scenario)."""

from __future__ import annotations

from ..capture import stream as S
from .framework import _RT, MODES, Recorder, _buf, _capture, _launch_once, _replay, scenario

_PG = "CUDA Programming Guide, 'Stream Capture' → 'Prohibited and Unhandled Operations'"
#: The documented refusal: legacy-stream work while a blocking stream captures would make the legacy
#: stream depend on the capture (RT cudaError: cudaErrorStreamCaptureImplicit).
_IMPLICIT = {"status_in_capture": "invalidated", "end_capture": "cudaErrorStreamCaptureInvalidated"}


def _unsafe(mode: str) -> dict:
    """cudaEventQuery / cudaEventSynchronize of an event outside the capture, on the capturing thread: 'potentially
    unsafe' (RT cudaThreadExchangeStreamCaptureMode): refused in global and thread-local mode, the capture
    invalidated; allowed in relaxed mode (so on the H200: h200-2026-12-02-ds4/conformance)."""
    if mode == "relaxed":
        return {"status_in_capture": "active", "end_capture": "ok"}
    return {"status_in_capture": "invalidated", "end_capture": "cudaErrorStreamCaptureInvalidated"}


def _blocking_capture(r: Recorder, mode: str, body) -> None:
    """Capture ``body(s)`` on a new blocking stream ``s`` in ``mode``; record the capture status after the body, the
    graph's nodes, and what a replay of it does to the probe buffer."""
    be = r.be
    s = be.new_stream(non_blocking=False)
    x = _buf(r, 1.0)

    def run():
        r.add("add_before", x, s)
        body(s)
        r.add("add_after", x, s)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, run)
    r.nodes("nodes", g)
    r.value("x_after_capture", x)
    _replay(r, g, s)
    r.value("x_after_replay", x)


@scenario("event record on the legacy stream while a blocking stream captures (ds4's MoE profile in island 1)",
          MODES, expect=lambda m: {"record_legacy": "cudaErrorStreamCaptureImplicit", **_IMPLICIT}, source=_PG)
def legacy_event_record_blocking_capture(r: Recorder, mode: str) -> None:
    """``cudaEventRecord(ev, 0)`` inside a capture on a blocking stream: the legacy stream would depend on the capture
    (implicit synchronization). Does the record fail, and is the capture invalidated?"""
    ev = r.be.new_event()
    _blocking_capture(r, mode, lambda s: r.call("record_legacy", r.be.event_record, S.LEGACY_STREAM, ev))
    r.call("query_after", r.be.event_query, ev)


@scenario("event query of a legacy-stream event while a blocking stream captures", MODES, expect=_unsafe,
          source=f"{_RT}, cudaThreadExchangeStreamCaptureMode (GUESS: event query is 'potentially unsafe')")
def legacy_event_query_blocking_capture(r: Recorder, mode: str) -> None:
    """``cudaEventQuery`` of an event recorded on the legacy stream before the capture, asked while a blocking stream
    captures (ds4's profile polls its events)."""
    ev = r.be.new_event()
    r.call("record_before", r.be.event_record, S.LEGACY_STREAM, ev)
    r.call("sync_before", r.be.synchronize)
    _blocking_capture(r, mode, lambda s: r.call("query_legacy_event", r.be.event_query, ev))


@scenario("event synchronize of a legacy-stream event while a blocking stream captures", MODES, expect=_unsafe,
          source=f"{_RT}, cudaThreadExchangeStreamCaptureMode (GUESS: event synchronize is 'potentially unsafe')")
def legacy_event_sync_blocking_capture(r: Recorder, mode: str) -> None:
    """``cudaEventSynchronize`` of an event recorded on the legacy stream before the capture, while a blocking stream
    captures."""
    ev = r.be.new_event()
    r.call("record_before", r.be.event_record, S.LEGACY_STREAM, ev)
    r.call("sync_before", r.be.synchronize)
    _blocking_capture(r, mode, lambda s: r.call("sync_legacy_event", r.be.event_synchronize, ev))


@scenario("ds4's MoE profile inside a blocking-stream capture: seven legacy records, synchronize, elapsed", MODES,
          expect=lambda m: {"record0": "cudaErrorStreamCaptureImplicit", **_IMPLICIT}, source=_PG)
def moe_profile_in_blocking_capture(r: Recorder, mode: str) -> None:
    """The whole sequence ds4's ``DS4_CUDA_MOE_PROFILE`` runs on a routed-MoE call, inside island 1's capture: an event
    recorded on the legacy stream before each stage (a probe kernel on the capturing stream between them), the last
    event synchronized, the six elapsed times read."""
    be = r.be
    evs = [be.new_event() for _ in range(7)]
    x = _buf(r, 1.0)

    def body(s):
        for i, ev in enumerate(evs):
            r.call(f"record{i}", be.event_record, S.LEGACY_STREAM, ev)
            if i < 6:
                r.add(f"stage{i}", x, s)
        r.call("sync_last", be.event_synchronize, evs[6])
        r.call("elapsed0", be.event_elapsed_ms, evs[0], evs[1])

    _blocking_capture(r, mode, body)
    r.value("stages_after", x)


@scenario("island replay on a blocking stream between legacy-stream work: implicit ordering",
          expect={"replay0": "ok", "x_after": "8", "y_after": "3"},
          source=f"{_RT}, 'Stream synchronization behavior' (legacy default stream and blocking streams)")
def island_replay_orders_with_legacy(r: Recorder) -> None:
    """ds4's islands keep the eager kernels on the legacy stream and replay each island's graph on its blocking capture
    stream: legacy work, the replay and legacy work again run in that order with no event between them (a blocking
    stream synchronizes with the legacy stream)."""
    be = r.be
    s = be.new_stream(non_blocking=False)
    x = _buf(r, 1.0)
    y = _buf(r, 0.0)
    g = _capture(r, s, "global", lambda: (r.fill("fill_y", y, 3.0, s), r.add("add_x", x, s)))
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    for i in range(3):
        r.add(f"legacy_add{i}", x, legacy=True)
        if ex is not None:
            r.call(f"replay{i}", be.graph_launch, ex, s)
    r.add("legacy_add_last", x, legacy=True)
    r.value("x_after", x)
    r.value("y_after", y)


@scenario("kernel-node parameters set on an executable before its launch (ds4's hand-built attention graph)",
          expect={"set_params": "ok", "set_params_past_the_last_node": "cudaErrorInvalidValue",
                  "x_after_updated_replay": "7", "x_after_second_executable": "1"},
          source=f"{_RT}, cudaGraphExecKernelNodeSetParams ('changes only affect future launches of hGraphExec')")
def kernel_node_set_params(r: Recorder) -> None:
    """``cudaGraphExecKernelNodeSetParams``: the executable's node takes new arguments for its next launches; the graph
    it was instantiated from keeps the captured ones (a second executable of it fills the captured value)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 0.0)
    g = _capture(r, s, "thread_local", lambda: r.fill("fill_1", x, 1.0, s))
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is None:
        return
    with r.L.planning() as plan:
        r.fill("plan_fill_7", x, 7.0, s)
    r.call("set_params", be.graph_exec_kernel_node_set_params, ex, 0, plan[0])
    r.call("set_params_past_the_last_node", be.graph_exec_kernel_node_set_params, ex, 1, plan[0])
    _launch_once(r, ex, s)
    r.value("x_after_updated_replay", x)
    ex2 = r.call("instantiate_again", be.graph_instantiate, g)
    _launch_once(r, ex2, s, tag="second_")
    r.value("x_after_second_executable", x)
