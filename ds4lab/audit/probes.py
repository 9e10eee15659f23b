"""What each call class does to a capture, asked of the simulated runtime.

:func:`probe` makes one call class's call on a fresh :class:`~ds4lab.sim.backend.SimBackend` while a stream
captures in a mode, and reads what the sim's rules did (:class:`ProbeResult`, its :meth:`~ProbeResult.verdict`:
invalidates, refused, not in graph, allowed, no rule). How a probe runs and what each verdict means:
docs/call-classes.md, "The probes"."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..capture.stream import CAPTURE_MODES, LEGACY_STREAM
from ..errors import RuntimeApiError
from ..sim.rules import RULES

INVALIDATES, REFUSED, NOT_IN_GRAPH, ALLOWED, NO_RULE = "invalidates", "refused", "not in graph", "allowed", "no rule"
#: Verdicts, most severe first (the order the report leads with).
VERDICTS = (INVALIDATES, REFUSED, NOT_IN_GRAPH, NO_RULE, ALLOWED)
N = 256
f32 = np.float32


@dataclass(frozen=True)
class ProbeResult:
    """What the sim did with one call class (``key``) in one capture ``mode``: ``error`` (the name raised, or None),
    ``status`` (the capture's, right after), ``end_error`` (ending it, or None), ``nodes`` (kinds added), ``eager``
    (device work run at once), ``rules`` (those that decided it, in order: keys of :data:`~ds4lab.sim.rules.RULES`)."""

    key: str
    mode: str
    error: str | None
    status: str
    end_error: str | None
    nodes: tuple
    eager: int
    rules: tuple

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS` (module docstring)."""
        if not self.rules:
            return NO_RULE
        if self.error:
            return INVALIDATES if self.status == "invalidated" else REFUSED
        if self.status == "invalidated":
            return INVALIDATES
        if any(RULES[r].outcome == "escapes" for r in self.rules):
            return NOT_IN_GRAPH
        return ALLOWED

    @property
    def rule(self) -> str:
        """The deciding rule: the one that raised, else one that let the work escape, else the last fired ("": none)."""
        if not self.rules:
            return ""
        if self.error:
            hit = [r for r in self.rules if RULES[r].error == self.error]
            if hit:
                return hit[0]
        esc = [r for r in self.rules if RULES[r].outcome == "escapes"]
        return esc[0] if esc else self.rules[-1]


class _Ctx:
    """A probe's objects: backend, capturing stream ``s``, two other streams, buffers, events, ``held`` (from setup)."""

    def __init__(self, be) -> None:
        self.be = be
        self.s = be.new_stream(non_blocking=True)
        self.other = be.new_stream(non_blocking=True)
        self.other2 = be.new_stream(non_blocking=True)
        self.buf = be.zeros((N,), f32)
        self.host = np.zeros(N, dtype=f32)
        self.ev = be.new_event()
        self.ev2 = be.new_event()
        self.held: dict = {}

    def kernel(self, stream) -> None:
        self.be.launch(stream, "probe_kernel", (1,), (N,), (self.buf,), 0, None, 4 * N)

    def record_before(self) -> None:
        """Both events recorded eagerly on another stream, finished, before the capture."""
        self.be.event_record(self.other, self.ev)
        self.be.event_record(self.other, self.ev2)
        self.be.synchronize()

    def record_inside(self) -> None:
        """Both events recorded on the capturing stream, after one kernel, inside the capture."""
        self.kernel(self.s)
        self.be.event_record(self.s, self.ev)
        self.be.event_record(self.s, self.ev2)


def _graph(c: _Ctx) -> None:
    """An instantiated graph of one kernel, captured on another stream before the probe's capture."""
    be = c.be
    be.begin_capture(c.other2, "relaxed")
    c.kernel(c.other2)
    c.held["exec"] = be.graph_instantiate(be.end_capture(c.other2))


def _d2d(c: _Ctx, stream) -> None:
    """A device-to-device copy on ``stream``: stream work as a memset is (the backends have no device-to-device copy
    call; the runtime's enqueue applies the same rules to it)."""
    c.be.rt.enqueue(stream, "memcpy", "memcpy DtoD", None, 1.0, "cudaMemcpyAsync")


def _pinned(c: _Ctx) -> None:
    c.held["pinned"] = c.be.host_alloc((N,), f32)


def _registered(c: _Ctx) -> None:
    c.held["registered"] = np.zeros(N, dtype=f32)
    c.be.host_register(c.held["registered"])


def _blas(c: _Ctx) -> None:
    c.held["blas"] = c.be.blas_create()
    c.held["ws"] = c.be.zeros((N,), f32)


_NONE = None
#: call class → (setup before the capture, step inside the capture before the call, the call).
PROBES: dict[str, tuple[Callable | None, Callable | None, Callable]] = {
    "kernel@capture": (_NONE, _NONE, lambda c: c.kernel(c.s)),
    "kernel@legacy": (_NONE, _NONE, lambda c: c.kernel(LEGACY_STREAM)),
    "kernel@other": (_NONE, _NONE, lambda c: c.kernel(c.other)),
    "graph_launch@capture": (_graph, _NONE, lambda c: c.be.graph_launch(c.held["exec"], c.s)),
    "graph_launch@legacy": (_graph, _NONE, lambda c: c.be.graph_launch(c.held["exec"], LEGACY_STREAM)),
    "graph_launch@other": (_graph, _NONE, lambda c: c.be.graph_launch(c.held["exec"], c.other)),
    "memset_async@capture": (_NONE, _NONE, lambda c: c.be.memset_async(c.s, c.buf, 0)),
    "memset_async@legacy": (_NONE, _NONE, lambda c: c.be.memset_async(LEGACY_STREAM, c.buf, 0)),
    "memset_async@other": (_NONE, _NONE, lambda c: c.be.memset_async(c.other, c.buf, 0)),
    "memset_sync": (_NONE, _NONE, lambda c: c.be.memset_sync(c.buf, 0)),
    "memcpy_async.h2d.pageable@capture": (_NONE, _NONE, lambda c: c.be.copy_h2d(c.s, c.buf, c.host)),
    "memcpy_async.h2d.pinned@capture": (_pinned, _NONE, lambda c: c.be.copy_h2d(c.s, c.buf, c.held["pinned"])),
    "memcpy_async.d2h.pageable@capture": (_NONE, _NONE, lambda c: c.be.copy_d2h(c.s, c.host, c.buf)),
    "memcpy_async.d2h.pinned@capture": (_pinned, _NONE, lambda c: c.be.copy_d2h(c.s, c.held["pinned"], c.buf)),
    "memcpy_async.d2d@capture": (_NONE, _NONE, lambda c: _d2d(c, c.s)),
    "memcpy_async@legacy": (_NONE, _NONE, lambda c: c.be.copy_h2d(LEGACY_STREAM, c.buf, c.host)),
    "memcpy_async@other": (_NONE, _NONE, lambda c: c.be.copy_h2d(c.other, c.buf, c.host)),
    "memcpy_sync.h2d": (_NONE, _NONE, lambda c: c.be.memcpy_h2d_sync(c.buf, c.host)),
    "memcpy_sync.d2h": (_NONE, _NONE, lambda c: c.be.memcpy_d2h_sync(c.host, c.buf)),
    "memcpy_sync.d2d": (_NONE, _NONE, lambda c: c.be.memcpy_h2d_sync(c.buf, c.host)),
    "malloc": (_NONE, _NONE, lambda c: c.be.malloc((N,), f32)),
    "free": (lambda c: c.held.setdefault("m", c.be.malloc((N,), f32)), _NONE, lambda c: c.be.free(c.held["m"])),
    "malloc_async@capture": (_NONE, _NONE, lambda c: c.be.malloc_async(c.s, (N,), f32)),
    "malloc_async@legacy": (_NONE, _NONE, lambda c: c.be.malloc_async(LEGACY_STREAM, (N,), f32)),
    "malloc_async@other": (_NONE, _NONE, lambda c: c.be.malloc_async(c.other, (N,), f32)),
    "free_async@capture": (lambda c: c.held.setdefault("m", c.be.malloc_async(c.other, (N,), f32)), _NONE,
                           lambda c: c.be.free_async(c.s, c.held["m"])),
    "free_async@legacy": (lambda c: c.held.setdefault("m", c.be.malloc_async(c.other, (N,), f32)), _NONE,
                          lambda c: c.be.free_async(LEGACY_STREAM, c.held["m"])),
    "free_async@other": (lambda c: c.held.setdefault("m", c.be.malloc_async(c.other, (N,), f32)), _NONE,
                         lambda c: c.be.free_async(c.other, c.held["m"])),
    "host_alloc": (_NONE, _NONE, lambda c: c.be.host_alloc((N,), f32)),
    "free_host": (_pinned, _NONE, lambda c: c.be.free_host(c.held["pinned"])),
    "host_register": (_NONE, _NONE, lambda c: c.be.host_register(c.host)),
    "host_unregister": (_registered, _NONE, lambda c: c.be.host_unregister(c.held["registered"])),
    "stream_sync@capture": (_NONE, _NONE, lambda c: c.be.stream_synchronize(c.s)),
    "stream_sync@legacy": (_NONE, _NONE, lambda c: c.be.stream_synchronize(LEGACY_STREAM)),
    "stream_sync@other": (_NONE, _NONE, lambda c: c.be.stream_synchronize(c.other)),
    "device_sync": (_NONE, _NONE, lambda c: c.be.synchronize()),
    "event_sync.in_token": (_NONE, lambda c: c.record_inside(), lambda c: c.be.event_synchronize(c.ev)),
    "event_sync.before": (lambda c: c.record_before(), _NONE, lambda c: c.be.event_synchronize(c.ev)),
    "event_query.in_token": (_NONE, lambda c: c.record_inside(), lambda c: c.be.event_query(c.ev)),
    "event_query.before": (lambda c: c.record_before(), _NONE, lambda c: c.be.event_query(c.ev)),
    "event_elapsed.in_token": (_NONE, lambda c: c.record_inside(), lambda c: c.be.event_elapsed_ms(c.ev, c.ev2)),
    "event_elapsed.before": (lambda c: c.record_before(), _NONE, lambda c: c.be.event_elapsed_ms(c.ev, c.ev2)),
    "event_record@capture": (_NONE, _NONE, lambda c: c.be.event_record(c.s, c.ev)),
    "event_record@legacy": (_NONE, _NONE, lambda c: c.be.event_record(LEGACY_STREAM, c.ev)),
    "event_record@other": (_NONE, _NONE, lambda c: c.be.event_record(c.other, c.ev)),
    "wait_event.join": (_NONE, lambda c: c.record_inside(), lambda c: c.be.stream_wait_event(c.s, c.ev)),
    "wait_event.outside": (lambda c: c.record_before(), _NONE, lambda c: c.be.stream_wait_event(c.s, c.ev)),
    "wait_event.fork": (_NONE, lambda c: c.record_inside(), lambda c: c.be.stream_wait_event(c.other, c.ev)),
    "wait_event.legacy": (_NONE, lambda c: c.record_inside(), lambda c: c.be.stream_wait_event(LEGACY_STREAM, c.ev)),
    "wait_event@other": (lambda c: c.record_before(), _NONE, lambda c: c.be.stream_wait_event(c.other2, c.ev)),
    "stream_query@capture": (_NONE, _NONE, lambda c: c.be.stream_query(c.s)),
    "stream_query@legacy": (_NONE, _NONE, lambda c: c.be.stream_query(LEGACY_STREAM)),
    "stream_query@other": (_NONE, _NONE, lambda c: c.be.stream_query(c.other)),
    "capture_status": (_NONE, _NONE, lambda c: c.be.capture_status(c.s)),
    "host_query": (_NONE, _NONE, lambda c: c.be.host_query("cudaGetDevice")),
    "cublas_create": (_NONE, _NONE, lambda c: c.be.blas_create()),
    "cublas_settings": (_blas, _NONE, lambda c: c.be.blas_set_workspace(c.held["blas"], c.held["ws"])),
}
for _k in ("malloc", "free", "host_alloc", "free_host", "host_register", "host_unregister", "event_sync.before",
           "event_query.before", "cublas_create"):
    PROBES["other_thread." + _k] = PROBES[_k]  # the call is made from another thread (see probe)


def has_probe(key: str | None) -> bool:
    """Whether call class ``key`` has a probe (None: an API no class covers)."""
    return key is not None and key in PROBES


@functools.lru_cache(maxsize=None)
def probe(key: str, mode: str) -> ProbeResult:
    """Run call class ``key``'s probe in capture ``mode`` on a fresh sim; cached. Raises KeyError: no probe for
    ``key`` (:func:`has_probe`); ValueError: an unknown ``mode``."""
    from ..sim.backend import SimBackend

    if mode not in CAPTURE_MODES:
        raise ValueError(f"capture mode {mode!r}; choose one of {', '.join(CAPTURE_MODES)}")
    setup, inside, call = PROBES[key]
    be = SimBackend(timing_only=True, calibration=_calibration())
    rt = be.rt
    c = _Ctx(be)
    if setup is not None:
        setup(c)
    be.begin_capture(c.s, mode)
    if inside is not None:
        inside(c)
    rt.record_rules = True
    fired0 = len(rt.fired)
    seq = rt.capturing(c.s)
    n0, t0 = len(seq.nodes), be.trace_records(0)[1]
    err = _call_in_other_thread(call, c) if key.startswith("other_thread.") else _call(call, c)
    status = be.rt.capture_status(c.s)
    rules = tuple(dict.fromkeys(r for r, _ in rt.fired[fired0:] if r != "capture_status_query"
                                or key == "capture_status"))
    nodes = tuple(n.kind for n in seq.nodes[n0:])
    eager = be.trace_records(0)[1] - t0
    rt.record_rules = False
    end_err = None
    try:
        be.end_capture(c.s)
    except RuntimeApiError as e:
        end_err = e.name
    return ProbeResult(key, mode, err, status, end_err, nodes, eager, rules)


def _call(call, c: _Ctx) -> str | None:
    try:
        call(c)
    except RuntimeApiError as e:
        return e.name
    return None


def _call_in_other_thread(call, c: _Ctx) -> str | None:
    """The call made from another thread, whose interaction mode is the default (global)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("err", _call(call, c)))
    t.start()
    t.join()
    return out.get("err")


@functools.lru_cache(maxsize=1)
def _calibration():
    """The default calibration, loaded once (the probes need no particular one: they read rules, not times)."""
    from ..sim.costmodel import Calibration

    return Calibration.load(None)
