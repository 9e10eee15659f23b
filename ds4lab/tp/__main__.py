"""``python -m ds4lab.tp``: the tensor-parallel token and its ladder, on the sim or on a host's two GPUs.

``token``: the TP=2 token against the single-GPU token (on the sim with the reduction bound checked at every
reduction; on GPUs the first difference and the largest one, and NCCL's against ds4's peer copies).
``ladder``: the tensor-parallel stages per rank (``ds4lab.tp.ladder``). ``trace``: the TP token recorded per
rank as one trace per device for ``ds4lab audit`` (``ds4lab.tp.trace``). Each writes a result folder
(``--out``) the way every ds4lab job does (``ds4lab.report.results.job_folder``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ds4lab.tp", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("token", "ladder", "trace"):
        s = sub.add_parser(name)
        s.add_argument("--backend", choices=("sim", "cupy"), default="sim")
        s.add_argument("--preset", default="small")
        s.add_argument("--reduce", choices=("nccl", "peer"), default="nccl")
        s.add_argument("--start-pos", type=int, default=1000)
        s.add_argument("--long-context", action="store_true")
        s.add_argument("--out", default=None)
        if name == "token":
            s.add_argument("--tokens", type=int, default=4)
        if name == "ladder":
            s.add_argument("--stages", default=None)
            s.add_argument("--exact-tokens", type=int, default=4)
            s.add_argument("--tokens", type=int, default=96)
            s.add_argument("--rounds", type=int, default=4)
        if name == "trace":
            s.add_argument("--stage", default="0")
            s.add_argument("--tokens", type=int, default=4)
    return p


def _cfg(a):
    from ..token.config import get_preset

    cfg = get_preset(a.preset)
    if a.long_context:  # caches for every position the command decodes (its rounds included), in whole 128s
        need = -(-(a.start_pos + 8192) // 128) * 128
        cfg = cfg.replace(long_context=True, max_context=min(cfg.max_context, need))
    return cfg


def main(argv=None) -> int:
    """Run a subcommand; returns the exit status (2 bad input, 1 a failed check)."""
    a = _parser().parse_args(argv)
    from ..capture import stream as S
    from ..errors import BadInput, CheckFailed
    from ..report import provenance, results
    from ..token.model import TokenOptions
    from .group import TPGroup
    from .ranks import make_node

    try:
        cfg = _cfg(a)
        out = Path(a.out or f"results/tp-{a.cmd}-{cfg.name}-{a.backend}-{a.reduce}")
        node = make_node(a.backend, 2)
        base = TokenOptions(vocab=True)
        meta = provenance.base_meta(node.backend(0))
        meta.update(job=f"tp-{a.cmd}", preset=cfg.summary(), reduce=a.reduce, node=node.info())
        with S.graphs_enabled(), results.job_folder(out, meta, ("tp-*.csv", "tp-*.json", "trace-*"), say=print) as folder:
            if a.cmd == "token":
                return _token(a, cfg, node, base, folder, meta)
            group = TPGroup(cfg, node=node, reduce=a.reduce, opts=base, nvtx=a.cmd == "trace" and a.backend == "cupy")
            meta["group"] = group.info()
            if a.cmd == "ladder":
                return _ladder(a, cfg, group, folder, meta)
            from .trace import write_tp_trace

            files = write_tp_trace(group, a.stage, a.start_pos, a.tokens, folder)
            print("wrote " + ", ".join(str(results.final_path(out) / f.name) for f in files))
            return 0
    except (BadInput, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CheckFailed as e:
        print(f"check failed: {e}", file=sys.stderr)
        return 1


def _token(a, cfg, node, base, folder, meta) -> int:
    from ..errors import CheckFailed
    from ..experiments.run import Span
    from .group import compare_with_single

    if a.backend != "sim":
        return _token_gpu(a, cfg, node, base, folder, meta)
    r = compare_with_single(cfg, Span(a.start_pos, a.tokens), reduce=a.reduce, opts=base, check=True,
                            group=None)
    keep = {k: v for k, v in r.items() if k not in ("snapshots", "reference", "checks")}
    (folder / "tp-token.json").write_text(json.dumps(keep, indent=1) + "\n")
    print(json.dumps(keep, indent=1))
    if not r["ranks_identical"] or r["worst_bound_ratio"] > 1.0:
        raise CheckFailed(f"ranks identical: {r['ranks_identical']}, worst reduction / bound {r['worst_bound_ratio']:.3f}")
    return 0


def _token_gpu(a, cfg, node, base, folder, meta) -> int:
    """On GPUs: the TP token (NCCL and ds4's peer copies, each bit-identical on both ranks and to each other)
    against the single-GPU token on device 0 (the order of the reductions differs: the largest difference is
    reported, not held to the sim's bound, which is for the NumPy reference's arithmetic)."""
    import numpy as np

    from ..errors import CheckFailed
    from ..experiments.run import Span, StageRun, first_difference
    from ..experiments.stages import STAGES
    from ..token.model import DecodeModel
    from .group import TPGroup

    span = Span(a.start_pos, a.tokens)
    ref = StageRun(DecodeModel(cfg, node.backend(0), base), STAGES["0"], base).record(span)
    got = {}
    for red in ("nccl", "peer"):
        g = TPGroup(cfg, node=node, reduce=red, opts=base)
        got[red] = g.record(g.stage_runs(STAGES["0"], base), span)
    h = lambda recs: np.stack([t["hidden"] for t in recs]).astype(np.float64)  # noqa: E731
    res = {"ranks_identical": {k: first_difference(v[0], v[1]) is None for k, v in got.items()},
           "nccl_equals_peer": first_difference(got["nccl"][0], got["peer"][0]) is None,
           "first_difference_vs_single": first_difference(ref, got["nccl"][0]),
           "max_rel_hidden_vs_single": float(np.abs(h(got["nccl"][0]) - h(ref)).max() / np.abs(h(ref)).max())}
    (folder / "tp-token.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    if not all(res["ranks_identical"].values()) or not res["nccl_equals_peer"]:
        raise CheckFailed(f"ranks or reductions disagree: {res}")
    return 0


def _ladder(a, cfg, group, folder, meta) -> int:
    import pandas as pd

    from ..errors import CheckFailed
    from .ladder import default_table, tp_ladder
    from .stages import TP_LADDER_DEFAULT, parse_tp_stages

    names = a.stages or (TP_LADDER_DEFAULT + (",3c:in,3c:out" if a.long_context else ""))
    stages = parse_tp_stages(names, long_context=a.long_context)
    table = default_table(a.exact_tokens, a.tokens, a.rounds, start=a.start_pos)
    rows = tp_ladder(group, stages, table, progress=lambda st, what: print(f"  {st}: {what}", flush=True))
    df = pd.DataFrame(rows)
    df["modeled"] = group.node.name == "sim"
    df.to_csv(folder / "tp-ladder.csv", index=False)
    meta.update(stages=names, tokens=a.tokens, rounds=a.rounds, exact_tokens=a.exact_tokens)
    print(df[["stage", "exact", "ranks_identical", "us_median", "gain_us", "gain_measurable", "graph_launches",
              "collectives", "failures"]].to_string(index=False))
    bad = df[~(df.exact & df.ranks_identical)] if "exact" in df else df.iloc[0:0]
    if len(bad):
        raise CheckFailed(f"stage(s) {', '.join(bad.stage)} not bit-identical to TP stage 0 (or across ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
