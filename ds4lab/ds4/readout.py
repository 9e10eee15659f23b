"""Reading what ds4 did (its log lines, timed tokens and recorded tokens) into ds4lab's tables: pure pandas on the
workers' files (:mod:`ds4lab.ds4.worker`), so it runs without a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..trace.records import GRAPH_LAUNCH_CALLS, KERNEL_LAUNCH_CALLS, api_base_name


def read_log(path) -> dict:
    """What a ds4 log says about its decode islands and model load (:func:`ds4lab.trace.sources.ds4log.read_ds4_log`,
    lenient). Returns ``captured`` [(layer, island)], ``failed`` [{layer, island, step, error}], ``disabled``,
    ``model_copy_s`` (or None), ``profile_lines``, ``weights`` (``gpu-memory``, ``host-mapped`` or ``unknown``),
    ``capture_launch_errors``. A missing log says nothing."""
    from ..trace.sources.ds4log import EVENT_COLUMNS, STAGES, read_ds4_log

    path = Path(path)
    res = read_ds4_log(path, lenient=True) if path.exists() else None
    ev = res.tables.get("ds4_events") if res is not None else None
    ev = ev if ev is not None else pd.DataFrame(columns=list(EVENT_COLUMNS))
    isl = ev[ev.island.notna()]
    failed = isl[isl.event != "captured"]
    weights = next((e.split(" ", 1)[1] for e in ev.event if e.startswith("weights ")), "unknown")
    copies = ev.loc[ev.event == "model copy complete", "seconds"]
    copy_s = float(copies.iloc[-1]) if len(copies) else None
    if weights == "gpu-memory" and copy_s is None:
        weights = "unknown"
    in_capture = ev[ev.event == "launch failed in capture"]
    return {"captured": [(int(r.layer), int(r.island)) for r in isl[isl.event == "captured"].itertuples()],
            "failed": [{"layer": int(r.layer), "island": int(r.island), "step": r.event, "error": r.error}
                       for r in failed.itertuples()],
            "disabled": bool((ev.event == "capture disabled").any()), "model_copy_s": copy_s,
            "profile_lines": len(res.tables["ds4_moe"]) // len(STAGES) if res is not None else 0,
            "weights": weights,
            "capture_launch_errors": [{"launch": r.call, "error": r.error} for r in in_capture.itertuples()]}


def island_table(logs: dict) -> pd.DataFrame:
    """One row per configuration: islands captured (island 0, island 1), failures and their errors, from
    :func:`read_log` of each configuration's log (``logs``: config → read_log dict)."""
    rows = []
    for cfg, lg in logs.items():
        cap = lg["captured"]
        errors = sorted({f"{f['step']}: {f['error']}" for f in lg["failed"]})
        rows.append({"config": cfg, "weights": lg.get("weights", "unknown"), "model_copy_s": lg.get("model_copy_s"),
                     "islands_disabled": lg["disabled"],
                     "captured": len(cap), "captured_island0": sum(1 for _, i in cap if i == 0),
                     "captured_island1": sum(1 for _, i in cap if i == 1),
                     "failed": len(lg["failed"]), "failed_island1": sum(1 for f in lg["failed"] if f["island"] == 1),
                     "failed_layers": ",".join(str(f["layer"]) for f in lg["failed"]),
                     "errors": " | ".join(errors), "profile_lines": lg["profile_lines"],
                     "launch_errors_in_capture": len(lg.get("capture_launch_errors", ())),
                     "launch_error_in_capture": " | ".join(sorted({f"{e['launch']}: {e['error']}" for e in
                                                                    lg.get("capture_launch_errors", ())}))})
    return pd.DataFrame(rows)


def summarize_tokens(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and context of the workers' ``tokens`` rows (``config, context, gpu_us, host_us``): tokens,
    median µs per token with its IQR, median host µs of the eval call, and host / GPU."""
    g = tokens.groupby(["config", "context"], sort=False)
    out = g.agg(tokens=("gpu_us", "size"), us_per_token=("gpu_us", "median"),
                q1=("gpu_us", lambda s: s.quantile(0.25)), q3=("gpu_us", lambda s: s.quantile(0.75)),
                host_us=("host_us", "median")).reset_index()
    out["iqr_us"] = out["q3"] - out["q1"]
    return out.drop(columns=["q1", "q3"])


def paired_gain(tokens: pd.DataFrame, base: str, other: str, *, confidence: float = 0.95) -> pd.DataFrame:
    """Per context, ``base`` minus ``other`` µs per token, paired by decode position: the median difference with its
    interval (:func:`ds4lab.timing.paired_difference`), ``measurable`` False where it includes zero. Raises KeyError:
    ``base`` or ``other`` has no tokens."""
    from ..timing import paired_difference

    rows = []
    for ctx, grp in tokens.groupby("context", sort=True):
        a = grp[grp.config == base].set_index("pos")["gpu_us"]
        b = grp[grp.config == other].set_index("pos")["gpu_us"]
        common = a.index.intersection(b.index)
        if len(common) < 2:
            continue
        # paired_difference(x, y) is the median of y - x: here base - other, the gain of ``other``.
        d = paired_difference(b.loc[common].to_numpy(), a.loc[common].to_numpy(), confidence=confidence)
        rows.append({"context": ctx, "base": base, "other": other, "pairs": len(common),
                     "base_us": float(np.median(a.loc[common])), "other_us": float(np.median(b.loc[common])),
                     "gain_us": d.median, "gain_lo": d.lo, "gain_hi": d.hi, "measurable": d.measurable,
                     "ratio": float(np.median(a.loc[common]) / np.median(b.loc[common]))})
    if not rows and (base not in set(tokens.config) or other not in set(tokens.config)):
        raise KeyError(f"no tokens for {base!r} or {other!r}")
    return pd.DataFrame(rows)


def trace_census(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From a recording's event table of tokens marked by NVTX ranges ``decode_step``: per token (``tokens``: launch
    calls, graph launches, kernels executed, kernel busy µs, ``enqueue_us``, ``launch_call_us``) and per kernel name
    (``kernels``: launches per token, median µs, in a graph or not). Raises ValueError: the table has no ``decode_step``
    range."""
    nv = frame[(frame.kind == "nvtx") & (frame.name == "decode_step")].sort_values("start_ns")
    if nv.empty:
        raise ValueError("the recording has no NVTX range decode_step: record tokens with ds4lab.ds4.worker")
    api = frame[frame.kind == "api"].copy()
    api["base"] = api["name"].astype(str).map(api_base_name)
    kern = frame[frame.kind == "kernel"].copy()
    kern["us"] = (kern.end_ns - kern.start_ns) / 1e3
    tok_rows, kern_rows = [], []
    for i, r in enumerate(nv.itertuples()):
        a = api[(api.start_ns >= r.start_ns) & (api.end_ns <= r.end_ns)]
        if r.tid != -1:
            a = a[a.tid == r.tid]
        launches = a[a.base.isin(KERNEL_LAUNCH_CALLS)]
        graphs = a[a.base.isin(GRAPH_LAUNCH_CALLS)]
        k = kern[kern.correlation.isin(set(launches.correlation) | set(graphs.correlation))]
        issued = pd.concat([launches.end_ns, graphs.end_ns])
        last = issued.max() if len(issued) else r.start_ns
        tok_rows.append({"token": i, "launch_calls": len(launches), "graph_launches": len(graphs),
                         "kernels": len(k), "kernels_in_graphs": int((k.graph_id > 0).sum()),
                         "busy_us": float(k.us.sum()), "span_us": (r.end_ns - r.start_ns) / 1e3,
                         "enqueue_us": (last - r.start_ns) / 1e3,
                         "launch_call_us": float(((launches.end_ns - launches.start_ns) / 1e3).median())
                         if len(launches) else float("nan")})
        kk = k.assign(token=i)
        kern_rows.append(kk[["token", "name", "us", "graph_id", "grid", "block"]])
    tokens = pd.DataFrame(tok_rows)
    allk = pd.concat(kern_rows, ignore_index=True) if kern_rows else pd.DataFrame(columns=["token", "name", "us"])
    n = max(len(tokens), 1)
    kernels = (allk.assign(in_graph=allk.graph_id > 0)
               .groupby("name", sort=False)
               .agg(launches=("us", "size"), median_us=("us", "median"), total_us=("us", "sum"),
                    in_graph=("in_graph", "mean"), grid=("grid", "first"), block=("block", "first"))
               .reset_index())
    kernels["per_token"] = kernels["launches"] / n
    kernels["us_per_token"] = kernels["total_us"] / n
    return tokens, kernels.sort_values("us_per_token", ascending=False).reset_index(drop=True)


def expert_data_check(frame: pd.DataFrame, random_layers, n_layers: int = 43) -> pd.DataFrame:
    """Do ds4's kernels run faster on zeros? Per kernel that runs once per layer in every recorded token, its median
    µs on ``random_layers`` against the hole layers: rows ``name``, ``random_us``, ``hole_us``, ``ratio`` (random /
    hole), ``tokens``; empty when no layer is random or no kernel runs once per layer."""
    random_layers = {int(x) for x in random_layers}
    cols = ["name", "random_us", "hole_us", "ratio", "tokens"]
    if not random_layers:
        return pd.DataFrame(columns=cols)
    nv = frame[(frame.kind == "nvtx") & (frame.name == "decode_step")].sort_values("start_ns")
    kern = frame[frame.kind == "kernel"].sort_values("start_ns")
    per_name: dict = {}
    for r in nv.itertuples():
        k = kern[(kern.start_ns >= r.start_ns) & (kern.start_ns <= r.end_ns + 50_000_000)]
        # a token's kernels start after its range opens and before the next token's does
        k = k[k.start_ns < (nv[nv.start_ns > r.start_ns].start_ns.min() if (nv.start_ns > r.start_ns).any()
                            else float("inf"))]
        for name, g in k.groupby("name", sort=False):
            if len(g) != n_layers:
                continue
            us = ((g.end_ns - g.start_ns) / 1e3).to_numpy()
            rnd = [us[i] for i in range(n_layers) if i in random_layers]
            rest = [us[i] for i in range(n_layers) if i not in random_layers]
            per_name.setdefault(name, []).append((float(np.median(rnd)), float(np.median(rest))))
    rows = [{"name": n, "random_us": float(np.median([a for a, _ in v])), "hole_us": float(np.median([b for _, b in v])),
             "tokens": len(v)} for n, v in per_name.items()]
    out = pd.DataFrame(rows, columns=["name", "random_us", "hole_us", "tokens"])
    out["ratio"] = out["random_us"] / out["hole_us"]
    return out[cols].sort_values("ratio", ascending=False, ignore_index=True)


def exactness(folder, configs, reference: str) -> pd.DataFrame:
    """Each configuration's logits against ``reference``'s, token by token, from ``folder/worker-<config>/``. One row
    per (config, context, pos): ``identical``, ``n_diff``, ``first_diff`` (-1 if none), ``reference`` and ``value``
    there, ``max_abs_diff``, ``argmax_same``."""
    folder = Path(folder)
    cols = ["config", "reference", "context", "pos", "identical", "n_diff", "first_diff", "reference_value",
            "value", "max_abs_diff", "argmax_same"]

    def load(cfg):
        w = folder / f"worker-{cfg}"
        if not (w / "tokens.csv").exists():
            return None, {}
        t = pd.read_csv(w / "tokens.csv")
        arrays = {int(c): np.load(w / f"logits-{int(c)}.npy") for c in set(t.context)
                  if (w / f"logits-{int(c)}.npy").exists()}
        return t, arrays

    ref_t, ref_a = load(reference)
    rows = []
    if ref_t is None:
        return pd.DataFrame(columns=cols)
    for cfg in configs:
        t, arrays = load(cfg)
        if t is None:
            continue
        for ctx, grp in t.groupby("context", sort=True):
            ctx = int(ctx)
            if ctx not in arrays or ctx not in ref_a:
                continue
            rgrp = ref_t[ref_t.context == ctx].reset_index(drop=True)
            ref_row = {int(p): i for i, p in enumerate(rgrp.pos)}
            for i, p in enumerate(grp.pos):
                if int(p) not in ref_row:
                    continue
                a, b = ref_a[ctx][ref_row[int(p)]], arrays[ctx][i]
                diff = a.view(np.uint32) != b.view(np.uint32)
                idx = np.flatnonzero(diff)
                rows.append({"config": cfg, "reference": reference, "context": ctx, "pos": int(p),
                             "identical": not len(idx), "n_diff": int(len(idx)),
                             "first_diff": int(idx[0]) if len(idx) else -1,
                             "reference_value": float(a[idx[0]]) if len(idx) else float("nan"),
                             "value": float(b[idx[0]]) if len(idx) else float("nan"),
                             "max_abs_diff": float(np.max(np.abs(a[idx].astype(np.float64) - b[idx]))) if len(idx)
                             else 0.0,
                             "argmax_same": int(np.argmax(a)) == int(np.argmax(b))})
    return pd.DataFrame(rows, columns=cols)
