"""A stand-in for ``cupti-python``'s ``cupti.cupti`` module (the names ds4lab's CUPTI session uses, with
the enum values of cupti-python 13.0.1), so that the GPU path runs on a machine without a GPU.

It keeps what the session asked of it (kinds enabled, callbacks registered and enabled), and lets a
test play CUPTI's part: :meth:`FakeCupti.deliver` hands records to the buffer-completed callback, and
:meth:`FakeCupti.call` enters a CUDA call (runs the subscriber callback, on the caller's thread, when
the call is enabled: as CUPTI does), then emits its activity record.
"""

from __future__ import annotations

import enum
import os
import sys
import types
from types import SimpleNamespace as R


class ActivityKind(enum.IntEnum):
    MEMCPY = 1
    MEMSET = 2
    KERNEL = 3
    DRIVER = 4
    RUNTIME = 5
    CONCURRENT_KERNEL = 10
    MARKER = 12
    CUDA_EVENT = 36
    STREAM = 37
    SYNCHRONIZATION = 38
    GRAPH_TRACE = 51
    MEMORY2 = 49


class CallbackDomain(enum.IntEnum):
    DRIVER_API = 1
    RUNTIME_API = 2


class ApiCallbackSite(enum.IntEnum):
    API_ENTER = 0
    API_EXIT = 1


class ActivityThreadIdType(enum.IntEnum):
    DEFAULT = 0
    SYSTEM = 1


runtime_api_trace_cbid = enum.IntEnum("runtime_api_trace_cbid", {
    "cudaMalloc_v3020": 20, "cudaFree_v3020": 22, "cudaMemcpyAsync_v3020": 41, "cudaMemcpyAsync_ptsz_v7000": 227,
    "cudaStreamSynchronize_v3020": 131, "cudaStreamSynchronize_ptsz_v7000": 232, "cudaLaunchKernel_v7000": 211,
    "cudaGetDevice_v3020": 10, "cudaLaunchKernel_ptsz_v7000": 214, "cudaLaunchKernelExC_v11060": 430,
    "cudaGetFuncBySymbol_v11000": 336})
driver_api_trace_cbid = enum.IntEnum("driver_api_trace_cbid", {"cuMemAlloc_v2": 308, "cuLaunchKernel": 307,
                                                               "cuCtxSynchronize": 17, "cuLaunchKernelEx": 652,
                                                               "cuLaunchKernel_ptsz": 442,
                                                               "cuFuncGetParamInfo": 698})


class FakeCupti(types.ModuleType):
    """The module object (see the module docstring)."""

    ActivityKind = ActivityKind
    CallbackDomain = CallbackDomain
    ApiCallbackSite = ApiCallbackSite
    ActivityThreadIdType = ActivityThreadIdType
    runtime_api_trace_cbid = runtime_api_trace_cbid
    driver_api_trace_cbid = driver_api_trace_cbid
    __version__ = "13.0.1-fake"

    def __init__(self, refuse=()) -> None:
        super().__init__("cupti.cupti")
        self.enabled: set = set()
        self.log: list = []
        self.completed = None
        self.requested = None
        self.subscribers: dict = {}
        self.callbacks_on: set = set()
        self.refuse = set(refuse)
        self.clock = 1_000_000
        self.corr = 0
        self.thread_id_type = None
        self.pending: list = []
        #: launches hand their callback data with a NumPy view of it (``_data``), as cupti-python does
        self.numpy_callback_data = False

    # activity API
    def activity_enable(self, kind):
        if ActivityKind(kind).name in self.refuse:
            raise RuntimeError(f"CUPTI_ERROR_NOT_COMPATIBLE for {ActivityKind(kind).name}")
        self.enabled.add(int(kind))
        self.log.append(("enable", ActivityKind(kind).name))

    def activity_disable(self, kind):
        self.enabled.discard(int(kind))
        self.log.append(("disable", ActivityKind(kind).name))

    def activity_register_callbacks(self, requested, completed):
        self.requested, self.completed = requested, completed
        self.log.append(("register",))

    def activity_flush_all(self, flag):
        self.log.append(("flush", flag))
        if self.pending and self.completed is not None:
            recs, self.pending = self.pending, []
            self.completed(recs)

    def get_timestamp(self):
        self.clock += 1
        return self.clock

    def set_thread_id_type(self, t):
        self.thread_id_type = t

    def get_callback_name(self, domain, cbid):
        enum_ = runtime_api_trace_cbid if int(domain) == CallbackDomain.RUNTIME_API else driver_api_trace_cbid
        return enum_(cbid).name

    def get_stream_id_ex(self, ctx, stream, per_thread):
        return 7 if not per_thread else 14

    # callback API
    def subscribe(self, callback, userdata):
        h = 1000 + len(self.subscribers)
        self.subscribers[h] = callback
        return h

    def unsubscribe(self, h):
        del self.subscribers[h]
        self.callbacks_on.clear()

    def enable_callback(self, on, h, domain, cbid):
        if on:
            self.callbacks_on.add((int(domain), int(cbid)))
        else:
            self.callbacks_on.discard((int(domain), int(cbid)))

    # playing CUPTI's part
    def deliver(self, records):
        """Records CUPTI would deliver at the next flush (kept only for enabled kinds)."""
        self.pending += [r for r in records if int(r.kind) in self.enabled]

    def call(self, name, domain="runtime", dur=100, thread_id=77, process_id=None):
        """Enter a CUDA call: the subscriber callback (when enabled) at entry, then its API record.
        Returns its correlation id."""
        self.corr += 1
        dom = CallbackDomain.RUNTIME_API if domain == "runtime" else CallbackDomain.DRIVER_API
        enum_ = runtime_api_trace_cbid if domain == "runtime" else driver_api_trace_cbid
        cbid = int(enum_[name])
        t0 = self.get_timestamp()
        if (int(dom), cbid) in self.callbacks_on:
            import ctypes

            # CUpti_CallbackData in memory too (callbackSite, functionName, correlationId), for a subscriber
            # handed its address (ds4lab.trace.cupti.NativeCallbacks)
            mem, fname = ctypes.create_string_buffer(72), ctypes.create_string_buffer(name.split("_v")[0].encode())
            ctypes.c_uint64.from_address(ctypes.addressof(mem) + 8).value = ctypes.addressof(fname)
            ctypes.c_uint32.from_address(ctypes.addressof(mem) + 64).value = self.corr
            for cb in list(self.subscribers.values()):
                cb(None, dom, cbid, R(callback_site=ApiCallbackSite.API_ENTER, correlation_id=self.corr,
                                      function_name=name.split("_v")[0], ptr=ctypes.addressof(mem)))
        self.clock += dur
        kind = ActivityKind.RUNTIME if domain == "runtime" else ActivityKind.DRIVER
        pid = os.getpid() if process_id is None else process_id
        self.deliver([R(kind=kind, start=t0, end=self.clock, process_id=pid, thread_id=thread_id,
                        correlation_id=self.corr, cbid=cbid, return_value=0)])
        return self.corr


#: ``cupti.callback_data_dtype`` as cupti-python 13.0.1 has it (only the field the argument capture reads).
FakeCupti.callback_data_dtype = R(fields={"function_params": (None, 16)})

#: Launch call → (offset of the function, offset of the argument array, offset of extra) in its params
#: struct (CUPTI's generated_cuda_*_meta.h), independently of ds4lab.trace.arguments.LAUNCH_LAYOUTS.
_FORMS = {"cudaLaunchKernel": (0, 32, None), "cudaLaunchKernelExC": (8, 16, None), "cuLaunchKernel": (0, 48, 56),
          "cuLaunchKernelEx": (8, 16, 24)}


def _launch(self, name, fn, args, *, domain="runtime", kernel="k", grid=(1, 1, 1), block=(128, 1, 1), stream=13,
            extra=False, nested=None, thread_id=77, dur=100, kernel_us=2):
    """Enter a launch call as CUPTI would: a real ``CUpti_CallbackData`` in memory (ctypes) whose
    ``functionParams`` points to a real params struct, its argument array pointing to each argument's
    bytes (``args``: a list of bytes; ``extra``: one packed buffer through CU_LAUNCH_PARAM_BUFFER_POINTER).
    The subscriber runs at entry and exit (when enabled); ``nested(self)`` runs between them (a driver
    launch the runtime makes). Then its API record and kernel record. Returns the correlation id."""
    import ctypes

    base = name.split("_v")[0].replace("_ptsz", "")
    f_off, a_off, x_off = _FORMS[base]
    keep = [ctypes.create_string_buffer(bytes(a), max(len(a), 1)) for a in args]
    argv = (ctypes.c_void_p * max(len(keep), 1))(*[ctypes.addressof(b) for b in keep])
    params = ctypes.create_string_buffer(64)
    ctypes.c_uint64.from_address(ctypes.addressof(params) + f_off).value = fn
    if extra:
        packed = ctypes.create_string_buffer(b"".join(bytes(a) for a in args), max(sum(len(a) for a in args), 1))
        size = ctypes.c_size_t(sum(len(a) for a in args))
        ex = (ctypes.c_void_p * 5)(1, ctypes.addressof(packed), 2, ctypes.addressof(size), 0)
        keep += [packed, size, ex]
        ctypes.c_uint64.from_address(ctypes.addressof(params) + x_off).value = ctypes.addressof(ex)
    else:
        ctypes.c_uint64.from_address(ctypes.addressof(params) + a_off).value = ctypes.addressof(argv)
    # CUpti_CallbackData as CUPTI fills it: callbackSite at 0, functionParams at 16, symbolName at 32,
    # correlationId at 64 (x86-64)
    cb = ctypes.create_string_buffer(72)
    sym = ctypes.create_string_buffer(kernel.encode())
    keep.append(sym)
    ctypes.c_uint64.from_address(ctypes.addressof(cb) + 16).value = ctypes.addressof(params)
    ctypes.c_uint64.from_address(ctypes.addressof(cb) + 32).value = ctypes.addressof(sym)
    self.corr += 1
    corr = self.corr
    ctypes.c_uint32.from_address(ctypes.addressof(cb) + 64).value = corr
    dom = CallbackDomain.RUNTIME_API if domain == "runtime" else CallbackDomain.DRIVER_API
    enum_ = runtime_api_trace_cbid if domain == "runtime" else driver_api_trace_cbid
    cbid = int(enum_[name])
    t0 = self.get_timestamp()
    on = (int(dom), cbid) in self.callbacks_on
    def data(site):
        ctypes.c_int32.from_address(ctypes.addressof(cb)).value = int(site)
        d = R(callback_site=site, correlation_id=corr, function_name=base, symbol_name=kernel, ptr=ctypes.addressof(cb))
        if self.numpy_callback_data:  # as cupti-python's CallbackData holds it: a NumPy view of the struct
            import numpy as np

            d._data = np.frombuffer((ctypes.c_char * 72).from_address(ctypes.addressof(cb)), dtype=np.uint8)
        return d
    if on:
        for s in list(self.subscribers.values()):
            s(None, dom, cbid, data(ApiCallbackSite.API_ENTER))
    if nested is not None:
        nested(self)
    if on:
        for s in list(self.subscribers.values()):
            s(None, dom, cbid, data(ApiCallbackSite.API_EXIT))
    self.clock += dur
    kind = ActivityKind.RUNTIME if domain == "runtime" else ActivityKind.DRIVER
    self.deliver([R(kind=kind, start=t0, end=self.clock, process_id=os.getpid(), thread_id=thread_id,
                    correlation_id=corr, cbid=cbid, return_value=0),
                  R(kind=ActivityKind.CONCURRENT_KERNEL, name=kernel, start=self.clock + 5,
                    end=self.clock + 5 + kernel_us * 1000, device_id=0, stream_id=stream, correlation_id=corr,
                    grid_x=grid[0], grid_y=grid[1], grid_z=grid[2], block_x=block[0], block_y=block[1],
                    block_z=block[2], static_shared_memory=0, dynamic_shared_memory=0, graph_id=0,
                    graph_node_id=0)])
    del keep, argv, params, cb
    return corr


FakeCupti.launch = _launch


class FakeQueries:
    """The CUDA side of ds4lab.audit.arguments.CudaQueries: ``layouts`` {CUfunction: [(offset, size)]},
    ``runtime`` {host stub: CUfunction}, ``ranges`` [(base, size)] of device memory now; ``calls`` counts."""

    def __init__(self, layouts=None, runtime=None, ranges=()):
        self.layouts, self.runtime, self.ranges = dict(layouts or {}), dict(runtime or {}), list(ranges)
        self.calls = {"runtime_function": 0, "param_layout": 0, "address_range": 0}

    def runtime_function(self, host_fn):
        self.calls["runtime_function"] += 1
        f = self.runtime.get(host_fn, 0)
        return f, "" if f else "cudaGetFuncBySymbol: libcudart.so.13: cudaError 98"

    def param_layout(self, f):
        self.calls["param_layout"] += 1
        if f in self.layouts:
            return list(self.layouts[f]), ""
        return None, "cuFuncGetParamInfo(0): CUDA_ERROR_INVALID_HANDLE"

    def function_name(self, f):
        return ""

    def address_range(self, ptr):
        self.calls["address_range"] += 1
        for b, s in self.ranges:
            if b <= ptr < b + s:
                return b, s
        return None


def install(monkeypatch, refuse=()) -> FakeCupti:
    """Put a fresh :class:`FakeCupti` in ``sys.modules`` (as ``cupti.cupti``) and a fresh ds4lab
    session; returns the fake."""
    from ds4lab.trace.cupti import CuptiSession

    mod = FakeCupti(refuse)
    pkg = types.ModuleType("cupti")
    pkg.cupti = mod
    monkeypatch.setitem(sys.modules, "cupti", pkg)
    monkeypatch.setitem(sys.modules, "cupti.cupti", mod)
    monkeypatch.setattr(CuptiSession, "_instance", None)
    return mod


class FakeLibcupti:
    """The three calls :class:`ds4lab.trace.cupti.NativeCallbacks` makes of CUPTI's library
    (``cuptiSubscribe``, ``cuptiEnableCallback``, ``cuptiUnsubscribe``) over a :class:`FakeCupti`: the
    subscriber is the ``ctypes`` callback itself, called through ``ctypes`` (a C thunk, as CUPTI would
    call it) with the callback data's address."""

    def __init__(self, fake: FakeCupti) -> None:
        self.fake = fake
        self.calls: list = []

    def cuptiSubscribe(self, handle_ref, fn, userdata):
        h = 5000 + len(self.calls)
        self.calls.append(("subscribe", h))
        handle_ref._obj.value = h
        self.fake.subscribers[h] = lambda u, d, c, cb: fn(None, int(d), int(c), int(cb.ptr))
        return 0

    def cuptiEnableCallback(self, on, handle, domain, cbid):
        self.calls.append(("enable", on.value, domain.value, cbid.value))
        self.fake.enable_callback(on.value, handle.value, domain.value, cbid.value)
        return 0

    def cuptiUnsubscribe(self, handle):
        self.calls.append(("unsubscribe", handle.value))
        self.fake.unsubscribe(handle.value)
        return 0
