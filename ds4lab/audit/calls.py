"""The audit's one table of its own: which *call class* a trace's API row is (:func:`classify`, in call order within
one token): the API and what the row says about it (the stream it names, a copy's direction and host memory, where
the event it names was recorded, the calling thread). The table, row by row: ``docs/call-classes.md``. Each class
has a probe (:mod:`ds4lab.audit.probes`) on the simulated runtime; the verdict is what the sim's rules
(:mod:`ds4lab.sim.rules`) do with it, never this table."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from ..trace.capture_path import CAPTURE_STATUS_CALLS
from ..trace.records import GRAPH_LAUNCH_CALLS, KERNEL_LAUNCH_CALLS, api_base_name

MALLOC_APIS = frozenset({"cudaMalloc", "cudaMallocPitch", "cudaMalloc3D", "cudaMallocArray", "cudaMalloc3DArray",
                         "cudaMallocManaged", "cudaMallocMipmappedArray", "cuMemAlloc", "cuMemAllocPitch",
                         "cuMemAllocManaged", "cuMemCreate"})
FREE_APIS = frozenset({"cudaFree", "cudaFreeArray", "cudaFreeMipmappedArray", "cuMemFree", "cuMemRelease"})
MALLOC_ASYNC_APIS = frozenset({"cudaMallocAsync", "cudaMallocFromPoolAsync", "cuMemAllocAsync",
                               "cuMemAllocFromPoolAsync"})
FREE_ASYNC_APIS = frozenset({"cudaFreeAsync", "cuMemFreeAsync"})
HOST_ALLOC_APIS = frozenset({"cudaHostAlloc", "cudaMallocHost", "cuMemHostAlloc", "cuMemAllocHost"})
FREE_HOST_APIS = frozenset({"cudaFreeHost", "cuMemFreeHost"})
HOST_REGISTER_APIS = frozenset({"cudaHostRegister", "cuMemHostRegister"})
HOST_UNREGISTER_APIS = frozenset({"cudaHostUnregister", "cuMemHostUnregister"})
STREAM_SYNC_APIS = frozenset({"cudaStreamSynchronize", "cuStreamSynchronize"})
DEVICE_SYNC_APIS = frozenset({"cudaDeviceSynchronize", "cudaThreadSynchronize", "cuCtxSynchronize"})
EVENT_SYNC_APIS = frozenset({"cudaEventSynchronize", "cuEventSynchronize"})
EVENT_QUERY_APIS = frozenset({"cudaEventQuery", "cuEventQuery"})
EVENT_ELAPSED_APIS = frozenset({"cudaEventElapsedTime", "cuEventElapsedTime"})
EVENT_RECORD_APIS = frozenset({"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord",
                               "cuEventRecordWithFlags"})
STREAM_WAIT_APIS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent"})
STREAM_QUERY_APIS = frozenset({"cudaStreamQuery", "cuStreamQuery"})
CAPTURE_STATUS_APIS = CAPTURE_STATUS_CALLS  # the trace model's (the capture-path pass looks for them too)
CUBLAS_CREATE_APIS = frozenset({"cublasCreate", "cublasLtCreate"})
CUBLAS_SETTINGS_APIS = frozenset({"cublasSetWorkspace", "cublasSetStream"})
#: Host-only calls (rule ``host_query``): queries, attribute reads and settings, handle look-ups,
#: stream and event creation. CUDA Runtime API "Device Management", "Error Handling", "Version
#: Management", "Occupancy", "Stream Management", "Event Management"; Driver API "Context Management".
HOST_QUERY_APIS = frozenset({
    "cudaGetDevice", "cudaSetDevice", "cudaGetDeviceCount", "cudaGetLastError", "cudaPeekAtLastError",
    "cudaGetErrorString", "cudaGetErrorName", "cudaFuncGetAttributes", "cudaFuncSetAttribute",
    "cudaFuncSetCacheConfig", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaOccupancyMaxPotentialBlockSize",
    "cudaOccupancyAvailableDynamicSMemPerBlock", "cudaDeviceGetAttribute", "cudaGetDeviceProperties",
    "cudaDeviceGetStreamPriorityRange", "cudaDeviceCanAccessPeer", "cudaPointerGetAttributes",
    "cudaDriverGetVersion", "cudaRuntimeGetVersion", "cudaStreamGetPriority", "cudaStreamGetFlags",
    "cudaStreamGetId", "cudaStreamGetDevice", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
    "cudaGetFuncBySymbol", "cudaGetSymbolAddress", "cudaGetSymbolSize", "cudaThreadExchangeStreamCaptureMode",
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority", "cudaEventCreate",
    "cudaEventCreateWithFlags", "cudaEventDestroy", "cuEventDestroy", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuCtxPushCurrent", "cuCtxPopCurrent",
    "cuCtxGetDevice", "cuCtxGetStreamPriorityRange", "cuDeviceGet", "cuDeviceGetAttribute", "cuDeviceGetCount",
    "cuDevicePrimaryCtxGetState", "cuDevicePrimaryCtxRetain", "cuFuncGetAttribute", "cuFuncSetAttribute",
    "cuGetProcAddress", "cuDriverGetVersion", "cuPointerGetAttribute", "cuPointerGetAttributes",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor", "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cuOccupancyMaxPotentialBlockSize", "cuStreamGetCtx", "cuStreamGetPriority", "cuStreamGetFlags",
    "cuStreamGetId", "cuThreadExchangeStreamCaptureMode", "cuStreamCreate", "cuStreamCreateWithPriority",
    "cuEventCreate", "cuKernelGetFunction", "cuKernelGetName", "cuFuncGetName", "cuLibraryGetKernel",
    "cuModuleGetFunction"})
#: Classes whose rule depends on the calling thread (rule unsafe_call's interaction modes).
UNSAFE_CLASSES = frozenset({"malloc", "free", "host_alloc", "free_host", "host_register", "host_unregister",
                            "event_sync.before", "event_query.before", "cublas_create"})

_MEMCPY = re.compile(r"^cu(da)?Memcpy")
_MEMSET = re.compile(r"^cu(da)?Memset")
_DIRECTIONS = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "PtoP": "d2d", "HtoA": "h2d", "AtoH": "d2h",
               "DtoA": "d2d", "AtoD": "d2d", "AtoA": "d2d", "HtoH": "h2h"}


@functools.lru_cache(maxsize=4096)
def is_launch(name: str) -> bool:
    """Whether API ``name`` issues device work paired by correlation (a kernel or graph launch, memcpy, memset)."""
    n = api_base_name(name)
    return n in KERNEL_LAUNCH_CALLS or n in GRAPH_LAUNCH_CALLS or bool(_MEMCPY.match(n)) or bool(_MEMSET.match(n))


def copy_direction(name: str, copy_kind: str) -> str:
    """``h2d``, ``d2h``, ``d2d``, ``h2h`` or ``unknown``: from the device row's copy kind when the trace has it, else
    from the API name (``cuMemcpyHtoDAsync``)."""
    if copy_kind in _DIRECTIONS:
        return _DIRECTIONS[copy_kind]
    for k, v in _DIRECTIONS.items():
        if k in name:
            return v
    return "unknown"


@dataclass
class TokenContext:
    """What :func:`classify` tracks through one token's calls: ``capture`` (the main stream), ``legacy``, ``main_tid``,
    ``joined`` (streams in the capture), ``in_token_events`` (events recorded in the token on a captured stream),
    ``recorded_here`` (any such so far), ``assumptions`` (what was taken where the trace is silent)."""

    capture: int
    legacy: frozenset
    main_tid: int
    joined: set = field(default_factory=set)
    in_token_events: set = field(default_factory=set)
    recorded_here: bool = False
    assumptions: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.joined.add(self.capture)

    def rel(self, stream: int, name: str) -> str:
        """``capture``, ``legacy`` or ``other`` for a row naming ``stream`` (-1: not in the trace)."""
        if stream < 0:
            self.assumptions.add(f"{name}: the trace does not give its stream; taken as the capture stream")
            return "capture"
        if stream in self.joined:
            return "capture"
        return "legacy" if stream in self.legacy else "other"

    def origin(self, event: int, name: str) -> str:
        """``in_token`` when ``event`` was recorded in this token on a captured stream, else ``before``."""
        if event >= 0:
            return "in_token" if event in self.in_token_events else "before"
        self.assumptions.add(f"{name}: the trace does not name its event; taken as recorded in the token when an "
                             "event was recorded on a captured stream before it in the token, else before the token")
        return "in_token" if self.recorded_here else "before"


def classify(name: str, stream: int, tid: int, event: int, copy_kind: str, host_memory: str,
             ctx: TokenContext) -> str | None:
    """The call class of one API row (module docstring's table), updating ``ctx`` (joined streams, events recorded in
    the token). None: an API no rule covers."""
    n = api_base_name(name)
    key = _classify(n, name, stream, event, copy_kind, host_memory, ctx)
    if key in UNSAFE_CLASSES and tid >= 0 and tid != ctx.main_tid:
        return "other_thread." + key
    return key


def _classify(n, name, stream, event, copy_kind, host_memory, ctx: TokenContext) -> str | None:
    if n in KERNEL_LAUNCH_CALLS:
        return f"kernel@{ctx.rel(stream, n)}"
    if n in GRAPH_LAUNCH_CALLS:
        return f"graph_launch@{ctx.rel(stream, n)}"
    if _MEMSET.match(n):
        return f"memset_async@{ctx.rel(stream, n)}" if n.endswith("Async") else "memset_sync"
    if _MEMCPY.match(n):
        d = copy_direction(n, copy_kind)
        if not n.endswith("Async"):
            return f"memcpy_sync.{d if d in ('h2d', 'd2h') else 'd2d'}"
        rel = ctx.rel(stream, n)
        if rel != "capture":
            return f"memcpy_async@{rel}"
        if d in ("h2d", "d2h"):
            mem = host_memory if host_memory in ("pageable", "pinned") else "pageable"
            if host_memory not in ("pageable", "pinned"):
                ctx.assumptions.add(f"{n}: the trace does not say whether its host memory is pinned; taken as "
                                    "pageable")
            return f"memcpy_async.{d}.{mem}@capture"
        if d == "unknown":
            ctx.assumptions.add(f"{n}: the trace does not give the copy's direction; taken as device to device")
        return "memcpy_async.d2d@capture"
    for apis, key in ((MALLOC_APIS, "malloc"), (FREE_APIS, "free"), (HOST_ALLOC_APIS, "host_alloc"),
                      (FREE_HOST_APIS, "free_host"), (HOST_REGISTER_APIS, "host_register"),
                      (HOST_UNREGISTER_APIS, "host_unregister"), (DEVICE_SYNC_APIS, "device_sync"),
                      (CAPTURE_STATUS_APIS, "capture_status"), (HOST_QUERY_APIS, "host_query"),
                      (CUBLAS_CREATE_APIS, "cublas_create"), (CUBLAS_SETTINGS_APIS, "cublas_settings")):
        if n in apis:
            return key
    for apis, key in ((MALLOC_ASYNC_APIS, "malloc_async"), (FREE_ASYNC_APIS, "free_async"),
                      (STREAM_SYNC_APIS, "stream_sync"), (STREAM_QUERY_APIS, "stream_query")):
        if n in apis:
            return f"{key}@{ctx.rel(stream, n)}"
    for apis, key in ((EVENT_SYNC_APIS, "event_sync"), (EVENT_QUERY_APIS, "event_query"),
                      (EVENT_ELAPSED_APIS, "event_elapsed")):
        if n in apis:
            return f"{key}.{ctx.origin(event, n)}"
    if n in EVENT_RECORD_APIS:
        rel = ctx.rel(stream, n)
        if rel == "capture":
            ctx.recorded_here = True
            if event >= 0:
                ctx.in_token_events.add(event)
        elif event >= 0:
            ctx.in_token_events.discard(event)  # re-recorded eagerly: no longer a captured event
        return f"event_record@{rel}"
    if n in STREAM_WAIT_APIS:
        rel = ctx.rel(stream, n)
        origin = ctx.origin(event, n)
        if rel == "capture":
            return "wait_event.join" if origin == "in_token" else "wait_event.outside"
        if origin == "in_token":
            if rel == "legacy":
                return "wait_event.legacy"
            ctx.joined.add(stream)
            return "wait_event.fork"
        return "wait_event@other"
    return None
