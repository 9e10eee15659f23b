"""Figures shared by the command line and the notebooks.

Every function returns a matplotlib ``Figure`` whose title carries the provenance of its numbers
(GPU, driver, preset — or "MODELED" for the simulated runtime); :func:`save` writes PNG, SVG and
PDF in one call. The Agg backend is used when no display is present.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
    try:
        import os

        if not os.environ.get("DISPLAY"):
            matplotlib.use("Agg")
    except Exception:  # noqa: BLE001
        pass
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "figure.dpi": 110, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.25, "font.size": 9, "axes.titlesize": 10,
}
COLORS = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452"]


def provenance_title(meta: dict, what: str) -> str:
    """``what`` plus where the numbers came from (measured GPU or modeled)."""
    preset = meta.get("preset", {})
    preset = preset.get("name", preset) if isinstance(preset, dict) else preset
    if meta.get("modeled"):
        return f"{what} — MODELED (simulated runtime, calibration {meta.get('calibration', '?')}) · {preset}"
    if meta.get("measured"):
        return (f"{what} — measured on {meta.get('device')} · driver {meta.get('driver')} · "
                f"CuPy {meta.get('cupy')} · {preset}")
    return f"{what} — {meta.get('backend')} backend, no timing claims · {preset}"


def save(fig, stem: Path | str, formats=("png", "svg", "pdf")) -> list[Path]:
    """Write ``fig`` as ``stem.png``, ``stem.svg`` and ``stem.pdf`` (or ``formats``). Returns paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for f in formats:
        p = stem.with_suffix("." + f)
        fig.savefig(p, bbox_inches="tight")
        out.append(p)
    return out


def ladder_figure(df, meta: dict):
    """µs per token per stage (median, IQR whiskers), the GPU-busy floor as a line, speedups and
    launches per token annotated. ``df``: rows of ``ladder.csv``."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(8.5, 4.6))
        x = range(len(df))
        med = df["us_median"].to_numpy()
        lo = med - df["us_p25"].to_numpy()
        hi = df["us_p75"].to_numpy() - med
        bars = ax.bar(x, med, yerr=[lo, hi], capsize=4, color=[COLORS[i % len(COLORS)] for i in x], alpha=0.85)
        floor = df["floor_us"].dropna()
        if len(floor):
            ax.axhline(float(floor.iloc[0]), color="black", ls="--", lw=1,
                       label=f"GPU-busy floor {float(floor.iloc[0]):,.0f} µs")
            ax.legend(loc="upper right", frameon=False)
        for b, (_, r) in zip(bars, df.iterrows()):
            exact = r.get("exact")
            mark = "" if exact in (True, "True") else (" ✗" if exact in (False, "False") else "")
            ax.annotate(f"×{r['speedup']:.2f}{mark}\n{r['kernel_launches']:.0f} k + {r['graph_launches']:.0f} g",
                        (b.get_x() + b.get_width() / 2, r["us_p75"]), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 3), textcoords="offset points")
        ax.set_xticks(list(x), [f"{s}\n{d}" for s, d in zip(df["stage"], df["short"])], fontsize=8)
        ax.set_ylabel("µs per token (median, IQR)")
        ax.set_ylim(0, max(med.max() * 1.25, 1))
        ax.set_title(provenance_title(meta, "CUDA-graph stage ladder"), fontsize=9)
        fig.text(0.01, 0.01, "k: kernel launches per token, g: graph launches per token; ✗: not bit-identical "
                 "to stage 0", fontsize=7, color="0.4")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        return fig
