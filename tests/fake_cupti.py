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
    "cudaGetDevice_v3020": 10})
driver_api_trace_cbid = enum.IntEnum("driver_api_trace_cbid", {"cuMemAlloc_v2": 308, "cuLaunchKernel": 307,
                                                               "cuCtxSynchronize": 17})


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
        self.callbacks_on.add((int(domain), int(cbid)))

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
            for cb in list(self.subscribers.values()):
                cb(None, dom, cbid, R(callback_site=ApiCallbackSite.API_ENTER, correlation_id=self.corr,
                                      function_name=name.split("_v")[0]))
        self.clock += dur
        kind = ActivityKind.RUNTIME if domain == "runtime" else ActivityKind.DRIVER
        pid = os.getpid() if process_id is None else process_id
        self.deliver([R(kind=kind, start=t0, end=self.clock, process_id=pid, thread_id=thread_id,
                        correlation_id=self.corr, cbid=cbid, return_value=0)])
        return self.corr


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
