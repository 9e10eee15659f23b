"""The CUDA runtime and driver calls behind the ``cupy`` backend that CuPy does not wrap the way ds4lab needs them:
CUDA error names from statuses and CuPy's messages, status checks that never swallow a code (CuPy returns some
instead of raising), the captured graph and executable graph objects, and ``cuGraphExecUpdate`` through the driver
so its result info is kept."""

from __future__ import annotations

import ctypes
import functools
import re

def cuda_error_name(message: str, status=None) -> str:
    """The runtime-API error name (``cudaErrorStreamCaptureImplicit``) in a CuPy error message; driver names
    (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``, from kernel launches) are mapped to it."""
    head = message.split(":", 1)[0].strip()
    if head.startswith("cudaError"):
        return head
    if head.startswith("CUDA_ERROR_"):
        return "cudaError" + "".join(w.capitalize() for w in head[len("CUDA_ERROR_"):].split("_"))
    return f"cudaError({status})"


#: ``cudaEventRecordExternal`` and ``cudaEventWaitExternal`` (CUDA Runtime API, "Data types used by
#: CUDA Runtime": both 0x01).
_EVENT_RECORD_EXTERNAL = 0x01
_EVENT_WAIT_EXTERNAL = 0x01

#: ``cudaGraphNodeType`` numbers → ds4lab's node kinds (CUDA Runtime API, enum cudaGraphNodeType).
_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
               7: "event_record", 8: "ext_semaphore_signal", 9: "ext_semaphore_wait", 10: "mem_alloc",
               11: "mem_free", 12: "batch_mem_op", 13: "conditional"}

#: The documented "pending" answer of cudaStreamQuery / cudaEventQuery.
_NOT_READY = 600


def _cudart():
    """``cuda.bindings.runtime`` (cuda-bindings 12/13), or the older ``cuda.cudart``; imported only by the graph calls
    CuPy lacks, so CPU paths never need it. Raises ImportError naming the package."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # type: ignore
        except ImportError:
            raise ImportError("this CUDA graph call needs the cuda-bindings package (pip install cuda-bindings)") from None
    return cudart


#: ``cudaError_t`` numbers of the statuses the capture rules speak of (CUDA Runtime API, "Data types
#: used by CUDA Runtime" → enum cudaError): the last resort of :func:`_error_name`.
_ERROR_NAMES = {1: "cudaErrorInvalidValue", 400: "cudaErrorInvalidResourceHandle", 401: "cudaErrorIllegalState",
                600: "cudaErrorNotReady", 801: "cudaErrorNotSupported", 900: "cudaErrorStreamCaptureUnsupported",
                901: "cudaErrorStreamCaptureInvalidated", 902: "cudaErrorStreamCaptureMerge",
                903: "cudaErrorStreamCaptureUnmatched", 904: "cudaErrorStreamCaptureUnjoined",
                905: "cudaErrorStreamCaptureIsolation", 906: "cudaErrorStreamCaptureImplicit",
                907: "cudaErrorCapturedEvent", 908: "cudaErrorStreamCaptureWrongThread",
                910: "cudaErrorGraphExecUpdateFailure"}


def _error_name(code: int) -> str:
    """The ``cudaError_t`` name of a status number (``cudaErrorStreamCaptureUnsupported`` for 900): CuPy's own message,
    else ``cuda.bindings``' enum, else :data:`_ERROR_NAMES`."""
    try:
        import cupy

        name = cuda_error_name(str(cupy.cuda.runtime.CUDARuntimeError(int(code))), code)
        if name.startswith("cudaError") and not name.startswith("cudaError("):
            return name
    except Exception:
        pass
    try:
        return _cudart().cudaError_t(int(code)).name
    except Exception:
        return _ERROR_NAMES.get(int(code), f"cudaError({int(code)})")


def _ready(status, call: str) -> bool:
    """A query's returned status: 0 → True, cudaErrorNotReady → False, anything else raised by name."""
    code = int(status)
    if code == 0:
        return True
    if code == _NOT_READY:
        return False
    from ..errors import CudaError

    raise CudaError(_error_name(code), call, f"returned status {code}")


def _checked(call: str, res):
    """A ``cuda.bindings`` result ``(err, *values)``: raises CudaError unless ``err`` is success; returns the one value
    (or the tuple of values, or None)."""
    err = res[0] if isinstance(res, tuple) else res
    code = int(err)
    if code != 0:
        from ..errors import CudaError

        raise CudaError(_error_name(code), call, f"status {code}")
    rest = res[1:] if isinstance(res, tuple) else ()
    return rest[0] if len(rest) == 1 else (rest or None)


class _UpdateResultInfo(ctypes.Structure):
    """``CUgraphExecUpdateResultInfo`` (CUDA Driver API, "Data types"): result, errorNode, errorFromNode."""

    _fields_ = [("result", ctypes.c_int), ("errorNode", ctypes.c_void_p), ("errorFromNode", ctypes.c_void_p)]


class _KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS_v2`` (CUDA Driver API, "Data types"): the function, grid, block, dynamic shared
    memory, the argument pointer array, and the CUkernel / context (NULL here)."""

    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.POINTER(ctypes.c_void_p)),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def _libcuda():
    """The CUDA driver library (``libcuda.so.1``, always present beside a driver), with the entry points ds4lab calls
    directly typed."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuGraphExecUpdate_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_UpdateResultInfo)]
    lib.cuGraphExecUpdate_v2.restype = ctypes.c_int
    lib.cuGraphNodeGetType.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.cuGraphNodeGetType.restype = ctypes.c_int
    lib.cuGraphGetNodes.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    lib.cuGraphGetNodes.restype = ctypes.c_int
    lib.cuGraphKernelNodeGetParams_v2.argtypes = [ctypes.c_void_p, ctypes.POINTER(_KernelNodeParams)]
    lib.cuGraphKernelNodeGetParams_v2.restype = ctypes.c_int
    lib.cuGraphExecKernelNodeSetParams_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                      ctypes.POINTER(_KernelNodeParams)]
    lib.cuGraphExecKernelNodeSetParams_v2.restype = ctypes.c_int
    return lib


def _driver_checked(call: str, status: int) -> None:
    """Raise :class:`ds4lab.errors.CudaError` for a driver status other than success (driver and runtime share the
    numbers of the statuses these calls return)."""
    if status:
        from ..errors import CudaError

        raise CudaError(_error_name(status), call, f"status {status}")


def graph_kernel_nodes(graph_handle: int) -> list[tuple[int, int]]:
    """The kernel nodes of a graph as ``(node handle, CUfunction)``, in the order ``cuGraphGetNodes`` returns them (the
    order of their creation: the capture's launch order). Raises CudaError."""
    lib = _libcuda()
    n = ctypes.c_size_t(0)
    _driver_checked("cuGraphGetNodes", lib.cuGraphGetNodes(ctypes.c_void_p(graph_handle), None, ctypes.byref(n)))
    nodes = (ctypes.c_void_p * n.value)()
    _driver_checked("cuGraphGetNodes", lib.cuGraphGetNodes(ctypes.c_void_p(graph_handle), nodes, ctypes.byref(n)))
    out = []
    for node in nodes[: n.value]:
        if _driver_node_type(node) != "kernel":
            continue
        p = _KernelNodeParams()
        _driver_checked("cuGraphKernelNodeGetParams", lib.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node),
                                                                                        ctypes.byref(p)))
        out.append((int(node), int(p.func or 0)))
    return out


def _c_arg(a):
    """One kernel argument as the ctypes value the kernel's parameter holds: a device array → its address; a NumPy
    scalar → the C type of its dtype. Raises TypeError for anything else."""
    import numpy as np

    ptr = getattr(getattr(a, "data", None), "ptr", None)
    if isinstance(ptr, int):
        return ctypes.c_void_p(ptr)
    if isinstance(a, np.generic):
        t = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
             np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
             np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}.get(a.dtype)
        if t is not None:
            return t(a.item())
    raise TypeError(f"kernel argument {a!r} ({type(a).__name__}): not a device array or a NumPy scalar")


def exec_kernel_node_set_params(exec_handle: int, node: int, func: int, grid, block, shared: int, args) -> None:
    """``cuGraphExecKernelNodeSetParams`` (CUDA Driver API; ``cudaGraphExecKernelNodeSetParams`` in the runtime): the
    executable's copy of kernel ``node`` gets ``func``, ``grid``, ``block``, ``shared`` and ``args`` for its next
    launches (the graph's own node is unchanged). Raises CudaError."""
    vals = [_c_arg(a) for a in args]
    ptrs = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    p = _KernelNodeParams(ctypes.c_void_p(func), *map(int, g), *map(int, b), int(shared),
                          ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p)), None, None, None)
    _driver_checked("cuGraphExecKernelNodeSetParams",
                    _libcuda().cuGraphExecKernelNodeSetParams_v2(ctypes.c_void_p(exec_handle), ctypes.c_void_p(node),
                                                                 ctypes.byref(p)))


def _driver_graph_exec_update(exec_handle: int, graph_handle: int) -> tuple[int, int, int]:
    """``cuGraphExecUpdate_v2`` (CUDA Driver API; the runtime's cudaGraphExec_t/cudaGraph_t are the driver's
    CUgraphExec/CUgraph): ``(status, cudaGraphExecUpdateResult, errorNode handle or 0)``. Driver and runtime share
    the status numbers this call returns (910: update failure)."""
    info = _UpdateResultInfo()
    err = _libcuda().cuGraphExecUpdate_v2(ctypes.c_void_p(int(exec_handle)), ctypes.c_void_p(int(graph_handle)),
                                          ctypes.byref(info))
    return int(err), int(info.result), int(info.errorNode or 0)


def _driver_node_type(node: int) -> str | None:
    """``cuGraphNodeGetType`` of a node handle as a ds4lab node kind; None for a NULL node."""
    if not node:
        return None
    t = ctypes.c_int(-1)
    err = _libcuda().cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
    if err != 0:
        return f"unknown (status {err})"
    return _NODE_TYPES.get(t.value, f"cudaGraphNodeType({t.value})")


class _cuda_errors:
    """Context manager: CuPy's ``CUDARuntimeError`` / ``CUDADriverError`` → :class:`ds4lab.errors.CudaError` (the
    runtime-API name, driver names mapped by :func:`cuda_error_name`)."""

    def __init__(self, call: str) -> None:
        self.call = call

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or typ.__name__ not in ("CUDARuntimeError", "CUDADriverError"):
            return False
        from ..errors import CudaError

        raise CudaError(cuda_error_name(str(exc), getattr(exc, "status", None)), self.call, str(exc)) from None


class _OwnedHandle:
    """A CUDA handle destroyed with the object, or at once by :meth:`destroy` (``_DESTROY``: the CuPy runtime function,
    ``_CALL``: the CUDA call it makes, named in errors)."""

    _DESTROY = _CALL = ""

    def destroy(self) -> None:
        """Destroy the handle now; raises CudaError on failure (a second call does nothing)."""
        if self.destroyed:
            return
        with _cuda_errors(self._CALL):
            getattr(self.cp.cuda.runtime, self._DESTROY)(self.handle)
        self.destroyed = True

    def __del__(self):
        if getattr(self, "destroyed", True):
            return
        try:
            getattr(self.cp.cuda.runtime, self._DESTROY)(self.handle)
        except Exception:  # interpreter shutdown: CuPy may be gone; nothing to report to
            pass


class CupyGraph(_OwnedHandle):
    """A captured CUDA graph (``cudaGraph_t``), destroyed with the object."""

    _DESTROY, _CALL = "graphDestroy", "cudaGraphDestroy"

    _KINDS = {"KERNEL": "kernel", "MEMSET": "memset", "MEMCPY": "memcpy", "EVENT_RECORD": "event_record",
              "WAIT_EVENT": "wait_event", "MEM_ALLOC": "mem_alloc", "MEM_FREE": "mem_free", "EMPTY": "empty",
              "HOST": "host", "EVENT": "event_record", "WAIT": "wait_event",
              "EVENT_WAIT": "wait_event"}  # the DOT dump's label of an external event wait node (H200)

    def __init__(self, cp, handle: int) -> None:
        self.cp, self.handle = cp, handle
        self.destroyed = False
        self.last_node = None  # the last node added by ds4lab (graphs from cudaGraphCreate)

    def dot(self) -> str:
        """The graph as Graphviz text (``cudaGraphDebugDotPrint``, verbose)."""
        import os
        import tempfile

        fd, path = tempfile.mkstemp(suffix=".dot")
        os.close(fd)
        try:
            self.cp.cuda.runtime.graphDebugDotPrint(self.handle, path, 1 << 0)
            with open(path) as f:
                return f.read()
        finally:
            os.unlink(path)

    def nodes(self, known_kernels=()) -> list[dict]:
        """Node kinds (and kernel names among ``known_kernels``), parsed from the DOT dump."""
        out = []
        for label in re.findall(r'label="((?:[^"\\]|\\.)*)"', self.dot()):
            m = re.search(r"[A-Z][A-Z_]{2,}", label)
            if not m:
                continue
            kind = self._KINDS.get(m.group(0), m.group(0).lower())
            name = next((k for k in known_kernels if re.search(rf"\b{k}\b", label)), "") if kind == "kernel" else ""
            out.append({"kind": kind, "name": name})
        return out


class CupyGraphExec(_OwnedHandle):
    """An instantiated graph (``cudaGraphExec_t``), destroyed with the object."""

    _DESTROY, _CALL = "graphExecDestroy", "cudaGraphExecDestroy"

    def __init__(self, cp, handle: int, graph: CupyGraph) -> None:
        self.cp, self.handle, self.graph = cp, handle, graph
        self.destroyed = False
        #: ``(node, CUfunction)`` of the source graph's kernel nodes, read on the first node update
        self.kernel_nodes: list | None = None
