"""Live traces: this process's device work as the trace model's records, for every figure that reads a trace of
ds4lab's own work. :func:`trace_source` picks a source for a backend (never raises): :class:`CuptiTimeline`,
:class:`SimTimeline` (MODELED) or :class:`Unavailable`. Also what ``ds4lab trace`` records beside:
:class:`RecordingAnnotator`, :class:`SimCallLog` (MODELED) and :func:`kernel_args`."""

from __future__ import annotations

import numbers
from typing import Callable

import numpy as np

from . import records as R
from .cupti import KERNEL_KINDS, TRACE_KINDS, CuptiSession, cupti_available

__all__ = ["CuptiTimeline", "RecordingAnnotator", "SimCallLog", "SimTimeline", "Unavailable", "kernel_args",
           "scalar_args", "trace_source"]


# ----------------------------------------------------------------------------- device work
class SimTimeline:
    """The sim's modeled timeline as device records (MODELED; device 0, or a node's own index). ``calls``: a
    :class:`SimCallLog` installed while it runs (:meth:`take_api`), linked by correlation id; a replayed node's id is
    its position in the graph's launch order."""

    available, reason = True, ""
    modeled = True

    def __init__(self, be, calls: bool = False) -> None:
        self.be = be
        self.device = be.device if isinstance(getattr(be, "device", None), int) else 0
        self.calls = SimCallLog(be) if calls else None
        self.clock_ns = lambda: be.host_clock_us() * 1e3  # the modeled host clock
        self._seen = be.trace_records(0)[1]

    def start(self) -> None:
        self._seen = self.be.trace_records(0)[1]
        if self.calls is not None and not self.calls.on:
            self.calls.install()

    def stop(self) -> None:
        if self.calls is not None:
            self.calls.remove()

    def take(self) -> list:
        """The device records since the last take, in timeline order."""
        since = self._seen
        new, self._seen = self.be.trace_records(self._seen)
        first = self._seen - len(new)
        out, node, last_graph = [], 0, None
        corr = self.calls.corr_of if self.calls is not None else None
        for j, (stream, name, start, end, kind, graph) in enumerate(new):
            if graph is None:
                last_graph = None
            elif graph != last_graph:
                node, last_graph = 0, graph
            common = dict(start_ns=start * 1e3, end_ns=end * 1e3, stream=str(stream), device=self.device,
                          graph_id=0 if graph is None else int(graph), graph_node_id=0 if graph is None else node,
                          correlation=corr.pop(first + j, -1) if corr is not None else -1)
            if kind == "kernel":
                out.append(R.Kernel(name=name, **common))
            elif kind == "memset":
                out.append(R.Memset(label=name, memory="Device", **common))
            else:
                out.append(R.Copy(label=name, copy_kind=_sim_copy_kind(name), **common))
            if graph is not None:
                node += 1
        if corr is not None:
            for i in [i for i in corr if i < since]:
                del corr[i]
        return out

    def take_api(self) -> list:
        """The API-level records (:class:`~ds4lab.trace.records.ApiCall`, ``Sync``) logged since the last call."""
        return self.calls.take() if self.calls is not None else []

    def stream_of(self, stream) -> tuple[int, str]:
        """``(id, kind)`` of a device record's stream (the sim names its streams; the log numbers them)."""
        return self.calls.streams.get(stream, (-1, "")) if self.calls is not None else (-1, "")

    def stream_types(self) -> dict:
        """``{stream id: kind}`` of the streams the calls named so far."""
        return {sid: kind for sid, kind in self.calls.streams.values()} if self.calls is not None else {}

    def note_stream(self, stream) -> None:
        """Nothing to learn: the sim's call log names every stream a call uses."""


def _sim_copy_kind(name: str) -> str:
    """The copy kind a sim copy's name ends with (``memcpy HtoD`` → ``HtoD``), or ``""``."""
    last = name.rsplit(" ", 1)[-1]
    return last if last in R.COPY_KINDS else ""


class CuptiTimeline:
    """Records of the CUPTI session of ``kinds`` as a trace source: :meth:`take` returns the device records,
    :meth:`take_api` the others; ``clock_ns`` is CUPTI's clock. Raises CuptiUnavailable without CUPTI."""

    available, reason = True, ""
    modeled = False

    def __init__(self, kinds=KERNEL_KINDS) -> None:
        self.session = CuptiSession.get()
        self.kinds = tuple(kinds)
        self.clock_ns = self.session.timestamp
        self.sub = None
        self._other: list = []
        self.known: dict[int, str] = {}  # stream id → kind, for streams made before the trace started

    def start(self) -> None:
        """Start receiving (a fresh subscription: earlier records are not seen)."""
        if self.sub is None or self.sub.closed:
            self.sub = self.session.subscribe(self.kinds)
        else:
            self.sub.take()
        self._other = []

    def stop(self) -> None:
        if self.sub is not None:
            self.sub.close()

    def take(self) -> list:
        """The device records since the last take (the others kept for :meth:`take_api`)."""
        if self.sub is None or self.sub.closed:
            return []
        recs = self.sub.take()
        self._other += [r for r in recs if not isinstance(r, R.DEVICE_TYPES)]
        return [r for r in recs if isinstance(r, R.DEVICE_TYPES)]

    def take_api(self) -> list:
        """The API-level records (ApiCall, Sync, EventRecord, StreamMade) since the last call."""
        out, self._other = self._other, []
        return out

    def stream_types(self) -> dict:
        """``{stream id: kind}``: the current context's streams as the driver says now (none where no driver call is
        possible here), and those learnt by :meth:`note_stream`."""
        try:
            types = dict(self.session.stream_types_now())
        except Exception:  # noqa: BLE001 - no driver call possible here: stream kinds from STREAM records only
            types = {}
        return {**types, **self.known}

    def stream_of(self, stream) -> tuple[int, str]:
        """``(id, kind)`` of a device record's stream (CUPTI's id; its kind where known)."""
        return int(stream), self.known.get(int(stream), "")

    def note_stream(self, stream) -> None:
        """Learn the CUPTI id and kind of a stream created before the trace started (``cuptiGetStreamIdEx``,
        ``cuStreamGetFlags``); a failure leaves it unknown."""
        from .cupti import current_context

        ptr = getattr(stream, "ptr", None)
        if not isinstance(ptr, int) or not ptr:
            return
        try:
            from cuda.bindings import driver as cu

            sid = int(self.session.c.get_stream_id_ex(current_context(), ptr, 0))
            err, flags = cu.cuStreamGetFlags(ptr)
            if int(err) == 0:
                self.known[sid] = "non_blocking" if int(flags) & 0x1 else "blocking"
        except Exception:  # noqa: BLE001 - no binding, or a driver that refuses: the stream stays unknown
            return


class Unavailable:
    """No trace here; ``reason`` says why (no records, every call a no-op)."""

    available = False
    modeled = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def take(self) -> list:
        return []


def trace_source(be, kinds=KERNEL_KINDS, *, calls: bool = False):
    """The device-work trace of backend ``be``: CUPTI on a GPU (``kinds``; ``TRACE_KINDS`` with ``calls``), the
    modeled timeline on ``sim`` (with its call log), else an :class:`Unavailable` saying why."""
    from ..executor.base import ModeledTime

    if isinstance(be, ModeledTime):  # a backend that keeps a (modeled) device timeline
        return SimTimeline(be, calls=calls)
    if not be.is_gpu:
        return Unavailable(f"no kernel timeline on the {be.name} backend: use cupy (a GPU) or sim")
    ok, why = cupti_available()
    if not ok:
        return Unavailable(why)
    try:
        return CuptiTimeline(TRACE_KINDS if calls else kinds)
    except Exception as e:  # noqa: BLE001 - CUPTI's own error, named
        return Unavailable(f"CUPTI did not start ({type(e).__name__}: {e})")


def busy_us(records) -> tuple[float, float, int]:
    """``(busy, span, kernels)`` of device records: the union of kernel intervals (µs), first start to last end (µs),
    the kernel count; ``(0, 0, 0)`` without kernels."""
    iv = sorted((float(r.start_ns), float(r.end_ns)) for r in records if r.kind == "kernel")
    if not iv:
        return 0.0, 0.0, 0
    total, cur_s, cur_e = 0.0, iv[0][0], iv[0][1]
    for s, e in iv[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    total += cur_e - cur_s
    return total * 1e-3, (max(e for _, e in iv) - iv[0][0]) * 1e-3, len(iv)


# ----------------------------------------------------------------------------- kernel arguments
def scalar_args(args) -> str:
    """A kernel's scalar arguments as ``index=value`` joined by ``,`` (integers exactly, floats with ``repr``); array
    and pointer arguments are left out. ``""`` when it has none."""
    out = []
    for i, a in enumerate(args):
        if isinstance(a, (bool, np.bool_)):
            out.append(f"{i}={int(a)}")
        elif isinstance(a, numbers.Integral):
            out.append(f"{i}={int(a)}")
        elif isinstance(a, numbers.Real):
            out.append(f"{i}={float(a)!r}")
    return ",".join(out)


def kernel_args(args) -> R.KernelArgs:
    """The :class:`~ds4lab.trace.records.KernelArgs` of a launch as ds4lab's launch layer passed it (its scalar
    arguments; no parameter bytes: the launch layer does not pack them)."""
    return R.KernelArgs(scalars=scalar_args(args))


# ----------------------------------------------------------------------------- NVTX ranges
class RecordingAnnotator:
    """An NVTX annotator recording each range's push and pop time with ``clock_ns`` and passing every call on to
    ``inner``. ``ranges``: a :class:`~ds4lab.trace.records.Range` per range popped while :attr:`recording`; a pop
    without a push raises IndexError."""

    enabled = True

    def __init__(self, clock_ns: Callable[[], float], inner=None) -> None:
        self.clock_ns = clock_ns
        self.inner = inner
        self.recording = False
        self.ranges: list[R.Range] = []
        self._stack: list[tuple] = []

    def push(self, message: str, cluster: str, payload: int | None = None) -> None:
        self._stack.append((message, cluster, payload, self.clock_ns()))
        if self.inner is not None:
            self.inner.push(message, cluster, payload)

    def pop(self) -> None:
        if self.inner is not None:
            self.inner.pop()
        message, cluster, payload, t0 = self._stack.pop()
        if self.recording:
            self.ranges.append(R.Range(name=message, cluster=cluster, payload=payload, start_ns=t0,
                                       end_ns=self.clock_ns(), depth=len(self._stack)))


# ----------------------------------------------------------------------------- the sim's API level
#: Backend call → (CUDA API name, index of its stream argument or None, sync kind or "").
SIM_CALLS = {
    "launch": ("cudaLaunchKernel", 0, ""), "memset_async": ("cudaMemsetAsync", 0, ""),
    "memset_sync": ("cudaMemset", None, ""), "copy_h2d": ("cudaMemcpyAsync", 0, ""),
    "event_record": ("cudaEventRecord", 0, ""), "graph_launch": ("cudaGraphLaunch", 1, ""),
    "synchronize": ("cudaDeviceSynchronize", None, "device"), "stream_synchronize": ("cudaStreamSynchronize", 0,
                                                                                      "stream"),
    "event_synchronize": ("cudaEventSynchronize", None, "event"), "event_query": ("cudaEventQuery", None, ""),
    "stream_query": ("cudaStreamQuery", 0, ""), "stream_wait_event": ("cudaStreamWaitEvent", 0, "stream_wait_event"),
    "malloc": ("cudaMalloc", None, ""), "free": ("cudaFree", None, ""), "malloc_async": ("cudaMallocAsync", 0, ""),
    "free_async": ("cudaFreeAsync", 0, ""),
}


class SimCallLog:
    """The sim backend's calls as the CUDA API level (MODELED): ``launch`` → ``cudaLaunchKernel``, ``memset_sync``
    → ``cudaMemset``, ``graph_launch`` → ``cudaGraphLaunch``, ..., with the modeled host clock around each, the
    stream it names and a correlation id shared with its device work. :meth:`install` wraps the backend's methods,
    :meth:`remove` unwraps them; ``calls`` (ApiCall and Sync records), ``corr_of``, ``streams``."""

    def __init__(self, be) -> None:
        self.be = be
        self.calls: list = []
        self.corr_of: dict[int, int] = {}
        self.streams: dict[str, tuple] = {}
        self._corr = 0
        self._names: list[str] = []
        self.on = False

    def _stream(self, s):
        from ..capture.stream import LEGACY_STREAM

        rt = getattr(self.be, "rt", None)
        legacy = getattr(rt, "legacy", None)
        obj = legacy if (s is LEGACY_STREAM or s is None) else s
        sid, kind = getattr(obj, "id", -1), getattr(obj, "kind", "")
        name = getattr(obj, "name", str(obj))
        self.streams[name] = (sid, kind)
        return sid, kind

    def install(self) -> "SimCallLog":
        for meth, (api, si, sync) in SIM_CALLS.items():
            orig = getattr(self.be, meth, None)
            if orig is None:
                continue
            setattr(self.be, meth, self._wrap(orig, api, si, sync))
            self._names.append(meth)
        self.on = True
        return self

    def remove(self) -> None:
        for meth in self._names:
            self.be.__dict__.pop(meth, None)
        self._names = []
        self.on = False

    def _wrap(self, orig, api, si, sync):
        log = self

        def call(*a, **k):
            if not log.on:
                return orig(*a, **k)
            log._corr += 1
            corr = log._corr
            stream = a[si] if si is not None and len(a) > si else None
            if api == "cudaMemset":
                sid, _ = log._stream(None)  # ds4 today: the synchronous memset goes to the legacy stream
            elif si is not None:
                sid, _ = log._stream(stream)
            else:
                sid = -1
            n0 = log.be.trace_records(0)[1]
            t0 = log.be.host_clock_us()
            try:
                return orig(*a, **k)
            finally:
                t1 = log.be.host_clock_us()
                n1 = log.be.trace_records(0)[1]
                for i in range(n0, n1):
                    log.corr_of[i] = corr
                log.calls.append(R.ApiCall(name=api, domain="runtime", start_ns=t0 * 1e3, end_ns=t1 * 1e3, tid=1,
                                           correlation=corr, stream=sid))
                if sync:
                    log.calls.append(R.Sync(sync_kind=sync, start_ns=t0 * 1e3, end_ns=t1 * 1e3, stream=sid,
                                            correlation=corr))
        return call

    def take(self) -> list:
        """The records logged since the last take."""
        out, self.calls = self.calls, []
        return out
