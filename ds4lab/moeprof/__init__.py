"""Routed-MoE timing profiler with capture-compatible modes, and its workloads.

ds4 times its routed MoE (``DS4_CUDA_MOE_PROFILE``) with seven CUDA events around six stages,
waits on the last one with ``cudaEventSynchronize`` and reads the elapsed times on the host, every
call (``shared/context/ds4-decode.md``, "The routed MoE kernel sequence and its profile"). That is
legal eagerly and fatal inside a stream capture: on the H200, the synchronize fails with
``cudaErrorCapturedEvent`` and invalidates the capture (``docs/measurements/h200-2026-11-29/
conformance-cupy.json``, scenarios ``event_sync_captured`` and ``event_elapsed_captured``). This
module times the same stages (``xq``, ``sort``, ``gateup``, ``midq``, ``down``, ``sum``, ``total``)
in six modes:

==================  ===========================================================================
``host-timed``      ds4's way (``TokenOptions(moe_profile=True, moe_host_timed=True)``): events,
                    synchronize, elapsed times read on the host, per call. Guarded: while the
                    stream captures (``capture_status != "none"``, an invalidated capture included)
                    it refuses with :class:`ProfilerCaptureError` before any synchronize, or, with
                    ``fallback=True``, switches that call to ``in-graph`` (or ``deferred``) and says
                    so (a warning and the row's ``note``).
``deferred``        the same seven events per call, each call its own events from a pool, read after
                    the token (or every ``read_every`` calls): no synchronization mid-token. Eager
                    only: events recorded in a capture make no graph node, and on the H200 reading
                    them afterwards fails (``cudaErrorInvalidValue``) until they are re-recorded.
``graph-boundary``  the MoE cluster captured and replayed through a :class:`~ds4lab.capture.GraphCache`;
                    two events between graph launches bracket each replay: ``total`` only.
``in-graph``        a one-thread kernel (``kernels/timestamp.cu:stamp_time``) writes ``%globaltimer``
                    (ns) into a device slot at each stage boundary. Captured, the stamps are kernel
                    nodes, so every replay writes fresh times; the slots are read after the replay.
                    (An event record inside a capture makes no graph node and its elapsed time is
                    refused, as measured on the H200; a kernel is what CUDA allows.) Clock caveat:
                    ``%globaltimer`` counts ns but advances in implementation-defined steps (PTX ISA;
                    often about 1 µs, finer while a profiler is attached): stages of a few µs can be
                    quantized. :func:`globaltimer_resolution` measures the step (32 ns on the H200,
                    2026-11-29). Every stage includes one stamp kernel (about 1 µs on the H200: the
                    ``sort`` stage at 1 token, which is empty, shows its cost).
``cupti``           per-kernel activity records (``cupti-python``, imported lazily; "unavailable:
                    <reason>" when it is missing), attributed to stages by kernel name and to layers
                    by order. On ``sim`` the modeled timeline plays the part of the records.
``nvtx``            NVTX ranges per stage (domain ``ds4lab``) and no timing: rows with ``ms`` NaN.
==================  ===========================================================================

Results are tidy rows (:data:`ROW_COLUMNS`), summarized by :func:`summarize` (median and IQR per
mode, routing, token count and stage), and printable as ds4's stderr line (:func:`format_ds4_line`)
for a side-by-side comparison with a real ds4 run (:func:`read_ds4_log`).

Workloads (:class:`MoeWorkbench`): 1 token (decode), 2 and 3 (multi-token-prediction verification)
and batches (16..512); routing ``uniform`` (distinct random experts per token), ``zipf`` (skewed
expert popularity), ``hash`` (the model's hash-routed layers, through ``model.router``) and
``worst`` (every token to the same ``n_used`` experts). Except for ``hash``, the chosen expert ids
and weights are written into the router's output buffers (``model.moe_buf.ids``/``wts``) on the
device, on the current stream, after the router ran and before the routed-MoE launches, so the
sort, the tiles and the expert load really change; the router stays outside the timed stages.

How the profiler attaches: it becomes the model's ``moe_observer`` for as long as it is attached
(:meth:`MoeProfiler.attached`; :class:`ds4lab.model.MoeObserver`). The model calls it around
every ``moe`` cluster run (brackets, eager/capture/replay bookkeeping) and every routed-MoE call
(the capture guard and the per-call instrumentation), and the seven profiling points call a
:class:`ds4lab.model.ProfileMarker`'s ``fire`` where the mode puts stamps or NVTX marks instead
of CUDA events. With no profiler attached the model runs exactly as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .. import stream as S
from ..capture import GraphCache
from ..errors import RuntimeApiError
from ..model import MOE_STAGES, DecodeModel, MoeObserver, ProfileMarker, TokenOptions

#: ds4's profile stages plus their sum.
STAGES = MOE_STAGES + ("total",)
MODES = ("host-timed", "deferred", "graph-boundary", "in-graph", "cupti", "nvtx")
#: Modes whose rows carry per-stage times (graph-boundary: total only; nvtx: none).
STAGE_MODES = ("host-timed", "deferred", "in-graph", "cupti")
ROUTINGS = ("uniform", "zipf", "hash", "worst")
#: Decode, MTP verification, batches.
TOKENS_DEFAULT = (1, 2, 3, 16, 64, 256, 512)
REGIMES = ("eager", "replayed")
#: Columns of every profile row (``moe.csv``).
ROW_COLUMNS = ("token", "layer", "tokens", "pairs", "stage", "ms", "mode", "backend", "routing", "modeled",
               "phase", "note")
#: Zipf exponent of the skewed expert popularity (expert of rank r chosen with weight r^-s).
ZIPF_S = 1.2

#: Kernel name (prefix when it ends in ``_``) → stage, for trace records (CUPTI or the sim timeline).
KERNEL_STAGE = (("xq_quantize", "xq"), ("moe_count", "sort"), ("moe_prefix", "sort"), ("moe_scatter", "sort"),
                ("moe_tiles", "sort"), ("memset", "sort"), ("moe_gateup_", "gateup"), ("moe_midq", "midq"),
                ("moe_down_", "down"), ("moe_sum", "sum"))

#: ds4's stderr line (context file, "The routed MoE kernel sequence and its profile").
DS4_LINE = ("ds4: CUDA MoE profile tokens={tokens} pairs={pairs} xq={xq} sort={sort} gateup={gateup} "
            "midq={midq} down={down} sum={sum} total={total} ms")
_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
DS4_LINE_RE = re.compile(r"ds4: CUDA MoE profile tokens=(\d+) pairs=(\d+) "
                         + " ".join(f"{s}={_NUM}" for s in STAGES) + r" ms")


def kernel_stage(name: str) -> str | None:
    """The MoE stage a kernel (or the counts-clear ``memset``) belongs to; None for any other kernel."""
    for prefix, stage in KERNEL_STAGE:
        if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
            return stage
    return None


class ProfilerCaptureError(RuntimeApiError):
    """Host-timed MoE profiling was asked for while the stream captures (the guard refused it).

    A :class:`~ds4lab.errors.RuntimeApiError`, so a :class:`~ds4lab.capture.GraphCache` treats it as
    a failed capture: it ends the (still intact) capture, retires the graph and runs eagerly.
    """

    NAME = "ds4lab:HostTimedProfileInCapture"

    def __init__(self, status: str, layer: int, tokens: int) -> None:
        super().__init__(
            self.NAME, "moe profile (host-timed)",
            f"layer {layer}, {tokens} token(s): the stream's capture status is {status!r}; "
            "cudaEventSynchronize / cudaEventElapsedTime on an event recorded in a capture fail with "
            "cudaErrorCapturedEvent and invalidate the capture. Use mode deferred, in-graph, graph-boundary "
            "or cupti, or pass fallback=True")
        self.status = status

    @property
    def source(self) -> str:
        return "ds4lab"


def capture_status(be, stream) -> str:
    """``be.capture_status(stream)``; ``"unknown"`` when the query itself fails (treated as capturing)."""
    try:
        return be.capture_status(stream)
    except RuntimeApiError:
        return "unknown"


def is_modeled(be) -> bool:
    return bool(getattr(be, "models_time", False))


# ----------------------------------------------------------------------------- trace sources
class _SimTrace:
    """The sim's modeled timeline as trace records (the role CUPTI plays on a GPU): modeled."""

    available, reason = True, ""

    def __init__(self, be) -> None:
        self.be = be
        self._seen = self._count()

    def _dev(self):
        return self.be.rt.dev

    def _count(self) -> int:
        d = self._dev()
        return d.dropped + len(d.timeline)

    def start(self) -> None:
        self._seen = self._count()

    def stop(self) -> None:
        pass

    def take(self) -> list[tuple]:
        """``(name, start_ns, end_ns, kind, graph)`` of the device work since the last take."""
        d = self._dev()
        n = self._count()
        new = d.timeline[max(0, len(d.timeline) - (n - self._seen)):] if n > self._seen else []
        self._seen = n
        return [(r[1], r[2] * 1e3, r[3] * 1e3, r[4], r[5]) for r in new if r[4] in ("kernel", "memset")]


class _CuptiSession:
    """One process-wide CUPTI activity session (``cupti-python``): kernel and memset records."""

    _instance: "_CuptiSession | None" = None

    def __init__(self) -> None:
        from cupti import cupti  # optional dependency, imported only here

        self.c = cupti
        self.records: list[tuple] = []
        self.registered = False
        self.kinds = (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMSET)

    @classmethod
    def get(cls) -> "_CuptiSession":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _requested(self):
        return 8 << 20, 0

    def _completed(self, activities) -> None:
        K = self.c.ActivityKind
        for a in activities:
            if a.kind == K.CONCURRENT_KERNEL or a.kind == K.KERNEL:
                name = a.name.decode() if isinstance(a.name, bytes) else str(a.name)
                self.records.append((name, float(a.start), float(a.end), "kernel", int(a.graph_id)))
            elif a.kind == K.MEMSET:
                self.records.append(("memset", float(a.start), float(a.end), "memset", int(a.graph_id)))

    def start(self) -> None:
        for k in self.kinds:
            self.c.activity_enable(k)
        if not self.registered:
            self.c.activity_register_callbacks(self._requested, self._completed)
            self.registered = True

    def stop(self) -> None:
        self.c.activity_flush_all(1)
        for k in self.kinds:
            self.c.activity_disable(k)
        self.records = []

    def take(self) -> list[tuple]:
        self.c.activity_flush_all(1)
        out, self.records = self.records, []
        return out


class _CuptiTrace:
    available, reason = True, ""

    def __init__(self) -> None:
        self.s = _CuptiSession.get()

    def start(self) -> None:
        self.s.start()
        self.s.take()

    def stop(self) -> None:
        self.s.stop()

    def take(self) -> list[tuple]:
        return self.s.take()


class _Unavailable:
    available = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def take(self) -> list:
        return []


def cupti_available() -> tuple[bool, str]:
    """Whether ``cupti-python`` imports (GPU side); the reason when not."""
    try:
        import importlib

        importlib.import_module("cupti.cupti")
    except Exception as e:  # ImportError, or a library that fails to load
        return False, f"cupti-python not importable ({type(e).__name__}: {e}); pip install cupti-python"
    return True, "ok"


def trace_source(be):
    """CUPTI on a GPU (when importable and it starts), the modeled timeline on ``sim``."""
    if is_modeled(be) and hasattr(be, "rt"):
        return _SimTrace(be)
    if not be.is_gpu:
        return _Unavailable(f"no trace on the {be.name} backend")
    ok, why = cupti_available()
    if not ok:
        return _Unavailable(why)
    try:
        t = _CuptiTrace()
    except Exception as e:
        return _Unavailable(f"CUPTI did not start ({type(e).__name__}: {e})")
    return t


# ----------------------------------------------------------------------------- per-call instrumentation
class _Marker(ProfileMarker):
    """A profiling point of this profiler (see :class:`ds4lab.model.ProfileMarker`)."""


class _Stamp(_Marker):
    def __init__(self, prof: "MoeProfiler", slot: int) -> None:
        self.prof, self.slot = prof, slot

    def fire(self, site: str) -> None:
        self.prof._stamp(self.slot)


class _NvtxMark(_Marker):
    def __init__(self, prof: "MoeProfiler", i: int, layer: int, probe: "_Probe") -> None:
        self.prof, self.i, self.layer, self.probe = prof, i, layer, probe

    def fire(self, site: str) -> None:
        self.prof._nvtx_mark(self.i, self.layer, self.probe)


@dataclass
class _Probe:
    """The instrumentation of one routed-MoE call (or of the graph it was captured into)."""

    kind: str  # host, events, stamps, nvtx, none
    layer: int
    tokens: int
    phase: str  # eager or capture (where the instrumentation was issued)
    events: list | None = None
    slot: int = -1  # first of 7 stamp slots
    host: dict | None = None  # host-timed: the model's moe_profile_log entry
    note: str = ""
    error: str = ""
    status_after: str = ""
    nvtx_ranges: int = 0
    nvtx_capturing: bool = False


@dataclass
class _Call:
    """One call of the ``moe`` cluster as the profiler saw it, waiting to be read."""

    token: int
    layer: int
    tokens: int
    phase: str  # eager, capture (outer capture: nothing ran), replay, capture+replay
    probe: _Probe | None
    bracket: tuple | None = None
    note: str = ""


class _Nvtx:
    """NVTX ranges in the ``ds4lab`` domain, category ``profile``; records why when unavailable."""

    def __init__(self) -> None:
        try:
            import nvtx

            self.domain = nvtx.get_domain("ds4lab")
            self.category = self.domain.get_category_id("profile")
            self.ok, self.why = True, ""
        except Exception as e:
            self.domain, self.ok, self.why = None, False, f"nvtx not importable ({type(e).__name__}: {e})"
        self._attrs: dict = {}

    def push(self, message: str, payload: int) -> None:
        if not self.ok:
            return
        key = (message, payload)
        a = self._attrs.get(key)
        if a is None:
            a = self.domain.get_event_attributes(message=message, color=0x17BECF, category=self.category,
                                                 payload=payload)
            self._attrs[key] = a
        self.domain.push_range(a)

    def pop(self) -> None:
        if self.ok:
            self.domain.pop_range()


# ----------------------------------------------------------------------------- the profiler
class MoeProfiler(MoeObserver):
    """Times the routed-MoE stages of one :class:`~ds4lab.model.DecodeModel` in one mode.

    Args:
        model: the model whose ``moe`` clusters are profiled (MoE-only steps or whole tokens).
        mode: one of :data:`MODES`.
        routing: label written into the rows.
        guard: ``host-timed`` only: refuse while the stream captures (on by default). ``False`` runs
            ds4's path as is (the exclusion matrix uses this to show what CUDA does).
        fallback: ``host-timed`` only: instead of refusing under capture, switch that call to
            ``"in-graph"`` (``True``: stamps become graph nodes and time every replay) or
            ``"deferred"`` (no synchronize, the capture survives, but events recorded in a capture
            time nothing: its rows stay empty), with a warning and a note.
        read_every: ``deferred``: read after this many calls (default: at :meth:`end_step`, i.e.
            after the token).
        raw: report what the mechanism returns even where it cannot have timed the call (events
            recorded in a capture, the capturing call's boundary time); default: such rows get NaN
            and a note. The exclusion matrix runs raw.
        slots: stamp slot capacity (7 per distinct (layer, token count) key).

    Use :meth:`attached` as a context manager around the calls, :meth:`begin_step` /
    :meth:`end_step` around each token (``end_step`` returns that token's rows).
    """

    def __init__(self, model: DecodeModel, mode: str, *, routing: str = "", guard: bool = True,
                 fallback: bool | str = False, read_every: int | None = None, raw: bool = False,
                 slots: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown profiling mode {mode!r}; choose one of: {', '.join(MODES)}")
        if fallback is True:
            fallback = "in-graph"
        if fallback not in (False, None, "in-graph", "deferred"):
            raise ValueError(f"fallback={fallback!r}: choose True, 'in-graph' or 'deferred'")
        if read_every is not None and read_every < 1:
            raise ValueError(f"read_every={read_every} must be >= 1")
        self.model, self.be = model, model.be
        self.mode, self.routing = mode, routing
        self.guard, self.fallback, self.raw = guard, (fallback or None), raw
        self.read_every = read_every
        self.modeled = is_modeled(self.be)
        self.timing_only = bool(getattr(self.be, "timing_only", False))
        self.k = model.cfg.n_used
        self.token = 0
        self.errors: list[dict] = []
        self.notes: list[str] = []
        self._pending: list[_Call] = []
        self._probes: list[_Probe] = []
        self._graph_probe: dict[tuple, _Probe] = {}
        self._attached = False
        self._warned = False
        self._call_probes: list[_Probe] = []
        # event pools (deferred, fallback deferred) and brackets (graph-boundary)
        self._pool: list[list] = []
        self._pool_next = 0
        self._brackets: list[tuple] = []
        self._bracket_next = 0
        self._poison: dict[int, tuple] = {}
        # stamps
        n_keys = max(16, 2 * model.n_layers)
        self._slot_cap = slots or 7 * n_keys
        self._slots = None
        self._slot_of: dict[tuple, int] = {}
        self._stamp_log: list[int] = []  # slot of each stamp launched (timing-only sim: order-based read)
        # nvtx / trace
        self.nvtx = _Nvtx() if mode == "nvtx" else None
        self._nvtx_open = False
        self.trace = trace_source(self.be) if mode == "cupti" or (mode in ("in-graph", "host-timed") and
                                                                   self.timing_only) else None
        self._host_events: list = []

    # ------------------------------------------------------------------ availability
    @property
    def available(self) -> bool:
        return not (self.mode == "cupti" and not self.trace.available)

    @property
    def unavailable_reason(self) -> str:
        return "" if self.available else f"unavailable: {self.trace.reason}"

    def _uses_stamps(self) -> bool:
        return self.mode == "in-graph" or (self.mode == "host-timed" and self.fallback == "in-graph")

    def _uses_pool(self) -> bool:
        return self.mode == "deferred" or (self.mode == "host-timed" and self.fallback == "deferred")

    # ------------------------------------------------------------------ attach / detach
    @contextlib.contextmanager
    def attached(self, calls_per_read: int | None = None) -> Iterator["MoeProfiler"]:
        """Install the profiler on the model for the ``with`` block (see the module docstring)."""
        self.attach(calls_per_read)
        try:
            yield self
        finally:
            self.detach()

    def attach(self, calls_per_read: int | None = None) -> None:
        """Allocate what the mode needs (outside any capture) and become the model's
        ``moe_observer``.

        ``calls_per_read``: calls between reads (deferred pool size); default: the model's layers.
        Raises ``RuntimeError`` when the stream is capturing or another profiler is attached.
        """
        if self._attached:
            return
        m, be = self.model, self.be
        if m.moe_observer is not None:
            raise RuntimeError("another routed-MoE profiler is attached to this model: detach it first")
        if capture_status(be, m.L.stream()) != "none":
            raise RuntimeError("attach the profiler before any capture begins (it allocates events and slots)")
        window = self.read_every or calls_per_read or m.n_layers
        if self._uses_pool():
            while len(self._pool) < window:
                self._pool.append([be.new_event() for _ in range(7)])
        if self.mode == "graph-boundary":
            while len(self._brackets) < window:
                self._brackets.append((be.new_event(), be.new_event()))
        if self._uses_stamps() and self._slots is None:
            self._slots = be.zeros((self._slot_cap,), np.uint64)
        if self.mode == "host-timed":
            self._host_events = m.profile_events if len(m.profile_events) == 7 else [be.new_event() for _ in range(7)]
        self._saved = (m.opts, m.profile_events)
        m.opts = dataclasses.replace(m.opts, moe_profile=self.mode in ("host-timed", "deferred", "in-graph", "nvtx"),
                                     moe_host_timed=self.mode == "host-timed")
        m.moe_observer = self
        if self.trace is not None and self.trace.available:
            self.trace.start()
        self._attached = True

    def detach(self) -> None:
        if not self._attached:
            return
        m = self.model
        m.moe_observer = None
        m.opts, m.profile_events = self._saved
        if self.trace is not None and self.trace.available:
            self.trace.stop()
        if self._nvtx_open:
            self.nvtx.pop()
            self._nvtx_open = False
        self._attached = False

    # ------------------------------------------------------------------ steps
    def begin_step(self, token: int) -> None:
        """Start token (step) ``token``: clear the stamp slots (when the stream is not capturing)."""
        self.token = token
        stamps = self.mode == "in-graph" or bool(self._slot_of)  # fallback: once stamps are in use
        if self._slots is not None and stamps and capture_status(self.be, self.model.L.stream()) == "none":
            self.be.memset_async(self.model.L.stream(), self._slots, 0)

    def end_step(self) -> list[dict]:
        """Read what the token's calls left (after the token: no mid-token synchronization). Returns rows.

        While the stream is capturing nothing is read (a synchronize would break the capture): the
        calls wait for the next read.
        """
        return self.read()

    # ------------------------------------------------------------------ hooks
    def _status(self) -> str:
        return capture_status(self.be, self.model.L.stream())

    def around_moe_cluster(self, layer: int, T: int, run) -> None:
        """The model's hook around each ``moe`` cluster run (eager, capture or replay)."""
        m = self.model
        cache = m.executor if isinstance(m.executor, GraphCache) else None
        st0 = (cache.stats.captures, cache.stats.replays, cache.stats.eager_runs) if cache else None
        status = self._status()
        note = ""
        bracket = None
        if self.mode == "graph-boundary":
            if status == "none":
                bracket = self._brackets[self._bracket_next % len(self._brackets)]
                self._bracket_next += 1
                m.L.event_record("profile.boundary", bracket[0])
            else:
                note = f"stream capturing ({status}): no boundary events recorded"
        self._call_probes: list[_Probe] = []
        try:
            run()
        finally:
            if bracket is not None and self._status() == "none":
                m.L.event_record("profile.boundary", bracket[1])
        probes = self._call_probes
        if cache is not None and cache.stats.replays > st0[1]:
            phase = "capture+replay" if cache.stats.captures > st0[0] else "replay"
            probe = self._graph_probe.get((layer, T))
            if probe is None and self.mode not in ("graph-boundary", "cupti"):
                note = _join(note, "graph captured before the profiler attached: not instrumented")
        elif status != "none":
            phase, probe = "capture", (probes[-1] if probes else None)
            note = _join(note, "issued inside a capture: nothing ran (the graph's replays run it)")
        else:
            phase, probe = "eager", (probes[-1] if probes else None)
            failed = [p for p in probes[:-1] if p.error]
            if failed:
                note = _join(note, f"capture failed ({failed[0].error}, capture {failed[0].status_after}): "
                                   "graph retired, eager fallback")
            elif cache is not None and cache.stats.eager_runs > st0[2] and cache.retired():
                note = _join(note, "graph retired earlier: eager fallback")
        if probe is not None and probe.note:
            note = _join(note, probe.note)
        self._pending.append(_Call(self.token, layer, T, phase, probe, bracket, note))

    def around_routed_moe(self, layer: int, T: int, run):
        """The model's hook around each routed-MoE call: picks this call's profiling points."""
        m, be = self.model, self.be
        status = self._status()
        phase = "eager" if status == "none" else "capture"
        kind = {"host-timed": "host", "deferred": "events", "in-graph": "stamps", "nvtx": "nvtx"}.get(self.mode, "none")
        note = ""
        if kind == "host" and status != "none" and self.guard:
            if not self.fallback:
                err = ProfilerCaptureError(status, layer, T)
                self.errors.append({"token": self.token, "layer": layer, "tokens": T, "phase": phase,
                                    "error": err.name, "status_after": self._status(), "where": "guard"})
                raise err
            kind = "stamps" if self.fallback == "in-graph" else "events"
            note = (f"host-timed refused while the stream captures (status {status}): this call timed "
                    f"{self.fallback} instead")
            if not self._warned:
                warnings.warn(f"ds4lab moe profile: {note}", RuntimeWarning, stacklevel=3)
                self._warned = True
        probe = _Probe(kind, layer, T, phase, note=note)
        saved_opts = m.opts
        if kind == "host":
            probe.events = self._host_events
        elif kind == "events":
            probe.events = self._pool[self._pool_next % len(self._pool)] if self._pool else \
                [be.new_event() for _ in range(7)]
            self._pool_next += 1
        elif kind == "stamps":
            probe.slot = self._slot_base(layer, T, status)
        if kind != "host" and m.opts.moe_host_timed:
            m.opts = dataclasses.replace(m.opts, moe_host_timed=False)
        if kind == "stamps":
            m.profile_events = [_Stamp(self, probe.slot + i) for i in range(7)]
        elif kind == "nvtx":
            m.profile_events = [_NvtxMark(self, i, layer, probe) for i in range(7)]
        elif kind in ("host", "events"):
            m.profile_events = probe.events
        else:
            m.profile_events = []
        n_log = len(m.moe_profile_log)
        try:
            y = run()
        except RuntimeApiError as e:
            probe.error, probe.status_after = e.name, self._status()
            self.errors.append({"token": self.token, "layer": layer, "tokens": T, "phase": phase, "error": e.name,
                                "status_after": probe.status_after, "where": "call"})
            self._call_probes.append(probe)
            raise
        finally:
            m.opts = saved_opts
        if kind == "host" and len(m.moe_profile_log) > n_log:
            probe.host = m.moe_profile_log[n_log]
        if phase == "capture":
            self._graph_probe[(layer, T)] = probe
        self._call_probes.append(probe)
        return y

    # ------------------------------------------------------------------ stamps and ranges
    def _slot_base(self, layer: int, T: int, status: str) -> int:
        key = (layer, T)
        base = self._slot_of.get(key)
        if base is None:
            base = 7 * len(self._slot_of)
            if base + 7 > self._slot_cap:
                raise RuntimeError(f"in-graph profile: {len(self._slot_of)} (layer, tokens) keys exhaust "
                                   f"{self._slot_cap} stamp slots; pass slots= larger")
            self._slot_of[key] = base
        return base

    def _stamp(self, slot: int) -> None:
        L = self.model.L
        slots = self._slots
        stream = L.stream()
        modeled = self.modeled

        def ref():  # sim: the modeled device time at which this stamp kernel starts, in ns (no clock: 0)
            slots[slot] = np.uint64(round(self._sim_now_us(stream) * 1e3)) if modeled else np.uint64(0)
        L.kernel("profile.stamp", "stamp_time", (1,), (32,), (slots, np.int32(slot)), ref, nbytes=8)
        self._stamp_log.append(slot)

    def _sim_now_us(self, stream) -> float:
        """When a stamp kernel issued now starts on the modeled device: no earlier than the host's
        submit time, the stream's previous work and the device's previous kernel (one at a time)."""
        be = self.be
        dev = getattr(getattr(be, "rt", None), "dev", None)
        return max(be.host_time_us, be.stream_ready_us(stream), getattr(dev, "free_us", 0.0))

    def _nvtx_mark(self, i: int, layer: int, probe: _Probe) -> None:
        if i > 0 and self._nvtx_open:
            self.nvtx.pop()
            self._nvtx_open = False
        if i < len(MOE_STAGES):
            self.nvtx.push(f"moe.{MOE_STAGES[i]}", layer)
            self._nvtx_open = self.nvtx.ok
            probe.nvtx_ranges += 1 if self.nvtx.ok else 0
            probe.nvtx_capturing = probe.phase == "capture"

    # ------------------------------------------------------------------ poison (stale-value detection)
    def poison(self) -> None:
        """Re-record every pooled event back to back and clear the stamp slots, now (not capturing), and
        remember what the events read: a later read that returns these values was not re-recorded."""
        be, stream = self.be, self.model.L.stream()
        if capture_status(be, stream) != "none":
            raise RuntimeError("poison() while the stream captures")
        sets = list(self._pool) + ([self._host_events] if self._host_events else [])
        for evs in sets:
            for e in evs:
                be.event_record(stream, e)
        if self._slots is not None:
            be.memset_async(stream, self._slots, 0)
        be.stream_synchronize(stream)
        self._poison = {}
        for evs in sets:
            try:
                self._poison[id(evs)] = tuple(be.event_elapsed_ms(evs[i], evs[i + 1]) for i in range(6))
            except RuntimeApiError:
                pass

    # ------------------------------------------------------------------ reading
    def read(self) -> list[dict]:
        """Rows for every call waiting to be read; nothing while the stream captures."""
        if not self._pending:
            return []
        be, stream = self.be, self.model.L.stream()
        status = capture_status(be, stream)
        if status != "none":
            return []  # the guard: no synchronize, no read, while the stream captures
        calls, self._pending = self._pending, []
        try:
            be.stream_synchronize(stream)
        except RuntimeApiError as e:
            self.errors.append({"token": self.token, "layer": -1, "tokens": 0, "phase": "read", "error": e.name,
                                "status_after": capture_status(be, stream), "where": "read"})
        records = self.trace.take() if (self.trace is not None and self.trace.available) else None
        slots_host = None
        if self._slots is not None and not self.timing_only:
            slots_host = np.asarray(be.to_host(self._slots)).astype(np.float64)
        elif self._slots is not None:
            slots_host = self._stamps_from_trace(calls, records)
        groups = self._trace_groups(calls, records) if self.mode == "cupti" else None
        rows = []
        for i, c in enumerate(calls):
            rows.extend(self._rows(c, slots_host, groups[i] if groups is not None else None))
        return rows

    def _stamps_from_trace(self, calls, records) -> np.ndarray:
        """Timing-only sim (no numbers are computed, so stamp kernels write nothing): the stamp
        kernels' modeled start times, in the order they ran, attributed 7 per executed call."""
        out = np.zeros(self._slot_cap, dtype=np.float64)
        starts = [r[1] for r in (records or []) if r[0] == "stamp_time"]
        j = 0
        for c in calls:
            if c.phase == "capture" or c.probe is None or c.probe.kind != "stamps":
                continue
            for i in range(7):
                if j < len(starts):
                    out[c.probe.slot + i] = starts[j]
                    j += 1
        return out

    def _trace_groups(self, calls, records) -> list:
        """Trace records split into MoE calls at each ``xq_quantize``, assigned to the calls that ran."""
        if records is None:
            return [None] * len(calls)
        recs = sorted((r for r in records if kernel_stage(r[0])), key=lambda r: r[1])
        groups, cur = [], None
        for r in recs:
            if kernel_stage(r[0]) == "xq" or cur is None:
                cur = []
                groups.append(cur)
            cur.append(r)
        out, j = [], 0
        for c in calls:
            if c.phase == "capture":
                out.append([])
            else:
                out.append(groups[j] if j < len(groups) else [])
                j += 1
        if j != len(groups):
            self.notes.append(f"trace: {len(groups)} MoE kernel groups for {j} executed calls")
        return out

    def _base(self, c: _Call) -> dict:
        return {"token": c.token, "layer": c.layer, "tokens": c.tokens, "pairs": c.tokens * self.k,
                "mode": self.mode, "backend": self.be.name, "routing": self.routing, "modeled": self.modeled,
                "phase": c.phase, "note": c.note}

    def _stage_rows(self, c: _Call, ms: dict, note: str = "") -> list[dict]:
        base = self._base(c)
        if note:
            base["note"] = _join(base["note"], note)
        return [{**base, "stage": s, "ms": float(ms.get(s, math.nan))} for s in STAGES]

    def _nan_rows(self, c: _Call, note: str, stages=STAGES) -> list[dict]:
        base = self._base(c)
        base["note"] = _join(base["note"], note)
        return [{**base, "stage": s, "ms": math.nan} for s in stages]

    def _rows(self, c: _Call, slots_host, group) -> list[dict]:
        be, p = self.be, c.probe
        if self.mode == "nvtx":
            if p is None or c.phase == "replay":
                return self._nan_rows(c, "NVTX ranges are host calls: a graph replay emits none")
            if not self.nvtx.ok:
                return self._nan_rows(c, f"no ranges: {self.nvtx.why}")
            if p.nvtx_capturing:
                return self._nan_rows(c, "NVTX ranges emitted at capture time: they mark the capture, not execution")
            return self._nan_rows(c, f"NVTX ranges only ({p.nvtx_ranges} per call, domain ds4lab): no timing")
        if self.mode == "cupti":
            if not self.trace.available:
                return self._nan_rows(c, self.unavailable_reason)
            if not group:
                return self._nan_rows(c, "no kernel records for this call" +
                                      (" (captured, not run)" if c.phase == "capture" else ""))
            ms = {s: 0.0 for s in MOE_STAGES}
            for name, t0, t1, _kind, _g in group:
                ms[kernel_stage(name)] += (t1 - t0) / 1e6
            ms["total"] = (max(r[2] for r in group) - min(r[1] for r in group)) / 1e6
            src = "modeled timeline" if self.modeled else "CUPTI activity records"
            return self._stage_rows(c, ms, f"{src}: stage = kernel busy time, total = first start to last end")
        if self.mode == "graph-boundary":
            if c.bracket is None:
                return self._nan_rows(c, "no boundary events", ("total",))
            if c.phase == "capture+replay" and not self.raw:
                return self._nan_rows(c, "capturing call: its boundary time includes capture and instantiation",
                                      ("total",))
            try:
                be.event_synchronize(c.bracket[1])
                ms = be.event_elapsed_ms(c.bracket[0], c.bracket[1])
            except RuntimeApiError as e:
                self._read_error(c, e)
                return self._nan_rows(c, f"read failed: {e.name}", ("total",))
            base = self._base(c)
            extra = {"eager": "eager call bracketed (no graph)",
                     "capture+replay": "includes capture and instantiation"}.get(c.phase, "")
            base["note"] = _join(base["note"], extra)
            return [{**base, "stage": "total", "ms": float(ms)}]
        if p is None:
            return self._nan_rows(c, "no instrumented call")
        if p.error:
            return self._nan_rows(c, f"call failed: {p.error}")
        if p.kind == "host":
            if not p.host:
                return self._nan_rows(c, "no host-timed record")
            return self._stage_rows(c, p.host)
        if p.kind == "events":
            return self._event_rows(c, p)
        if p.kind == "stamps":
            if c.phase == "capture":
                return self._nan_rows(c, "stamps captured: they run when the graph is replayed")
            t = slots_host[p.slot:p.slot + 7] if slots_host is not None else np.zeros(7)
            if not np.all(t > 0):
                return self._nan_rows(c, "stamp slots not written")
            ms = {s: (t[i + 1] - t[i]) / 1e6 for i, s in enumerate(MOE_STAGES)}
            ms["total"] = (t[6] - t[0]) / 1e6
            src = ("modeled device clock (stamp kernel start)" if self.modeled else
                   "%globaltimer (ns; update step: globaltimer_resolution)")
            return self._stage_rows(c, ms, f"in-graph stamps: {src}; each stage includes one stamp kernel")
        return self._nan_rows(c, f"nothing recorded ({p.kind})")

    def _event_rows(self, c: _Call, p: _Probe) -> list[dict]:
        be = self.be
        in_graph = c.phase != "eager" or p.phase == "capture"
        if in_graph and not self.raw:
            return self._nan_rows(c, "events recorded inside a capture are not graph nodes: nothing was timed")
        try:
            be.event_synchronize(p.events[6])
            vals = tuple(be.event_elapsed_ms(p.events[i], p.events[i + 1]) for i in range(6))
        except RuntimeApiError as e:
            self._read_error(c, e)
            return self._nan_rows(c, f"read failed: {e.name}")
        note = ""
        if self._poison.get(id(p.events)) == vals:
            note = "stale: the events still hold their previous (eager) record"
        ms = dict(zip(MOE_STAGES, vals))
        ms["total"] = sum(vals)
        return self._stage_rows(c, ms, note)

    def _read_error(self, c: _Call, e: RuntimeApiError) -> None:
        self.errors.append({"token": c.token, "layer": c.layer, "tokens": c.tokens, "phase": c.phase,
                            "error": e.name, "status_after": self._status(), "where": "read"})


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage-collector pauses inside timed work (as ``ds4lab ladder`` does); the young
    generations are collected first (a full collection costs more than the work in a big process)."""
    gc.collect(1)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)


# ----------------------------------------------------------------------------- workloads
class MoeWorkbench:
    """A model, its inputs and the routing patterns for routed-MoE steps (see module docstring).

    Args:
        be: ``cupy`` or ``sim`` backend (the ``numpy`` executor has no clock: refused).
        cfg: model configuration; ``max_tokens`` is raised to the largest token count.
        max_tokens: largest token count a step will use.
        n_layers: build only the first layers (default: all).
        stream: ``"non-blocking"`` (default: needed for capture) or ``"legacy"``.
        counts_clear: the routed-MoE counts clear (``"async"``: the capture-safe fix, default).
        vocab: build the vocabulary projection (whole-token timing).
        seed: routing and input seed.
    """

    def __init__(self, be, cfg, *, max_tokens: int = 512, n_layers: int | None = None, stream: str = "non-blocking",
                 counts_clear: str = "async", vocab: bool = False, seed: int = 0) -> None:
        if not (be.measures_time or is_modeled(be)):
            raise ValueError(f"the {be.name} backend makes no timing claims: profile on cupy or sim")
        if stream not in ("non-blocking", "legacy"):
            raise ValueError(f"stream={stream!r}: choose 'non-blocking' or 'legacy'")
        self.be = be
        self.cfg = cfg.replace(max_tokens=max(max_tokens, 1)) if cfg.max_tokens < max_tokens else cfg
        self.model = DecodeModel(self.cfg, be, TokenOptions(counts_clear=counts_clear, scratch="prealloc", vocab=vocab),
                                 n_layers=n_layers)
        self.stream = be.new_stream(non_blocking=True) if stream == "non-blocking" else S.LEGACY_STREAM
        self.legacy = S.LEGACY_STREAM
        c = self.cfg
        self.x = be.empty((c.max_tokens, c.embed), np.float32)
        be.fill_f32(self.x, "moeprof.x", 1.0, 0.0, c.seed + seed)
        self.tok = be.zeros((c.max_tokens,), np.int32)
        self.rng = np.random.default_rng(seed)
        N, k = c.n_experts, c.n_used
        ranks = self.rng.permutation(N)
        p = (ranks + 1.0) ** -ZIPF_S
        self.zipf_p = p / p.sum()
        self.worst_experts = np.sort(self.rng.choice(N, k, replace=False)).astype(np.int32)
        be.synchronize()

    # ------------------------------------------------------------------ routing
    def layers_for(self, routing: str, layers=None) -> list[int]:
        """The layers a routing pattern runs on: ``hash`` only on the model's hash-routed layers."""
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; choose one of: {', '.join(ROUTINGS)}")
        ls = list(range(self.model.n_layers)) if layers is None else list(layers)
        if routing == "hash":
            ls = [l for l in ls if self.cfg.is_hash_layer(l)]
            if not ls:
                raise ValueError(f"{self.cfg.name}: no hash-routed layer among {layers} "
                                 f"(the first {self.cfg.n_hash_layers} layers are hash-routed)")
        return ls

    def pattern(self, routing: str, T: int) -> tuple[np.ndarray, np.ndarray]:
        """Host expert ids ``[T, k]`` (int32, distinct per token) and weights ``[T, k]`` (float32,
        summing to 1 per token) for ``uniform``, ``zipf`` or ``worst``."""
        N, k = self.cfg.n_experts, self.cfg.n_used
        if routing == "worst":
            ids = np.broadcast_to(self.worst_experts, (T, k)).copy()
        elif routing in ("uniform", "zipf"):
            logp = np.zeros(N) if routing == "uniform" else np.log(self.zipf_p)
            keys = logp[None, :] + self.rng.gumbel(size=(T, N))  # Gumbel top-k: k draws without replacement
            ids = np.argpartition(-keys, k - 1, axis=1)[:, :k].astype(np.int32)
        else:
            raise ValueError(f"routing {routing!r} has no injected pattern")
        w = self.rng.random((T, k)) + 0.1
        return ids.astype(np.int32), (w / w.sum(axis=1, keepdims=True)).astype(np.float32)

    def prepare(self, layer: int, T: int, routing: str) -> None:
        """Before the MoE stages: new token ids, the router (outside the timed stages), and for the
        non-hash patterns the chosen ids and weights written over the router's outputs on the device."""
        m = self.model
        L = m.L
        with L.cluster("router"):
            L.copy_h2d("profile.token_ids", self.tok[:T], self.rng.integers(0, self.cfg.vocab, T, dtype=np.int32))
        m.router(layer, self.x, T, token_ids=self.tok)
        if routing != "hash":
            ids, wts = self.pattern(routing, T)
            b = m.moe_buf
            with L.cluster("router"):
                L.copy_h2d("profile.route_ids", b.ids[:T], ids)
                L.copy_h2d("profile.route_wts", b.wts[:T], wts)

    def moe_call(self, layer: int, T: int) -> None:
        """One routed-MoE call through the model's cluster runner (eager, or the executor's graph)."""
        m = self.model
        m.run_cluster("moe", layer, T, None, lambda: m.routed_moe(layer, self.x, T), inputs=(self.x,))

    def step(self, prof: MoeProfiler | None, token: int, T: int, routing: str, layers: list[int],
             brackets: list | None = None) -> list[dict]:
        """One step: for each layer, prepare then the MoE call. Returns the profiler's rows (read after
        the step). ``brackets``: a list to append ``(e0, e1)`` events recorded around each MoE call."""
        be = self.be
        if prof is not None:
            prof.begin_step(token)
        for layer in layers:
            self.prepare(layer, T, routing)
            if brackets is not None:
                e0, e1 = be.new_event(), be.new_event()
                be.event_record(self.model.L.stream(), e0)
            self.moe_call(layer, T)
            if brackets is not None:
                be.event_record(self.model.L.stream(), e1)
                brackets.append((e0, e1))
        return prof.end_step() if prof is not None else []

    @contextlib.contextmanager
    def session(self, executor=None, stream=None) -> Iterator[None]:
        """``DS4_CUDA_GRAPHS`` on, the workbench's stream as the accessor's override, ``executor`` installed."""
        m = self.model
        was, prev_exec = S.graphs_enabled(), m.executor
        S.set_graphs_enabled(True)
        m.executor = executor
        try:
            with S.stream_override(self.stream if stream is None else stream):
                yield
        finally:
            m.executor = prev_exec
            S.set_graphs_enabled(was)

    # ------------------------------------------------------------------ routing check
    def expert_load(self, layer: int, T: int, routing: str) -> dict:
        """Run one eager MoE call with ``routing`` and report the work it routed: experts hit, the
        largest expert load, the tiles built (T > 1) and the pairs. Synchronizes (not for timing)."""
        m, be = self.model, self.be
        with self.session():
            self.prepare(layer, T, routing)
            m.routed_moe(layer, self.x, T)
            be.synchronize()
            ids = np.asarray(be.to_host(m.moe_buf.ids))[:T].reshape(-1)
            out = {"routing": routing, "tokens": T, "pairs": T * self.cfg.n_used}
            if np.isnan(np.asarray(ids, dtype=np.float64)).any():
                return {**out, "experts_hit": math.nan, "max_load": math.nan, "n_tiles": math.nan}
            counts = np.bincount(ids.astype(np.int64), minlength=self.cfg.n_experts)
            out.update(experts_hit=int((counts > 0).sum()), max_load=int(counts.max()))
            if T > 1:
                dev_counts = np.asarray(be.to_host(m.moe_buf.counts)).astype(np.int64)
                out["counts_match"] = bool(np.array_equal(dev_counts, counts))
                out["n_tiles"] = int(np.asarray(be.to_host(m.moe_buf.n_tiles))[0])
            else:
                out["n_tiles"] = 0
        return out


# ----------------------------------------------------------------------------- runs
def iter_profile(wb: MoeWorkbench, mode: str, tokens: int, routing: str, steps: int, *, layers=None,
                 regime: str = "auto", capture_mode: str = "thread_local", warmup: int | None = None,
                 fallback: bool | str = False, guard: bool = True, read_every: int | None = None,
                 raw: bool = False) -> Iterator[list[dict]]:
    """Profile ``steps`` steps of ``tokens`` tokens with ``routing``; yields each step's rows.

    ``regime``: ``eager``, ``replayed`` (the MoE cluster captured once per layer and token count,
    then replayed), or ``auto`` (replayed for graph-boundary and in-graph, else eager). ``warmup``
    steps run first and are not reported (default: 1 eager, 2 replayed: warm-up and capture).
    """
    if regime == "auto":
        regime = "replayed" if mode in ("graph-boundary", "in-graph") else "eager"
    if regime not in REGIMES:
        raise ValueError(f"regime={regime!r}: choose eager, replayed or auto")
    if not 1 <= tokens <= wb.cfg.max_tokens:
        raise ValueError(f"tokens={tokens} outside 1..{wb.cfg.max_tokens} (the workbench's max_tokens)")
    ls = wb.layers_for(routing, layers)
    warm = (2 if regime == "replayed" else 1) if warmup is None else warmup
    cache = GraphCache(wb.be, ("moe",), mode=capture_mode, warmup=1) if regime == "replayed" else None
    prof = MoeProfiler(wb.model, mode, routing=routing, guard=guard, fallback=fallback, read_every=read_every,
                       raw=raw)
    with wb.session(cache), prof.attached(calls_per_read=len(ls)), gc_paused():
        for i in range(warm + steps):
            rows = wb.step(prof, i - warm, tokens, routing, ls)
            if i >= warm:
                yield rows
        rest = prof.read()
        if rest:
            yield rest
    wb.last_profiler, wb.last_cache = prof, cache


def profile(wb: MoeWorkbench, mode: str, tokens: int, routing: str = "uniform", steps: int = 10, **kw):
    """All rows of :func:`iter_profile` as a DataFrame (columns :data:`ROW_COLUMNS`)."""
    import pandas as pd

    rows = [r for step in iter_profile(wb, mode, tokens, routing, steps, **kw) for r in step]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def summarize(df):
    """Median and IQR (ms) per mode, backend, routing, token count and stage (finite values only)."""
    import pandas as pd

    keys = ["mode", "backend", "routing", "tokens", "stage"]
    d = df[np.isfinite(df["ms"].astype(float))]
    if d.empty:
        return pd.DataFrame(columns=keys + ["n", "median_ms", "p25_ms", "p75_ms", "iqr_ms", "modeled"])
    g = d.groupby(keys, sort=False)
    out = g["ms"].agg(n="count", median_ms="median", p25_ms=lambda s: s.quantile(0.25),
                      p75_ms=lambda s: s.quantile(0.75)).reset_index()
    out["iqr_ms"] = out["p75_ms"] - out["p25_ms"]
    out["modeled"] = g["modeled"].first().to_numpy()
    out["_o"] = out["stage"].map({s: i for i, s in enumerate(STAGES)})
    return out.sort_values(["mode", "routing", "tokens", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)


# ----------------------------------------------------------------------------- ds4's line
def format_ds4_line(tokens: int, ms: dict, pairs: int | None = None, n_used: int = 6, digits: int = 3) -> str:
    """ds4's stderr line for one call: ``ds4: CUDA MoE profile tokens=<n> pairs=<n*6> xq=<ms> ... total=<ms> ms``.

    ``ms``: stage → milliseconds (missing stages print ``nan``; ``total`` defaults to the sum).
    """
    vals = {s: float(ms.get(s, math.nan)) for s in MOE_STAGES}
    total = ms.get("total")
    vals["total"] = float(sum(vals.values()) if total is None else total)
    return DS4_LINE.format(tokens=int(tokens), pairs=int(tokens * n_used if pairs is None else pairs),
                           **{s: f"{v:.{digits}f}" for s, v in vals.items()})


def parse_ds4_line(line: str) -> dict | None:
    """The fields of one ds4 MoE profile line (``tokens``, ``pairs`` and each stage in ms), or None."""
    m = DS4_LINE_RE.search(line)
    if not m:
        return None
    g = m.groups()
    return {"tokens": int(g[0]), "pairs": int(g[1]), **{s: float(v) for s, v in zip(STAGES, g[2:])}}


def ds4_lines(df, digits: int = 3, n_used: int | None = None, header: str | None = None) -> list[str]:
    """One ds4 line per profiled call in ``df`` (rows with all six stages), in call order.

    ``header``: where the numbers come from (e.g. ``"ds4lab moe · " + provenance.label(meta)``), put
    first as a ``# `` comment line when there is any call. ds4's line parsers (:func:`read_ds4_log`,
    ``ds4lab ingest``) skip it as a profile line but read it as provenance: the lines are ds4lab's,
    modeled when the header says ``MODELED``. It must be one line and start with ``ds4lab``."""
    hdr = None
    if header is not None:
        hdr = str(header).strip().lstrip("#").strip()
        if "\n" in hdr or "\r" in hdr or not hdr.startswith("ds4lab") or "ds4: CUDA MoE profile" in hdr:
            raise ValueError(f"ds4 log header must be one line starting with 'ds4lab' and not a profile "
                             f"line: {header!r}")
    out = []
    d = df[df["stage"].isin(STAGES)]
    for (_mode, _routing, _t, _tok, _layer), g in d.groupby(["mode", "routing", "token", "tokens", "layer"],
                                                         sort=False):
        ms = dict(zip(g["stage"], g["ms"].astype(float)))
        if not all(s in ms and np.isfinite(ms[s]) for s in MOE_STAGES):
            continue
        pairs = int(g["pairs"].iloc[0]) if "pairs" in g else None
        out.append(format_ds4_line(int(_tok), ms, pairs=pairs, n_used=n_used or 6, digits=digits))
    return ([f"# {hdr}"] if hdr and out else []) + out


def read_ds4_log(text: str, n_layers: int | None = None, backend: str = "ds4"):
    """Profile rows (:data:`ROW_COLUMNS`) from a ds4 stderr log: one call per matching line; with
    ``n_layers``, calls are numbered token by token (layer = call index mod ``n_layers``).

    A ``# ds4lab ...`` header line (:func:`ds4_lines`) marks the lines after it as ds4lab's: their
    ``note`` is the header and ``modeled`` is true when it says ``MODELED``."""
    import pandas as pd

    from ..ingest import ds4lab_header

    rows = []
    i = 0
    note, modeled = "ds4 DS4_CUDA_MOE_PROFILE line", False
    for line in text.splitlines():
        h = ds4lab_header(line)
        if h is not None:
            note, modeled = h
            continue
        d = parse_ds4_line(line)
        if d is None:
            continue
        token, layer = (i // n_layers, i % n_layers) if n_layers else (i, -1)
        base = {"token": token, "layer": layer, "tokens": d["tokens"], "pairs": d["pairs"], "mode": "ds4",
                "backend": backend, "routing": "model", "modeled": modeled, "phase": "eager", "note": note}
        rows.extend({**base, "stage": s, "ms": d[s]} for s in STAGES)
        i += 1
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


# ----------------------------------------------------------------------------- whole tokens
def _clock(be) -> Callable[[], float]:
    """µs: the sim's modeled host clock, or the real host clock on a GPU."""
    if is_modeled(be):
        return lambda: be.host_time_us
    return lambda: time.perf_counter() * 1e6


def time_tokens(wb: MoeWorkbench, mode: str | None = None, regime: str = "eager", tokens: int = 8,
                warmup: int = 2, start: int = 1000, capture_mode: str = "thread_local",
                fallback: bool | str = False) -> dict:
    """Decode ``tokens`` whole tokens (after ``warmup``) with ``mode`` attached (None: no profiling).

    Per token: µs between two events on the stream around the token, each token ended by a device
    synchronize (as ds4 does); the MoE's profiled total within it (sum over layers). The garbage
    collector is paused meanwhile. ``regime``
    ``replayed``: the shared-expert and routed-MoE clusters captured per layer and replayed (stage 2).
    Returns ``{"token_us": [...], "moe_us": [...], "rows": [...], "cache": GraphCache or None}``.
    """
    from ..ladder import token_id_at

    be, m = wb.be, wb.model
    cache = GraphCache(be, ("shared", "moe"), mode=capture_mode, warmup=1) if regime == "replayed" else None
    prof = MoeProfiler(m, mode, routing="model", fallback=fallback) if mode else None
    e0, e1 = be.new_event(), be.new_event()
    token_us, moe_us, rows = [], [], []
    with wb.session(cache), (prof.attached() if prof else contextlib.nullcontext()), gc_paused():
        be.synchronize()
        for i in range(warmup + tokens):
            pos = start + i
            if prof:
                prof.begin_step(i - warmup)
            be.event_record(wb.stream, e0)
            m.token(pos, token_id_at(pos, m.cfg.vocab))
            be.event_record(wb.stream, e1)
            be.synchronize()
            r = prof.end_step() if prof else []
            if i < warmup:
                continue
            token_us.append(be.event_elapsed_ms(e0, e1) * 1e3)
            tot = [x["ms"] for x in r if x["stage"] == "total" and np.isfinite(x["ms"])]
            moe_us.append(sum(tot) * 1e3 if tot else math.nan)
            rows.extend(r)
    return {"token_us": token_us, "moe_us": moe_us, "rows": rows, "cache": cache, "profiler": prof}


def token_share(wb: MoeWorkbench, tokens: int = 8, warmup: int = 2, mode: str = "deferred"):
    """The routed MoE's share of a whole decode token, eager: per token its µs and the MoE's
    profiled total within it (``deferred``: events read after the token, no mid-token sync)."""
    import pandas as pd

    r = time_tokens(wb, mode, "eager", tokens, warmup)
    df = pd.DataFrame({"token": range(len(r["token_us"])), "token_us": r["token_us"], "moe_us": r["moe_us"]})
    df["rest_us"] = df["token_us"] - df["moe_us"]
    df["share"] = df["moe_us"] / df["token_us"]
    df["mode"], df["backend"], df["modeled"] = mode, wb.be.name, is_modeled(wb.be)
    df["layers"] = wb.model.n_layers
    return df


def overhead_table(wb: MoeWorkbench, modes=MODES, tokens: int = 8, warmup: int = 2,
                   regimes=REGIMES, capture_mode: str = "thread_local", pairs: int = 1):
    """µs per whole decode token with each mode attached vs none, eager and replayed (stage 2:
    shared-expert and routed-MoE clusters captured). Each mode is timed right after its own baseline
    run (``pairs`` times, alternating), so slow drifts of the machine cancel; medians over tokens,
    ``overhead_us`` = median over pairs of (mode − its baseline). The ``none`` row: all baselines.

    ``host-timed`` under replay runs with its guard: the capture is refused and the MoE cluster runs
    eagerly (the ``note`` says so); that cost is the overhead of leaving ds4's profile on. On a GPU the
    eager token is launch-bound, so the profiler's own Python per MoE call (its hooks, its markers)
    counts in full there.
    """
    import pandas as pd

    rows = []
    # CUPTI stays loaded in the process once started (and may then take NVTX calls too): last.
    modes = sorted(modes, key=lambda m: m == "cupti")
    mk = lambda **kw: {"backend": wb.be.name, "modeled": is_modeled(wb.be), **kw}  # noqa: E731
    for regime in regimes:
        bases, out = [], []
        for mode in modes:
            probe = MoeProfiler(wb.model, mode)
            if not probe.available:
                out.append(mk(mode=mode, regime=regime, us_per_token=math.nan, baseline_us=math.nan,
                              overhead_us=math.nan, overhead_pct=math.nan, note=probe.unavailable_reason))
                continue
            diffs, us, bs, note = [], [], [], ""
            for _ in range(pairs):
                b = float(np.median(time_tokens(wb, None, regime, tokens, warmup, capture_mode=capture_mode)["token_us"]))
                r = time_tokens(wb, mode, regime, tokens, warmup, capture_mode=capture_mode)
                u = float(np.median(r["token_us"]))
                bs.append(b), us.append(u), diffs.append(u - b)
                c = r["cache"]
                if c is not None and c.stats.failures:
                    note = "capture refused → eager fallback: " + ";".join(f"{k}={v}" for k, v in c.stats.failures.items())
            bases += bs
            b, d = float(np.median(bs)), float(np.median(diffs))
            out.append(mk(mode=mode, regime=regime, us_per_token=float(np.median(us)), baseline_us=b, overhead_us=d,
                          overhead_pct=100 * d / b if b else math.nan, note=note))
        b = float(np.median(bases)) if bases else math.nan
        rows.append(mk(mode="none", regime=regime, us_per_token=b, baseline_us=b, overhead_us=0.0, overhead_pct=0.0,
                       note=f"median of {len(bases)} baseline runs"))
        rows += out
    return pd.DataFrame(rows, columns=["mode", "regime", "us_per_token", "baseline_us", "overhead_us", "overhead_pct",
                                       "note", "backend", "modeled"])


# ----------------------------------------------------------------------------- clock resolution
def globaltimer_resolution(be, n: int = 64) -> dict | None:
    """The update step of ``%globaltimer`` on this GPU (ns), from ``kernels/timestamp.cu:globaltimer_probe``:
    ``{"min_ns", "median_ns", "n"}``. None off a GPU (the sim's modeled clock is exact)."""
    if not be.is_gpu:
        return None
    cp = be.cp
    buf = cp.zeros((n,), dtype=np.uint64)
    be.function("globaltimer_probe")((1,), (32,), (buf, np.int32(n)), 0, cp.cuda.Stream.null)
    cp.cuda.runtime.deviceSynchronize()
    steps = cp.asnumpy(buf).astype(np.float64)
    steps = steps[steps > 0]
    if steps.size == 0:
        return {"min_ns": math.nan, "median_ns": math.nan, "n": 0}
    return {"min_ns": float(steps.min()), "median_ns": float(np.median(steps)), "n": int(steps.size)}
