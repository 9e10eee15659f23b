"""The API level of ``ds4lab trace`` (for ``ds4lab audit`` of ds4lab's own token): the CUDA calls each
traced token made, and each kernel's scalar arguments.

* On a GPU the calls are CUPTI ``RUNTIME``/``DRIVER`` activity records, with ``SYNCHRONIZATION``,
  ``CUDA_EVENT`` and ``STREAM`` records for what they synchronized, recorded and on which kind of
  stream (the legacy stream's id from ``cuptiGetStreamIdEx``), all from ds4lab's one CUPTI session
  (:class:`ds4lab.backends.cupti.CuptiSession`, :data:`~ds4lab.backends.cupti.TRACE_KINDS`).
* On the sim, :class:`SimCallLog`: the calls the launch layer and the graph cache make of the sim
  backend (``launch`` → ``cudaLaunchKernel``, ``memset_sync`` → ``cudaMemset`` on the legacy stream,
  ``graph_launch`` → ``cudaGraphLaunch``, ...) with the modeled host clock before and after each
  (MODELED), the stream each names (id and kind: legacy, blocking, non-blocking, per-thread) and a
  correlation id shared with the device work the call put on the modeled timeline.
* A kernel's scalar arguments (:func:`scalar_args`): the numbers ds4lab's launch layer passed
  (positions, KV rows, lengths, token ids, ...), ``index=value`` in parameter order; the arrays are
  left out. A position-like argument that changes every token is what a frozen graph replays stale.
"""

from __future__ import annotations

import numbers

import numpy as np

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


def scalar_args(args) -> str:
    """A kernel's scalar arguments as ``index=value`` joined by ``,`` (integers exactly, floats with
    ``repr``); array and pointer arguments are left out. ``""`` when it has none."""
    out = []
    for i, a in enumerate(args):
        if isinstance(a, (bool, np.bool_)):
            out.append(f"{i}={int(a)}")
        elif isinstance(a, numbers.Integral):
            out.append(f"{i}={int(a)}")
        elif isinstance(a, numbers.Real):
            out.append(f"{i}={float(a)!r}")
    return ",".join(out)


class SimCallLog:
    """The sim backend's calls, logged (see the module docstring). :meth:`install` wraps the
    backend instance's methods (instance attributes over the class's); :meth:`remove` takes them
    away. ``calls``: the logged API records (dicts, MODELED); ``corr_of``: absolute timeline index
    (``trace_records`` numbering) → correlation id; ``streams``: stream name → (id, kind)."""

    def __init__(self, be) -> None:
        self.be = be
        self.calls: list[dict] = []
        self.corr_of: dict[int, int] = {}
        self.streams: dict[str, tuple] = {}
        self._corr = 0
        self._names: list[str] = []
        self.on = False

    def _stream(self, s):
        rt = getattr(self.be, "rt", None)
        legacy = getattr(rt, "legacy", None)
        from ..capture.stream import LEGACY_STREAM

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
        be = self

        def call(*a, **k):
            if not be.on:
                return orig(*a, **k)
            self._corr += 1
            corr = self._corr
            stream = a[si] if si is not None and len(a) > si else None
            if api in ("cudaMemset",):
                sid, kind = self._stream(None)  # ds4 today: the synchronous memset goes to the legacy stream
            elif si is not None:
                sid, kind = self._stream(stream)
            else:
                sid, kind = -1, ""
            n0 = be.be.trace_records(0)[1]
            t0 = be.be.host_clock_us()
            try:
                return orig(*a, **k)
            finally:
                t1 = be.be.host_clock_us()
                n1 = be.be.trace_records(0)[1]
                for i in range(n0, n1):
                    self.corr_of[i] = corr
                self.calls.append({"name": api, "domain": "runtime", "start_ns": t0 * 1e3, "end_ns": t1 * 1e3,
                                   "stream": sid, "stream_type": kind, "correlation": corr, "sync_kind": sync})
        return call

    def take(self) -> list[dict]:
        """The calls logged since the last take."""
        out, self.calls = self.calls, []
        return out


def cupti_api_rows(session, records) -> tuple[list[dict], dict, dict]:
    """CUPTI session records (:mod:`ds4lab.backends.cupti`) of the API level as dicts: ``(calls,
    by_corr, stream_types)`` — the API calls and sync records (``kind`` ``api``/``sync``), each
    cudaEventRecord's (stream, event) by correlation id, and ``{stream id: type}`` from ``STREAM``
    records and the current context's legacy stream."""
    from ..backends.cupti import INVALID_ID, STREAM_FLAGS, SYNC_TYPES

    try:
        types = dict(session.stream_types_now())
    except Exception:  # noqa: BLE001 - no driver call possible here: stream kinds from STREAM records only
        types = {}
    calls, events = [], {}
    for r in records:
        if r[0] == "cuda_event":
            events[r[4]] = (r[3], r[1])
        elif r[0] == "stream" and r[1] in STREAM_FLAGS:
            types.setdefault(r[3], STREAM_FLAGS[r[1]])
    for r in records:
        if r[0] == "api":
            _, domain, t0, t1, _pid, tid, corr, cbid, _ret = r
            stream, ev = events.get(corr, (-1, -1))
            calls.append({"kind": "api", "name": session.callback_name(domain, cbid), "domain": domain,
                          "start_ns": t0, "end_ns": t1, "tid": tid, "correlation": corr, "stream": stream,
                          "event": ev, "sync_kind": "", "stream_type": types.get(stream, "")})
        elif r[0] == "sync":
            _, st, t0, t1, _ctx, stream, corr, ev = r
            stream = -1 if stream in (-1, INVALID_ID) else stream
            calls.append({"kind": "sync", "name": "sync", "domain": "", "start_ns": t0, "end_ns": t1, "tid": -1,
                          "correlation": corr, "stream": stream, "event": -1 if ev in (-1, INVALID_ID) else ev,
                          "sync_kind": SYNC_TYPES.get(st, ""), "stream_type": types.get(stream, "")})
    return calls, events, types
