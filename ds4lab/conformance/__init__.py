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

from .. import stream as S
from ..errors import RuntimeApiError
from ..launch import Launcher

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

    def update(self, step: str, graph_exec, graph) -> None:
        """``cudaGraphExecUpdate``: records the outcome, and for a refusal CUDA's update result
        (``<step>_result``) and the failing node's type (``<step>_node``, ``none`` when CUDA names none)."""
        from ..errors import GraphExecUpdateError

        if graph_exec is None or graph is None:
            self.obs[step] = "no graph"
            return
        try:
            self.be.graph_exec_update(graph_exec, graph)
        except GraphExecUpdateError as e:
            self.obs[step] = e.name
            self.obs[f"{step}_result"] = e.result
            self.obs[f"{step}_node"] = e.node_type or "none"
            return
        except RuntimeApiError as e:
            self.obs[step] = e.name
            return
        self.obs[step] = "ok"

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
    """A named program over the runtime API; ``covers`` names the hazard row or rule it checks.

    ``expect``: for scenarios written from the CUDA documentation before an H200 record of them
    exists, the outcome of the steps the documented rule is about (``{step: outcome}``), with
    ``source`` saying where it comes from. The sim is held to it until the H200 record replaces it.
    """

    name: str
    fn: Callable[[Recorder], None]
    covers: str
    doc: str = ""
    expect: dict | None = None
    source: str = ""


SCENARIOS: list[Scenario] = []


def scenario(covers: str, modes: tuple | None = None, expect=None, source: str = ""):
    """Register a scenario function; with ``modes``, one scenario per capture mode.

    ``expect``: a ``{step: outcome}`` dict, or (with ``modes``) a function of the mode returning one.
    """

    def deco(fn):
        if modes:
            for m in modes:
                e = expect(m) if callable(expect) else expect
                SCENARIOS.append(Scenario(f"{fn.__name__}[{m}]", (lambda r, m=m: fn(r, m)), covers,
                                          (fn.__doc__ or "").strip(), e, source))
        else:
            SCENARIOS.append(Scenario(fn.__name__, fn, covers, (fn.__doc__ or "").strip(), expect, source))
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
    from ..capture import capture_scope

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
    from ..config import get_preset
    from ..model import DecodeModel, TokenOptions

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


# ----------------------------------------------------------------------------- queries (issue: no swallowed status)
_FACTS = "shared/context/gpu-facts.md"
_RT = "CUDA Runtime API reference"
_INV = {"end_capture": "cudaErrorStreamCaptureInvalidated", "nodes": "no graph", "status_in_capture": "invalidated"}


@scenario("stream query on the capturing stream (every mode)", ("global", "thread_local"),
          expect={"stream_query": "cudaErrorStreamCaptureUnsupported", **_INV},
          source=f"{_FACTS}: cudaStreamQuery on a capturing stream returns 900 and invalidates, every mode")
def stream_query_in_capture(r: Recorder, mode: str) -> None:
    """cudaStreamQuery on the capturing stream returns cudaErrorStreamCaptureUnsupported (CuPy
    returns it as a value: ds4lab raises it) and invalidates the capture."""
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
    """After a clean end, the stream is an ordinary stream again; an event last recorded inside the
    capture stays unusable, replays or not, until it is recorded again eagerly."""
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
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    y = _buf(r)

    def body():
        r.call("record_fork", be.event_record, s1, e1)
        r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
        r.add("add_y_s2", y, s2)
        r.call("stream_query_forked", be.stream_query, s2)
        r.note("status_in_capture", be.capture_status(s1))
        r.call("record_join", be.event_record, s2, e2)
        r.call("s1_wait_join", be.stream_wait_event, s1, e2)

    g = _capture(r, s1, "thread_local", body)
    r.nodes("nodes", g)


@scenario("another thread's event query of a pre-capture event during a capture", MODES,
          expect=lambda m: {"event_query_other_thread": "cudaErrorStreamCaptureUnsupported" if m == "global" else "ok",
                            "status_in_capture": "invalidated" if m == "global" else "active",
                            "end_capture": "cudaErrorStreamCaptureInvalidated" if m == "global" else "ok"},
          source=f"{_FACTS} (2026-11-30): global: 900 + capture invalidated; thread-local or relaxed: success; "
                 f"{_RT}, cudaThreadExchangeStreamCaptureMode")
def cross_thread_event_query(r: Recorder, mode: str) -> None:
    """An event recorded and completed before the capture, queried from another thread."""
    be = r.be
    s0, s = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_before", be.event_record, s0, e)
    r.call("sync_before", be.stream_synchronize, s0)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s),
                                      _other_thread(lambda: r.call("event_query_other_thread", be.event_query, e)),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("another thread's event synchronize of a pre-capture event during a capture", MODES,
          expect=lambda m: {"event_sync_other_thread": "cudaErrorStreamCaptureUnsupported" if m == "global" else "ok",
                            "status_in_capture": "invalidated" if m == "global" else "active",
                            "end_capture": "cudaErrorStreamCaptureInvalidated" if m == "global" else "ok"},
          source=f"{_FACTS} (2026-11-30): another thread's event query/sync of a pre-capture event: global: 900 + "
                 "invalidated; thread-local or relaxed: success")
def cross_thread_event_sync(r: Recorder, mode: str) -> None:
    """As cross_thread_event_query, with cudaEventSynchronize."""
    be = r.be
    s0, s = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_before", be.event_record, s0, e)
    r.call("sync_before", be.stream_synchronize, s0)
    g = _capture(r, s, mode, lambda: (r.add("add", x, s),
                                      _other_thread(lambda: r.call("event_sync_other_thread", be.event_synchronize, e)),
                                      r.note("status_in_capture", be.capture_status(s))))
    r.nodes("nodes", g)


@scenario("stream synchronize of a stream forked into a capture",
          expect={"s2_wait_fork": "ok", "stream_sync_forked": "cudaErrorStreamCaptureUnsupported",
                  "status_in_capture": "invalidated", "end_capture": "cudaErrorStreamCaptureInvalidated"},
          source=f"{_FACTS} (2026-11-30): cudaStreamSynchronize of a forked stream that joined the capture → 900, "
                 "capture invalidated")
def stream_sync_forked(r: Recorder) -> None:
    """A forked stream is part of the capture: synchronizing it is synchronizing a capturing stream."""
    be = r.be
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    y = _buf(r)

    def body():
        r.call("record_fork", be.event_record, s1, e1)
        r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
        r.add("add_y_s2", y, s2)
        r.call("stream_sync_forked", be.stream_synchronize, s2)
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
    """The querying thread leaves the default (global) interaction mode with
    cudaThreadExchangeStreamCaptureMode; the capture on this thread is global."""
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


# ----------------------------------------------------------------------------- graphs: launch and upload
_GM = f"{_RT}, 'Graph Management'"


def _add_graph(r: Recorder, x, n: int = 1, tag: str = "", mode: str = "thread_local"):
    """A graph of ``n`` ``x += 1`` kernels captured on a fresh stream (steps prefixed ``tag``)."""
    s = r.be.new_stream(non_blocking=True)
    return _capture(r, s, mode, lambda: [r.add(f"{tag}add{i}", x, s) for i in range(n)], tag=tag)


def _mem_graph(r: Recorder, free: bool, tag: str = "m_"):
    """A graph with a cudaMallocAsync node (and its cudaFreeAsync node when ``free``); returns (graph, buffer)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    held = {}

    def body():
        held["buf"] = r.call(f"{tag}malloc_async", be.malloc_async, s, (N,), f32)
        if free and held["buf"] is not None:
            r.call(f"{tag}free_async", be.free_async, s, held["buf"])

    g = _capture(r, s, "thread_local", body, tag=tag)
    return g, held.get("buf")


@scenario("graph launch into a stream that is capturing (every mode)", MODES,
          expect={"launch_into_capture": "cudaErrorStreamCaptureUnsupported", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated", "nodes": "no graph", "x": "0"},
          source=f"{_FACTS} (2026-11-30): cudaGraphLaunch into a capturing stream (global, relaxed) → 900, "
                 "invalidated, end → invalidated; GUESS: thread-local alike")
def graph_launch_into_capture(r: Recorder, mode: str) -> None:
    """Capturing a graph launch (a child-graph node in the sim before) is refused on the H200."""
    be = r.be
    x = _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s2 = be.new_stream(non_blocking=True)
    g = _capture(r, s2, mode, lambda: (r.call("launch_into_capture", be.graph_launch, ex, s2),
                                       r.note("status_in_capture", be.capture_status(s2))))
    r.nodes("nodes", g)
    r.value("x", x)


@scenario("graph launch into a stream whose capture is invalidated",
          expect={"device_synchronize": "cudaErrorStreamCaptureUnsupported",
                  "launch_into_invalidated": "cudaErrorStreamCaptureUnsupported",
                  "end_capture": "cudaErrorStreamCaptureInvalidated", "x": "0"},
          source="CUDA Programming Guide, 'Stream Capture' → 'Invalidation'; measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): the launch returns "
                 "cudaErrorStreamCaptureUnsupported")
def graph_launch_invalidated_capture(r: Recorder) -> None:
    """Every further use of a stream in an invalidated capture fails until the capture ends."""
    be = r.be
    x = _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s2 = be.new_stream(non_blocking=True)
    _capture(r, s2, "relaxed", lambda: (r.call("device_synchronize", be.synchronize),
                                        r.call("launch_into_invalidated", be.graph_launch, ex, s2)))
    r.value("x", x)


@scenario("graph launch on the legacy stream while a blocking stream captures",
          expect={"launch_legacy": "cudaErrorStreamCaptureImplicit", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated"},
          source="CUDA Programming Guide, 'Prohibited and Unhandled Operations' (legacy stream use during the "
                 "capture of a blocking stream)")
def graph_launch_legacy_blocking_capture(r: Recorder) -> None:
    """A graph launch is legacy-stream work like a kernel."""
    be = r.be
    x, y = _buf(r), _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s = be.new_stream(non_blocking=False)
    _capture(r, s, "relaxed", lambda: (r.add("add_s", y, s), r.call("launch_legacy", be.graph_launch, ex, S.LEGACY_STREAM),
                                       r.note("status_in_capture", be.capture_status(s))))


@scenario("graph upload, then launch",
          expect={"upload": "ok", "replay0": "ok", "x": "1"}, source=f"{_GM}, cudaGraphUpload")
def graph_upload_then_launch(r: Recorder) -> None:
    """cudaGraphUpload prepares the executable without running it; the launch runs it once."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    r.call("upload", be.graph_upload, ex, s)
    r.call("upload_sync", be.stream_synchronize, s)
    r.value("x_after_upload", x)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("graph upload into a stream that is capturing",
          expect={"upload_into_capture": "cudaErrorStreamCaptureUnsupported", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated"},
          source=f"{_GM}, cudaGraphUpload (stream-ordered); GUESS: refused as a launch is ({_FACTS})")
def graph_upload_into_capture(r: Recorder) -> None:
    """cudaGraphUpload into a capturing stream."""
    be = r.be
    x = _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s2 = be.new_stream(non_blocking=True)
    _capture(r, s2, "relaxed", lambda: (r.call("upload_into_capture", be.graph_upload, ex, s2),
                                        r.note("status_in_capture", be.capture_status(s2))))


@scenario("one executable launched on two streams back to back",
          expect={"replay_s1": "ok", "replay_s2": "ok", "x": "2"},
          source=f"{_GM}, cudaGraphLaunch: each launch is ordered behind any previous launches of the executable")
def graph_launch_two_streams(r: Recorder) -> None:
    """Two launches of one executable on two streams, no synchronization between them."""
    be = r.be
    x = _buf(r)
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    r.call("replay_s1", be.graph_launch, ex, s1)
    r.call("replay_s2", be.graph_launch, ex, s2)
    r.call("sync_s1", be.stream_synchronize, s1)
    r.call("sync_s2", be.stream_synchronize, s2)
    r.value("x", x)


# ----------------------------------------------------------------------------- graphs: instantiation
@scenario("a graph without memory nodes instantiated twice",
          expect={"instantiate1": "ok", "instantiate2": "ok", "x": "2"},
          source=f"{_GM}, cudaGraphLaunch: to run a graph concurrently, instantiate it several times")
def instantiate_twice(r: Recorder) -> None:
    """Both executables replay the same nodes."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    g = _add_graph(r, x, tag="g_")
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    ex2 = r.call("instantiate2", be.graph_instantiate, g)
    r.call("replay1", be.graph_launch, ex1, s)
    r.call("replay2", be.graph_launch, ex2, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a graph that allocates and frees, instantiated while its executable lives",
          expect={"m_nodes": "mem_allocx1,mem_freex1", "instantiate1": "ok", "instantiate2": "cudaErrorNotSupported"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (at most one executable in existence for a graph with "
                 "memory nodes)")
def instantiate_mem_nodes_twice(r: Recorder) -> None:
    """A graph with cudaMallocAsync and the matching cudaFreeAsync node, instantiated twice while the
    first executable is kept alive (in CuPy a dropped executable is destroyed at once)."""
    be = r.be
    g, _ = _mem_graph(r, free=True)
    r.nodes("m_nodes", g)
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    r.call("instantiate2", be.graph_instantiate, g)
    del ex1


@scenario("a graph with an unfreed allocation instantiated again, then after its executable is dropped",
          expect={"u_nodes": "mem_allocx1", "instantiate1": "ok", "instantiate2": "cudaErrorNotSupported",
                  "instantiate3": "ok"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (at most one executable in existence); {_FACTS} (2026-11-30) "
                 "and the H200 conformance run of 2026-11-30: cudaErrorNotSupported while the first executable "
                 "lives; once it is destroyed the slot is free")
def instantiate_unfreed_mem_nodes_twice(r: Recorder) -> None:
    """The graph allocates and does not free: a second executable while the first lives, then one
    after the first is destroyed."""
    be = r.be
    g, _ = _mem_graph(r, free=False, tag="u_")
    r.nodes("u_nodes", g)
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    r.call("instantiate2", be.graph_instantiate, g)
    if ex1 is not None:
        be.graph_exec_destroy(ex1)
    r.call("instantiate3", be.graph_instantiate, g)


@scenario("a graph with memory nodes instantiated again after its executable was destroyed",
          expect={"instantiate1": "ok", "exec_destroy": "ok", "instantiate2": "ok", "replay0": "ok"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags ('before destroying the first with cudaGraphExecDestroy')")
def instantiate_after_exec_destroy(r: Recorder) -> None:
    """cudaGraphExecDestroy frees the graph's one-executable slot."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=True)
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    r.call("exec_destroy", be.graph_exec_destroy, ex1)
    ex2 = r.call("instantiate2", be.graph_instantiate, g)
    r.call("replay0", be.graph_launch, ex2, s)
    r.call("replay_sync", be.stream_synchronize, s)


@scenario("relaunch of a graph whose allocation was never freed",
          expect={"m_nodes": "mem_allocx1", "replay0": "ok", "replay1": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphLaunch (unfreed allocations of a previous launch: cudaErrorInvalidValue); "
                 f"{_FACTS} (2026-11-30)")
def mem_alloc_unfreed_relaunch(r: Recorder) -> None:
    """A cudaMallocAsync node without a free: the first launch allocates; the second is refused."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=False)
    r.nodes("m_nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay0_sync", be.stream_synchronize, s)
    r.call("replay1", be.graph_launch, ex, s)
    r.call("replay1_sync", be.stream_synchronize, s)


@scenario("relaunch with cudaGraphInstantiateFlagAutoFreeOnLaunch",
          expect={"instantiate_auto_free": "ok", "replay0": "ok", "replay1": "ok"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (AutoFreeOnLaunch frees unfreed allocations before relaunch)")
def mem_alloc_auto_free_on_launch(r: Recorder) -> None:
    """The same graph instantiated with AutoFreeOnLaunch relaunches."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=False)
    ex = r.call("instantiate_auto_free", be.graph_instantiate, g, 1)
    for i in range(2):
        r.call(f"replay{i}", be.graph_launch, ex, s)
        r.call(f"replay{i}_sync", be.stream_synchronize, s)


@scenario("a graph's allocation freed outside the graph, then relaunch",
          expect={"replay0": "ok", "free_outside": "ok", "replay1": "ok"},
          source="CUDA Programming Guide, 'Graph Memory Nodes' (freeing graph memory outside the allocating graph); "
                 f"{_GM}, cudaGraphLaunch")
def mem_alloc_freed_outside(r: Recorder) -> None:
    """cudaFreeAsync of the graph's allocation after a launch makes the next launch legal."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, buf = _mem_graph(r, free=False)
    ex = r.call("instantiate", be.graph_instantiate, g)
    r.call("replay0", be.graph_launch, ex, s)
    if buf is not None:
        r.call("free_outside", be.free_async, s, buf)
    r.call("replay1", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)


@scenario("a graph that allocates and frees, launched three times",
          expect={"m_nodes": "mem_allocx1,mem_freex1", "replay0": "ok", "replay1": "ok", "replay2": "ok"},
          source=f"{_GM}, cudaGraphLaunch (no allocation left unfreed)")
def mem_alloc_freed_in_graph(r: Recorder) -> None:
    """An allocation freed inside the same graph never blocks a relaunch."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=True)
    r.nodes("m_nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    for i in range(3):
        r.call(f"replay{i}", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)


@scenario("instantiate with DeviceLaunch together with AutoFreeOnLaunch",
          expect={"instantiate_device_auto_free": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags ('cannot be used in conjunction')")
def instantiate_device_launch_auto_free(r: Recorder) -> None:
    """Two flags the reference says exclude each other."""
    x = _buf(r)
    r.call("instantiate_device_auto_free", r.be.graph_instantiate, _add_graph(r, x, tag="g_"), 4 | 1)


@scenario("instantiate for device launch a graph with memory nodes",
          expect={"instantiate_device": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (device graphs: kernel, memcpy, memset and child graph nodes "
                 "only; returns cudaErrorInvalidValue)")
def instantiate_device_launch_mem_nodes(r: Recorder) -> None:
    """A graph with memory nodes cannot be instantiated for device launch."""
    g, _ = _mem_graph(r, free=True)
    r.call("instantiate_device", r.be.graph_instantiate, g, 4)


@scenario("instantiate for device launch an empty graph",
          expect={"graph_create": "ok", "instantiate_device": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (a device graph cannot be empty)")
def instantiate_device_launch_empty(r: Recorder) -> None:
    """An empty graph cannot be instantiated for device launch."""
    g = r.call("graph_create", r.be.graph_create)
    if g is not None:
        r.call("instantiate_device", r.be.graph_instantiate, g, 4)


@scenario("instantiate for device launch a graph of kernels, launch it from the host",
          expect={"instantiate_device": "ok", "replay0": "ok", "x": "1"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (a device-launch executable launches from host and device)")
def instantiate_device_launch_kernels(r: Recorder) -> None:
    """A kernel-only graph instantiated for device launch also runs from the host."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate_device", be.graph_instantiate, _add_graph(r, x, tag="g_"), 4)
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("cudaGraphInstantiateFlagUpload through cudaGraphInstantiateWithFlags",
          expect={"instantiate_upload_flag": "cudaErrorInvalidValue"},
          source=f"{_RT}, enum cudaGraphInstantiateFlags (Upload: only with cudaGraphInstantiateWithParams). "
                 "GUESS: the error")
def instantiate_flag_upload(r: Recorder) -> None:
    """The upload flag needs the stream that only cudaGraphInstantiateWithParams names."""
    x = _buf(r)
    r.call("instantiate_upload_flag", r.be.graph_instantiate, _add_graph(r, x, tag="g_"), 2)


@scenario("instantiate with an unknown flag bit",
          expect={"instantiate_bad_flag": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (valid flags; returns cudaErrorInvalidValue)")
def instantiate_unknown_flag(r: Recorder) -> None:
    """Flag bit 1 << 10 names nothing."""
    x = _buf(r)
    r.call("instantiate_bad_flag", r.be.graph_instantiate, _add_graph(r, x, tag="g_"), 1 << 10)


@scenario("an empty graph: create, instantiate, launch",
          expect={"graph_create": "ok", "instantiate": "ok", "replay0": "ok", "replay_sync": "ok"},
          source=f"{_GM}, cudaGraphCreate / cudaGraphInstantiate (an empty graph is valid for host launch)")
def empty_graph_launch(r: Recorder) -> None:
    """A graph with no nodes launches and does nothing."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g = r.call("graph_create", be.graph_create)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)


@scenario("destroy the graph, launch its executable",
          expect={"graph_destroy": "ok", "replay0": "ok", "x": "1"},
          source=f"{_GM}, cudaGraphInstantiate / cudaGraphDestroy (the executable is independent of its graph)")
def graph_destroy_exec_lives(r: Recorder) -> None:
    """An executable graph keeps working after cudaGraphDestroy of the graph it came from."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    g = _add_graph(r, x, tag="g_")
    ex = r.call("instantiate", be.graph_instantiate, g)
    if g is not None:
        r.call("graph_destroy", be.graph_destroy, g)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


# ----------------------------------------------------------------------------- graphs: executable update
_UPD = f"{_GM}, cudaGraphExecUpdate (cudaGraphExecUpdateResultInfo)"


def _fill_graph(r: Recorder, x, v: float, tag: str):
    s = r.be.new_stream(non_blocking=True)
    return _capture(r, s, "thread_local", lambda: r.fill(f"{tag}fill", x, v, s), tag=tag)


@scenario("executable update with a topologically identical graph",
          expect={"update": "ok", "x": "2"}, source=f"{_UPD}; CUDA Programming Guide, 'Whole graph update'")
def exec_update_same_topology(r: Recorder) -> None:
    """A by-value argument captured again and given to the executable: the replay uses the new value."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _fill_graph(r, x, 1.0, "a_"))
    r.update("update", ex, _fill_graph(r, x, 2.0, "b_"))
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("executable update with one node more",
          expect={"update": "cudaErrorGraphExecUpdateFailure", "update_result": "cudaGraphExecUpdateErrorTopologyChanged",
                  "update_node": "none", "x": "1"},
          source=f"{_UPD} (node counts differ: TopologyChanged, errorNode NULL); {_FACTS} (2026-11-30)")
def exec_update_node_count(r: Recorder) -> None:
    """The refused update leaves the executable as it was: the replay runs the old graph."""
    be = r.be
    x, y = _buf(r), _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, 1, tag="a_"))
    r.update("update", ex, _add_graph(r, y, 2, tag="b_"))
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("executable update where a node's type changed",
          expect={"update": "cudaErrorGraphExecUpdateFailure", "update_result": "cudaGraphExecUpdateErrorNodeTypeChanged",
                  "update_node": "memset"},
          source=f"{_UPD} (NodeTypeChanged, errorNode the node from the new graph)")
def exec_update_node_type(r: Recorder) -> None:
    """A kernel node paired with a memset node."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, 1, tag="a_"))
    g2 = _capture(r, s, "thread_local", lambda: r.call("memset_async", be.memset_async, s, x, 0), tag="b_")
    r.update("update", ex, g2)


@scenario("executable update where a kernel node's function changed",
          expect={"update": "ok", "x": "3"},
          source=f"{_UPD} (FunctionChanged only for drivers < 11.2; none of the kernel-node limitations applies)")
def exec_update_function(r: Recorder) -> None:
    """``x += 1`` replaced by ``x = 3`` (another kernel, same context)."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, 1, tag="a_"))
    r.update("update", ex, _fill_graph(r, x, 3.0, "b_"))
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("executable update where the dependencies changed",
          expect={"update": "cudaErrorGraphExecUpdateFailure", "update_result": "cudaGraphExecUpdateErrorTopologyChanged",
                  "update_node": "kernel"},
          source=f"{_UPD} (a node with other dependencies, or more exit nodes: TopologyChanged, errorNode from hGraph)")
def exec_update_dependencies(r: Recorder) -> None:
    """Two kernels in a chain, updated with the same two kernels side by side (fork/join)."""
    be = r.be
    x, y = _buf(r), _buf(r)
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    g1 = _capture(r, s1, "thread_local", lambda: (r.add("a_add_x", x, s1), r.add("a_add_y", y, s1)), tag="a_")
    ex = r.call("instantiate", be.graph_instantiate, g1)

    def forked():
        r.call("record_fork", be.event_record, s1, e1)
        r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
        r.add("b_add_x", x, s1)
        r.add("b_add_y", y, s2)
        r.call("record_join", be.event_record, s2, e2)
        r.call("s1_wait_join", be.stream_wait_event, s1, e2)

    r.update("update", ex, _capture(r, s1, "thread_local", forked, tag="b_"))


@scenario("executable update of a graph with memory nodes",
          expect={"update": "ok"},
          source=f"{_GM}, cudaGraphExecNodeSetParams (memory allocation/free nodes: API unsupported for single-node "
                 "updates); measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): the whole-graph update of an identical graph succeeds")
def exec_update_mem_nodes(r: Recorder) -> None:
    """Allocation and free nodes, the same on both sides."""
    be = r.be
    g1, _ = _mem_graph(r, free=True, tag="a_")
    ex = r.call("instantiate", be.graph_instantiate, g1)
    g2, _ = _mem_graph(r, free=True, tag="b_")
    r.update("update", ex, g2)


# ----------------------------------------------------------------------------- graphs: composition and event nodes
@scenario("child graph nodes run as part of the parent",
          expect={"graph_create": "ok", "add_child1": "ok", "add_child2": "ok", "instantiate": "ok", "x": "2"},
          source=f"{_GM}, cudaGraphAddChildGraphNode")
def child_graph_runs(r: Recorder) -> None:
    """A captured ``x += 1`` graph added twice as a child of a created graph."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    child = _add_graph(r, x, tag="c_")
    parent = r.call("graph_create", be.graph_create)
    if parent is None or child is None:
        return
    r.call("add_child1", be.graph_add_child, parent, child)
    r.call("add_child2", be.graph_add_child, parent, child)
    ex = r.call("instantiate", be.graph_instantiate, parent)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a child graph is cloned: destroying it leaves the parent intact",
          expect={"add_child": "ok", "child_destroy": "ok", "instantiate": "ok", "replay0": "ok", "x": "1"},
          source=f"{_GM}, cudaGraphAddChildGraphNode (the child graph is cloned in this call)")
def child_graph_cloned(r: Recorder) -> None:
    """The child is destroyed right after it was added."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    child = _add_graph(r, x, tag="c_")
    parent = r.call("graph_create", be.graph_create)
    if parent is None or child is None:
        return
    r.call("add_child", be.graph_add_child, parent, child)
    r.call("child_destroy", be.graph_destroy, child)
    ex = r.call("instantiate", be.graph_instantiate, parent)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a child graph with memory nodes",
          expect={"add_child": "cudaErrorNotSupported"},
          source=f"{_GM}, cudaGraphAddChildGraphNode (a child with allocation or free nodes: an error); measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): "
                 "cudaErrorNotSupported")
def child_graph_mem_nodes(r: Recorder) -> None:
    """Graphs with memory nodes cannot be children."""
    be = r.be
    child, _ = _mem_graph(r, free=True)
    parent = r.call("graph_create", be.graph_create)
    if parent is not None and child is not None:
        r.call("add_child", be.graph_add_child, parent, child)


@scenario("event record node (cudaEventRecordExternal) in a capture",
          expect={"record_external": "ok", "nodes": "event_recordx1,kernel:tiny_addx1", "replay0": "ok",
                  "event_synchronize": "ok", "event_query": "ok"},
          source=f"{_RT}, cudaEventRecordWithFlags (cudaEventRecordExternal: an event record node)")
def event_record_external_node(r: Recorder) -> None:
    """Unlike a plain record in a capture, an external record is a node: each replay records the event,
    which the host can then wait for."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, "thread_local", lambda: (r.add("add", x, s), r.call("record_external", be.event_record_external, s, e)))
    r.nodes("nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("event_synchronize", be.event_synchronize, e)
        r.call("event_query", be.event_query, e)


@scenario("event wait node (cudaEventWaitExternal) on an event recorded outside the capture",
          expect={"wait_external": "ok", "nodes": "kernel:tiny_addx1,wait_eventx1", "end_capture": "ok"},
          source=f"{_RT}, cudaStreamWaitEvent (cudaEventWaitExternal); CUDA Programming Guide, 'Prohibited and "
                 "Unhandled Operations' (without the flag: refused)")
def wait_external_event_node(r: Recorder) -> None:
    """The wait that is refused without the flag (scenario wait_external_event) becomes a node."""
    be = r.be
    s1, s0 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_outside", be.event_record, s0, e)
    g = _capture(r, s1, "relaxed", lambda: (r.call("wait_external", be.stream_wait_event_external, s1, e),
                                            r.add("add", x, s1)))
    r.nodes("nodes", g)


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
