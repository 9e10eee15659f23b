"""A calibration at ds4's own costs from measured ``ds4lab ds4`` folders (``calibrate --from-ds4``, no GPU:
:func:`fit_from_ds4`, checked against ds4), and ds4lab's token at other host costs (:func:`host_whatif`). Every sim
figure is MODELED. Next: ``docs/calibration.md``, "--from-ds4"."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..report import results
from .modeled import sim_context
from .record import TOLERANCE


#: ds4's configurations (``ds4lab ds4``) each ds4lab stage models: eager is islands off, stage i is
#: ds4's islands as they ship.
DS4_STAGE_OF = {"islands-off": "0", "islands-on": "i"}


def read_ds4_folder(folder: Path):
    """``(meta, summary, census)`` of a ``ds4lab ds4`` folder. Raises ValueError naming what is missing."""
    import pandas as pd

    meta = results.read_meta(folder) or {}
    if meta.get("job") != "ds4":
        why = (f"its meta.json names job {meta['job']!r}" if meta.get("job") else "no ds4lab meta.json there")
        raise ValueError(f"{folder}: not a ds4lab ds4 folder ({why})")
    status = str(meta.get("status", ""))
    if status != "complete" and not (folder / "census.csv").is_file():
        raise ValueError(f"{folder}: the ds4 run did not finish (meta.json status {status[:200]!r}): nothing to fit")
    need = {"summary.csv": ("config", "context", "us_per_token"),
            "census.csv": ("config", "context", "launch_calls", "graph_launches", "busy_us", "enqueue_us")}
    tables = []
    for name, cols in need.items():
        p = folder / name
        if not p.is_file():
            raise ValueError(f"{p}: missing (a ds4lab ds4 run with --trace-contexts records the census)")
        d = pd.read_csv(p)
        lacks = [c for c in cols if c not in d.columns]
        if lacks:
            raise ValueError(f"{p}: lacks {', '.join(lacks)}")
        tables.append(d)
    summary, census = tables
    for cfg in DS4_STAGE_OF:
        if not (census.config == cfg).any():
            raise ValueError(f"{folder / 'census.csv'}: no recorded {cfg} tokens (run ds4lab ds4 with both "
                             "islands-off and islands-on)")
    return meta, summary, census


def as_folders(folders) -> list[Path]:
    """``folders`` (a path or several) as a list of Paths; ValueError for none, or a folder named twice."""
    got = [Path(folders)] if isinstance(folders, (str, Path)) else [Path(f) for f in folders]
    if not got:
        raise ValueError("--from-ds4: no ds4lab ds4 folder given")
    twice = sorted({str(f) for f in got if sum(g.resolve() == f.resolve() for g in got) > 1})
    if twice:
        raise ValueError(f"--from-ds4 {', '.join(twice)}: a folder given more than once")
    return got


def fit_from_ds4(base: dict, folder, *, preset: str = "ds4-flash", tokens: int = 32, stages: str = "0,i,3,3cc,3ccp"):
    """A calibration pricing ds4lab's launch list at ds4's own costs, fitted from measured ``ds4lab ds4`` folders:
    ``host_launch_us``, ``host_graph_call_us``, ``eager_gap_us``, the kernel time factor per recorded context; then the
    sim's context ladder with it beside ds4's measured µs (``docs/calibration.md``, "--from-ds4").

    Args:
        base: the calibration to extend (parsed, valid).
        folder: one ``ds4lab ds4`` folder, or several (their recorded tokens pooled).
        preset, stages, tokens: the sim's token, stages and timed tokens per stage and context.

    Returns:
        ``(calibration dict, fits table, check table)``: fits ``figure``, ``context``, ``value``, ``folder``; the check
        per context: ``ds4``, ``stage``, ``measured_us``, ``modeled_us``, ``ratio``, ``agrees``, ``gain_over_i_us``,
        ``folder``, ``kernel_time_scale``, ``sample`` (fitted or held out).

    Raises:
        ValueError: no folder, a folder given twice, not a ds4 folder, a missing table or configuration (each named)."""
    import pandas as pd

    from ..sim.costmodel import Calibration

    folders = as_folders(folder)
    metas, summaries, censuses = [], [], []
    for f in folders:
        meta, summary, census = read_ds4_folder(f)
        metas.append(meta)
        summaries.append(summary.assign(folder=str(f)))
        censuses.append(census.assign(folder=str(f)))
    summary, census = pd.concat(summaries, ignore_index=True), pd.concat(censuses, ignore_index=True)
    off = census[census.config == "islands-off"]
    fits: list[dict] = []
    out = _host_fits(base, off, census[census.config == "islands-on"], fits)
    trace_ctx = sorted(int(c) for c in set(off.context))
    ratios = _kernel_scales(out, off, trace_ctx, preset, tokens)
    which = [",".join(sorted(set(off[off.context == c].folder))) if len(folders) > 1 else str(folders[0])
             for c in trace_ctx]
    out["kernel_time_scale"] = round(_put(fits, "kernel_time_scale", ratios, trace_ctx, which), 4)
    if len(trace_ctx) > 1:
        out["kernel_time_scale_by_context"] = [[c, round(r, 4)] for c, r in zip(trace_ctx, ratios)]
    _name(out, base, folders, metas, fitted="kernel_time_scale" + (" by context" if len(trace_ctx) > 1 else ""))
    check = _check_against_ds4(out, Calibration.load(out), summary, folders, trace_ctx, preset, stages, tokens)
    return out, pd.DataFrame(fits), check


def _put(fits: list, figure: str, values, ctx, where) -> float:
    """Add one row per fitted value to ``fits``; returns their median."""
    fits.extend({"figure": figure, "context": int(c), "value": float(v), "folder": w}
                for v, c, w in zip(values, ctx, where))
    return float(np.median(list(values)))


def _host_fits(base: dict, off, on, fits: list) -> dict:
    """``base`` with the three host constants fitted from ds4's tokens islands ``off`` and ``on``."""
    out = dict(base)
    out.pop("kernel_time_scale_by_context", None)
    h = _put(fits, "host_launch_us", off.enqueue_us / off.launch_calls, off.context, off.folder)
    out["host_launch_us"] = round(h, 3)
    g = on[on.graph_launches > 0]
    if len(g):
        call = (g.enqueue_us - g.launch_calls * h) / g.graph_launches - float(base["host_graph_launch_us"])
        out["host_graph_call_us"] = round(max(0.0, _put(fits, "host_graph_call_us", call, g.context, g.folder)), 3)
    ahead = off[off.enqueue_us < off.span_us]
    if len(ahead):
        gap = (ahead.span_us - ahead.busy_us) / (ahead.kernels - 1).clip(lower=1)
        out["eager_gap_us"] = round(max(0.0, _put(fits, "eager_gap_us", gap, ahead.context, ahead.folder)), 3)
    return out


def _kernel_scales(cal: dict, off, contexts: list[int], preset: str, tokens: int) -> list[float]:
    """Per recorded context, ds4's median kernel-busy µs (islands off) over the sim's busy floor at factor 1."""
    lab = sim_context({**cal, "kernel_time_scale": 1.0}, preset, "0", contexts, tokens)
    lab_busy = lab.set_index("context")["floor_us"]
    return [float(np.median(off[off.context == c].busy_us)) / float(lab_busy.loc[c]) for c in contexts]


def _name(out: dict, base: dict, folders, metas, fitted: str) -> None:
    """``out``'s ``name`` and ``source``: the ds4 commits, GPUs and drivers it was fitted from."""
    commits = list(dict.fromkeys(str(m.get("ds4_commit") or "ds4") for m in metas))
    out["name"] = f"{base.get('name', 'calibration')} at ds4's costs ({'+'.join(commits)})"
    out["source"] = (f"{base.get('source', '')}; host constants and {fitted} fitted from ds4 itself by "
                     "ds4lab calibrate " + " ".join(f"--from-ds4 {f}" for f in folders) + " (" +
                     "; ".join(f"ds4 {m.get('ds4_commit', '?')}, {m.get('gpu', '?')}, driver {m.get('driver', '?')}"
                               + ("" if m.get("status") == "complete" else
                                  f", a run that did not finish: status {str(m.get('status', ''))[:80]!r}")
                               for m in metas) + ")")


def _check_against_ds4(out: dict, cal, summary, folders, trace_ctx, preset: str, stages: str, tokens: int):
    """The check table: the sim with ``out`` beside ds4's measured µs per token at every context."""
    import pandas as pd

    contexts = sorted(int(c) for c in set(summary.context))
    modeled = sim_context(out, preset, stages, contexts, tokens)
    rows = []
    for c in contexts:
        m = modeled[modeled.context == c].set_index("stage")["us_median"]
        sample = ("fitted" if c in trace_ctx else
                  "held out (interpolated)" if trace_ctx[0] < c < trace_ctx[-1] else "held out (extrapolated)")
        where = {"kernel_time_scale": cal.scale_at(c), "sample": sample}
        for f in folders:
            for cfg, stage in DS4_STAGE_OF.items():
                meas = summary[(summary.folder == str(f)) & (summary.config == cfg) & (summary.context == c)]
                if meas.empty or stage not in m.index:
                    continue
                mu = float(meas.us_per_token.iloc[0])
                rows.append({"context": c, "ds4": cfg, "stage": stage, "measured_us": mu,
                             "modeled_us": float(m[stage]), "ratio": float(m[stage]) / mu,
                             "agrees": abs(float(m[stage]) / mu - 1) <= TOLERANCE, "folder": str(f), **where})
        for stage in [s for s in m.index if s not in DS4_STAGE_OF.values()]:
            rows.append({"context": c, "ds4": "", "stage": stage, "measured_us": float("nan"),
                         "modeled_us": float(m[stage]), "ratio": float("nan"), "agrees": None,
                         "gain_over_i_us": float(m["i"] - m[stage]) if "i" in m.index else float("nan"),
                         "folder": "", **where})
    return pd.DataFrame(rows)


def host_whatif(contexts=(1024,), host_launch_us=(3.2,), *, preset: str = "ds4-flash", stages: str = "0,i,3",
                tokens: int = 8, calibration=None):
    """ds4lab's token on the sim, eager launches priced at the shipped host cost and at each of ``host_launch_us``,
    MODELED: :func:`sim_context`'s rows with ``host_launch_us``, ``host``, ``speedup``."""
    import pandas as pd

    from ..sim.calibration import read
    from ..sim.costmodel import default_calibration_path

    base = read(Path(calibration) if calibration else default_calibration_path())
    rows = []
    for h in (None, *host_launch_us):
        cal = dict(base) if h is None else {**base, "host_launch_us": float(h)}
        t = sim_context(cal, preset, stages, contexts, tokens)
        label = (f"ds4lab's Python launch layer ({base['host_launch_us']:.1f} µs per launch, calibration)"
                 if h is None else f"{float(h):.1f} µs per launch")
        t = t.assign(host_launch_us=cal["host_launch_us"], host=label)
        s0 = t[t.stage == "0"].set_index("context")["us_median"]
        t["speedup"] = t.apply(lambda r: s0.get(r.context, float("nan")) / r.us_median, axis=1)
        rows.append(t)
    return pd.concat(rows, ignore_index=True)


def host_whatif_figure(table, preset: str):
    """:func:`host_whatif`'s µs per token as grouped bars (MODELED), stages that captured several graphs noted."""
    from ..report import plots

    x = table["stage"] + " @" + table["context"].astype(str)
    recaptured = table[(table["captures"] > 1) & (table["host"] == table["host"].iloc[0])]
    note = "; ".join(f"{r.stage} @{r.context}: {r.captures} graphs captured over its warm-up and timed tokens (one "
                     "per new token shape), its median mixes captures and replays" for r in recaptured.itertuples())
    return plots.grouped_bars_figure(
        {h: dict(zip(x[g.index], g["us_median"])) for h, g in table.groupby("host")}, list(dict.fromkeys(x)),
        "µs per token (MODELED)", f"ds4lab's {preset} token at two host costs per launch — MODELED (sim)",
        rotate=False, note=note or None)
