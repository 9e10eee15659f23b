"""The backend contract: what the launch layer, the model and the jobs may ask of a backend, as abstract classes (a
backend that forgets a method fails when it is built).

* :class:`Executor`: memory, weights, launches, copies, streams, events and the capabilities a job reads; every backend
(``cupy``, ``sim``, ``numpy``).
* :class:`RuntimeApi`: capture, graphs, event timing, allocation, queries; ``cupy`` and ``sim`` (:func:`can_capture`).
* :class:`ModeledTime`: a cost model's time (the sim); every figure from it is MODELED.
* :class:`DeviceClock`: a readable GPU clock (``cupy``).

The launcher, not the backend, decides the stream (:mod:`ds4lab.capture.stream`). Runtime calls raise
:class:`ds4lab.errors.CudaError` or :class:`ds4lab.errors.CupyRefusal`, on the GPU and the sim alike. Sources: CUDA
Runtime API, "Stream", "Event", "Graph" and "Memory Management"."""

from __future__ import annotations

import abc
import time
from typing import Any, Callable

import numpy as np


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (no CuPy, no usable GPU); the message says which."""


def check_all_reduce(send, recv, op: str) -> None:
    """The all-reduce ds4lab's collectives make (NCCL's ``ncclAllReduce`` on the GPU, the sim's model of it): ``op``
    ``sum`` over float32 buffers of one size. Raises ValueError naming what differs."""
    if op != "sum":
        raise ValueError(f"all_reduce: op={op!r}; ds4lab's collectives use ncclSum")
    if np.dtype(send.dtype) != np.float32 or np.dtype(recv.dtype) != np.float32 or send.size != recv.size:
        raise ValueError(f"all_reduce: float32 buffers of one size, got {send.dtype}[{send.size}] → "
                         f"{recv.dtype}[{recv.size}]")


class Executor(abc.ABC):
    """Runs a decode token. Arrays are the backend's own (``numpy``/``cupy``/sim arena views).

    Capabilities (class or instance attributes; every backend has all of them):

    ``name``            the name used on the command line and in results
    ``is_gpu``          launches run on a real GPU
    ``measures_time``   its times are measurements (CUDA events, CUPTI)
    ``models_time``     its times are modeled from a calibration (the sim): label them MODELED
    ``timing_only``     it models time without computing any number (the sim's phantom mode)
    ``calibration``     the cost-model calibration in use (``name``, ``path``, ``sha256``, …) or None
    ``xp``              the array module (``numpy`` or ``cupy``)"""

    name: str = "base"
    is_gpu: bool = False
    measures_time: bool = False
    models_time: bool = False
    timing_only: bool = False
    calibration: dict | None = None
    xp: Any = np

    # --- memory
    @abc.abstractmethod
    def empty(self, shape, dtype) -> Any:
        """A new uninitialized array of ``shape`` and ``dtype`` (pool allocation on a GPU)."""

    @abc.abstractmethod
    def zeros(self, shape, dtype) -> Any:
        """A new zero-filled array."""

    @abc.abstractmethod
    def from_host(self, a: np.ndarray) -> Any:
        """A device copy of host array ``a`` (synchronous)."""

    @abc.abstractmethod
    def to_host(self, a: Any) -> np.ndarray:
        """A host copy of ``a`` (synchronous)."""

    # --- weights (see ds4lab.token.weights for the formats)
    @abc.abstractmethod
    def make_weight(self, spec) -> Any:
        """Materialize one :class:`ds4lab.token.weights.WeightSpec` (QTensor, bank or fp32 array)."""

    @abc.abstractmethod
    def fill_f32(self, out: Any, name: str, scale: float, offset: float, seed: int) -> None:
        """Fill an existing fp32 buffer from the hash generator (KV cache prefill)."""

    # --- launches (called by the Launcher only)
    @abc.abstractmethod
    def launch(self, stream: Any, name: str, grid: tuple, block: tuple, args: tuple,
               shared: int, ref: Callable[[], None], nbytes: int = 0) -> None:
        """Launch kernel ``name`` on ``stream``; ``ref`` computes the same with NumPy (CPU backends)."""

    @abc.abstractmethod
    def memset_async(self, stream: Any, buf: Any, value: int) -> None:
        """``cudaMemsetAsync`` on ``stream``."""

    @abc.abstractmethod
    def memset_sync(self, buf: Any, value: int) -> None:
        """``cudaMemset``: synchronous, on the legacy stream (a capture hazard: never in a graph)."""

    @abc.abstractmethod
    def copy_h2d(self, stream: Any, dst: Any, src: np.ndarray) -> None:
        """``cudaMemcpyAsync`` host to device on ``stream``."""

    @abc.abstractmethod
    def event_record(self, stream: Any, event: Any) -> None:
        """``cudaEventRecord`` on ``stream``."""

    # --- streams and events
    @abc.abstractmethod
    def new_stream(self, non_blocking: bool = True) -> Any:
        """A new stream (``cudaStreamNonBlocking`` when ``non_blocking``)."""

    @abc.abstractmethod
    def new_event(self) -> Any:
        """A new event (timing enabled)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all device work (``cudaDeviceSynchronize``)."""

    # --- capabilities with a default
    def host_clock_us(self) -> float:
        """The host clock in µs for host work (``time.perf_counter``; the sim's modeled one), never device work."""
        return time.perf_counter() * 1e6

    def free_memory(self) -> tuple[int, int] | None:
        """``(free, total)`` device bytes (``cudaMemGetInfo``), or None where memory is the host's."""
        return None

    def memory_used(self) -> int | None:
        """Device bytes held by ds4lab's allocations, or None where not meaningful."""
        return None

    def release_cached_memory(self) -> None:
        """Give cached pool blocks back to the device (CuPy's pool); nothing elsewhere."""

    def profiler_start(self) -> None:
        """``cudaProfilerStart`` (CUDA Runtime API, "Profiler Control") on a GPU; nothing elsewhere."""

    def profiler_stop(self) -> None:
        """``cudaProfilerStop`` on a GPU; nothing elsewhere."""

    def info(self) -> dict:
        """Provenance: device name, driver, runtime and library versions."""
        return {"backend": self.name}

    @property
    def calibration_name(self) -> str | None:
        """The calibration's ``name`` (None where time is not modeled)."""
        return None if self.calibration is None else str(self.calibration.get("name", "?"))


class RuntimeApi(abc.ABC):
    """Capture, graphs, event timing, allocation and queries (``cupy`` and ``sim``). Streams: backend objects or
    ``LEGACY_STREAM``. Every method raises :class:`ds4lab.errors.CudaError` or ``CupyRefusal``, never returns a
    status."""

    @abc.abstractmethod
    def event_synchronize(self, event: Any) -> None:
        """``cudaEventSynchronize``."""

    @abc.abstractmethod
    def event_query(self, event: Any) -> bool:
        """``cudaEventQuery``: True when complete, False for ``cudaErrorNotReady``."""

    @abc.abstractmethod
    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        """``cudaEventElapsedTime`` in milliseconds."""

    @abc.abstractmethod
    def stream_wait_event(self, stream: Any, event: Any) -> None:
        """``cudaStreamWaitEvent``."""

    @abc.abstractmethod
    def stream_synchronize(self, stream: Any) -> None:
        """``cudaStreamSynchronize``."""

    @abc.abstractmethod
    def stream_query(self, stream: Any) -> bool:
        """``cudaStreamQuery``: True when all work is done, False for ``cudaErrorNotReady``."""

    @abc.abstractmethod
    def per_thread_stream(self) -> Any:
        """CUDA's per-thread default stream (``cudaStreamPerThread``)."""

    @abc.abstractmethod
    def malloc(self, shape, dtype) -> Any:
        """``cudaMalloc`` of a new array, outside any pool (a real allocation every call)."""

    @abc.abstractmethod
    def free(self, buf: Any) -> None:
        """``cudaFree`` of an array from :meth:`malloc`."""

    @abc.abstractmethod
    def malloc_async(self, stream: Any, shape, dtype) -> Any:
        """``cudaMallocAsync`` on ``stream`` (a memory node when captured)."""

    @abc.abstractmethod
    def free_async(self, stream: Any, buf: Any) -> None:
        """``cudaFreeAsync`` on ``stream``."""

    @abc.abstractmethod
    def copy_d2h(self, stream: Any, dst: np.ndarray, src: Any) -> None:
        """``cudaMemcpyAsync`` device to host on ``stream``, into the host array ``dst`` (pageable, or pinned when it
        comes from :meth:`host_alloc`); completes when ``stream`` is synchronized."""

    @abc.abstractmethod
    def memcpy_h2d_sync(self, dst: Any, src: np.ndarray) -> None:
        """``cudaMemcpy`` host to device: synchronous, on the legacy stream whatever the accessor says."""

    @abc.abstractmethod
    def memcpy_d2h_sync(self, dst: np.ndarray, src: Any) -> None:
        """``cudaMemcpy`` device to host into ``dst``: synchronous, on the legacy stream."""

    @abc.abstractmethod
    def host_alloc(self, shape, dtype) -> np.ndarray:
        """``cudaHostAlloc`` (pinned host memory) as a NumPy array; free it with :meth:`free_host`."""

    @abc.abstractmethod
    def free_host(self, arr: np.ndarray) -> None:
        """``cudaFreeHost`` of an array from :meth:`host_alloc`."""

    @abc.abstractmethod
    def host_register(self, arr: np.ndarray) -> None:
        """``cudaHostRegister`` of a host array's memory (page-locks it)."""

    @abc.abstractmethod
    def host_unregister(self, arr: np.ndarray) -> None:
        """``cudaHostUnregister`` of memory registered with :meth:`host_register`."""

    @abc.abstractmethod
    def host_query(self, name: str) -> Any:
        """One host-only runtime or driver query by its API name (one of :data:`ds4lab.executor.base.HOST_QUERIES`): no
        stream work. Returns the answer; raises ValueError for another name, CudaError for a failed call."""

    @abc.abstractmethod
    def blas_create(self) -> Any:
        """``cublasCreate``; raises :class:`ds4lab.errors.LibraryError` (``cublas:<status>``) when cuBLAS refuses."""

    @abc.abstractmethod
    def blas_destroy(self, handle: Any) -> None:
        """``cublasDestroy``."""

    @abc.abstractmethod
    def blas_set_workspace(self, handle: Any, buf: Any) -> None:
        """``cublasSetWorkspace``: the handle's workspace is ``buf`` (device memory made beforehand)."""

    @abc.abstractmethod
    def blas_set_stream(self, handle: Any, stream: Any) -> None:
        """``cublasSetStream``."""

    @abc.abstractmethod
    def read(self, buf: Any) -> np.ndarray:
        """A synchronous device-to-host read as ``cupy.asnumpy`` does it (refused by CuPy during capture)."""

    @abc.abstractmethod
    def matmul(self, stream: Any, a: Any, b: Any) -> Any:
        """``a @ b`` through CuPy's array API (cuBLAS) on ``stream``; CuPy refuses it during capture."""

    @abc.abstractmethod
    def begin_capture(self, stream: Any, mode: str = "thread_local") -> None:
        """``cudaStreamBeginCapture(stream, mode)``."""

    @abc.abstractmethod
    def end_capture(self, stream: Any) -> Any:
        """``cudaStreamEndCapture``: returns the captured graph."""

    @abc.abstractmethod
    def capture_status(self, stream: Any) -> str:
        """``cudaStreamGetCaptureInfo``: ``"none"``, ``"active"`` or ``"invalidated"``."""

    @abc.abstractmethod
    def graph_nodes(self, graph: Any) -> list[dict]:
        """The nodes of a captured graph: dicts with ``kind`` (kernel, memset, memcpy, event_record, wait_event,
        mem_alloc, mem_free, empty) and ``name`` (kernel name or "")."""

    @abc.abstractmethod
    def graph_instantiate(self, graph: Any, flags: int = 0) -> Any:
        """``cudaGraphInstantiateWithFlags``: an executable graph (``flags``: cudaGraphInstantiateFlags bits,
        AutoFreeOnLaunch 1, Upload 2, DeviceLaunch 4, UseNodePriority 8)."""

    @abc.abstractmethod
    def graph_exec_destroy(self, graph_exec: Any) -> None:
        """``cudaGraphExecDestroy`` now (not when the object is collected)."""

    @abc.abstractmethod
    def graph_create(self) -> Any:
        """``cudaGraphCreate``: an empty graph, for :meth:`graph_add_child`."""

    @abc.abstractmethod
    def graph_add_child(self, graph: Any, child: Any) -> None:
        """``cudaGraphAddChildGraphNode`` after ``graph``'s last added node (``child`` is cloned)."""

    @abc.abstractmethod
    def graph_destroy(self, graph: Any) -> None:
        """``cudaGraphDestroy`` now; executables instantiated from it keep working."""

    @abc.abstractmethod
    def graph_upload(self, graph_exec: Any, stream: Any) -> None:
        """``cudaGraphUpload``: prepare an executable graph on ``stream`` without running it."""

    @abc.abstractmethod
    def graph_exec_kernel_node_set_params(self, graph_exec: Any, index: int, launch: Any) -> None:
        """``cudaGraphExecKernelNodeSetParams``: the executable's ``index``-th kernel node (capture order) takes
        ``launch``'s arguments, grid, block and shared memory for later launches; the graph is unchanged (Programming
        Guide, "Individual node update"). Raises CudaError (cudaErrorInvalidValue: no such kernel node, or another
        function)."""

    @abc.abstractmethod
    def event_record_external(self, stream: Any, event: Any) -> None:
        """``cudaEventRecordWithFlags(cudaEventRecordExternal)``: an event record node when captured."""

    @abc.abstractmethod
    def stream_wait_event_external(self, stream: Any, event: Any) -> None:
        """``cudaStreamWaitEvent(cudaEventWaitExternal)``: an event wait node when captured."""

    @abc.abstractmethod
    def exchange_capture_mode(self, mode: str) -> str:
        """``cudaThreadExchangeStreamCaptureMode``: set the thread's capture mode, return the previous one."""

    @abc.abstractmethod
    def graph_exec_update(self, graph_exec: Any, graph: Any) -> None:
        """``cudaGraphExecUpdate``: the executable takes ``graph``'s arguments (same topology required)."""

    @abc.abstractmethod
    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        """``cudaGraphLaunch`` of an executable graph on ``stream`` (a replay)."""


class ModeledTime(abc.ABC):
    """A backend whose times come from a cost model (the sim): every number from it is MODELED."""

    @abc.abstractmethod
    def modeled_kernel_us(self, kernel: str, nbytes: int) -> float:
        """The cost model's GPU µs for ``kernel`` moving ``nbytes``."""

    @abc.abstractmethod
    def model_context(self, context: int | None) -> float:
        """Price kernels from now on at the cost model's kernel time factor at ``context`` (None:
        ``kernel_time_scale``); returns the factor. Raises ValueError for a context that is not positive."""

    @abc.abstractmethod
    def modeled_copy_GBps(self) -> tuple[float, str]:
        """The cost model's device copy bandwidth (GB/s) and where it comes from."""

    @abc.abstractmethod
    def trace_records(self, since: int = 0) -> tuple[list[tuple], int]:
        """The modeled device timeline: records ``(stream, name, start_us, end_us, kind, graph)`` from absolute index
        ``since`` (dropped ones skipped), and the index to pass next time."""

    @abc.abstractmethod
    def modeled_start_us(self, stream) -> float:
        """When a kernel issued now on ``stream`` would start on the modeled device (µs)."""

    @abc.abstractmethod
    def model_host_work(self, kind: str) -> None:
        """Put ds4lab's own Python work around a runtime call on the modeled host clock: ``graph_call`` (a
        graph-cache launch's keys, lookup, stream choice) or ``node_update`` (planning and packing one kernel node's
        parameters). Raises ValueError for another ``kind``."""


class DeviceClock(abc.ABC):
    """A GPU whose own clock can be read (the ``cupy`` backend)."""

    @abc.abstractmethod
    def globaltimer_steps(self, n: int) -> np.ndarray:
        """``n`` successive update steps of the GPU's ``%globaltimer`` (ns, uint64; ``kernels/timestamp.cu``)."""


#: The host-only queries :meth:`RuntimeApi.host_query` makes, by API name (CUDA Runtime API "Device
#: Management", "Error Handling"; CUDA Driver API "Context Management", "Execution Control", "Occupancy").
HOST_QUERIES = ("cudaGetDevice", "cudaGetLastError", "cudaDeviceGetAttribute", "cuFuncGetAttribute",
                "cuOccupancyMaxActiveBlocksPerMultiprocessor", "cuCtxGetCurrent")


#: The name most of the code uses for "a backend": every backend is an :class:`Executor`.
Backend = Executor


def can_capture(be: Executor) -> bool:
    """Whether ``be`` implements the runtime API (stream capture, graphs, event timing)."""
    return isinstance(be, RuntimeApi)
