"""Scenarios of stream and event queries and synchronization during and after a capture, on this thread, on forked
streams and from another thread (no swallowed status)."""

from __future__ import annotations

from .framework import MODES, _FACTS, _RT, Recorder, _buf, _capture, _other_thread, _replay, scenario


# ----------------------------------------------------------------------------- queries (issue: no swallowed status)
_INV = {"end_capture": "cudaErrorStreamCaptureInvalidated", "nodes": "no graph", "status_in_capture": "invalidated"}


@scenario("stream query on the capturing stream (every mode)", ("global", "thread_local"),
          expect={"stream_query": "cudaErrorStreamCaptureUnsupported", **_INV},
          source=f"{_FACTS}: cudaStreamQuery on a capturing stream returns 900 and invalidates, every mode")
def stream_query_in_capture(r: Recorder, mode: str) -> None:
    """cudaStreamQuery on the capturing stream returns cudaErrorStreamCaptureUnsupported (CuPy returns it as a value:
    ds4lab raises it) and invalidates the capture."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s), r.call("stream_query", be.stream_query, s),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("event query on an event recorded in the capturing stream (every mode)", ("global", "thread_local"),
          expect={"event_query": "cudaErrorCapturedEvent", **_INV},
          source=f"{_RT}, cudaError: cudaErrorCapturedEvent (GUESS: the name); invalidation as the relaxed H200 record")
def event_query_in_capture(r: Recorder, mode: str) -> None:
    """cudaEventQuery of an event last recorded in an active capture."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s), r.call("event_record", be.event_record, s, e),
                                      r.call("event_query", be.event_query, e),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("event query of an event recorded in an invalidated capture",
          expect={"device_synchronize": "cudaErrorStreamCaptureUnsupported", "event_query": "cudaErrorInvalidValue",
                  **_INV},
          source=f"{_FACTS}: cudaEventQuery of an event recorded in an invalidated capture returns cudaErrorInvalidValue")
def event_query_invalidated_capture(r: Recorder) -> None:
    """The capture is invalidated (device synchronize) after the event was recorded in it."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: (r.add("add", x, s), r.call("event_record", be.event_record, s, e),
                                           r.call("device_synchronize", be.synchronize),
                                           r.call("event_query", be.event_query, e),
                                           r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("stream query of a stream whose capture is invalidated",
          expect={"device_synchronize": "cudaErrorStreamCaptureUnsupported",
                  "stream_query": "cudaErrorStreamCaptureUnsupported", **_INV},
          source="CUDA Programming Guide, 'Stream Capture' → 'Invalidation'; measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): cudaErrorStreamCaptureUnsupported, "
                 "not cudaErrorStreamCaptureInvalidated")
def stream_query_invalidated_capture(r: Recorder) -> None:
    """cudaStreamQuery after the capture was invalidated, before it is ended."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: (r.add("add", x, s), r.call("device_synchronize", be.synchronize),
                                           r.call("stream_query", be.stream_query, s),
                                           r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("stream and event queries after the capture ended (and after replays)",
          expect={"end_capture": "ok", "stream_query_after_end": "ok", "stream_query_value": "True",
                  "event_query_after_end": "cudaErrorInvalidValue", "replay0": "ok",
                  "event_query_after_replay": "cudaErrorInvalidValue", "event_query_rerecorded": "ok"},
          source="docs/measurements/h200-2026-11-29/event-after-capture-probe.txt (an event of an ended capture: "
                 "synchronize and elapsed time cudaErrorInvalidValue; the query 'not complete' through a swallowed "
                 "status: GUESS cudaErrorInvalidValue)")
def queries_after_capture_ended(r: Recorder) -> None:
    """After a clean end, the stream is an ordinary stream again; an event last recorded inside the capture stays
    unusable, replays or not, until it is recorded again eagerly."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: (r.add("add", x, s), r.call("event_record", be.event_record, s, e)))
    v = r.call("stream_query_after_end", be.stream_query, s)
    r.note("stream_query_value", v)
    r.call("event_query_after_end", be.event_query, e)
    _replay(r, g, s)
    r.call("event_query_after_replay", be.event_query, e)
    r.call("event_record_eager", be.event_record, s, e)
    r.call("event_synchronize_eager", be.event_synchronize, e)
    r.call("event_query_rerecorded", be.event_query, e)


@scenario("stream query of a stream forked into a capture",
          expect={"s2_wait_fork": "ok", "stream_query_forked": "cudaErrorStreamCaptureUnsupported",
                  "end_capture": "cudaErrorStreamCaptureInvalidated", "status_in_capture": "invalidated"},
          source=f"{_FACTS} (2026-11-30): cudaStreamSynchronize of a forked stream → 900, invalidated; "
                 "GUESS: cudaStreamQuery alike")
def stream_query_forked(r: Recorder) -> None:
    """A stream that joined the capture by waiting on a captured event is capturing too."""
    _on_forked_stream(r, "stream_query_forked", r.be.stream_query)


@scenario("another thread's event query of a pre-capture event during a capture", MODES,
          expect=lambda m: {"event_query_other_thread": "cudaErrorStreamCaptureUnsupported" if m == "global" else "ok",
                            "status_in_capture": "invalidated" if m == "global" else "active",
                            "end_capture": "cudaErrorStreamCaptureInvalidated" if m == "global" else "ok"},
          source=f"{_FACTS} (2026-11-30): global: 900 + capture invalidated; thread-local or relaxed: success; "
                 f"{_RT}, cudaThreadExchangeStreamCaptureMode")
def cross_thread_event_query(r: Recorder, mode: str) -> None:
    """An event recorded and completed before the capture, queried from another thread."""
    _pre_capture_event_from_other_thread(r, mode, "event_query_other_thread", r.be.event_query)


@scenario("another thread's event synchronize of a pre-capture event during a capture", MODES,
          expect=lambda m: {"event_sync_other_thread": "cudaErrorStreamCaptureUnsupported" if m == "global" else "ok",
                            "status_in_capture": "invalidated" if m == "global" else "active",
                            "end_capture": "cudaErrorStreamCaptureInvalidated" if m == "global" else "ok"},
          source=f"{_FACTS} (2026-11-30): another thread's event query/sync of a pre-capture event: global: 900 + "
                 "invalidated; thread-local or relaxed: success")
def cross_thread_event_sync(r: Recorder, mode: str) -> None:
    """As cross_thread_event_query, with cudaEventSynchronize."""
    _pre_capture_event_from_other_thread(r, mode, "event_sync_other_thread", r.be.event_synchronize)


def _pre_capture_event_from_other_thread(r: Recorder, mode: str, step: str, call) -> None:
    """Record and complete an event before a ``mode`` capture; during it, ``call(event)`` from another thread as step
    ``step``, then note the capture's status."""
    be = r.be
    s0, s = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_before", be.event_record, s0, e)
    r.call("sync_before", be.stream_synchronize, s0)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s), _other_thread(lambda: r.call(step, call, e)),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("stream synchronize of a stream forked into a capture",
          expect={"s2_wait_fork": "ok", "stream_sync_forked": "cudaErrorStreamCaptureUnsupported",
                  "status_in_capture": "invalidated", "end_capture": "cudaErrorStreamCaptureInvalidated"},
          source=f"{_FACTS} (2026-11-30): cudaStreamSynchronize of a forked stream that joined the capture → 900, "
                 "capture invalidated")
def stream_sync_forked(r: Recorder) -> None:
    """A forked stream is part of the capture: synchronizing it is synchronizing a capturing stream."""
    _on_forked_stream(r, "stream_sync_forked", r.be.stream_synchronize)


def _on_forked_stream(r: Recorder, step: str, call) -> None:
    """Fork a second stream into a thread-local capture, work on it, ``call(stream)`` it as step ``step``, then join it
    back and end the capture."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    y = _buf(r)

    def body():
        r.call("record_fork", be.event_record, s1, e1)
        r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
        r.add("add_y_s2", y, s2)
        r.call(step, call, s2)
        r.note("status_in_capture", be.capture_status(s1))
        r.call("record_join", be.event_record, s2, e2)
        r.call("s1_wait_join", be.stream_wait_event, s1, e2)

    g = _capture(r, s1, "thread_local", body)
    r.nodes("nodes", g)


@scenario("another thread in thread-local or relaxed interaction mode queries an event during a global capture",
          ("thread_local", "relaxed"),
          expect={"exchange_mode": "ok", "event_query_other_thread": "ok", "status_in_capture": "active",
                  "end_capture": "ok"},
          source=f"{_FACTS} (2026-11-30): thread-local or relaxed mode on that thread: success, capture intact; "
                 f"{_RT}, cudaThreadExchangeStreamCaptureMode")
def cross_thread_query_own_mode(r: Recorder, mode: str) -> None:
    """The querying thread leaves the default (global) interaction mode with cudaThreadExchangeStreamCaptureMode; the
    capture on this thread is global."""
    be = r.be
    s0, s = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_before", be.event_record, s0, e)
    r.call("sync_before", be.stream_synchronize, s0)

    def other():
        prev = r.call("exchange_mode", be.exchange_capture_mode, mode)
        r.call("event_query_other_thread", be.event_query, e)
        if prev is not None:
            be.exchange_capture_mode(prev)

    g = _capture(r, s, "global", lambda: (r.add("add", x, s), _other_thread(other),
                                          r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)
