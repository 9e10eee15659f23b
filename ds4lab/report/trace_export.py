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
  range and the graph launch, with the kernels of the graph under it on the GPU track.

Each kernel of a traced token is given its launch site (cluster, layer, op) by position: the
token's kernels, in start order, are matched one to one with the launch sites of an eager token of
the same model (``Launcher.trace``); where the counts or names differ, no site is given and the
result says so (``sites_matched``).

Written to ``out``: ``trace.json`` (the Trace Event format: ``{"traceEvents": [...],
"displayTimeUnit": "ns", "otherData": {...}}``, complete events ``"ph": "X"`` with ``ts`` and ``dur``
in µs, one process per stage with ``process_name``/``thread_name`` metadata events ``"ph": "M"``;
as ``torch.profiler`` exports; opens in ui.perfetto.dev and chrome://tracing; each stage's process
starts at 0 µs, its clock offset in ``otherData.clock_offset_ns``), ``trace_kernels.csv`` and
``trace_nvtx.csv`` (the same events as tables; named apart from ``compare``'s kernel tables),
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

TRACE_OUTPUTS = ("trace.json", "trace_kernels.csv", "trace_nvtx.csv", "trace.png", "trace.svg", "trace.pdf")
HOST_TID = 1
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
            (``ds4lab.jobs.common.DEFAULT_PRESETS``: ds4-flash on a GPU, tiny on the sim).
        stages: comma-separated stage names (``ds4lab.experiments.ladder.STAGES``), one trace process each.
        tokens: tokens traced per stage (≥ 1), after ``warmup`` tokens (≥ 1: the captured stages
            capture their graphs there).
        warmup: untraced tokens per stage before the traced ones.
        out: result folder; None: ``results/trace-<preset>-<backend>``.
        capture_mode: stream-capture mode of the captured stages.
    """

    preset: str | None = None
    stages: str = "0,3"
    tokens: int = 2
    warmup: int = 3
    out: Path | None = None
    capture_mode: str = "thread_local"


@dataclass
class TraceResult:
    """What one trace wrote: the output folder, the kernel and NVTX tables, provenance."""

    out: Path
    kernels: pd.DataFrame
    nvtx: pd.DataFrame
    meta: dict
    files: list = field(default_factory=list)


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
    """CUPTI activity records of kernels, memsets and copies (``cupti-python``), with stream and
    graph ids; timestamps from CUPTI's clock (``clock_ns`` is ``cupti.get_timestamp``).

    CUPTI takes one pair of buffer callbacks per process: this source registers its own while it
    traces and, when it stops, gives them back to ds4lab's MoE CUPTI session if one registered them
    (``ds4lab.moeprof.traces.CuptiSession``), so a later ``ds4lab moe --mode cupti`` in the same
    process still sees its records. Raises ImportError when ``cupti-python`` is missing, and CUPTI's own error when it
    does not start.
    """

    modeled = False

    def __init__(self) -> None:
        from cupti import cupti  # optional dependency (the GPU machine carries it as a wheel)

        self.c = cupti
        K = cupti.ActivityKind
        self.kinds = [K.CONCURRENT_KERNEL, K.MEMSET, K.MEMCPY]
        self.records: list[dict] = []
        self.clock_ns = cupti.get_timestamp

    def _requested(self):
        return 8 << 20, 0

    def _completed(self, activities) -> None:
        K = self.c.ActivityKind
        for a in activities:
            if a.kind in (K.CONCURRENT_KERNEL, K.KERNEL):
                name = a.name.decode() if isinstance(a.name, bytes) else str(a.name)
                kind = "kernel"
            elif a.kind == K.MEMSET:
                name, kind = "memset", "memset"
            elif a.kind == K.MEMCPY:
                name, kind = "memcpy", "memcpy"
            else:
                continue
            self.records.append({"name": name, "kind": kind, "start_ns": int(a.start), "end_ns": int(a.end),
                                 "stream": int(getattr(a, "stream_id", -1)),
                                 "graph_id": int(getattr(a, "graph_id", 0)),
                                 "graph_node_id": int(getattr(a, "graph_node_id", 0))})

    def start(self) -> None:
        self.c.activity_register_callbacks(self._requested, self._completed)
        for k in self.kinds:
            self.c.activity_enable(k)
        self.records = []

    def take(self) -> list[dict]:
        self.c.activity_flush_all(1)
        out, self.records = self.records, []
        return out

    def stop(self) -> None:
        self.c.activity_flush_all(1)
        for k in self.kinds:
            self.c.activity_disable(k)
        from ..moeprof.traces import CuptiSession

        s = CuptiSession._instance  # the MoE profiler's session, if one registered its callbacks
        if s is not None and s.registered:
            self.c.activity_register_callbacks(s._requested, s._completed)


class SimKernelSource:
    """A modeled device timeline (the backend contract's ``trace_records``: the sim's cost-model
    schedule) as kernel records, MODELED; ``clock_ns`` is the backend's host clock (the sim's
    modeled one, ``host_clock_us``)."""

    modeled = True

    def __init__(self, be) -> None:
        self.be = be
        self._next = 0
        self.clock_ns = lambda: be.host_clock_us() * 1e3

    def start(self) -> None:
        _, self._next = self.be.trace_records(self._next)

    def take(self) -> list[dict]:
        new, self._next = self.be.trace_records(self._next)
        out, node, last_graph = [], 0, None
        for stream, name, start, end, kind, graph in new:
            if graph is None:
                last_graph = None
            elif graph != last_graph:
                node, last_graph = 0, graph
            out.append({"name": name, "kind": kind, "start_ns": start * 1e3, "end_ns": end * 1e3,
                        "stream": str(stream), "graph_id": 0 if graph is None else int(graph),
                        "graph_node_id": 0 if graph is None else node})
            if graph is not None:
                node += 1
        return out

    def stop(self) -> None:
        pass


def kernel_source(be):
    """:class:`SimKernelSource` on the sim; :class:`CuptiKernelSource` on a GPU. Raises TraceError
    (with the reason) where neither can run."""
    if be.models_time and be.trace_records(0) is not None:
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
        TraceError: unknown or repeated stage, tokens or warm-up below 1, an empty ``out``.
    """
    from ..experiments.ladder import LadderInputError, parse_stages

    try:
        st_list = parse_stages(config.stages)
    except LadderInputError as e:
        raise TraceError(str(e)) from None
    if config.tokens < 1 or config.warmup < 1:
        raise TraceError(f"tokens={config.tokens} and warmup={config.warmup} must be at least 1 (the warm-up "
                         "captures the graphs of the captured stages)")
    if config.out is not None and not str(config.out).strip():
        raise TraceError("--out '': an empty path would silently mean the current folder; name a folder")
    return st_list


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
    from ..jobs.common import default_preset, modeled_banner, open_backend

    st_list = check_config(config)
    be = backend if backend is not None else open_backend("auto", timing_only=True)
    preset = config.preset or default_preset("trace", be)
    cfg = get_preset(preset)
    src = kernel_source(be)
    out = Path(config.out or f"results/trace-{preset}-{be.name}")
    meta = provenance.base_meta(be)
    modeled = bool(be.models_time)
    meta.update(job="trace", preset=cfg.summary(), stages=[s.name for s in st_list], tokens=config.tokens,
                warmup=config.warmup, capture_mode=config.capture_mode, modeled=modeled,
                kernel_source="modeled schedule (sim cost model)" if modeled else "CUPTI activity records",
                nvtx_source="ds4lab's recorded push/pop times (" + ("modeled host clock" if modeled
                                                                      else "CUPTI timestamp clock") + ")")
    say = (console.print if console is not None else (lambda *a, **k: None))
    banner = modeled_banner(be)
    if banner:
        meta["calibration"] = backend_calibration(be)  # name, path, sha256, shipped
        say(banner)
    was = S.graphs_enabled()
    S.set_graphs_enabled(True)
    try:
        with results.job_folder(out, meta, TRACE_OUTPUTS, say=say) as folder:
            kern, nvtx = _trace(be, cfg, st_list, config, src, say, meta)
            files = [out / p.name for p in _write(folder, kern, nvtx, meta)]
    finally:
        S.set_graphs_enabled(was)
    return TraceResult(out, kern, nvtx, meta, files)


def _trace(be, cfg, st_list, config, src, say, meta):
    from ..capture.annotate import NullAnnotator
    from ..token.model import DecodeModel, TokenOptions

    base = TokenOptions(vocab=True)  # the ladder's token: with the vocabulary projection
    model = DecodeModel(cfg, be, base)
    rec = RecordingAnnotator(src.clock_ns, inner=None if isinstance(model.L.annotator, NullAnnotator)
                             else model.L.annotator)
    with model.L.annotating(rec):
        return _trace_stages(be, cfg, st_list, config, src, say, meta, model, rec, base)


def _trace_stages(be, cfg, st_list, config, src, say, meta, model, rec, base):
    from ..experiments.ladder import START_POS, StageRun, token_id_at

    # the launch sites of one eager token, in launch order (the kernels are labelled by position)
    with model.L.recording() as launched:
        model.token(START_POS, token_id_at(START_POS, cfg.vocab))
    sites = [(r.cluster, r.layer, r.site, r.kernel) for r in launched]
    be.synchronize()
    kern_rows, nvtx_rows, matched, runs = [], [], {}, []
    pos = START_POS + 1
    try:
        src.start()
    except Exception as e:  # noqa: BLE001 - CUPTI's own error, named
        raise TraceError(f"the kernel record source did not start ({type(e).__name__}: {e}); nothing traced") from e
    try:
        for st in st_list:
            run = StageRun(model, st, base, mode=config.capture_mode)
            run.activate()
            for _ in range(config.warmup):
                run.token(pos, token_id_at(pos, cfg.vocab))
                pos += 1
            be.synchronize()
            src.take()  # drop the warm-up's records
            rec.ranges.clear()
            rec.recording = True
            first = pos
            for _ in range(config.tokens):
                run.token(pos, token_id_at(pos, cfg.vocab))
                pos += 1
            be.synchronize()
            rec.recording = False
            recs = sorted(src.take(), key=lambda r: r["start_ns"])
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
    # each stage from 0: its earliest host or device timestamp
    t0 = {}
    for st in st_list:
        cands = list(kern.loc[kern.stage == st.name, "start_ns"]) + list(nvtx.loc[nvtx.stage == st.name, "start_ns"])
        t0[st.name] = min(cands)
    for df in (kern, nvtx):
        if not df.empty:
            base0 = df["stage"].map(t0)
            df["start_us"] = (df["start_ns"] - base0) / 1e3
            df["end_us"] = (df["end_ns"] - base0) / 1e3
            df["dur_us"] = df["end_us"] - df["start_us"]
    meta["clock_offset_ns"] = t0
    return kern, nvtx


def chrome_trace(kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict) -> dict:
    """The Trace Event JSON object (see the module docstring) of a trace's tables: one process per
    stage (pid 1, 2, ... in the order of ``meta["stages"]``), a host thread with the NVTX ranges and
    one GPU thread per stream; every kernel event's ``args`` carry site, cluster, layer, graph and
    node ids, stream, and ``modeled``."""
    from ..experiments.ladder import STAGES

    modeled = bool(meta.get("modeled"))
    tag = "MODELED" if modeled else provenance.label(meta)
    ev: list[dict] = []
    for pid, name in enumerate(meta["stages"], 1):
        st = STAGES[name]
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": f"stage {name}: {st.short} ({tag})"}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": HOST_TID,
                   "args": {"name": "host: NVTX ranges (ds4lab)" + (" MODELED" if modeled else "")}})
        k = kern[kern.stage == name] if not kern.empty else kern
        streams = list(dict.fromkeys(k["stream"])) if not k.empty else []
        tids = {s: GPU_TID0 + i for i, s in enumerate(streams)}
        for s, tid in tids.items():
            ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"GPU stream {s}" + (" (MODELED)" if modeled else "")}})
        n = nvtx[nvtx.stage == name] if not nvtx.empty else nvtx
        for r in n.itertuples():
            ev.append({"name": r.name, "cat": "nvtx", "ph": "X", "ts": float(r.start_us), "dur": float(r.dur_us),
                       "pid": pid, "tid": HOST_TID,
                       "args": {"cluster": r.cluster, "payload": None if pd.isna(r.payload) else int(r.payload),
                                "depth": int(r.depth), "modeled": modeled}})
        for r in k.itertuples():
            args = {"stream": str(r.stream), "graph_id": int(r.graph_id), "graph_node_id": int(r.graph_node_id),
                    "modeled": modeled}
            for c in ("site", "cluster", "layer", "token"):
                v = getattr(r, c, None)
                if v is not None and not (isinstance(v, float) and pd.isna(v)):
                    args[c] = int(v) if c in ("layer", "token") else v
            ev.append({"name": r.name, "cat": r.kind, "ph": "X", "ts": float(r.start_us), "dur": float(r.dur_us),
                       "pid": pid, "tid": tids[r.stream], "args": args})
    other = {k: meta.get(k) for k in ("ds4lab", "git_revision", "timestamp", "backend", "device", "driver", "cupy",
                                      "modeled", "calibration", "kernel_source", "nvtx_source", "stages", "tokens",
                                      "clock_offset_ns", "sites_matched") if k in meta}
    other["preset"] = meta.get("preset", {}).get("name") if isinstance(meta.get("preset"), dict) else meta.get("preset")
    other["provenance"] = tag
    return {"traceEvents": ev, "displayTimeUnit": "ns", "otherData": other}


def _write(out: Path, kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict) -> list[Path]:
    from . import plots

    files = []
    p = out / "trace.json"
    results.write_text_atomic(p, json.dumps(chrome_trace(kern, nvtx, meta), default=str))
    files.append(p)
    kern.to_csv(out / "trace_kernels.csv", index=False)
    nvtx.to_csv(out / "trace_nvtx.csv", index=False)
    files += [out / "trace_kernels.csv", out / "trace_nvtx.csv"]
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

