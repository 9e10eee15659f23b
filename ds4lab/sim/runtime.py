"""A model of the CUDA runtime's streams, events, stream capture and graphs, on the CPU (:class:`Runtime`).

Work is a callable plus a modeled duration: eager work runs when enqueued, captured work becomes a :class:`Node` run
again at each graph launch. Every capture rule is an entry of :data:`ds4lab.sim.rules.RULES`, raised through
:meth:`Runtime._fail`. Next: :mod:`ds4lab.sim.graphs`, :mod:`ds4lab.sim.objects`, :mod:`ds4lab.sim.backend`."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable

from ..errors import CudaError
from ..capture.stream import LEGACY_STREAM, current_stream
from .costmodel import Calibration, Device
from .graphs import (FLAG_AUTO_FREE_ON_LAUNCH, FLAG_DEVICE_LAUNCH, FLAG_UPLOAD, FLAG_USE_NODE_PRIORITY, Graph,
                     GraphExec, Graphs)
from .objects import CaptureSeq, Node, SimEvent, SimStream
from .rules import MODES, RULES, Rule, _error

#: What ``from ds4lab.sim.runtime import ...`` gives, as before the rules, handles and graphs moved
#: to their own modules.
__all__ = ["Runtime", "MODES", "RULES", "Rule", "SimStream", "SimEvent", "Node", "CaptureSeq", "Graph", "GraphExec",
           "FLAG_AUTO_FREE_ON_LAUNCH", "FLAG_UPLOAD", "FLAG_DEVICE_LAUNCH", "FLAG_USE_NODE_PRIORITY"]


# ----------------------------------------------------------------------------- runtime
class Runtime:
    """Streams, events, captures, graphs and the modeled clock (see module docstring).

    ``cal``: the cost model's constants; ``compute``: call the work callables (False: timing only);
    ``threads_enabled``: tell threads apart; ``invalidated_ops``: ``"drop"`` or ``"raise"`` (rule
    ``after_invalidation``)."""

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
        #: The graph calls (instantiate, update, launch, ...), a collaborator holding the runtime.
        self.graphs = Graphs(self)
        #: When True, every rule applied is appended to :attr:`fired` as ``(rule, call)`` (the audit's
        #: probes read which rule decided a call; off by default so long runs keep no log).
        self.record_rules = False
        self.fired: list[tuple[str, str]] = []

    # ------------------------------------------------------------------ helpers
    def _applied(self, rule: str, call: str) -> None:
        """Note that rule ``rule`` decided ``call`` (kept in :attr:`fired` when :attr:`record_rules`)."""
        if self.record_rules:
            self.fired.append((rule, call))

    def _fail(self, rule: str, call: str, seqs=(), detail: str = ""):
        """Apply rule ``rule``: invalidate ``seqs``, raise its error (when it has one)."""
        r = RULES[rule]
        self._applied(rule, call)
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

    def _used_stream(self, stream: Any, call: str) -> SimStream:
        """:meth:`_stream`, with rule ``legacy_implicit`` applied to a use of the legacy stream."""
        s = self._stream(stream, call)
        if s is self.legacy and self.live:
            self._legacy_use(call)
        return s

    def _legacy_use(self, call: str) -> None:
        """Rule ``legacy_implicit``: the legacy stream may not be used while a blocking stream captures."""
        bad = [q for q in self.live if any(m.blocking for m in q.streams)]
        if bad:
            self._fail("legacy_implicit", call, bad,
                       f"stream {bad[0].origin.name} (blocking) is capturing; the legacy stream would depend on it")

    def _unsafe(self, call: str, rule: str = "unsafe_call") -> None:
        """Rule ``unsafe_call`` (cudaThreadExchangeStreamCaptureMode's definitions), or another rule with the same
        trigger (``unsafe_host_call``, ``cublas_create``)."""
        live = self._process_live()
        if not live:
            return
        tid = self._tid()
        tm = self._thread_mode.get(tid, "global")
        own = [q for q in live if q.thread == tid and q.mode != "relaxed"] if tm != "relaxed" else []
        other = [q for q in live if q.thread != tid and q.mode == "global"] if tm == "global" else []
        if own or other:
            q = (own or other)[0]
            self._fail(rule, call, own + other,
                       f"{'this thread' if own else 'another thread'} has a {q.mode} capture on {q.origin.name}")
        self._applied(rule, call)  # permitted: relaxed mode, or no capture prohibits it

    def _process_live(self) -> list:
        """The live captures the unsafe-call rule weighs: this runtime's (a device of a node: every device's)."""
        return self.live

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
        """The calling thread's per-thread default stream: synchronises with the legacy stream, not with other created
        streams (PG, "Per-thread default stream")."""
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
        """Issue one piece of work (kernel, memset, memcpy) on ``stream``; the graph node when captured, else None
        (rules legacy_implicit, legacy_escape, capture_node, after_invalidation)."""
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)  # raises while a blocking stream captures
                self.escapes.append((call, name))  # rule legacy_escape: runs now, not in any graph
                self._applied("legacy_escape", call)
            cost = self.cal.host_launch_us if host_us is None else host_us
            seq = s.capture
            if seq is not None:
                self.dev.host(cost)
                return self._append_node(seq, s, call, kind, name, fn, gpu_us, info)
            if self.live and s is not self.legacy:
                self._applied("uncaptured_stream", call)
            submit = self.dev.host(cost)
            if fn is not None and (self.compute or getattr(fn, "always", False)):  # always: device scalars, conditions
                fn()
            earliest = self._earliest(s, submit)
            if kind == "kernel" and self.cal.eager_gap_us:  # the device's own gap before an eager kernel
                earliest = max(earliest, self.dev.free_us + self.cal.eager_gap_us)
            _, s.ready_us = self.dev.run(s.name, name, earliest, gpu_us, kind, occupies=kind != "memcpy")
            return None

    def _append_node(self, seq: "CaptureSeq", s: SimStream, call: str, kind: str, name: str, fn, gpu_us: float,
                     info: Any = None, rule: str | None = "capture_node") -> Node | None:
        """A node after ``s``'s tail in capture ``seq`` (rule ``rule``); None, dropped, when ``seq`` is invalidated
        (rule after_invalidation)."""
        if seq.status != "active":
            self._on_invalidated(seq, call, name)
            return None
        node = Node(len(seq.nodes), kind, name, fn, s.tail, gpu_us, s.name, info)
        if rule:
            self._applied(rule, call)
        seq.nodes.append(node)
        s.tail = (node.idx,)
        return node

    def host_op(self, stream: Any, kind: str, name: str, fn: Callable[[], None] | None, call: str,
                capture_fn: Callable[[], None] | None = None) -> Node | None:
        """A zero-duration stream-ordered operation (``cudaMallocAsync``/``cudaFreeAsync``): ``fn`` runs now, or,
        captured, a node runs ``capture_fn`` at each replay."""
        with self.lock:
            s = self._used_stream(stream, call)
            seq = s.capture
            self.dev.host(self.cal.host_api_us)
            if seq is not None:
                return self._append_node(seq, s, call, kind, name, capture_fn, 0.0)
            if self.live:
                self._applied("legacy_escape" if s is self.legacy else "uncaptured_stream", call)
            if fn is not None:
                fn()
            return None

    def capturing(self, stream: Any) -> CaptureSeq | None:
        """The live capture ``stream`` belongs to (active or invalidated), else None."""
        s = self._stream(stream, "cudaStreamIsCapturing")
        return s.capture

    def unsafe_call(self, call: str, rule: str = "unsafe_call") -> None:
        """Check a potentially unsafe call (rule ``unsafe_call``, or ``rule`` with the same trigger:
        ``unsafe_host_call``, ``cublas_create``); raises when prohibited."""
        with self.lock:
            self._unsafe(call, rule)
            self.dev.host(self.cal.host_api_us)

    def host_query(self, call: str) -> None:
        """A host-only call (rule ``host_query``: no stream work, never refused): host cost only."""
        with self.lock:
            if self.live:
                self._applied("host_query", call)
            self.dev.host(self.cal.host_api_us)

    # ------------------------------------------------------------------ events
    def event_record(self, stream: Any, e: SimEvent) -> None:
        """``cudaEventRecord``: eager, the time the stream reaches it; captured, a set of nodes."""
        with self.lock:
            s = self._used_stream(stream, "cudaEventRecord")
            submit = self.dev.host(self.cal.host_api_us)
            seq = s.capture
            if seq is not None:
                if seq.status != "active":
                    self._on_invalidated(seq, "cudaEventRecord", e.name)
                    return
                e.capture, e.tail = seq, s.tail  # rule capture_event_record
                self._applied("capture_event_record", "cudaEventRecord")
                return
            if self.live:
                self._applied("legacy_escape" if s is self.legacy else "uncaptured_stream", "cudaEventRecord")
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
            s = self._used_stream(stream, call)
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
                    self._applied("fork", call)
                elif sc is ec:  # rule join
                    s.tail = tuple(sorted(set(s.tail) | set(e.tail)))
                    self._applied("join", call)
                else:
                    self._fail("merge", call, [sc, ec],
                               f"{s.name} captures in sequence {sc.id}, {e.name} was recorded in sequence {ec.id}")
                return
            if sc is not None:
                if e.time_us is None:
                    return  # never recorded: no dependency to express (GUESS: a no-op, as outside capture)
                self._fail("isolation", call, [sc], f"{e.name} was recorded outside capture, on "
                           f"{e.stream.name if e.stream else '?'}")
            if self.live:
                self._applied("uncaptured_sync", call)
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
        """``cudaEventQuery``: True when the device has reached the event, False for ``cudaErrorNotReady``.

        Raises cudaErrorCapturedEvent (rule event_query_captured), cudaErrorInvalidValue (rules
        event_query_invalidated, event_after_capture) or cudaErrorStreamCaptureUnsupported (rule unsafe_call)."""
        call = "cudaEventQuery"
        with self.lock:
            q = self._captured(e)
            if q is not None:
                if q.status == "active":
                    self._fail("event_query_captured", call, [q], f"{e.name} was last recorded in capture {q.id}")
                self._fail("event_query_invalidated", call, (), f"{e.name} was recorded in invalidated capture {q.id}")
            if self._after_capture(e):
                self._fail("event_after_capture", call, [], f"{e.name} was last recorded in an ended capture")
            self._unsafe(call)
            now = self.dev.host(self.cal.host_api_us)
            return e.time_us is None or e.time_us <= now

    def event_elapsed_ms(self, a: SimEvent, b: SimEvent) -> float:
        """``cudaEventElapsedTime``: modeled milliseconds from ``a`` to ``b``.

        Raises cudaErrorCapturedEvent (either last recorded in a live capture), cudaErrorInvalidResourceHandle (either
        never recorded) or cudaErrorNotReady (the host has not yet reached either event: synchronize first, as on a
        GPU)."""
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
            if self.live:
                self._applied("host_query", call)
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
            s = self._used_stream(stream, call)
            if s.capture is not None:
                self._fail("stream_sync_capturing", call, [s.capture], f"{s.name} is capturing")
            if self.live:
                self._applied("uncaptured_sync", call)
            self.dev.host(self.cal.host_api_us)
            self.dev.wait_host(self._earliest(s, 0.0))

    def stream_query(self, stream: Any) -> bool:
        """``cudaStreamQuery``: True when all the stream's work is done, False for ``cudaErrorNotReady``.

        Raises cudaErrorStreamCaptureUnsupported (rule stream_query_capturing), cudaErrorStreamCaptureInvalidated
        (rule stream_query_invalidated), cudaErrorStreamCaptureImplicit (legacy stream, blocking capture)."""
        call = "cudaStreamQuery"
        with self.lock:
            s = self._used_stream(stream, call)
            q = s.capture
            if q is not None:
                if q.status == "active":
                    self._fail("stream_query_capturing", call, [q], f"{s.name} is capturing (sequence {q.id})")
                self._fail("stream_query_invalidated", call, (), f"capture {q.id} was invalidated by {q.why}")
            if self.live:
                self._applied("uncaptured_sync", call)
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
            if seq.graph is not None:  # a graph asked for during the capture, or captured into (capture_to_graph)
                return seq.graph
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
        """``"none"``, ``"active"`` or ``"invalidated"`` (``cudaStreamGetCaptureInfo``; rule capture_status_query)."""
        with self.lock:
            q = self._stream(stream, "cudaStreamGetCaptureInfo").capture
            if self.live:
                self._applied("capture_status_query", "cudaStreamIsCapturing")
            return "none" if q is None else q.status

    def capture_info(self, stream: Any) -> dict:
        """Status plus the capture's id, mode, origin stream, member streams and node count."""
        with self.lock:
            q = self._stream(stream, "cudaStreamGetCaptureInfo").capture
            if q is None:
                return {"status": "none"}
            return {"status": q.status, "id": q.id, "mode": q.mode, "origin": q.origin.name,
                    "streams": [m.name for m in q.streams], "nodes": len(q.nodes), "invalidated_by": q.why}

    # ------------------------------------------------------------------ clock
    def reset_clock(self) -> None:
        """Every clock back to 0 (host, device, streams) and an empty timeline."""
        with self.lock:
            self.dev.reset()
            for s in self._all:
                s.ready_us = 0.0

    def current_capturing(self) -> CaptureSeq | None:
        """The live capture of the accessor's current stream (``ds4lab.capture.stream.current_stream()``)."""
        return self._stream(current_stream(), "current_stream").capture
