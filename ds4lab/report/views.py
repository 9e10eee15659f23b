"""The tables and figures a notebook shows from a job's result folder, drawn by the same :mod:`ds4lab.report.plots`
functions as the job's saved files (figure objects, not PNGs read back). Each function raises :class:`ValueError`
naming a folder that does not hold that job's results."""

from __future__ import annotations

from pathlib import Path


def _meta(folder: Path, jobs) -> dict:
    from .results import read_meta

    folder = Path(folder)
    meta = read_meta(folder)
    if meta is None:
        raise ValueError(f"{folder}: no meta.json (not a ds4lab result folder)")
    if meta.get("job") not in jobs:
        raise ValueError(f"{folder}: holds the results of ds4lab {meta.get('job')}, not of {' or '.join(jobs)}")
    return meta


def _csv(folder: Path, name: str, **kw):
    import pandas as pd

    p = Path(folder) / name
    if not p.is_file():
        raise ValueError(f"{folder}: no {name}")
    return pd.read_csv(p, **kw)


def figures(folder: Path) -> dict:
    """``{name: Figure}`` of the job whose results ``folder`` holds, named as its saved files (``ladder``, ``context``,
    ``moe-*``, ``exclusion``), detached from pyplot.

    Raises:
        ValueError: no ``meta.json``, a job without figures here, or a CSV file missing."""
    from . import plots

    return {name: plots.detach(fig) for name, fig in _figures(Path(folder)).items()}


def _figures(folder: Path) -> dict:
    from . import plots

    meta = _meta(folder, ("ladder", "context", "moe", "exclusion"))
    job = meta["job"]
    if job == "ladder":
        return {"ladder": plots.ladder_figure(_csv(folder, "ladder.csv", dtype={"stage": str}), meta)}
    if job == "context":
        return {"context": plots.context_figure(_csv(folder, "context.csv", dtype={"stage": str}), meta)}
    if job == "exclusion":
        return {"exclusion": plots.exclusion_figure(_csv(folder, "exclusion.csv"), meta)}
    data, summ = _csv(folder, "moe.csv"), _csv(folder, "summary.csv")
    routings = meta.get("routings") or list(dict.fromkeys(data["routing"]))
    out = {"moe-stages": plots.moe_stage_bars_figure(summ, meta),
           "moe-distribution": plots.moe_stage_distribution_figure(data, meta, routing=routings[0])}
    if (folder / "share.csv").is_file():
        out["moe-share"] = plots.moe_share_figure(_csv(folder, "share.csv"), meta)
    return out


def moe_stage_table(folder: Path):
    """Median µs per routed-MoE call by stage (columns) for each ``(tokens, routing)`` (``mode`` leading with several
    modes), from ``moe.csv``. Raises ValueError as :func:`figures`."""
    from ..token.model import MOE_STAGES

    _meta(folder, ("moe",))
    moe = _csv(folder, "moe.csv")
    moe["µs"] = moe["ms"] * 1e3
    stages = [*MOE_STAGES, "total"]
    index = (["mode"] if moe["mode"].nunique() > 1 else []) + ["tokens", "routing"]
    t = moe[moe.stage.isin(stages)].pivot_table(index=index, columns="stage", values="µs", aggfunc="median")
    return t[[s for s in stages if s in t.columns]]


def context_graphs(folder: Path):
    """Graphs each stage of a ``ds4lab context`` folder captured by context (cumulative), stage 3c's µs over stage
    3's, stage 3's recaptures and retirements; rows: contexts. Raises ValueError as :func:`figures`."""
    _meta(folder, ("context",))
    df = _csv(folder, "context.csv", dtype={"stage": str})
    stages = list(dict.fromkeys(df["stage"]))
    g = df.pivot_table(index="context", columns="stage", values="graphs", aggfunc="first")
    g = g[[s for s in stages if s in g.columns]]
    g.columns = [f"graphs, stage {s}" for s in g.columns]
    if {"3", "3c"} <= set(stages):
        us = df.pivot_table(index="context", columns="stage", values="us_median", aggfunc="first")
        g["stage 3c µs × stage 3"] = (us["3c"] / us["3"]).round(3)
    if "3" in stages:
        g = g.join(df[df.stage == "3"].set_index("context")[["recaptures", "retirements"]].add_prefix("stage 3 "))
    return g


def capture_stages(folder: Path):
    """A ``ds4lab context`` folder with stage 3 and others: each row's µs over stage 3's (``x_stage_3``) and paired
    gain (``gain over 3``). Raises ValueError as :func:`figures`, or without stage 3."""
    _meta(folder, ("context",))
    cs = _csv(folder, "context.csv", dtype={"stage": str})
    if "3" not in set(cs.stage):
        raise ValueError(f"{folder}: no stage 3 in its context.csv to compare with")
    s3 = cs[cs.stage == "3"].set_index("context").us_median
    cs["x_stage_3"] = cs.us_median / cs.context.map(s3)
    cs["gain over 3"] = [("—" if r.stage == "3" else f"{r.gain_us:+.0f} µs ({r.gain_lo:.0f}…{r.gain_hi:.0f})"
                          if r.gain_measurable else f"not measurable (±{(r.gain_hi - r.gain_lo) / 2:.0f} µs)")
                         for r in cs.itertuples()]
    return cs


__all__ = ["capture_stages", "context_graphs", "figures", "moe_stage_table"]
