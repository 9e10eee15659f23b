"""Several GPUs of one host in one process through CuPy: peer copies and NCCL (``cupy.cuda.nccl``).

:class:`CupyNode` is the GPU counterpart of :class:`ds4lab.sim.devices.SimNode`, with the same methods: one
:class:`~ds4lab.backends.cupy_backend.CupyBackend` per device, peer copies and one NCCL communicator per device
(:class:`CupyComm`); CuPy's errors become :class:`~ds4lab.errors.CudaError` / ``nccl:<name>``
:class:`~ds4lab.errors.CollectiveError`. No call may hang the process: :meth:`CupyNode.wait_stream` polls with a
timeout, then aborts every communicator. Importing this module imports neither CuPy nor NCCL."""

from __future__ import annotations

import time

from ..capture.stream import LEGACY_STREAM
from ..errors import CollectiveError, CudaError
from ..executor.base import BackendUnavailable, check_all_reduce
from .cupy_runtime import _cuda_errors, _error_name

#: ``ncclResult_t`` names by number (NCCL API, "Types": ncclResult_t).
NCCL_RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
#: The documented "pending" answer of cudaStreamQuery.
_NOT_READY = 600


def node_unavailable(n_devices: int = 2) -> str | None:
    """Why a :class:`CupyNode` of ``n_devices`` GPUs cannot be made here (CuPy missing, fewer GPUs, CuPy without NCCL),
    or None when it can."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        found = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:
        return f"no usable CUDA device ({type(e).__name__}: {e})"
    if found < n_devices:
        return f"needs {n_devices} GPUs, this machine has {found}"
    try:
        from cupy.cuda import nccl
    except Exception as e:
        return f"CuPy has no NCCL (cupy.cuda.nccl: {type(e).__name__}: {e})"
    if not getattr(nccl, "available", True):
        return "CuPy has no NCCL (cupy.cuda.nccl.available is False)"
    return None


class _nccl_errors:
    """Context manager: CuPy's ``NcclError`` → :class:`CollectiveError` (``nccl:<name>``), CUDA errors →
    :class:`CudaError`."""

    def __init__(self, call: str) -> None:
        self.call = call
        self.cuda = _cuda_errors(call)

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None:
            return False
        if typ.__name__ == "NcclError":
            status = int(getattr(exc, "status", -1))
            raise CollectiveError(f"nccl:{NCCL_RESULTS.get(status, f'ncclResult({status})')}", self.call,
                                  str(exc)) from None
        return self.cuda.__exit__(typ, exc, tb)


class CupyComm:
    """One rank's NCCL communicator on its GPU (``ncclComm_t`` through ``cupy.cuda.nccl``)."""

    def __init__(self, node: "CupyNode", rank: int, device: int, comm, world: int) -> None:
        self.node, self.rank, self.device, self.comm, self.world = node, rank, device, comm, world
        self.aborted = False

    def all_reduce(self, send, recv, stream, op: str = "sum") -> None:
        """``ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream)`` with this rank's device current;
        returns once enqueued (the stream waits for the peers).

        Raises:
            ValueError: another type than float32, sizes that differ, or another op than sum.
            CollectiveError: NCCL's status (``nccl:ncclInvalidUsage``, ...), or ``nccl:ncclInvalidUsage`` after
                :meth:`abort`.
            CudaError: a CUDA error CuPy raised."""
        from cupy.cuda import nccl

        call = "ncclAllReduce"
        check_all_reduce(send, recv, op)
        if self.aborted:
            raise CollectiveError("nccl:ncclInvalidUsage", call, f"rank {self.rank}: the communicator was aborted")
        ptr = 0 if stream is LEGACY_STREAM else stream.ptr
        with self.node.device_context(self.device), _nccl_errors(call):
            self.comm.allReduce(send.data.ptr, recv.data.ptr, int(send.size), nccl.NCCL_FLOAT32, nccl.NCCL_SUM, ptr)

    def check_async_error(self) -> None:
        """``ncclCommGetAsyncError``: raises CollectiveError when NCCL recorded an asynchronous error."""
        f = getattr(self.comm, "check_async_error", None)
        if f is not None and not self.aborted:
            with self.node.device_context(self.device), _nccl_errors("ncclCommGetAsyncError"):
                f()

    def abort(self) -> None:
        """``ncclCommAbort``: ends this rank's outstanding operations; the communicator is unusable after."""
        if self.aborted:
            return
        with self.node.device_context(self.device), _nccl_errors("ncclCommAbort"):
            self.comm.abort()
        self.aborted = True


class CupyNode:
    """The GPUs ``0 .. n_devices - 1`` of this host (see module docstring); ``seed``: every backend's weight seed;
    ``collective_timeout_s``: how long :meth:`wait_stream` waits before aborting the communicators. Raises
    BackendUnavailable: :func:`node_unavailable` says why (fewer GPUs, no NCCL, no CuPy)."""

    name = "cupy"

    def __init__(self, n_devices: int = 2, *, seed: int = 1234, collective_timeout_s: float = 20.0) -> None:
        why = node_unavailable(n_devices)
        if why:
            raise BackendUnavailable(f"a node of {n_devices} GPUs is unavailable: {why}")
        import cupy

        from .cupy_backend import CupyBackend

        self.cp = cupy
        self.collective_timeout_s = float(collective_timeout_s)
        self.devices = []
        for d in range(n_devices):
            with self.device_context(d):
                self.devices.append(CupyBackend(seed=seed))
        self._comms: list[list[CupyComm]] = []
        self.timing_only = False

    # ------------------------------------------------------------------ devices
    @property
    def n_devices(self) -> int:
        """How many GPUs the node uses."""
        return len(self.devices)

    def backend(self, device: int):
        """Device ``device``'s backend (raises IndexError naming the devices there are)."""
        if not 0 <= device < len(self.devices):
            raise IndexError(f"device {device}: the node has devices 0..{len(self.devices) - 1}")
        return self.devices[device]

    def device_context(self, device: int):
        """``with node.device_context(d):`` — ``d`` is the calling thread's current device for the block."""
        return self.cp.cuda.Device(device)

    def on_device(self, device: int):
        """``cudaSetDevice(device)`` for the calling thread (a rank's thread calls it first). Returns the device's
        backend."""
        be = self.backend(device)
        with _cuda_errors("cudaSetDevice"):
            self.cp.cuda.Device(device).use()
        return be

    def can_access_peer(self, device: int, peer: int) -> bool:
        """``cudaDeviceCanAccessPeer``."""
        with _cuda_errors("cudaDeviceCanAccessPeer"):
            return bool(self.cp.cuda.runtime.deviceCanAccessPeer(device, peer))

    def enable_peer_access(self, device: int, peer: int) -> None:
        """``cudaDeviceEnablePeerAccess(peer)`` with ``device`` current. Raises CudaError
        (cudaErrorPeerAccessAlreadyEnabled the second time, cudaErrorInvalidDevice, ...)."""
        with self.device_context(device), _cuda_errors("cudaDeviceEnablePeerAccess"):
            self.cp.cuda.runtime.deviceEnablePeerAccess(peer)

    # ------------------------------------------------------------------ peer copies
    def memcpy_peer_async(self, dst, dst_device: int, src, src_device: int, stream, device: int) -> None:
        """``cudaMemcpyPeerAsync`` on ``stream`` (a stream of ``device``, the source or destination device). Raises
        ValueError (sizes, device) or CudaError."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"cudaMemcpyPeerAsync: {src.nbytes} bytes into a {dst.nbytes}-byte buffer")
        if device not in (dst_device, src_device):
            raise ValueError(f"cudaMemcpyPeerAsync: the stream's device {device} is neither end of the copy")
        ptr = 0 if stream is LEGACY_STREAM else stream.ptr
        with self.device_context(device), _cuda_errors("cudaMemcpyPeerAsync"):
            self.cp.cuda.runtime.memcpyPeerAsync(dst.data.ptr, dst_device, src.data.ptr, src_device, int(src.nbytes),
                                                 ptr)

    def memcpy_peer(self, dst, dst_device: int, src, src_device: int) -> None:
        """``cudaMemcpyPeer`` (ds4's copies). Raises ValueError (sizes) or CudaError."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"cudaMemcpyPeer: {src.nbytes} bytes into a {dst.nbytes}-byte buffer")
        with self.device_context(src_device), _cuda_errors("cudaMemcpyPeer"):
            self.cp.cuda.runtime.memcpyPeer(dst.data.ptr, dst_device, src.data.ptr, src_device, int(src.nbytes))

    # ------------------------------------------------------------------ NCCL
    def comm_init_all(self, devices: list[int] | None = None) -> list[CupyComm]:
        """``ncclCommInitAll`` over ``devices`` (default every device): one :class:`CupyComm` per rank. Raises
        ValueError for a device named twice, CollectiveError / CudaError from NCCL."""
        from cupy.cuda import nccl

        devs = list(range(self.n_devices)) if devices is None else list(devices)
        if len(set(devs)) != len(devs):
            raise ValueError(f"comm_init_all: devices {devs} name a device twice (NCCL: one rank per device)")
        for d in devs:
            self.backend(d)
        with _nccl_errors("ncclCommInitAll"):
            raw = nccl.NcclCommunicator.initAll(devs)
        group: list[CupyComm] = []
        self._comms.append(group)
        group.extend(CupyComm(self, r, d, c, len(devs)) for r, (d, c) in enumerate(zip(devs, raw)))
        return group

    def abort_all(self) -> list[str]:
        """``ncclCommAbort`` on every communicator of the node; returns the errors aborting raised (as text; an abort
        that fails leaves nothing else to do)."""
        errors = []
        for group in self._comms:
            for c in group:
                try:
                    c.abort()
                except Exception as e:  # noqa: BLE001 - reported to the caller, which is already failing
                    errors.append(f"rank {c.rank}: {e}")
        return errors

    def wait_stream(self, device: int, stream, timeout_s: float | None = None) -> None:
        """Wait for ``stream`` of ``device`` by polling ``cudaStreamQuery`` (a blocking synchronize could hang); after
        ``timeout_s`` (default the node's) every communicator is aborted and ``nccl:timeout`` raised.

        Raises:
            CollectiveError: ``nccl:timeout``; an asynchronous NCCL error of a communicator.
            CudaError: any other status the stream returns."""
        limit = self.collective_timeout_s if timeout_s is None else float(timeout_s)
        ptr = 0 if stream is LEGACY_STREAM else stream.ptr
        deadline = time.monotonic() + limit
        with self.device_context(device):
            while True:
                with _cuda_errors("cudaStreamQuery"):
                    st = int(self.cp.cuda.runtime.streamQuery(ptr))
                if st == 0:
                    gone = [c.rank for g in self._comms for c in g if c.device == device and c.aborted]
                    if gone:  # it completed because a watchdog (another rank's) aborted the communicators
                        raise CollectiveError("nccl:timeout", "cudaStreamQuery",
                                              f"device {device}: completed only after rank(s) {gone} were aborted")
                    return
                if st != _NOT_READY:
                    raise CudaError(_error_name(st), "cudaStreamQuery", f"device {device}: status {st}")
                for group in self._comms:
                    for c in group:
                        if c.device == device:
                            c.check_async_error()
                if time.monotonic() > deadline:
                    aborted = self.abort_all()
                    raise CollectiveError("nccl:timeout", "cudaStreamQuery",
                                          f"device {device}: the stream did not complete in {limit:g} s; every "
                                          "communicator aborted" + (f" ({'; '.join(aborted)})" if aborted else ""))
                time.sleep(0.001)

    def close(self) -> list[str]:
        """``ncclCommDestroy`` on every communicator not aborted; returns the errors (as text)."""
        errors = []
        for group in self._comms:
            for c in group:
                if c.aborted:
                    continue
                try:
                    with self.device_context(c.device), _nccl_errors("ncclCommDestroy"):
                        c.comm.destroy()
                    c.aborted = True
                except Exception as e:  # noqa: BLE001 - reported to the caller
                    errors.append(f"rank {c.rank}: {e}")
        self._comms.clear()
        return errors

    def __enter__(self) -> "CupyNode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self) -> dict:
        """Provenance: each device's backend info and NCCL's version."""
        from cupy.cuda import nccl

        try:
            version = int(nccl.get_version())
        except Exception as e:  # noqa: BLE001 - provenance only
            version = f"unknown ({e})"
        return {"backend": self.name, "devices": [be.info() for be in self.devices], "nccl_version": version,
                "collective_timeout_s": self.collective_timeout_s}


__all__ = ["CupyComm", "CupyNode", "NCCL_RESULTS", "node_unavailable"]
