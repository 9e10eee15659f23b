"""Graphs of the simulated runtime: :class:`Graph` and :class:`GraphExec`, the instantiate flags, and :class:`Graphs`,
the graph calls of the runtime (instantiate, destroy, create, child graphs, executable update and kernel-node
update, upload, launch, and the event record / wait nodes a capture can hold), a collaborator the
:class:`~ds4lab.sim.runtime.Runtime` holds as ``rt.graphs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import CudaError, GraphExecUpdateError
from .objects import Node, SimEvent, SimStream
from .rules import RULES


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
    #: the graph whose conditional node owns this one as a body (None: a top-level graph)
    parent: Any = None

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
    """An instantiated graph (``cudaGraphExec_t``): the graph it mirrors, its flags, and the allocations its last
    launch made that are not freed yet (rule graph_launch_unfreed)."""

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


def _check_live(obj, call: str, cls: type = Graph) -> None:
    """CudaError cudaErrorInvalidValue unless ``obj`` is a ``cls`` (a graph, or an executable) not destroyed."""
    if not isinstance(obj, cls) or obj.destroyed:
        raise CudaError("cudaErrorInvalidValue", call,
                        f"{obj!r} is not a live {'sim graph' if cls is Graph else 'executable graph'}")


class Graphs:
    """The graph calls of the simulated runtime, a collaborator of :class:`~ds4lab.sim.runtime.Runtime` (``rt``); it
    owns the executables whose last launch left graph allocations unfreed (rule graph_launch_unfreed)."""

    def __init__(self, rt) -> None:
        self.rt = rt
        #: Executables whose last launch left graph allocations unfreed (rule graph_launch_unfreed).
        self._launched: list[GraphExec] = []

    # ------------------------------------------------------------------ graphs
    def instantiate(self, g: Graph, flags: int = 0) -> GraphExec:
        """``cudaGraphInstantiateWithFlags`` of ``g``; ``flags``: AutoFreeOnLaunch 1, Upload 2, DeviceLaunch 4,
        UseNodePriority 8. Raises CudaError: cudaErrorInvalidValue (not a graph; rules instantiate_bad_flags,
        instantiate_device_launch), cudaErrorNotSupported (rule instantiate_mem_nodes_twice)."""
        call = "cudaGraphInstantiate"
        _check_live(g, call)
        flags = int(flags)
        with self.rt.lock:
            if flags & ~0xF:
                self.rt._fail("instantiate_bad_flags", call, (), f"unknown flag bits {flags & ~0xF:#x}")
            if flags & FLAG_UPLOAD:
                self.rt._fail("instantiate_bad_flags", call, (), "cudaGraphInstantiateFlagUpload needs "
                                                               "cudaGraphInstantiateWithParams")
            if flags & FLAG_DEVICE_LAUNCH and flags & FLAG_AUTO_FREE_ON_LAUNCH:
                self.rt._fail("instantiate_bad_flags", call, (), "DeviceLaunch with AutoFreeOnLaunch")
            if flags & FLAG_DEVICE_LAUNCH:
                bad = [n.kind for n in g.nodes if n.kind not in ("kernel", "memcpy", "memset", "graph")]
                if bad or not g.nodes:
                    self.rt._fail("instantiate_device_launch", call, (),
                               f"node kinds {sorted(set(bad))}" if bad else "empty graph")
            if g.has_mem_nodes and g.live:
                self.rt._fail("instantiate_mem_nodes_twice", call, (), f"graph {g.id} has memory nodes and a live "
                                                                    "executable")
            self.rt.dev.host(self.rt.cal.host_api_us)
            g.execs += 1
            ex = GraphExec(next(self.rt._ids), g, flags=flags, source=g)
            g.live.append(ex)
            return ex

    def exec_destroy(self, ex: GraphExec) -> None:
        """``cudaGraphExecDestroy`` (rule exec_destroy). Raises cudaErrorInvalidValue for a non-executable or one
        destroyed already (CUDA calls that undefined; the sim refuses it)."""
        call = "cudaGraphExecDestroy"
        with self.rt.lock:
            _check_live(ex, call, GraphExec)
            ex.destroyed = True
            if ex.source is not None:
                ex.source.execs -= 1
                if ex in ex.source.live:
                    ex.source.live.remove(ex)
            self.rt.dev.host(self.rt.cal.host_api_us)

    def destroy(self, g: Graph) -> None:
        """``cudaGraphDestroy``: executables instantiated from ``g`` keep working (rule graph_destroy_exec_lives)."""
        with self.rt.lock:
            _check_live(g, "cudaGraphDestroy")
            g.destroyed = True
            self.rt.dev.host(self.rt.cal.host_api_us)

    def create(self) -> Graph:
        """``cudaGraphCreate``: an empty graph (nodes added with :meth:`graph_add_child`)."""
        with self.rt.lock:
            self.rt.dev.host(self.rt.cal.host_api_us)
            return Graph(next(self.rt._ids), [], 0)

    def add_child(self, g: Graph, child: Graph) -> None:
        """``cudaGraphAddChildGraphNode`` after ``g``'s last node (rules child_graph, child_graph_mem_nodes); raises
        cudaErrorNotSupported for a child with memory allocation or free nodes."""
        call = "cudaGraphAddChildGraphNode"
        with self.rt.lock:
            if not isinstance(g, Graph) or not isinstance(child, Graph):
                raise CudaError("cudaErrorInvalidValue", call, "not sim graphs")
            if child.has_mem_nodes:
                self.rt._fail("child_graph_mem_nodes", call, (), f"graph {child.id} has memory nodes")
            if any(n.kind == "conditional" for n in child.nodes):
                self.rt._fail("child_graph_conditional", call, (), f"graph {child.id} has a conditional node")
            deps = (len(g.nodes) - 1,) if g.nodes else ()
            clone = Graph(next(self.rt._ids), list(child.nodes), child.capture_id)  # the child is cloned
            g.nodes.append(Node(len(g.nodes), "graph", f"graph {child.id}", None, deps, 0.0, "", clone))
            self.rt.dev.host(self.rt.cal.host_api_us)

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
                sub = Graphs._update_check(a.info.nodes, b.info.nodes)
                if sub is not None:
                    return sub
        return None

    def exec_update(self, ex: GraphExec, g: Graph) -> None:
        """``cudaGraphExecUpdate``: take ``g``'s node parameters when its topology matches (RT cudaGraphExecUpdate).
        Host cost: one API call plus ``host_api_us / 8`` per node (modeled).

        Raises:
            GraphExecUpdateError: ``cudaErrorGraphExecUpdateFailure`` with ``result`` (the
                ``cudaGraphExecUpdateResult`` name) and ``node_type`` (the failing node of ``g``, or None when the node
                counts differ); the executable is unchanged.
            CudaError: cudaErrorInvalidValue for arguments that are not a sim executable / graph."""
        call = "cudaGraphExecUpdate"
        if not isinstance(ex, GraphExec) or not isinstance(g, Graph) or ex.destroyed:
            raise CudaError("cudaErrorInvalidValue", call, "not a sim graph / live executable graph")
        with self.rt.lock:
            self.rt.dev.host(self.rt.cal.host_api_us * (1 + len(g.nodes) / 8))
            bad = self._update_check(ex.graph.nodes, g.nodes)
            if bad is not None:
                rule, result, node = bad
                raise GraphExecUpdateError(call, result, node.kind if node is not None else None,
                                           f"{RULES[rule].when} (graph {g.id} vs executable {ex.id})")
            ex.graph = g

    def exec_kernel_node_set_params(self, ex: GraphExec, index: int, name: str, gpu_us: float,
                                          fn, info) -> None:
        """``cudaGraphExecKernelNodeSetParams`` (rule kernel_node_set_params): kernel node ``index`` (capture order)
        takes ``fn``, ``gpu_us`` and ``info`` for later launches; the graph is unchanged. Host cost: one API call.
        Raises CudaError: cudaErrorInvalidValue for a dead executable, an index past its kernel nodes, or another kernel
        than the node's (GUESS)."""
        call = "cudaGraphExecKernelNodeSetParams"
        _check_live(ex, call, GraphExec)
        with self.rt.lock:
            kernels = [i for i, n in enumerate(ex.graph.nodes) if n.kind == "kernel"]
            if not 0 <= index < len(kernels):
                raise CudaError("cudaErrorInvalidValue", call, f"kernel node {index} of {len(kernels)}")
            pos = kernels[index]
            old = ex.graph.nodes[pos]
            if old.name != name:
                raise CudaError("cudaErrorInvalidValue", call, f"kernel node {index} runs {old.name}, not {name}")
            if ex.source is not None and ex.graph is ex.source:  # copy on first update: the graph stays as captured
                ex.graph = Graph(next(self.rt._ids), list(ex.graph.nodes), ex.graph.capture_id)
            ex.graph.nodes[pos] = Node(old.idx, "kernel", name, fn, old.deps, gpu_us, old.stream, info)
            self.rt.dev.host(self.rt.cal.host_api_us)

    @staticmethod
    def _flat(nodes):
        """The nodes a replay runs, in order: child graphs inlined; a conditional node, then the bodies its handle
        selects when the replay reaches it (``info.run_bodies()``: rule set_conditional), lazily, so a condition set
        by an earlier node of the same launch decides."""
        for n in nodes:
            if n.kind == "graph":
                yield from Graphs._flat(n.info.nodes)
            elif n.kind == "conditional":
                yield n
                for body in n.info.run_bodies():
                    yield from Graphs._flat(body.nodes)
            else:
                yield n

    @staticmethod
    def _conditionals(nodes):
        """Every conditional node of ``nodes``, child graphs and bodies included."""
        for n in nodes:
            if n.kind == "graph":
                yield from Graphs._conditionals(n.info.nodes)
            elif n.kind == "conditional":
                yield n
                for body in n.info.bodies:
                    yield from Graphs._conditionals(body.nodes)

    def _launch_checks(self, ge: GraphExec, s: SimStream, call: str, rule: str) -> bool:
        """Capture rules of a launch/upload on ``s``; True when the call must stop (dropped)."""
        seq = s.capture
        if seq is None:
            return False
        if seq.status != "active":
            self.rt._fail("graph_launch_invalidated", call, (), f"capture {seq.id} was invalidated by {seq.why}")
        self.rt._fail(rule, call, [seq], f"{s.name} is capturing (sequence {seq.id})")
        return True

    def _exec_stream(self, ge: GraphExec, stream: Any, call: str, what: str):
        """The stream ``call`` puts ``ge`` on (a use of the legacy stream recorded). Raises cudaErrorInvalidValue when
        ``ge`` is not ``what`` (destroyed, or not an executable)."""
        if not isinstance(ge, GraphExec) or ge.destroyed:
            raise CudaError("cudaErrorInvalidValue", call, f"{ge!r} is not {what}")
        return self.rt._used_stream(stream, call)

    def upload(self, ge: GraphExec, stream: Any) -> None:
        """``cudaGraphUpload``: prepare ``ge`` on ``stream`` without running it (host cost only); raises
        cudaErrorStreamCaptureUnsupported into a capturing stream (rule graph_upload_in_capture)."""
        call = "cudaGraphUpload"
        with self.rt.lock:
            s = self._exec_stream(ge, stream, call, "a live executable graph")
            if self._launch_checks(ge, s, call, "graph_upload_in_capture"):
                return
            self.rt.dev.host(self.rt.cal.host_api_us)

    def memory_free(self, addr: int) -> bool:
        """A free outside the graph of memory a launched graph allocated (rule graph_free_outside): True when ``addr``
        was one (the executable may launch again), False otherwise (the caller frees ordinary memory)."""
        with self.rt.lock:
            for ex in self._launched:
                if addr in ex.unfreed:
                    ex.unfreed.remove(addr)
                    return True
            return False

    @staticmethod
    def _unfreed_allocs(nodes) -> list:
        """Allocations (addresses; None in timing-only mode) of ``nodes`` not freed by a free node of the same graph.
        """
        allocs = [n.info for n in nodes if n.kind == "mem_alloc"]
        for n in nodes:
            if n.kind == "mem_free" and n.info in allocs:
                allocs.remove(n.info)
        return allocs

    def launch(self, ge: GraphExec, stream: Any) -> None:
        """``cudaGraphLaunch``: replay every node in order (their callables run again); time paced per node.

        Raises cudaErrorStreamCaptureUnsupported into a capturing stream (rule graph_launch_in_capture),
        cudaErrorInvalidValue while the previous launch's allocations are unfreed (rule graph_launch_unfreed),
        cudaErrorStreamCaptureImplicit (legacy stream, blocking capture)."""
        call = "cudaGraphLaunch"
        with self.rt.lock:
            s = self._exec_stream(ge, stream, call, "an instantiated sim graph")
            if s is self.rt.legacy and self.rt.live:
                self.rt.escapes.append((call, f"graph {ge.graph.id}"))
            if self._launch_checks(ge, s, call, "graph_launch_in_capture"):
                return
            if self.rt.live:
                self.rt._applied("legacy_escape" if s is self.rt.legacy else "uncaptured_stream", call)
            if ge.unfreed:
                if not ge.flags & FLAG_AUTO_FREE_ON_LAUNCH:
                    self.rt._fail("graph_launch_unfreed", call, (), f"{len(ge.unfreed)} allocation(s) of the previous "
                                                                 "launch not freed")
                ge.unfreed = []  # rule graph_auto_free
            submit = self.rt.dev.host(self.rt.cal.host_graph_launch_us)
            ge.launches += 1
            pace = submit
            prev_end = self.rt._earliest(s, submit)
            step = self.rt.cal.graph_node_us
            gid = ge.graph.id
            compute = self.rt.compute
            for c in self._conditionals(ge.graph.nodes):  # rule conditional_default
                c.info.start_launch()
                self.rt._applied("conditional_default" if c.info.handle.assign_default else "set_conditional", call)
            for n in self._flat(ge.graph.nodes):
                if n.fn is not None and (compute or getattr(n.fn, "always", False)):
                    n.fn()
                if n.kind == "conditional":  # the device evaluates it before its body can start (set_conditional)
                    self.rt._applied("set_conditional", call)
                    prev_end = max(pace, prev_end) + self.rt.cal.graph_conditional_us
                if n.kind == "event_record" and isinstance(n.info, SimEvent):  # rule event_record_external
                    ev = n.info
                    ev.capture, ev.tail, ev.stream = None, (), s
                    ev.time_us = max(pace, prev_end)
                if n.kind in ("kernel", "memset", "memcpy"):
                    us = self.rt.cal.programmatic_us(n.gpu_us) if "programmatic" in n.edges else n.gpu_us
                    _, prev_end = self.rt.dev.run(s.name, n.name, max(pace, prev_end), us, n.kind, gid,
                                               occupies=n.kind != "memcpy")
                pace += step
            s.ready_us = prev_end
            ge.unfreed = [a for a in self._unfreed_allocs(list(self._flat(ge.graph.nodes))) if a is not None]
            if ge.unfreed and ge not in self._launched:
                self._launched.append(ge)

    # ------------------------------------------------------------------ external event nodes
    def event_record_external(self, stream: Any, e: SimEvent) -> None:
        """``cudaEventRecordWithFlags(cudaEventRecordExternal)``: captured, an event record node that records ``e`` at
        every replay (rule event_record_external); eagerly, a plain record."""
        self._external_node("cudaEventRecordWithFlags", "event_record", stream, e,
                            lambda seq: seq is None, self.rt.event_record)

    def stream_wait_event_external(self, stream: Any, e: SimEvent) -> None:
        """``cudaStreamWaitEvent(..., cudaEventWaitExternal)``: captured, an event wait node (rule wait_external);
        eagerly, or on an event of the same capture, a plain wait."""
        self._external_node("cudaStreamWaitEvent", "wait_event", stream, e,
                            lambda seq: seq is None or self.rt._captured(e) is not None, self.rt.stream_wait_event)

    def _external_node(self, call: str, kind: str, stream: Any, e: SimEvent, plain, fallback) -> None:
        """An event node of ``kind`` on ``stream``'s capture, or the plain call ``fallback`` when ``plain(capture)``
        says so; on an invalidated capture the call is dropped (rule after_invalidation)."""
        with self.rt.lock:
            s = self.rt._stream(stream, call)
            seq = s.capture
            if plain(seq):
                fallback(stream, e)
                return
            self.rt.dev.host(self.rt.cal.host_api_us)
            self.rt._append_node(seq, s, call, kind, e.name, None, 0.0, e, rule=None)

    @staticmethod
    def nodes(g: Graph) -> list[dict]:
        return [{"kind": n.kind, "name": n.name} for n in g.nodes]
