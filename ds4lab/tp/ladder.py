"""The capture ladder under tensor parallelism (:func:`tp_ladder`): each TP stage checked bit for bit against TP stage
0 and timed in interleaved rounds; a token's time is the slower rank's. On the sim every figure is MODELED."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..experiments.ladder import Table
from ..experiments.stage_run import Span, first_difference
from ..timing import Stats, paired_difference
from ..token.model import TokenOptions
from .group import TPGroup
from .stages import TPStage


@dataclass
class _Run:
    stage: TPStage
    runs: list


def _on(group: TPGroup, run: _Run, fn):
    """``fn(rank, stage_run)`` on every rank with the stage's placement set on the rank's model."""
    def one(r: int):
        group.models[r].placement = run.stage.placement
        return fn(r, run.runs[r])

    return group.run(one)


def _per_token_collectives(model) -> float:
    df = model.L.census.frame(per_token=True)
    return float(df[df.kind == "collective"].launches.sum()) if len(df) else 0.0


def tp_ladder(group: TPGroup, stages: list[TPStage], table: Table, base: TokenOptions | None = None,
              progress=None) -> list[dict]:
    """Run ``stages`` on ``group`` at ``table.contexts[0]``: exactness over ``table.exact_tokens`` tokens against the
    first stage (``0``), timing over ``table.tokens`` tokens in ``table.rounds`` rounds.

    Returns one row per stage: ``stage``, ``placement``, ``collectives_in_graph``, ``exact``, ``first_difference``,
    ``ranks_identical``, ``us_median``, ``us_p25``, ``us_p75`` (the slower rank's), ``us_rank0``, ``us_rank1``,
    ``gain_us``, ``gain_lo``, ``gain_hi``, ``gain_measurable`` (paired against the first stage), ``kernel_launches``,
    ``graph_launches``, ``collectives`` (per token, rank 0), ``captures``, ``replays``, ``retirements``, ``failures``.
    Raises ValueError: no stages, or a table with more than one context."""
    if not stages:
        raise ValueError("tp_ladder: no stages")
    if len(table.contexts) != 1:
        raise ValueError("tp_ladder: one context per table")
    base = base or TokenOptions(vocab=group.models[0].opts.vocab)  # the vocabulary as the models were built
    ctx = table.contexts[0]
    runs = [_Run(st, group.stage_runs(st.stage, base)) for st in stages]
    rows = {r.stage.name: {"stage": r.stage.name, "placement": r.stage.placement,
                           "collectives_in_graph": r.stage.captures_collectives} for r in runs}
    if table.exact_tokens:
        span = table.exact_span(ctx)
        ref = None
        for run in runs:
            got = _on(group, run, lambda r, sr: sr.record(span))
            if ref is None:
                ref = got
            d = [first_difference(ref[r], got[r]) for r in range(group.world)]
            rows[run.stage.name].update(exact=all(x is None for x in d), first_difference=next((x for x in d if x), ""),
                                        ranks_identical=all(first_difference(got[0], got[r]) is None
                                                            for r in range(1, group.world)))
            if progress:
                progress(run.stage.name, "exact")
    samples = {run.stage.name: [] for run in runs}
    per_rank = {run.stage.name: [[] for _ in range(group.world)] for run in runs}
    launches = {}
    for rnd in range(table.rounds):
        order = runs if rnd % 2 == 0 else runs[::-1]
        span = table.round_span(ctx, rnd)
        warm = table.warmup if rnd == 0 else 2
        for run in order:
            res = _on(group, run, lambda r, sr: sr.time(span, warm))
            tok = np.max(np.stack([np.asarray(x["us_samples"], dtype=np.float64) for x in res]), axis=0)
            samples[run.stage.name].extend(tok.tolist())
            for r, x in enumerate(res):
                per_rank[run.stage.name][r].extend(x["us_samples"])
            launches[run.stage.name] = (res[0]["kernel_launches"], res[0]["graph_launches"],
                                        _per_token_collectives(group.models[0]))
            if progress:
                progress(run.stage.name, f"round {rnd}")
    first = runs[0].stage.name
    for run in runs:
        name = run.stage.name
        s = Stats.of(samples[name])
        g = paired_difference(samples[first], samples[name])
        st = [sr.stats() for sr in run.runs]
        failures = {}
        for x in st:
            for k, v in (x.get("failures") or {}).items():
                failures[k] = failures.get(k, 0) + v
        rows[name].update(us_median=s.median, us_p25=s.p25, us_p75=s.p75,
                          **{f"us_rank{r}": float(np.median(per_rank[name][r])) for r in range(group.world)},
                          gain_us=0.0 - g.median, gain_lo=0.0 - g.hi, gain_hi=0.0 - g.lo, gain_measurable=g.measurable,
                          kernel_launches=launches[name][0], graph_launches=launches[name][1],
                          collectives=launches[name][2],
                          captures=sum(x.get("captures", 0) for x in st), replays=sum(x.get("replays", 0) for x in st),
                          retirements=sum(x.get("retirements", 0) for x in st),
                          failures=";".join(f"{k}={v}" for k, v in failures.items()) or "none")
    return [rows[run.stage.name] for run in runs]


def default_table(exact_tokens: int = 4, tokens: int = 8, rounds: int = 2, start: int = 1000,
                  warmup: int = 2) -> Table:
    """The tensor-parallel ladder's positions: ``exact_tokens`` compared from ``start``, then ``tokens`` timed in
    ``rounds`` rounds (the ladder's :class:`~ds4lab.experiments.ladder.Table`)."""
    return Table(stages=(), contexts=(start,), exact_tokens=exact_tokens, exact_lead=0, tokens=tokens,
                 warmup=warmup, rounds=rounds, floor=False)


__all__ = ["Span", "default_table", "tp_ladder"]
