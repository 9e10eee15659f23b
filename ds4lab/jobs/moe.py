"""``ds4lab moe``: the routed-MoE profiler (:mod:`ds4lab.moeprof`): ds4's stages by token count, routing and profiling
mode; ds4-format profile lines; figures; the MoE's share of a token; each mode's overhead on a whole token."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..sim.calibration import backend_calibration
from .common import BadInput, default_preset, modeled_banner, out_folder
from .result import JobResult, result_folder

#: Token counts per step profiled by default: decode, MTP verification (2-3) and batches.
TOKENS_PER_STEP_DEFAULT = (1, 2, 3, 16, 64, 256, 512)

#: What ``ds4lab moe`` writes in its folder (an earlier run's copies are removed first).
MOE_OUTPUTS = ("moe.csv", "summary.csv", "moe-ds4*.log", "expert-load.csv", "share.csv", "overhead.csv",
               "moe-stages.*", "moe-distribution.*", "moe-share.*")


@dataclass
class MoeConfig:
    """Arguments of ``ds4lab moe`` (``ds4lab moe --help``). ``tokens_per_step``: token counts per step; ``steps``:
    reported steps per (mode, tokens per step, routing); ``warmup``: None = 1 eager, 2 replayed."""

    modes: list[str] = field(default_factory=lambda: ["host-timed", "deferred", "graph-boundary", "in-graph",
                                                      "cupti", "nvtx"])
    #: None: :data:`TOKENS_PER_STEP_DEFAULT`, less any count above the preset's ``max_tokens``.
    tokens_per_step: list[int] | None = None
    routings: list[str] = field(default_factory=lambda: ["uniform", "zipf", "hash", "worst"])
    preset: str | None = None
    steps: int = 20
    warmup: int | None = None
    regime: str = "auto"
    capture_mode: str = "thread_local"
    n_layers: int | None = None
    fallback: bool = False
    share_tokens: int = 8
    overhead: bool = True
    print_ds4: bool = False
    seed: int = 0
    sim_compute: bool = False
    out: Path | str | None = None


def text_options(backend: str, preset: str | None, tokens_per_step=None, routings=None, modes=None
                 ) -> tuple[dict, str]:
    """:class:`MoeConfig` fields from a notebook's text: ``tokens_per_step`` ``"1,2,64"``, ``routings``/``modes``
    comma-separated or ``"all"``; other values kept, None left out. ``preset`` None: the job's default on ``backend``.
    Counts above the preset's ``max_tokens`` are left out; the second value says which, or is "".

    Raises:
        ds4lab.token.config.ConfigError: an unknown preset.
        BadInput: no token count the preset takes, or one that is not a whole number."""
    from .. import moeprof as M
    from ..backends import resolve
    from ..token.config import get_preset
    from .common import DEFAULT_PRESETS

    preset = preset or DEFAULT_PRESETS["moe"][0 if resolve(backend) == "cupy" else 1]
    out, note = {"preset": preset}, ""
    if isinstance(tokens_per_step, str):
        limit = get_preset(preset).max_tokens
        try:
            asked = [int(t) for t in tokens_per_step.split(",") if t.strip()]
        except ValueError:
            raise BadInput(f"tokens per step {tokens_per_step!r}: comma-separated whole numbers expected") from None
        text, tokens_per_step = tokens_per_step, [t for t in asked if t <= limit]
        if not tokens_per_step:
            raise BadInput(f"tokens per step {text!r}: {preset} takes at most {limit} tokens per step")
        if len(tokens_per_step) < len(asked):
            note = f"note: {preset} takes at most {limit} tokens per step: profiling {tokens_per_step}"
    for name, value, every in (("tokens_per_step", tokens_per_step, ()), ("routings", routings, M.ROUTINGS),
                               ("modes", modes, M.MODES)):
        if isinstance(value, str):
            value = list(every) if value.strip() == "all" else [p.strip() for p in value.split(",") if p.strip()]
        if value is not None:
            out[name] = value
    return out, note


def run(cfg: MoeConfig, be, console=None) -> JobResult:
    """The ``ds4lab moe`` job on ``be``. Returns the :class:`~ds4lab.jobs.result.JobResult`: tables ``moe``, ``summary``
    and, where written, ``expert-load``, ``share``, ``overhead``; figures ``moe-stages``, ``moe-distribution``,
    ``moe-share``; ds4's profile lines among its files.

    Raises:
        BadInput: a token count above the preset's ``max_tokens``, an unknown mode or routing, a repeated value, an
            empty list.
        ds4lab.report.results.OutputError: an unwritable ``out``."""
    from ..progress import make_console

    from .. import moeprof as M
    from ..report import provenance
    from ..token.config import get_preset

    con = console or make_console()
    preset = cfg.preset or default_preset("moe", be)
    mcfg = get_preset(preset)
    tokens = cfg.tokens_per_step
    if tokens is None:  # the defaults this preset takes
        tokens = [t for t in TOKENS_PER_STEP_DEFAULT if t <= mcfg.max_tokens]
        if len(tokens) < len(TOKENS_PER_STEP_DEFAULT):
            con.print(f"[yellow]note: {preset} takes at most {mcfg.max_tokens} tokens per step: profiling "
                      f"{','.join(map(str, tokens))}[/]")
    _check_lists(cfg, tokens, M)
    modes = sorted(cfg.modes, key=lambda m: m == "cupti")  # CUPTI stays loaded once started: last
    tokens, routings = list(tokens), list(cfg.routings)
    if cfg.seed < 0:
        raise BadInput(f"--seed {cfg.seed}: a routing and input seed is a whole number >= 0")
    if cfg.steps < 1:
        raise BadInput(f"--steps {cfg.steps}: at least one reported step per mode, token count and routing")
    if cfg.n_layers is not None and not 1 <= cfg.n_layers <= mcfg.n_layers:
        raise BadInput(f"--n-layers {cfg.n_layers}: the {preset} preset has {mcfg.n_layers} layers (1..{mcfg.n_layers})")
    if max(tokens) > mcfg.max_tokens:
        raise BadInput(f"--tokens-per-step {max(tokens)}: the {preset} preset takes at most {mcfg.max_tokens} "
                       "tokens per step (its max_tokens; `ds4lab presets`)")
    out, ran = out_folder(cfg.out, "moe", (preset, be.name),
                          {"preset": preset, "backend": be.name, "modes": modes, "tokens_per_step": tokens,
                           "routings": routings, "capture_mode": cfg.capture_mode})
    meta = provenance.base_meta(be)
    modeled = be.models_time
    meta.update(job="moe", preset=mcfg.summary(), modes=modes, tokens=tokens, routings=routings, steps=cfg.steps,
                warmup=cfg.warmup, regime=cfg.regime, capture_mode=cfg.capture_mode, n_layers=cfg.n_layers,
                fallback=cfg.fallback, seed=cfg.seed, modeled=modeled)
    if modeled:
        meta["calibration"] = backend_calibration(be)  # name, path, sha256, shipped
        meta["sim_timing_only"] = be.timing_only
        con.print(modeled_banner(be) + (" Timing only: every routing pattern is priced as uniform routing."
                                        if be.timing_only else ""))
    meta["globaltimer"] = M.globaltimer_resolution(be)
    meta["cupti"] = ("modeled timeline" if modeled else ":".join(map(str, M.cupti_available())))
    with result_folder("moe", out, meta, MOE_OUTPUTS, say=con.print, ran=ran) as o:
        written = _profile(be, mcfg, preset, modes, tokens, routings, cfg, o, meta, modeled, con)
    con.print("wrote " + ", ".join(str(o.where(p.name)) for p in written))
    return o.done()


def _check_lists(cfg: MoeConfig, tokens: list[int], M) -> None:
    for what, vals, allowed in (("mode", cfg.modes, M.MODES), ("routing", cfg.routings, M.ROUTINGS),
                                ("token count", tokens, None)):
        if not vals:
            raise BadInput(f"no {what} given")
        bad = [v for v in vals if allowed is not None and v not in allowed]
        if bad:
            raise BadInput(f"unknown {what}(s) {', '.join(map(str, bad))}; choose from: {', '.join(allowed)}")
        twice = sorted({str(v) for v in vals if list(vals).count(v) > 1})
        if twice:
            raise BadInput(f"{what}(s) {', '.join(twice)} given more than once")
    if any(t < 1 for t in tokens):
        raise BadInput(f"token counts must be >= 1: {list(tokens)}")


def _profile(be, cfg, preset, modes, tokens, routings, job: MoeConfig, o, meta, modeled, con):
    """Profile every (mode, routing, tokens per step) into ``o``; returns the files written, in order."""
    import sys

    import pandas as pd

    from .. import moeprof as M
    from ..report import plots, provenance, results
    from ..progress import JobProgress

    wb = M.MoeWorkbench(be, cfg, max_tokens=max(tokens), n_layers=job.n_layers, seed=job.seed,
                        vocab=bool(job.share_tokens))
    con.print(f"[bold]ds4lab moe[/] · {preset} · {be.name} · layers {wb.model.n_layers} · modes {', '.join(modes)}")
    csv_path = o.folder / "moe.csv"
    header = True
    frames = []
    failures = []
    combos = [(m, r, t) for m in modes for r in routings for t in tokens]
    with JobProgress(con, "moe profile", len(combos) * job.steps, eta=True) as prog:
        for mode, routing, T in combos:
            prog.describe(f"{mode} · {routing} · {T} tok")
            try:
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always", RuntimeWarning)
                    for rows in M.iter_profile(wb, mode, T, routing, job.steps, regime=job.regime, warmup=job.warmup,
                                               capture_mode=job.capture_mode, fallback=job.fallback):
                        df = pd.DataFrame(rows, columns=list(M.ROW_COLUMNS))
                        with results.appending(csv_path):  # rows as they come, whole rows only
                            df.to_csv(csv_path, mode="a", header=header, index=False)
                        header = False
                        frames.append(df)
                        prog.advance()
                    for x in w[:1]:
                        con.print(f"[yellow]{x.message}[/]")
            except (RuntimeError, ValueError) as e:
                failures.append({"mode": mode, "routing": routing, "tokens": T, "error": f"{type(e).__name__}: {e}"})
                con.print(f"[red]{mode} · {routing} · {T} tok: {e}[/]")
            be.release_cached_memory()
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(M.ROW_COLUMNS))
    o.streamed("moe", data)
    summ = with_fallbacks(M.summarize(data), data)
    o.table("summary", summ)
    # ds4's profile lines, one file per (mode, routing): the format has no field for either, so
    # the header names them and one file never mixes two.
    logs = []
    staged = data[data["mode"].isin(M.STAGE_MODES)]
    for (mode, routing), g in staged.groupby(["mode", "routing"], sort=False):
        lines = M.ds4_lines(g, n_used=cfg.n_used,
                            header=f"ds4lab moe · mode={mode} · routing={routing} · " + provenance.label(meta))
        if lines:
            logs.append(o.text(f"moe-ds4-{mode}-{routing}.log", "\n".join(lines) + "\n"))
            if job.print_ds4:
                for ln in lines:
                    print(ln, file=sys.stderr)
    _print_summary(con, summ, modes)
    fell = summ[summ["fallback_calls"] > 0].drop_duplicates(["mode", "routing", "tokens"]) if len(summ) else summ
    if len(fell):
        meta["eager_fallbacks"] = [{"mode": r.mode, "routing": r.routing, "tokens": int(r.tokens),
                                    "fallback_calls": int(r.fallback_calls), "calls": int(r.calls)}
                                   for r in fell.itertuples()]
        con.print("[yellow]calls that fell back to eager (their graph was retired and they ran eagerly: the times "
                  "above are eager times):[/]")
        for r in fell.itertuples():
            con.print(f"[yellow]  {r.mode} · {r.routing} · {int(r.tokens)} tok: {int(r.fallback_calls)} of "
                      f"{int(r.calls)} calls[/]")
    # the routing check: expert load per pattern (numbers needed: not in timing-only sim)
    if not be.timing_only:
        loads = []
        for r in routings:
            ls = wb.layers_for(r)
            for T in tokens:
                try:
                    loads.append(wb.expert_load(ls[-1] if r != "hash" else ls[0], T, r))
                except (RuntimeError, ValueError) as e:
                    failures.append({"mode": "expert_load", "routing": r, "tokens": T, "error": str(e)})
        o.table("expert-load", pd.DataFrame(loads))
    figs = []
    figs += o.figure("moe-stages", plots.moe_stage_bars_figure(summ, meta))
    figs += o.figure("moe-distribution", plots.moe_stage_distribution_figure(data, meta, routing=routings[0]))
    if job.share_tokens:
        share = M.token_share(wb, tokens=job.share_tokens)
        o.table("share", share)
        meta["moe_share_median"] = float(share["share"].median())
        figs += o.figure("moe-share", plots.moe_share_figure(share, meta))
        con.print(f"routed MoE share of an eager token: median {100 * meta['moe_share_median']:.1f} % "
                  f"({share['moe_us'].median():.0f} of {share['token_us'].median():.0f} µs)")
    if job.overhead:
        ov = M.overhead_table(wb, modes, tokens=4)
        o.table("overhead", ov)
        con.print("µs per whole token with each mode (median; overhead vs none):")
        con.print(ov[["mode", "regime", "us_per_token", "overhead", "note"]].to_string(
            index=False, float_format=lambda v: f"{v:.1f}"))
    meta.update(failures=failures, rows=len(data))
    names = {p.name for p in o.result.files}
    return [csv_path, Path("summary.csv"), *logs, Path("meta.json")] + [
        Path(f) for f in ("expert-load.csv", "share.csv", "overhead.csv") if f in names] + figs


def with_fallbacks(summ, data):
    """``summ`` with ``calls`` and ``fallback_calls`` (ran eagerly: eager times) per mode, backend, routing, tokens."""
    import pandas as pd

    keys = ["mode", "backend", "routing", "tokens"]
    if data.empty:
        return summ.assign(calls=pd.Series(dtype="int64"), fallback_calls=pd.Series(dtype="int64"))
    calls = data[data["stage"] == "total"]
    fb = calls["phase"].astype(str).eq("eager") & calls["note"].astype(str).str.contains("fallback", case=False)
    per = calls.assign(fb=fb).groupby(keys, sort=False).agg(calls=("fb", "size"), fallback_calls=("fb", "sum"))
    out = summ.merge(per.reset_index(), on=keys, how="left")
    out["calls"] = out["calls"].fillna(0).astype("int64")
    out["fallback_calls"] = out["fallback_calls"].fillna(0).astype("int64")
    return out


def _print_summary(con, summ, modes) -> None:
    if summ.empty:
        con.print("[yellow]no timed rows[/]")
        return
    piv = summ.pivot_table(index=["mode", "routing", "tokens"], columns="stage", values="median_ms",
                           aggfunc="first", sort=False)
    cols = [c for c in ("xq", "sort", "gateup", "midq", "down", "sum", "total") if c in piv.columns]
    table = (piv[cols] * 1e3).apply(lambda c: c.map(lambda v: "" if math.isnan(v) else f"{v:.1f}"))
    fb = summ.drop_duplicates(["mode", "routing", "tokens"]).set_index(["mode", "routing", "tokens"])
    if (fb["fallback_calls"] > 0).any():  # a column only where a call fell back: eager times under a replayed name
        table["eager fallback"] = [f"{int(fb.loc[i, 'fallback_calls'])}/{int(fb.loc[i, 'calls'])} calls"
                                   if fb.loc[i, "fallback_calls"] else "" for i in table.index]
    con.print("median µs per routed-MoE call:")
    con.print(table.to_string())


