"""``ds4lab run``: decode N tokens eagerly; reference check, µs per token, launch census, memory, bytes floor, each
written as soon as it exists.

Checks before anything is written (int32 positions, a writable folder, no CPU-computed model over
:data:`CPU_WEIGHT_LIMIT` without ``--force``); a stopped run keeps what it wrote and raises :class:`RunInterrupted`
or :class:`RunFailed`. Next: ``docs/commands.md`` (``ds4lab run``)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..report import provenance, results
from ..token import weights as W
from ..token.config import MAX_POS, get_preset
from ..token.config import token_id_at
from ..capture.launch import Census
from ..token.model import DecodeModel, TokenOptions
from ..report.results import OutputError, ResultsCSV
from ..timing import Stats, copy_bandwidth, sources, time_steps, token_bytes
from .common import check_out_option, BadInput, CheckFailed, default_preset, modeled_banner, out_folder
from .result import JobResult, result_folder

#: Relative L2 error allowed between the GPU token and the NumPy reference: fp32 accumulation
#: plus the rare one-step flips of the Q8_K activation quantization (measured 1.05e-5 on
#: ds4-flash: docs/measurements/h200-2026-11-29/run-ds4-flash.meta.json).
CHECK_RTOL = 1e-4
#: Weight bytes above which a CPU backend that computes (``numpy``, ``sim --compute``) refuses to
#: run without ``--force``.
CPU_WEIGHT_LIMIT = 1 << 30
#: Rough seconds per token per GB of weights when NumPy computes the token (``small``: 0.65 s for
#: 0.10 GB on a 2-core x86 host); only used for the estimate in the refusal message.
CPU_S_PER_GB_TOKEN = 6.0
#: What ``run`` writes in its folder (and the temporary file of the atomic ``meta.json`` write).
RESULT_FILES = ("results.csv", "census.csv", "meta.json", "meta.json.tmp")
_DEFAULT_OPTS = TokenOptions()


class RunError(BadInput):
    """A problem found before any work (the command line exits 2): nothing was run."""


class RunRefused(RunError):
    """The run would take tens of minutes and many GB on the CPU; ``--force`` overrides."""


class ReferenceCheckFailed(CheckFailed):
    """The first token on the device does not match the NumPy reference."""


class RunFailed(CheckFailed):
    """The run stopped on an error after its folder existed (results so far on disk): ``out``, ``meta``."""

    def __init__(self, msg: str, out: Path, meta: dict) -> None:
        super().__init__(msg)
        self.out, self.meta = out, meta


class RunInterrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, SIGTERM, SIGHUP) after its folder existed (results so far on disk): ``out``,
    ``meta``, ``signum``/``signame`` (None for Ctrl-C; :func:`ds4lab.jobs.common.exit_code`)."""

    def __init__(self, msg: str, out: Path, meta: dict) -> None:
        super().__init__(msg)
        self.out, self.meta = out, meta
        self.signum: int | None = None
        self.signame: str | None = None


@dataclass
class RunConfig:
    """Arguments of ``ds4lab run`` (see ``ds4lab run --help``)."""

    backend: str = "auto"
    preset: str | None = None  # None: "small" (DEFAULT_PRESETS)
    tokens: int = 64
    warmup: int = 8
    out: Path | str | None = None  # None: results/run-<preset>-<backend>; "" is refused
    start_pos: int = 1000
    nvtx: bool = False
    check: bool = True
    per_layer_experts: bool = False
    seed: int = 1234
    #: The token's options; by default the final norm and vocabulary projection included.
    options: TokenOptions = field(default_factory=lambda: TokenOptions(vocab=True))
    #: sim only: model the timing without computing numbers. None: True, but False for tiny.
    timing_only: bool | None = None
    #: Run a CPU-computed model whose weights exceed CPU_WEIGHT_LIMIT anyway.
    force: bool = False


# ---------------------------------------------------------------------- checks before any work
def check_positions(rc: RunConfig) -> None:
    """Every decoded position must be an int32 kernel argument; :class:`RunError` says how far the run would go."""
    if rc.start_pos < 0:
        raise RunError(f"--start-pos {rc.start_pos}: positions start at 0")
    last = rc.start_pos + rc.warmup + rc.tokens - 1
    if last > MAX_POS:
        room = MAX_POS - rc.warmup - rc.tokens + 1
        fix = (f"use --start-pos {room} or less" if room >= 0 else
               f"--warmup + --tokens alone exceed {MAX_POS + 1} positions")
        raise RunError(f"--start-pos {rc.start_pos} + --warmup {rc.warmup} + --tokens {rc.tokens} would decode "
                       f"positions up to {last}, past {MAX_POS} (positions are int32 kernel arguments); {fix}")


def check_out(out: Path) -> None:
    """:func:`ds4lab.report.results.check_out` for ``run``'s files."""
    results.check_out(out, RESULT_FILES)


def launches_per_token(cfg, opts: TokenOptions) -> int:
    """Launches one decode token issues, counted on a timing-only sim model (no memory, ~0.1 s)."""
    from ..backends import make_backend

    m = DecodeModel(cfg, make_backend("sim", seed=cfg.seed, timing_only=True), opts)
    m.token(0, token_id_at(0, cfg.vocab))
    return int(m.L.census.total())


def check_cpu_cost(rc: RunConfig, be, cfg) -> dict | None:
    """Refuse a CPU backend that computes a model over :data:`CPU_WEIGHT_LIMIT` weight bytes unless ``rc.force``;
    returns the estimate when forced. Raises :class:`RunRefused` saying why and what to run instead."""
    if be.is_gpu or be.timing_only:
        return None
    wb = W.model_bytes(cfg, rc.options.vocab)
    if wb <= CPU_WEIGHT_LIMIT:
        return None
    launches = launches_per_token(cfg, rc.options)
    per_tok = wb / 1e9 * CPU_S_PER_GB_TOKEN
    n = rc.warmup + rc.tokens
    est = {"weights_bytes": wb, "launches_per_token": launches, "estimated_s_per_token": per_tok}
    if rc.force:
        return est
    what = "the numpy backend" if be.name == "numpy" else f"the {be.name} backend with --compute"
    alt = ("--backend sim (modeled timing in seconds, timing-only by default)" if be.name == "numpy" else
           "--timing-only (modeled timing in seconds, no numbers computed)")
    raise RunRefused(
        f"preset {cfg.name} on {what}: NumPy computes every launch on the CPU over {wb / 1e9:.1f} GB of weights "
        f"held in host memory (expect more than that in RSS), {launches} launches per token — roughly "
        f"{per_tok:.0f} s per token, about {per_tok * n / 60:.0f} min for {n} tokens ({rc.warmup} warm-up + "
        f"{rc.tokens}), and no timing figure at the end. Refused without --force; use {alt}, or --preset small.")


def reference_check(cfg, be, opts: TokenOptions, pos: int, log) -> dict:
    """First token on ``be`` against the NumPy executor: the check's figures (``passed``; a mismatch not raised)."""
    from ..backends import make_backend

    layers = cfg.n_layers if cfg.name in ("tiny", "small") else min(cfg.n_layers, cfg.n_hash_layers + 1)
    scope = "full model" if layers == cfg.n_layers else f"first {layers} of {cfg.n_layers} layers (partial model)"
    log(f"reference check: first token, {scope}, vs the NumPy executor on the CPU")
    tok = token_id_at(pos, cfg.vocab)
    vocab = opts.vocab and layers == cfg.n_layers
    o = TokenOptions(**{**opts.summary(), "vocab": vocab})
    res = {}
    for tag, backend in (("device", be), ("reference", make_backend("numpy", seed=cfg.seed))):
        t0 = time.perf_counter()
        m = DecodeModel(cfg, backend, o, n_layers=layers)
        m.token(pos, tok)
        backend.synchronize()
        res[tag] = (m.hidden(), m.output_logits(), m.selected_experts()[:1])
        res[tag + "_s"] = time.perf_counter() - t0
        del m
    (h, lg, ids), (hr, lgr, idsr) = res["device"], res["reference"]
    err = float(np.linalg.norm(h.astype(np.float64) - hr) / np.linalg.norm(hr))
    out = {"scope": scope, "layers": layers, "hidden_rel_err": err, "rtol": CHECK_RTOL,
           "routing_equal": bool(np.array_equal(ids, idsr)), "finite": bool(np.isfinite(h).all())}
    if vocab:
        out["logits_rel_err"] = float(np.linalg.norm(lg.astype(np.float64) - lgr) / np.linalg.norm(lgr))
    out["passed"] = bool(out["finite"] and err < CHECK_RTOL and out.get("logits_rel_err", 0.0) < CHECK_RTOL)
    out["reference_seconds"] = res["reference_s"]
    return out


class _Progress:
    """How far the run got: tokens completed, and the census as of the last completed token."""

    def __init__(self) -> None:
        self.warmup_done = 0
        self.tokens_done = 0
        self.census_counts: Counter = Counter()
        self.census_tokens = 0
        self.census_phase = "none"
        self.gpu_us: list[float] = []
        self.host_us: list[float] = []
        self.sources: tuple[str, str] | None = None

    def token_done(self, timed: bool, census: Census) -> None:
        if timed:
            self.tokens_done += 1
        else:
            self.warmup_done += 1
        self.census_counts = census.counts.copy()
        self.census_tokens = census.tokens
        self.census_phase = "timed" if timed else "warm-up"

    def census(self) -> Census:
        c = Census()
        c.counts = Counter(self.census_counts)
        c.tokens = self.census_tokens
        return c


def timing_only_for(rc: RunConfig) -> bool:
    """Whether the sim models time only: ``rc.timing_only``, by default every preset but ``tiny``."""
    return (rc.preset != "tiny") if rc.timing_only is None else bool(rc.timing_only)


def check_config(rc: RunConfig) -> None:
    """Checks that need no backend (token counts, int32 positions, a non-empty ``out``); raises :class:`RunError`."""
    if rc.tokens < 1:
        raise RunError(f"--tokens {rc.tokens}: need at least 1 token")
    if rc.warmup < 0:
        raise RunError(f"--warmup {rc.warmup}: must be 0 or more")
    check_positions(rc)
    check_out_option(rc.out)


def run(rc: RunConfig, be, console=None) -> JobResult:
    """Run the job on ``be`` (``cupy``, ``sim`` with ``timing_only_for(rc)``, or ``numpy``); returns the
    :class:`~ds4lab.jobs.result.JobResult` (tables ``results`` and ``census``; ``meta`` as ``meta.json`` holds it).

    Raises (before anything is written):
        RunError: too few tokens, positions past int32, ``--timing-only`` off the sim; OutputError and RunRefused are
            RunErrors.
        ConfigError: unknown preset or a bad override.
    Raises (after the folder exists; ``meta.json`` and ``census.csv`` record how far it got):
        RunInterrupted: Ctrl-C (a KeyboardInterrupt); ``status`` is ``"interrupted"``.
        RunFailed: any error, a failed reference check included; ``status`` is ``"failed: <reason>"``."""
    from ..progress import make_console

    con = console or make_console()
    check_config(rc)
    if rc.timing_only and not be.models_time:
        raise RunError(f"--timing-only applies to the sim backend only; the {be.name} backend always computes")
    preset = rc.preset or default_preset("run", be)
    cfg = get_preset(preset, per_layer_experts=rc.per_layer_experts, seed=rc.seed)
    forced = check_cpu_cost(rc, be, cfg)
    out, ran = out_folder(rc.out, "run", (preset, be.name),
                          {"preset": preset, "backend": be.name, "options": rc.options.summary(),
                           "start_pos": rc.start_pos, "per_layer_experts": rc.per_layer_experts})
    check_out(out)

    meta = provenance.base_meta(be)
    meta.update(job="run", preset=cfg.summary(), options=rc.options.summary(), tokens=rc.tokens,
                warmup=rc.warmup, start_pos=rc.start_pos, nvtx=rc.nvtx, tokens_completed=0,
                routed_experts=("one bank per layer" if cfg.per_layer_experts else
                                f"one routed-expert bank shared by all {cfg.n_layers} layers "
                                "(per-token traffic unchanged)"))
    if be.models_time:
        meta["figures"] = sources(be)[0]
    if forced:
        meta["forced_cpu_run"] = forced
    prog = _Progress()
    staging: list[Path] = []  # the folder job_folder hands the run (for what a stopped run records)
    try:
        with result_folder("run", out, meta, RESULT_FILES, say=con.print,
                           on_stop=lambda status: _record_stop(staging[0], meta, prog, be, preset), ran=ran) as o:
            staging.append(o.folder)
            _job(rc, be, cfg, preset, o.folder, meta, con, prog, o)
    except KeyboardInterrupt as e:
        where = Path(meta.get("kept_in", out))
        err = RunInterrupted(f"interrupted after {_how_far(rc, prog)}; results so far in {where}/ "
                             f"(meta.json status \"{meta.get('status', 'interrupted')}\", census.csv)", where, meta)
        err.signum, err.signame = getattr(e, "signum", None), getattr(e, "signame", None)
        raise err from e
    except Exception as e:
        if "status" not in meta:  # refused before the folder was this run's (a lock held, another job's folder)
            raise
        where = Path(meta.get("kept_in", out))
        reason = meta["status"].removeprefix("failed: ")
        raise RunFailed(f"run failed after {_how_far(rc, prog)}: {reason}; results so far in {where}/ "
                        "(meta.json status \"failed\", census.csv)", where, meta) from e
    return o.done()


def _how_far(rc: RunConfig, prog: _Progress) -> str:
    s = f"{prog.tokens_done} of {rc.tokens} timed tokens"
    if rc.warmup and prog.warmup_done < rc.warmup:
        s += f" ({prog.warmup_done} of {rc.warmup} warm-up tokens)"
    return s


def write_census(census: Census, path: Path, be, preset: str):
    """Write ``census.csv`` (:meth:`Census.frame` with ``backend``, ``preset``, ``modeled``); returns the table."""
    df = provenance.with_source_columns(census.frame(), be.name, preset, be.models_time)
    results.write_csv(df, path)
    return df


def _record_stop(out: Path, meta: dict, prog: _Progress, be, preset: str) -> None:
    """Best effort, never raising: how far the run got into ``meta``, ``census.csv`` so far."""
    meta["tokens_completed"] = prog.tokens_done
    meta["warmup_completed"] = prog.warmup_done
    meta["census_tokens"] = prog.census_tokens
    meta["census_covers"] = (f"{prog.census_tokens} completed {prog.census_phase} tokens"
                             if prog.census_tokens else "no completed token")
    try:
        census = prog.census()
        write_census(census, out / "census.csv", be, preset)
        if prog.census_tokens:
            meta["census_per_token"] = {r.kind: {"launches": float(r.launches), "sites": int(r.sites)}
                                        for r in census.by_kind().itertuples()}
    except Exception as e:  # noqa: BLE001 - keep the original error, say what else went wrong
        meta["census_error"] = f"{type(e).__name__}: {e}"
    if prog.gpu_us and prog.sources:
        meta["summary_partial"] = {"token_us": asdict(Stats.of(prog.gpu_us)),
                                   "host_enqueue_us": asdict(Stats.of(prog.host_us)),
                                   "sources": list(prog.sources)}


def _job(rc: RunConfig, be, cfg, preset: str, out: Path, meta: dict, con, prog: _Progress, o) -> dict:
    src_mem, src_ev, src_host, src_bytes = _announce(rc, be, preset, meta, con.print)
    results.write_meta(out / "meta.json", meta)
    with ResultsCSV(out / "results.csv") as res:
        _reference_check(rc, be, cfg, meta, out, res, con.print)  # 1. the reference check
        model = _build(rc, be, cfg, meta, res, src_mem)  # 2. the model
        prog.sources = (src_ev, src_host)  # 3. the tokens, each timed by the one timing loop
        _decode(rc, be, cfg, model, prog, res, con, src_ev, src_host)
        census = model.L.census  # 4. census, floor, summary
        o.streamed("census", write_census(census, out / "census.csv", be, preset))
        kinds = census.by_kind()
        meta["census_per_token"] = {r.kind: {"launches": float(r.launches), "sites": int(r.sites)}
                                    for r in kinds.itertuples()}
        tb = token_bytes(cfg, rc.options.vocab)
        meta["bytes_per_token"] = tb
        res.add("bytes_per_token", sum(tb.values()), "bytes", src_bytes)
        meta["summary"] = _summary(be, prog, sum(tb.values()), res, src_ev)
        meta["tokens_completed"] = prog.tokens_done

    import pandas as pd

    o.streamed("results", pd.read_csv(out / "results.csv"))  # written row by row (ResultsCSV): read once, whole
    _print_summary(con, cfg, meta, kinds, census)
    return meta


def _announce(rc: RunConfig, be, preset: str, meta: dict, log) -> tuple:
    """Say what runs; returns the sources ``(memory, token time, host time, bytes)``."""
    modeled = be.models_time
    if modeled:
        src = sources(be)[0]
        srcs = (src, src, src, src)
        log(modeled_banner(be) + (" [yellow]Timing-only: no numbers are computed.[/]" if be.timing_only else ""))
        log(f"[bold]ds4lab run[/] · preset {preset} · backend {be.name} · modeled")
    else:
        srcs = ("cupy-memory-pool", "cuda-events", "host-clock", "analytic")
        if be.measures_time:
            log(f"[bold]ds4lab run[/] · preset {preset} · backend {be.name} · {provenance.label(meta)}")
        else:
            log(f"[bold]ds4lab run[/] · preset {preset} · backend {be.name}")
    log(f"routed experts: {meta['routed_experts']}")
    if not be.measures_time and not modeled:
        log("[yellow]numpy backend: the CPU reference executor. It computes the same outputs and makes "
            "no timing claims.[/]")
    if rc.nvtx and not be.is_gpu:
        meta["nvtx_note"] = "NVTX ranges only matter to a profiler on a GPU"
        log(f"[yellow]note: --nvtx on the {be.name} backend: NVTX ranges only matter to a profiler "
            "(Nsight Systems) on a GPU.[/]")
    moved = [f"--counts-clear {rc.options.counts_clear}"] if rc.options.counts_clear != _DEFAULT_OPTS.counts_clear else []
    if rc.options.scratch != _DEFAULT_OPTS.scratch:
        moved.append(f"--scratch {rc.options.scratch}")
    if moved:
        note = (f"{' and '.join(moved)} only affect{'s' if len(moved) == 1 else ''} the batched routed-MoE path "
                "(tokens > 1 per step), which a decode token never takes: this run's tokens are unchanged")
        if rc.options.scratch != _DEFAULT_OPTS.scratch:
            note += (" (the scratch is still allocated at setup, for "
                     f"{'1 token by cudaMalloc' if rc.options.scratch == 'on-demand' else 'max_tokens'})")
        meta["option_note"] = note
        log(f"[yellow]note: {note}.[/]")
    return srcs


def _reference_check(rc: RunConfig, be, cfg, meta: dict, out: Path, res, log) -> None:
    """The reference check on a GPU (raises :class:`ReferenceCheckFailed`); elsewhere why it is skipped, in ``meta``."""
    if rc.check and be.is_gpu:
        chk = reference_check(cfg, be, rc.options, rc.start_pos, log)
        meta["reference_check"] = chk
        res.add("reference_check_hidden_rel_err", chk["hidden_rel_err"], "1", "numpy-reference")
        results.write_meta(out / "meta.json", meta)
        verdict = "[green]passed[/]" if chk["passed"] else "[red]FAILED[/]"
        log(f"reference check {verdict}: hidden-state relative error {chk['hidden_rel_err']:.2e} "
            f"(limit {CHECK_RTOL:.0e}), routing equal: {chk['routing_equal']} — {chk['scope']}")
        if not chk["passed"]:
            raise ReferenceCheckFailed(
                f"reference check failed: hidden-state relative error {chk['hidden_rel_err']:.3g} "
                f"(limit {CHECK_RTOL:.0e}), routing equal: {chk['routing_equal']}, finite: {chk['finite']} "
                f"— {chk['scope']}")
    elif rc.check and be.models_time:
        why = ("timing-only: no numbers are computed" if be.timing_only else
               "the sim computes with the reference ops (bit-identical to the numpy backend)")
        meta["reference_check"] = f"skipped: {why}"
        log(f"reference check skipped: {why}")
    elif rc.check:
        meta["reference_check"] = "skipped: the numpy backend is the reference"


def _build(rc: RunConfig, be, cfg, meta: dict, res, src_mem) -> DecodeModel:
    """The model, its setup time and its device memory (the sim's: its arena plus the weight bytes)."""
    if be.is_gpu:
        be.compile_all()
    t0 = time.perf_counter()
    model = DecodeModel(cfg, be, rc.options, nvtx=rc.nvtx)
    be.synchronize()
    meta["setup_seconds"] = time.perf_counter() - t0
    mem = be.memory_used()
    if mem is not None:
        if be.models_time:
            # The sim keeps weights outside its device arena (host arrays, or phantoms when
            # timing-only): the modeled footprint is the arena plus the weight bytes.
            mem += W.model_bytes(cfg, rc.options.vocab)
            meta["gpu_memory_note"] = "modeled: sim device arena + weight bytes"
        meta["gpu_memory_bytes"] = mem
        res.add("gpu_memory", mem, "bytes", src_mem)
    return model


def _decode(rc: RunConfig, be, cfg, model, prog: _Progress, res, con, src_ev, src_host) -> None:
    """The warm-up and timed tokens through :func:`ds4lab.timing.time_steps`; untimed on the NumPy executor."""
    from ..progress import JobProgress

    L = model.L
    with JobProgress(con, "decoding", rc.warmup + rc.tokens, eta=True) as bar:
        def step(i: int) -> None:
            pos = rc.start_pos + i
            model.token(pos, token_id_at(pos, cfg.vocab))

        def done() -> None:  # after each token, outside the timed region
            prog.token_done(prog.warmup_done >= rc.warmup, L.census)
            bar.advance()

        def sample(j: int, dev_us: float, h_us: float) -> None:
            prog.gpu_us.append(dev_us)
            prog.host_us.append(h_us)
            res.add("host_enqueue_us", round(h_us, 3), "us", src_host, j)
            res.add("token_us", round(dev_us, 3), "us", src_ev, j)

        if be.measures_time or be.models_time:
            time_steps(be, step, rc.tokens, stream=L.stream(), warmup=rc.warmup, on_sample=sample,
                       on_warm=L.census.reset, progress=done)
        else:
            for i in range(rc.warmup + rc.tokens):
                if i == rc.warmup:
                    L.census.reset()
                step(i)
                done()


def _summary(be, prog: _Progress, total_bytes: int, res, src_ev) -> dict:
    """µs per token, host enqueue µs, bytes floor, each also a ``results.csv`` row; ``{}`` where nothing was timed."""
    if not prog.gpu_us:
        return {}
    st, hs = Stats.of(prog.gpu_us), Stats.of(prog.host_us)
    if not be.models_time:
        bw = copy_bandwidth()
        floor_us = total_bytes / (bw.median * 1e9) * 1e6
        res.add("token_us_median", st.median, "us", "cuda-events")
        res.add("token_us_p25", st.p25, "us", "cuda-events")
        res.add("token_us_p75", st.p75, "us", "cuda-events")
        res.add("host_enqueue_us_median", hs.median, "us", "host-clock")
        res.add("copy_bandwidth_median", bw.median, "GB/s", "cuda-events")
        res.add("bytes_floor_us", floor_us, "us", "analytic / measured bandwidth")
        return {"token_us": asdict(st), "host_enqueue_us": asdict(hs), "copy_bandwidth_GBps": asdict(bw),
                "bytes_floor_us": floor_us, "floor_over_token": floor_us / st.median}
    bw, where = be.modeled_copy_GBps()
    floor_us = total_bytes / (bw * 1e9) * 1e6
    for metric, v, unit in (("token_us_median", st.median, "us"), ("token_us_p25", st.p25, "us"),
                            ("token_us_p75", st.p75, "us"), ("host_enqueue_us_median", hs.median, "us"),
                            ("copy_bandwidth_median", bw, "GB/s"), ("bytes_floor_us", floor_us, "us")):
        res.add(metric, v, unit, src_ev)
    return {"token_us": asdict(st), "host_enqueue_us": asdict(hs), "copy_bandwidth_GBps": {"median": bw, "from": where},
            "bytes_floor_us": floor_us, "floor_over_token": floor_us / st.median, "source": src_ev}


def _print_summary(con, cfg, meta, kinds, census) -> None:
    from rich.table import Table

    t = Table(title=f"launch census per token — {cfg.name}")
    for c in ("kind", "launches / token", "distinct sites"):
        t.add_column(c, justify="right" if c != "kind" else "left")
    for r in kinds.itertuples():
        t.add_row(r.kind, f"{r.launches:g}", str(r.sites))
    con.print(t)
    by = census.by_cluster()
    t2 = Table(title="launches per token by cluster")
    t2.add_column("cluster")
    for c in by.columns:
        t2.add_column(str(c), justify="right")
    for name, row in by.iterrows():
        t2.add_row(str(name), *[f"{v:g}" for v in row])
    con.print(t2)
    s = meta.get("summary") or {}
    if s:
        if meta.get("modeled"):
            src = {"ev": "MODELED (sim events)", "host": "MODELED host clock (launch cost only)",
                   "bw": f"calibration, {s['copy_bandwidth_GBps']['from'].rsplit(': ', 1)[-1]}",
                   "floor": "bytes / modeled bandwidth", "mem": "MODELED (sim arena + weights)"}
        else:
            src = {"ev": "CUDA events", "host": "host clock (launch cost only)", "bw": "CUDA events, D2D copy",
                   "floor": "bytes / bandwidth", "mem": "CuPy pool"}
        st, hs, bw = s["token_us"], s["host_enqueue_us"], s["copy_bandwidth_GBps"]
        t3 = Table(title=f"decode token timing — {provenance.label(meta)}")
        t3.add_column("figure")
        t3.add_column("value", justify="right")
        t3.add_column("source")
        t3.add_row("µs per token (median)", f"{st['median']:.1f}", src["ev"])
        t3.add_row("  interquartile range", f"{st['p25']:.1f}–{st['p75']:.1f}", f"n={st['n']}")
        t3.add_row("host enqueue µs per token", f"{hs['median']:.1f}", src["host"])
        t3.add_row("bytes read per token", f"{sum(meta['bytes_per_token'].values()) / 1e6:.1f} MB", "analytic")
        t3.add_row("copy bandwidth", f"{bw['median']:.0f} GB/s", src["bw"])
        t3.add_row("bytes-moved floor", f"{s['bytes_floor_us']:.1f} µs", src["floor"])
        t3.add_row("floor / measured" if not meta.get("modeled") else "floor / modeled",
                   f"{s['floor_over_token']:.2f}", "")
        if "gpu_memory_bytes" in meta:
            mem = meta["gpu_memory_bytes"]
            t3.add_row("GPU memory held", f"{mem / 2**30:.2f} GiB" if mem >= 2**30 else f"{mem / 2**20:.1f} MiB",
                       src["mem"])
        con.print(t3)
