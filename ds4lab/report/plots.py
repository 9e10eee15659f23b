"""Figures shared by the command line and the notebooks: each returns a matplotlib ``Figure`` whose title carries its
numbers' provenance (GPU, driver, preset, or MODELED); :func:`save` writes PNG, SVG and PDF. Agg is used without a
display. Next: ``docs/figures.md``, ``docs/compare.md``."""

from __future__ import annotations

import math
import os
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline") and \
        not os.environ.get("DISPLAY"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "figure.dpi": 110, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.25, "font.size": 9, "axes.titlesize": 10,
}
COLORS = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452"]
#: Colours for one bar per source (matplotlib's qualitative ``tab20``: 20 colours), and the hatches
#: that tell sources apart past them (:func:`series_style`): no two sources look alike up to 120.
SERIES_COLORS = [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20"].colors]
SERIES_HATCHES = ("", "//", "..", "xx", "\\\\", "oo")
#: Marker shapes that tell sources apart past the colours where a source is a marker series
#: (:func:`series_marker`): one per hatch, so the same 120 sources can be told apart.
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P")
#: 20 distinct colours for the stages, one each (``tab10``, then ``tab20``'s light shades).
STAGE_PALETTE = ([matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab10"].colors]
                 + [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20"].colors[1::2]])


def stage_color(stage) -> str:
    """A capture stage's colour, by its place in :data:`ds4lab.experiments.stages.STAGES` (grey outside it)."""
    from ..experiments.stages import STAGES

    order = list(STAGES)
    s = str(stage)
    return STAGE_PALETTE[order.index(s) % len(STAGE_PALETTE)] if s in order else "#7f7f7f"


def series_style(i: int) -> dict:
    """Bar style of the ``i``-th source (0-based): a colour of :data:`SERIES_COLORS`, then again with a hatch of
    :data:`SERIES_HATCHES`. Raises ValueError past the 120 distinct styles."""
    n = len(SERIES_COLORS)
    if i >= n * len(SERIES_HATCHES):
        raise ValueError(f"{i + 1} sources in one figure: at most {n * len(SERIES_HATCHES)} can be told apart; "
                         "compare fewer folders at a time")
    return {"color": SERIES_COLORS[i % n], "hatch": SERIES_HATCHES[i // n], "edgecolor": "0.25" if i >= n else None,
            "linewidth": 0.3 if i >= n else 0}


def series_marker(i: int) -> dict:
    """Marker style of the ``i``-th source: its colour, then a shape of :data:`SERIES_MARKERS`; ValueError past 120."""
    color = series_style(i)["color"]
    return {"color": color, "marker": SERIES_MARKERS[i // len(SERIES_COLORS)]}


def provenance_title(meta: dict, what: str) -> str:
    """``what`` plus where the numbers came from (measured GPU or modeled)."""
    preset = meta.get("preset", {})
    preset = preset.get("name", preset) if isinstance(preset, dict) else preset
    if meta.get("modeled"):
        from .provenance import calibration_label

        return f"{what} — MODELED (simulated runtime, calibration {calibration_label(meta)}) · {preset}"
    if meta.get("measured"):
        return (f"{what} — measured on {meta.get('device')} · driver {meta.get('driver')} · "
                f"CuPy {meta.get('cupy')} · {preset}")
    return f"{what} — {meta.get('backend')} backend, no timing claims · {preset}"


def save(fig, stem: Path | str, formats=("png", "svg", "pdf")) -> list[Path]:
    """Write ``fig`` as ``stem.png``, ``.svg``, ``.pdf`` (or ``formats``), each whole, then close it in pyplot,
    written or not, so pyplot keeps no figure and Jupyter draws none twice. Returns the paths."""
    from .folder_io import whole_file

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    try:
        for f in formats:
            p = stem.with_suffix("." + f)
            with whole_file(p) as tmp:
                fig.savefig(tmp, bbox_inches="tight", format=f)
            out.append(p)
    finally:
        plt.close(fig)
    return out


def ladder_figure(df, meta: dict):
    """µs per token per stage (median, IQR whiskers), the busy time and launch-list floor as lines, speedups and
    launches annotated. ``df``: ``ladder.csv`` rows."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(10.5, 4.6))
        x = range(len(df))
        med = df["us_median"].to_numpy()
        lo = med - df["us_p25"].to_numpy()
        hi = df["us_p75"].to_numpy() - med
        bars = ax.bar(x, med, yerr=[lo, hi], capsize=4, color=[stage_color(s) for s in df["stage"]], alpha=0.85)
        floors = 0
        for col, color, ls, what in (("floor_us", "black", "--", "replayed token, GPU busy"),
                                     ("launch_floor_us", "0.5", ":", "launch-list floor")):
            v = df[col].dropna() if col in df else []
            if len(v):
                floors += 1
                ax.axhline(float(v.iloc[0]), color=color, ls=ls, lw=1, label=f"{what} {float(v.iloc[0]):,.0f} µs")
        if floors:  # beside the axes: no bar's label runs into it
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8, borderaxespad=0)
        for b, (_, r) in zip(bars, df.iterrows()):
            mark = f" {_exact_mark(r.get('exact'))}"
            ax.annotate(f"×{r['speedup']:.2f}{mark}\n{r['kernel_launches']:.0f} k + {r['graph_launches']:.0f} g",
                        (b.get_x() + b.get_width() / 2, r["us_p75"]), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 3), textcoords="offset points")
        ax.set_xticks(list(x), [f"{s}\n{d}" for s, d in zip(df["stage"], df["short"])], fontsize=8)
        ax.set_ylabel("µs per token (median, IQR)")
        ax.set_ylim(0, max(float(np.nanmax(df["us_p75"].to_numpy())) * 1.25, med.max() * 1.25, 1))
        ax.set_title(provenance_title(meta, "CUDA-graph stage ladder"), fontsize=9)
        fig.text(0.01, 0.01, "k: kernel launches per token, g: graph launches per token; ✓: bit-identical to "
                 "stage 0, ✗: not bit-identical, not checked: no exactness check ran", fontsize=7, color="0.4")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        return fig


def context_figure(df, meta: dict):
    """µs per token against context (log scale), one line per stage, IQR as a band."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(8.0, 4.4))
        for stage, g in df.groupby("stage", sort=False):
            g = g.sort_values("context")
            col = stage_color(stage)
            ax.plot(g.context, g.us_median, marker="o", color=col, label=f"stage {stage}")
            ax.fill_between(g.context, g.us_p25, g.us_p75, color=col, alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (start position)")
        ax.set_ylabel("µs per token (median, IQR)")
        ax.set_title(provenance_title(meta, "long-context decode: µs per token by stage"))
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


def _exact_mark(exact) -> str:
    """``✓`` bit-identical to stage 0, ``✗`` not, ``not checked`` where no check ran."""
    if exact in (True, "True", "true"):
        return "✓"
    if exact in (False, "False", "false"):
        return "✗"
    return "not checked"


# ----------------------------------------------------------------------------- routed-MoE profile (ds4lab.moeprof)
#: One color per routed-MoE stage (ds4's profile order).
MOE_STAGE_COLORS = {"xq": "#64B5CD", "sort": "#CCB974", "gateup": "#C44E52", "midq": "#8172B2", "down": "#4C72B0",
                    "sum": "#55A868", "total": "#333333"}
#: One color per exclusion-matrix outcome.
OUTCOME_COLORS = {"works": "#8FD19E", "refused": "#F6C28B", "breaks capture": "#E07B7B", "silently wrong": "#B9A3E3",
                  "no data": "#D0D0D0", "unavailable": "#F2F2F2"}


def _moe_stages():
    from ..token.model import MOE_STAGES

    return MOE_STAGES


def moe_stage_bars_figure(summary, meta: dict, modes=None, routings=None):
    """Where a routed-MoE call spends its time: per token count a 100 % stacked bar of ds4's profile stages, the
    median total above it; one row per mode, one column per routing. Eager fallbacks (``fallback_calls``) hatched and
    counted; on the timing-only sim every routing is priced as uniform, said in the title and panels. ``summary``:
    :func:`ds4lab.moeprof.summarize` output."""
    stages = _moe_stages()
    as_uniform = bool(meta.get("sim_timing_only"))
    s = summary[summary["stage"].isin(stages + ("total",))]
    have = set(s[s["stage"].isin(stages)]["mode"])
    known = ("host-timed", "deferred", "graph-boundary", "in-graph", "cupti", "nvtx")
    modes = [m for m in (modes or sorted(dict.fromkeys(s["mode"]), key=lambda m: (m not in known, known.index(m)
                                                                                 if m in known else 0, m)))
             if m in have]
    routings = routings or list(dict.fromkeys(s["routing"]))
    with plt.rc_context(STYLE):
        if not modes or not routings:
            return _no_stage_times()
        fig, axes = plt.subplots(len(modes), len(routings), figsize=(2.6 * len(routings) + 1.0, 2.5 * len(modes) + 1.0),
                                 squeeze=False, sharey=True)
        for i, m in enumerate(modes):
            for j, r in enumerate(routings):
                ax = axes[i][j]
                d = s[(s["routing"] == r) & (s["mode"] == m)]
                if d.empty:
                    ax.set_axis_off()
                    continue
                piv = d.pivot_table(index="tokens", columns="stage", values="median_ms", aggfunc="first")
                x = np.arange(len(piv))
                parts = np.array([(piv[st].fillna(0).to_numpy() if st in piv else np.zeros(len(piv))) * 1e3
                                  for st in stages])
                staged = parts.sum(axis=0)
                bottom = np.zeros(len(piv))
                for st, v in zip(stages, parts):
                    share = np.divide(100 * v, staged, out=np.zeros_like(v), where=staged > 0)
                    ax.bar(x, share, bottom=bottom, color=MOE_STAGE_COLORS[st], label=st, width=0.75)
                    bottom += share
                total = piv["total"].to_numpy() * 1e3 if "total" in piv else staged
                fell = (d.drop_duplicates("tokens").set_index("tokens")[["fallback_calls", "calls"]]
                        .reindex(piv.index).fillna(0) if "fallback_calls" in d else None)
                for xi, t, T in zip(x, total, piv.index):
                    fb = int(fell.loc[T, "fallback_calls"]) if fell is not None else 0
                    if fb:
                        ax.bar(xi, 100, width=0.75, fill=False, hatch="xx", edgecolor="0.2", linewidth=0)
                        ax.text(xi, 50, f"eager fallback\n{fb}/{int(fell.loc[T, 'calls'])}", ha="center",
                                va="center", fontsize=6, color="black",
                                bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0, "pad": 1})
                    ax.text(xi, 101.5, _us(t), ha="center", va="bottom", fontsize=6.5)
                ax.set_ylim(0, 112)
                ax.set_xticks(x, [str(t) for t in piv.index], fontsize=7)
                ax.set_title(f"{m} · {r}" + (" (priced as uniform)" if as_uniform and r != "uniform" else ""),
                             fontsize=8)
                if j == 0:
                    ax.set_ylabel("share of the MoE call (%)")
                if i == len(modes) - 1:
                    ax.set_xlabel("tokens per step")
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.legend(h, lab, loc="lower center", ncol=len(lab), frameon=False, fontsize=7)
        title = provenance_title(meta, "Routed-MoE call by ds4 profile stage (median total above each bar)")
        if as_uniform:
            title += ("\ntiming-only sim: every routing is priced as uniform routing, so its columns show one "
                      "model (--sim-compute, or a GPU, routes them)")
        fig.suptitle(title, fontsize=9)
        fig.tight_layout(rect=(0, 0.035, 1, 0.97 if not as_uniform else 0.94))
        return fig


def _no_stage_times():
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.text(0.5, 0.5, "no per-stage times", ha="center", va="center")
    ax.set_axis_off()
    return fig


def _us(v: float) -> str:
    """µs with a unit that keeps 2–3 significant digits (``42 µs``, ``2.2 ms``)."""
    if v != v:
        return ""
    return f"{v / 1e3:.2g} ms" if v >= 1000 else f"{v:.2g} µs" if v < 10 else f"{v:.0f} µs"


def moe_stage_distribution_figure(df, meta: dict, modes=None, routing: str | None = None):
    """Each stage's µs per call across layers and steps (box plots, log scale), a box per token count, a panel per
    mode. ``df``: ``moe.csv`` rows."""
    stages = _moe_stages()
    d = df[df["stage"].isin(stages) & np.isfinite(df["ms"].astype(float)) & (df["ms"].astype(float) > 0)]
    if routing is not None:
        d = d[d["routing"] == routing]
    modes = [m for m in (modes or list(dict.fromkeys(d["mode"])))]
    with plt.rc_context(STYLE):
        if d.empty or not modes:
            return _no_stage_times()
        tokens = sorted(d["tokens"].unique())
        fig, axes = plt.subplots(len(modes), 1, figsize=(max(7.5, 1.3 * len(stages) * max(1, len(tokens)) / 3),
                                                         2.6 * len(modes) + 0.8), squeeze=False)
        width = 0.8 / max(1, len(tokens))
        for i, m in enumerate(modes):
            ax = axes[i][0]
            dm = d[d["mode"] == m]
            for k, t in enumerate(tokens):
                data = [dm[(dm["stage"] == st) & (dm["tokens"] == t)]["ms"].astype(float).to_numpy() * 1e3
                        for st in stages]
                pos = [si + (k - (len(tokens) - 1) / 2) * width for si in range(len(stages))]
                keep = [(p, v) for p, v in zip(pos, data) if len(v)]
                if not keep:
                    continue
                bp = ax.boxplot([v for _, v in keep], positions=[p for p, _ in keep], widths=width * 0.9,
                                patch_artist=True, showfliers=True, flierprops={"markersize": 2})
                for b in bp["boxes"]:
                    b.set_facecolor(COLORS[k % len(COLORS)])
                    b.set_alpha(0.7)
                ax.plot([], [], color=COLORS[k % len(COLORS)], lw=6, alpha=0.7, label=f"{t} tok")
            ax.set_xticks(range(len(stages)), stages)
            ax.set_yscale("log")
            ax.set_ylabel("µs per call")
            ax.set_title(f"{m}" + (f" · {routing}" if routing else ""), fontsize=8)
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=7)
        fig.suptitle(provenance_title(meta, "Routed-MoE stage times across layers and steps"), fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        return fig


def moe_share_figure(share, meta: dict):
    """The routed MoE's share of a whole eager token (MoE and rest stacked, share annotated). ``share``:
    :func:`ds4lab.moeprof.token_share` output."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        x = np.arange(len(share))
        moe = share["moe_us"].to_numpy(dtype=float)
        rest = share["rest_us"].to_numpy(dtype=float)
        ax.bar(x, moe, color=MOE_STAGE_COLORS["gateup"], label="routed MoE (profiled total, all layers)")
        ax.bar(x, rest, bottom=moe, color="#BBBBBB", label="rest of the token")
        for xi, m, r, sh in zip(x, moe, rest, share["share"].to_numpy(dtype=float)):
            if np.isfinite(sh):
                ax.annotate(f"{100 * sh:.0f} %", (xi, m + r), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
        med = float(np.nanmedian(share["share"])) if len(share) else float("nan")
        ax.set_xlabel("decode token")
        ax.set_ylabel("µs per token (events around the token)")
        ax.set_xticks(x, [str(int(t)) for t in share["token"]], fontsize=7)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=7)
        ax.set_title(provenance_title(meta, f"Routed MoE in the whole eager token (median share {100 * med:.0f} %)"),
                     fontsize=9)
        fig.tight_layout()
        return fig


def exclusion_figure(df, meta: dict):
    """The profiling × capture exclusion matrix as a heatmap, the outcome in every cell. ``df``: ``exclusion.csv``."""
    from matplotlib.colors import ListedColormap

    rows = list(dict.fromkeys(df["mode"]))
    cols = list(dict.fromkeys(df["column"]))
    names = list(OUTCOME_COLORS)
    cell = {(r.mode, r.column): r for r in df.itertuples()}
    grid = np.array([[names.index(cell[(r, c)].outcome) if (r, c) in cell and cell[(r, c)].outcome in names else
                      names.index("no data") for c in cols] for r in rows])
    with plt.rc_context({**STYLE, "axes.grid": False}):
        fig, ax = plt.subplots(figsize=(1.95 * len(cols) + 2.0, 0.9 * len(rows) + 1.4))
        ax.imshow(grid, cmap=ListedColormap([OUTCOME_COLORS[n] for n in names]), vmin=-0.5, vmax=len(names) - 0.5,
                  aspect="auto")
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                x = cell.get((r, c))
                if x is None:
                    continue
                text = f"{x.outcome}"
                ov = getattr(x, "overhead_us", float("nan"))
                lo, hi = getattr(x, "overhead_lo_us", float("nan")), getattr(x, "overhead_hi_us", float("nan"))
                if x.outcome == "works" and ov == ov:
                    text += f"\n{ov:+.1f} µs/call"
                elif x.outcome == "works" and lo == lo and hi == hi:  # interval includes zero
                    text += f"\nnot measurable (±{(hi - lo) / 2:.1f} µs)"
                detail = str(x.detail) if x.detail == x.detail else ""
                if detail and x.outcome != "works":
                    text += "\n" + "\n".join(textwrap.wrap(detail, 34, break_long_words=False)[:3])
                ax.text(j, i, text, ha="center", va="center", fontsize=6.2)
        ax.set_xticks(range(len(cols)), cols, fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.xaxis.tick_top()
        ax.set_xticks(np.arange(-0.5, len(cols)), minor=True)
        ax.set_yticks(np.arange(-0.5, len(rows)), minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_title(provenance_title(meta, "MoE profiling × CUDA-graph capture"), fontsize=9, pad=22)
        fig.tight_layout()
        return fig


def whatif_figure(layers=None, launch=None, tokens=None):
    """The modeled what-if sweeps side by side (:mod:`ds4lab.experiments.whatif`); each argument a sweep's DataFrame
    or None to leave its panel out. The title names the calibration."""
    panels = [(df, x, xlabel, ylabel) for df, x, xlabel, ylabel in (
        (layers, "layers", "layers (ds4-flash dims)", "stage 3 gain over stage 0"),
        (launch, "host_launch_us", "host µs per eager launch", "stage 3 gain over stage 0"),
        (tokens, "tokens", "tokens per step (routed MoE)", "graph gain over eager MoE call"),
    ) if df is not None and len(df)]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(3.4 * max(len(panels), 1) + 0.6, 3.3),
                                 squeeze=False)
        for ax, (df, x, xlabel, ylabel) in zip(axes[0], panels):
            ax.plot(df[x], df["gain"], "o-", color=COLORS[0])
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            if x == "tokens":
                ax.set_xscale("log", base=2)
                ax.set_xticks(list(df[x]), [str(v) for v in df[x]])
                ax.minorticks_off()
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
        sources = sorted({s for df, *_ in panels for s in df["source"]}) if panels else ["no sweep"]
        cal = sources[0].split("calibration ")[-1].split(",")[0].rstrip(")") if panels else "?"
        fig.suptitle(f"What-if sweeps — MODELED (simulated runtime, calibration {cal})", fontsize=9)
        fig.tight_layout()
        return fig


def grouped_bars_figure(series: dict, xs: list, ylabel: str, title: str, rotate: bool = False,
                        note: str | None = None):
    """One bar group per x, one bar per source (``series``: label → {x: value}); a missing value is marked ``n/a``
    and said in the note. ``note``: a line under the axes."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(8.5, 0.9 * len(xs) * max(1, len(series)) ** 0.5), 4))
        w = 0.8 / len(series)
        missing = 0
        for i, (name, vals) in enumerate(series.items()):
            ys = [vals.get(x, float("nan")) for x in xs]
            ax.bar([k + i * w for k in range(len(xs))], ys, w, label=name, **series_style(i))
            for k, y in enumerate(ys):
                if y is None or y != y:  # not in this source: say so in its slot
                    missing += 1
                    ax.annotate("n/a", (k + i * w, 0), xytext=(0, 2), textcoords="offset points", ha="center",
                                va="bottom", rotation=90, fontsize=7, color=series_style(i)["color"])
        if missing:
            note = (note + "; " if note else "") + "n/a: the source has no such value (not run there)"
        ticks = [x if len(str(x)) <= 28 else str(x)[:27] + "…" for x in xs]
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(xs))], ticks,
                      rotation=30 if rotate else 0, ha="right" if rotate else "center")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        # beside the axes: no bar, however tall, sits under it
        ax.legend(frameon=False, fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left", borderaxespad=0)
        if note:
            ax.annotate(note, (0, 0), xycoords="axes fraction", xytext=(0, -48 if rotate else -30),
                        textcoords="offset points", fontsize=7, color="0.35", va="top")
    return fig


def compare_moe_figure(sources: dict, stages, max_panels: int = 8,
                       title: str = "Routed-MoE stages side by side (each source's mode and provenance in the legend)"):
    """Routed-MoE stage times side by side, one panel per token count (those most sources share, at most
    ``max_panels``), those left out named in a note. ``sources``: label → {tokens: {stage: median µs per call}}."""
    counts = Counter(T for per in sources.values() for T in per)
    tokens = sorted(sorted(counts, key=lambda T: (-counts[T], T))[:max_panels])
    left_out = sorted(set(counts) - set(tokens))
    cols = min(len(tokens), 4)
    nrows = -(-len(tokens) // cols)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, cols, figsize=(3.3 * cols + 1.0, 3.2 * nrows + 0.6), squeeze=False)
        w = 0.8 / len(sources)
        for idx, T in enumerate(tokens):
            ax = axes[idx // cols][idx % cols]
            for i, (name, per) in enumerate(sources.items()):
                vals = per.get(T, {})
                ax.bar([k + i * w for k in range(len(stages))], [vals.get(s, float("nan")) for s in stages], w,
                       label=name, **series_style(i))
            ax.set_xticks([k + 0.4 - w / 2 for k in range(len(stages))], stages, fontsize=7)
            ax.set_title(f"{T} token{'s' if T != 1 else ''} per step" if T else "tokens per step unknown",
                         fontsize=8)
            if idx % cols == 0:
                ax.set_ylabel("µs per MoE call (median)")
        for idx in range(len(tokens), nrows * cols):
            axes[idx // cols][idx % cols].set_axis_off()
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.legend(h, lab, loc="lower center", ncol=min(len(lab), 3), frameon=False, fontsize=7)
        fig.suptitle(title, fontsize=9)
        bottom = 0.06 + 0.03 * ((len(lab) - 1) // 3)
        if left_out:
            fig.text(0.01, 0.005, f"not drawn (at most {max_panels} panels): "
                     + ", ".join(f"{T} tokens per step" for T in left_out) + "; the tables hold them",
                     fontsize=7, color="0.35")
            bottom += 0.03
        fig.tight_layout(rect=(0, bottom / nrows, 1, 0.95))
    return fig


def compare_context_figure(sources: dict, stages=None, names=None, max_cols: int = 3,
                           title: str = "context ladder side by side (sources in the legend)"):
    """Context ladders side by side: one panel per stage, median µs per token at each context every source holds, IQR
    whiskers, one marker series per source; what a source lacks is written under the panels (``docs/compare.md``).
    ``sources``: label → {stage: {context: (median, p25, p75)}}; ``names``: stage → panel title words."""
    stages = list(stages) if stages is not None else list(dict.fromkeys(st for per in sources.values() for st in per))
    names = names or {}
    held = {label: {c for pts in per.values() for c in pts} for label, per in sources.items()}
    every = set.intersection(*held.values()) if held else set()
    contexts = sorted(every)
    anywhere = sorted(set().union(*held.values())) if held else []
    missing = []  # (label, what it lacks)
    for label, per in sources.items():
        lacks = []
        ctx = [c for c in anywhere if c not in held[label]]
        if ctx:
            lacks.append("context" + "s" * (len(ctx) > 1) + " " + ", ".join(map(str, ctx)))
        sts = [st for st in stages if st not in per]
        if sts:
            lacks.append("stage" + "s" * (len(sts) > 1) + " " + ", ".join(sts))
        gaps = [f"{st} at {c}" for st in stages if st in per for c in contexts if c not in per[st]]
        if gaps:
            lacks.append("stage " + ", ".join(gaps))
        if lacks:
            missing.append((label, "; ".join(lacks)))
    notes = []
    if missing:
        notes.append("Drawn: the contexts every source holds (" + (", ".join(map(str, contexts)) or "none")
                     + "); a context missing from one source is drawn for none. Missing from a source:")
        for label, lacks in missing:
            notes += textwrap.wrap(f"• {label}: {lacks}", 150, subsequent_indent="   ", break_long_words=False)
    line = 0.16  # inches per note line
    with plt.rc_context(STYLE):
        if not contexts or not stages:
            fig, ax = plt.subplots(figsize=(9.0, 1.6 + line * len(notes)))
            ax.set_axis_off()
            ax.text(0.5, 0.7, "no context is in every source: nothing can be set side by side",
                    ha="center", va="center", fontsize=9, transform=ax.transAxes)
            fig.suptitle(title, fontsize=9)
            for k, text in enumerate(notes):
                fig.text(0.01, 0.45 - k * line / fig.get_figheight(), text, fontsize=7, color="0.3", va="top")
            return fig
        cols = min(len(stages), max_cols)
        nrows = math.ceil(len(stages) / cols)
        height = 2.9 * nrows + 0.7 + line * len(notes)
        fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols + 0.8, height), squeeze=False)
        x = np.arange(len(contexts))
        step = min(0.12, 0.6 / max(1, len(sources)))
        for idx, st in enumerate(stages):
            ax = axes[idx // cols][idx % cols]
            absent = 0
            for i, (label, per) in enumerate(sources.items()):
                pts = per.get(st)
                style = series_marker(i)
                if pts is None:
                    absent += 1
                    ax.plot([], [], ls="-", lw=0.8, ms=5, label=label, **style)  # in the legend all the same
                    continue
                med, lo, hi = (np.array([pts.get(c, (np.nan,) * 3)[k] for c in contexts], dtype=float)
                               for k in range(3))
                err = [np.nan_to_num(np.clip(med - lo, 0, None)), np.nan_to_num(np.clip(hi - med, 0, None))]
                ax.errorbar(x + (i - (len(sources) - 1) / 2) * step, med, yerr=err, ls="-", lw=0.8, ms=5,
                            capsize=3, label=label, **style)
            ax.set_xticks(x, [str(c) for c in contexts], fontsize=7)
            ax.set_xlim(-0.5, len(contexts) - 0.5)
            ax.set_ylim(bottom=0)
            ax.set_title(f"stage {st}" + (f" · {names[st]}" if names.get(st) else "")
                         + (f"\nnot in {absent} of {len(sources)} sources (named below)" if absent else ""),
                         fontsize=8)
            if idx % cols == 0:
                ax.set_ylabel("µs per token (median, IQR)")
            if idx // cols == nrows - 1 or idx + cols >= len(stages):
                ax.set_xlabel("context (start position)")
        for idx in range(len(stages), nrows * cols):
            axes[idx // cols][idx % cols].set_axis_off()
        h, lab = axes[0][0].get_legend_handles_labels()
        # beside the panels: no marker sits under it
        fig.legend(h, lab, loc="upper left", bbox_to_anchor=(1.0, 0.93), frameon=False, fontsize=7)
        fig.suptitle(title, fontsize=9)
        for k, text in enumerate(notes):
            fig.text(0.01, (line * (len(notes) - k) + 0.05) / height, text, fontsize=7, color="0.3", va="top")
        fig.tight_layout(rect=(0, (line * len(notes) + 0.1) / height, 1, 1 - 0.35 / height))
    return fig


def trace_figure(kern, nvtx, meta: dict, first_layers: int = 2):
    """One token per stage on a shared µs axis: a host lane of NVTX ranges and a GPU lane of kernels coloured by
    cluster, up to the end of layer ``first_layers - 1``, each lane annotated with its kernels, busy time and span.
    ``kern``, ``nvtx``: the tables of :func:`ds4lab.jobs.trace.run`."""
    import pandas as pd

    from ..capture.annotate import _COLORS

    stages = list(meta.get("stages") or dict.fromkeys(kern["stage"]))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(11, 1.0 + 1.15 * len(stages)))
        yt, yl, seen, ends, labels = [], [], {}, [], []
        for i, st in enumerate(stages):
            k = kern[(kern["stage"] == st) & (kern["kind"] == "kernel")].sort_values("start_us")
            if k.empty:
                continue
            if "token" in k and k["token"].notna().any():
                k = k[k["token"] == k["token"].dropna().min()]
            if "layer" in k and k["layer"].notna().any():
                lay = pd.to_numeric(k["layer"], errors="coerce").to_numpy()
                past = (lay >= first_layers).nonzero()[0]  # the first kernel of a later layer ends the window
                k = k.iloc[: past[0]] if len(past) else k
            else:
                k = k.head(60)
            t0, t1 = float(k["start_us"].min()), float(k["end_us"].max())
            n = nvtx
            if not nvtx.empty:
                n = nvtx[(nvtx["stage"] == st) & (nvtx["end_us"] > t0) & (nvtx["start_us"] < t1)]
            n = n[~n["name"].isin(["token", "layer"])] if not n.empty else n
            t0 = min([t0] + ([float(n["start_us"].min())] if not n.empty else []))
            yh, yg = 2 * i, 2 * i + 1.0  # host lane above its GPU lane, stages top to bottom
            for r in n.itertuples():
                c = "#%06x" % _COLORS.get(r.cluster, 0x999999)
                ax.broken_barh([(r.start_us - t0, max(r.end_us - r.start_us, 0.05))],
                               (yh - 0.35 + 0.1 * min(r.depth, 3), 0.5), facecolors=c, alpha=0.45, linewidth=0)
            for r in k.itertuples():
                cl = r.cluster if isinstance(r.cluster, str) else "unlabelled"
                c = "#%06x" % _COLORS.get(cl, 0x999999)
                h = ax.broken_barh([(r.start_us - t0, max(r.end_us - r.start_us, 0.05))], (yg - 0.4, 0.8),
                                   facecolors=c, linewidth=0)
                seen.setdefault(cl, h)
            busy = float((k["end_us"] - k["start_us"]).sum())
            span = float(k["end_us"].max() - k["start_us"].min())
            last = float(k["end_us"].max()) - t0  # the lane's last bar ends here (bars are drawn from t0)
            ends.append(max([last] + ([float(n["end_us"].max()) - t0] if not n.empty else [])))
            # to the right of the lane's last bar, never over its bars
            labels.append((last, ax.annotate(
                f"{len(k)} kernels · busy {busy:.0f} µs of {span:.0f} µs ({100 * busy / span if span else 0:.0f} %)",
                (last, yg), xytext=(4, 0), textcoords="offset points", va="center", ha="left", fontsize=8,
                gid=f"trace-label-{st}", in_layout=False)))
            yt += [yg, yh]
            yl += [f"stage {st} · GPU", f"stage {st} · host NVTX"]
        ax.set_yticks(yt)
        ax.set_yticklabels(yl)
        ax.invert_yaxis()
        if ends:
            ax.set_xlim(0, max(ends) * 1.05)
        ax.set_xlabel("µs from the token's first launch (each stage from its own)")
        ax.grid(axis="y", visible=False)
        if seen:
            ax.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                      title="cluster", frameon=False)
        ax.set_title(provenance_title(meta, f"one decode token, embedding + first {first_layers} layer(s): "
                                            "kernels and launch gaps by stage"))
        fig.tight_layout()
        if labels:  # widen the x axis until every label, right of its lane's last bar, ends inside the axes
            r = fig.canvas.get_renderer() if hasattr(fig.canvas, "get_renderer") else fig._get_renderer()
            width = ax.get_window_extent(r).width
            lo, hi = ax.get_xlim()
            for x, t in labels:  # a label's width in pixels does not change with the limits; x's position does
                w = t.get_window_extent(r).width + 4 * fig.dpi / 72 + 6  # the text, its 4-point offset, a margin
                if width > w:
                    hi = max(hi, lo + (x - lo) * width / (width - w))
            ax.set_xlim(lo, hi * 1.01)
    return fig


def ncu_sites_figure(sources: dict, top: int = 16):
    """Per launch site, the median DRAM throughput in % of peak that Nsight Compute measured, one bar per source, for
    the ``top`` sites by kernel time. ``sources``: label → a :func:`ds4lab.trace.sources.ncu.per_site` table."""
    import pandas as pd

    allf = pd.concat([df.assign(site=df["cluster"].astype(str) + "/" + df["op"].astype(str), source=label)
                      for label, df in sources.items()], ignore_index=True)
    w = pd.to_numeric(allf.get("total_us", pd.Series(1.0, index=allf.index)), errors="coerce").fillna(0)
    order = allf.assign(w=w).groupby("site")["w"].sum().sort_values(ascending=False).index[:top].tolist()
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(11, 1.2 + 0.32 * len(order) * max(1, len(sources)) ** 0.5))
        h = 0.8 / max(1, len(sources))
        y = np.arange(len(order))
        for i, (label, d) in enumerate(allf.groupby("source", sort=False)):
            v = d.groupby("site")["dram_pct"].median().reindex(order)
            ax.barh(y + i * h, v.to_numpy(dtype=float), height=h, label=label, **series_style(i))
        ax.set_yticks(y + h * (len(sources) - 1) / 2)
        ax.set_yticklabels(order, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("DRAM throughput, % of peak (median over launches; ncu SpeedOfLight)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        ax.set_title(f"achieved fraction of DRAM bandwidth per launch site, the {len(order)} sites with the most "
                     "kernel time — measured by Nsight Compute (clocks locked to base)")
        fig.tight_layout()
    return fig


def launches_figure(scan):
    """Kernel launches per token by position from a :class:`ds4lab.experiments.launch_list.LaunchScan`: consecutive
    tokens, and anchor positions with each launch-shape change marked. Counts, not times."""
    from ..experiments.launch_list import shape

    launches, window = scan.launches, scan.window
    colors = {t: COLORS[i % len(COLORS)] for i, t in enumerate(sorted(set(launches.token) | set(window.token)))}
    with plt.rc_context(STYLE):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.5]})
        for t, g in window.groupby("token"):
            a1.scatter(g.position, g.kernels, s=10, color=colors[t], label=t)
        a1.set_xlabel("position (consecutive tokens)")
        a1.set_ylabel("kernel launches per token")
        a1.set_title(f"{len(window)} consecutive tokens (n_comp {window['n_comp (ratio 4)'].min()}–"
                     f"{window['n_comp (ratio 4)'].max()})", fontsize=9)
        for t, g in launches.groupby("token"):
            a2.plot(g.position, g.kernels, marker="o", ms=3, drawstyle="steps-post", color=colors[t], label=t)
        for nb in scan.changes:
            x = 4 * nb + 3  # the first position with n_comp = nb + 1
            if x < scan.max_context:
                a2.axvline(x, color="0.6", linestyle=":", linewidth=0.8)
                (r0, _), (r1, n1) = shape(nb, scan.top_k), shape(nb + 1, scan.top_k)
                a2.text(x, 1.0, " " + (r1 if r1 != r0 else f"{n1} top-k launches"),
                        transform=a2.get_xaxis_transform(), rotation=90, va="top", ha="left", fontsize=7,
                        color="0.35")
        a2.set_xscale("log", base=2)
        a2.set_xlabel("position (log; dotted: top-k regime changes of the ratio-4 layers)")
        a2.set_title("across the top-k regimes", fontsize=9)
        a2.legend(loc="lower right", fontsize=8, frameon=False)
        fig.suptitle(f"launches per token by position — counted by the launch census (the launch list, the same "
                     f"on every backend; not timed) · {scan.preset}, long context", fontsize=10)
        fig.tight_layout()
    return fig


def detach(view):
    """``view`` closed in pyplot when it is a Figure (still drawable), so a cell shows it once."""
    from matplotlib.figure import Figure

    if isinstance(view, Figure):
        plt.close(view)
    return view
