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

from ..errors import CudaError, CupyRefusal, GraphExecUpdateError
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
    "stream_query_capturing": Rule(
        "cudaStreamQuery of a stream in an active capture (the origin or a stream forked into it), any mode",
        "raises", "cudaErrorStreamCaptureUnsupported", "the capture",
        "facts row 'event or stream query': cudaStreamQuery on the capturing stream returns 900 "
        "(cudaErrorStreamCaptureUnsupported) and invalidates the capture, in every mode (measured); PG "
        "'Prohibited and Unhandled Operations': it is invalid to query the execution status of a stream being "
        "captured. GUESS: a forked stream answers as the origin does (facts: its synchronize does)"),
    "event_query_captured": Rule(
        "cudaEventQuery of an event last recorded in an active capture", "raises", "cudaErrorCapturedEvent",
        "the event's capture",
        "RT cudaError: cudaErrorCapturedEvent ('operation not permitted on an event last recorded in a capturing "
        "stream'); the 2026-11-29 H200 record: the capture is invalidated afterwards. GUESS: the error name "
        "(that record took a swallowed status; device_trust.sh re-checks it)"),
    "event_query_invalidated": Rule(
        "cudaEventQuery of an event last recorded in a capture that was invalidated (not yet ended)", "raises",
        "cudaErrorInvalidValue", "none",
        "facts row 'event or stream query': cudaEventQuery of an event recorded in an invalidated capture "
        "returns cudaErrorInvalidValue (measured)"),
    "stream_query_invalidated": Rule(
        "cudaStreamQuery of a stream whose capture is invalidated (not yet ended)", "raises",
        "cudaErrorStreamCaptureUnsupported", "none",
        "facts (H200, 2026-11-30 conformance run, docs/measurements/h200-2026-11-30b/conformance): cudaStreamQuery on an invalidated capture returns cudaErrorStreamCaptureUnsupported (900), as on an "
        "active one (the Programming Guide's 'Invalidation' would suggest cudaErrorStreamCaptureInvalidated)"),
    "graph_launch_invalidated": Rule(
        "cudaGraphLaunch or cudaGraphUpload into a stream whose capture is invalidated (not yet ended)", "raises",
        "cudaErrorStreamCaptureUnsupported", "none",
        "facts (H200, 2026-11-30 conformance run, docs/measurements/h200-2026-11-30b/conformance): a graph launch into an invalidated capture returns cudaErrorStreamCaptureUnsupported (900), not "
        "cudaErrorStreamCaptureInvalidated"),
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
        "cudaEventSynchronize / cudaEventElapsedTime / cudaEventQuery on an event last recorded inside a "
        "capture that has ended", "raises", "cudaErrorInvalidValue", "none",
        "Measured on the H200 (docs/measurements/h200-2026-11-29/event-after-capture-probe.txt): before and "
        "after replays, until the event is recorded again eagerly. cudaEventQuery: that probe saw 'not "
        "complete' through CuPy's returned status; GUESS: the status was cudaErrorInvalidValue, as for "
        "synchronize"),
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
    # --- graphs: instantiate, launch, upload, update, destroy, composition (RT = CUDA Runtime API,
    # "Graph Management"; PG = Programming Guide "CUDA Graphs"; facts = gpu-facts.md, 2026-11-30 table)
    "graph_launch_in_capture": Rule(
        "cudaGraphLaunch of an executable graph into a stream in an active capture (any mode)", "raises",
        "cudaErrorStreamCaptureUnsupported", "the capture",
        "facts (2026-11-30): cudaGraphLaunch into a capturing stream (global, relaxed) returns "
        "cudaErrorStreamCaptureUnsupported, capture invalidated, end → cudaErrorStreamCaptureInvalidated. "
        "GUESS: thread-local mode alike"),
    "graph_upload_in_capture": Rule(
        "cudaGraphUpload into a stream in an active capture", "raises", "cudaErrorStreamCaptureUnsupported",
        "the capture", "RT cudaGraphUpload (stream-ordered, like a launch). GUESS: refused as cudaGraphLaunch is "
        "(facts)"),
    "graph_launch_unfreed": Rule(
        "cudaGraphLaunch of an executable graph whose memory-allocation nodes' allocations from the previous "
        "launch are not freed, without cudaGraphInstantiateFlagAutoFreeOnLaunch", "raises", "cudaErrorInvalidValue",
        "none", "RT cudaGraphLaunch: 'If any allocations created by graphExec remain unfreed (from a previous "
        "launch) and graphExec was not instantiated with cudaGraphInstantiateFlagAutoFreeOnLaunch, the launch "
        "will fail with cudaErrorInvalidValue'; facts (2026-11-30): launch 1 ok, launch 2 cudaErrorInvalidValue"),
    "graph_auto_free": Rule(
        "cudaGraphLaunch of an executable graph instantiated with cudaGraphInstantiateFlagAutoFreeOnLaunch",
        "frees", None, "-", "RT cudaGraphInstantiateWithFlags: frees any unfreed allocations before relaunch"),
    "graph_free_outside": Rule(
        "cudaFreeAsync / cudaFree, outside the graph, of an allocation a launched graph made", "frees", None,
        "-", "PG 'Graph Memory Nodes' → 'Accessing and freeing graph memory outside of the allocating graph'"),
    "instantiate_mem_nodes_twice": Rule(
        "cudaGraphInstantiate of a graph with memory allocation/free nodes while an executable of that graph "
        "exists", "raises", "cudaErrorNotSupported", "none",
        "RT cudaGraphInstantiateWithFlags: 'at most one executable graph in existence for that graph at a "
        "time'; facts (2026-11-30) and the H200 conformance run of 2026-11-30 (first executable kept "
        "alive): cudaErrorNotSupported. An executable that is destroyed (in CuPy: garbage-collected) frees "
        "the slot (rule exec_destroy)"),
    "instantiate_bad_flags": Rule(
        "cudaGraphInstantiateWithFlags with unknown flag bits, with cudaGraphInstantiateFlagUpload (only "
        "cudaGraphInstantiateWithParams takes it), or with DeviceLaunch together with AutoFreeOnLaunch",
        "raises", "cudaErrorInvalidValue", "none",
        "RT cudaGraphInstantiateWithFlags (valid flags; 'cannot be used in conjunction'); RT enum "
        "cudaGraphInstantiateFlags (Upload: 'only supported by cudaGraphInstantiateWithParams')"),
    "instantiate_device_launch": Rule(
        "cudaGraphInstantiateWithFlags(cudaGraphInstantiateFlagDeviceLaunch) of an empty graph or one with "
        "nodes other than kernel, memcpy, memset and child-graph nodes", "raises", "cudaErrorInvalidValue", "none",
        "RT cudaGraphInstantiateWithFlags: graphs instantiated for device launch can only contain kernel, "
        "memcpy, memset and child graph nodes and cannot be empty (returns: cudaSuccess, cudaErrorInvalidValue)"),
    "instantiate_many": Rule(
        "cudaGraphInstantiate of a graph without memory nodes, several times", "returns", None, "-",
        "PG 'CUDA Graphs' → 'Graph instantiation': to run a graph concurrently it must be instantiated several "
        "times (RT cudaGraphLaunch); each executable replays independently"),
    "graph_destroy_exec_lives": Rule(
        "cudaGraphDestroy of a graph whose executables still live", "returns", None, "-",
        "RT cudaGraphInstantiate: the executable is a snapshot; PG 'Graph instantiation': an executable graph "
        "is not changed by later changes to (or destruction of) its graph"),
    "exec_destroy": Rule(
        "cudaGraphExecDestroy", "returns", None, "-",
        "RT cudaGraphExecDestroy (later use of the handle is undefined: never modelled); frees the graph's "
        "single-executable slot for graphs with memory nodes"),
    "update_topology": Rule(
        "cudaGraphExecUpdate with a graph of another node count, other dependencies or more exit nodes",
        "raises", "cudaErrorGraphExecUpdateFailure", "none",
        "RT cudaGraphExecUpdate: result cudaGraphExecUpdateErrorTopologyChanged (errorNode NULL when the counts "
        "differ, else the node from hGraph); facts (2026-11-30): one node more → cudaErrorGraphExecUpdateFailure"),
    "update_node_type": Rule(
        "cudaGraphExecUpdate where a paired node's type differs", "raises", "cudaErrorGraphExecUpdateFailure",
        "none", "RT cudaGraphExecUpdate: result cudaGraphExecUpdateErrorNodeTypeChanged, errorNode the node from "
        "hGraph"),
    "update_function": Rule(
        "cudaGraphExecUpdate where a kernel node's function changes (same context, no CDP, not cooperative)",
        "updates", None, "-",
        "RT cudaGraphExecUpdate: FunctionChanged only for drivers < 11.2; kernel-node limitations list the "
        "changes refused (UnsupportedFunctionChange): owning context, CDP, device-side update/launch, "
        "cooperative; none applies to ds4lab's kernels"),
    "update_mem_nodes": Rule(
        "cudaGraphExecUpdate of an executable with memory allocation/free nodes, from a graph of the same "
        "topology", "updates", None, "-",
        "facts (H200, 2026-11-30 conformance run, docs/measurements/h200-2026-11-30b/conformance): the whole-graph update succeeds (RT cudaGraphExecNodeSetParams calls single-node updates of "
        "memory nodes unsupported; the whole-graph update pairs them unchanged)"),
    "update_ok": Rule(
        "cudaGraphExecUpdate with a topologically identical graph", "updates", None, "-",
        "RT cudaGraphExecUpdate; PG 'Updating instantiated graphs' → 'Whole graph update': the executable takes "
        "the new nodes' parameters (kernel arguments, memset values) for later launches"),
    "child_graph": Rule(
        "cudaGraphAddChildGraphNode", "node", None, "-",
        "RT cudaGraphAddChildGraphNode: the child graph is cloned into the node; it runs as part of the parent. "
        "Refused (cudaErrorNotSupported) when the child contains memory allocation or free nodes"),
    "child_graph_mem_nodes": Rule(
        "cudaGraphAddChildGraphNode with a child graph containing memory allocation or free nodes", "raises",
        "cudaErrorNotSupported", "none",
        "RT cudaGraphAddChildGraphNode: 'If childGraph contains allocation nodes, free nodes, or conditional "
        "nodes, this call will return an error'; facts (H200, 2026-11-30 conformance run, docs/measurements/h200-2026-11-30b/conformance): cudaErrorNotSupported"),
    "event_record_external": Rule(
        "cudaEventRecordWithFlags(cudaEventRecordExternal) on a capturing stream", "node", None, "-",
        "RT cudaEventRecordWithFlags: the event is captured as an event record node (PG 'Cross-stream "
        "Dependencies and Events'); each replay records the event, which the host may then wait for"),
    "wait_external": Rule(
        "cudaStreamWaitEvent(cudaEventWaitExternal) on a capturing stream, event recorded outside the capture",
        "node", None, "-",
        "RT cudaStreamWaitEvent: with cudaEventWaitExternal the wait is captured as an event wait node instead "
        "of refused (rule isolation)"),
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
    """A captured (or created) graph (``cudaGraph_t``): its nodes in a topological order."""

    id: int
    nodes: list
    capture_id: int
    #: live executables instantiated from it (rule instantiate_mem_nodes_twice)
    execs: int = 0
    #: those executables (rule instantiate_mem_nodes_twice asks whether one holds unfreed allocations)
    live: list = field(default_factory=list)
    destroyed: bool = False

    @property
    def has_mem_nodes(self) -> bool:
        """Memory allocation or free nodes directly in this graph."""
        return any(n.kind in ("mem_alloc", "mem_free") for n in self.nodes)

    def __repr__(self) -> str:
        return f"<sim graph {self.id}: {len(self.nodes)} nodes>"


#: cudaGraphInstantiateFlags (CUDA Runtime API, "Data types used by CUDA Runtime").
FLAG_AUTO_FREE_ON_LAUNCH, FLAG_UPLOAD, FLAG_DEVICE_LAUNCH, FLAG_USE_NODE_PRIORITY = 1, 2, 4, 8


@dataclass
class GraphExec:
    """An instantiated graph (``cudaGraphExec_t``): the graph it mirrors, its flags, and the
    allocations its last launch made that are not freed yet (rule graph_launch_unfreed)."""

    id: int
    graph: Graph
    launches: int = 0
    flags: int = 0
    destroyed: bool = False
    unfreed: list = field(default_factory=list)
    #: the graph it was instantiated from (its single-executable slot), even after updates
    source: Graph | None = None

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
        #: Executables whose last launch left graph allocations unfreed (rule graph_launch_unfreed).
        self._launched: list[GraphExec] = []

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
        """``cudaEventQuery``: True when the device has reached the event at the current host time,
        False for ``cudaErrorNotReady`` (the documented "pending" answer).

        Raises cudaErrorCapturedEvent (last recorded in an active capture, which is invalidated:
        rule event_query_captured), cudaErrorInvalidValue (last recorded in an invalidated or ended
        capture: rules event_query_invalidated, event_after_capture), or cudaErrorStreamCaptureUnsupported
        (rule unsafe_call).
        """
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
        """``cudaStreamQuery``: True when all the stream's work is done, False for ``cudaErrorNotReady``.

        Raises cudaErrorStreamCaptureUnsupported (the stream is in an active capture, which is
        invalidated: rule stream_query_capturing), cudaErrorStreamCaptureInvalidated (its capture is
        invalidated: rule stream_query_invalidated), cudaErrorStreamCaptureImplicit (legacy stream
        while a blocking stream captures).
        """
        call = "cudaStreamQuery"
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
            q = s.capture
            if q is not None:
                if q.status == "active":
                    self._fail("stream_query_capturing", call, [q], f"{s.name} is capturing (sequence {q.id})")
                self._fail("stream_query_invalidated", call, (), f"capture {q.id} was invalidated by {q.why}")
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
    def graph_instantiate(self, g: Graph, flags: int = 0) -> GraphExec:
        """``cudaGraphInstantiateWithFlags``: an executable graph.

        Args:
            g: a graph from :meth:`end_capture` or :meth:`graph_create`.
            flags: ``cudaGraphInstantiateFlags`` bits (AutoFreeOnLaunch 1, Upload 2, DeviceLaunch 4,
                UseNodePriority 8).

        Raises:
            CudaError: cudaErrorInvalidValue (not a graph; rules instantiate_bad_flags,
                instantiate_device_launch), cudaErrorNotSupported (rule instantiate_mem_nodes_twice).
        """
        call = "cudaGraphInstantiate"
        if not isinstance(g, Graph) or g.destroyed:
            raise CudaError("cudaErrorInvalidValue", call, f"{g!r} is not a live sim graph")
        flags = int(flags)
        with self.lock:
            if flags & ~0xF:
                self._fail("instantiate_bad_flags", call, (), f"unknown flag bits {flags & ~0xF:#x}")
            if flags & FLAG_UPLOAD:
                self._fail("instantiate_bad_flags", call, (), "cudaGraphInstantiateFlagUpload needs "
                                                               "cudaGraphInstantiateWithParams")
            if flags & FLAG_DEVICE_LAUNCH and flags & FLAG_AUTO_FREE_ON_LAUNCH:
                self._fail("instantiate_bad_flags", call, (), "DeviceLaunch with AutoFreeOnLaunch")
            if flags & FLAG_DEVICE_LAUNCH:
                bad = [n.kind for n in g.nodes if n.kind not in ("kernel", "memcpy", "memset", "graph")]
                if bad or not g.nodes:
                    self._fail("instantiate_device_launch", call, (),
                               f"node kinds {sorted(set(bad))}" if bad else "empty graph")
            if g.has_mem_nodes and g.live:
                self._fail("instantiate_mem_nodes_twice", call, (), f"graph {g.id} has memory nodes and a live "
                                                                    "executable")
            self.dev.host(self.cal.host_api_us)
            g.execs += 1
            ex = GraphExec(next(self._ids), g, flags=flags, source=g)
            g.live.append(ex)
            return ex

    def graph_exec_destroy(self, ex: GraphExec) -> None:
        """``cudaGraphExecDestroy`` (rule exec_destroy). Raises cudaErrorInvalidValue for a non-executable
        or one destroyed already (CUDA calls that undefined; the sim refuses it)."""
        call = "cudaGraphExecDestroy"
        with self.lock:
            if not isinstance(ex, GraphExec) or ex.destroyed:
                raise CudaError("cudaErrorInvalidValue", call, f"{ex!r} is not a live executable graph")
            ex.destroyed = True
            if ex.source is not None:
                ex.source.execs -= 1
                if ex in ex.source.live:
                    ex.source.live.remove(ex)
            self.dev.host(self.cal.host_api_us)

    def graph_destroy(self, g: Graph) -> None:
        """``cudaGraphDestroy``: executables instantiated from ``g`` keep working (rule graph_destroy_exec_lives)."""
        with self.lock:
            if not isinstance(g, Graph) or g.destroyed:
                raise CudaError("cudaErrorInvalidValue", "cudaGraphDestroy", f"{g!r} is not a live sim graph")
            g.destroyed = True
            self.dev.host(self.cal.host_api_us)

    def graph_create(self) -> Graph:
        """``cudaGraphCreate``: an empty graph (nodes added with :meth:`graph_add_child`)."""
        with self.lock:
            self.dev.host(self.cal.host_api_us)
            return Graph(next(self._ids), [], 0)

    def graph_add_child(self, g: Graph, child: Graph) -> None:
        """``cudaGraphAddChildGraphNode`` after ``g``'s last node (rules child_graph, child_graph_mem_nodes).

        Raises cudaErrorNotSupported for a child with memory allocation or free nodes.
        """
        call = "cudaGraphAddChildGraphNode"
        with self.lock:
            if not isinstance(g, Graph) or not isinstance(child, Graph):
                raise CudaError("cudaErrorInvalidValue", call, "not sim graphs")
            if child.has_mem_nodes:
                self._fail("child_graph_mem_nodes", call, (), f"graph {child.id} has memory nodes")
            deps = (len(g.nodes) - 1,) if g.nodes else ()
            clone = Graph(next(self._ids), list(child.nodes), child.capture_id)  # the child is cloned
            g.nodes.append(Node(len(g.nodes), "graph", f"graph {child.id}", None, deps, 0.0, "", clone))
            self.dev.host(self.cal.host_api_us)

    @staticmethod
    def _update_check(old: list, new: list):
        """CUDA's pairing of ``cudaGraphExecUpdate``: None, or (rule, result, failing new node)."""
        if len(old) != len(new):
            return "update_topology", "cudaGraphExecUpdateErrorTopologyChanged", None
        for a, b in zip(old, new):
            if a.deps != b.deps:
                return "update_topology", "cudaGraphExecUpdateErrorTopologyChanged", b
            if a.kind != b.kind:
                return "update_node_type", "cudaGraphExecUpdateErrorNodeTypeChanged", b
            if b.kind == "graph":
                sub = Runtime._update_check(a.info.nodes, b.info.nodes)
                if sub is not None:
                    return sub
        return None

    def graph_exec_update(self, ex: GraphExec, g: Graph) -> None:
        """``cudaGraphExecUpdate``: take ``g``'s node parameters when its topology matches.

        CUDA Runtime API, cudaGraphExecUpdate, and Programming Guide "Updating Instantiated Graphs"
        → "Whole graph update": nodes are paired in order; another node count or other dependencies
        (TopologyChanged), another node type (NodeTypeChanged) or a memory node (NotSupported,
        GUESS) refuse the update and leave the executable unchanged. A kernel's function may change
        (rule update_function). Host cost: one API call plus ``host_api_us / 8`` per node (modeled).

        Raises:
            GraphExecUpdateError: ``cudaErrorGraphExecUpdateFailure`` with ``result`` (the
                ``cudaGraphExecUpdateResult`` name) and ``node_type`` (the failing node of ``g``, or
                None when the node counts differ).
            CudaError: cudaErrorInvalidValue for arguments that are not a sim executable / graph.
        """
        call = "cudaGraphExecUpdate"
        if not isinstance(ex, GraphExec) or not isinstance(g, Graph) or ex.destroyed:
            raise CudaError("cudaErrorInvalidValue", call, "not a sim graph / live executable graph")
        with self.lock:
            self.dev.host(self.cal.host_api_us * (1 + len(g.nodes) / 8))
            bad = self._update_check(ex.graph.nodes, g.nodes)
            if bad is not None:
                rule, result, node = bad
                raise GraphExecUpdateError(call, result, node.kind if node is not None else None,
                                           f"{RULES[rule].when} (graph {g.id} vs executable {ex.id})")
            ex.graph = g

    @staticmethod
    def _flat(nodes):
        for n in nodes:
            if n.kind == "graph":
                yield from Runtime._flat(n.info.nodes)
            else:
                yield n

    def _launch_checks(self, ge: GraphExec, s: SimStream, call: str, rule: str) -> bool:
        """Capture rules of a launch/upload on ``s``; True when the call must stop (dropped)."""
        seq = s.capture
        if seq is None:
            return False
        if seq.status != "active":
            self._fail("graph_launch_invalidated", call, (), f"capture {seq.id} was invalidated by {seq.why}")
        self._fail(rule, call, [seq], f"{s.name} is capturing (sequence {seq.id})")
        return True

    def graph_upload(self, ge: GraphExec, stream: Any) -> None:
        """``cudaGraphUpload``: prepare ``ge`` on ``stream`` without running it (host cost only).

        Raises cudaErrorStreamCaptureUnsupported into a capturing stream (rule graph_upload_in_capture).
        """
        call = "cudaGraphUpload"
        if not isinstance(ge, GraphExec) or ge.destroyed:
            raise CudaError("cudaErrorInvalidValue", call, f"{ge!r} is not a live executable graph")
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
            if self._launch_checks(ge, s, call, "graph_upload_in_capture"):
                return
            self.dev.host(self.cal.host_api_us)

    def graph_memory_free(self, addr: int) -> bool:
        """A free, outside the graph, of memory a launched graph allocated (rule graph_free_outside).

        Returns True when ``addr`` was such an allocation (now freed: the executable may launch
        again), False otherwise (the caller frees it as ordinary memory).
        """
        with self.lock:
            for ex in self._launched:
                if addr in ex.unfreed:
                    ex.unfreed.remove(addr)
                    return True
            return False

    @staticmethod
    def _unfreed_allocs(nodes) -> list:
        """Allocations (addresses; None in timing-only mode) of ``nodes`` not freed by a free node of the same graph."""
        allocs = [n.info for n in nodes if n.kind == "mem_alloc"]
        for n in nodes:
            if n.kind == "mem_free" and n.info in allocs:
                allocs.remove(n.info)
        return allocs

    def graph_launch(self, ge: GraphExec, stream: Any) -> None:
        """``cudaGraphLaunch``: replay every node in order (their callables run again); time paced per node.

        Raises cudaErrorStreamCaptureUnsupported into a capturing stream (rule graph_launch_in_capture),
        cudaErrorInvalidValue while the previous launch's allocations are unfreed (rule
        graph_launch_unfreed), cudaErrorStreamCaptureImplicit (legacy stream, blocking capture).
        """
        call = "cudaGraphLaunch"
        if not isinstance(ge, GraphExec) or ge.destroyed:
            raise CudaError("cudaErrorInvalidValue", call, f"{ge!r} is not an instantiated sim graph")
        with self.lock:
            s = self._stream(stream, call)
            if s is self.legacy and self.live:
                self._legacy_use(call)
                self.escapes.append((call, f"graph {ge.graph.id}"))
            if self._launch_checks(ge, s, call, "graph_launch_in_capture"):
                return
            if ge.unfreed:
                if not ge.flags & FLAG_AUTO_FREE_ON_LAUNCH:
                    self._fail("graph_launch_unfreed", call, (), f"{len(ge.unfreed)} allocation(s) of the previous "
                                                                 "launch not freed")
                ge.unfreed = []  # rule graph_auto_free
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
                if n.kind == "event_record" and isinstance(n.info, SimEvent):  # rule event_record_external
                    ev = n.info
                    ev.capture, ev.tail, ev.stream = None, (), s
                    ev.time_us = max(pace, prev_end)
                if n.kind in ("kernel", "memset", "memcpy"):
                    _, prev_end = self.dev.run(s.name, n.name, max(pace, prev_end), n.gpu_us, n.kind, gid,
                                               occupies=n.kind != "memcpy")
                pace += step
            s.ready_us = prev_end
            ge.unfreed = [a for a in self._unfreed_allocs(list(self._flat(ge.graph.nodes))) if a is not None]
            if ge.unfreed and ge not in self._launched:
                self._launched.append(ge)

    # ------------------------------------------------------------------ external event nodes
    def event_record_external(self, stream: Any, e: SimEvent) -> None:
        """``cudaEventRecordWithFlags(cudaEventRecordExternal)``: captured, an event record node that
        records ``e`` at every replay (rule event_record_external); eagerly, a plain record."""
        call = "cudaEventRecordWithFlags"
        with self.lock:
            s = self._stream(stream, call)
            seq = s.capture
            if seq is None:
                self.event_record(stream, e)
                return
            self.dev.host(self.cal.host_api_us)
            if seq.status != "active":
                self._on_invalidated(seq, call, e.name)
                return
            node = Node(len(seq.nodes), "event_record", e.name, None, s.tail, 0.0, s.name, e)
            seq.nodes.append(node)
            s.tail = (node.idx,)

    def stream_wait_event_external(self, stream: Any, e: SimEvent) -> None:
        """``cudaStreamWaitEvent(..., cudaEventWaitExternal)``: captured, an event wait node (rule
        wait_external); eagerly, a plain wait."""
        call = "cudaStreamWaitEvent"
        with self.lock:
            s = self._stream(stream, call)
            seq = s.capture
            if seq is None or self._captured(e) is not None:
                self.stream_wait_event(stream, e)
                return
            self.dev.host(self.cal.host_api_us)
            if seq.status != "active":
                self._on_invalidated(seq, call, e.name)
                return
            node = Node(len(seq.nodes), "wait_event", e.name, None, s.tail, 0.0, s.name, e)
            seq.nodes.append(node)
            s.tail = (node.idx,)

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
