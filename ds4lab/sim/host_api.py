"""The ``sim`` backend's host-side runtime calls: copies to and from host memory, pinned host memory, host-only queries
and cuBLAS handles. Mixed into :class:`ds4lab.sim.backend.SimBackend`; every call goes through the runtime's rules
(:mod:`ds4lab.sim.rules`): which one decides each is in the rule's ``when``."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..errors import CudaError
from ..executor.base import HOST_QUERIES
from ..capture.stream import LEGACY_STREAM


class BlasHandle:
    """A simulated cuBLAS handle: its stream and workspace (no state beyond what a trace would show)."""

    def __init__(self, hid: int) -> None:
        self.id = hid
        self.stream: Any = LEGACY_STREAM
        self.workspace: Any = None
        self.destroyed = False

    def __repr__(self) -> str:
        return f"<sim cublas handle {self.id}>"


class HostApiMixin:
    """The host-side runtime calls of :class:`~ds4lab.sim.backend.SimBackend` (which provides ``rt``, ``cal`` and
    ``timing_only``)."""

    # ------------------------------------------------------------------ copies
    def copy_d2h(self, stream, dst: np.ndarray, src) -> None:
        """``cudaMemcpyAsync`` device to host on ``stream`` into ``dst``. Captured, a memcpy node that writes ``dst``
        at each replay (rule capture_node); eagerly, written when the copy runs."""
        if not dst.flags.c_contiguous or dst.nbytes != src.nbytes:
            raise ValueError(f"copy_d2h: needs a C-contiguous host array of {src.nbytes} bytes")

        def fn():
            dst.reshape(-1).view(np.uint8)[...] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)

        self.rt.enqueue(stream, "memcpy", "memcpy DtoH", None if self.timing_only else fn,
                        self.cal.h2d_gpu_us(dst.nbytes), "cudaMemcpyAsync", self.cal.host_api_us, (dst, src))

    def memcpy_h2d_sync(self, dst, src: np.ndarray) -> None:
        """``cudaMemcpy`` host to device: on the legacy stream (rule legacy_escape while a non-blocking stream
        captures, legacy_implicit while a blocking one does); the host waits for it."""
        src = np.ascontiguousarray(src)
        if src.nbytes != dst.nbytes:
            raise ValueError(f"memcpy_h2d_sync: {src.nbytes} host bytes into a {dst.nbytes}-byte buffer")

        def fn():
            dst[...] = src.reshape(dst.shape)

        self._sync_copy(fn, src.nbytes, "memcpy HtoD")

    def memcpy_d2h_sync(self, dst: np.ndarray, src) -> None:
        """``cudaMemcpy`` device to host into ``dst``: on the legacy stream, synchronous (rules as
        :meth:`memcpy_h2d_sync`)."""
        if not dst.flags.c_contiguous or dst.nbytes != src.nbytes:
            raise ValueError(f"memcpy_d2h_sync: needs a C-contiguous host array of {src.nbytes} bytes")

        def fn():
            dst.reshape(-1).view(np.uint8)[...] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)

        self._sync_copy(fn, dst.nbytes, "memcpy DtoH")

    def _sync_copy(self, fn, nbytes: int, name: str) -> None:
        rt = self.rt
        with rt.lock:
            rt.enqueue(LEGACY_STREAM, "memcpy", name, None if self.timing_only else fn, self.cal.h2d_gpu_us(nbytes),
                       "cudaMemcpy", self.cal.host_api_us)
            rt.dev.wait_host(rt._earliest(rt.legacy, 0.0))

    # ------------------------------------------------------------------ pinned host memory
    def host_alloc(self, shape, dtype) -> np.ndarray:
        """``cudaHostAlloc``: a host array, remembered as pinned (rule unsafe_host_call during capture)."""
        self.rt.unsafe_call("cudaHostAlloc", "unsafe_host_call")
        arr = np.zeros(shape, dtype=dtype)
        self._pinned_ids().add(id(arr))
        return arr

    def free_host(self, arr: np.ndarray) -> None:
        """``cudaFreeHost`` (rule unsafe_host_call). Raises CudaError for an array not from :meth:`host_alloc`."""
        self._pin_call(arr, "cudaFreeHost", True, "cudaErrorInvalidValue", "not memory from cudaHostAlloc")
        self._pinned_ids().discard(id(arr))

    def host_register(self, arr: np.ndarray) -> None:
        """``cudaHostRegister`` (rule unsafe_host_call). Raises CudaError for memory registered already
        (``cudaErrorHostMemoryAlreadyRegistered``)."""
        self._pin_call(arr, "cudaHostRegister", False, "cudaErrorHostMemoryAlreadyRegistered", "already page-locked")
        self._pinned_ids().add(id(arr))

    def host_unregister(self, arr: np.ndarray) -> None:
        """``cudaHostUnregister`` (rule unsafe_host_call). Raises CudaError for memory not registered
        (``cudaErrorHostMemoryNotRegistered``)."""
        self._pin_call(arr, "cudaHostUnregister", True, "cudaErrorHostMemoryNotRegistered", "not registered")
        self._pinned_ids().discard(id(arr))

    def _pin_call(self, arr: np.ndarray, call: str, pinned: bool, error: str, detail: str) -> None:
        """Raise ``error`` unless ``arr`` is pinned as ``pinned`` says, then rule unsafe_host_call for ``call``."""
        if self.is_pinned(arr) != pinned:
            raise CudaError(error, call, detail)
        self.rt.unsafe_call(call, "unsafe_host_call")

    def is_pinned(self, arr: np.ndarray) -> bool:
        """Whether ``arr`` came from :meth:`host_alloc` or was registered (what a trace calls pinned)."""
        return id(arr) in self._pinned_ids()

    def _pinned_ids(self) -> set:
        if not hasattr(self, "_pinned"):
            self._pinned = set()
        return self._pinned

    # ------------------------------------------------------------------ host queries
    def host_query(self, name: str) -> Any:
        """One of :data:`~ds4lab.executor.base.HOST_QUERIES` (rule host_query): host cost only; returns a modeled
        answer (0 for the device, the context and the last error; 1 for attributes). Raises ValueError naming the
        known queries for another name."""
        if name not in HOST_QUERIES:
            raise ValueError(f"host query {name!r}; known: {', '.join(HOST_QUERIES)}")
        self.rt.host_query(name)
        return 0 if name in ("cudaGetDevice", "cudaGetLastError", "cuCtxGetCurrent") else 1

    # ------------------------------------------------------------------ cuBLAS
    def blas_create(self) -> BlasHandle:
        """``cublasCreate`` (rule cublas_create during capture: its device resources are a cudaMalloc)."""
        self.rt.unsafe_call("cublasCreate", "cublas_create")
        if not hasattr(self, "_blas_ids"):
            self._blas_ids = itertools.count(1)
        return BlasHandle(next(self._blas_ids))

    def blas_destroy(self, handle: BlasHandle) -> None:
        """``cublasDestroy``: frees the handle's resources (a cudaFree: rule unsafe_call during capture)."""
        self.rt.unsafe_call("cublasDestroy")
        handle.destroyed = True

    def blas_set_workspace(self, handle: BlasHandle, buf) -> None:
        """``cublasSetWorkspace`` (rule cublas_settings: host-side)."""
        self._blas_setting("cublasSetWorkspace")
        handle.workspace = buf

    def blas_set_stream(self, handle: BlasHandle, stream) -> None:
        """``cublasSetStream`` (rule cublas_settings: host-side)."""
        self._blas_setting("cublasSetStream")
        handle.stream = stream

    def _blas_setting(self, call: str) -> None:
        rt = self.rt
        with rt.lock:
            if rt.live:
                rt._applied("cublas_settings", call)
            rt.dev.host(self.cal.host_api_us)
