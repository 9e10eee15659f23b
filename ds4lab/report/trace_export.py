"""``ds4lab trace``: one decode token's timeline per capture stage, as a Chrome/Perfetto trace.

For every stage asked for (``ds4lab.experiments.ladder.STAGES``), after warm-up (graphs captured), ``tokens``
decode tokens are traced:

* **kernels** (and memsets, host-to-device copies): on a GPU, CUPTI activity records
  (``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL``, ``MEMSET``, ``MEMCPY`` through ``cupti-python``; start
  and end in ns, stream id, and for a kernel launched from a graph its ``graph_id`` and
  ``graph_node_id``, zero for eager launches: CUPTI ``CUpti_ActivityKernel*`` record, measured on the
  H200 in ``shared/context/gpu-facts.md``, "Tracing"); on the sim, the modeled schedule of its cost
  model (``ds4lab.sim.costmodel.Device.timeline``: per launch, start and end in the modeled device
  clock), every event labelled MODELED. A replayed graph's node index on the sim is its position in
  the graph's launch order (the sim replays nodes in capture order);
* **NVTX ranges** (token → layer → cluster → op, ``ds4lab.capture.annotate``) from ds4lab's own record of
  its push and pop times (:class:`RecordingAnnotator`), in the clock the kernels use: CUPTI's
  timestamp (``cupti.get_timestamp``, the clock of its activity records) on a GPU, the modeled host
  clock on the sim. A captured stage pushes no op ranges while it replays: its token shows the token
  range and the graph launch, with the kernels of the graph under it on the GPU track;
* **the CUDA API level** (for ``ds4lab audit`` of ds4lab's own token, :mod:`ds4lab.report.trace_api`):
  on a GPU the CUPTI runtime and driver call records, synchronizations, event records and stream
  kinds (legacy, blocking, non-blocking) of the traced tokens; on the sim the backend's call log
  (MODELED); each call linked to its device work by a correlation id. Each eagerly launched kernel
  carries its scalar arguments as the launch layer passed them (``args``); a replayed kernel has
  none (it runs with the arguments of its capture).

Each kernel of a traced token is given its launch site (cluster, layer, op) by position: the
token's kernels, in start order, are matched one to one with the launch sites of an eager token of
the same model (``Launcher.trace``); where the counts or names differ, no site is given and the
result says so (``sites_matched``).

Written to ``out``: ``trace.json`` (the Trace Event format: ``{"otherData": {...}, "displayTimeUnit":
"ns", "traceEvents": [...]}``, complete events ``"ph": "X"`` with ``ts`` and ``dur``
in µs, one process per stage with ``process_name``/``thread_name`` metadata events ``"ph": "M"``;
as ``torch.profiler`` exports; opens in ui.perfetto.dev and chrome://tracing; each stage's process
starts at 0 µs, its clock offset in ``otherData.clock_offset_ns``), ``trace_kernels.csv`` and
``trace_nvtx.csv``, ``trace_api.csv`` (the same events as tables; named apart from ``compare``'s
kernel tables; every row ends with ``backend``, ``preset`` and ``modeled``, as ``ladder.csv``),
``meta.json`` and the figure ``trace.png/.svg/.pdf`` (:func:`ds4lab.report.plots.trace_figure`).

Source of the format: "Trace Event Format" (Google, the document chrome://tracing and Perfetto
read): JSON object form, events ``X`` (complete: ``ts``, ``dur``), ``M`` (metadata: ``process_name``,
``thread_name``, ``process_sort_index``), ``displayTimeUnit``, ``otherData``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from . import provenance, results
from ..capture import stream as S
from ..sim.calibration import backend_calibration
from ..errors import BadInput, CheckFailed

TRACE_OUTPUTS = ("trace.json", "trace_kernels.csv", "trace_nvtx.csv", "trace_api.csv", "trace.png", "trace.svg",
                 "trace.pdf")
HOST_TID = 1
API_TID = 2
GPU_TID0 = 100


class TraceError(BadInput):
    """A trace request that cannot run (unknown stage, no tokens, no kernel source on the backend):
    nothing traced (exit 2)."""


class NoKernelRecords(CheckFailed):
    """The traced tokens of a stage gave no kernel record (exit 1; ``meta.json`` says so)."""


@dataclass
class TraceConfig:
    """What ``ds4lab trace`` runs.

    Attributes:
        preset: model dimensions (``ds4lab.token.config.PRESETS``); None: the job's default
            (``ds4lab.jobs.common.DEFAULT_PRESETS``: ds4-flash on a GPU, small on the sim).
        stages: comma-separated stage names (``ds4lab.experiments.ladder.STAGES``), one trace process each;
            None: ``0,3``, or ``0s`` with a ``hazard`` (stage 0 with the accessor's stream set, as a
            capture runs it: work that bypasses the accessor then shows on the legacy stream).
        hazard: a token hazard of ``ds4lab ladder --hazard`` (:data:`ds4lab.experiments.hazards.HAZARDS`)
            whose ds4-today path the traced tokens take (its ``TokenOptions`` over each stage's), so that
            ``ds4lab audit`` of the trace reports it. The routed-MoE hazards (``steps`` ``moe``:
            sync-memset, alloc-in-capture, host-timed-profile) trace the hazard's own step, as ``ladder
            --hazard`` demonstrates it: the router and routed MoE of the first top-k layer for 2 tokens
            (multi-token-prediction verification), inside a ``token`` NVTX range; their warm-up runs decode
            tokens, so scratch grown on demand grows in the first traced step. None: no hazard.
        tokens: tokens traced per stage (≥ 1), after ``warmup`` tokens (≥ 1: the captured stages
            capture their graphs there).
        warmup: untraced tokens per stage before the traced ones.
        out: result folder; None: ``results/trace-<preset>-<backend>`` (``-<hazard>`` added with one).
        capture_mode: stream-capture mode of the captured stages.
    """

    preset: str | None = None
    stages: str | None = None
    tokens: int = 2
    warmup: int = 3
    out: Path | None = None
    capture_mode: str = "thread_local"
    hazard: str | None = None


@dataclass
class TraceResult:
    """What one trace wrote: the output folder, the kernel, NVTX and CUDA API tables, provenance."""

    out: Path
    kernels: pd.DataFrame
    nvtx: pd.DataFrame
    meta: dict
    files: list = field(default_factory=list)
    api: pd.DataFrame = field(default_factory=pd.DataFrame)


# ----------------------------------------------------------------------------- NVTX record
class RecordingAnnotator:
    """An annotator (the :class:`ds4lab.capture.annotate.NvtxAnnotator` interface) that records each range's
    push and pop time with ``clock_ns`` (a callable returning ns), and passes every call on to
    ``inner`` (e.g. an :class:`~ds4lab.capture.annotate.NvtxAnnotator`, so Nsight tools still see the ranges).

    ``ranges``: ``(message, cluster, payload, start_ns, end_ns, depth)`` per popped range while
    :attr:`recording` is true (``depth`` 0 for the outermost). A pop without a push raises
    IndexError, as an unbalanced NVTX stack is a bug of the caller.
    """

    enabled = True

    def __init__(self, clock_ns: Callable[[], float], inner=None) -> None:
        self.clock_ns = clock_ns
        self.inner = inner
        self.recording = False
        self.ranges: list[tuple] = []
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
            self.ranges.append((message, cluster, payload, t0, self.clock_ns(), len(self._stack)))


# ----------------------------------------------------------------------------- kernel sources
class CuptiKernelSource:
    """CUPTI activity records of ds4lab's one CUPTI session (:class:`ds4lab.backends.cupti.CuptiSession`,
    kinds :data:`~ds4lab.backends.cupti.TRACE_KINDS`): kernels, memsets and copies with stream, graph and
    node ids (:meth:`take`), and the API level of the same span (:meth:`take_api`: runtime and driver
    calls, synchronizations, event records, stream kinds; :mod:`ds4lab.report.trace_api`); timestamps
    on CUPTI's clock (``clock_ns`` is ``cuptiGetTimestamp``). Raises
    :class:`~ds4lab.backends.cupti.CuptiUnavailable` when ``cupti-python`` is missing or CUPTI does not
    start."""

    modeled = False

    def __init__(self) -> None:
        from ..backends.cupti import CuptiSession

        self.session = CuptiSession.get()
        self.clock_ns = self.session.timestamp
        self.sub = None
        self._api: list = []
        self.known: dict[int, str] = {}

    def start(self) -> None:
        from ..backends.cupti import TRACE_KINDS

        self.sub = self.session.subscribe(TRACE_KINDS)
        self._api = []

    def take(self) -> list[dict]:
        """Kernel, memset and memcpy records since the last take (dicts); the API level of the same
        span is kept for :meth:`take_api`."""
        from ..backends.cupti import MEMCPY_KINDS, MEMORY_KINDS, host_memory

        recs = self.sub.take() if self.sub is not None else []
        out = []
        for r in recs:
            extra = {}
            if r[0] == "kernel":
                _, name, t0, t1, dev, stream, corr, _g, _b, _s, gid, gnode = r
            elif r[0] == "memset":
                _, _mk, t0, t1, dev, stream, corr, nbytes, gid, gnode = r
                name, extra = "memset", {"bytes": int(nbytes)}
            elif r[0] == "memcpy":
                _, ck, t0, t1, dev, stream, corr, nbytes, sk, dk, gid, gnode = r
                kind = MEMCPY_KINDS.get(ck, "")
                src, dst = MEMORY_KINDS.get(sk, "Unknown"), MEMORY_KINDS.get(dk, "Unknown")
                name = f"Memcpy {kind or '?'} ({src} -> {dst})"
                extra = {"bytes": int(nbytes), "copy_kind": kind, "host_memory": host_memory(kind, src, dst)}
            else:
                continue
            out.append({"name": name, "kind": r[0], "start_ns": int(t0), "end_ns": int(t1), "stream": int(stream),
                        "graph_id": int(gid), "graph_node_id": int(gnode), "correlation": int(corr),
                        "device": int(dev), **extra})
        self._api += [r for r in recs if r[0] not in ("kernel", "memset", "memcpy")]
        return out

    def take_api(self) -> tuple[list[dict], dict]:
        """``(calls, stream_types)`` of the span read by the takes since the last call
        (:func:`ds4lab.report.trace_api.cupti_api_rows`)."""
        from .trace_api import cupti_api_rows

        recs, self._api = self._api, []
        calls, _, types = cupti_api_rows(self.session, recs)
        for c in calls:
            if not c["stream_type"] and c["stream"] in self.known:
                c["stream_type"] = self.known[c["stream"]]
        return calls, {**types, **self.known}

    def note_stream(self, stream) -> None:
        """Learn the CUPTI id and kind of a stream created before the trace started (CUPTI's ``STREAM``
        records only name streams created while it records): ``cuptiGetStreamIdEx`` of the handle and
        its ``cuStreamGetFlags`` (``CU_STREAM_NON_BLOCKING``). A stream that is not a CUDA handle, or a
        failing call, leaves it unknown."""
        from ..backends.cupti import current_context

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

    def stop(self) -> None:
        if self.sub is not None:
            self.sub.close()


#: The device the sim's modeled work runs on: one GPU, CUDA's first (as ``cudaGetDevice`` says).
SIM_DEVICE = 0


class SimKernelSource:
    """A modeled device timeline (the backend contract's ``trace_records``: the sim's cost-model
    schedule) as kernel records, MODELED; ``clock_ns`` is the backend's host clock (the sim's
    modeled one, ``host_clock_us``). While it runs, a :class:`ds4lab.report.trace_api.SimCallLog`
    logs the backend calls (the API level, :meth:`take_api`) and links each to its device work."""

    modeled = True

    def __init__(self, be) -> None:
        from .trace_api import SimCallLog

        self.be = be
        self._next = 0
        self.clock_ns = lambda: be.host_clock_us() * 1e3
        self.log = SimCallLog(be)

    def start(self) -> None:
        _, self._next = self.be.trace_records(self._next)
        if not self.log.on:
            self.log.install()

    def take(self) -> list[dict]:
        since = self._next
        new, self._next = self.be.trace_records(self._next)
        first = self._next - len(new)
        out, node, last_graph = [], 0, None
        for j, (stream, name, start, end, kind, graph) in enumerate(new):
            if graph is None:
                last_graph = None
            elif graph != last_graph:
                node, last_graph = 0, graph
            sid, skind = self.log.streams.get(str(stream), (-1, ""))
            out.append({"name": name, "kind": kind, "start_ns": start * 1e3, "end_ns": end * 1e3,
                        "stream": str(stream), "graph_id": 0 if graph is None else int(graph),
                        "graph_node_id": 0 if graph is None else node,
                        "correlation": self.log.corr_of.pop(first + j, -1), "stream_id": sid, "stream_type": skind,
                        "device": SIM_DEVICE})
            if graph is not None:
                node += 1
        for i in [i for i in self.log.corr_of if i < since]:
            del self.log.corr_of[i]
        return out

    def take_api(self) -> tuple[list[dict], dict]:
        """``(calls, stream_types)`` logged since the last call: one ``api`` dict per backend call, and a
        ``sync`` dict beside each call that synchronizes (MODELED)."""
        calls = []
        for c in self.log.take():
            calls.append({"kind": "api", "tid": 1, "event": -1, **c})
            if c["sync_kind"]:
                calls.append({**c, "kind": "sync", "name": "sync", "domain": "", "tid": -1, "event": -1})
        return calls, {sid: kind for sid, kind in self.log.streams.values()}

    def stop(self) -> None:
        self.log.remove()


def kernel_source(be):
    """:class:`SimKernelSource` on the sim; :class:`CuptiKernelSource` on a GPU. Raises TraceError
    (with the reason) where neither can run."""
    from ..backends.base import ModeledTime

    if isinstance(be, ModeledTime):
        return SimKernelSource(be)
    if not be.is_gpu:
        raise TraceError(f"no kernel timeline on the {be.name} backend: use cupy (a GPU) or sim")
    try:
        return CuptiKernelSource()
    except Exception as e:  # ImportError, or a CUPTI library that does not load
        raise TraceError(f"CUPTI is not usable here ({type(e).__name__}: {e}); pip install cupti-python") from None


# ----------------------------------------------------------------------------- the job
def check_config(config: TraceConfig) -> list:
    """The stages of ``config`` after checking it before any work (no backend needed).

    Raises:
        TraceError: unknown or repeated stage, tokens or warm-up below 1, an empty ``out``, a hazard
            that is not a token hazard of ``ladder --hazard``.
    """
    from ..experiments.hazards import HAZARD_SETS
    from ..experiments.stages import StageInputError, parse_stages

    if config.hazard is not None and config.hazard not in HAZARD_SETS["all"]:
        raise TraceError(f"--hazard {config.hazard}: choose one of {', '.join(HAZARD_SETS['all'])} (the token "
                         "hazards of ds4lab ladder --hazard; the long-context ones are not traced)")
    try:
        st_list = parse_stages(stages_of(config))
    except StageInputError as e:
        raise TraceError(str(e)) from None
    if config.tokens < 1 or config.warmup < 1:
        raise TraceError(f"tokens={config.tokens} and warmup={config.warmup} must be at least 1 (the warm-up "
                         "captures the graphs of the captured stages)")
    from ..jobs.common import check_out_option

    check_out_option(config.out)
    return st_list


def stages_of(config: TraceConfig) -> str:
    """The stages ``config`` traces (see :class:`TraceConfig`)."""
    if config.stages is not None:
        return config.stages
    return "0s" if config.hazard else "0,3"


def run_trace(config: TraceConfig, backend=None, console=None) -> TraceResult:
    """Trace ``config.tokens`` tokens of every stage in ``config.stages`` on ``backend`` and write the
    trace, the tables, ``meta.json`` and the figure to ``config.out``. ``backend``: a ds4lab backend
    (None: ``auto``, opened as the jobs open it; on the sim a timing-only backend is enough). The job
    ``trace`` of :mod:`ds4lab.jobs` runs this. Returns a :class:`TraceResult`.

    Raises:
        TraceError: bad input (:func:`check_config`) or no kernel source on this backend (exit 2).
        NoKernelRecords: a stage's traced tokens gave no kernel record (exit 1; ``meta.json`` says
            ``failed``).
        ds4lab.token.config.ConfigError: unknown preset.
        ds4lab.report.results.OutputError: an ``out`` that cannot be written.
    """
    from ..token.config import get_preset
    from ..jobs.common import default_preset, modeled_banner, open_backend, out_folder

    st_list = check_config(config)
    be = backend if backend is not None else open_backend("auto", timing_only=True)
    preset = config.preset or default_preset("trace", be)
    cfg = get_preset(preset)
    src = kernel_source(be)
    # a hazard's trace has its own default folder: a plain trace (or another hazard's) is not replaced by it
    out, ran = out_folder(config.out, "trace", (preset, be.name, config.hazard),
                          {"preset": preset, "backend": be.name, "hazard": config.hazard,
                           "stages": [s.name for s in st_list], "capture_mode": config.capture_mode})
    meta = provenance.base_meta(be)
    modeled = bool(be.models_time)
    meta.update(job="trace", preset=cfg.summary(), stages=[s.name for s in st_list], tokens=config.tokens,
                warmup=config.warmup, capture_mode=config.capture_mode, modeled=modeled, hazard=config.hazard,
                kernel_source="modeled schedule (sim cost model)" if modeled else "CUPTI activity records",
                api_source=("the sim backend's call log (modeled host clock)" if modeled
                            else "CUPTI runtime, driver, synchronization, CUDA event and stream records"),
                nvtx_source="ds4lab's recorded push/pop times (" + ("modeled host clock" if modeled
                                                                      else "CUPTI timestamp clock") + ")")
    say = (console.print if console is not None else (lambda *a, **k: None))
    banner = modeled_banner(be)
    if banner:
        meta["calibration"] = backend_calibration(be)  # name, path, sha256, shipped
        say(banner)
    with S.graphs_enabled(), results.job_folder(out, meta, TRACE_OUTPUTS, say=say, ran=ran) as folder:
        kern, nvtx, api = _trace(be, cfg, st_list, config, src, say, meta)
        files = [out / p.name for p in _write(folder, kern, nvtx, meta, api)]
    return TraceResult(out, kern, nvtx, meta, files, api)


def _trace(be, cfg, st_list, config, src, say, meta):
    from ..capture.annotate import NullAnnotator
    from ..experiments.hazards import HAZARDS
    from ..token.model import DecodeModel, TokenOptions

    hz = HAZARDS[config.hazard] if config.hazard else None
    # the ladder's token: with the vocabulary projection; a hazard's path from the model's build on
    base = TokenOptions(vocab=True, **(hz.options if hz else {}))
    model = DecodeModel(cfg, be, base)
    rec = RecordingAnnotator(src.clock_ns, inner=None if isinstance(model.L.annotator, NullAnnotator)
                             else model.L.annotator)
    with model.L.annotating(rec):
        return _trace_stages(be, cfg, st_list, config, src, say, meta, model, rec, base)


def _trace_stages(be, cfg, st_list, config, src, say, meta, model, rec, base):
    from ..experiments.run import StageRun
    from ..experiments.stages import START_POS, token_id_at

    # the launch sites of one eager token, in launch order (the kernels are labelled by position)
    with model.L.recording() as launched:
        model.token(START_POS, token_id_at(START_POS, cfg.vocab))
    sites = [(r.cluster, r.layer, r.site, r.kernel) for r in launched]
    be.synchronize()
    kern_rows, nvtx_rows, api_rows, matched, runs = [], [], [], {}, []
    pos = START_POS + 1
    try:
        src.start()
    except Exception as e:  # noqa: BLE001 - CUPTI's own error, named
        raise TraceError(f"the kernel record source did not start ({type(e).__name__}: {e}); nothing traced") from e
    from ..experiments.hazards import HAZARDS
    from ..token.model import TokenOptions

    traced = _hazard_step(config.hazard, model) if config.hazard else None
    try:
        for st in st_list:
            run = StageRun(model, st, base, mode=config.capture_mode)
            if config.hazard:  # the hazard's path over the stage's own options
                run.opts = TokenOptions(**{**run.opts.summary(), **HAZARDS[config.hazard].options})
            run.activate()
            if hasattr(src, "note_stream"):
                src.note_stream(run.stream)
            for _ in range(config.warmup):
                run.token(pos)
                pos += 1
            be.synchronize()
            src.take()  # drop the warm-up's records
            src.take_api()
            rec.ranges.clear()
            rec.recording = True
            first = pos
            with model.L.recording() as launched:  # the traced tokens' own launches: their scalar arguments
                for _ in range(config.tokens):
                    if traced is not None:
                        traced(run, pos)
                    else:
                        run.token(pos)
                    pos += 1
            be.synchronize()
            rec.recording = False
            recs = sorted(src.take(), key=lambda r: r["start_ns"])
            calls, types = src.take_api()
            _attach_args(recs, launched, types)
            api_rows += [{"stage": st.name, **c} for c in calls]
            ks = [r for r in recs if r["kind"] == "kernel"]
            if not ks:
                raise NoKernelRecords(f"stage {st.name}: the traced tokens gave no kernel record "
                                 f"({meta['kernel_source']})")
            ok = len(ks) == config.tokens * len(sites) and all(
                k["name"] == sites[i % len(sites)][3] for i, k in enumerate(ks))
            matched[st.name] = ok
            ki = 0
            for r in recs:
                row = {"stage": st.name, **r}
                if r["kind"] == "kernel":
                    row["token"] = first + ki // len(sites) if ok else None
                    c, layer, site, _ = sites[ki % len(sites)] if ok else (None, None, None, None)
                    row.update(cluster=c, layer=layer, site=site)
                    ki += 1
                kern_rows.append(row)
            for message, cluster, payload, t0, t1, depth in rec.ranges:
                nvtx_rows.append({"stage": st.name, "name": message, "cluster": cluster, "payload": payload,
                                  "start_ns": t0, "end_ns": t1, "depth": depth})
            say(f"stage {st.name}: {len(ks)} kernels in {config.tokens} token(s), {len(rec.ranges)} NVTX ranges"
                + ("" if ok else " (kernels not matched to launch sites: count or names differ)"))
            runs.append(run)  # its graphs stay alive until every stage ran
    finally:
        rec.recording = False
        src.stop()
    meta["sites_matched"] = matched
    meta["kernels_per_token"] = len(sites)
    kern = pd.DataFrame(kern_rows)
    nvtx = pd.DataFrame(nvtx_rows, columns=["stage", "name", "cluster", "payload", "start_ns", "end_ns", "depth"])
    api = pd.DataFrame(api_rows, columns=API_COLUMNS)
    # each stage from 0: its earliest host or device timestamp
    t0 = {}
    for st in st_list:
        cands = list(kern.loc[kern.stage == st.name, "start_ns"]) + list(nvtx.loc[nvtx.stage == st.name, "start_ns"])
        if not api.empty:
            cands += list(api.loc[api.stage == st.name, "start_ns"])
        t0[st.name] = min(cands)
    for df in (kern, nvtx, api):
        if not df.empty:
            base0 = df["stage"].map(t0)
            df["start_us"] = (df["start_ns"] - base0) / 1e3
            df["end_us"] = (df["end_ns"] - base0) / 1e3
            df["dur_us"] = df["end_us"] - df["start_us"]
    meta["clock_offset_ns"] = t0
    meta["api_calls"] = {st.name: int((api.stage == st.name).sum()) for st in st_list} if not api.empty else {}
    return kern, nvtx, api


#: Columns of ``trace_api.csv`` (one row per CUDA API call or synchronization of the traced tokens).
API_COLUMNS = ["stage", "kind", "name", "domain", "tid", "start_ns", "end_ns", "stream", "stream_type", "correlation",
               "event", "sync_kind"]


def _attach_args(recs: list, launched: list, types: dict) -> None:
    """Give each eagerly launched kernel record (``graph_id`` 0) the scalar arguments of its launch
    (:func:`ds4lab.report.trace_api.scalar_args`), matched in order and by kernel name to the launch
    layer's records of the same tokens; a replayed kernel ran with the arguments of its capture and
    gets none. Also each record's ``stream_type`` from ``types`` (stream id → type)."""
    from .trace_api import scalar_args

    j = 0
    for r in recs:
        sid = r.get("stream_id", r.get("stream"))
        if "stream_type" not in r or not r["stream_type"]:
            r["stream_type"] = types.get(sid, "") if isinstance(sid, int) else ""
        if r["kind"] != "kernel" or r["graph_id"]:
            continue
        while j < len(launched) and launched[j].kernel != r["name"]:
            j += 1
        if j < len(launched):
            r["args"] = scalar_args(launched[j].args)
            j += 1


def _opt(v):
    """A table cell as a JSON value: None for a missing one (NaN), ints as ints."""
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _hazard_step(name: str, model):
    """The traced step of a routed-MoE hazard (see :class:`TraceConfig`), or None for a token hazard:
    ``step(run, pos)`` runs the router and routed MoE of the first top-k layer for 2 tokens on the
    stage's stream, inside a ``token`` NVTX range (its input written from the host first, as
    ``ladder --hazard`` does)."""
    import contextlib

    import numpy as np

    from ..experiments.hazards import HAZARDS

    if HAZARDS[name].steps != "moe":
        return None
    be, cfg, L = model.be, model.cfg, model.L
    layer = min(cfg.n_hash_layers, model.n_layers - 1)
    x = be.zeros((2, cfg.embed), np.float32)
    rng = np.random.default_rng(11)

    def step(run, pos: int) -> None:
        scope = S.stream_override(run.stream) if run.stage.nonblocking else contextlib.nullcontext()
        with scope, L.range("token", "token", pos):
            be.copy_h2d(S.current_stream(), x, rng.standard_normal((2, cfg.embed)).astype(np.float32))

            def cluster():
                model.router(layer, x, 2)
                model.routed_moe(layer, x, 2)

            model.run_cluster("moe", layer, 2, None, cluster, inputs=(x,))

    return step


def chrome_trace(kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, api: pd.DataFrame | None = None) -> dict:
    """The Trace Event JSON object (see the module docstring) of a trace's tables: one process per
    stage (pid 1, 2, ... in the order of ``meta["stages"]``), a host thread with the NVTX ranges, a
    host thread with the CUDA API calls (categories ``cuda_runtime``/``cuda_driver``, as the PyTorch
    profiler names them), and one GPU thread per stream (kernels, memsets, copies, and the
    synchronizations as ``cuda_sync``); every kernel event's ``args`` carry site, cluster, layer,
    graph and node ids, stream (name, id and type), correlation, its scalar arguments (``args``) and
    ``modeled``. ``otherData`` comes first in the object, so that a streaming reader sees it before
    the events (:mod:`ds4lab.audit.sources.chrome`)."""
    from ..experiments.stages import STAGES

    modeled = bool(meta.get("modeled"))
    tag = "MODELED" if modeled else provenance.label(meta)
    api = api if api is not None else pd.DataFrame(columns=API_COLUMNS)
    ev: list[dict] = []
    for pid, name in enumerate(meta["stages"], 1):
        st = STAGES[name]
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": f"stage {name}: {st.short} ({tag})"}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": HOST_TID,
                   "args": {"name": "host: NVTX ranges (ds4lab)" + (" MODELED" if modeled else "")}})
        k = kern[kern.stage == name] if not kern.empty else kern
        a = api[api.stage == name] if not api.empty else api
        calls, syncs = (a[a.kind == "api"], a[a.kind == "sync"]) if not a.empty else (a, a)
        streams = list(dict.fromkeys(k["stream"])) if not k.empty else []
        tids = {s: GPU_TID0 + i for i, s in enumerate(streams)}
        for s, tid in tids.items():
            ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"GPU stream {s}" + (" (MODELED)" if modeled else "")}})
        if len(calls):
            ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": API_TID,
                       "args": {"name": "host: CUDA API" + (" (sim call log, MODELED)" if modeled else " (CUPTI)")}})
        n = nvtx[nvtx.stage == name] if not nvtx.empty else nvtx
        for r in n.itertuples():
            ev.append({"name": r.name, "cat": "nvtx", "ph": "X", "ts": float(r.start_us), "dur": float(r.dur_us),
                       "pid": pid, "tid": HOST_TID,
                       "args": {"cluster": r.cluster, "payload": None if pd.isna(r.payload) else int(r.payload),
                                "depth": int(r.depth), "modeled": modeled}})
        for r in calls.itertuples():
            ev.append({"name": r.name, "cat": f"cuda_{r.domain or 'runtime'}", "ph": "X", "ts": float(r.start_us),
                       "dur": float(r.dur_us), "pid": pid, "tid": API_TID,
                       "args": {"correlation": _opt(r.correlation), "stream": _opt(r.stream), "event": _opt(r.event),
                                "stream_type": _opt(r.stream_type) or "", "modeled": modeled}})
        for r in syncs.itertuples():
            ev.append({"name": r.sync_kind, "cat": "cuda_sync", "ph": "X", "ts": float(r.start_us),
                       "dur": float(r.dur_us), "pid": pid, "tid": API_TID + 1,
                       "args": {"sync_kind": r.sync_kind, "correlation": _opt(r.correlation), "stream": _opt(r.stream),
                                "event": _opt(r.event), "modeled": modeled}})
        for r in k.itertuples():
            args = {"stream": str(r.stream), "graph_id": int(r.graph_id), "graph_node_id": int(r.graph_node_id),
                    "modeled": modeled}
            for c in ("site", "cluster", "layer", "token", "correlation", "stream_id", "stream_type", "args", "device",
                      "copy_kind", "host_memory", "bytes"):
                v = getattr(r, c, None)
                if v is not None and not (isinstance(v, float) and pd.isna(v)):
                    args[c] = int(v) if c in ("layer", "token", "correlation", "stream_id", "device", "bytes") else v
            ev.append({"name": r.name, "cat": r.kind, "ph": "X", "ts": float(r.start_us), "dur": float(r.dur_us),
                       "pid": pid, "tid": tids[r.stream], "args": args})
    other = {k: meta.get(k) for k in ("ds4lab", "git_revision", "timestamp", "backend", "device", "driver", "cupy",
                                      "modeled", "calibration", "kernel_source", "nvtx_source", "api_source", "stages",
                                      "tokens", "clock_offset_ns", "sites_matched", "hazard") if k in meta}
    other["preset"] = meta.get("preset", {}).get("name") if isinstance(meta.get("preset"), dict) else meta.get("preset")
    other["provenance"] = tag
    return {"otherData": other, "displayTimeUnit": "ns", "traceEvents": ev}


def labelled(df: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """A trace table as its CSV holds it: ``df`` with ``backend``, ``preset`` and ``modeled`` appended
    (:func:`ds4lab.report.provenance.with_source_columns`, as ``ladder.csv``), so that a copied
    ``trace_*.csv`` still says whether its times are the sim's (MODELED) or measured."""
    return provenance.with_source_columns(df, meta.get("backend"), provenance.preset_name(meta),
                                          bool(meta.get("modeled")))


def _write(out: Path, kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict,
           api: pd.DataFrame | None = None) -> list[Path]:
    from . import plots

    files = []
    p = out / "trace.json"
    results.write_text_atomic(p, json.dumps(chrome_trace(kern, nvtx, meta, api), default=str))
    files.append(p)
    for name, df in (("trace_kernels.csv", kern), ("trace_nvtx.csv", nvtx),
                     ("trace_api.csv", api if api is not None else pd.DataFrame(columns=API_COLUMNS))):
        results.write_csv(labelled(df, meta), out / name)
        files.append(out / name)
    import matplotlib.pyplot as plt

    fig = plots.trace_figure(kern, nvtx, meta)
    try:
        files += plots.save(fig, out / "trace")
    finally:
        plt.close(fig)
    return files


def load_trace(path: Path) -> dict:
    """A ``trace.json`` (or a folder holding one) read back and checked as Trace Event JSON: an
    object with a ``traceEvents`` list whose events each have ``name``, ``ph``, ``pid`` and, for a
    complete event (``X``), numeric ``ts`` and ``dur`` ≥ 0. Raises TraceError naming the file and
    the first bad event."""
    p = Path(path)
    if p.is_dir():
        p = p / "trace.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TraceError(f"{p}: not readable as JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p}: no traceEvents list")
    for i, e in enumerate(data["traceEvents"]):
        if not isinstance(e, dict) or not {"name", "ph", "pid"} <= set(e):
            raise TraceError(f"{p}: traceEvents[{i}] lacks name, ph or pid: {str(e)[:120]}")
        if e["ph"] == "X" and not (isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
                                   and e["dur"] >= 0):
            raise TraceError(f"{p}: traceEvents[{i}] is a complete event without numeric ts and dur ≥ 0")
    return data

