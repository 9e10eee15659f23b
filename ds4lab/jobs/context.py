"""``ds4lab context``: the stage ladder across context length (:mod:`ds4lab.experiments.context`) on the
long-context token (compressed and indexed attention, whose launches change with the position).

At each context: exactness of every stage against stage 0 over ``span`` tokens from
``context - 4`` (crossing an emit of both compressors and, where one lies there, a top-k regime
boundary), then µs per token (median, IQR) over ``tokens`` tokens, kernel and graph launches per
token, and the graph cache's counts so far (graphs captured, recaptures, retirements).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..report import provenance, results
from ..capture import stream as S
from ..token.config import get_preset, is_ds4_flash
from ..experiments.context import (CONTEXT_STAGES, ContextInputError, context_figure, first_difference_all,
                                   parse_contexts, parse_context_stages, stage_run, state_record)
from ..experiments.ladder import STAGES, time_stage
from ..token.model import DecodeModel, TokenOptions
from ..timing import Stats
from .common import default_preset, modeled_banner
from .ladder import NotExact, exactness_backend

#: What the context job writes in its folder.
CONTEXT_OUTPUTS = ("context.csv", "context.png", "context.svg", "context.pdf")


@dataclass
class ContextConfig:
    """Arguments of ``ds4lab context``: stages (of ``0, 2, 3, 3c``), contexts (start positions),
    ``span`` (tokens compared bit for bit at each context), ``tokens`` timed per stage and context
    after ``warmup``, capture ``mode``, result folder (None: ``results/context-<preset>-<backend>``)."""

    stages: str = "0,2,3,3c"
    preset: str | None = None
    contexts: list[int] | str = field(default_factory=lambda: [1024, 4096, 16384, 65536])
    span: int = 8
    tokens: int = 64
    warmup: int = 4
    mode: str = "thread_local"
    out: Path | str | None = None


def _contexts(cfg: ContextConfig) -> list[int]:
    c = cfg.contexts
    return parse_contexts(c if isinstance(c, str) else ",".join(map(str, c)))


def check_config(cfg: ContextConfig) -> None:
    """Checks that need no backend. Raises :class:`ContextInputError` naming the bad value."""
    parse_context_stages(cfg.stages)
    _contexts(cfg)
    if cfg.span < 1 or cfg.tokens < 1 or cfg.warmup < 0:
        raise ContextInputError(f"span={cfg.span}, tokens={cfg.tokens} and warmup={cfg.warmup} must be positive")
    if cfg.out is not None and not str(cfg.out).strip():
        raise ContextInputError("--out '': an empty path would silently mean the current folder; name a folder")


def run(cfg: ContextConfig, be, console):
    """The ladder at each context on ``be``; returns the rows (one per stage and context) as a
    DataFrame, written to ``context.csv`` after each context, with ``meta.json`` and the figure.

    Raises:
        ContextInputError: bad input (nothing ran; exit 2).
        NotExact: a stage not bit-identical to stage 0 at some context, after writing everything.
    """
    from ..report import plots

    check_config(cfg)
    st_list = parse_context_stages(cfg.stages)
    ctx = _contexts(cfg)
    preset = cfg.preset or default_preset("context", be)
    last = max(max(c - 4 + cfg.span, c + cfg.warmup + cfg.tokens) for c in ctx)
    limit = get_preset(preset, long_context=True).max_context
    if last >= limit:
        raise ContextInputError(f"--contexts {max(ctx)}: with --tokens {cfg.tokens} and --warmup {cfg.warmup} the "
                                f"run decodes up to position {last}, past the {preset} preset's max_context {limit}")
    max_context = -(-(last + 1) // 128) * 128  # the caches' prefill does not depend on their size
    mcfg = get_preset(preset, long_context=True, max_context=max_context)
    out = Path(cfg.out or f"results/context-{preset}-{be.name}")
    meta = provenance.base_meta(be)
    meta.update(job="context", preset=mcfg.summary(), stages=[s.name for s in st_list], contexts=ctx,
                span=cfg.span, tokens=cfg.tokens, warmup=cfg.warmup, capture_mode=cfg.mode, modeled=be.models_time)
    banner = modeled_banner(be)
    if banner:
        console.print(banner)
    was = S.graphs_enabled()
    S.set_graphs_enabled(True)
    try:
        with results.job_folder(out, meta, CONTEXT_OUTPUTS):
            df = _measure(be, preset, mcfg, st_list, ctx, cfg, out, meta, console)
            paths = plots.save(context_figure(df, meta), out / "context")
            console.print(f"wrote {out / 'context.csv'}, {out / 'meta.json'}, " + ", ".join(map(str, paths)))
            bad = df[df.exact == False]  # noqa: E712
            if len(bad):
                raise NotExact("not bit-identical to stage 0: " + "; ".join(
                    f"stage {r.stage} at context {r.context}: {r.first_mismatch}" for r in bad.itertuples()))
    finally:
        S.set_graphs_enabled(was)
    return df


def _measure(be, preset, mcfg, st_list, ctx, cfg: ContextConfig, out, meta, con):
    import pandas as pd

    from ..progress import JobProgress

    base = TokenOptions(vocab=True)
    model = DecodeModel(mcfg, be, base)
    runs = [stage_run(model, st, base, cfg.mode) for st in st_list]
    be_x = exactness_backend(be)
    can_check = be_x.is_gpu or not is_ds4_flash(preset)
    if can_check and be_x is not be:
        model_x = DecodeModel(mcfg, be_x, base)
        runs_x = [stage_run(model_x, st, base, cfg.mode) for st in st_list]
    else:
        model_x, runs_x = model, runs
    if not can_check:
        con.print("exactness: not checked (the simulated runtime cannot compute ds4-flash in reasonable time)")
    rows = []
    with JobProgress(con, "contexts", len(ctx) * len(runs)) as prog:
        for c in ctx:
            exact = {st.name: ("n/a", "") for st in st_list}
            if can_check:
                start = c - 4
                ref = state_record(stage_run(model_x, STAGES["0"], base, cfg.mode), start, cfg.span)
                for rx in runs_x:
                    diff = first_difference_all(ref, state_record(rx, start, cfg.span))
                    exact[rx.stage.name] = (diff is None, diff or "")
            model.reset_state()
            for run in runs:
                run.activate()
                t = time_stage(run, c, cfg.tokens, cfg.warmup)
                us = Stats.of(t["us_samples"])
                st = run.cache.stats.as_dict() if run.cache else {}
                rows.append({
                    "stage": run.stage.name, "context": c, "us_median": us.median, "us_p25": us.p25,
                    "us_p75": us.p75, "n": us.n, "host_us_median": Stats.of(t["host_samples"]).median,
                    "kernel_launches": t["kernel_launches"], "graph_launches": t["graph_launches"],
                    "exact": exact[run.stage.name][0], "first_mismatch": exact[run.stage.name][1],
                    "graphs": st.get("captures", 0), "recaptures": st.get("recaptures", 0),
                    "retirements": st.get("retirements", 0), "replays": st.get("replays", 0),
                    "failures": ";".join(f"{k}={v}" for k, v in st.get("failures", {}).items()),
                    "decisions": repr(model.longctx_decisions(c, by_value=False)),
                    "backend": be.name, "preset": preset, "modeled": be.models_time})
                r = rows[-1]
                con.print(f"context {c:>7} stage {r['stage']:3s} {r['us_median']:10.1f} µs/token "
                          f"(IQR {r['us_p25']:.1f}–{r['us_p75']:.1f}) exact={r['exact']} "
                          f"{r['kernel_launches']:.0f} kernels + {r['graph_launches']:.0f} graphs, "
                          f"graphs so far {r['graphs']}")
                prog.advance()
            pd.DataFrame(rows).to_csv(out / "context.csv", index=False)  # each context as soon as it is done
    return pd.DataFrame(rows)


__all__ = ["CONTEXT_OUTPUTS", "CONTEXT_STAGES", "ContextConfig", "check_config", "run"]
