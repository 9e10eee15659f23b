"""A model of the CUDA runtime's streams, events, stream capture and graphs, on the CPU.

This module knows nothing about arrays or kernels: work is a callable (``fn``) plus a modeled
GPU duration. :class:`ds4lab.sim.backend.SimBackend` adapts the :class:`~ds4lab.backends.base.Backend`
interface onto it.

What it models (sources: CUDA Programming Guide, "Asynchronous execution" → blocking and
non-blocking streams and the default stream, and "CUDA Graphs" → "Stream Capture"; CUDA Runtime
API reference for each call; ``shared/context/gpu-facts.md`` for what our H200 did):

* **Eager work** runs *now*: ``fn()`` is called at enqueue. In this workbench one host thread
  issues work in dependency order, so executing at enqueue respects every stream and event
  dependency. Its *time* is modeled separately (:mod:`ds4lab.sim.costmodel`).
* **Captured work** is not executed: it becomes a :class:`Node` of the capture's graph holding
  the callable exactly as issued (a ref closure captured scalars by value and buffers by
  reference, which is exactly what a kernel node keeps: parameter values and pointers).
  :meth:`Runtime.graph_launch` calls the nodes' callables again, in order.
* **Streams**: the legacy default stream (implicitly synchronises with every *blocking* stream),
  blocking and non-blocking streams, and per-thread default streams (blocking with respect to the
  legacy stream, not synchronising with other streams).
* **Capture rules**: every rule is an entry of :data:`RULES` (trigger, outcome, CUDA error name,
  what gets invalidated, source). The code raises through :meth:`Runtime._fail`, which looks the
  rule up, so the table is the single place to read or change what the simulator claims.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from ..errors import CudaError, CupyRefusal
from ..stream import LEGACY_STREAM, current_stream
from .costmodel import Calibration, Device

#: Capture modes, as ``Backend.begin_capture`` names them (cudaStreamCaptureMode*).
MODES = ("global", "thread_local", "relaxed")


class Rule(NamedTuple):
    """One rule of stream capture: when it applies and what the simulator does."""

    when: str
    outcome: str  # "node", "marks", "joins", "escapes", "raises", "returns", "drops"
    error: str | None  # CUDA error name or "cupy:" label raised (None: no error)
    invalidates: str  # which capture sequences become invalidated
    source: str


#: Every stream-capture rule the simulator applies. ``PG`` = CUDA Programming Guide, "CUDA Graphs"
#: → "Stream Capture" (subsections named); ``RT`` = CUDA Runtime API reference; ``facts`` =
#: ``shared/context/gpu-facts.md`` ("Stream capture, as CuPy 14.2 + driver 580 behave"), which is
#: authoritative where it speaks. ``GUESS`` marks behaviour no source states: to be checked on a GPU.
RULES: dict[str, Rule] = {
    # --- what becomes part of the graph
    "capture_node": Rule(
        "kernel, cudaMemsetAsync, cudaMemcpyAsync, cudaMallocAsync/cudaFreeAsync or cudaGraphLaunch on a "
        "capturing stream", "node", None, "-",
        "PG 'Stream Capture': work launched into a capturing stream is appended to the capture graph, not "
        "executed; facts rows memsetAsync and mallocAsync/freeAsync ('yes (memory nodes)')"),
    "capture_event_record": Rule(
        "cudaEventRecord on a capturing stream", "marks", None, "-",
        "PG 'Cross-stream Dependencies and Events': a captured event represents a set of nodes; facts row "
        "'event record': marks a dependency, not a timing node (no graph node)"),
    "fork": Rule(
        "cudaStreamWaitEvent(s, e): e last recorded in live capture C, s not capturing", "joins", None, "-",
        "PG 'Cross-stream Dependencies and Events': waiting on a captured event places the stream in capture "
        "mode; its next item depends on the event's nodes"),
    "join": Rule(
        "cudaStreamWaitEvent(s, e): e and s in the same capture", "joins", None, "-",
        "PG 'Cross-stream Dependencies and Events' (join back to the origin stream)"),
    # --- work that escapes the graph
    "legacy_escape": Rule(
        "kernel or synchronous cudaMemset on the legacy stream while only non-blocking streams capture",
        "escapes", None, "-",
        "facts rows 'synchronous memset (legacy stream)' and 'kernel on the legacy (null) stream': ran once at "
        "capture time, not in the graph"),
    # --- refusals
    "legacy_implicit": Rule(
        "any use of the legacy stream (enqueue, record, wait, query, synchronize, synchronous memset/copy) "
        "while a blocking (not cudaStreamNonBlocking) stream captures", "raises",
        "cudaErrorStreamCaptureImplicit", "every live capture holding a blocking stream",
        "PG 'Prohibited and Unhandled Operations': any attempted use of the legacy stream is invalid; RT "
        "cudaError: cudaErrorStreamCaptureImplicit. GUESS: the legacy work is not executed"),
    "unsafe_call": Rule(
        "a potentially unsafe call (cudaMalloc, cudaFree, memory-pool growth, cudaEventQuery/"
        "cudaEventSynchronize of an uncaptured event) by a thread that has a global/thread-local capture, "
        "or, while its interaction mode is global (the default), while another thread has a global capture",
        "raises", "cudaErrorStreamCaptureUnsupported", "the captures that prohibit the call",
        "RT cudaThreadExchangeStreamCaptureMode (mode definitions); facts row cudaMalloc (global/thread-local: "
        "refused, invalidated; relaxed: ok). GUESS: cudaFree, pool growth and event query/synchronize are "
        "'unsafe' (PyTorch's NCCL watchdog hits this with cudaEventQuery); other threads' captures invalidated"),
    "event_sync_captured": Rule(
        "cudaEventSynchronize of an event last recorded in a live capture", "raises", "cudaErrorCapturedEvent",
        "the event's capture", "facts row 'event synchronize / elapsed time' (end fails: invalidated)"),
    "event_elapsed_captured": Rule(
        "cudaEventElapsedTime with an event last recorded in a live capture", "raises", "cudaErrorCapturedEvent",
        "none", "facts row 'event synchronize / elapsed time' (error); GUESS: does not invalidate"),
    "query_captured": Rule(
        "cudaEventQuery of a captured event, cudaStreamQuery of a capturing stream", "returns", None,
        "the capture", "facts row 'event or stream query': call returns, end_capture fails (invalidated). "
        "GUESS: the value returned is True (nothing pending)"),
    "stream_sync_capturing": Rule(
        "cudaStreamSynchronize of a capturing stream", "raises", "cudaErrorStreamCaptureUnsupported",
        "the capture", "PG 'Prohibited and Unhandled Operations': invalid to synchronize a capturing stream"),
    "device_sync": Rule(
        "cudaDeviceSynchronize while any capture is live (any thread, any mode)", "raises",
        "cudaErrorStreamCaptureUnsupported", "every live capture",
        "facts row 'device synchronize'; PG: invalid to synchronize a device handle while any associated "
        "stream captures"),
    "d2h_in_capture": Rule(
        "device-to-host read while the accessor's current stream captures (also invalidated)", "raises",
        "cupy:D2HDisallowed", "none", "facts row 'device-to-host read' (CuPy refuses before calling CUDA)"),
    "cublas_in_capture": Rule(
        "cupy.matmul / @ while the stream (or the accessor's current stream) captures", "raises",
        "cupy:CublasInCapture", "none", "facts row 'cuBLAS via cupy.matmul' (NotImplementedError in CuPy)"),
    "merge": Rule(
        "a capturing stream waits on an event captured in a different capture sequence", "raises",
        "cudaErrorStreamCaptureMerge", "both captures",
        "PG 'Prohibited and Unhandled Operations': invalid to merge two separate capture graphs; RT cudaError: "
        "cudaErrorStreamCaptureMerge ('would have resulted in a merge of two independent capture sequences'). "
        "NOTE: the brief asked for cudaErrorStreamCaptureIsolation here"),
    "isolation": Rule(
        "a capturing stream waits on an uncaptured (eagerly recorded) event", "raises",
        "cudaErrorStreamCaptureIsolation", "the waiting stream's capture",
        "PG 'Prohibited and Unhandled Operations': invalid to wait on a non-captured event without "
        "cudaEventWaitExternal; RT cudaError: cudaErrorStreamCaptureIsolation ('dependency ... crosses the "
        "capture sequence boundary')"),
    "after_invalidation": Rule(
        "work, event record or wait on a stream of an invalidated capture", "drops", None, "-",
        "the brief: silently dropped (not executed, not recorded) until end_capture. PG 'Invalidation' says "
        "each such call returns an error; SimBackend(invalidated_ops='raise') raises "
        "cudaErrorStreamCaptureInvalidated instead. GUESS which one CuPy launches see"),
    # --- begin / end
    "begin_bad_mode": Rule("cudaStreamBeginCapture with an unknown mode", "raises", "cudaErrorInvalidValue",
                           "none", "RT cudaStreamBeginCapture (returns cudaErrorInvalidValue)"),
    "begin_legacy": Rule(
        "cudaStreamBeginCapture on the legacy stream", "raises", "cudaErrorStreamCaptureUnsupported", "none",
        "RT cudaStreamBeginCapture: capture may not be initiated on cudaStreamLegacy. GUESS: the error name"),
    "begin_twice": Rule(
        "cudaStreamBeginCapture on a stream already capturing", "raises", "cudaErrorIllegalState", "none",
        "RT cudaStreamBeginCapture: only if the stream is not already in capture mode. GUESS: the error name"),
    "event_after_capture": Rule(
        "cudaEventSynchronize / cudaEventElapsedTime on an event last recorded inside a capture that has ended "
        "(cudaEventQuery: never complete)", "raises", "cudaErrorInvalidValue", "none",
        "Measured on the H200 (docs/measurements/h200-2026-11-29/event-after-capture-probe.txt): before and "
        "after replays, until the event is recorded again eagerly"),
    "end_not_capturing": Rule("cudaStreamEndCapture on a stream that is not capturing", "raises",
                              "cudaErrorIllegalState", "none", "RT cudaStreamEndCapture"),
    "end_wrong_thread": Rule(
        "cudaStreamEndCapture from another thread than cudaStreamBeginCapture, mode global or thread_local",
        "raises", "cudaErrorStreamCaptureWrongThread", "none",
        "RT cudaStreamBeginCapture: if mode is not relaxed, end capture on the same thread. Measured on the "
        "H200 (conformance, 2026-11-29): the capture ends with the error; the stream is no longer capturing"),
    "end_unmatched": Rule(
        "cudaStreamEndCapture on a stream that joined a capture but did not begin it", "raises",
        "cudaErrorStreamCaptureUnmatched", "the capture",
        "PG 'Cross-stream Dependencies and Events': end capture in the origin stream; RT cudaError. GUESS: "
        "invalidates"),
    "end_invalidated": Rule(
        "cudaStreamEndCapture of an invalidated capture", "raises", "cudaErrorStreamCaptureInvalidated",
        "- (capture ends: every stream leaves capture mode)", "PG 'Invalidation'"),
    "end_unjoined": Rule(
        "cudaStreamEndCapture on the origin while a forked stream's last work does not precede the origin's "
        "last node (not joined back)", "raises", "cudaErrorStreamCaptureUnjoined",
        "- (capture ends: every stream leaves capture mode)",
        "PG 'Cross-stream Dependencies and Events': failure to rejoin fails the capture. GUESS: a forked "
        "stream with no work of its own counts as joined"),
}


def _error(name: str, call: str, detail: str):
    return (CupyRefusal if name.startswith("cupy:") else CudaError)(name, call, detail)


# ----------------------------------------------------------------------------- objects
class SimStream:
    """A simulated stream. ``kind``: ``legacy``, ``blocking``, ``non_blocking`` or ``per_thread``."""

    __slots__ = ("id", "name", "kind", "ready_us", "capture", "tail", "__weakref__")

    def __init__(self, sid: int, name: str, kind: str) -> None:
        self.id, self.name, self.kind = sid, name, kind
        self.ready_us = 0.0  # modeled time its last eager work ends
        self.capture: CaptureSeq | None = None
        self.tail: tuple = ()  # node indices the next captured item depends on

    @property
    def blocking(self) -> bool:
        """Synchronises implicitly with the legacy stream (everything but non-blocking streams)."""
        return self.kind != "non_blocking"

    def __repr__(self) -> str:
        return f"<sim stream {self.name}>"


class SimEvent:
    """A simulated event: its last eager record (time, stream) and, if any, the capture it was last recorded in."""

    __slots__ = ("id", "name", "time_us", "stream", "capture", "tail")

    def __init__(self, eid: int, name: str) -> None:
        self.id, self.name = eid, name
        self.time_us: float | None = None  # None: never recorded eagerly
        self.stream: SimStream | None = None
        self.capture: CaptureSeq | None = None
        self.tail: tuple = ()

    def __repr__(self) -> str:
        return f"<sim event {self.name}>"


@dataclass
class Node:
    """One graph node: ``kind`` (kernel, memset, memcpy, mem_alloc, mem_free, graph), the work, its deps."""

    idx: int
    kind: str
    name: str
    fn: Callable[[], None] | None
    deps: tuple
    gpu_us: float
    stream: str
    info: Any = None  # the launch as issued (grid, block, args, shared, nbytes) or the child graph


@dataclass
class CaptureSeq:
    """One capture sequence (``cudaStreamBeginCapture`` … ``cudaStreamEndCapture``)."""

    id: int
    mode: str
    thread: int
    origin: SimStream
    status: str = "active"  # active, invalidated, ended
    streams: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    why: str = ""  # the first invalidating call

    @property
    def live(self) -> bool:
        return self.status != "ended"


@dataclass
class Graph:
    """A captured graph (``cudaGraph_t``): its nodes in capture order (a topological order)."""

    id: int
    nodes: list
    capture_id: int

    def __repr__(self) -> str:
        return f"<sim graph {self.id}: {len(self.nodes)} nodes>"


@dataclass
class GraphExec:
    """An instantiated graph (``cudaGraphExec_t``)."""

    id: int
    graph: Graph
    launches: int = 0

    def __repr__(self) -> str:
        return f"<sim graph exec {self.id} of graph {self.graph.id}>"


# ----------------------------------------------------------------------------- runtime
class Runtime:
    """Streams, events, captures, graphs and the modeled clock (see module docstring).

    Args:
        cal: the cost model's constants.
        compute: call the work callables (False: timing only, nothing is computed).
        threads_enabled: tell threads apart (False: every caller counts as one thread, so capture
            modes and per-thread streams cannot distinguish threads).
        invalidated_ops: ``"drop"`` or ``"raise"`` (rule ``after_invalidation``).
    """

    def __init__(self, cal: Calibration, *, compute: bool = True, threads_enabled: bool = True,
                 invalidated_ops: str = "drop") -> None:
        if invalidated_ops not in ("drop", "raise"):
            raise ValueError(f"invalidated_ops={invalidated_ops!r}; choose 'drop' or 'raise'")
        self.cal = cal
        self.dev = Device(cal)
        self.compute = compute
        self.threads_enabled = threads_enabled
        self.invalidated_ops = invalidated_ops
        self._tid = threading.get_ident if threads_enabled else (lambda: 0)
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self.legacy = SimStream(0, "legacy", "legacy")
        self._blocking: list[SimStream] = []  # every blocking / per-thread stream (legacy sync)
        self._all: weakref.WeakSet = weakref.WeakSet()  # every stream (device synchronize, clock reset)
        self._all.add(self.legacy)
        self._per_thread: dict[int, SimStream] = {}
        self._thread_mode: dict[int, str] = {}
        self.live: list[CaptureSeq] = []  # captures begun and not ended
        #: Work that ran eagerly on the legacy stream while a capture was live (escaped the graph).
        self.escapes: list[tuple[str, str]] = []
        #: Work dropped because its capture was invalidated.
        self.dropped: list[tuple[str, str]] = []

    # ------------------------------------------------------------------ helpers
    def _fail(self, rule: str, call: str, seqs=(), detail: str = ""):
        """Apply rule ``rule``: invalidate ``seqs``, raise its error (when it has one)."""
        r = RULES[rule]
        for q in seqs:
            self._invalidate(q, f"{call}: {rule}")
        if r.error:
            raise _error(r.error, call, detail or r.when)

    def _invalidate(self, seq: "CaptureSeq", why: str) -> None:
        if seq.status == "active":
            seq.status, seq.why = "invalidated", why

    def _stream(self, stream: Any, call: str) -> SimStream:
        if stream is LEGACY_STREAM or stream is None:
            return self.legacy
        if isinstance(stream, SimStream):
            return stream
        raise CudaError("cudaErrorInvalidResourceHandle", call, f"{stream!r} is not a sim stream")

    def _legacy_use(self, call: str) -> None:
        """Rule ``legacy_implicit``: the legacy stream may not be used while a blocking stream captures."""
        bad = [q for q in self.live if any(m.blocking for m in q.streams)]
        if bad:
            self._fail("legacy_implicit", call, bad,
                       f"stream {bad[0].origin.name} (blocking) is capturing; the legacy stream would depend on it")

    def _unsafe(self, call: str) -> None:
        """Rule ``unsafe_call`` (cudaThreadExchangeStreamCaptureMode's definitions)."""
        if not self.live:
            return
        tid = self._tid()
        tm = self._thread_mode.get(tid, "global")
        if tm == "relaxed":
            return
        own = [q for q in self.live if q.thread == tid and q.mode != "relaxed"]
        other = [q for q in self.live if q.thread != tid and q.mode == "global"] if tm == "global" else []
        if own or other:
            q = (own or other)[0]
            self._fail("unsafe_call", call, own + other,
                       f"{'this thread' if own else 'another thread'} has a {q.mode} capture on {q.origin.name}")

    def _on_invalidated(self, seq: CaptureSeq, call: str, name: str = "") -> None:
        """Rule ``after_invalidation``."""
        if self.invalidated_ops == "raise":
            raise CudaError("cudaErrorStreamCaptureInvalidated", call, f"capture {seq.id} was invalidated by {seq.why}")
        self.dropped.append((call, name))

    def _earliest(self, s: SimStream, t: float) -> float:
        """Earliest device start on ``s`` after ``t``: its own work and the legacy implicit sync."""
        t = max(t, s.ready_us)
        if s is self.legacy:
            for b in self._blocking:
                if b.ready_us > t:
                    t = b.ready_us
        elif s.kind != "non_blocking":
            t = max(t, self.legacy.ready_us)
        return t

    @staticmethod
    def _end(seq: CaptureSeq) -> None:
        seq.status = "ended"
        for m in seq.streams:
            m.capture, m.tail = None, ()

    def _finish(self, seq: CaptureSeq) -> None:
        self._end(seq)
        if seq in self.live:
            self.live.remove(seq)

    # ------------------------------------------------------------------ streams and events
    def new_stream(self, non_blocking: bool = True, name: str | None = None) -> SimStream:
        """``cudaStreamCreateWithFlags`` (``cudaStreamNonBlocking`` when ``non_blocking``)."""
        with self.lock:
            sid = next(self._ids)
            s = SimStream(sid, name or f"s{sid}{'' if non_blocking else '(blocking)'}",
                          "non_blocking" if non_blocking else "blocking")
            if s.blocking:
                self._blocking.append(s)
            self._all.add(s)
            self.dev.host(self.cal.host_api_us)
            return s

    def per_thread_stream(self) -> SimStream:
        """The calling thread's per-thread default stream (``cudaStreamPerThread``).

        It does not synchronise with other created streams, but, not being a non-blocking stream,
        it does synchronise with the legacy stream (PG, "Per-thread default stream").
        """
        with self.lock:
            tid = self._tid()
            s = self._per_thread.get(tid)
            if s is None:
                s = SimStream(next(self._ids), f"per-thread[{threading.current_thread().name}]", "per_thread")
                self._per_thread[tid] = s
                self._blocking.append(s)
                self._all.add(s)
            return s

    def new_event(self, name: str | None = None) -> SimEvent:
        with self.lock:
            eid = next(self._ids)
            return SimEvent(eid, name or f"e{eid}")

    def exchange_capture_mode(self, mode: str) -> str:
        """``cudaThreadExchangeStreamCaptureMode``: set the calling thread's mode, return the previous one."""
        if mode not in MODES:
            raise CudaError("cudaErrorInvalidValue", "cudaThreadExchangeStreamCaptureMode", f"mode {mode!r}")
        with self.lock:
            tid = self._tid()
            prev = self._thread_mode.get(tid, "global")
            self._thread_mode[tid] = mode
            return prev

    # ------------------------------------------------------------------ work
    def enqueue(self, stream: Any, kind: str, name: str, fn: Callable[[], None] | None, gpu_us: float,
                call: str, host_us: float | None = None, info: Any = None) -> Node | None:
        """Issue one piece of work (kernel, memset, memcpy) on ``stream``.

        Returns the graph node when captured, else None. Applies ``legacy_implicit``,
        ``legacy_escape``, ``capture_node`` and ``after_invalidation``.
        """
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)  # raises while a blocking stream captures
                self.escapes.append((call, name))  # rule legacy_escape: runs now, not in any graph
            cost = self.cal.host_launch_us if host_us is None else host_us
            seq = s.capture
            if seq is not None:
                self.dev.host(cost)
                if seq.status != "active":
                    self._on_invalidated(seq, call, name)
                    return None
                node = Node(len(seq.nodes), kind, name, fn, s.tail, gpu_us, s.name, info)  # rule capture_node
                seq.nodes.append(node)
                s.tail = (node.idx,)
                return node
            submit = self.dev.host(cost)
            if fn is not None and self.compute:
                fn()
            _, s.ready_us = self.dev.run(s.name, name, self._earliest(s, submit), gpu_us, kind,
                                         occupies=kind != "memcpy")
            return None

    def host_op(self, stream: Any, kind: str, name: str, fn: Callable[[], None] | None, call: str,
                capture_fn: Callable[[], None] | None = None) -> Node | None:
        """A zero-duration stream-ordered operation (``cudaMallocAsync``/``cudaFreeAsync``).

        Eagerly ``fn`` runs now; captured, a node runs ``capture_fn`` at each replay.
        """
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
            seq = s.capture
            self.dev.host(self.cal.host_api_us)
            if seq is not None:
                if seq.status != "active":
                    self._on_invalidated(seq, call, name)
                    return None
                node = Node(len(seq.nodes), kind, name, capture_fn, s.tail, 0.0, s.name)
                seq.nodes.append(node)
                s.tail = (node.idx,)
                return node
            if fn is not None:
                fn()
            return None

    def capturing(self, stream: Any) -> CaptureSeq | None:
        """The live capture ``stream`` belongs to (active or invalidated), else None."""
        s = self._stream(stream, "cudaStreamIsCapturing")
        return s.capture

    def unsafe_call(self, call: str) -> None:
        """Check a potentially unsafe call (rule ``unsafe_call``); raises when prohibited."""
        with self.lock:
            self._unsafe(call)
            self.dev.host(self.cal.host_api_us)

    # ------------------------------------------------------------------ events
    def event_record(self, stream: Any, e: SimEvent) -> None:
        """``cudaEventRecord``: eager, the time the stream reaches it; captured, a set of nodes."""
        with self.lock:
            s = self._stream(stream, "cudaEventRecord")
            if s is self.legacy and self.live:
                self._legacy_use("cudaEventRecord")
            submit = self.dev.host(self.cal.host_api_us)
            seq = s.capture
            if seq is not None:
                if seq.status != "active":
                    self._on_invalidated(seq, "cudaEventRecord", e.name)
                    return
                e.capture, e.tail = seq, s.tail  # rule capture_event_record
                return
            e.capture, e.tail = None, ()
            e.time_us = self._earliest(s, submit)
            e.stream = s
            s.ready_us = e.time_us

    def _captured(self, e: SimEvent) -> CaptureSeq | None:
        q = e.capture
        return q if q is not None and q.live else None

    @staticmethod
    def _after_capture(e: SimEvent) -> bool:
        """Rule event_after_capture: last recorded inside a capture that has ended."""
        return e.capture is not None and not e.capture.live

    def stream_wait_event(self, stream: Any, e: SimEvent) -> None:
        """``cudaStreamWaitEvent``: a timing dependency eagerly; fork / join / refusal in capture."""
        call = "cudaStreamWaitEvent"
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
            self.dev.host(self.cal.host_api_us)
            ec, sc = self._captured(e), s.capture
            if sc is not None and sc.status != "active":
                self._on_invalidated(sc, call, e.name)
                return
            if ec is not None:
                if s is self.legacy:  # the legacy stream cannot capture (GUESS: refused as an implicit merge)
                    self._fail("legacy_implicit", call, [ec], "the legacy stream cannot join a capture")
                if sc is None:  # rule fork
                    s.capture, s.tail = ec, e.tail
                    ec.streams.append(s)
                elif sc is ec:  # rule join
                    s.tail = tuple(sorted(set(s.tail) | set(e.tail)))
                else:
                    self._fail("merge", call, [sc, ec],
                               f"{s.name} captures in sequence {sc.id}, {e.name} was recorded in sequence {ec.id}")
                return
            if sc is not None:
                if e.time_us is None:
                    return  # never recorded: no dependency to express (GUESS: a no-op, as outside capture)
                self._fail("isolation", call, [sc], f"{e.name} was recorded outside capture, on "
                           f"{e.stream.name if e.stream else '?'}")
            if e.time_us is not None and e.time_us > s.ready_us:
                s.ready_us = e.time_us

    def event_synchronize(self, e: SimEvent) -> None:
        """``cudaEventSynchronize``: the host waits until the device reaches the event."""
        call = "cudaEventSynchronize"
        with self.lock:
            q = self._captured(e)
            if q is not None:
                self._fail("event_sync_captured", call, [q], f"{e.name} was last recorded in capture {q.id}")
            if self._after_capture(e):
                self._fail("event_after_capture", call, [], f"{e.name} was last recorded in an ended capture")
            self._unsafe(call)
            self.dev.host(self.cal.host_api_us)
            if e.time_us is not None:
                self.dev.wait_host(e.time_us)

    def event_query(self, e: SimEvent) -> bool:
        """``cudaEventQuery``: True when the device has reached the event at the current host time."""
        call = "cudaEventQuery"
        with self.lock:
            q = self._captured(e)
            if q is not None:  # rule query_captured: returns, invalidates
                self._invalidate(q, f"{call}: query_captured")
                return True
            if self._after_capture(e):  # rule event_after_capture: never complete
                return False
            self._unsafe(call)
            now = self.dev.host(self.cal.host_api_us)
            return e.time_us is None or e.time_us <= now

    def event_elapsed_ms(self, a: SimEvent, b: SimEvent) -> float:
        """``cudaEventElapsedTime``: modeled milliseconds from ``a`` to ``b``.

        Raises cudaErrorCapturedEvent (either last recorded in a live capture),
        cudaErrorInvalidResourceHandle (either never recorded) or cudaErrorNotReady (the host
        has not yet reached either event: synchronize first, as on a GPU).
        """
        call = "cudaEventElapsedTime"
        with self.lock:
            for e in (a, b):
                q = self._captured(e)
                if q is not None:
                    self._fail("event_elapsed_captured", call, [], f"{e.name} was last recorded in capture {q.id}")
            for e in (a, b):
                if self._after_capture(e):
                    self._fail("event_after_capture", call, [], f"{e.name} was last recorded in an ended capture")
            for e in (a, b):
                if e.time_us is None:
                    raise CudaError("cudaErrorInvalidResourceHandle", call, f"{e.name} was never recorded")
            now = self.dev.host(self.cal.host_api_us)
            late = max(a.time_us, b.time_us)
            if late > now:
                raise CudaError("cudaErrorNotReady", call,
                                f"the device reaches the events at {late:.1f} µs, the host is at {now:.1f} µs")
            return (b.time_us - a.time_us) / 1e3

    # ------------------------------------------------------------------ synchronization
    def stream_synchronize(self, stream: Any) -> None:
        call = "cudaStreamSynchronize"
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
            if s.capture is not None:
                self._fail("stream_sync_capturing", call, [s.capture], f"{s.name} is capturing")
            self.dev.host(self.cal.host_api_us)
            self.dev.wait_host(self._earliest(s, 0.0))

    def stream_query(self, stream: Any) -> bool:
        call = "cudaStreamQuery"
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
            if s.capture is not None:  # rule query_captured
                self._invalidate(s.capture, f"{call}: query_captured")
                return True
            now = self.dev.host(self.cal.host_api_us)
            return self._earliest(s, 0.0) <= now

    def synchronize(self) -> None:
        """``cudaDeviceSynchronize``."""
        call = "cudaDeviceSynchronize"
        with self.lock:
            if self.live:
                self._fail("device_sync", call, list(self.live),
                           f"{len(self.live)} capture(s) live, on {', '.join(q.origin.name for q in self.live)}")
            self.dev.host(self.cal.host_api_us)
            t = max([self.dev.free_us] + [s.ready_us for s in self._all])
            self.dev.wait_host(t)

    # ------------------------------------------------------------------ capture
    def begin_capture(self, stream: Any, mode: str = "thread_local") -> None:
        call = "cudaStreamBeginCapture"
        with self.lock:
            if mode not in MODES:
                self._fail("begin_bad_mode", call, (), f"mode {mode!r}; choose one of {', '.join(MODES)}")
            s = self._stream(stream, call)
            if s is self.legacy:
                self._fail("begin_legacy", call)
            if s.capture is not None:
                self._fail("begin_twice", call, (), f"{s.name} is already capturing (sequence {s.capture.id})")
            self.dev.host(self.cal.host_api_us)
            seq = CaptureSeq(next(self._ids), mode, self._tid(), s)
            seq.streams.append(s)
            s.capture, s.tail = seq, ()
            self.live.append(seq)

    def end_capture(self, stream: Any) -> Graph:
        call = "cudaStreamEndCapture"
        with self.lock:
            s = self._stream(stream, call)
            seq = s.capture
            if seq is None:
                self._fail("end_not_capturing", call, (), f"{s.name} is not capturing")
            if seq.mode != "relaxed" and self._tid() != seq.thread:
                self._finish(seq)  # measured on the H200: the capture is gone afterwards (status none)
                self._fail("end_wrong_thread", call, (), f"{seq.mode} capture begun on another thread")
            if s is not seq.origin:
                self._fail("end_unmatched", call, [seq], f"capture began on {seq.origin.name}, not {s.name}")
            self.dev.host(self.cal.host_api_us)
            if seq.status == "invalidated":
                self._finish(seq)
                self._fail("end_invalidated", call, (), f"invalidated by {seq.why}")
            unjoined = self._unjoined(seq)
            if unjoined:
                self._finish(seq)
                self._fail("end_unjoined", call, (), f"work on {', '.join(m.name for m in unjoined)} not joined "
                                                     f"back to {s.name}")
            self._finish(seq)
            return Graph(next(self._ids), list(seq.nodes), seq.id)

    @staticmethod
    def _unjoined(seq: CaptureSeq) -> list:
        """Forked streams whose last nodes are not ancestors of (or equal to) the origin's last nodes."""
        seen = set(seq.origin.tail)
        stack = list(seq.origin.tail)
        while stack:
            for d in seq.nodes[stack.pop()].deps:
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return [m for m in seq.streams if m is not seq.origin and not set(m.tail) <= seen]

    def capture_status(self, stream: Any) -> str:
        """``"none"``, ``"active"`` or ``"invalidated"`` (``cudaStreamGetCaptureInfo``)."""
        with self.lock:
            q = self._stream(stream, "cudaStreamGetCaptureInfo").capture
            return "none" if q is None else q.status

    def capture_info(self, stream: Any) -> dict:
        """Status plus the capture's id, mode, origin stream, member streams and node count."""
        with self.lock:
            q = self._stream(stream, "cudaStreamGetCaptureInfo").capture
            if q is None:
                return {"status": "none"}
            return {"status": q.status, "id": q.id, "mode": q.mode, "origin": q.origin.name,
                    "streams": [m.name for m in q.streams], "nodes": len(q.nodes), "invalidated_by": q.why}

    # ------------------------------------------------------------------ graphs
    def graph_instantiate(self, g: Graph) -> GraphExec:
        if not isinstance(g, Graph):
            raise CudaError("cudaErrorInvalidValue", "cudaGraphInstantiate", f"{g!r} is not a sim graph")
        with self.lock:
            self.dev.host(self.cal.host_api_us)
            return GraphExec(next(self._ids), g)

    def graph_exec_update(self, ex: GraphExec, g: Graph) -> None:
        """``cudaGraphExecUpdate``: take ``g``'s node parameters when its topology matches.

        CUDA Programming Guide, "Updating Instantiated Graphs" → "Whole graph update": the new
        graph must have the same nodes (kind, kernel) in the same order and dependencies;
        otherwise ``cudaErrorGraphExecUpdateFailure`` and the executable is unchanged.
        Host cost: one API call plus ``host_api_us / 8`` per node (a modeled figure).
        """
        call = "cudaGraphExecUpdate"
        if not isinstance(ex, GraphExec) or not isinstance(g, Graph):
            raise CudaError("cudaErrorInvalidValue", call, "not a sim graph / executable graph")
        with self.lock:
            old = ex.graph.nodes
            same = len(old) == len(g.nodes) and all(
                a.kind == b.kind and a.name == b.name and a.deps == b.deps for a, b in zip(old, g.nodes))
            self.dev.host(self.cal.host_api_us * (1 + len(g.nodes) / 8))
            if not same:
                raise CudaError("cudaErrorGraphExecUpdateFailure", call, "topology differs from the instantiated graph")
            ex.graph = g

    @staticmethod
    def _flat(nodes):
        for n in nodes:
            if n.kind == "graph":
                yield from Runtime._flat(n.info.graph.nodes)
            else:
                yield n

    def graph_launch(self, ge: GraphExec, stream: Any) -> None:
        """``cudaGraphLaunch``: replay every node in order (their callables run again); time paced per node."""
        call = "cudaGraphLaunch"
        if not isinstance(ge, GraphExec):
            raise CudaError("cudaErrorInvalidValue", call, f"{ge!r} is not an instantiated sim graph")
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
                self.escapes.append((call, f"graph {ge.graph.id}"))
            seq = s.capture
            if seq is not None:  # a child-graph node (cudaGraphNodeTypeGraph)
                self.dev.host(self.cal.host_graph_launch_us)
                if seq.status != "active":
                    self._on_invalidated(seq, call, f"graph {ge.graph.id}")
                    return
                node = Node(len(seq.nodes), "graph", f"graph {ge.graph.id}", None, s.tail, 0.0, s.name, ge)
                seq.nodes.append(node)
                s.tail = (node.idx,)
                return
            submit = self.dev.host(self.cal.host_graph_launch_us)
            ge.launches += 1
            pace = submit
            prev_end = self._earliest(s, submit)
            step = self.cal.graph_node_us
            gid = ge.graph.id
            compute = self.compute
            for n in self._flat(ge.graph.nodes):
                if compute and n.fn is not None:
                    n.fn()
                if n.kind in ("kernel", "memset", "memcpy"):
                    _, prev_end = self.dev.run(s.name, n.name, max(pace, prev_end), n.gpu_us, n.kind, gid,
                                               occupies=n.kind != "memcpy")
                pace += step
            s.ready_us = prev_end

    @staticmethod
    def graph_nodes(g: Graph) -> list[dict]:
        return [{"kind": n.kind, "name": n.name} for n in g.nodes]

    # ------------------------------------------------------------------ clock
    def reset_clock(self) -> None:
        """Every clock back to 0 (host, device, streams) and an empty timeline."""
        with self.lock:
            self.dev.reset()
            for s in self._all:
                s.ready_us = 0.0

    def current_capturing(self) -> CaptureSeq | None:
        """The live capture of the accessor's current stream (``ds4lab.stream.current_stream()``)."""
        return self._stream(current_stream(), "current_stream").capture
