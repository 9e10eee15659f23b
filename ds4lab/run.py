"""``ds4lab run``: decode N tokens eagerly, check against the reference, time, count, floor.

The job, in order (each result written to ``DIR`` as soon as it exists):

1. reference check: the first token on the chosen backend against the NumPy executor with the
   same weights (all layers for ``tiny``/``small``; the first ``n_hash_layers + 1`` layers of
   ``ds4-flash``, which cover both routing kinds, because 43 layers take minutes on a CPU);
2. N decode tokens after warm-up, each bracketed by CUDA events on the accessor's stream and
   ended with a device synchronize, as ds4 ends each token with ``cudaDeviceSynchronize()``;
3. the launch census, the GPU memory footprint, and the bytes-moved floor (the fewest bytes a
   token must read over the measured device-to-device copy bandwidth).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import provenance
from .backends import make_backend
from .config import get_preset
from .model import DecodeModel, TokenOptions
from .results import ResultsCSV
from .timing import Stats, copy_bandwidth, token_bytes

#: Relative L2 error allowed between the GPU token and the NumPy reference: fp32 accumulation
#: plus the rare one-step flips of the Q8_K activation quantization (measured ~1e-5; NOTES.md).
CHECK_RTOL = 1e-4


@dataclass
class RunConfig:
    """Arguments of ``ds4lab run`` (see ``ds4lab run --help``)."""

    backend: str = "auto"
    preset: str | None = None  # None: "small" on a GPU, "tiny" on the CPU
    tokens: int = 64
    warmup: int = 8
    out: Path | None = None
    start_pos: int = 1000
    nvtx: bool = False
    check: bool = True
    per_layer_experts: bool = False
    seed: int = 1234
    options: TokenOptions = field(default_factory=TokenOptions)


def token_id_at(pos: int, vocab: int) -> int:
    """The token id decoded at ``pos``: a fixed, spread-out sequence."""
    return (pos * 7919 + 13) % vocab


def reference_check(cfg, be, opts: TokenOptions, pos: int, log) -> dict:
    """First token on ``be`` against the NumPy executor. Returns the check's figures.

    Raises nothing on a mismatch: the caller decides (``passed`` is in the result).
    """
    from .backends.numpy_backend import NumpyBackend

    layers = cfg.n_layers if cfg.name in ("tiny", "small") else min(cfg.n_layers, cfg.n_hash_layers + 1)
    scope = "full model" if layers == cfg.n_layers else f"first {layers} of {cfg.n_layers} layers (partial model)"
    log(f"reference check: first token, {scope}, vs the NumPy executor on the CPU")
    tok = token_id_at(pos, cfg.vocab)
    vocab = opts.vocab and layers == cfg.n_layers
    o = TokenOptions(**{**opts.summary(), "vocab": vocab})
    res = {}
    for tag, backend in (("device", be), ("reference", NumpyBackend(seed=cfg.seed))):
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


def run(rc: RunConfig, console=None) -> dict:
    """Run the job; returns the summary dict also written to ``meta.json``.

    Raises:
        ConfigError: unknown preset or a bad override.
        BackendUnavailable: ``--backend cupy`` without a usable GPU.
        RuntimeError: the reference check failed (results so far are on disk).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    con = console or Console()
    log = con.print
    if rc.tokens < 1:
        raise ValueError(f"--tokens {rc.tokens}: need at least 1 token")
    be = make_backend(rc.backend, seed=rc.seed)
    preset = rc.preset or ("small" if be.is_gpu else "tiny")
    cfg = get_preset(preset, per_layer_experts=rc.per_layer_experts, seed=rc.seed)
    out = Path(rc.out or f"results/run-{preset}-{be.name}")
    out.mkdir(parents=True, exist_ok=True)

    meta = provenance.base_meta(be)
    meta.update(job="run", preset=cfg.summary(), options=rc.options.summary(), tokens=rc.tokens,
                warmup=rc.warmup, start_pos=rc.start_pos, nvtx=rc.nvtx, status="running",
                routed_experts=("one bank per layer" if cfg.per_layer_experts else
                                f"one routed-expert bank shared by all {cfg.n_layers} layers "
                                "(per-token traffic unchanged)"))
    provenance.write_json(out / "meta.json", meta)
    log(f"[bold]ds4lab run[/] · preset {preset} · backend {be.name} · {provenance.label(meta)}")
    log(f"routed experts: {meta['routed_experts']}")
    if not be.measures_time:
        log("[yellow]numpy backend: the CPU reference executor. It computes the same outputs and makes "
            "no timing claims.[/]")

    with ResultsCSV(out / "results.csv") as res:
        # 1. reference check
        if rc.check and be.is_gpu:
            chk = reference_check(cfg, be, rc.options, rc.start_pos, log)
            meta["reference_check"] = chk
            res.add("reference_check_hidden_rel_err", chk["hidden_rel_err"], "1", "numpy-reference")
            provenance.write_json(out / "meta.json", meta)
            verdict = "[green]passed[/]" if chk["passed"] else "[red]FAILED[/]"
            log(f"reference check {verdict}: hidden-state relative error {chk['hidden_rel_err']:.2e} "
                f"(limit {CHECK_RTOL:.0e}), routing equal: {chk['routing_equal']} — {chk['scope']}")
            if not chk["passed"]:
                meta["status"] = "reference check failed"
                provenance.write_json(out / "meta.json", meta)
                raise RuntimeError(f"reference check failed: {chk}")
        elif rc.check:
            meta["reference_check"] = "skipped: the numpy backend is the reference"

        # 2. the model
        if be.is_gpu:
            be.compile_all()
        t0 = time.perf_counter()
        model = DecodeModel(cfg, be, rc.options, nvtx=rc.nvtx)
        be.synchronize()
        meta["setup_seconds"] = time.perf_counter() - t0
        mem = be.memory_used()
        if mem is not None:
            meta["gpu_memory_bytes"] = mem
            res.add("gpu_memory", mem, "bytes", "cupy-memory-pool")

        # 3. tokens
        L = model.L
        ev = [be.new_event(), be.new_event()] if be.measures_time else None
        gpu_us, host_us = [], []
        pos = rc.start_pos
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=con, transient=True) as prog:
            task = prog.add_task("decoding", total=rc.warmup + rc.tokens)
            for i in range(rc.warmup + rc.tokens):
                if i == rc.warmup:
                    L.census.reset()
                tok = token_id_at(pos, cfg.vocab)
                if ev:
                    be.event_record(L.stream(), ev[0])
                h0 = time.perf_counter()
                model.token(pos, tok)
                h1 = time.perf_counter()
                if ev:
                    be.event_record(L.stream(), ev[1])
                    be.synchronize()  # ds4 ends every token with cudaDeviceSynchronize()
                if i >= rc.warmup:
                    j = i - rc.warmup
                    if ev:
                        host_us.append((h1 - h0) * 1e6)
                        res.add("host_enqueue_us", round(host_us[-1], 3), "us", "host-clock", j)
                        import cupy

                        gpu_us.append(cupy.cuda.get_elapsed_time(ev[0], ev[1]) * 1e3)
                        res.add("token_us", round(gpu_us[-1], 3), "us", "cuda-events", j)
                pos += 1
                prog.advance(task)

        # 4. census, floor, summary
        census = L.census
        census.frame().to_csv(out / "census.csv", index=False)
        kinds = census.by_kind()
        meta["census_per_token"] = {r.kind: {"launches": float(r.launches), "sites": int(r.sites)}
                                    for r in kinds.itertuples()}
        tb = token_bytes(cfg, rc.options.vocab)
        meta["bytes_per_token"] = tb
        total_bytes = sum(tb.values())
        res.add("bytes_per_token", total_bytes, "bytes", "analytic")
        summary = {}
        if gpu_us:
            st = Stats.of(gpu_us)
            hs = Stats.of(host_us)
            bw = copy_bandwidth()
            floor_us = total_bytes / (bw.median * 1e9) * 1e6
            summary = {"token_us": asdict(st), "host_enqueue_us": asdict(hs),
                       "copy_bandwidth_GBps": asdict(bw), "bytes_floor_us": floor_us,
                       "floor_over_token": floor_us / st.median}
            res.add("token_us_median", st.median, "us", "cuda-events")
            res.add("token_us_p25", st.p25, "us", "cuda-events")
            res.add("token_us_p75", st.p75, "us", "cuda-events")
            res.add("host_enqueue_us_median", hs.median, "us", "host-clock")
            res.add("copy_bandwidth_median", bw.median, "GB/s", "cuda-events")
            res.add("bytes_floor_us", floor_us, "us", "analytic / measured bandwidth")
        meta["summary"] = summary
        meta["status"] = "complete"
        provenance.write_json(out / "meta.json", meta)

    _print_summary(con, cfg, meta, kinds, census)
    log(f"results in {out}/ (results.csv, census.csv, meta.json)")
    return meta


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
        st, hs, bw = s["token_us"], s["host_enqueue_us"], s["copy_bandwidth_GBps"]
        t3 = Table(title=f"decode token timing — {provenance.label(meta)}")
        t3.add_column("figure")
        t3.add_column("value", justify="right")
        t3.add_column("source")
        t3.add_row("µs per token (median)", f"{st['median']:.1f}", "CUDA events")
        t3.add_row("  interquartile range", f"{st['p25']:.1f}–{st['p75']:.1f}", f"n={st['n']}")
        t3.add_row("host enqueue µs per token", f"{hs['median']:.1f}", "host clock (launch cost only)")
        t3.add_row("bytes read per token", f"{sum(meta['bytes_per_token'].values()) / 1e6:.1f} MB", "analytic")
        t3.add_row("copy bandwidth", f"{bw['median']:.0f} GB/s", "CUDA events, D2D copy")
        t3.add_row("bytes-moved floor", f"{s['bytes_floor_us']:.1f} µs", "bytes / bandwidth")
        t3.add_row("floor / measured", f"{s['floor_over_token']:.2f}", "")
        if "gpu_memory_bytes" in meta:
            t3.add_row("GPU memory held", f"{meta['gpu_memory_bytes'] / 2**30:.2f} GiB", "CuPy pool")
        con.print(t3)
