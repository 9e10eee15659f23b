"""Conformance scenarios: short programs over the runtime API, run on ``cupy`` and on ``sim``.

Each scenario records, step by step, what each call did (``ok`` or the CUDA/CuPy error name),
which operations ended up in the captured graph (node kinds and kernel names), and the values
buffers hold after replays. The same scenario on the real GPU and on the simulated runtime must
produce the same record; ``ds4lab conformance`` prints every disagreement. Where CUDA's behaviour
is surprising, the scenario stays and its docstring says what it shows.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import stream as S
from .errors import RuntimeApiError
from .launch import Launcher

MODES = ("global", "thread_local", "relaxed")
N = 1024
f32, i32 = np.float32, np.int32


class Recorder:
    """Runs runtime-API calls for one scenario and keeps what each one did, in order."""

    def __init__(self, be) -> None:
        self.be = be
        self.L = Launcher(be)
        self.obs: dict[str, str] = {}

    def call(self, step: str, fn: Callable, *args, **kw):
        """Run ``fn``; record ``ok`` or the error name. Returns the result (None on error)."""
        try:
            r = fn(*args, **kw)
        except RuntimeApiError as e:
            self.obs[step] = e.name
            return None
        self.obs[step] = "ok"
        return r

    def nodes(self, step: str, graph) -> None:
        """Record a graph's nodes as ``kind[:kernel]`` counts, sorted (empty graph: ``none``)."""
        if graph is None:
            self.obs[step] = "no graph"
            return
        c = Counter(f"{n['kind']}:{n['name']}" if n["kind"] == "kernel" and n["name"] else n["kind"]
                    for n in self.be.graph_nodes(graph))
        c.pop("empty", None)
        self.obs[step] = ",".join(f"{k}x{v}" for k, v in sorted(c.items())) or "none"

    def value(self, step: str, buf) -> None:
        """Record a buffer's values compactly (``7`` when uniform, else the first four)."""
        self.be.synchronize()
        h = np.asarray(self.be.to_host(buf), dtype=np.float64).reshape(-1)
        self.obs[step] = f"{h[0]:g}" if np.all(h == h[0]) else "[" + " ".join(f"{v:g}" for v in h[:4]) + " ...]"

    def note(self, step: str, value) -> None:
        self.obs[step] = str(value)

    # --- probe launches (each with its NumPy effect for the CPU backends)
    def add(self, step: str, x, stream=None, legacy: bool = False) -> None:
        """``x += 1`` on ``stream`` (through the accessor) or on the legacy stream."""
        def ref():
            np.add(x, 1, out=x)

        def go():
            self.L.kernel("probe.add", "tiny_add", (N // 256,), (256,), (x, i32(N)), ref, nbytes=8 * N,
                          legacy=legacy)

        if stream is None or legacy:
            self.call(step, go)
        else:
            with S.stream_override(stream):
                self.call(step, go)

    def fill(self, step: str, x, v: float, stream) -> None:
        """``x[:] = v`` with ``v`` passed by value (frozen into a graph)."""
        def ref():
            x[...] = v

        with S.stream_override(stream):
            self.call(step, lambda: self.L.kernel("probe.fill", "fill_value", (N // 256,), (256,),
                                                  (x, i32(N), f32(v)), ref, nbytes=4 * N))

    def fill_from(self, step: str, x, vbuf, stream) -> None:
        """``x[:] = vbuf[0]`` read from device memory at execution (replay) time."""
        def ref():
            x[...] = vbuf[0]

        with S.stream_override(stream):
            self.call(step, lambda: self.L.kernel("probe.fill_from", "fill_from", (N // 256,), (256,),
                                                  (x, i32(N), vbuf), ref, nbytes=4 * N))


@dataclass
class Scenario:
    """A named program over the runtime API; ``covers`` names the hazard row or rule it checks."""

    name: str
    fn: Callable[[Recorder], None]
    covers: str
    doc: str = ""


SCENARIOS: list[Scenario] = []


def scenario(covers: str, modes: tuple | None = None):
    """Register a scenario function; with ``modes``, one scenario per capture mode."""

    def deco(fn):
        if modes:
            for m in modes:
                SCENARIOS.append(Scenario(f"{fn.__name__}[{m}]", (lambda r, m=m: fn(r, m)), covers,
                                          (fn.__doc__ or "").strip()))
        else:
            SCENARIOS.append(Scenario(fn.__name__, fn, covers, (fn.__doc__ or "").strip()))
        return fn

    return deco


def _buf(r: Recorder, v: float = 0.0):
    x = r.be.zeros((N,), f32)
    if v:
        r.fill("init", x, v, S.LEGACY_STREAM)
    r.be.synchronize()
    return x


def _capture(r: Recorder, s, mode: str, body: Callable[[], None], tag: str = ""):
    """begin → body → end through :func:`ds4lab.capture.capture_scope` (so the capture ends whatever
    the body raises); records begin/end outcomes; returns the graph or None."""
    from .capture import capture_scope

    with capture_scope(r.be, s, mode, begin=lambda st, m: r.call(f"{tag}begin_capture", r.be.begin_capture, st, m),
                       end=lambda st: r.call(f"{tag}end_capture", r.be.end_capture, st)) as cap:
        body()
    return cap.graph


def _replay(r: Recorder, g, stream, times: int = 1, tag: str = "") -> None:
    ex = r.call(f"{tag}instantiate", r.be.graph_instantiate, g) if g is not None else None
    if ex is None:
        return
    for i in range(times):
        r.call(f"{tag}replay{i}", r.be.graph_launch, ex, stream)
    r.call(f"{tag}replay_sync", r.be.stream_synchronize, stream)


# ----------------------------------------------------------------------------- the hazard table
@scenario("sync memset on the legacy stream while another stream captures", MODES)
def sync_memset_escapes(r: Recorder, mode: str) -> None:
    """A synchronous memset during capture runs once, now, and is not in the graph: the replay
    leaves the buffer untouched (gpu-facts.md; ds4's routed-MoE counts clear)."""
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
    """A blocking stream synchronizes implicitly with the legacy stream, so legacy work during its
    capture would join it: CUDA refuses (cudaErrorStreamCaptureImplicit) and invalidates."""
    be = r.be
    s = be.new_stream(non_blocking=False)
    x = _buf(r, 1.0)
    g = _capture(r, s, "relaxed", lambda: (r.add("add_s", x, s), r.add("add_legacy", x, legacy=True)))
    r.nodes("nodes", g)
    r.note("status_after", be.capture_status(s))


@scenario("allocation inside capture (cudaMalloc)", MODES)
def malloc_in_capture(r: Recorder, mode: str) -> None:
    """cudaMalloc during capture: refused in global and thread-local mode (the capture is
    invalidated), allowed in relaxed mode."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 1.0)
    holder = {}

    def body():
        r.add("add_before", x, s)
        holder["m"] = r.call("malloc", be.malloc, (N,), f32)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)
    if holder.get("m") is not None:
        be.free(holder["m"])


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
    """ds4's MoE profile: cudaEventSynchronize on a captured event is refused
    (cudaErrorCapturedEvent) and breaks the capture."""
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
    """Reading a device value on the host while the current stream captures: CuPy refuses
    before CUDA sees it (a CuPy rule, not CUDA's)."""
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
    """``a @ b`` through CuPy while capturing, after an eager ``a @ b`` made CuPy's cuBLAS handle
    and workspace (as any real program would have)."""
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
    """A scalar kernel argument is captured by value: replaying for the next token reuses the
    captured value (silently stale); the same scalar read from a device buffer is re-read."""
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
    """The graph keeps the freed buffer's address; a new allocation of the same size may get the
    same memory, which the replay then writes (CUDA Programming Guide: graph memory is by address)."""
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


# ----------------------------------------------------------------------------- threads
def _other_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out.get("r")


@scenario("unsafe call (cudaMalloc) from another thread during a capture", MODES)
def cross_thread_malloc(r: Recorder, mode: str) -> None:
    """Global mode forbids unsafe calls from every thread while it captures; thread-local and
    relaxed mode leave other threads alone."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    holder = {}

    def other():
        holder["m"] = r.call("malloc_other_thread", be.malloc, (N,), f32)

    g = _capture(r, s, mode, lambda: (r.add("add", x, s), _other_thread(other),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)
    if holder.get("m") is not None:
        be.free(holder["m"])


@scenario("end capture from another thread", MODES)
def end_capture_wrong_thread(r: Recorder, mode: str) -> None:
    """cudaStreamEndCapture from a thread that did not begin the capture."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    r.call("begin_capture", be.begin_capture, s, mode)
    r.add("add", x, s)
    g = _other_thread(lambda: r.call("end_capture_other_thread", be.end_capture, s))
    if be.capture_status(s) != "none":
        g = r.call("end_capture_same_thread", be.end_capture, s)
    r.nodes("nodes", g)


# ----------------------------------------------------------------------------- fork / join
@scenario("cross-stream fork and join through events")
def fork_join(r: Recorder) -> None:
    """A second stream joins the capture by waiting on an event recorded in it, and is joined back
    by the origin waiting on its event: both kernels are in the graph and replay."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    x, y = _buf(r), _buf(r)

    def body():
        r.call("record_fork", be.event_record, s1, e1)
        r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
        r.add("add_x_s1", x, s1)
        r.add("add_y_s2", y, s2)
        r.call("record_join", be.event_record, s2, e2)
        r.call("s1_wait_join", be.stream_wait_event, s1, e2)

    g = _capture(r, s1, "thread_local", body)
    r.nodes("nodes", g)
    _replay(r, g, s1, times=2)
    r.value("x_after_2_replays", x)
    r.value("y_after_2_replays", y)


@scenario("forked stream never joined back")
def fork_unjoined(r: Recorder) -> None:
    """Ending the capture while a forked stream still has unjoined work."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1 = be.new_event()
    y = _buf(r)
    g = _capture(r, s1, "thread_local", lambda: (r.call("record_fork", be.event_record, s1, e1),
                                                 r.call("s2_wait_fork", be.stream_wait_event, s2, e1),
                                                 r.add("add_y_s2", y, s2)))
    r.nodes("nodes", g)
    r.note("s2_status_after", be.capture_status(s2))


@scenario("end capture on the forked stream instead of the origin")
def end_capture_on_forked(r: Recorder) -> None:
    """cudaStreamEndCapture must be called on the stream that began the capture."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    y = _buf(r)
    r.call("begin_capture", be.begin_capture, s1, "thread_local")
    r.call("record_fork", be.event_record, s1, e1)
    r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
    r.add("add_y_s2", y, s2)
    r.call("end_capture_forked", be.end_capture, s2)
    r.call("record_join", be.event_record, s2, e2)
    r.call("s1_wait_join", be.stream_wait_event, s1, e2)
    g = r.call("end_capture_origin", be.end_capture, s1)
    r.nodes("nodes", g)


@scenario("waiting on an event of another capture sequence")
def isolation(r: Recorder) -> None:
    """Two separate captures; the second waits on an event recorded inside the first."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1 = be.new_event()
    x = _buf(r)
    r.call("begin_capture_s1", be.begin_capture, s1, "relaxed")
    r.call("begin_capture_s2", be.begin_capture, s2, "relaxed")
    r.add("add_s1", x, s1)
    r.call("record_s1", be.event_record, s1, e1)
    r.call("s2_wait_s1_event", be.stream_wait_event, s2, e1)
    g2 = r.call("end_capture_s2", be.end_capture, s2)
    g1 = r.call("end_capture_s1", be.end_capture, s1)
    r.nodes("nodes_s1", g1)
    r.nodes("nodes_s2", g2)


@scenario("waiting on an event recorded outside any capture")
def wait_external_event(r: Recorder) -> None:
    """A capturing stream waits on an event recorded eagerly on another stream before capture."""
    be = r.be
    s1, s0 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_outside", be.event_record, s0, e)
    g = _capture(r, s1, "relaxed", lambda: (r.call("wait_outside_event", be.stream_wait_event, s1, e),
                                            r.add("add", x, s1)))
    r.nodes("nodes", g)


# ----------------------------------------------------------------------------- capture basics
@scenario("end capture on a stream that is not capturing")
def end_capture_not_capturing(r: Recorder) -> None:
    """cudaStreamEndCapture without a begin."""
    s = r.be.new_stream(non_blocking=True)
    r.call("end_capture", r.be.end_capture, s)


@scenario("capture the legacy default stream")
def capture_legacy_stream(r: Recorder) -> None:
    """The legacy NULL stream cannot be captured."""
    r.call("begin_capture_legacy", r.be.begin_capture, S.LEGACY_STREAM, "relaxed")
    if r.be.capture_status(S.LEGACY_STREAM) != "none":
        r.call("end_capture_legacy", r.be.end_capture, S.LEGACY_STREAM)


@scenario("graph replay on another stream, on the legacy stream, and twice", MODES)
def replay_anywhere(r: Recorder, mode: str) -> None:
    """A graph captured on one stream replays on any stream, each replay running every node."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s1, mode, lambda: (r.add("add1", x, s1), r.add("add2", x, s1)))
    r.value("x_after_capture", x)
    r.nodes("nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    for st, tag in ((s1, "s1"), (s2, "s2"), (S.LEGACY_STREAM, "legacy")):
        r.call(f"replay_{tag}", be.graph_launch, ex, st)
        r.call(f"sync_{tag}", be.stream_synchronize, st)
    r.value("x_after_3_replays", x)


@scenario("event record inside a capture")
def event_record_node(r: Recorder) -> None:
    """An event recorded on the capturing stream: what the graph holds for it."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, "thread_local", lambda: (r.add("add", x, s), r.call("record", be.event_record, s, e),
                                                r.add("add2", x, s)))
    r.nodes("nodes", g)


@scenario("host-to-device copy from pageable memory inside a capture")
def h2d_pageable_in_capture(r: Recorder) -> None:
    """cudaMemcpyAsync from pageable host memory on the capturing stream (ds4lab writes per-token
    scalars this way, before the replay, never inside it)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = _capture(r, s, "relaxed", lambda: r.call("copy_h2d", be.copy_h2d, s, x, np.full(N, 4.0, dtype=f32)))
    r.nodes("nodes", g)
    r.note("status_after", be.capture_status(s))


@scenario("capture of one whole tiny token; replay at the next position (device scalars)")
def whole_tiny_token(r: Recorder) -> None:
    """The whole token body captured with per-token scalars read from a device buffer and the
    counts clear as async memset: replaying at a new position equals the eager token, bit for bit."""
    _whole_token(r, scalars="device")


@scenario("capture of one whole tiny token with scalars passed by value; replay at the next position")
def whole_tiny_token_by_value(r: Recorder) -> None:
    """With scalars passed by value, the replay recomputes the captured position: the replayed
    token differs from the eager token at the new position (the exactness check catches it)."""
    _whole_token(r, scalars="value")


def _whole_token(r: Recorder, scalars: str) -> None:
    from .config import get_preset
    from .model import DecodeModel, TokenOptions

    be = r.be
    cfg = get_preset("tiny")
    opts = TokenOptions(counts_clear="async", scalars=scalars, scratch="prealloc", vocab=True)
    eager = DecodeModel(cfg, be, opts)
    cap = DecodeModel(cfg, be, opts)
    for m in (eager, cap):  # the same history: positions 100, 101 eagerly
        m.token(100, 5)
        m.token(101, 6)
    eager.token(102, 7)
    be.synchronize()
    want = eager.hidden().copy()
    s = be.new_stream(non_blocking=True)
    h0 = be.to_host(cap.h).copy()
    snapshot = [be.to_host(c).copy() for c in cap.cache]

    def body():
        with S.stream_override(s):
            cap.token(101, 6, write_scalars=False)  # captured at position 101

    if scalars == "device":
        cap.scalars(101, 6)  # written eagerly; the graph only reads the buffer
    be.synchronize()
    g = _capture(r, s, "thread_local", body)
    r.note("graph_kernels", sum(n["kind"] == "kernel" for n in be.graph_nodes(g)) if g is not None else 0)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    # Restore the state after position 101, write position 102's scalars, replay.
    cap.h[...] = be.from_host(h0)
    for c, snap in zip(cap.cache, snapshot):
        c[...] = be.from_host(snap)
    if scalars == "device":
        cap.scalars(102, 7)
    be.synchronize()  # the restores and the scalar copy ran on the legacy stream; s does not wait for it
    if ex is not None:
        r.call("replay", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    got = cap.hidden()
    r.note("replay_equals_eager_next_token", bool(np.array_equal(got, want)))


# ----------------------------------------------------------------------------- runner
def run_scenarios(be, names: list[str] | None = None, progress=None) -> dict[str, dict[str, str]]:
    """Run the scenarios (all, or those named) on ``be``. Returns ``{scenario: {step: outcome}}``.

    A scenario that raises an unexpected Python exception records it under ``"<exception>"`` and
    the run goes on; any capture it left open is ended.
    """
    was = S.graphs_enabled()
    S.set_graphs_enabled(True)
    out = {}
    try:
        for sc in SCENARIOS:
            if names and sc.name not in names:
                continue
            rec = Recorder(be)
            created: list = []
            make_stream = be.new_stream

            def tracked(*a, **k):
                st = make_stream(*a, **k)
                created.append(st)
                return st

            be.new_stream = tracked  # the scenario's streams, so a capture it leaves open is ended
            try:
                sc.fn(rec)
            except RuntimeApiError as e:
                rec.obs["<unhandled>"] = e.name
            except Exception as e:  # a scenario bug or a backend gap: keep going, report it
                rec.obs["<exception>"] = f"{type(e).__name__}: {e}"
            finally:
                del be.new_stream
                S.capture_set_stream(None)
                _end_left_captures(be, created, rec)
            try:
                be.synchronize()
            except RuntimeApiError:
                pass
            out[sc.name] = rec.obs
            if progress:
                progress(sc.name)
    finally:
        S.set_graphs_enabled(was)
    return out


def _end_left_captures(be, streams, rec: Recorder) -> None:
    """End any capture a scenario left open on its streams; recorded as ``<left capturing>``."""
    left = []
    for st in streams:
        try:
            status = be.capture_status(st)
        except RuntimeApiError:
            continue
        if status != "none":
            left.append(status)
            try:
                be.end_capture(st)
            except RuntimeApiError:
                pass
    if left:
        rec.obs["<left capturing>"] = ",".join(left)


def compare(results: dict[str, dict[str, dict[str, str]]]):
    """One tidy DataFrame: scenario, step, one column per backend, and ``agree``."""
    import pandas as pd

    backends = list(results)
    rows = []
    for sc in SCENARIOS:
        steps: list[str] = []
        for b in backends:
            for st in results[b].get(sc.name, {}):
                if st not in steps:
                    steps.append(st)
        for st in steps:
            row = {"scenario": sc.name, "covers": sc.covers, "step": st}
            vals = [results[b].get(sc.name, {}).get(st, "—") for b in backends]
            row.update(dict(zip(backends, vals)))
            row["agree"] = len(set(vals)) == 1
            rows.append(row)
    return pd.DataFrame(rows)
