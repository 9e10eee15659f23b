"""Per-launch-site roofline of one decode token (``ds4lab bench --per-op``; GPU only): per site the launches, bytes,
GPU µs (CUPTI records, else each launch re-issued behind a spin kernel: :func:`per_op_times`), GB/s, fraction of the
copy bandwidth and time lost against it, sorted by time lost. Next: ``docs/commands.md``, "bench --per-op"."""

from __future__ import annotations

import numpy as np

#: CSV columns of the per-site table, in order.
SITE_COLUMNS = ("cluster", "site", "kernel", "launches", "bytes", "us", "us_p25", "us_p75", "GBps",
                "copy_fraction", "floor_us", "lost_us")


def _cupti_launch_us(be, model, pos: int, token_id: int, tokens: int, n_launch: int, names: list[str]):
    """µs per launch ``[tokens, n_launch]`` from CUPTI records of eager tokens, or ``(None, reason)``."""
    from ..trace.cupti import KERNEL_KINDS, CuptiSession, cupti_available

    ok, why = cupti_available()
    if not ok:
        return None, why
    try:
        sub = CuptiSession.get().subscribe(KERNEL_KINDS)
    except Exception as e:  # the library loads but the activity API refuses (driver, permissions)
        return None, f"CUPTI did not start ({type(e).__name__}: {e})"
    try:
        out = np.empty((tokens, n_launch))
        for t in range(tokens):
            model.token(pos + t, token_id)
            be.synchronize()
            recs = sorted((r for r in sub.take() if r.kind == "kernel"), key=lambda r: r.start_ns)
            if len(recs) != n_launch:
                return None, f"CUPTI gave {len(recs)} kernel records for a {n_launch}-launch token"
            got = [r.name for r in recs]
            if got != names:
                i = next(i for i, (a, b) in enumerate(zip(got, names)) if a != b)
                return None, f"CUPTI record {i} is {got[i]!r}, the trace has {names[i]!r}"
            out[t] = [r.dur_ns * 1e-3 for r in recs]
        return out, "cupti"
    finally:
        sub.close()


def per_op_times(be, model, pos: int = 1000, token_id: int = 7, repeats: int = 20):
    """GPU time of every launch of one token, each re-issued ``repeats`` times behind a spin kernel between two CUDA
    events (mean per launch). Columns: cluster, layer, site, kernel, nbytes, us."""
    import cupy
    import pandas as pd

    from ..timing import event_ms

    with model.L.recording() as trace:
        model.token(pos, token_id)
    be.synchronize()
    st = cupy.cuda.Stream(non_blocking=True)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    spin = be.function("spin_wait")
    rows = []
    for r in trace:
        fn = be.function(r.kernel)
        fn(r.grid, r.block, r.args, r.shared, st)  # warm
        # The GPU spins while the host queues the repeats, so they run back to back and the
        # event pair measures kernel time, not the host's launch rate.
        spin((1,), (1,), (np.int64(20_000 + 8_000 * repeats),), 0, st)
        e0.record(st)
        for _ in range(repeats):
            fn(r.grid, r.block, r.args, r.shared, st)
        e1.record(st)
        rows.append({"cluster": r.cluster, "layer": r.layer, "site": r.site, "kernel": r.kernel,
                     "nbytes": r.nbytes, "us": event_ms(e0, e1) * 1e3 / repeats})
    return pd.DataFrame(rows)


def token_launches(be, model, *, pos: int = 1000, token_id: int = 7, tokens: int = 7, method: str = "auto"):
    """One row per launch of a token (cluster, layer, site, kernel, nbytes, us median over ``tokens``, us_p25,
    us_p75) and the method used. ``method``: ``"auto"``, ``"cupti"`` (RuntimeError without it) or ``"events"``."""
    import pandas as pd

    if method not in ("auto", "cupti", "events"):
        raise ValueError(f"method {method!r}: choose auto, cupti or events")
    L = model.L
    model.token(pos - 1, token_id)  # warm-up: every kernel compiled and loaded
    be.synchronize()
    with L.recording() as trace:
        model.token(pos, token_id)
    be.synchronize()
    names = [r.kernel for r in trace]
    why = "events requested"
    if method != "events":
        us, why = _cupti_launch_us(be, model, pos, token_id, tokens, len(trace), names)
        if us is not None:
            p25, med, p75 = np.percentile(us, [25, 50, 75], axis=0)
            df = pd.DataFrame({"cluster": [r.cluster for r in trace], "layer": [r.layer for r in trace],
                               "site": [r.site for r in trace], "kernel": names,
                               "nbytes": [r.nbytes for r in trace], "us": med, "us_p25": p25, "us_p75": p75})
            return df, "cupti"
        if method == "cupti":
            raise RuntimeError(f"per-op timing with CUPTI: {why}")
    df = per_op_times(be, model, pos=pos, token_id=token_id)
    df["us_p25"] = df["us"]
    df["us_p75"] = df["us"]
    return df, f"events ({why})"


def site_table(launches, copy_GBps: float):
    """Per-site roofline from :func:`token_launches` rows (columns :data:`SITE_COLUMNS`), sorted by ``lost_us`` (µs
    over the bytes-moved floor at ``copy_GBps``), largest first."""
    g = launches.groupby(["cluster", "site", "kernel"], sort=False)
    df = g.agg(launches=("us", "size"), bytes=("nbytes", "sum"), us=("us", "sum"),
               us_p25=("us_p25", "sum"), us_p75=("us_p75", "sum")).reset_index()
    df["GBps"] = df["bytes"] / (df["us"] * 1e-6) / 1e9
    df["copy_fraction"] = df["GBps"] / copy_GBps
    df["floor_us"] = df["bytes"] / (copy_GBps * 1e9) * 1e6
    df["lost_us"] = df["us"] - df["floor_us"]
    return df.sort_values("lost_us", ascending=False).reset_index(drop=True)[list(SITE_COLUMNS)]


def token_summary(launches, copy_GBps: float) -> dict:
    """GPU-busy µs of one token, its bytes, the bytes-moved floor at ``copy_GBps``, busy / floor, the launch count."""
    busy = float(launches["us"].sum())
    nbytes = int(launches["nbytes"].sum())
    floor = nbytes / (copy_GBps * 1e9) * 1e6
    return {"token_busy_us": busy, "token_bytes": nbytes, "bytes_floor_us": floor,
            "busy_over_floor": busy / floor if floor else float("nan"), "launches": int(len(launches))}


def roofline_figure(sites, summary: dict, meta: dict, top: int = 20):
    """Bars of the ``top`` sites by time lost: µs per token (IQR) beside the bytes floor, with the copy fraction."""
    import matplotlib.pyplot as plt

    from ..report.plots import STYLE, provenance_title

    d = sites.head(top).iloc[::-1]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(d) + 1.6))
        y = np.arange(len(d))
        err = [d["us"] - d["us_p25"], d["us_p75"] - d["us"]]
        ax.barh(y + 0.2, d["us"], height=0.4, xerr=err, color="#C44E52", label="measured µs / token")
        ax.barh(y - 0.2, d["floor_us"], height=0.4, color="#4C72B0", label="bytes / copy bandwidth")
        for yi, (us, fr) in enumerate(zip(d["us"], d["copy_fraction"])):
            ax.text(us, yi + 0.2, f" {fr:.0%}", va="center", fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels([f"{c}/{s} ({k}) ×{n}" for c, s, k, n in
                            zip(d["cluster"], d["site"], d["kernel"], d["launches"])], fontsize=8)
        ax.set_xlabel("µs per token")
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title(provenance_title(
            meta, f"per-site roofline: busy {summary['token_busy_us']:,.0f} µs, floor "
                  f"{summary['bytes_floor_us']:,.0f} µs ({summary['busy_over_floor']:.2f}×)"), fontsize=9)
        fig.tight_layout()
    return fig


def run_per_op(be, cfg, console=None, outputs: dict | None = None, *, copy_GBps: float | None = None,
               tokens: int = 7, method: str = "auto", meta: dict | None = None, replayed: bool = True) -> dict:
    """Per-site roofline of one ``cfg`` token (vocabulary on), printed and, with ``outputs``, kept as tables
    ``per_op``, ``per_op_launches`` and figure ``per_op``. With ``replayed``, the floors first
    (:func:`ds4lab.experiments.floors.token_floors`) and µs from the replayed tokens where they match the launch
    list; else eager tokens by ``method``. ``copy_GBps``: default a fresh measurement. Returns the token summary with
    ``method``, ``copy_GBps``, the floors (under ``floors`` and :data:`ds4lab.experiments.floors.SUMMARY_KEYS` at the
    top) and the site records."""
    from ..report import provenance
    from ..token.model import DecodeModel, TokenOptions
    from ..timing import copy_bandwidth
    from ..experiments import floors as FL

    meta = dict(meta or provenance.base_meta(be))
    meta.setdefault("preset", cfg.name)
    if copy_GBps is None:
        copy_GBps = copy_bandwidth().median
    model = DecodeModel(cfg, be, TokenOptions(vocab=True))
    fl = None
    if replayed:
        fl = FL.token_floors(be, model, copy_measured=copy_GBps, tokens=max(tokens, 5))
        model.executor = None
    if fl is not None and fl.launches is not None:
        launches, used = fl.launches, "cupti-replay"
    else:
        launches, used = token_launches(be, model, tokens=tokens, method=method)
    del model
    sites = site_table(launches, copy_GBps)
    summary = token_summary(launches, copy_GBps)
    summary.update({"method": used, "copy_GBps": copy_GBps, "tokens": tokens})
    if fl is not None:
        fs = fl.summary()
        summary["floors"] = fs
        summary.update({k: fs.get(k) for k in FL.SUMMARY_KEYS})
    else:
        summary.update(FL.kernel_figures(launches, copy_GBps))
    if console is not None:
        from rich.table import Table

        t = Table(title=f"per-site roofline, {cfg.name} ({used}) — {provenance.label(meta)}")
        for c in ("site", "kernel", "×", "MB", "µs", "GB/s", "of copy", "lost µs"):
            t.add_column(c, justify="left" if c in ("site", "kernel") else "right")
        for r in sites.head(25).itertuples():
            t.add_row(f"{r.cluster}/{r.site}", r.kernel, f"{r.launches}", f"{r.bytes / 1e6:.1f}", f"{r.us:.1f}",
                      f"{r.GBps:.0f}", f"{r.copy_fraction:.0%}", f"{r.lost_us:.1f}")
        console.print(t)
        if fl is not None:
            console.print(floors_table(summary["floors"], f"floors of one {cfg.name} token — {provenance.label(meta)}"))
        else:
            console.print(f"token: GPU-busy {summary['token_busy_us']:,.0f} µs over {summary['launches']} launches, "
                          f"{summary['token_bytes'] / 1e9:.2f} GB, floor {summary['bytes_floor_us']:,.0f} µs at "
                          f"{copy_GBps:,.0f} GB/s: busy / floor = {summary['busy_over_floor']:.2f}")
    if outputs is not None:
        outputs.setdefault("tables", {}).update(per_op=sites, per_op_launches=launches)
        outputs.setdefault("figures", {})["per_op"] = roofline_figure(sites, summary, meta)
    import json

    summary["sites"] = json.loads(sites.to_json(orient="records"))  # plain floats and ints
    return summary


def floors_table(fs: dict, title: str):
    """A rich table of :meth:`ds4lab.experiments.floors.TokenFloors.summary`: busy time, floors, t_min, efficiencies."""
    from rich.table import Table

    def us(v):
        return "—" if v is None else f"{v:,.1f} µs"

    def eff(d):
        if not d or d.get("efficiency") is None:
            return "—"
        return f"{d['efficiency']:.2f} ({d['over_floor']:.2f}×)" + (" FLOOR BEATEN" if d["floor_beaten"] else "")

    t = Table(title=title)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("source")
    rows = [("busy per replayed token (union of kernel records)", us(fs["token_busy_us"]), fs["busy_source"]),
            ("replayed µs per token (events)", us(fs["token_replay_us"]), fs["t_min_source"]),
            ("bytes floor", us(fs["bytes_floor_us"]), f"{fs['token_bytes'] / 1e9:.2f} GB at {fs['copy_GBps']:,.0f} GB/s"),
            ("t_min (empty kernel, replay per kernel)", us(fs["t_min_us"]), f"graph of {fs['kernels']} kernels"),
            ("t_min_kernel (its traced duration)", us(fs["t_min_kernel_us"]), fs["busy_source"]),
            ("launch-list floor Σ max(bytes/bw, t_min)", us(fs["launch_floor_us"]),
             f"{fs['t_min_bound_kernels']} kernels at t_min"),
            ("launch-list floor with t_min_kernel (bounds busy)", us(fs["launch_floor_busy_us"]), ""),
            ("efficiency: bytes floor / busy", eff(fs["busy_vs_bytes_floor"]), ""),
            ("efficiency: launch-list floor / busy", eff(fs["busy_vs_launch_floor"]), ""),
            ("efficiency: launch-list floor (t_min_kernel) / busy", eff(fs["busy_vs_launch_floor_busy"]), ""),
            ("efficiency: launch-list floor / replayed µs", eff(fs["replay_vs_launch_floor"]), ""),
            ("large kernels (≥ 8 MB): fraction of copy", "—" if fs.get("large_kernel_copy_fraction") is None
             else f"{fs['large_kernel_copy_fraction']:.2f}", f"{fs.get('large_kernels', 0)} kernels"),
            ("attention µs per layer", us(fs.get("attention_us_per_layer")), "")]
    for r in rows:
        t.add_row(*r)
    return t
