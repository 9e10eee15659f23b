"""The CUDA runtime and driver calls behind the ``cupy`` backend that CuPy does not wrap the way
ds4lab needs them: CUDA error names from statuses and CuPy's messages, status checks that never
swallow a code (CuPy returns some instead of raising), the captured graph and executable graph
objects, and ``cuGraphExecUpdate`` through the driver so its result info is kept."""

from __future__ import annotations

import ctypes
import functools
import re

def cuda_error_name(message: str, status=None) -> str:
    """The runtime-API error name (``cudaErrorStreamCaptureImplicit``) in a CuPy error message;
    driver names (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``, from kernel launches) are mapped to it."""
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
    """``cuda.bindings.runtime`` (cuda-bindings 12/13), or the older ``cuda.cudart``; imported only by
    the graph calls CuPy lacks, so CPU paths never need it. Raises ImportError naming the package."""
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
    """The ``cudaError_t`` name of a status number (``cudaErrorStreamCaptureUnsupported`` for 900):
    CuPy's own message, else ``cuda.bindings``' enum, else :data:`_ERROR_NAMES`."""
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
    """A ``cuda.bindings`` result ``(err, *values)``: raises CudaError unless ``err`` is success;
    returns the one value (or the tuple of values, or None)."""
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


@functools.lru_cache(maxsize=1)
def _libcuda():
    """The CUDA driver library (``libcuda.so.1``, always present beside a driver), with the two entry
    points ds4lab calls directly typed."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuGraphExecUpdate_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_UpdateResultInfo)]
    lib.cuGraphExecUpdate_v2.restype = ctypes.c_int
    lib.cuGraphNodeGetType.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.cuGraphNodeGetType.restype = ctypes.c_int
    return lib


def _driver_graph_exec_update(exec_handle: int, graph_handle: int) -> tuple[int, int, int]:
    """``cuGraphExecUpdate_v2`` (CUDA Driver API; the runtime's cudaGraphExec_t/cudaGraph_t are the
    driver's CUgraphExec/CUgraph): ``(status, cudaGraphExecUpdateResult, errorNode handle or 0)``.
    Driver and runtime share the status numbers this call returns (910: update failure)."""
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
    """Context manager: CuPy's ``CUDARuntimeError`` / ``CUDADriverError`` → :class:`ds4lab.errors.CudaError`
    (the runtime-API name, driver names mapped by :func:`cuda_error_name`)."""

    def __init__(self, call: str) -> None:
        self.call = call

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or typ.__name__ not in ("CUDARuntimeError", "CUDADriverError"):
            return False
        from ..errors import CudaError

        raise CudaError(cuda_error_name(str(exc), getattr(exc, "status", None)), self.call, str(exc)) from None


class CupyGraph:
    """A captured CUDA graph (``cudaGraph_t``), destroyed with the object."""

    _KINDS = {"KERNEL": "kernel", "MEMSET": "memset", "MEMCPY": "memcpy", "EVENT_RECORD": "event_record",
              "WAIT_EVENT": "wait_event", "MEM_ALLOC": "mem_alloc", "MEM_FREE": "mem_free", "EMPTY": "empty",
              "HOST": "host", "EVENT": "event_record", "WAIT": "wait_event",
              "EVENT_WAIT": "wait_event"}  # the DOT dump's label of an external event wait node (H200)

    def __init__(self, cp, handle: int) -> None:
        self.cp, self.handle = cp, handle
        self.destroyed = False
        self.last_node = None  # the last node added by ds4lab (graphs from cudaGraphCreate)

    def destroy(self) -> None:
        """``cudaGraphDestroy`` now; raises CudaError on failure (a second call does nothing)."""
        if self.destroyed:
            return
        with _cuda_errors("cudaGraphDestroy"):
            self.cp.cuda.runtime.graphDestroy(self.handle)
        self.destroyed = True

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

    def __del__(self):
        if self.destroyed:
            return
        try:
            self.cp.cuda.runtime.graphDestroy(self.handle)
        except Exception:  # interpreter shutdown: CuPy may be gone; nothing to report to
            pass


class CupyGraphExec:
    """An instantiated graph (``cudaGraphExec_t``), destroyed with the object."""

    def __init__(self, cp, handle: int, graph: CupyGraph) -> None:
        self.cp, self.handle, self.graph = cp, handle, graph
        self.destroyed = False

    def destroy(self) -> None:
        """``cudaGraphExecDestroy`` now; raises CudaError on failure (a second call does nothing)."""
        if self.destroyed:
            return
        with _cuda_errors("cudaGraphExecDestroy"):
            self.cp.cuda.runtime.graphExecDestroy(self.handle)
        self.destroyed = True

    def __del__(self):
        if self.destroyed:
            return
        try:
            self.cp.cuda.runtime.graphExecDestroy(self.handle)
        except Exception:  # interpreter shutdown: CuPy may be gone; nothing to report to
            pass
