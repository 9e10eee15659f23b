"""``ds4lab tp token|ladder|trace``: tensor parallelism on the sim's two devices or a host's two GPUs: the TP=2 token
against the single-GPU one (:mod:`ds4lab.tp.group`), the tensor-parallel stages per rank
(:func:`ds4lab.tp.ladder.tp_ladder`), the TP token recorded per device for ``ds4lab audit``
(:func:`ds4lab.tp.trace.tp_trace`). Next: ``docs/tensor-parallel.md``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..capture import stream as S
from ..errors import BadInput, CheckFailed
from ..report import provenance
from .common import check_out_option, default_preset, out_folder
from .result import JobResult, result_folder

#: The commands, and the tokens each runs when the config names none.
COMMANDS = {"token": 4, "ladder": 96, "trace": 4}

#: What the tensor-parallel commands write in their folder.
TP_OUTPUTS = ("tp-*.csv", "tp-*.json", "trace-*")


@dataclass
class TPConfig:
    """Arguments of ``ds4lab tp COMMAND`` (the command line's defaults): ``backend`` ``sim`` or ``cupy`` (two GPUs);
    ``reduce``: NCCL all-reduce or ds4's peer copies; ``tokens`` None: the command's (:data:`COMMANDS`); ``stages``
    None: :data:`~ds4lab.tp.stages.TP_LADDER_DEFAULT`; ``out`` None:
    ``results/tp-<command>-<preset>-<backend>-<reduce>``."""

    command: str = "token"
    backend: str = "sim"
    preset: str | None = None
    reduce: str = "nccl"
    start_pos: int = 1000
    long_context: bool = False
    tokens: int | None = None
    stages: str | None = None
    exact_tokens: int = 4
    rounds: int = 4
    stage: str = "0"
    out: Path | str | None = None


def check_config(cfg: TPConfig) -> None:
    """Checks that need no device. Raises :class:`BadInput` naming the bad value."""
    from ..tp.stages import TP_STAGES

    for name, value, allowed in (("command", cfg.command, tuple(COMMANDS)), ("--backend", cfg.backend, ("sim", "cupy")),
                                 ("--reduce", cfg.reduce, ("nccl", "peer"))):
        if value not in allowed:
            raise BadInput(f"{name} {value!r}: choose one of {', '.join(allowed)}")
    bad = [f"--{k} {v}: at least 1" for k, v in (("tokens", cfg.tokens), ("rounds", cfg.rounds))
           if v is not None and v < 1]
    bad += [f"--exact-tokens {cfg.exact_tokens}: at least 0"] if cfg.exact_tokens < 0 else []
    if bad:
        raise BadInput("; ".join(bad))
    if cfg.command == "ladder":
        _stages(cfg)
    if cfg.command == "trace" and cfg.stage not in TP_STAGES:
        raise BadInput(f"--stage {cfg.stage}: choose one of {', '.join(TP_STAGES)}")
    check_out_option(cfg.out)


def _stages(cfg: TPConfig):
    from ..tp.stages import TP_LADDER_DEFAULT, parse_tp_stages

    names = cfg.stages or (TP_LADDER_DEFAULT + (",3c:in,3c:out" if cfg.long_context else ""))
    return names, parse_tp_stages(names, long_context=cfg.long_context)


def model_config(cfg: TPConfig, be):
    """The preset (None: the job's default on ``be``); with ``long_context``, caches for every position the command
    decodes (its rounds included), in whole 128s."""
    from ..token.config import get_preset

    mcfg = get_preset(cfg.preset or default_preset("tp", be))
    if cfg.long_context:
        need = -(-(cfg.start_pos + 8192) // 128) * 128
        mcfg = mcfg.replace(long_context=True, max_context=min(mcfg.max_context, need))
    return mcfg


def run(cfg: TPConfig, be, console) -> JobResult:
    """Run ``cfg.command`` on a node of two devices (``be`` unused). Returns the :class:`~ds4lab.jobs.result.JobResult`:
    ``token``: the comparison as ``value``; ``ladder``: table ``tp-ladder``; ``trace``: tables ``tp-collectives`` and
    ``tp-plan``.

    Raises:
        BadInput: bad input (nothing ran; exit 2).
        CheckFailed: ranks or reductions that disagree, or a stage not bit-identical (exit 1)."""
    from ..tp.ranks import make_node
    from ..token.model import TokenOptions

    check_config(cfg)
    node = make_node(cfg.backend, 2)
    mcfg = model_config(cfg, node.backend(0))
    job = f"tp-{cfg.command}"
    out, ran = out_folder(cfg.out, job, (mcfg.name, cfg.backend, cfg.reduce),
                          {"preset": mcfg.name, "backend": cfg.backend, "reduce": cfg.reduce})
    meta = provenance.base_meta(node.backend(0))
    meta.update(job=job, preset=mcfg.summary(), reduce=cfg.reduce, node=node.info())
    base = TokenOptions(vocab=True)
    with S.graphs_enabled(), result_folder(job, out, meta, TP_OUTPUTS, say=console.print, ran=ran) as o:
        value = _RUNS[cfg.command](cfg, mcfg, node, base, o, meta, console)
    return o.done(value)


def _token(cfg, mcfg, node, base, o, meta, console) -> dict:
    from ..experiments.stage_run import Span
    from ..tp.group import compare_on_gpus, compare_with_single

    span = Span(cfg.start_pos, cfg.tokens or COMMANDS["token"])
    if cfg.backend == "sim":
        r = compare_with_single(mcfg, span, reduce=cfg.reduce, opts=base, check=True, group=None)
        keep = {k: v for k, v in r.items() if k not in ("snapshots", "reference", "checks")}
        ok = r["ranks_identical"] and r["worst_bound_ratio"] <= 1.0
        why = f"ranks identical: {r['ranks_identical']}, worst reduction / bound {r['worst_bound_ratio']:.3f}"
    else:
        keep = compare_on_gpus(mcfg, node, span, base)
        ok = all(keep["ranks_identical"].values()) and keep["nccl_equals_peer"]
        why = f"ranks or reductions disagree: {keep}"
    o.json("tp-token.json", keep, indent=1, default=str)
    console.print(json.dumps(keep, indent=1, default=str))
    if not ok:
        raise CheckFailed(why)
    return keep


def _ladder(cfg, mcfg, node, base, o, meta, console):
    import pandas as pd

    from ..tp.group import TPGroup
    from ..tp.ladder import default_table, tp_ladder

    group = TPGroup(mcfg, node=node, reduce=cfg.reduce, opts=base)
    meta["group"] = group.info()
    names, stages = _stages(cfg)
    tokens = cfg.tokens or COMMANDS["ladder"]
    table = default_table(cfg.exact_tokens, tokens, cfg.rounds, start=cfg.start_pos)
    df = pd.DataFrame(tp_ladder(group, stages, table, progress=lambda st, what: console.print(f"  {st}: {what}")))
    df["modeled"] = group.node.name == "sim"
    meta.update(stages=names, tokens=tokens, rounds=cfg.rounds, exact_tokens=cfg.exact_tokens)
    o.table("tp-ladder", df)
    console.print(df[["stage", "exact", "ranks_identical", "us_median", "gain_us", "gain_measurable", "graph_launches",
                      "collectives", "failures"]].to_string(index=False))
    bad = df[~(df.exact & df.ranks_identical)] if "exact" in df else df.iloc[0:0]
    if len(bad):
        raise CheckFailed(f"stage(s) {', '.join(bad.stage)} not bit-identical to TP stage 0 (or across ranks)")
    return df


def _trace(cfg, mcfg, node, base, o, meta, console):
    from ..trace.sources.saved import write_table
    from ..tp.group import TPGroup
    from ..tp.trace import tp_trace

    group = TPGroup(mcfg, node=node, reduce=cfg.reduce, opts=base, nvtx=cfg.backend == "cupy")
    meta["group"] = group.info()
    table, pairs, plan = tp_trace(group, cfg.stage, cfg.start_pos, cfg.tokens or COMMANDS["trace"])
    write_table(table, o.folder / "trace-tp.csv.gz", stage=cfg.stage, reduce=group.reduce)
    o.file("trace-tp.csv.gz")
    o.table("tp-collectives", pairs)
    o.table("tp-plan", plan)
    console.print("wrote " + ", ".join(str(o.where(n)) for n in ("trace-tp.csv.gz", "tp-collectives.csv",
                                                                  "tp-plan.csv")))
    return table


_RUNS = {"token": _token, "ladder": _ladder, "trace": _trace}
