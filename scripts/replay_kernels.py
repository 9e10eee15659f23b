"""A replayed graph's kernels against the eager token's, per launch index (GPU, torch, transformers,
cupti-python): where the graph's device time goes that the whole-token plan does not model.

For each FAMILY/CACHE (``ds4lab.audit.families``), at the same positions: eager tokens recorded
(CUPTI kernel records), then the step captured with ``torch.cuda.graph`` at the first of them and
replayed (each replay queued behind a spinning kernel, so the device runs it back to back), recorded
too. Written to ``OUT/replay_kernels.json``: per family, the kernels per token, the eager and replayed
busy time (sum of durations, median over tokens), the span of a replay (first start to last end),
the idle between dependent kernels per boundary, and the launch indexes whose duration changes most.

    python scripts/replay_kernels.py --out OUT [--dtype bfloat16] llama/dynamic llama/static ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _kernels(rec, graph: bool) -> list:
    f = rec.table().frame
    k = f[(f["kind"] == "kernel") & ((f["graph_id"] > 0) == graph)].sort_values("start_ns")
    return list(zip(k["start_ns"].to_numpy(), k["end_ns"].to_numpy(), k["name"].to_numpy()))


def _per_token(ks: list, n: int) -> list:
    return [ks[i:i + n] for i in range(0, len(ks) - n + 1, n)]


def measure(engine: str, cache: str, dtype: str, tokens: int = 8) -> dict:
    import torch

    from ds4lab.audit import families as FA
    from ds4lab.audit.replay_check import TorchOps, restore, snapshot
    from ds4lab.trace.recording import recording

    ops = TorchOps(torch)
    step, set_pos, state, pos, _ = FA._family(engine, cache, dtype)
    with torch.no_grad():
        for p in (pos, pos + 1):
            set_pos(p)
            step()
        start = pos + 2
        snap = snapshot(state, ops)
        torch.cuda.synchronize()
        with recording(stacks=False) as eager:
            for p in range(start, start + tokens):
                set_pos(p)
                step()
            torch.cuda.synchronize()
        restore(snap, ops)
        set_pos(start)
        ops.warm(step, 2)
        restore(snap, ops)
        set_pos(start)
        graph, _ = ops.capture(step)
        with recording(stacks=False) as rep:
            for p in range(start, start + tokens):
                set_pos(p)
                torch.cuda._sleep(50_000_000)
                graph.replay()
            torch.cuda.synchronize()
    ek, gk = _kernels(eager, False), _kernels(rep, True)
    n = len(gk) // tokens
    et, gt = _per_token(ek, len(ek) // tokens), _per_token(gk, n)
    busy_e = float(np.median([sum(e - s for s, e, _ in t) for t in et])) / 1e3
    busy_g = float(np.median([sum(e - s for s, e, _ in t) for t in gt])) / 1e3
    span_g = float(np.median([t[-1][1] - t[0][0] for t in gt])) / 1e3
    gaps = [b[0] - a[1] for t in gt for a, b in zip(t, t[1:])]
    out = {"engine": engine, "cache": cache, "dtype": dtype, "tokens": tokens, "kernels_eager": len(et[0]),
           "kernels_graph": n, "busy_eager_us": busy_e, "busy_graph_us": busy_g, "span_graph_us": span_g,
           "idle_per_boundary_us": (span_g - busy_g) / max(n - 1, 1),
           "gap_median_us": float(np.median(gaps)) / 1e3, "gap_p90_us": float(np.percentile(gaps, 90)) / 1e3}
    if len(et[0]) == n:
        de = np.median([[e - s for s, e, _ in t] for t in et], axis=0)
        dg = np.median([[e - s for s, e, _ in t] for t in gt], axis=0)
        gap = np.median([[b[0] - a[1] for a, b in zip(t, t[1:])] for t in gt], axis=0)
        order = np.argsort(-(dg - de))[:12]
        out["slower_in_graph"] = [{"index": int(i), "name": str(gt[0][i][2])[:90], "eager_us": float(de[i]) / 1e3,
                                   "graph_us": float(dg[i]) / 1e3, "gap_before_next_us": float(gap[i]) / 1e3
                                   if i < len(gap) else None} for i in order]
        by: dict = {}
        for i, g_ in enumerate(gap):
            key = str(gt[0][i + 1][2]).split("<")[0][:60]
            by.setdefault(key, []).append(float(g_) / 1e3)
        out["gap_before_kernel"] = {k: {"n": len(v), "median_us": float(np.median(v))} for k, v in
                                    sorted(by.items(), key=lambda kv: -sum(kv[1]))[:15]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="FAMILY/CACHE")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    res = []
    for r in a.runs:
        engine, cache = r.split("/")
        try:
            res.append(measure(engine, cache, a.dtype))
        except Exception as e:  # noqa: BLE001 - one family failing keeps the others
            res.append({"engine": engine, "cache": cache, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps({k: v for k, v in res[-1].items() if not isinstance(v, (list, dict))}))
        (a.out / "replay_kernels.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
