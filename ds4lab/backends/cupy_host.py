"""The ``cupy`` backend's host-side runtime calls (host copies, synchronous ``cudaMemcpy``, pinned host memory,
host-only queries, cuBLAS handles), mixed into :class:`ds4lab.backends.cupy_backend.CupyBackend`. Every status is
checked: :class:`~ds4lab.errors.CudaError`, or :class:`~ds4lab.errors.LibraryError` (``cublas:<name>``)."""

from __future__ import annotations

import ctypes
import re
from typing import Any

import numpy as np

from ..executor.base import HOST_QUERIES
from .cupy_runtime import _checked, _cudart

#: cudaDevAttrMultiProcessorCount (CUDA Runtime API, enum cudaDeviceAttr): the attribute the
#: ``cudaDeviceGetAttribute`` host query reads.
_ATTR_MULTIPROCESSORS = 16
#: The kernel the function-attribute and occupancy queries ask about (kernels/probe: every build has it).
_QUERY_KERNEL = "tiny_add"


def _host_array(ptr: int, shape, dtype) -> np.ndarray:
    """A NumPy view of ``nbytes`` host bytes at ``ptr`` (memory ds4lab owns through the CUDA runtime)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = (ctypes.c_byte * max(n, 1)).from_address(int(ptr))
    return np.frombuffer(raw, dtype=np.uint8, count=n).view(dt).reshape(shape)


def _blas_error(e: Exception, call: str):
    """CuPy's ``CUBLASError`` as a :class:`~ds4lab.errors.LibraryError` named ``cublas:<status>``."""
    from ..errors import LibraryError

    m = re.search(r"CUBLAS_STATUS_\w+", str(e))
    return LibraryError(f"cublas:{m.group(0) if m else 'unknown'}", call, str(e))


class CupyHostMixin:
    """Host-side runtime calls on a GPU (see the module docstring)."""

    # ------------------------------------------------------------------ copies
    def copy_d2h(self, stream, dst: np.ndarray, src) -> None:
        """``cudaMemcpyAsync`` device to host into ``dst`` (must be C-contiguous: it is written in place)."""
        if not dst.flags.c_contiguous or dst.nbytes != src.nbytes:
            raise ValueError(f"copy_d2h: needs a C-contiguous host array of {src.nbytes} bytes")
        self._rt("cudaMemcpyAsync", "memcpyAsync", dst.ctypes.data, src.data.ptr, src.nbytes,
                 self.cp.cuda.runtime.memcpyDeviceToHost, self._ptr_stream(stream))

    def memcpy_h2d_sync(self, dst, src: np.ndarray) -> None:
        """``cudaMemcpy`` host to device (synchronous, the legacy stream)."""
        src = np.ascontiguousarray(src)
        if src.nbytes != dst.nbytes:
            raise ValueError(f"memcpy_h2d_sync: {src.nbytes} host bytes into a {dst.nbytes}-byte buffer")
        self._rt("cudaMemcpy", "memcpy", dst.data.ptr, src.ctypes.data, src.nbytes,
                 self.cp.cuda.runtime.memcpyHostToDevice)

    def memcpy_d2h_sync(self, dst: np.ndarray, src) -> None:
        """``cudaMemcpy`` device to host into ``dst`` (C-contiguous; synchronous, the legacy stream)."""
        if not dst.flags.c_contiguous or dst.nbytes != src.nbytes:
            raise ValueError(f"memcpy_d2h_sync: needs a C-contiguous host array of {src.nbytes} bytes")
        self._rt("cudaMemcpy", "memcpy", dst.ctypes.data, src.data.ptr, src.nbytes,
                 self.cp.cuda.runtime.memcpyDeviceToHost)

    # ------------------------------------------------------------------ pinned host memory
    def _pinned(self) -> dict:
        if not hasattr(self, "_pinned_ptrs"):
            self._pinned_ptrs: dict[int, int] = {}
        return self._pinned_ptrs

    def host_alloc(self, shape, dtype) -> np.ndarray:
        """``cudaHostAlloc`` (flags 0: ``cudaHostAllocDefault``) of ``shape`` × ``dtype`` as a NumPy array."""
        n = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        ptr = int(self._rt("cudaHostAlloc", "hostAlloc", n, 0))
        arr = _host_array(ptr, shape, dtype)
        self._pinned()[arr.ctypes.data] = ptr
        return arr

    def free_host(self, arr: np.ndarray) -> None:
        """``cudaFreeHost`` of an array from :meth:`host_alloc`. Raises ValueError for another array."""
        ptr = self._pinned().pop(arr.ctypes.data, None)
        if ptr is None:
            raise ValueError("free_host: not an array from host_alloc")
        self._rt("cudaFreeHost", "freeHost", ptr)

    def host_register(self, arr: np.ndarray) -> None:
        """``cudaHostRegister`` (flags 0) of ``arr``'s memory (C-contiguous)."""
        if not arr.flags.c_contiguous:
            raise ValueError("host_register: needs a C-contiguous array")
        if hasattr(self.cp.cuda.runtime, "hostRegister"):
            self._rt("cudaHostRegister", "hostRegister", arr.ctypes.data, arr.nbytes, 0)
            return
        cudart = _cudart()
        _checked("cudaHostRegister", cudart.cudaHostRegister(arr.ctypes.data, arr.nbytes, 0))

    def host_unregister(self, arr: np.ndarray) -> None:
        """``cudaHostUnregister`` of memory registered with :meth:`host_register`."""
        if hasattr(self.cp.cuda.runtime, "hostUnregister"):
            self._rt("cudaHostUnregister", "hostUnregister", arr.ctypes.data)
            return
        cudart = _cudart()
        _checked("cudaHostUnregister", cudart.cudaHostUnregister(arr.ctypes.data))

    # ------------------------------------------------------------------ host queries
    def host_query(self, name: str) -> Any:
        """One of :data:`~ds4lab.executor.base.HOST_QUERIES` through ``cuda.bindings`` (runtime or driver), its status
        checked. ``cudaGetLastError`` returns the last error's number (its answer, not a failure of the call).
        """
        if name not in HOST_QUERIES:
            raise ValueError(f"host query {name!r}; known: {', '.join(HOST_QUERIES)}")
        cudart = _cudart()
        if name == "cudaGetDevice":
            return _checked(name, cudart.cudaGetDevice())
        if name == "cudaGetLastError":
            res = cudart.cudaGetLastError()
            return int(res[0] if isinstance(res, tuple) else res)
        if name == "cudaDeviceGetAttribute":
            dev = _checked("cudaGetDevice", cudart.cudaGetDevice())
            return _checked(name, cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr(_ATTR_MULTIPROCESSORS), dev))
        from cuda.bindings import driver

        if name == "cuCtxGetCurrent":
            return int(_checked(name, driver.cuCtxGetCurrent()))
        func = driver.CUfunction(int(self.function(_QUERY_KERNEL).ptr))
        if name == "cuFuncGetAttribute":
            return _checked(name, driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, func))
        return _checked(name, driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(func, 256, 0))

    # ------------------------------------------------------------------ cuBLAS
    def _cublas(self):
        from cupy_backends.cuda.libs import cublas

        return cublas

    def blas_create(self) -> int:
        """``cublasCreate``: a handle (an int). Raises LibraryError with cuBLAS's status name."""
        cublas = self._cublas()
        try:
            return int(cublas.create())
        except Exception as e:  # CUBLASError (CuPy's) carries the status
            if type(e).__name__ != "CUBLASError":
                raise
            raise _blas_error(e, "cublasCreate") from None

    def blas_destroy(self, handle: int) -> None:
        """``cublasDestroy``."""
        cublas = self._cublas()
        try:
            cublas.destroy(handle)
        except Exception as e:
            if type(e).__name__ != "CUBLASError":
                raise
            raise _blas_error(e, "cublasDestroy") from None

    def blas_set_stream(self, handle: int, stream) -> None:
        """``cublasSetStream``, called in the cuBLAS library itself (ctypes, status checked): CuPy's binding refuses
        any call while the stream captures (its own NotImplementedError, not cuBLAS's rule), and what is checked
        here is what cuBLAS does, as engines that capture call it."""
        lib = _libcublas()
        _blas_status(lib.cublasSetStream_v2(ctypes.c_void_p(handle), ctypes.c_void_p(self._ptr_stream(stream))),
                     "cublasSetStream")

    def blas_set_workspace(self, handle: int, buf) -> None:
        """``cublasSetWorkspace`` (cuBLAS ≥ 11.3) with ``buf``'s device memory, called in the cuBLAS library itself as
        :meth:`blas_set_stream` is (CuPy's bindings refuse calls during a capture)."""
        lib = _libcublas()
        _blas_status(lib.cublasSetWorkspace_v2(ctypes.c_void_p(handle), ctypes.c_void_p(buf.data.ptr),
                                               ctypes.c_size_t(buf.nbytes)), "cublasSetWorkspace")


def _blas_status(status: int, call: str) -> None:
    """Raise :class:`~ds4lab.errors.LibraryError` (``cublas:<status name>``) for a cublasStatus_t other than 0."""
    if status != 0:
        from ..errors import LibraryError

        raise LibraryError(f"cublas:{_CUBLAS_STATUS.get(status, f'status {status}')}", call)


#: cublasStatus_t numbers (cuBLAS library reference, "cublasStatus_t").
_CUBLAS_STATUS = {1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
                  8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                  13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                  15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}


def _libcublas():
    """The cuBLAS shared library already loaded by CuPy (by soname, newest first). Raises OSError naming the names
    tried when none loads."""
    tried = []
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            tried.append(name)
            continue
        lib.cublasSetWorkspace_v2.restype = ctypes.c_int
        lib.cublasSetStream_v2.restype = ctypes.c_int
        return lib
    raise OSError(f"no cuBLAS library to call cublasSetStream_v2 and cublasSetWorkspace_v2 ({', '.join(tried)})")
