"""Host constants refitted from measured ``ds4lab ladder`` or ``context`` folders (``calibrate --from-ladder``, no
GPU): ds4lab's host µs per eager launch, per graph-cache call and per kernel-node update, from the stages that price
each (:data:`HOST_FIT_STAGES`). Next: ``docs/calibration.md``, "--from-ladder"."""

from __future__ import annotations

from pathlib import Path

import numpy as np


#: The stages whose host times give the host constants: eager stage 0 (kernel launches only), ds4's
#: islands (stage i: kernel launches and graph-cache calls) and stage i+ (those plus kernel-node
#: updates of a cached graph).
HOST_FIT_STAGES = ("0", "i", "i+")


def fit_host_from_ladder(base: dict, folders) -> tuple:
    """``base`` with its ds4lab host constants (``host_launch_us``, ``host_graph_call_us``, ``host_node_update_us``)
    refitted from measured ladder or context folders (``docs/calibration.md``, "--from-ladder": the formulas). Returns
    ``(calibration dict, table)``: one table row per fitted value with its folder and context.

    Raises:
        ValueError: a folder that is not a ladder or context result, one modeled on the sim, a table without host
            times or launch counts, or no stage-0 row (each names it)."""
    import pandas as pd

    from .record import read_record

    rows, used = [], []
    for folder in map(Path, folders):
        job, _, d = read_record(folder)
        table = folder / f"{job}.csv"
        need = {"stage", "host_us_median", "kernel_launches"}
        if not need <= set(d.columns):
            raise ValueError(f"{table}: lacks {sorted(need - set(d.columns))}, the host enqueue time and launch "
                             "counts per stage the fit reads (a ladder from an older ds4lab)")
        for col in ("graph_launches", "node_updates"):  # older ladders: no stage launched graphs or updated nodes
            if col not in d.columns:
                d[col] = 0.0
        d["folder"] = str(folder)
        rows.append(d[d["stage"].isin(HOST_FIT_STAGES)])
        used.append(str(folder))
    if not rows:
        raise ValueError("name at least one measured ladder or context folder")
    d = pd.concat(rows, ignore_index=True)
    if not ((d["stage"] == "0") & (d["kernel_launches"] > 0)).any():
        raise ValueError(f"no stage 0 row in {', '.join(used)}: host_launch_us comes from eager tokens")
    out = dict(base)
    out.setdefault("host_graph_call_us", 0.0)
    out.setdefault("host_node_update_us", 0.0)
    fit = []

    def refit(stage: str, figure: str, value, per: str) -> None:
        rows = d[(d["stage"] == stage) & (d[per] > 0)]  # a row without what it prices says nothing of it
        got = [{"figure": figure, "folder": r.folder, "context": r.context, "value": float(value(r))}
               for r in rows.itertuples()]
        fit.extend(got)
        if got:
            out[figure] = round(max(0.0, float(np.median([g["value"] for g in got]))), 3)

    refit("0", "host_launch_us", lambda r: r.host_us_median / r.kernel_launches, "kernel_launches")
    hl, hg = out["host_launch_us"], float(base["host_graph_launch_us"])
    refit("i", "host_graph_call_us", lambda r: (r.host_us_median - r.kernel_launches * hl) / r.graph_launches - hg,
          "graph_launches")
    call = out["host_graph_call_us"]
    api = float(base["host_api_us"])
    refit("i+", "host_node_update_us",
          lambda r: (r.host_us_median - r.kernel_launches * hl - r.graph_launches * (hg + call)) / r.node_updates - api,
          "node_updates")
    out["source"] = (f"{base.get('source', '')}; host constants fitted from measured ladders by ds4lab calibrate "
                     f"--from-ladder {' '.join(used)}")
    return out, pd.DataFrame(fit, columns=["figure", "folder", "context", "value"])
