"""The simulator's stream-capture rules: the capture modes, :class:`Rule` and the :data:`RULES` table (trigger,
outcome, CUDA error name, what gets invalidated, source), and the error a rule raises.
:meth:`ds4lab.sim.runtime.Runtime._fail` applies them; this table is the single place to read or change what the
simulator claims."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import CollectiveError, CudaError, CupyRefusal, LibraryError

#: Capture modes, as ``Backend.begin_capture`` names them (cudaStreamCaptureMode*).
from ..capture.stream import CAPTURE_MODES as MODES  # defined once


class Rule(NamedTuple):
    """One rule of stream capture: when it applies and what the simulator does."""

    when: str
    outcome: str  # "node", "marks", "joins", "escapes", "raises", "returns", "drops", "frees", "updates"
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
        "executed; facts rows memsetAsync and mallocAsync/freeAsync ('yes (memory nodes)'); H200 conformance "
        "2026-11-30 (h2d_pageable_in_capture): cudaMemcpyAsync from pageable host memory → one memcpy node. "
        "H200 conformance 2026-12-01 (memory.d2h_async_pageable, docs/measurements/h200-2026-12-01/round2): device-to-host into pageable memory "
        "alike"),
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
        "kernel, synchronous cudaMemset or cudaMemcpy, or other work or an event record on the legacy stream while "
        "only non-blocking streams capture", "escapes", None, "-",
        "facts rows 'synchronous memset (legacy stream)' and 'kernel on the legacy (null) stream': ran once at "
        "capture time, not in the graph; H200 conformance 2026-12-01 (memory.memcpy_sync_h2d_in_capture and "
        "memory.memcpy_sync_d2h_in_capture, docs/measurements/h200-2026-12-01/round2): synchronous cudaMemcpy alike in both directions. GUESS: "
        "other copies, stream-ordered allocations and event records on the legacy stream alike"),
    "uncaptured_stream": Rule(
        "work (kernel, memset, copy, stream-ordered allocation) or an event record on a stream that is neither "
        "capturing nor the legacy stream, while another stream captures", "escapes", None, "-",
        "PG 'Stream Capture': only work issued into a capturing stream, or into a stream joined to its capture "
        "through an event, is captured; every other stream executes its work as it would outside capture (runs "
        "now, not in any graph)"),
    "uncaptured_sync": Rule(
        "cudaStreamSynchronize, cudaStreamQuery or cudaStreamWaitEvent (on an event recorded outside any capture) "
        "of a stream that is not in any capture, while another (non-blocking) stream captures", "returns", None, "-",
        "PG 'Prohibited and Unhandled Operations': it is invalid to synchronize or query a stream being captured "
        "(or the legacy stream while a blocking stream captures); other streams answer as outside capture"),
    "host_query": Rule(
        "a host-only call while a stream captures: cudaGetDevice, cudaGetLastError, cudaDeviceGetAttribute, "
        "cudaFuncGetAttributes / cuFuncGetAttribute, occupancy queries, cuCtxGetCurrent, stream and event creation "
        "(and an event's destruction), cudaEventElapsedTime of events recorded outside any capture", "returns", None,
        "-",
        "RT: these calls take no stream and enqueue no work; their reference pages name no stream-capture "
        "restriction. H200 conformance 2026-12-01 (host_calls.host_queries_in_capture, docs/measurements/h200-2026-12-01/round2): none is refused or "
        "invalidates a capture in any mode"),
    "capture_status_query": Rule(
        "cudaStreamIsCapturing / cudaStreamGetCaptureInfo of a stream, capturing or not, while a capture is live",
        "returns", None, "-",
        "RT cudaStreamIsCapturing, cudaStreamGetCaptureInfo: the way code asks whether a stream captures (to skip "
        "work); returns the status, does not invalidate. On the legacy stream while a blocking stream captures RT "
        "documents cudaErrorStreamCaptureImplicit instead: not modelled here (the audit's capture stream is "
        "non-blocking)"),
    # --- refusals
    "legacy_implicit": Rule(
        "any use of the legacy stream (enqueue, record, wait, query, synchronize, synchronous memset/copy) "
        "while a blocking (not cudaStreamNonBlocking) stream captures", "raises",
        "cudaErrorStreamCaptureImplicit", "every live capture holding a blocking stream",
        "PG 'Prohibited and Unhandled Operations': any attempted use of the legacy stream is invalid; RT "
        "cudaError: cudaErrorStreamCaptureImplicit. H200 conformance run of 2026-12-01 "
        "(docs/measurements/h200-2026-12-01/round1): a cudaEventRecord on the legacy stream (ds4's MoE profile) "
        "is refused so in every capture mode and invalidates the capture. GUESS: the legacy work is not executed"),
    "unsafe_call": Rule(
        "a potentially unsafe call (cudaMalloc, cudaFree, memory-pool growth, cudaEventQuery/"
        "cudaEventSynchronize of an uncaptured event) by a thread that has a global/thread-local capture, "
        "or, while its interaction mode is global (the default), while another thread has a global capture",
        "raises", "cudaErrorStreamCaptureUnsupported", "the captures that prohibit the call",
        "RT cudaThreadExchangeStreamCaptureMode (mode definitions); facts row cudaMalloc (global/thread-local: "
        "refused, invalidated; relaxed: ok). H200 conformance run of 2026-12-01: cudaEventQuery and "
        "cudaEventSynchronize of an event recorded on the legacy stream before a blocking stream's capture are "
        "refused so (and invalidate) in global and thread-local mode, allowed in relaxed mode. GUESS: cudaFree "
        "and pool growth are 'unsafe'; other threads' captures invalidated"),
    "unsafe_host_call": Rule(
        "cudaHostAlloc / cudaMallocHost / cudaFreeHost / cudaHostRegister / cudaHostUnregister by a thread that has "
        "a global/thread-local capture, or, while its interaction mode is global, while another thread has a global "
        "capture", "raises", "cudaErrorStreamCaptureUnsupported", "the captures that prohibit the call",
        "RT cudaThreadExchangeStreamCaptureMode ('potentially unsafe API calls'; cudaMalloc is the example it "
        "gives). H200 conformance 2026-12-01 (memory.host_alloc_in_capture and memory.host_register_in_capture, "
        "docs/measurements/h200-2026-12-01/round2): allocating and registering host memory is unsafe as cudaMalloc is: refused and invalidating in "
        "global and thread-local mode, allowed in relaxed"),
    "cublas_create": Rule(
        "cublasCreate by a thread whose capture (global/thread-local), or another thread's global capture, "
        "prohibits unsafe calls", "raises", "cublas:CUBLAS_STATUS_NOT_INITIALIZED", "the captures that prohibit the call",
        "cuBLAS library reference: cublasCreate allocates hardware resources on the host and the device "
        "(CUBLAS_STATUS_NOT_INITIALIZED: 'the cuBLAS library was not initialized', usually a failed resource "
        "allocation). Measured on the H200 (conformance host_calls.cublas_create_in_capture, "
        "docs/measurements/h200-2026-12-01/round2): NOT_INITIALIZED and the capture invalidated in global and "
        "thread-local mode, the handle made in relaxed mode"),
    "cublas_settings": Rule(
        "cublasSetWorkspace / cublasSetStream with a workspace and a stream made before the capture", "returns", None,
        "-", "cuBLAS library reference, 'CUDA Graphs Support': give the handle a workspace (cublasSetWorkspace) so "
        "that no allocation happens during capture. H200 conformance 2026-12-01 "
        "(host_calls.cublas_workspace_in_capture, docs/measurements/h200-2026-12-01/round3): host-side settings, "
        "allowed in every mode, the capture intact"),
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
        "cudaErrorStreamCaptureUnsupported, capture invalidated, end → cudaErrorStreamCaptureInvalidated; "
        "thread-local mode alike (H200 conformance 2026-12-01, graphs.graph_launch_into_capture, docs/measurements/h200-2026-12-01/round2)"),
    "graph_upload_in_capture": Rule(
        "cudaGraphUpload into a stream in an active capture", "raises", "cudaErrorStreamCaptureUnsupported",
        "the capture", "RT cudaGraphUpload (stream-ordered, like a launch); H200 conformance 2026-12-01 "
        "(graphs.graph_upload_into_capture, docs/measurements/h200-2026-12-01/round2): refused as cudaGraphLaunch is"),
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
    "kernel_node_set_params": Rule(
        "cudaGraphExecKernelNodeSetParams on a kernel node of an executable graph (same function)", "updates",
        None, "-",
        "RT cudaGraphExecKernelNodeSetParams: sets the parameters of the node's copy in the executable; 'the "
        "changes only affect future launches of hGraphExec'; the graph is not modified. PG 'Updating "
        "instantiated graphs' → 'Individual node update'. ds4 36ee8c14 sets its attention graph's nodes every "
        "token this way. GUESS: a function change is refused (the sim's choice; never asked by ds4lab)"),
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
    # --- two devices: peer copies and NCCL collectives (ds4lab/sim/devices.py; tensor parallelism,
    # docs/tensor-parallel.md). NCCL = NCCL User Guide, "Using NCCL with CUDA Graphs" (and "Capture
    # modes" in its 2.11-2.12 editions); each rule's conformance scenario is in ds4lab/conformance/tp.py.
    **{name: Rule(*fields) for name, fields in {
        "peer_copy": (
            "cudaMemcpyPeerAsync on a stream of the source or destination device that is not capturing",
            "returns", None, "-",
            "RT cudaMemcpyPeerAsync: asynchronous with respect to the host and to work in other streams and on "
            "other devices; ordered in its stream like any copy"),
        "peer_copy_capture": (
            "cudaMemcpyPeerAsync on a capturing stream", "node", None, "-",
            "GUESS: captured as one memcpy node (PG 'Stream Capture': work launched into a capturing stream becomes "
            "a node; no source speaks of peer copies; one third-party project reports capture refusing it): the "
            "two-GPU scenario tp.peer_copy_in_capture decides"),
        "memcpy_peer_implicit": (
            "cudaMemcpyPeer (synchronous, ds4's TP reduction) while a blocking stream of the source or destination "
            "device captures", "raises", "cudaErrorStreamCaptureImplicit", "that device's live captures holding a "
            "blocking stream",
            "RT cudaMemcpyPeer: serialized with respect to all pending and future asynchronous work on the current, "
            "source and destination devices, i.e. the legacy stream's semantics on both devices. GUESS: refused as "
            "rule legacy_implicit refuses legacy-stream work"),
        "memcpy_peer_escape": (
            "cudaMemcpyPeer while only non-blocking streams of the source or destination device capture", "escapes",
            None, "-",
            "RT cudaMemcpyPeer (as memcpy_peer_implicit). GUESS: it runs at once and is in no graph, as rule "
            "legacy_escape: a replay never copies"),
        "nccl_capture": (
            "ncclAllReduce on a capturing stream", "node", None, "-",
            "NCCL 'Using NCCL with CUDA Graphs': collective, P2P and group operations can be captured (NCCL >= 2.9, "
            "CUDA >= 11.3); the capture holds the collective (GUESS: one kernel node, nothing communicated at "
            "capture time); it runs when the graph is launched"),
        "nccl_pair": (
            "an eager ncclAllReduce, or the launch of a graph holding one: the k-th collective a rank executes on a "
            "communicator meets the k-th of every other rank", "returns", None, "-",
            "NCCL 'Using NCCL with CUDA Graphs': a graph launch holding a captured NCCL operation is collective for "
            "the ranks of the capture, each launching the graph derived from that collective capture; NCCL API "
            "ncclSend/ncclRecv: 'blocking for the GPU'. GUESS: matched by execution order, as MPI matches "
            "collectives (MPI report, 'Correctness': collectives executed in the same order at all members)"),
        "nccl_mismatch": (
            "the k-th collectives of two ranks differ (operation, element type or count)", "raises", "nccl:mismatch",
            "none",
            "GUESS: NCCL does not check it; on a GPU the ranks' protocol steps disagree (a hang or wrong data). The "
            "sim raises at once, on every rank of the pair"),
        "nccl_nonuniform": (
            "the k-th collective is launched from a graph on one rank and eagerly on another", "raises",
            "nccl:nonuniform-capture", "none",
            "NCCL 'Using NCCL with CUDA Graphs': whether an operation launch is graph-captured is a collective "
            "property and must be uniform over all ranks of the launch. GUESS what a GPU does when it is not: the "
            "sim models the pair as never completing and raises at once on both ranks"),
        "nccl_timeout": (
            "a rank's collective whose peers do not execute their k-th collective within the sim's timeout",
            "raises", "nccl:timeout", "none",
            "NCCL: collectives and send/receive block the GPU until every rank takes part (a peer that never does "
            "hangs the stream). The sim waits collective_timeout_s, then raises on the waiting rank and marks the "
            "communicator broken (every later collective on it raises), as ncclCommAbort leaves it"),
        "nccl_global_multithread": (
            "an NCCL call (eager or captured) by a thread in global interaction mode while another thread has a "
            "global-mode capture live", "raises", "nccl:ncclUnhandledCudaError", "the other threads' global captures",
            "NCCL 2.11-2.12 'Capture modes': global capture mode is compatible with NCCL except when a process has "
            "several threads each attached to a GPU (then cudaStreamCaptureModeThreadLocal is needed); RT "
            "cudaThreadExchangeStreamCaptureMode (another thread's global capture prohibits potentially unsafe "
            "calls). GUESS: the status (NCCL wraps the CUDA error) and which capture is invalidated"),
    }.items()},
}

# Graph construction inside a capture, conditional nodes, programmatic dependent launch: their own
# module, one table (stages 3cc, 3p, 3cp, 3ccp; docs/capture-stages.md).
from .rules_device import DEVICE_RULES  # noqa: E402

RULES.update({name: Rule(*fields) for name, fields in DEVICE_RULES.items()})


def _error(name: str, call: str, detail: str):
    if name.startswith("cupy:"):
        return CupyRefusal(name, call, detail)
    if name.startswith("cublas:"):
        return LibraryError(name, call, detail)
    if name.startswith("nccl:"):
        return CollectiveError(name, call, detail)
    return CudaError(name, call, detail)
