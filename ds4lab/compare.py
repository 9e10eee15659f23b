"""Side-by-side figures of results from several folders (ds4lab runs, other machines, ingested
ds4 and Nsight Systems profiles)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def _label(d: Path) -> str:
    meta = d / "meta.json"
    if meta.is_file():
        m = json.loads(meta.read_text())
        tag = "MODELED" if m.get("modeled") else m.get("device", "?")
        return f"{d.name} ({tag})"
    return d.name


def _grouped_bars(tables: dict, stages: list, value, ylabel: str, title: str):
    """One bar group per stage, one bar per source table (``value(df, stage)``)."""
    import matplotlib.pyplot as plt

    from . import plots

    with plt.rc_context(plots.STYLE):
        fig, ax = plt.subplots(figsize=(8.5, 4))
        w = 0.8 / len(tables)
        for i, (name, df) in enumerate(tables.items()):
            ax.bar([k + i * w for k in range(len(stages))], [value(df, s) for s in stages], w, label=name,
                   color=plots.COLORS[i % len(plots.COLORS)])
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(stages))], stages)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(frameon=False, fontsize=8)
    return fig


def compare(dirs, out: Path) -> list[Path]:
    """Ladder tables (µs per token per stage) and MoE stage medians (ms per stage), one bar group
    per folder. Returns the written figure paths (PNG, SVG, PDF)."""
    from . import plots

    out = Path(out)
    ladders, moes = {}, {}
    for d in map(Path, dirs):
        for f in ("ladder.csv", "ds4lab_ladder.csv"):
            if (d / f).is_file():
                ladders[_label(d)] = pd.read_csv(d / f)
        for f in ("moe.csv", "ds4_moe.csv", "ds4lab_moe.csv"):
            if (d / f).is_file():
                moes[_label(d) + ("" if f == "moe.csv" else f" [{f[:-4]}]")] = pd.read_csv(d / f)
    written = []
    if ladders:
        stages = list(dict.fromkeys(s for df in ladders.values() for s in df["stage"].astype(str)))
        fig = _grouped_bars(ladders, stages, lambda df, s: df.loc[df.stage.astype(str) == s, "us_median"].mean(),
                            "µs per token (median)", "stage ladder, side by side (sources in the legend)")
        written += plots.save(fig, out / "compare_ladder")
    if moes:
        stages = ["xq", "sort", "gateup", "midq", "down", "sum"]
        fig = _grouped_bars(moes, stages, lambda df, s: df.loc[df.stage == s, "ms"].median(),
                            "ms per call (median)", "routed-MoE stages, side by side (sources in the legend)")
        written += plots.save(fig, out / "compare_moe")
    return written
