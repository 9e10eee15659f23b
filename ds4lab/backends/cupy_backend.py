"""The ``cupy`` backend: ds4lab's kernels (``kernels/*.cu``, ``cupy.RawModule``) on a CUDA GPU through CuPy, each
launch on the stream the launch layer resolved (``LEGACY_STREAM``: handle 0). Importing this module does not import
CuPy; :func:`gpu_usable` and :class:`CupyBackend` do."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..token import weights as W
from ..capture.stream import CAPTURE_MODES, LEGACY_STREAM
from ..executor.base import BackendUnavailable, DeviceClock, Executor, RuntimeApi
from .cupy_device_graphs import CupyDeviceGraphsMixin
from .cupy_host import CupyHostMixin
from .cupy_runtime import (_EVENT_RECORD_EXTERNAL, _EVENT_WAIT_EXTERNAL, CupyGraph, CupyGraphExec, _checked,
                           _cuda_errors, _cudart, _driver_graph_exec_update, _driver_node_type, _error_name, _ready,
                           cuda_error_name, exec_kernel_node_set_params, graph_kernel_nodes)

#: ``extern "C" [ATTRIBUTE_MACRO[(ARGS)]] __global__ void NAME(``: an upper-case attribute macro may
#: stand before ``__global__`` (cluster dimensions on sm_90, empty before: ``common.cuh``), and
#: ``__launch_bounds__(...)`` on either side of ``void``.
_KERNEL_RE = re.compile(r'extern\s+"C"\s+(?:[A-Z_][A-Z0-9_]*(?:\([^)]*\))?\s+)?__global__\s+'
                        r'(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)')


def kernels_dir() -> Path:
    """Folder of the CUDA sources: the repository's ``kernels/``, or the installed copy."""
    repo = Path(__file__).resolve().parents[2] / "kernels"
    if (repo / "common.cuh").is_file():
        return repo
    from importlib import resources

    return Path(str(resources.files("ds4lab.kernels")))


def kernel_sources() -> dict[str, Path]:
    """Map of kernel name → the ``.cu`` file that defines it. Raises on a name defined twice."""
    out: dict[str, Path] = {}
    for f in sorted(kernels_dir().glob("*.cu")):
        for name in _KERNEL_RE.findall(f.read_text()):
            if name in out:
                raise RuntimeError(f"kernel {name!r} defined in both {out[name].name} and {f.name}")
            out[name] = f
    return out


def gpu_usable() -> tuple[bool, str]:
    """Whether CuPy imports and sees at least one CUDA device; the reason when not."""
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no usable CUDA device ({type(e).__name__}: {e})"
    return (n > 0, "ok" if n > 0 else "no CUDA device")


class CupyBackend(CupyHostMixin, CupyDeviceGraphsMixin, Executor, RuntimeApi, DeviceClock):
    """Runs launches on the current CUDA device. Raises BackendUnavailable: CuPy missing or no CUDA device."""

    name = "cupy"
    is_gpu = True
    measures_time = True

    def __init__(self, seed: int = 1234) -> None:
        ok, why = gpu_usable()
        if not ok:
            raise BackendUnavailable(f"backend 'cupy' unavailable: {why}")
        import cupy

        self.cp = cupy
        self.xp = cupy
        self.seed = seed
        self._null = cupy.cuda.Stream.null
        self._modules: dict[Path, Any] = {}
        self._sources = kernel_sources()
        self._fns: dict[str, Callable] = {}

    # ------------------------------------------------------------------ kernels
    def _module(self, path: Path):
        m = self._modules.get(path)
        if m is None:
            m = self.cp.RawModule(code=path.read_text(), options=("-std=c++17", f"-I{path.parent}"),
                                  name_expressions=None)
            self._modules[path] = m
        return m

    def function(self, name: str) -> Callable:
        """The launchable ``f(grid, block, args, shared_mem, stream)`` for kernel ``name`` (compiled on first use).
        Raises KeyError naming the kernel when no ``.cu`` file defines it."""
        f = self._fns.get(name)
        if f is None:
            try:
                path = self._sources[name]
            except KeyError:
                raise KeyError(f"no kernel named {name!r} in {kernels_dir()}") from None
            raw = self._module(path).get_function(name)
            f = _stream_launcher(raw)
            self._fns[name] = f
        return f

    def compile_all(self) -> list[str]:
        """Compile every kernel now (so no compile lands inside a timed region). Returns names."""
        for name in self._sources:
            self.function(name)
        return sorted(self._sources)

    # ------------------------------------------------------------------ memory
    def empty(self, shape, dtype):
        with _cuda_errors("cudaMalloc (memory-pool growth)"):
            a = self.cp.empty(shape, dtype=dtype)
            if a.dtype.kind == "f":
                a.fill(np.nan)  # poison: an output a kernel fails to write reads as NaN
        return a

    def zeros(self, shape, dtype):
        with _cuda_errors("cudaMalloc (memory-pool growth)"):
            return self.cp.zeros(shape, dtype=dtype)

    def from_host(self, a):
        with _cuda_errors("cudaMemcpy (host to device)"):
            return self.cp.asarray(a)

    def to_host(self, a):
        with _cuda_errors("cudaMemcpy (device to host)"):
            return self.cp.asnumpy(a)

    def make_weight(self, spec: W.WeightSpec):
        cp = self.cp
        key = np.uint32(W.tensor_key(self.seed, spec.name))
        if spec.fmt == "f32":
            out = cp.empty(spec.n_weights, dtype=np.float32)
            self.fill_f32(out, spec.name, spec.scale, spec.offset, self.seed)
            return out
        lead = (spec.subs,) if spec.subs > 1 else ()
        if spec.fmt in W.SUPERBLOCKS:
            return self._make_superblocks(spec, key, lead)
        nb = spec.cols // 32
        if spec.fmt == "q8_0":
            qs = cp.empty(lead + (spec.rows, spec.cols), dtype=np.int8)
            kern, base, nbytes = "init_q8_0", W.q8_base_scale(spec.cols), spec.rows * spec.cols
        else:
            qs = cp.empty(lead + (spec.rows, spec.cols // 2), dtype=np.uint8)
            kern, base, nbytes = "init_q4", W.q4_base_scale(spec.cols), spec.rows * spec.cols // 2
        d = cp.empty(lead + (spec.rows, nb), dtype=np.float16)
        grid = (min(65535, -(-nbytes // 256)), spec.subs)
        with _cuda_errors(f"launch {kern}"):
            self.function(kern)(grid, (256,), (qs, d, np.int32(spec.rows), np.int32(spec.cols), key, base), 0, self._null)
        return W.QTensor(spec.fmt, spec.rows, spec.cols, qs, d)

    def _make_superblocks(self, spec: W.WeightSpec, key, lead: tuple):
        """A super-block tensor filled in place by ``init_superblocks`` (bit for bit ``weights.gen_superblocks``)."""
        shape, dtype = W.qtensor_arrays(spec.fmt, spec.rows, spec.cols)["qs"]
        qs = self.cp.empty(lead + shape, dtype=dtype)
        per_sub = shape[0] * shape[1]
        if per_sub >= 2**32:
            raise ValueError(f"{spec.name}: {per_sub} bytes per sub-tensor exceed the 32-bit element index")
        fields = W.superblock_fields(spec.fmt, spec.cols) + [(-1, np.float32(0), 0)]
        (o0, m0, s0), (o1, m1, s1) = fields[0], fields[1]
        grid = (min(65535, -(-per_sub // 256)), spec.subs)
        with _cuda_errors("launch init_superblocks"):
            self.function("init_superblocks")(grid, (256,), (
                qs, np.uint64(per_sub), np.int32(W.SUPERBLOCKS[spec.fmt].nbytes), key, np.int32(o0), np.float32(m0),
                np.uint32(s0), np.int32(o1), np.float32(m1), np.uint32(s1)), 0, self._null)
        return W.QTensor(spec.fmt, spec.rows, spec.cols, qs, None)

    def fill_f32(self, out, name, scale, offset, seed):
        key = np.uint32(W.tensor_key(seed, name))
        n = out.size
        with _cuda_errors("launch init_f32"):
            self.function("init_f32")((min(65535, -(-n // 256)),), (256,),
                                      (out, np.int64(n), key, np.float32(scale), np.float32(offset)), 0, self._null)

    # ------------------------------------------------------------------ launches
    def launch(self, stream, name, grid, block, args, shared, ref, nbytes=0):
        f = self._fns.get(name) or self.function(name)
        try:
            f(grid, block, args, shared, self._null if stream is LEGACY_STREAM else stream)
        except Exception as e:
            if type(e).__name__ in ("CUDARuntimeError", "CUDADriverError"):
                from ..errors import CudaError

                raise CudaError(cuda_error_name(str(e), getattr(e, "status", None)), f"launch {name}", str(e)) from None
            raise

    def _ptr_stream(self, stream) -> int:
        return 0 if stream is LEGACY_STREAM else stream.ptr

    def _rt(self, call: str, fn: str, *args):
        """``cupy.cuda.runtime.<fn>(*args)``, its errors raised as CUDA's error ``call`` names."""
        with _cuda_errors(call):
            return getattr(self.cp.cuda.runtime, fn)(*args)

    def memset_async(self, stream, buf, value):
        self._rt("cudaMemsetAsync", "memsetAsync", buf.data.ptr, int(value), buf.nbytes, self._ptr_stream(stream))

    def memset_sync(self, buf, value):
        self._rt("cudaMemset", "memset", buf.data.ptr, int(value), buf.nbytes)

    def copy_h2d(self, stream, dst, src):
        # Pageable source: the runtime stages it before returning, so src may change afterwards
        # (CUDA Runtime API, "API synchronization behavior", memcpy from pageable memory).
        src = np.ascontiguousarray(src)
        if src.nbytes != dst.nbytes:
            raise ValueError(f"copy_h2d: {src.nbytes} host bytes into a {dst.nbytes}-byte buffer")
        rt = self.cp.cuda.runtime
        with _cuda_errors("cudaMemcpyAsync"):
            rt.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, self._ptr_stream(stream))

    def event_record(self, stream, event):
        self._rt("cudaEventRecord", "eventRecord", event.ptr, self._ptr_stream(stream))

    # ------------------------------------------------------------------ streams, events, info
    def new_stream(self, non_blocking: bool = True):
        with _cuda_errors("cudaStreamCreateWithFlags"):
            return self.cp.cuda.Stream(non_blocking=non_blocking)

    def per_thread_stream(self):
        """CUDA's per-thread default stream (``cudaStreamPerThread``)."""
        return self.cp.cuda.Stream.ptds

    def new_event(self):
        with _cuda_errors("cudaEventCreateWithFlags"):
            return self.cp.cuda.Event()

    def _s(self, stream):
        return self._null if stream is LEGACY_STREAM else stream

    def synchronize(self) -> None:
        self._rt("cudaDeviceSynchronize", "deviceSynchronize")

    # ------------------------------------------------------------------ runtime API
    def event_synchronize(self, event) -> None:
        self._rt("cudaEventSynchronize", "eventSynchronize", event.ptr)

    def event_query(self, event) -> bool:
        """``cudaEventQuery``: True when complete, False for ``cudaErrorNotReady`` (600); CuPy returns the status, so
        any other is raised as the named :class:`~ds4lab.errors.CudaError`, as the sim raises it."""
        rt = self.cp.cuda.runtime
        with _cuda_errors("cudaEventQuery"):
            return _ready(rt.eventQuery(event.ptr), "cudaEventQuery")

    def event_elapsed_ms(self, start, end) -> float:
        return float(self._rt("cudaEventElapsedTime", "eventElapsedTime", start.ptr, end.ptr))

    def stream_wait_event(self, stream, event) -> None:
        self._rt("cudaStreamWaitEvent", "streamWaitEvent", self._ptr_stream(stream), event.ptr, 0)

    def stream_synchronize(self, stream) -> None:
        self._rt("cudaStreamSynchronize", "streamSynchronize", self._ptr_stream(stream))

    def stream_query(self, stream) -> bool:
        """``cudaStreamQuery``: True when all work is done, False for ``cudaErrorNotReady`` (600); any other status is
        raised as the named CudaError (900 for a capturing stream, which it invalidates: gpu-facts.md)."""
        with _cuda_errors("cudaStreamQuery"):
            return _ready(self.cp.cuda.runtime.streamQuery(self._ptr_stream(stream)), "cudaStreamQuery")

    def _wrap(self, ptr: int, shape, dtype, owner=None):
        cp = self.cp
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = cp.cuda.UnownedMemory(ptr, n, owner)
        return cp.ndarray(shape, dtype, memptr=cp.cuda.MemoryPointer(mem, 0))

    def malloc(self, shape, dtype):
        n = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        with _cuda_errors("cudaMalloc"):
            ptr = self.cp.cuda.runtime.malloc(n)
        return self._wrap(ptr, shape, dtype)

    def free(self, buf) -> None:
        self._rt("cudaFree", "free", buf.data.ptr)

    def malloc_async(self, stream, shape, dtype):
        n = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        with _cuda_errors("cudaMallocAsync"):
            ptr = self.cp.cuda.runtime.mallocAsync(n, self._ptr_stream(stream))
        return self._wrap(ptr, shape, dtype)

    def free_async(self, stream, buf) -> None:
        self._rt("cudaFreeAsync", "freeAsync", buf.data.ptr, self._ptr_stream(stream))

    def read(self, buf) -> np.ndarray:
        from ..errors import CupyRefusal, RuntimeApiError
        from ..capture.stream import current_stream

        try:
            with self._s(current_stream()), _cuda_errors("cudaMemcpy (device to host)"):
                return buf.get()
        except RuntimeError as e:
            if isinstance(e, RuntimeApiError):
                raise
            if "disallowed" in str(e) or "capturing" in str(e):
                raise CupyRefusal("cupy:D2HDisallowed", "cupy.ndarray.get", str(e)) from None
            raise

    def matmul(self, stream, a, b):
        from ..errors import CupyRefusal

        try:
            with self._s(stream), _cuda_errors("cupy.matmul (cuBLAS)"):
                return a @ b
        except NotImplementedError as e:
            raise CupyRefusal("cupy:CublasInCapture", "cupy.matmul", str(e)) from None

    _MODES = {m: i for i, m in enumerate(CAPTURE_MODES)}  # cudaStreamCaptureMode: 0, 1, 2 in that order

    def begin_capture(self, stream, mode: str = "thread_local") -> None:
        if mode not in self._MODES:
            raise ValueError(f"capture mode {mode!r}; choose one of: {', '.join(self._MODES)}")
        with _cuda_errors("cudaStreamBeginCapture"):
            self.cp.cuda.runtime.streamBeginCapture(self._ptr_stream(stream), self._MODES[mode])

    def end_capture(self, stream):
        from ..errors import CudaError

        try:
            with _cuda_errors("cudaStreamEndCapture"):
                g = self.cp.cuda.runtime.streamEndCapture(self._ptr_stream(stream))
        except RuntimeError as e:  # CuPy's own wording for an invalidated capture
            if isinstance(e, CudaError) or "invalidated" not in str(e):
                raise
            raise CudaError("cudaErrorStreamCaptureInvalidated", "cudaStreamEndCapture", str(e)) from None
        return CupyGraph(self.cp, g)

    def capture_status(self, stream) -> str:
        rt = self.cp.cuda.runtime
        try:
            with _cuda_errors("cudaStreamIsCapturing"):
                st = rt.streamIsCapturing(self._ptr_stream(stream))
        except RuntimeError as e:  # CuPy raises a plain RuntimeError for an invalidated capture
            if "invalidated" in str(e):
                return "invalidated"
            raise
        return {rt.streamCaptureStatusNone: "none", rt.streamCaptureStatusActive: "active",
                rt.streamCaptureStatusInvalidated: "invalidated"}[st]

    def graph_nodes(self, graph) -> list[dict]:
        with _cuda_errors("cudaGraphDebugDotPrint"):
            return graph.nodes(tuple(self._sources))

    def graph_instantiate(self, graph, flags: int = 0):
        """``cudaGraphInstantiateWithFlags`` (``flags``: cudaGraphInstantiateFlags bits; 0 goes through CuPy's
        ``graphInstantiate``, others through ``cuda.bindings``). Raises CudaError (cudaErrorInvalidValue,
        cudaErrorNotSupported for a second executable of a graph with memory nodes)."""
        if not flags:
            with _cuda_errors("cudaGraphInstantiate"):
                return CupyGraphExec(self.cp, self.cp.cuda.runtime.graphInstantiate(graph.handle), graph)
        cudart = _cudart()
        h = _checked("cudaGraphInstantiateWithFlags",
                     cudart.cudaGraphInstantiateWithFlags(cudart.cudaGraph_t(graph.handle), int(flags)))
        return CupyGraphExec(self.cp, int(h), graph)

    def graph_exec_kernel_node_set_params(self, graph_exec, index: int, launch) -> None:
        """``cudaGraphExecKernelNodeSetParams`` through the driver: kernel node ``index`` (capture order) takes
        ``launch``'s arguments, grid, block and shared memory; its function must be ``launch``'s kernel. Raises
        CudaError: cudaErrorInvalidValue for an index past the graph's kernel nodes or a node that runs another
        function; any status the driver returns."""
        from ..errors import CudaError

        call = "cudaGraphExecKernelNodeSetParams"
        if graph_exec.kernel_nodes is None:
            graph_exec.kernel_nodes = graph_kernel_nodes(graph_exec.graph.handle)
        nodes = graph_exec.kernel_nodes
        if not 0 <= index < len(nodes):
            raise CudaError("cudaErrorInvalidValue", call, f"kernel node {index} of {len(nodes)}")
        node, func = nodes[index]
        fptr = int(self.function(launch.kernel).ptr)
        if fptr != func:
            raise CudaError("cudaErrorInvalidValue", call, f"kernel node {index} runs another function than "
                                                           f"{launch.kernel}")
        exec_kernel_node_set_params(graph_exec.handle, node, fptr, launch.grid, launch.block, launch.shared,
                                    launch.args)

    def graph_exec_update(self, graph_exec, graph) -> None:
        """``cudaGraphExecUpdate`` through ``cuda-bindings``: new node parameters from a topologically identical graph.

        Raises:
            GraphExecUpdateError: ``cudaErrorGraphExecUpdateFailure`` with ``result`` (the cudaGraphExecUpdateResult
                name) and ``node_type`` (of ``errorNode``; None when CUDA names none).
            CudaError: any other status."""
        from ..errors import GRAPH_EXEC_UPDATE_RESULTS, GraphExecUpdateError

        call = "cudaGraphExecUpdate"
        # The driver entry point, through ctypes: cuda-bindings returns (err, None) on failure and so
        # drops the very result info this call exists to report (seen on the H200, cuda-bindings 13).
        err, result, node = _driver_graph_exec_update(graph_exec.handle, graph.handle)
        if err == 0:
            graph_exec.graph = graph  # keep the graph the executable now mirrors alive
            return
        name = _error_name(err)
        if name != "cudaErrorGraphExecUpdateFailure":
            from ..errors import CudaError

            raise CudaError(name, call, f"status {err}")
        rname = GRAPH_EXEC_UPDATE_RESULTS.get(result, f"cudaGraphExecUpdateResult({result})")
        raise GraphExecUpdateError(call, rname, _driver_node_type(node), name=name)

    def graph_launch(self, graph_exec, stream) -> None:
        self._rt("cudaGraphLaunch", "graphLaunch", graph_exec.handle, self._ptr_stream(stream))

    def graph_upload(self, graph_exec, stream) -> None:
        """``cudaGraphUpload`` of ``graph_exec`` on ``stream``."""
        rt = self.cp.cuda.runtime
        if hasattr(rt, "graphUpload"):
            with _cuda_errors("cudaGraphUpload"):
                rt.graphUpload(graph_exec.handle, self._ptr_stream(stream))
            return
        cudart = _cudart()
        _checked("cudaGraphUpload", cudart.cudaGraphUpload(cudart.cudaGraphExec_t(graph_exec.handle),
                                                           cudart.cudaStream_t(self._ptr_stream(stream))))

    def graph_exec_destroy(self, graph_exec) -> None:
        """``cudaGraphExecDestroy`` now (not at garbage collection)."""
        graph_exec.destroy()

    def graph_destroy(self, graph) -> None:
        """``cudaGraphDestroy`` now; executables instantiated from it keep working."""
        graph.destroy()

    def graph_create(self):
        """``cudaGraphCreate``: an empty graph (through ``cuda.bindings``)."""
        cudart = _cudart()
        return CupyGraph(self.cp, int(_checked("cudaGraphCreate", cudart.cudaGraphCreate(0))))

    def graph_add_child(self, graph, child) -> None:
        """``cudaGraphAddChildGraphNode`` after ``graph``'s last added node (``child`` is cloned)."""
        cudart = _cudart()
        deps = [graph.last_node] if graph.last_node is not None else []
        node = _checked("cudaGraphAddChildGraphNode",
                        cudart.cudaGraphAddChildGraphNode(cudart.cudaGraph_t(graph.handle), deps, len(deps),
                                                          cudart.cudaGraph_t(child.handle)))
        graph.last_node = node

    def exchange_capture_mode(self, mode: str) -> str:
        """``cudaThreadExchangeStreamCaptureMode`` for the calling thread (through ``cuda.bindings``); returns the
        previous mode. Raises ValueError for an unknown mode, CudaError on failure."""
        if mode not in self._MODES:
            raise ValueError(f"capture mode {mode!r}; choose one of: {', '.join(self._MODES)}")
        cudart = _cudart()
        prev = _checked("cudaThreadExchangeStreamCaptureMode",
                        cudart.cudaThreadExchangeStreamCaptureMode(cudart.cudaStreamCaptureMode(self._MODES[mode])))
        return {v: k for k, v in self._MODES.items()}.get(int(prev), str(prev))

    def event_record_external(self, stream, event) -> None:
        """``cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)`` (an event record node in capture)."""
        cudart = _cudart()
        _checked("cudaEventRecordWithFlags",
                 cudart.cudaEventRecordWithFlags(cudart.cudaEvent_t(event.ptr), cudart.cudaStream_t(self._ptr_stream(stream)),
                                                 _EVENT_RECORD_EXTERNAL))

    def stream_wait_event_external(self, stream, event) -> None:
        """``cudaStreamWaitEvent(stream, event, cudaEventWaitExternal)`` (an event wait node in capture)."""
        cudart = _cudart()
        _checked("cudaStreamWaitEvent",
                 cudart.cudaStreamWaitEvent(cudart.cudaStream_t(self._ptr_stream(stream)), cudart.cudaEvent_t(event.ptr),
                                            _EVENT_WAIT_EXTERNAL))

    def memory_used(self) -> int:
        return int(self.cp.get_default_memory_pool().used_bytes())

    def free_memory(self) -> tuple[int, int]:
        with _cuda_errors("cudaMemGetInfo"):
            free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def release_cached_memory(self) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()

    def globaltimer_steps(self, n: int) -> np.ndarray:
        buf = self.cp.zeros((n,), dtype=np.uint64)
        self.function("globaltimer_probe")((1,), (32,), (buf, np.int32(n)), 0, self._null)
        self.synchronize()
        return self.to_host(buf)

    def profiler_start(self) -> None:
        self._rt("cudaProfilerStart", "profilerStart")

    def profiler_stop(self) -> None:
        self._rt("cudaProfilerStop", "profilerStop")

    def info(self) -> dict:
        return device_info()


def _stream_launcher(raw) -> Callable:
    """A fast ``f(grid, block, args, shared_mem, stream)`` for a ``cupy.RawKernel``: its ``cupy.cuda.Function`` takes
    the stream as an argument, which avoids a per-launch ``with stream:`` (docs/design-log.md)."""
    return raw.kernel


@functools.lru_cache(maxsize=1)
def device_info() -> dict:
    """GPU name, driver, CUDA runtime and CuPy versions (for every measured number's provenance)."""
    import cupy

    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    driver = None
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:
        pass
    return {
        "backend": "cupy",
        "device": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "multiprocessors": int(props["multiProcessorCount"]),
        "memory_total_bytes": int(props["totalGlobalMem"]),
        "driver": driver or f"CUDA driver API {rt.driverGetVersion()}",
        "cuda_driver_api": rt.driverGetVersion(),
        "cuda_runtime": rt.runtimeGetVersion(),
        "cupy": cupy.__version__,
    }
