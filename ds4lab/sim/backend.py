"""The ``sim`` backend: the decode token on a modeled GPU, on the CPU.

Numbers come from the NumPy reference (bit-identical to the ``numpy`` backend); *when* work runs follows CUDA's rules
(:mod:`ds4lab.sim.runtime`, :data:`ds4lab.sim.rules.RULES`); *how long* it takes is modeled from a calibration
(:mod:`ds4lab.sim.costmodel`), never measured. Memory and timing-only mode: ``docs/sim.md``."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from ..token import weights as W
from ..executor.base import Executor, ModeledTime, RuntimeApi
from ..executor.numpy_backend import NumpyBackend
from ..errors import CudaError
from ..capture.stream import LEGACY_STREAM, current_stream
from .costmodel import Calibration
from .memory import Arena, ArenaError, aligned, phantom
from .device_graphs import SimDeviceGraphsMixin
from .host_api import HostApiMixin
from .runtime import MODES, RULES, Graph, Runtime


#: In timing-only mode, int32 buffers of at most this many elements are real host arrays (the token's
#: scalars: what a condition-setting kernel reads), every other buffer a phantom.
SMALL_REAL_INTS = 16


class PhantomBank:
    """A routed-expert bank in timing-only mode: shapes and bytes of the real stack, no memory."""

    def __init__(self, spec: W.WeightSpec) -> None:
        self.spec = spec
        self.rows, self.cols, self.fmt = spec.rows, spec.cols, spec.fmt
        self.qs, self.d = _phantom_arrays(spec, (spec.subs,))

    def __getitem__(self, e: int) -> W.QTensor:
        return W.QTensor(self.fmt, self.rows, self.cols, self.qs[int(e)], None if self.d is None else self.d[int(e)])


def _phantom_arrays(spec: W.WeightSpec, lead: tuple) -> tuple:
    """Phantom ``qs`` and ``d`` of a quantized tensor (``d`` None for the super-block formats)."""
    arrs = W.qtensor_arrays(spec.fmt, spec.rows, spec.cols)
    return tuple(None if a is None else phantom(lead + a[0], a[1]) for a in (arrs["qs"], arrs["d"]))


def _phantom_weight(spec: W.WeightSpec):
    if spec.fmt == "f32":
        return phantom((spec.n_weights,), np.float32)
    if spec.subs > 1:
        return PhantomBank(spec)
    return W.QTensor(spec.fmt, spec.rows, spec.cols, *_phantom_arrays(spec, ()))


def _matmul_shape(a_shape: tuple, b_shape: tuple) -> tuple:
    a2 = a_shape if len(a_shape) > 1 else (1,) + tuple(a_shape)
    b2 = b_shape if len(b_shape) > 1 else tuple(b_shape) + (1,)
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: shapes {a_shape} and {b_shape} do not align")
    out = np.broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return out


class _Forward:
    """A backend attribute that is ``self.<path>.<name>`` (``name``: the attribute's own by default)."""

    def __init__(self, path: str, name: str = "") -> None:
        self.path, self.name = path.split("."), name

    def __set_name__(self, owner, name: str) -> None:
        self.name = self.name or name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        for part in self.path:
            obj = getattr(obj, part)
        return getattr(obj, self.name)


class SimBackend(HostApiMixin, SimDeviceGraphsMixin, Executor, RuntimeApi, ModeledTime):
    """A modeled GPU on the CPU (see module docstring): ``seed`` as the other backends; ``timing_only``: no numbers
    (phantom buffers), only the timing and the rules; ``calibration``: a JSON path or dict (default
    ``$DS4LAB_CALIBRATION``, else ``ds4lab/data/h200.json``); ``threads_enabled``: tell host threads apart (False: one
    thread); ``invalidated_ops``: work on an invalidated capture ``"drop"`` (default) or ``"raise"``
    (``cudaErrorStreamCaptureInvalidated``). Host-side calls: :class:`~ds4lab.sim.host_api.HostApiMixin`."""

    name = "sim"
    is_gpu = False
    measures_time = False
    #: Every time this backend gives is modeled from :attr:`calibration`.
    models_time = True
    xp = np
    rules = RULES
    modes = MODES

    def __init__(self, seed: int = 1234, timing_only: bool = False, calibration=None,
                 threads_enabled: bool = True, *, invalidated_ops: str = "raise") -> None:
        self.seed = seed
        self.timing_only = bool(timing_only)
        self.cal = Calibration.load(calibration)
        #: Name, path, provenance (the file's ``source``) and ``measured`` of the calibration in use.
        self.calibration = self.cal.provenance()
        self.rt = Runtime(self.cal, compute=not self.timing_only, threads_enabled=threads_enabled,
                          invalidated_ops=invalidated_ops)
        self._np = NumpyBackend(seed=seed)
        self.arena = Arena()
        self._phantom_bytes = 0
        self._phantom_free: Counter = Counter()
        self._kernel_us: dict[tuple[str, int], float] = {}

    # ------------------------------------------------------------------ memory
    def _alloc(self, shape, dtype, owner: str, *, pool: bool, call: str) -> np.ndarray:
        """One device allocation: ``pool`` (CuPy's ``empty``) takes a freed block of the same size, else grows the pool
        (a ``cudaMalloc``, unsafe during capture); not ``pool``: a ``cudaMalloc`` every time."""
        dt = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        size = aligned(nbytes)
        with self.rt.lock:
            if self.timing_only:
                if not (pool and self._phantom_free[size]):
                    self.rt.unsafe_call(call)
                if pool and self._phantom_free[size]:
                    self._phantom_free[size] -= 1
                self._phantom_bytes += size
                if dt == np.int32 and int(np.prod(shape, dtype=np.int64)) <= SMALL_REAL_INTS:
                    return np.zeros(shape, dt)  # real even here: device scalars decide conditional nodes
                return phantom(shape, dt)
            if not (pool and self.arena._free.get(size)):
                self.rt.unsafe_call(call)
            b = self.arena.alloc(nbytes, owner)
            return self.arena.view(b, shape, dt)

    def empty(self, shape, dtype):
        a = self._alloc(shape, dtype, "empty", pool=True, call="cudaMalloc (memory-pool growth)")
        if not self.timing_only and a.dtype.kind == "f":
            a.fill(np.nan)  # poisoned, as the numpy and cupy backends do
        return a

    def zeros(self, shape, dtype):
        a = self._alloc(shape, dtype, "zeros", pool=True, call="cudaMalloc (memory-pool growth)")
        if not self.timing_only:
            a[...] = 0
        return a

    def from_host(self, a):
        a = np.asarray(a)
        out = self._alloc(a.shape, a.dtype, "from_host", pool=True, call="cudaMalloc (memory-pool growth)")
        if not self.timing_only or out.flags.writeable:
            out[...] = a
        return out

    def to_host(self, a) -> np.ndarray:
        """As :meth:`read` (CuPy's ``asnumpy``): refused while the current stream captures."""
        return self.read(a)

    def malloc(self, shape, dtype):
        """``cudaMalloc``: an unsafe call during global/thread-local capture; reuses a freed block of the same size."""
        return self._alloc(shape, dtype, "malloc", pool=False, call="cudaMalloc")

    def free(self, buf) -> None:
        """``cudaFree`` (an unsafe call during capture). The array stays a view of the freed memory."""
        with self.rt.lock:
            self.rt.unsafe_call("cudaFree")
            if self.timing_only:
                size = aligned(buf.nbytes)
                self._phantom_free[size] += 1
                self._phantom_bytes -= size
                return
            self._arena_free(buf, "cudaFree")

    def _arena_free(self, buf, call: str) -> None:
        b = self.arena.block_of(buf)
        if b is None:
            raise CudaError("cudaErrorInvalidValue", call, "not a device pointer of this backend")
        try:
            self.arena.free(b.addr)
        except ArenaError as e:
            raise CudaError("cudaErrorInvalidValue", call, str(e)) from None

    def malloc_async(self, stream, shape, dtype):
        """``cudaMallocAsync``: eager, a stream-ordered allocation; captured, a ``mem_alloc`` node whose memory stays
        reserved for the graph."""
        dt = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        with self.rt.lock:
            if self.timing_only:
                buf = phantom(shape, dt)
                self._phantom_bytes += aligned(buf.nbytes)
                self.rt.host_op(stream, "mem_alloc", "cudaMallocAsync", None, "cudaMallocAsync")
                return buf
            b = self.arena.alloc(int(np.prod(shape, dtype=np.int64)) * dt.itemsize, "malloc_async")
            buf = self.arena.view(b, shape, dt)
            node = self.rt.host_op(stream, "mem_alloc", "cudaMallocAsync", None, "cudaMallocAsync")
            if node is not None:
                b.owner, node.info = "graph", b.addr
            return buf

    def free_async(self, stream, buf) -> None:
        """``cudaFreeAsync``: eager, frees now; captured, a ``mem_free`` node (memory allocated by the same graph stays
        the graph's; other memory is freed at the first replay)."""
        with self.rt.lock:
            if self.timing_only:
                self.rt.host_op(stream, "mem_free", "cudaFreeAsync", None, "cudaFreeAsync")
                return
            b = self.arena.block_of(buf)
            if b is None:
                raise CudaError("cudaErrorInvalidValue", "cudaFreeAsync", "not a device pointer of this backend")
            q = self.rt.capturing(stream)
            in_graph = q is not None and any(n.kind == "mem_alloc" and n.info == b.addr for n in q.nodes)

            def replay_free():
                if b.live and not in_graph:
                    self.arena.free(b.addr)

            def eager_free():
                if not self.rt.graphs.memory_free(b.addr):  # rule graph_free_outside: the graph's memory
                    self._arena_free(buf, "cudaFreeAsync")

            node = self.rt.host_op(stream, "mem_free", "cudaFreeAsync", eager_free, "cudaFreeAsync",
                                   capture_fn=replay_free)
            if node is not None:
                node.info = b.addr

    def read(self, buf) -> np.ndarray:
        """A synchronous device-to-host copy on the accessor's stream (``cupy.asnumpy``), refused while that stream
        captures (rule ``d2h_in_capture``); NaN in timing-only mode (float32 NaN for non-float buffers)."""
        call = "cudaMemcpy (device to host)"
        rt = self.rt
        with rt.lock:
            s = rt._stream(current_stream(), call)
            if s.capture is not None:
                rt._fail("d2h_in_capture", call, (), f"current stream {s.name} is capturing ({s.capture.status})")
            if s is rt.legacy and rt.live:
                rt._legacy_use(call)
            rt.dev.host(self.cal.host_api_us)
            rt.dev.wait_host(rt._earliest(s, 0.0))
            rt.dev.host(self.cal.h2d_gpu_us(getattr(buf, "nbytes", 0)))
            if self.timing_only:
                dt = buf.dtype if buf.dtype.kind == "f" else np.float32
                return np.full(buf.shape, np.nan, dtype=dt)
            return np.array(buf, copy=True)

    def matmul(self, stream, a, b):
        """``a @ b`` as CuPy's array API does it (cuBLAS) on ``stream``; refused during capture."""
        call = "cupy.matmul (cuBLAS)"
        rt = self.rt
        s = rt._stream(stream if stream is not None else current_stream(), call)
        cur = rt.current_capturing()
        if s.capture is not None or cur is not None:
            rt._fail("cublas_in_capture", call, (), f"stream {s.name if s.capture else 'current'} is capturing")
        out = self.empty(_matmul_shape(a.shape, b.shape), np.result_type(a.dtype, b.dtype))

        def ref():
            out[...] = np.matmul(a, b)

        self.launch(stream, "cublas_gemm", (), (), (a, b, out), 0, ref, int(a.nbytes + b.nbytes + out.nbytes))
        return out

    # ------------------------------------------------------------------ weights
    def make_weight(self, spec: W.WeightSpec):
        if self.timing_only:
            return _phantom_weight(spec)
        return self._np.make_weight(spec)

    def fill_f32(self, out, name, scale, offset, seed):
        if not self.timing_only:
            self._np.fill_f32(out, name, scale, offset, seed)

    # ------------------------------------------------------------------ launches
    def launch(self, stream: Any, name: str, grid, block, args, shared, ref: Callable[[], None],
               nbytes: int = 0) -> None:
        if not nbytes:
            nbytes = sum(a.nbytes for a in args if isinstance(a, np.ndarray))
        key = (name, nbytes)
        us = self._kernel_us.get(key)
        if us is None:
            us = self._kernel_us[key] = self.cal.kernel_us(name, nbytes)
        keep = not self.timing_only or getattr(ref, "always", False)  # always: a condition-setting kernel
        self.rt.enqueue(stream, "kernel", name, ref if keep else None, us, "cudaLaunchKernel",
                        None, (grid, block, args, shared, nbytes))

    def memset_async(self, stream, buf, value, call: str = "cudaMemsetAsync"):
        def fn():
            buf.view(np.uint8)[...] = value

        self.rt.enqueue(stream, "memset", "memset", fn, self.cal.memset_gpu_us(buf.nbytes), call,
                        self.cal.host_api_us, (buf, value))

    def memset_sync(self, buf, value):
        """``cudaMemset``: on the legacy stream, whatever the accessor says (ds4 today)."""
        self.memset_async(LEGACY_STREAM, buf, value, "cudaMemset")

    def copy_h2d(self, stream, dst, src):
        """``cudaMemcpyAsync`` host to device. Captured, the node keeps the host array by reference (a pointer): a
        replay copies what that host memory holds *then*."""
        src = np.ascontiguousarray(src)
        if src.nbytes != dst.nbytes:
            raise ValueError(f"copy_h2d: {src.nbytes} host bytes into a {dst.nbytes}-byte buffer")

        def fn():
            dst[...] = src.reshape(dst.shape)

        fn.always = bool(dst.flags.writeable)  # timing-only: a real (small) buffer still takes the copy
        self.rt.enqueue(stream, "memcpy", "memcpy HtoD", fn, self.cal.h2d_gpu_us(src.nbytes), "cudaMemcpyAsync",
                        self.cal.host_api_us, (dst, src))

    # ------------------------------------------------------------------ the runtime's own calls
    # The contract's methods (ds4lab.executor.base) that the runtime (rt) or its graphs (rt.graphs) implement as the
    # backend names them.
    event_record = _Forward("rt")
    new_stream = _Forward("rt")
    per_thread_stream = _Forward("rt")
    new_event = _Forward("rt")
    synchronize = _Forward("rt")
    event_synchronize = _Forward("rt")
    event_query = _Forward("rt")
    event_elapsed_ms = _Forward("rt")
    stream_wait_event = _Forward("rt")
    stream_synchronize = _Forward("rt")
    stream_query = _Forward("rt")
    exchange_capture_mode = _Forward("rt")
    begin_capture = _Forward("rt")
    end_capture = _Forward("rt")
    capture_status = _Forward("rt")
    capture_info = _Forward("rt")
    reset_clock = _Forward("rt")
    #: ``(call, name)`` of legacy-stream work that ran eagerly while a capture was live.
    escapes = _Forward("rt")
    #: ``(call, name)`` of work dropped because its capture was invalidated.
    dropped = _Forward("rt")
    graph_instantiate = _Forward("rt.graphs", "instantiate")
    graph_exec_update = _Forward("rt.graphs", "exec_update")
    graph_launch = _Forward("rt.graphs", "launch")
    graph_upload = _Forward("rt.graphs", "upload")
    graph_exec_destroy = _Forward("rt.graphs", "exec_destroy")
    graph_destroy = _Forward("rt.graphs", "destroy")
    graph_create = _Forward("rt.graphs", "create")
    graph_add_child = _Forward("rt.graphs", "add_child")
    event_record_external = _Forward("rt.graphs")
    stream_wait_event_external = _Forward("rt.graphs")
    #: The modeled host clock (µs since construction or :meth:`reset_clock`).
    host_time_us = _Forward("rt.dev", "host_us")
    #: Modeled device-busy time so far (sum of kernel and memset durations).
    device_busy_us = _Forward("rt.dev", "busy_us")
    #: ``(stream, name, start_us, end_us, kind, graph)`` of every piece of modeled device work.
    timeline = _Forward("rt.dev")

    def graph_nodes(self, graph) -> list[dict]:
        if not isinstance(graph, Graph):
            raise CudaError("cudaErrorInvalidValue", "cudaGraphGetNodes", f"{graph!r} is not a sim graph")
        return self.rt.graphs.nodes(graph)

    #: ``model_host_work`` kinds → the calibration constant that prices each (µs).
    HOST_WORK = {"graph_call": "host_graph_call_us", "node_update": "host_node_update_us"}

    def model_host_work(self, kind: str) -> None:
        """ds4lab's host work of ``kind`` at the calibration's price (:data:`HOST_WORK`; see
        :meth:`ds4lab.executor.base.ModeledTime.model_host_work`). Raises ValueError naming ``kind``."""
        if kind not in self.HOST_WORK:
            raise ValueError(f"host work {kind!r}: one of {', '.join(self.HOST_WORK)}")
        us = getattr(self.cal, self.HOST_WORK[kind])
        if us:
            self.rt.dev.host(us)

    def graph_exec_kernel_node_set_params(self, graph_exec, index: int, launch) -> None:
        """``cudaGraphExecKernelNodeSetParams`` with a :class:`~ds4lab.capture.launch.LaunchRecord` (see
        :meth:`Graphs.exec_kernel_node_set_params`)."""
        nbytes = launch.nbytes or sum(a.nbytes for a in launch.args if isinstance(a, np.ndarray))
        self.rt.graphs.exec_kernel_node_set_params(
            graph_exec, int(index), launch.kernel, self.cal.kernel_us(launch.kernel, nbytes),
            None if self.timing_only else launch.ref, (launch.grid, launch.block, launch.args, launch.shared, nbytes))

    # ------------------------------------------------------------------ the model's clock
    def host_clock_us(self) -> float:
        """The modeled host clock (µs): what a job reads for host enqueue time on the sim."""
        return self.rt.dev.host_us

    def modeled_kernel_us(self, kernel: str, nbytes: int) -> float:
        return self.cal.kernel_us(kernel, nbytes) * self.rt.dev.kernel_factor

    def model_context(self, context: int | None) -> float:
        """Price every kernel run from now on at the calibration's kernel time factor at ``context`` (a decode
        position; None: ``kernel_time_scale``; :meth:`ds4lab.sim.costmodel.Device.set_context`). Returns the factor.
        Raises ValueError for a context that is not positive."""
        return self.rt.dev.set_context(context)

    def modeled_copy_GBps(self) -> tuple[float, str]:
        cal = self.cal
        if cal.copy_GBps:
            return cal.copy_GBps, f"calibration {cal.name}: copy_GBps"
        return cal.bandwidth_GBps, f"calibration {cal.name}: bandwidth_GBps"

    def trace_records(self, since: int = 0) -> tuple[list[tuple], int]:
        d = self.rt.dev
        return d.timeline[max(0, since - d.dropped):], d.dropped + len(d.timeline)

    def modeled_start_us(self, stream) -> float:
        # no earlier than the host's submit time, the stream's previous work and the device's
        # previous kernel (the modeled device runs one kernel at a time)
        return max(self.rt.dev.host_us, self.stream_ready_us(stream), self.rt.dev.free_us)

    def stream_ready_us(self, stream) -> float:
        """Modeled time at which ``stream``'s eager work so far ends."""
        return self.rt._stream(stream, "stream_ready_us").ready_us

    def address(self, buf) -> int | None:
        """The simulated device address of ``buf`` (None for phantoms and host arrays)."""
        return self.arena.address(buf)

    # ------------------------------------------------------------------ provenance
    def info(self) -> dict:
        return {"backend": self.name, "device": f"simulated GPU (calibration: {self.cal.name})",
                "modeled": True, "calibration": self.calibration, "timing_only": self.timing_only,
                "numpy": np.__version__}

    def memory_used(self) -> int:
        return self._phantom_bytes if self.timing_only else self.arena.live_bytes
