"""Command-line jobs ``ds4lab moe`` (the routed-MoE profiler) and ``ds4lab exclusion`` (the
profiling × capture matrix). :func:`register` adds both to the ``ds4lab`` click group."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import click

from .config import PRESETS, ConfigError

#: What ``ds4lab moe`` writes in its folder (an earlier run's copies are removed first).
MOE_OUTPUTS = ("moe.csv", "summary.csv", "moe-ds4*.log", "expert-load.csv", "share.csv", "overhead.csv",
               "moe-stages.*", "moe-distribution.*", "moe-share.*")


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"ds4lab: error: {msg}", err=True)
    sys.exit(code)


def _csv_list(text: str, allowed=None, kind=str, what: str = "value") -> list:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        out = [kind(t) for t in items]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated {what}s expected") from None
    if allowed is not None:
        if out == ["all"]:
            return list(allowed)
        bad = [t for t in out if t not in allowed]
        if bad:
            raise click.BadParameter(f"unknown {what}(s) {', '.join(map(str, bad))}; choose from: "
                                     f"{', '.join(map(str, allowed))} (or all)")
    if not out:
        raise click.BadParameter(f"no {what} given")
    twice = sorted({str(t) for t in out if out.count(t) > 1})
    if twice:
        raise click.BadParameter(f"{what}(s) {', '.join(twice)} given more than once in {text!r}")
    return out


def _backend(name: str, sim_compute: bool):
    from .backends.cupy_backend import gpu_usable

    if name == "auto":
        name = "cupy" if gpu_usable()[0] else "sim"
    if name == "cupy":
        from .backends.cupy_backend import CupyBackend

        be = CupyBackend()
        be.compile_all()
        return be
    from .sim.backend import SimBackend

    return SimBackend(timing_only=not sim_compute)


@click.command("moe")
@click.option("--backend", type=click.Choice(["auto", "cupy", "sim"]), default="auto", show_default=True,
              help="auto: cupy when a GPU is usable, else the simulated runtime (every figure MODELED).")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None,
              help="Model dimensions. Default: ds4-flash on a GPU, small on the sim.")
@click.option("--mode", "modes", default="all", show_default=True,
              help="Comma-separated profiling modes: host-timed, deferred, graph-boundary, in-graph, cupti, nvtx.")
@click.option("--tokens-per-step", "tokens", default="1,2,3,16,64,256,512", show_default=True,
              help="Comma-separated token counts per step: 1 decode, 2-3 MTP verification, 16..512 batches.")
@click.option("--routing", "routings", default="all", show_default=True,
              help="Comma-separated routing patterns: uniform, zipf, hash, worst.")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="Reported steps per (mode, tokens, routing); a step runs every layer once.")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Unreported steps first. Default: 1 eager, 2 replayed (warm-up and capture).")
@click.option("--regime", type=click.Choice(["auto", "eager", "replayed"]), default="auto", show_default=True,
              help="auto: graph-boundary and in-graph replayed from graphs, the others eager.")
@click.option("--capture-mode", type=click.Choice(["global", "thread_local", "relaxed"]), default="thread_local",
              show_default=True)
@click.option("--n-layers", type=click.IntRange(min=1), default=None, help="Build only the first N layers.")
@click.option("--fallback", is_flag=True, help="host-timed: under capture, time in-graph instead of refusing.")
@click.option("--share-tokens", type=click.IntRange(min=0), default=8, show_default=True,
              help="Whole eager decode tokens for the MoE-share figure (0: skip).")
@click.option("--overhead/--no-overhead", default=True, show_default=True,
              help="µs per whole token with each mode, eager and replayed (overhead.csv).")
@click.option("--sim-compute", is_flag=True,
              help="sim: compute the numbers too (slow for big batches; default: timing only).")
@click.option("--print-ds4", is_flag=True, help="Also print ds4's stderr profile lines.")
@click.option("--seed", type=int, default=0, show_default=True, help="Routing and input seed.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/moe-<preset>-<backend>.")
def moe_cmd(backend, preset, modes, tokens, routings, steps, warmup, regime, capture_mode, n_layers, fallback,
            share_tokens, overhead, sim_compute, print_ds4, seed, out) -> None:
    """Routed-MoE stage timing (ds4's xq/sort/gateup/midq/down/sum/total) in capture-compatible modes."""
    from .backends import BackendUnavailable
    from .moeprof import MODES, ROUTINGS

    modes = sorted(_csv_list(modes, MODES, what="mode"), key=lambda m: m == "cupti")  # CUPTI stays loaded: last
    routings = _csv_list(routings, ROUTINGS, what="routing")
    tokens = _csv_list(tokens, kind=int, what="token count")
    if any(t < 1 for t in tokens):
        raise click.BadParameter(f"token counts must be >= 1: {tokens}")
    try:
        be = _backend(backend, sim_compute)
        run_moe(be, preset, modes, tokens, routings, steps, warmup, regime, capture_mode, n_layers, fallback,
                share_tokens, overhead, print_ds4, seed, out)
    except (ConfigError, BackendUnavailable, ValueError, MemoryError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("interrupted: the rows measured so far are in moe.csv (meta.json status: interrupted)", code=130)


def run_moe(be, preset, modes, tokens, routings, steps, warmup=None, regime="auto", capture_mode="thread_local",
            n_layers=None, fallback=False, share_tokens=8, overhead=True, print_ds4=False, seed=0, out=None,
            console=None):
    """The ``ds4lab moe`` job on backend ``be`` (see the command's help). Returns the profile DataFrame.

    Raises ``ValueError`` for a token count above the preset's ``max_tokens`` and
    :class:`ds4lab.results.OutputError` for an unwritable ``out``; the folder's ``meta.json`` says
    ``complete``, ``interrupted`` or ``failed: …`` (:func:`ds4lab.results.job_folder`)."""
    from .progress import make_console

    from . import moeprof as M
    from . import provenance, results
    from .config import get_preset

    con = console or make_console()
    preset = preset or ("ds4-flash" if be.is_gpu else "small")
    cfg = get_preset(preset)
    if max(tokens) > cfg.max_tokens:
        raise ValueError(f"--tokens-per-step {max(tokens)}: the {preset} preset takes at most {cfg.max_tokens} "
                         "tokens per step (its max_tokens; `ds4lab presets`)")
    out = Path(out or f"results/moe-{preset}-{be.name}")
    meta = provenance.base_meta(be)
    modeled = M.is_modeled(be)
    meta.update(job="moe", preset=cfg.summary(), modes=modes, tokens=tokens, routings=routings, steps=steps,
                warmup=warmup, regime=regime, capture_mode=capture_mode, n_layers=n_layers, fallback=fallback,
                seed=seed, modeled=modeled)
    if modeled:
        cal = getattr(be, "calibration", {})
        meta["calibration"] = cal.get("name", "?") if isinstance(cal, dict) else str(cal)
        meta["sim_timing_only"] = bool(getattr(be, "timing_only", False))
        con.print(f"[bold yellow]sim backend: every time below is MODELED (calibration {meta['calibration']}), "
                  "not measured.[/]" + (" Timing only: every routing pattern is priced as uniform routing."
                                        if meta["sim_timing_only"] else ""))
    meta["globaltimer"] = M.globaltimer_resolution(be)
    meta["cupti"] = ("modeled timeline" if modeled else ":".join(map(str, M.cupti_available())))
    with results.job_folder(out, meta, MOE_OUTPUTS):
        return _profile(be, cfg, preset, modes, tokens, routings, steps, warmup, regime, capture_mode, fallback,
                        share_tokens, overhead, print_ds4, out, meta, modeled, n_layers, seed, con)


def _profile(be, cfg, preset, modes, tokens, routings, steps, warmup, regime, capture_mode, fallback,
             share_tokens, overhead, print_ds4, out, meta, modeled, n_layers, seed, con):
    import pandas as pd

    from . import moeprof as M
    from . import plots, provenance
    from .progress import JobProgress

    wb = M.MoeWorkbench(be, cfg, max_tokens=max(tokens), n_layers=n_layers, seed=seed, vocab=bool(share_tokens))
    con.print(f"[bold]ds4lab moe[/] · {preset} · {be.name} · layers {wb.model.n_layers} · modes {', '.join(modes)}")
    csv_path = out / "moe.csv"
    csv_path.unlink(missing_ok=True)
    header = True
    frames = []
    failures = []
    combos = [(m, r, t) for m in modes for r in routings for t in tokens]
    with JobProgress(con, "moe profile", len(combos) * steps) as prog:
        for mode, routing, T in combos:
            prog.describe(f"{mode} · {routing} · {T} tok")
            try:
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always", RuntimeWarning)
                    for rows in M.iter_profile(wb, mode, T, routing, steps, regime=regime, warmup=warmup,
                                               capture_mode=capture_mode, fallback=fallback):
                        df = pd.DataFrame(rows, columns=list(M.ROW_COLUMNS))
                        df.to_csv(csv_path, mode="a", header=header, index=False)  # rows as they come
                        header = False
                        frames.append(df)
                        prog.advance()
                    for x in w[:1]:
                        con.print(f"[yellow]{x.message}[/]")
            except (RuntimeError, ValueError) as e:
                failures.append({"mode": mode, "routing": routing, "tokens": T, "error": f"{type(e).__name__}: {e}"})
                con.print(f"[red]{mode} · {routing} · {T} tok: {e}[/]")
            if be.is_gpu:
                be.cp.get_default_memory_pool().free_all_blocks()
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(M.ROW_COLUMNS))
    summ = M.summarize(data)
    summ.to_csv(out / "summary.csv", index=False)
    # ds4's profile lines, one file per (mode, routing): the format has no field for either, so
    # the header names them and one file never mixes two.
    logs = []
    staged = data[data["mode"].isin(M.STAGE_MODES)]
    for (mode, routing), g in staged.groupby(["mode", "routing"], sort=False):
        lines = M.ds4_lines(g, n_used=cfg.n_used,
                            header=f"ds4lab moe · mode={mode} · routing={routing} · " + provenance.label(meta))
        if lines:
            logs.append(out / f"moe-ds4-{mode}-{routing}.log")
            logs[-1].write_text("\n".join(lines) + "\n")
            if print_ds4:
                for ln in lines:
                    click.echo(ln, err=True)
    _print_summary(con, summ, modes)
    # the routing check: expert load per pattern (numbers needed: not in timing-only sim)
    if not getattr(be, "timing_only", False):
        loads = []
        for r in routings:
            ls = wb.layers_for(r)
            for T in tokens:
                try:
                    loads.append(wb.expert_load(ls[-1] if r != "hash" else ls[0], T, r))
                except (RuntimeError, ValueError) as e:
                    failures.append({"mode": "expert_load", "routing": r, "tokens": T, "error": str(e)})
        pd.DataFrame(loads).to_csv(out / "expert-load.csv", index=False)
    figs = []
    figs += plots.save(plots.moe_stage_bars_figure(summ, meta), out / "moe-stages")
    figs += plots.save(plots.moe_stage_distribution_figure(data, meta, routing=routings[0]), out / "moe-distribution")
    if share_tokens:
        share = M.token_share(wb, tokens=share_tokens)
        share.to_csv(out / "share.csv", index=False)
        meta["moe_share_median"] = float(share["share"].median())
        figs += plots.save(plots.moe_share_figure(share, meta), out / "moe-share")
        con.print(f"routed MoE share of an eager token: median {100 * meta['moe_share_median']:.1f} % "
                  f"({share['moe_us'].median():.0f} of {share['token_us'].median():.0f} µs)")
    if overhead:
        ov = M.overhead_table(wb, modes, tokens=max(4, share_tokens or 4))
        ov.to_csv(out / "overhead.csv", index=False)
        con.print("µs per whole token with each mode (median; overhead vs none):")
        con.print(ov[["mode", "regime", "us_per_token", "overhead_us", "overhead_pct", "note"]].to_string(
            index=False, float_format=lambda v: f"{v:.1f}"))
    meta.update(failures=failures, rows=len(data))
    written = [csv_path, out / "summary.csv", *logs, out / "meta.json"] + [
        out / f for f in ("expert-load.csv", "share.csv", "overhead.csv") if (out / f).exists()] + figs
    con.print("wrote " + ", ".join(map(str, written)))
    return data


def _print_summary(con, summ, modes) -> None:
    if summ.empty:
        con.print("[yellow]no timed rows[/]")
        return
    piv = summ.pivot_table(index=["mode", "routing", "tokens"], columns="stage", values="median_ms",
                           aggfunc="first", sort=False)
    cols = [c for c in ("xq", "sort", "gateup", "midq", "down", "sum", "total") if c in piv.columns]
    con.print("median µs per routed-MoE call:")
    con.print((piv[cols] * 1e3).to_string(float_format=lambda v: "" if math.isnan(v) else f"{v:.1f}"))


@click.command("exclusion")
@click.option("--backend", type=click.Choice(["auto", "cupy", "sim"]), default="auto", show_default=True,
              help="cupy: the matrix on the GPU and on the sim, compared cell by cell. sim: the sim alone.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None,
              help="Default: ds4-flash on a GPU (its first top-k layer), tiny on the sim.")
@click.option("--tokens", type=click.IntRange(min=1), default=2, show_default=True,
              help="Tokens per MoE call (2: the sorted-pairs path of MTP verification).")
@click.option("--overhead-calls", type=click.IntRange(min=1), default=None,
              help="MoE calls per overhead measurement (default: 100 on a GPU, 4 on the sim).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/exclusion"), show_default=True)
def exclusion_cmd(backend, preset, tokens, overhead_calls, out) -> None:
    """The MoE profiling × capture exclusion matrix, computed by running every combination."""
    from .backends import BackendUnavailable
    from .exclusion import run_exclusion

    try:
        run_exclusion(backend, out, preset, tokens, overhead_calls=overhead_calls)
    except (ConfigError, BackendUnavailable, ValueError) as e:
        _fail(str(e))


def register(main) -> None:
    """Add ``moe`` and ``exclusion`` to the ``ds4lab`` click group ``main``."""
    main.add_command(moe_cmd, "moe")
    main.add_command(exclusion_cmd, "exclusion")
