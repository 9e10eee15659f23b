"""Scenarios of host-side calls a decode step makes while a stream captures (queries, capture status, pre-capture
events, other streams, cuBLAS handles): the rules behind the audit's verdicts for these calls."""

from __future__ import annotations

from ..executor.base import HOST_QUERIES
from .framework import (INTACT, MODES, N, _RT, Recorder, _buf, _capture, _replay, call_in_capture, f32,
                        refused_unless_relaxed, scenario)

#: the H200 run that decided these scenarios' rules (0 disagreements with the sim)
_R3 = "H200 conformance 2026-12-01 (docs/measurements/h200-2026-12-01/round3)"


@scenario("host-only queries (device, last error, attributes, occupancy, context) inside a capture", MODES,
          expect={**{q: "ok" for q in HOST_QUERIES}, **INTACT},
          source=f"{_RT} (these calls take no stream and enqueue nothing); rule host_query, " + _R3 + ": none is "
                 "refused or invalidates in any mode")
def host_queries_in_capture(r: Recorder, mode: str) -> None:
    """Each host query of ``HOST_QUERIES`` while this thread captures."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)

    def body():
        r.add("add_before", x, s)
        for q in HOST_QUERIES:
            r.call(q, be.host_query, q)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)


@scenario("cudaStreamIsCapturing of the capturing stream and of another stream", MODES,
          expect={"is_capturing_s": "active", "is_capturing_other": "none", **INTACT},
          source=f"{_RT}, cudaStreamIsCapturing (rule capture_status_query): legal during capture, returns the status")
def stream_is_capturing_in_capture(r: Recorder, mode: str) -> None:
    """The call code makes to decide whether to skip work while capturing."""
    be = r.be
    s, other = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x = _buf(r)

    def body():
        r.add("add_before", x, s)
        r.note("is_capturing_s", be.capture_status(s))
        r.note("is_capturing_other", be.capture_status(other))
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)


_EVENT = ("rule unsafe_call; " + _R3 + ": a query or synchronize of an event recorded outside the capture is a "
          "potentially unsafe call for the capturing thread in global and thread-local mode, as measured for "
          "another thread in global mode (H200, 2026-11-30); relaxed mode allows it")


def _pre_capture_event(r: Recorder, mode: str, step: str, call) -> None:
    be = r.be
    other = be.new_stream(non_blocking=True)
    e = be.new_event()
    r.call("record_before", be.event_record, other, e)
    be.synchronize()
    call_in_capture(r, mode, step, call, e)


@scenario("event query, on the capturing thread, of an event recorded before the capture", MODES,
          expect=refused_unless_relaxed("event_query"), source=_EVENT)
def event_query_pre_capture_event(r: Recorder, mode: str) -> None:
    """cudaEventQuery of an eagerly recorded event while this thread captures (a profiler's check)."""
    _pre_capture_event(r, mode, "event_query", r.be.event_query)


@scenario("event synchronize, on the capturing thread, of an event recorded before the capture", MODES,
          expect=refused_unless_relaxed("event_synchronize"), source=_EVENT)
def event_sync_pre_capture_event(r: Recorder, mode: str) -> None:
    """cudaEventSynchronize of an eagerly recorded event while this thread captures."""
    _pre_capture_event(r, mode, "event_synchronize", r.be.event_synchronize)


@scenario("waiting on an event recorded outside any capture, global and thread-local mode", ("global", "thread_local"),
          expect={"wait_outside_event": "cudaErrorStreamCaptureIsolation", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated", "nodes": "no graph"},
          source="H200 conformance 2026-11-30 (wait_external_event, relaxed): cudaErrorStreamCaptureIsolation, "
                 "invalidated; PG 'Prohibited and Unhandled Operations'; " + _R3
                 + ": every mode alike (rule isolation)")
def wait_pre_capture_event(r: Recorder, mode: str) -> None:
    """cudaStreamWaitEvent on the capturing stream, of an event recorded eagerly before the capture."""
    be = r.be
    s, other = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_outside", be.event_record, other, e)

    def body():
        r.call("wait_outside_event", be.stream_wait_event, s, e)
        r.note("status_in_capture", be.capture_status(s))
        r.add("add", x, s)

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)


@scenario("a kernel and an event record on another non-blocking stream while a stream captures", MODES,
          expect={"add_other": "ok", "record_other": "ok", "x_after_capture": "2", "x_after_replay": "2",
                  "y_after_replay": "2", **INTACT},
          source="PG 'Stream Capture' (rule uncaptured_stream): only work issued into a capturing stream, or one "
                 "joined to it, is captured; another stream runs its work at once")
def other_stream_work_in_capture(r: Recorder, mode: str) -> None:
    """Work on a stream the capture never joined runs now and is not in the graph."""
    be = r.be
    s, other = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x, y = _buf(r, 1.0), _buf(r, 1.0)

    def body():
        r.add("add_other", x, other)
        r.call("record_other", be.event_record, other, e)
        r.add("add_y", y, s)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, body)
    r.value("x_after_capture", x)
    r.nodes("nodes", g)
    _replay(r, g, s)
    r.value("x_after_replay", x)
    r.value("y_after_replay", y)


@scenario("cuBLAS handle creation (cublasCreate) inside a capture", MODES,
          expect=refused_unless_relaxed("cublas_create", "cublas:CUBLAS_STATUS_NOT_INITIALIZED"),
          source="cuBLAS library reference: cublasCreate allocates host and device resources (NOT_INITIALIZED: "
                 "the library could not set itself up). The H200 answers NOT_INITIALIZED and invalidates the "
                 "capture in global and thread-local mode (rule cublas_create)")
def cublas_create_in_capture(r: Recorder, mode: str) -> None:
    """A library handle made on first use, inside the captured region (what lazily initialized engines do on their
    first captured token)."""
    call_in_capture(r, mode, "cublas_create", r.be.blas_create, release=r.be.blas_destroy)


@scenario("cuBLAS stream and workspace set inside a capture (handle and workspace made before)", MODES,
          expect={"cublas_create": "ok", "set_stream": "ok", "set_workspace": "ok", **INTACT},
          source="cuBLAS library reference, 'CUDA Graphs Support' (a workspace set with cublasSetWorkspace avoids "
                 "allocation during capture). The H200 allows both in every mode, the capture intact "
                 "(rule cublas_settings)")
def cublas_workspace_in_capture(r: Recorder, mode: str) -> None:
    """The fix for lazily made cuBLAS resources: handle and workspace made before the capture, only pointed at the
    capturing stream inside it."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    h = r.call("cublas_create", be.blas_create)
    ws = be.zeros((N * 1024,), f32)  # 4 MiB
    be.synchronize()

    def body():
        r.add("add_before", x, s)
        if h is not None:
            r.call("set_stream", be.blas_set_stream, h, s)
            r.call("set_workspace", be.blas_set_workspace, h, ws)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)
    if h is not None:
        be.blas_destroy(h)
