"""A conditional node inside the launcher's capture (:func:`conditional_node`): ask the capture for its graph and
dependencies, add the node, make the capture depend on it, fill each body by capturing a second stream into it
(CUDA Programming Guide, "Conditional Graph Nodes"). ``docs/capture-stages.md``, "Stage 3cc"."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..executor.device_graphs import DeviceGraphApi
from ..errors import RuntimeApiError
from .stream import stream_override


def in_device_graph(L) -> bool:
    """Whether launcher ``L``'s launches now go into a stream capture on a backend that can add conditional nodes to it
    (:class:`~ds4lab.executor.device_graphs.DeviceGraphApi`)."""
    return L.capturing and isinstance(L.backend, DeviceGraphApi)


def conditional_node(L, body_stream: Any, handle: Any, kind: str, bodies: Sequence[Callable[[], None]],
                     mode: str = "thread_local") -> Any:
    """Add a conditional node of ``kind`` (``"if"``, ``"while"``, ``"switch"``) with ``handle`` after the capturing
    stream's work so far, and fill body ``i`` by running ``bodies[i]`` while ``body_stream`` captures into it (each
    body capture ended whatever it raised). Returns the node.

    Raises:
        ValueError: the launcher is not capturing, or its backend cannot build conditional nodes.
        CudaError: any call CUDA (or the sim) refuses."""
    if not in_device_graph(L):
        raise ValueError("conditional_node: the launcher is not capturing on a backend with conditional nodes")
    be = L.backend
    stream = L.stream()
    graph, deps = be.capture_dependencies(stream)
    node, graphs = be.graph_add_conditional_node(graph, deps, handle, kind, len(bodies))
    be.stream_update_capture_dependencies(stream, [node], replace=True)
    for g, body in zip(graphs, bodies):
        be.begin_capture_to_graph(body_stream, g, mode)
        try:
            with stream_override(body_stream):
                body()
        except BaseException:
            try:
                be.end_capture_to_graph(body_stream)
            except RuntimeApiError:
                pass  # the body's own error is the one to report
            raise
        be.end_capture_to_graph(body_stream)
    return node


__all__ = ["conditional_node", "in_device_graph"]
