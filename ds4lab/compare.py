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


def compare(dirs, out: Path) -> list[Path]:
    """Ladder tables (µs per token per stage) and MoE stage medians (ms per stage), one bar group
    per folder. Returns the written figure paths (PNG, SVG, PDF)."""
    import matplotlib.pyplot as plt

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
    with plt.rc_context(plots.STYLE):
        if ladders:
            fig, ax = plt.subplots(figsize=(8.5, 4))
            stages = list(dict.fromkeys(s for df in ladders.values() for s in df["stage"].astype(str)))
            w = 0.8 / len(ladders)
            for i, (name, df) in enumerate(ladders.items()):
                y = [df.loc[df.stage.astype(str) == s, "us_median"].mean() for s in stages]
                ax.bar([k + i * w for k in range(len(stages))], y, w, label=name, color=plots.COLORS[i % 7])
            ax.set_xticks([k + 0.4 - w / 2 for k in range(len(stages))], stages)
            ax.set_ylabel("µs per token (median)")
            ax.set_title("stage ladder, side by side (sources in the legend)", fontsize=9)
            ax.legend(frameon=False, fontsize=8)
            written += plots.save(fig, out / "compare_ladder")
        if moes:
            fig, ax = plt.subplots(figsize=(8.5, 4))
            stages = ["xq", "sort", "gateup", "midq", "down", "sum"]
            w = 0.8 / len(moes)
            for i, (name, df) in enumerate(moes.items()):
                y = [df.loc[df.stage == s, "ms"].median() for s in stages]
                ax.bar([k + i * w for k in range(len(stages))], y, w, label=name, color=plots.COLORS[i % 7])
            ax.set_xticks([k + 0.4 - w / 2 for k in range(len(stages))], stages)
            ax.set_ylabel("ms per call (median)")
            ax.set_title("routed-MoE stages, side by side (sources in the legend)", fontsize=9)
            ax.legend(frameon=False, fontsize=8)
            written += plots.save(fig, out / "compare_moe")
    return written
