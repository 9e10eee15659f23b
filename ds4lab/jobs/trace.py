"""``ds4lab trace``: one decode token's timeline per capture stage, as a Chrome/Perfetto trace, from the live sources
(:mod:`ds4lab.trace.live`: CUPTI on a GPU, the sim's modeled schedule): device work, ds4lab's NVTX ranges and the CUDA
API level, linked by correlation id, each kernel given its launch site where an eager token matches (``sites_matched``).

Writes ``trace.json``, ``trace_kernels.csv``, ``trace_nvtx.csv``, ``trace_api.csv``, ``meta.json`` and the figure
``trace``. Next: ``docs/commands.md`` (``ds4lab trace``), ``docs/trace-readers.md``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..capture import stream as S
from ..errors import BadInput, CheckFailed
from ..report import provenance
from ..sim.calibration import backend_calibration
from ..trace.chrome import API_COLUMNS, chrome_trace
from .common import check_out_option, default_preset, modeled_banner, open_backend, out_folder
from .result import JobResult, result_folder

TRACE_OUTPUTS = ("trace.json", "trace_kernels.csv", "trace_nvtx.csv", "trace_api.csv", "trace.png", "trace.svg",
                 "trace.pdf")


class TraceError(BadInput):
    """A trace request that cannot run (unknown stage, no tokens, no kernel source): nothing traced (exit 2)."""


class NoKernelRecords(CheckFailed):
    """The traced tokens of a stage gave no kernel record (exit 1; ``meta.json`` says so)."""


@dataclass
class TraceConfig:
    """What ``ds4lab trace`` runs.

    Attributes:
        preset: model dimensions; None: the job's default (:data:`ds4lab.jobs.common.DEFAULT_PRESETS`).
        stages: comma-separated stages, one trace process each; None: ``0,3``, or ``0s`` with a ``hazard``.
        hazard: a token hazard of ``ladder --hazard`` whose ds4-today path the traced tokens take, so ``ds4lab audit``
            reports it; a routed-MoE hazard traces its own step (router and routed MoE of the first top-k layer, 2
            tokens, in a ``token`` range). None: no hazard.
        tokens: tokens traced per stage (≥ 1).
        warmup: untraced tokens per stage first (≥ 1: the captured stages capture there).
        out: result folder; None: ``results/trace-<preset>-<backend>[-<hazard>]``.
        capture_mode: stream-capture mode of the captured stages."""

    preset: str | None = None
    stages: str | None = None
    tokens: int = 2
    warmup: int = 3
    out: Path | None = None
    capture_mode: str = "thread_local"
    hazard: str | None = None


# ----------------------------------------------------------------------------- the trace's rows
def kernel_source(be):
    """The live trace of ``be`` with its API level; :class:`TraceError` with the reason where there is none."""
    from ..trace.live import trace_source

    src = trace_source(be, calls=True)
    if not src.available:
        raise TraceError(f"nothing records kernels here: {src.reason}")
    return src


def device_rows(src, recs) -> list[dict]:
    """The trace's rows of device records ``recs``, with stream id, kind and bytes where counted."""
    out = []
    for r in recs:
        if r.kind not in ("kernel", "memset", "memcpy"):
            continue
        sid, skind = src.stream_of(r.stream)
        row = {"name": (r.label or "memset") if r.kind == "memset" else r.name, "kind": r.kind,
               "start_ns": r.start_ns, "end_ns": r.end_ns, "stream": r.stream, "graph_id": int(r.graph_id),
               "graph_node_id": int(r.graph_node_id), "correlation": int(r.correlation), "stream_id": sid,
               "stream_type": skind, "device": int(r.device)}
        if r.kind in ("memset", "memcpy") and r.bytes >= 0:
            row["bytes"] = int(r.bytes)
            if r.kind == "memcpy":
                row.update(copy_kind=r.copy_kind, host_memory=r.host_memory)
        out.append(row)
    return out


def api_call_rows(src, recs) -> tuple[list[dict], dict]:
    """``(calls, stream_types)``: the API calls and synchronizations as ``trace_api.csv`` rows (a ``cudaEventRecord``
    on its record's stream) and ``{stream id: type}``."""
    from ..trace import records as R

    events, made = R.api_context(recs)
    types = {**made, **src.stream_types()}
    calls = []
    for r in recs:
        if isinstance(r, R.ApiCall):
            stream, ev = events.get(r.correlation, (r.stream, -1))
            calls.append({"kind": "api", "name": r.name, "domain": r.domain, "start_ns": r.start_ns,
                          "end_ns": r.end_ns, "tid": r.tid, "correlation": r.correlation, "stream": stream,
                          "event": ev, "sync_kind": "", "stream_type": types.get(stream, "")})
        elif isinstance(r, R.Sync):
            calls.append({"kind": "sync", "name": "sync", "domain": "", "start_ns": r.start_ns, "end_ns": r.end_ns,
                          "tid": -1, "correlation": r.correlation, "stream": r.stream, "event": r.event,
                          "sync_kind": r.sync_kind, "stream_type": types.get(r.stream, "")})
    return calls, types


# ----------------------------------------------------------------------------- the job
def check_config(config: TraceConfig) -> list:
    """The stages of ``config``, checked before any work.

    Raises:
        TraceError: unknown or repeated stage, tokens or warm-up below 1, an empty ``out``, a hazard that is not a
            token hazard of ``ladder --hazard``."""
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
    check_out_option(config.out)
    return st_list


def stages_of(config: TraceConfig) -> str:
    """The stages ``config`` traces (see :class:`TraceConfig`)."""
    if config.stages is not None:
        return config.stages
    return "0s" if config.hazard else "0,3"


def run(config: TraceConfig, backend=None, console=None) -> JobResult:
    """Trace ``config.tokens`` tokens of each stage on ``backend`` (None: ``auto``) and write the files to
    ``config.out``. Returns the :class:`~ds4lab.jobs.result.JobResult`: tables ``trace_kernels``, ``trace_nvtx``,
    ``trace_api``, figure ``trace``.

    Raises:
        TraceError: bad input or no kernel source on this backend (exit 2).
        NoKernelRecords: a stage's traced tokens gave no kernel record (exit 1; ``meta.json`` says ``failed``).
        ds4lab.token.config.ConfigError: unknown preset.
        ds4lab.report.results.OutputError: an ``out`` that cannot be written."""
    from ..token.config import get_preset

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
    with S.graphs_enabled(), result_folder("trace", out, meta, TRACE_OUTPUTS, say=say, ran=ran) as o:
        kern, nvtx, api = _trace(be, cfg, st_list, config, src, say, meta)
        _write(o, kern, nvtx, meta, api)
    return o.done()


def _trace(be, cfg, st_list, config, src, say, meta):
    from ..capture.annotate import NullAnnotator
    from ..experiments.hazards import HAZARDS
    from ..token.model import DecodeModel, TokenOptions
    from ..trace.live import RecordingAnnotator

    hz = HAZARDS[config.hazard] if config.hazard else None
    # the ladder's token: with the vocabulary projection; a hazard's path from the model's build on
    base = TokenOptions(vocab=True, **(hz.options if hz else {}))
    model = DecodeModel(cfg, be, base)
    rec = RecordingAnnotator(src.clock_ns, inner=None if isinstance(model.L.annotator, NullAnnotator)
                             else model.L.annotator)
    with model.L.annotating(rec):
        return _trace_stages(be, cfg, st_list, config, src, say, meta, model, rec, base)


def _trace_stages(be, cfg, st_list, config, src, say, meta, model, rec, base):
    from ..experiments.stage_run import StageRun
    from ..experiments.stages import START_POS
    from ..token.config import token_id_at

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
            recs = sorted(device_rows(src, src.take()), key=lambda r: r["start_ns"])
            calls, types = api_call_rows(src, src.take_api())
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
            for r in rec.ranges:
                nvtx_rows.append({"stage": st.name, "name": r.name, "cluster": r.cluster, "payload": r.payload,
                                  "start_ns": r.start_ns, "end_ns": r.end_ns, "depth": r.depth})
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


def _attach_args(recs: list, launched: list, types: dict) -> None:
    """Give each eager kernel record the scalar arguments of its launch (matched in order by name; a replayed kernel
    gets none), and each record its ``stream_type``."""
    from ..trace.live import scalar_args

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


def _hazard_step(name: str, model):
    """The traced step of a routed-MoE hazard (``step(run, pos)``), or None for a token hazard."""
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


def labelled(df: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """``df`` with ``backend``, ``preset`` and ``modeled`` appended, as its CSV holds it."""
    return provenance.with_source_columns(df, meta.get("backend"), provenance.preset_name(meta),
                                          bool(meta.get("modeled")))


def trace_json(kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, api: pd.DataFrame | None = None) -> dict:
    """The trace's Chrome/Perfetto JSON: one process per stage, with the trace's provenance."""
    from ..experiments.stages import STAGES

    tag = "MODELED" if meta.get("modeled") else provenance.label(meta)
    names = {s: f"stage {s}: {STAGES[s].short} ({tag})" for s in meta["stages"]}
    return chrome_trace(kern, nvtx, meta, api, processes=names, tag=tag)


def _write(o, kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, api: pd.DataFrame | None = None) -> None:
    from ..report import plots

    o.text("trace.json", json.dumps(trace_json(kern, nvtx, meta, api), default=str))
    for name, df in (("trace_kernels", kern), ("trace_nvtx", nvtx),
                     ("trace_api", api if api is not None else pd.DataFrame(columns=API_COLUMNS))):
        o.table(name, labelled(df, meta))
    o.figure("trace", plots.trace_figure(kern, nvtx, meta))


__all__ = ["NoKernelRecords", "TRACE_OUTPUTS", "TraceConfig", "TraceError", "api_call_rows", "check_config",
           "device_rows", "kernel_source", "run", "trace_json"]
