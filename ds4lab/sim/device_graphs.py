"""The simulated runtime's conditional nodes, capture into an existing graph and programmatic launches
(:class:`SimDeviceGraphsMixin`, the sim's :class:`~ds4lab.executor.device_graphs.DeviceGraphApi`). Every call follows a
rule of :mod:`ds4lab.sim.rules_device`; stages and semantics: ``docs/capture-stages.md``, "The sim"."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..executor.device_graphs import PREDECESSOR_RULES, DeviceGraphApi, check_kind, size_allowed
from ..executor.kernel_pdl import require_device_half
from ..errors import CudaError
from .graphs import Graph, _check_live
from .objects import Node

#: A WHILE body run more often than this in one replay is taken for a condition nobody clears.
WHILE_LIMIT = 1 << 16


class SimCondHandle:
    """A conditional handle (``cudaGraphConditionalHandle``): the graph it was created for, its default and flag, and
    the value a condition-setting kernel last set. ``arg`` is the kernel argument."""

    __slots__ = ("id", "graph", "default", "assign_default", "value")

    def __init__(self, hid: int, graph: Graph, default: int, assign_default: bool) -> None:
        self.id, self.graph = hid, graph
        self.default, self.assign_default = int(default) & 0xFFFFFFFF, bool(assign_default)
        self.value = self.default

    @property
    def arg(self) -> np.uint64:
        return np.uint64(self.id)

    def set(self, value) -> None:
        """``cudaGraphSetConditional(handle, value)`` (an ``unsigned int``)."""
        self.value = int(value) & 0xFFFFFFFF

    def __repr__(self) -> str:
        return f"<sim conditional handle {self.id} of graph {self.graph.id}: {self.value}>"


class CondInfo:
    """What a conditional node holds: its handle, its type (``if``, ``while``, ``switch``) and its bodies."""

    __slots__ = ("handle", "kind", "bodies")

    def __init__(self, handle: SimCondHandle, kind: str, bodies: list) -> None:
        self.handle, self.kind, self.bodies = handle, kind, bodies

    def start_launch(self) -> None:
        """A launch of the graph begins (rule conditional_default)."""
        if self.handle.assign_default:
            self.handle.value = self.handle.default

    def run_bodies(self):
        """The bodies a replay runs when it reaches the node, one at a time (a WHILE body's own kernels may clear the
        condition before it is read again). Raises CudaError (cudaErrorLaunchFailure stands for a hung launch) for a
        WHILE that runs :data:`WHILE_LIMIT` times."""
        h, b = self.handle, self.bodies
        if self.kind == "if":
            if h.value:
                yield b[0]
            elif len(b) == 2:
                yield b[1]
        elif self.kind == "switch":
            if h.value < len(b):
                yield b[h.value]
        else:
            n = 0
            while h.value:
                n += 1
                if n > WHILE_LIMIT:
                    raise CudaError("cudaErrorLaunchFailure", "cudaGraphLaunch",
                                    f"a WHILE node ran its body {WHILE_LIMIT} times: its condition is never cleared")
                yield b[0]


def _graph_reaches(graph: Graph, owner: Graph) -> bool:
    """Whether ``graph`` is ``owner`` or one of its bodies, at any depth."""
    g = graph
    while g is not None:
        if g is owner:
            return True
        g = g.parent
    return False


def _node_indices(nodes, pool: list, call: str, not_ours) -> list[int]:
    """The indices of ``nodes`` in ``pool``; cudaErrorInvalidValue (``not_ours(node)``) for one that is not there."""
    nodes = list(nodes)
    for n in nodes:
        if not isinstance(n, Node) or n.idx >= len(pool) or pool[n.idx] is not n:
            raise CudaError("cudaErrorInvalidValue", call, not_ours(n))
    return [n.idx for n in nodes]


class SimDeviceGraphsMixin(DeviceGraphApi):
    """:class:`DeviceGraphApi` on the simulated runtime (mixed into :class:`~ds4lab.sim.backend.SimBackend`: it uses
    the backend's ``rt`` and ``launch``)."""

    def _active_capture(self, stream, call: str):
        rt = self.rt
        s = rt._stream(stream, call)
        seq = s.capture
        if seq is None:
            raise CudaError("cudaErrorIllegalState", call, f"{s.name} is not capturing: no graph to add to")
        if seq.status != "active":
            raise CudaError("cudaErrorStreamCaptureInvalidated", call, f"capture {seq.id} was invalidated by {seq.why}")
        return s, seq

    def capture_dependencies(self, stream) -> tuple[Any, list]:
        call = "cudaStreamGetCaptureInfo"
        rt = self.rt
        with rt.lock:
            s, seq = self._active_capture(stream, call)
            if seq.graph is None:
                seq.graph = Graph(next(rt._ids), seq.nodes, seq.id)
            rt._applied("capture_graph_query", call)
            rt.dev.host(rt.cal.host_api_us)
            return seq.graph, [seq.nodes[i] for i in s.tail]

    def conditional_handle_create(self, graph, default: int = 0, assign_default: bool = True) -> SimCondHandle:
        call = "cudaGraphConditionalHandleCreate"
        rt = self.rt
        with rt.lock:
            _check_live(graph, call)
            rt._applied("conditional_handle", call)
            rt.dev.host(rt.cal.host_api_us)
            return SimCondHandle(next(rt._ids), graph, default, assign_default)

    def graph_add_conditional_node(self, graph, deps, handle, kind: str, size: int) -> tuple[Any, list]:
        call = "cudaGraphAddNode"
        rt = self.rt
        check_kind(kind)
        with rt.lock:
            _check_live(graph, call)
            if not isinstance(handle, SimCondHandle):
                raise CudaError("cudaErrorInvalidValue", call, f"{handle!r} is not a sim conditional handle")
            if not size_allowed(kind, int(size)):
                rt._fail("conditional_node_size", call, (), f"{kind} with {size} bodies")
            if not _graph_reaches(graph, handle.graph):
                rt._fail("conditional_handle_other_graph", call, (),
                         f"handle {handle.id} belongs to graph {handle.graph.id}, not to graph {graph.id} or above it")
            idx = _node_indices(deps, graph.nodes, call,
                                lambda d: f"dependency {d!r} is not a node of graph {graph.id}")
            bodies = [Graph(next(rt._ids), [], 0, parent=graph) for _ in range(int(size))]
            node = Node(len(graph.nodes), "conditional", kind, None, tuple(idx), 0.0, "",
                        CondInfo(handle, kind, bodies))
            graph.nodes.append(node)
            rt._applied("conditional_node", call)
            rt.dev.host(rt.cal.host_api_us)
            return node, bodies

    def stream_update_capture_dependencies(self, stream, nodes, replace: bool = True) -> None:
        call = "cudaStreamUpdateCaptureDependencies"
        rt = self.rt
        with rt.lock:
            s = rt._stream(stream, call)
            seq = s.capture
            if seq is None:
                rt._fail("capture_dependencies_update_idle", call, (), f"{s.name} is not capturing")
            rt.dev.host(rt.cal.host_api_us)
            if seq.status != "active":
                rt._on_invalidated(seq, call)
                return
            idx = _node_indices(nodes, seq.nodes, call, lambda n: f"{n!r} is not a node of capture {seq.id}'s graph")
            s.tail = tuple(idx) if replace else tuple(sorted(set(s.tail) | set(idx)))
            rt._applied("capture_dependencies_update", call)

    def begin_capture_to_graph(self, stream, graph, mode: str = "thread_local") -> None:
        call = "cudaStreamBeginCaptureToGraph"
        rt = self.rt
        with rt.lock:
            _check_live(graph, call)
            rt.begin_capture(stream, mode)  # the rules of cudaStreamBeginCapture (legacy stream, twice, mode)
            seq = rt._stream(stream, call).capture
            seq.graph, seq.nodes = graph, graph.nodes
            if not graph.capture_id:
                graph.capture_id = seq.id
            rt._applied("capture_to_graph", call)

    def end_capture_to_graph(self, stream):
        return self.rt.end_capture(stream)

    def launch_programmatic(self, stream, name, grid, block, args, shared, ref, nbytes=0, *,
                            predecessor: str = "kernel") -> bool:
        call = "cuLaunchKernelEx"
        if predecessor not in PREDECESSOR_RULES:
            raise ValueError(f"predecessor={predecessor!r}: one of {', '.join(PREDECESSOR_RULES)}")
        require_device_half(name)
        rt = self.rt
        with rt.lock:
            s = rt._stream(stream, call)
            seq = s.capture
            captured = seq is not None and seq.status == "active"
            after_kernel = captured and len(s.tail) == 1 and seq.nodes[s.tail[0]].kind == "kernel"
            programmatic = after_kernel if (captured and predecessor == "kernel") else True
            before = len(seq.nodes) if captured else 0
            self.launch(stream, name, grid, block, args, shared, ref, nbytes)
            if seq is None:
                rt._applied("programmatic_eager", call)
            elif programmatic and len(seq.nodes) > before:
                if after_kernel:
                    seq.nodes[-1].edges = ("programmatic",)
                    rt._applied("programmatic_edge", call)
                else:
                    rt._applied("programmatic_after_other", call)
            return programmatic

    def prepare_device_kernels(self, names=None, programmatic: bool = False) -> None:
        """Nothing to compile on the sim."""

    def graph_node_kinds(self, graph) -> list[str]:
        if not isinstance(graph, Graph):
            raise CudaError("cudaErrorInvalidValue", "cudaGraphGetNodes", f"{graph!r} is not a sim graph")
        return [n.kind for n in graph.nodes]

    def graph_edges(self, graph) -> list[tuple[str, str, str]]:
        if not isinstance(graph, Graph):
            raise CudaError("cudaErrorInvalidValue", "cudaGraphGetEdges", f"{graph!r} is not a sim graph")
        nodes = graph.nodes
        return [(nodes[d].kind, n.kind, n.edges[j] if j < len(n.edges) else "default")
                for n in nodes for j, d in enumerate(n.deps)]


__all__ = ["CondInfo", "SimCondHandle", "SimDeviceGraphsMixin", "WHILE_LIMIT"]
