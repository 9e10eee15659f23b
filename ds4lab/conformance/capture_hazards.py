"""Scenarios of the hazard table: ds4-today paths that break or escape a capture (synchronous memsets, legacy-stream
kernels, allocation, events and synchronization, host readback and host scalars), in every capture mode where the
mode matters."""

from __future__ import annotations

import numpy as np

from ..capture import stream as S
from .framework import MODES, N, Recorder, _buf, _capture, call_in_capture, f32, _replay, scenario


# ----------------------------------------------------------------------------- the hazard table
@scenario("sync memset on the legacy stream while another stream captures", MODES)
def sync_memset_escapes(r: Recorder, mode: str) -> None:
    """A synchronous memset during capture runs once, now, and is not in the graph: the replay leaves the buffer
    untouched (gpu-facts.md; ds4's routed-MoE counts clear)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 5.0)
    y = _buf(r, 1.0)
    g = _capture(r, s, mode, lambda: (r.call("memset_sync", be.memset_sync, x, 0), r.add("add_y", y, s)))
    r.value("x_after_capture", x)
    r.nodes("nodes", g)
    r.fill("refill_x", x, 5.0, S.LEGACY_STREAM)
    _replay(r, g, s)
    r.value("x_after_replay", x)
    r.value("y_after_replay", y)


@scenario("async memset on the current (capturing) stream: the fix", MODES)
def async_memset_in_graph(r: Recorder, mode: str) -> None:
    """memsetAsync on the capturing stream becomes a memset node: the replay clears again."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 5.0)
    g = _capture(r, s, mode, lambda: r.call("memset_async", be.memset_async, s, x, 0))
    r.value("x_after_capture", x)
    r.nodes("nodes", g)
    r.fill("refill_x", x, 5.0, S.LEGACY_STREAM)
    _replay(r, g, s)
    r.value("x_after_replay", x)


@scenario("kernel launched on the legacy stream, bypassing the accessor", MODES)
def legacy_kernel_escapes(r: Recorder, mode: str) -> None:
    """A legacy-stream kernel during a non-blocking stream's capture runs now, not in the graph."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 1.0)
    y = _buf(r, 1.0)
    g = _capture(r, s, mode, lambda: (r.add("add_x_legacy", x, legacy=True), r.add("add_y", y, s)))
    r.value("x_after_capture", x)
    r.nodes("nodes", g)
    _replay(r, g, s)
    r.value("x_after_replay", x)
    r.value("y_after_replay", y)


@scenario("legacy-stream work while a *blocking* stream captures")
def legacy_kernel_blocking_capture(r: Recorder) -> None:
    """A blocking stream synchronizes implicitly with the legacy stream, so legacy work during its capture would join
    it: CUDA refuses (cudaErrorStreamCaptureImplicit) and invalidates."""
    be = r.be
    s = be.new_stream(non_blocking=False)
    x = _buf(r, 1.0)
    g = _capture(r, s, "relaxed", lambda: (r.add("add_s", x, s), r.add("add_legacy", x, legacy=True)))
    r.nodes("nodes", g)
    r.note("status_after", be.capture_status(s))


@scenario("allocation inside capture (cudaMalloc)", MODES)
def malloc_in_capture(r: Recorder, mode: str) -> None:
    """cudaMalloc during capture: refused in global and thread-local mode (the capture is invalidated), allowed in
    relaxed mode."""
    call_in_capture(r, mode, "malloc", r.be.malloc, (N,), f32, release=r.be.free)


@scenario("stream-ordered allocation inside capture (cudaMallocAsync)", MODES)
def malloc_async_in_capture(r: Recorder, mode: str) -> None:
    """cudaMallocAsync/cudaFreeAsync on the capturing stream become memory nodes."""
    be = r.be
    s = be.new_stream(non_blocking=True)

    def body():
        m = r.call("malloc_async", be.malloc_async, s, (N,), f32)
        if m is not None:
            r.call("free_async", be.free_async, s, m)

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)


@scenario("host-timed profiling: event synchronize on an event recorded in the capturing stream", MODES)
def event_sync_captured(r: Recorder, mode: str) -> None:
    """ds4's MoE profile: cudaEventSynchronize on a captured event is refused (cudaErrorCapturedEvent) and breaks the
    capture."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s), r.call("event_record", be.event_record, s, e),
                                      r.call("event_synchronize", be.event_synchronize, e),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("host-timed profiling: elapsed time on events recorded in the capturing stream", MODES)
def event_elapsed_captured(r: Recorder, mode: str) -> None:
    """cudaEventElapsedTime on captured events: refused; does it also break the capture?"""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e0, e1 = be.new_event(), be.new_event()
    x = _buf(r)
    g = _capture(r, s, mode, lambda: (r.call("record0", be.event_record, s, e0), r.add("add", x, s),
                                      r.call("record1", be.event_record, s, e1),
                                      r.call("elapsed", be.event_elapsed_ms, e0, e1),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("event query on an event recorded in the capturing stream")
def event_query_captured(r: Recorder) -> None:
    """cudaEventQuery on a captured event."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: (r.add("add", x, s), r.call("event_record", be.event_record, s, e),
                                           r.call("event_query", be.event_query, e),
                                           r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("stream query on the capturing stream")
def stream_query_captured(r: Recorder) -> None:
    """cudaStreamQuery on the capturing stream."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: (r.add("add", x, s), r.call("stream_query", be.stream_query, s),
                                           r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("device synchronize inside the token body", MODES)
def device_sync_in_capture(r: Recorder, mode: str) -> None:
    """cudaDeviceSynchronize during capture: refused, capture invalidated."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s), r.call("device_synchronize", be.synchronize),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("stream synchronize of the capturing stream")
def stream_sync_in_capture(r: Recorder) -> None:
    """cudaStreamSynchronize on the capturing stream."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: (r.add("add", x, s), r.call("stream_synchronize", be.stream_synchronize, s),
                                           r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("host readback mid-token (device to host copy), CuPy's refusal")
def d2h_read_in_capture(r: Recorder) -> None:
    """Reading a device value on the host while the current stream captures: CuPy refuses before CUDA sees it (a CuPy
    rule, not CUDA's)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 3.0)

    def body():
        r.add("add", x, s)
        with S.stream_override(s):
            r.call("read", be.read, x)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, "thread_local", body)
    r.nodes("nodes", g)


@scenario("cuBLAS through CuPy's array API (matmul) during capture, CuPy's refusal")
def matmul_in_capture(r: Recorder) -> None:
    """``a @ b`` through CuPy while capturing, after an eager ``a @ b`` made CuPy's cuBLAS handle and workspace (as any
    real program would have)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    a = be.zeros((16, 16), f32)
    r.call("matmul_eager", be.matmul, s, a, a)
    be.synchronize()
    g = _capture(r, s, "thread_local", lambda: (r.call("matmul", be.matmul, s, a, a),
                                                r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("per-token host scalars passed by value: baked into the graph")
def host_scalar_stale(r: Recorder) -> None:
    """A scalar kernel argument is captured by value: replaying for the next token reuses the captured value (silently
    stale); the same scalar read from a device buffer is re-read."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x, y = _buf(r), _buf(r)
    vbuf = be.from_host(np.array([1.0], dtype=f32))
    g = _capture(r, s, "thread_local", lambda: (r.fill("fill_by_value", x, 1.0, s), r.fill_from("fill_from_device", y, vbuf, s)))
    r.nodes("nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    r.call("write_next_token_scalar", be.copy_h2d, S.LEGACY_STREAM, vbuf, np.array([2.0], dtype=f32))
    be.synchronize()
    if ex is not None:
        r.call("replay", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x_by_value_after_replay", x)
    r.value("y_from_device_after_replay", y)


@scenario("a buffer freed and re-allocated after capture")
def freed_realloc(r: Recorder) -> None:
    """The graph keeps the freed buffer's address; a new allocation of the same size may get the same memory, which the
    replay then writes (CUDA Programming Guide: graph memory is by address)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    a = r.call("malloc_a", be.malloc, (N,), f32)
    r.fill("init_a", a, 1.0, S.LEGACY_STREAM)
    be.synchronize()
    g = _capture(r, s, "relaxed", lambda: r.add("add_a", a, s))
    r.call("free_a", be.free, a)
    b = r.call("malloc_b", be.malloc, (N,), f32)
    r.fill("init_b", b, 10.0, S.LEGACY_STREAM)
    _replay(r, g, s)
    r.value("b_after_replay", b)
    be.free(b)
