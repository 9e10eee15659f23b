"""Conditional nodes, capture into an existing graph, graph queries and ``cuLaunchKernelEx`` through ``cuda-bindings``,
for the ``cupy`` backend's :class:`~ds4lab.executor.device_graphs.DeviceGraphApi`. Each function takes the binding
module it calls (``rt`` / ``drv``, so a test can hand it a fake) and raises :class:`ds4lab.errors.CudaError` for any
status but success. :func:`edge_variant` picks CUDA 12.3-12.9's ``_v2``/``_v3`` edge-data calls or CUDA 13's plain
names; conditional nodes need CUDA 12.4 (IF, WHILE) and 12.8 (IF with two bodies, SWITCH)."""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

from .cupy_runtime import _NODE_TYPES, _c_arg, _checked, _error_name
from ..executor.device_graphs import COND_KINDS, check_kind

#: cudaStreamCaptureStatus (CUDA Runtime API, enum): None 0, Active 1, Invalidated 2.
CAPTURE_STATUS = {0: "none", 1: "active", 2: "invalidated"}
#: cudaGraphDependencyType: Default 0, Programmatic 1.
EDGE_TYPES = {0: "default", 1: "programmatic"}
#: cudaStreamCaptureMode in the order ds4lab names the modes (global 0, thread-local 1, relaxed 2).
CAPTURE_MODE_INDEX = {"global": 0, "thread_local": 1, "relaxed": 2}


def _int(v) -> int:
    """An enum member, a handle object with ``__int__`` or bytes of one char, as an int."""
    if isinstance(v, (bytes, bytearray)):
        return v[0] if v else 0
    return int(getattr(v, "value", v))


def edge_variant(rt, name: str, suffix: str):
    """The binding of ``name`` that takes edge data: ``name + suffix`` (cuda-bindings 12.3 … 12.9), else ``name``
    (cuda-bindings 13, where the plain name has that signature)."""
    return getattr(rt, name + suffix, None) or getattr(rt, name)


def capture_info(rt, stream_ptr: int) -> tuple[str, int, list[int], list[str]]:
    """``cudaStreamGetCaptureInfo`` with edge data: ``(status, graph handle, dependency nodes, their edge types)``;
    graph and dependencies only meaningful while the status is ``"active"`` (RT: "Valid data (other than capture
    status) is returned only if ... the returned capture status is Active")."""
    fn = edge_variant(rt, "cudaStreamGetCaptureInfo", "_v3")
    vals = _checked("cudaStreamGetCaptureInfo", fn(rt.cudaStream_t(stream_ptr)))
    status, _cid, graph, deps, edges, n = vals
    st = CAPTURE_STATUS.get(_int(status), f"status {_int(status)}")
    if st != "active":
        return st, 0, [], []
    n = int(n)
    nodes = [int(d) for d in list(deps or [])[:n]]
    kinds = [EDGE_TYPES.get(_int(e.type), "other") for e in list(edges or [])[:n]] if edges else ["default"] * n
    return st, int(graph), nodes, kinds


def conditional_handle_create(rt, graph: int, default: int = 0, assign_default: bool = True) -> int:
    """``cudaGraphConditionalHandleCreate(graph, default, flags)`` (flags ``cudaGraphCondAssignDefault`` with
    ``assign_default``, else 0): the handle's 64-bit value."""
    flags = _int(rt.cudaGraphConditionalHandleFlags.cudaGraphCondAssignDefault) if assign_default else 0
    h = _checked("cudaGraphConditionalHandleCreate",
                 rt.cudaGraphConditionalHandleCreate(rt.cudaGraph_t(int(graph)), int(default), int(flags)))
    return int(h)


def add_conditional_node(rt, graph: int, deps: Sequence[int], handle: int, kind: str, size: int) -> tuple[int, list[int]]:
    """``cudaGraphAddNode`` of a conditional node (handle, type, size) after ``deps``: ``(node, body graph handles)``,
    the bodies read from the CUDA-owned ``phGraph_out`` only after the call succeeded.

    Raises:
        ValueError: an unknown ``kind``.
        CudaError: CUDA's status (cudaErrorInvalidValue for a size ``kind`` does not allow)."""
    check_kind(kind)
    p = rt.cudaGraphNodeParams()
    p.type = rt.cudaGraphNodeType.cudaGraphNodeTypeConditional
    c = p.conditional
    c.handle = rt.cudaGraphConditionalHandle(int(handle))
    c.type = rt.cudaGraphConditionalNodeType(COND_KINDS[kind])
    c.size = int(size)
    fn = edge_variant(rt, "cudaGraphAddNode", "_v2")
    dep = [rt.cudaGraphNode_t(int(d)) for d in deps]
    node = _checked("cudaGraphAddNode", fn(rt.cudaGraph_t(int(graph)), dep, None, len(dep), p))
    bodies = [int(g) for g in p.conditional.phGraph_out]
    return int(node), bodies


def update_capture_dependencies(rt, stream_ptr: int, nodes: Sequence[int], replace: bool = True) -> None:
    """``cudaStreamUpdateCaptureDependencies`` (``cudaStreamSetCaptureDependencies`` with ``replace``, else
    ``cudaStreamAddCaptureDependencies``), default edge data."""
    flags = rt.cudaStreamUpdateCaptureDependenciesFlags
    flag = _int(flags.cudaStreamSetCaptureDependencies if replace else flags.cudaStreamAddCaptureDependencies)
    fn = edge_variant(rt, "cudaStreamUpdateCaptureDependencies", "_v2")
    dep = [rt.cudaGraphNode_t(int(n)) for n in nodes]
    _checked("cudaStreamUpdateCaptureDependencies", fn(rt.cudaStream_t(stream_ptr), dep, None, len(dep), flag))


def begin_capture_to_graph(rt, stream_ptr: int, graph: int, mode: str = "thread_local") -> None:
    """``cudaStreamBeginCaptureToGraph(stream, graph, no dependencies, mode)``; ValueError for an unknown mode."""
    if mode not in CAPTURE_MODE_INDEX:
        raise ValueError(f"capture mode {mode!r}; choose one of: {', '.join(CAPTURE_MODE_INDEX)}")
    _checked("cudaStreamBeginCaptureToGraph",
             rt.cudaStreamBeginCaptureToGraph(rt.cudaStream_t(stream_ptr), rt.cudaGraph_t(int(graph)), [], [], 0,
                                              rt.cudaStreamCaptureMode(CAPTURE_MODE_INDEX[mode])))


def end_capture(rt, stream_ptr: int) -> int:
    """``cudaStreamEndCapture``: the graph handle it returns."""
    return int(_checked("cudaStreamEndCapture", rt.cudaStreamEndCapture(rt.cudaStream_t(stream_ptr))))


def node_kind(rt, node: int) -> str:
    """``cudaGraphNodeGetType`` as ds4lab's node kind (``kernel``, ``conditional``, ...)."""
    t = _checked("cudaGraphNodeGetType", rt.cudaGraphNodeGetType(rt.cudaGraphNode_t(int(node))))
    return _NODE_TYPES.get(_int(t), f"cudaGraphNodeType({_int(t)})")


def graph_nodes(rt, graph: int) -> list[int]:
    """``cudaGraphGetNodes`` (count, then the nodes): node handles in the graph's order."""
    g = rt.cudaGraph_t(int(graph))
    _, n = _checked("cudaGraphGetNodes", rt.cudaGraphGetNodes(g, 0))
    if not int(n):
        return []
    nodes, n = _checked("cudaGraphGetNodes", rt.cudaGraphGetNodes(g, int(n)))
    return [int(x) for x in list(nodes)[:int(n)]]


def graph_edges(rt, graph: int) -> list[tuple[int, int, str]]:
    """``cudaGraphGetEdges`` with edge data (count, then the edges): ``(from node, to node, type)``."""
    fn = edge_variant(rt, "cudaGraphGetEdges", "_v2")
    g = rt.cudaGraph_t(int(graph))
    *_, n = _checked("cudaGraphGetEdges", fn(g, 0))
    if not int(n):
        return []
    frm, to, data, n = _checked("cudaGraphGetEdges", fn(g, int(n)))
    n = int(n)
    types = [EDGE_TYPES.get(_int(e.type), "other") for e in list(data)[:n]] if data else ["default"] * n
    return [(int(a), int(b), t) for a, b, t in zip(list(frm)[:n], list(to)[:n], types)]


def _driver_checked(call: str, res) -> None:
    err = res[0] if isinstance(res, tuple) else res
    code = _int(err)
    if code:
        from ..errors import CudaError

        raise CudaError(_error_name(code), call, f"status {code}")


def launch_config(drv, grid: Sequence[int], block: Sequence[int], shared: int, stream_ptr: int,
                  programmatic: bool) -> Any:
    """A ``CUlaunchConfig`` (grid, block, dynamic shared bytes, stream) with, when ``programmatic``, one attribute:
    ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` = ``programmaticStreamSerializationAllowed`` 1 (CUDA
    Driver API, cuLaunchKernelEx). Raises ValueError for a grid or block of more than three dimensions."""
    if len(grid) > 3 or len(block) > 3:
        raise ValueError(f"grid {tuple(grid)} / block {tuple(block)}: at most three dimensions")
    g = tuple(int(x) for x in grid) + (1,) * (3 - len(grid))
    b = tuple(int(x) for x in block) + (1,) * (3 - len(block))
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
    cfg.sharedMemBytes = int(shared)
    cfg.hStream = drv.CUstream(int(stream_ptr))
    if programmatic:
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [a]
        cfg.numAttrs = 1
    else:
        cfg.numAttrs = 0
    return cfg


def _kernel_arg(a):
    """One kernel argument as the ctypes value its parameter holds (``cupy_runtime._c_arg``), ``None`` as a NULL device
    pointer (8 zero bytes, as CuPy's own launches pass it)."""
    return ctypes.c_void_p(None) if a is None else _c_arg(a)


def launch_kernel_ex(drv, func: int, grid: Sequence[int], block: Sequence[int], shared: int, stream_ptr: int,
                     args: Sequence, programmatic: bool) -> None:
    """``cuLaunchKernelEx(config, f, kernelParams, NULL)``, ``args`` (device arrays, NumPy scalars, ``None`` for NULL)
    packed as the ``void*`` array of pointers to their values.

    Raises:
        TypeError: an argument that is none of those.
        CudaError: the launch's status."""
    cfg = launch_config(drv, grid, block, shared, stream_ptr, programmatic)
    vals = [_kernel_arg(a) for a in args]
    ptrs = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    _driver_checked("cuLaunchKernelEx", drv.cuLaunchKernelEx(cfg, drv.CUfunction(int(func)), ctypes.addressof(ptrs), 0))


__all__ = ["CAPTURE_MODE_INDEX", "CAPTURE_STATUS", "EDGE_TYPES", "add_conditional_node", "begin_capture_to_graph",
           "capture_info", "conditional_handle_create", "edge_variant", "end_capture", "graph_edges", "graph_nodes",
           "launch_config", "launch_kernel_ex", "node_kind", "update_capture_dependencies"]
