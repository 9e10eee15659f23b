"""``ds4lab calibrate``: the sim's cost-model parameters measured on this GPU
(:func:`ds4lab.measure.calibrate.calibrate`), or, with no GPU, the tiled MoE kernels fitted from a
measured ``ds4lab moe`` folder (:func:`ds4lab.measure.calibrate.fit_tiled_moe`) or the host
constants from measured ladders (:func:`ds4lab.measure.calibrate.fit_host_from_ladder`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..measure.calibrate import (calibrate, calibrate_long_context, fit_host_from_ladder, fit_tiled_moe,
                                 write_calibration)
from ..sim.costmodel import default_calibration_path
from .common import BadInput, default_preset
from .result import JobResult, no_folder
from .sim_runs import sim_context


@dataclass
class CalibrateConfig:
    """Arguments of ``ds4lab calibrate``: ``preset`` whose eager tokens and kernels are measured;
    ``out`` the calibration file to write; ``moe_profile`` a ``ds4lab moe`` folder (no GPU: add
    tiled-kernel fits to ``base``, default the shipped calibration)."""

    preset: str | None = None
    out: Path | str = "results/calibration.json"
    moe_profile: Path | str | None = None
    base: Path | str | None = None
    #: GPU: refit the long-context token's kernels in ``base`` (lines over positions 4 095, 16 383 and
    #: 65 535: :data:`ds4lab.measure.calibrate.LONG_CONTEXT_POSITIONS`).
    long_context: bool = False
    #: No GPU: measured ``ds4lab ladder``/``context`` folders whose host times refit ``base``'s
    #: ``host_launch_us`` and ``host_node_update_us``.
    from_ladder: tuple = ()
    #: No GPU: measured ``ds4lab ds4`` folders (one path, or a tuple of them) whose host and kernel
    #: costs price ds4lab's launch list (:func:`fit_from_ds4`: one kernel time factor per recorded
    #: context), checked against ds4's measured islands off and on.
    from_ds4: Path | str | tuple | None = None
    #: No GPU: a measured ``ds4lab context`` folder of stages 3, 3p and 3cc whose paired gains over
    #: stage 3 refit ``base``'s ``pdl_edge_us`` and ``graph_conditional_us``
    #: (:func:`ds4lab.jobs.fit_capture_stages.fit_capture_stages`).
    from_context: Path | str | None = None


def check_config(cfg: CalibrateConfig) -> None:
    """Checks that need no GPU, before any work: ``out`` is not a shipped calibration (nor any file
    in ds4lab's data folder), not a folder; ``base`` (with ``moe_profile`` or ``long_context``) is a
    valid calibration (:func:`ds4lab.sim.calibration.read`: every key against the schema).

    Raises:
        ds4lab.errors.CalibrationError: a shipped ``out``, or an invalid ``base`` (names the file
            and every bad key; exit 2).
        BadInput: ``out`` is a folder.
    """
    from ..sim.calibration import read, refuse_shipped

    out = Path(cfg.out)
    refuse_shipped(out)
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder: name the calibration file to write")
    modes = [m for m, on in (("--moe-profile", cfg.moe_profile is not None), ("--long-context", cfg.long_context),
                             ("--from-ladder", bool(cfg.from_ladder)), ("--from-ds4", cfg.from_ds4 is not None),
                             ("--from-context", cfg.from_context is not None))
             if on]
    if len(modes) > 1:
        raise BadInput(f"{' and '.join(modes)}: choose one way to extend --base per run")
    if modes:
        read(Path(cfg.base) if cfg.base else default_calibration_path())


def _replaceable(path: Path) -> str | None:
    """None when the file at ``path`` is a calibration (ds4lab may replace it), else why not."""
    import json

    try:
        d = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return f"{path} is not a calibration file (not JSON)"
    if not (isinstance(d, dict) and "name" in d and "host_launch_us" in d):
        return f"{path} is not a calibration file (no name and host_launch_us keys)"
    return None


def _check_against(cal: dict, folders, console) -> list:
    """Print the sim's modeled stages with ``cal`` against each measured folder
    (:func:`ds4lab.jobs.sim_check.modeled_vs_measured`); returns the tables, one per folder."""
    from rich.table import Table

    from .sim_check import TOLERANCE, modeled_vs_measured

    found = []
    for folder in folders:
        d = modeled_vs_measured(folder, cal)
        found.append(d)
        changed = d.attrs.get("preset_changes") or {}
        if changed:
            console.print(f"[yellow]{folder}: its {d['preset'].iloc[0]} is not today's (" +
                          "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in changed.items()) +
                          "): the sim models today's token, so the ratios below compare two tokens[/]")
        t = Table(title=str(folder), caption="modeled (sim, this calibration) / measured, stage by stage")
        for c in ("context", "stage", "measured µs", "modeled µs", "ratio", f"within ±{TOLERANCE:.0%}"):
            t.add_column(c, justify="left" if c in ("stage", "") else "right")
        for r in d.itertuples():
            t.add_row(str(r.context), r.stage, f"{r.measured_us:,.0f}", f"{r.modeled_us:,.0f}", f"{r.ratio:.3f}",
                      "yes" if r.agrees else f"OUTSIDE ±{TOLERANCE:.0%}")
        console.print(t)
    return found


def _print_ds4_check(check, console) -> None:
    """The sim with a ``--from-ds4`` calibration beside ds4: modeled / measured per context and stage,
    the kernel time factor each context was priced at and whether that context was fitted (recorded)
    or held out (the check table of :func:`fit_from_ds4`; a ``folder`` column with several folders)."""
    from rich.table import Table

    folders = "folder" in check and check.folder[check.folder != ""].nunique() > 1
    t = Table(title="the sim at ds4's costs against ds4 itself",
              caption="stage 0 ↔ islands off, i ↔ islands on (measured); 3, 3cc, 3ccp: MODELED, what ds4 does not "
                      "ship; held out: a context whose kernel time factor was not fitted there")
    cols = ("context", "context is", "kernel factor", "stage", "ds4", "measured µs", "modeled µs", "ratio",
            "within ±10 %", "gain over i µs")
    for c in (("folder",) if folders else ()) + cols:
        t.add_column(c, justify="left" if c in ("folder", "context is", "stage", "ds4") else "right")
    for r in check.to_dict("records"):
        meas = r["measured_us"] == r["measured_us"]  # not NaN
        t.add_row(*((str(r.get("folder") or ""),) if folders else ()), str(r["context"]), str(r.get("sample", "")),
                  f"{r['kernel_time_scale']:.4f}" if "kernel_time_scale" in r else "",
                  r["stage"], r["ds4"] or "—", f"{r['measured_us']:,.0f}" if meas else "—",
                  f"{r['modeled_us']:,.0f}", f"{r['ratio']:.3f}" if meas else "—",
                  ("yes" if r["agrees"] else "OUTSIDE") if meas else "MODELED",
                  f"{r['gain_over_i_us']:,.0f}" if r.get("gain_over_i_us") == r.get("gain_over_i_us")
                  and r.get("gain_over_i_us") is not None else "")
    console.print(t)


def run(cfg: CalibrateConfig, be, console) -> JobResult:
    """Measure on ``be`` (a GPU) and write ``cfg.out``; with ``moe_profile`` or ``from_ladder``,
    ``be`` is unused (None is fine) and the fits are added to ``base`` (``from_ladder``: then the
    sim with the new file is compared with each folder, stage by stage). Returns the
    :class:`~ds4lab.jobs.result.JobResult`: the calibration written is its ``value`` and its one
    file; ``from_ladder`` adds the tables ``host_fit`` and, per folder, ``check-<n>`` (modeled against
    measured).

    ``out`` is checked before any measurement (:func:`check_config`), locked for the whole run
    (:func:`ds4lab.report.results.output_file`: a second calibration into the same file is
    refused), and written only when complete and valid against the schema; an interrupted or
    failed run leaves the file as it was.

    Raises:
        ds4lab.errors.CalibrationError: ``out`` a shipped calibration, ``base`` invalid, or the
            result not a valid calibration.
        BadInput: ``out`` a folder, a bad profile folder.
        ds4lab.report.results.OutputError: ``out``'s folder is not writable, ``out`` holds a file that
            is not a calibration, or another run is writing it.
    """
    from ..report.results import final_path, output_file
    from ..sim.calibration import read, refuse_shipped, validate

    check_config(cfg)
    out = Path(cfg.out)
    o = no_folder("calibrate", {"job": "calibrate", "calibration": str(out)})
    fits = None
    with output_file(out, "calibration", accept=_replaceable, refuse=refuse_shipped) as tmp:
        if cfg.long_context:
            base = read(Path(cfg.base) if cfg.base else default_calibration_path())
            cal = calibrate_long_context(be, base, cfg.preset or "ds4-flash", console=console)
        elif cfg.from_ds4 is not None:
            check_path = _sidecar(out, "-check.csv", "context,ds4,stage,")
            base = read(Path(cfg.base) if cfg.base else default_calibration_path())
            try:
                cal, table, check = fit_from_ds4(base, cfg.from_ds4, preset=cfg.preset or "ds4-flash")
            except ValueError as e:
                raise BadInput(str(e)) from None
            from ..report.results import read_meta

            unfinished = [str(f) for f in _as_folders(cfg.from_ds4)
                          if (read_meta(Path(f)) or {}).get("status") != "complete"]
            if unfinished:
                console.print(f"[yellow]note: fitted from a ds4 run that did not finish ({', '.join(unfinished)}: "
                              "its recorded tokens are there; the calibration's source says so)[/]")
            for k in ("host_launch_us", "host_graph_call_us", "eager_gap_us", "kernel_time_scale"):
                console.print(f"{k}: {base.get(k, 1.0 if k == 'kernel_time_scale' else None)} → {cal.get(k)} "
                              f"(median of {int((table.figure == k).sum())} "
                              f"{'recorded contexts' if k == 'kernel_time_scale' else 'recorded tokens'})")
            if cal.get("kernel_time_scale_by_context"):
                console.print("kernel_time_scale_by_context: " + ", ".join(
                    f"{c}: {s}" for c, s in cal["kernel_time_scale_by_context"])
                              + " (log2-linear between these contexts, constant outside)")
            _print_ds4_check(check, console)
            check.to_csv(check_path, index=False)
            console.print(f"the check table: {check_path}")
        elif cfg.from_context is not None:
            from .fit_capture_stages import fit_capture_stages, print_fit

            fit_path = _sidecar(out, "-fit.csv", "figure,stage,context,")
            base = read(Path(cfg.base) if cfg.base else default_calibration_path())
            try:
                cal, table = fit_capture_stages(base, cfg.from_context, preset=cfg.preset, say=console.print)
            except ValueError as e:
                raise BadInput(str(e)) from None
            print_fit(table, base, cal, console)
            o.table("stages_fit", table)
            table.to_csv(fit_path, index=False)
            console.print(f"the fit table: {fit_path}")
        elif cfg.from_ladder:
            base = read(Path(cfg.base) if cfg.base else default_calibration_path())
            try:
                cal, table = fit_host_from_ladder(base, cfg.from_ladder)
            except ValueError as e:
                raise BadInput(str(e)) from None
            o.table("host_fit", table)
            for r in table.itertuples():
                console.print(f"{r.figure}: {r.value:.3f} µs ({r.folder}, context {r.context})")
            for k in ("host_launch_us", "host_graph_call_us", "host_node_update_us"):
                console.print(f"{k}: {base.get(k)} → {cal.get(k)} (the median)")
        elif cfg.moe_profile is None:
            cal = calibrate(be, cfg.preset or default_preset("calibrate", be), console=console)
        else:
            base = Path(cfg.base or default_calibration_path())
            cal = read(base)  # every key checked: an invalid base is refused before anything is written
            try:
                fits = fit_tiled_moe(Path(cfg.moe_profile))
            except ValueError as e:
                raise BadInput(str(e)) from None
            cal.setdefault("kernels", {}).update(fits)
            cal["source"] = f"{cal.get('source', '')}; tiled MoE kernels fitted from {cfg.moe_profile}"
        validate(cal, str(out))
        write_calibration(cal, tmp)
        if cfg.from_ladder:
            for i, d in enumerate(_check_against(cal, cfg.from_ladder, console)):
                o.table(f"check-{i}", d)
    for kern, f in (fits or {}).items():
        console.print(f"{kern}: {f['fixed_us']} µs + bytes / {f['bandwidth_GBps']} GB/s ({f['samples']} points)")
    console.print(f"calibration written to {final_path(out)}")
    o.result.files.append(out)
    return o.done(cal)


def _sidecar(out: Path, suffix: str, header: str) -> Path:
    """The table written beside calibration ``out`` (``<stem><suffix>``), checked before anything is
    computed: one already there is replaced only when it is ds4lab's (its first line starts with
    ``header``, the table's own columns) and the calibration it belongs to is there too.

    Raises:
        BadInput: a file there that ds4lab did not write, or one without its calibration (naming it).
    """
    path = out.with_name(out.stem + suffix)
    if not path.exists():
        return path
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            ours = f.readline().startswith(header)
    except OSError:
        ours = False
    if not ours or not out.is_file():
        why = ("is not a table ds4lab wrote" if not ours else "is there without the calibration it belongs to")
        raise BadInput(f"--out {out}: {path} {why}, and ds4lab never replaces files it did not write: move it, "
                       "or choose another --out")
    return path


#: ds4's configurations (``ds4lab ds4``) each ds4lab stage models: eager is islands off, stage i is
#: ds4's islands as they ship.
DS4_STAGE_OF = {"islands-off": "0", "islands-on": "i"}


def _ds4_tables(folder: Path):
    """``(meta, summary, census)`` of a ``ds4lab ds4`` folder. Raises ValueError naming what is missing."""
    import pandas as pd

    from ..report import results

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


def _as_folders(folders) -> list[Path]:
    """``folders`` (one path, or an iterable of paths) as a list of Paths. Raises ValueError for none,
    or a folder named twice."""
    got = [Path(folders)] if isinstance(folders, (str, Path)) else [Path(f) for f in folders]
    if not got:
        raise ValueError("--from-ds4: no ds4lab ds4 folder given")
    twice = sorted({str(f) for f in got if sum(g.resolve() == f.resolve() for g in got) > 1})
    if twice:
        raise ValueError(f"--from-ds4 {', '.join(twice)}: a folder given more than once")
    return got


def fit_from_ds4(base: dict, folder, *, preset: str = "ds4-flash", tokens: int = 32, stages: str = "0,i,3,3cc,3ccp"):
    """A calibration that prices ds4lab's launch list at ds4's own costs, from one or more measured
    ``ds4lab ds4`` folders (no GPU), and the check of the sim with it against ds4.

    ``folder``: one folder (a path) or several (an iterable of paths): their recorded tokens are
    pooled, their recorded contexts give the kernel time factor by context.

    Fitted (medians over the recorded tokens of every folder's ``census.csv``; ``base`` keeps
    everything else):

    * ``host_launch_us``: ds4's host span per token to the end of its last launch call over its
      kernel launch calls, islands off (CUPTI's own cost per call included);
    * ``host_graph_call_us``: islands on, ``(span - launches * host_launch_us) / graph launches -
      host_graph_launch_us``: ds4's own work around each island's replay;
    * ``eager_gap_us``: islands off, the recorded tokens' kernel span less their kernel-busy µs, per
      boundary between two kernels (``(span - busy) / (kernels - 1)``): the device's idle before each
      eager kernel, which the islands' graph nodes are spared (the median over tokens; tokens the
      host ran behind, ``enqueue_us`` above ``span_us``, are left out: their idle is the host's);
    * the kernel time factor at each recorded context: ds4's median kernel-busy µs per token there
      (islands off, every folder's tokens at that context) over the sim's modeled busy floor of
      ds4lab's token at that context with ``base``'s kernel fits (factor 1): ds4's kernels, one
      factor on every one of ds4lab's at that context. ``kernel_time_scale`` is the median of these
      factors (the one factor, as a reader without the next key uses it); with two or more recorded
      contexts they are also written as ``kernel_time_scale_by_context`` (``[[context, factor], ...]``,
      ascending: :meth:`ds4lab.sim.costmodel.Calibration.scale_at` interpolates it in log2(context)),
      with one recorded context that key is dropped (a ``base`` that had one included).

    Then the sim's context ladder (``stages``, at every context any ``summary.csv`` measured) with
    the new calibration (each context priced at its own factor), beside ds4's measured µs per token:
    stage 0 against islands off, stage i against islands on (``ratio`` modeled / measured, ``agrees``
    within ±10 %), and the stages ds4 does not ship (3: one graph per token shape; 3cc, 3ccp: one graph
    for every position, through conditional nodes, without and with programmatic launch) MODELED, with their
    gain over stage i. ``tokens`` per stage and context: enough that stage 3's captures of new token shapes
    do not make its median (with 8, most of them did at 4k).

    Returns:
        ``(calibration dict, fits table, check table)``. The fits table: one row per fitted figure
        and recorded token (``kernel_time_scale``: per recorded context), columns ``figure``,
        ``context``, ``value``, ``folder`` (the token's folder; for a factor, the folders that
        recorded that context, comma-separated). The check
        table: per context (ascending) the measured rows of each folder that measured it, then the
        MODELED stages once; columns ``context``, ``ds4``, ``stage``, ``measured_us``, ``modeled_us``
        (µs per token), ``ratio``, ``agrees``, ``gain_over_i_us`` (MODELED rows), ``folder`` (the
        measured row's folder, ``""`` on MODELED rows), ``kernel_time_scale`` (the factor the
        context was priced at) and ``sample``: ``fitted`` (a recorded context: in-sample),
        ``held out (interpolated)`` (between two recorded contexts) or ``held out (extrapolated)``
        (outside them: the nearest recorded factor).

    Raises:
        ValueError: no folder, a folder given twice, not a ds4 folder, a missing table or
            configuration (each names it).
    """
    import pandas as pd

    import numpy as np

    from ..measure.sim_check import TOLERANCE
    from ..sim.costmodel import Calibration

    folders = _as_folders(folder)
    metas, summaries, censuses = [], [], []
    for f in folders:
        meta, summary, census = _ds4_tables(f)
        metas.append(meta)
        summaries.append(summary.assign(folder=str(f)))
        censuses.append(census.assign(folder=str(f)))
    summary, census = pd.concat(summaries, ignore_index=True), pd.concat(censuses, ignore_index=True)
    off = census[census.config == "islands-off"]
    on = census[census.config == "islands-on"]
    fits = []

    def put(figure, values, ctx, where):
        fits.extend({"figure": figure, "context": int(c), "value": float(v), "folder": w}
                    for v, c, w in zip(values, ctx, where))
        return float(np.median(list(values)))

    out = dict(base)
    out.pop("kernel_time_scale_by_context", None)
    h = put("host_launch_us", off.enqueue_us / off.launch_calls, off.context, off.folder)
    out["host_launch_us"] = round(h, 3)
    g = on[on.graph_launches > 0]
    if len(g):
        call = (g.enqueue_us - g.launch_calls * h) / g.graph_launches - float(base["host_graph_launch_us"])
        out["host_graph_call_us"] = round(max(0.0, put("host_graph_call_us", call, g.context, g.folder)), 3)
    ahead = off[off.enqueue_us < off.span_us]
    if len(ahead):
        out["eager_gap_us"] = round(max(0.0, put("eager_gap_us", (ahead.span_us - ahead.busy_us)
                                                 / (ahead.kernels - 1).clip(lower=1), ahead.context,
                                                 ahead.folder)), 3)
    trace_ctx = sorted(int(c) for c in set(off.context))
    lab = sim_context({**out, "kernel_time_scale": 1.0}, preset, "0", trace_ctx, tokens)
    lab_busy = lab.set_index("context")["floor_us"]
    ratios = [float(np.median(off[off.context == c].busy_us)) / float(lab_busy.loc[c]) for c in trace_ctx]
    which = [",".join(sorted(set(off[off.context == c].folder))) if len(folders) > 1 else str(folders[0])
             for c in trace_ctx]
    out["kernel_time_scale"] = round(put("kernel_time_scale", ratios, trace_ctx, which), 4)
    if len(trace_ctx) > 1:
        out["kernel_time_scale_by_context"] = [[c, round(r, 4)] for c, r in zip(trace_ctx, ratios)]
    commits = list(dict.fromkeys(str(m.get("ds4_commit") or "ds4") for m in metas))
    out["name"] = f"{base.get('name', 'calibration')} at ds4's costs ({'+'.join(commits)})"
    fitted = "kernel_time_scale" + (" by context" if len(trace_ctx) > 1 else "")
    out["source"] = (f"{base.get('source', '')}; host constants and {fitted} fitted from ds4 itself by "
                     "ds4lab calibrate " + " ".join(f"--from-ds4 {f}" for f in folders) + " (" +
                     "; ".join(f"ds4 {m.get('ds4_commit', '?')}, {m.get('gpu', '?')}, driver {m.get('driver', '?')}"
                               + ("" if m.get("status") == "complete" else
                                  f", a run that did not finish: status {str(m.get('status', ''))[:80]!r}")
                               for m in metas) + ")")
    cal = Calibration.load(out)
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
    return out, pd.DataFrame(fits), pd.DataFrame(rows)


def host_whatif(contexts=(1024,), host_launch_us=(3.2,), *, preset: str = "ds4-flash", stages: str = "0,i,3",
                tokens: int = 8, calibration=None):
    """ds4lab's token on the sim with its eager launches priced at other host costs: the shipped
    calibration's (ds4lab's Python launch layer, fitted from a measured ladder) and each of
    ``host_launch_us`` (e.g. a C program's: 3.0–3.3 µs per launch measured on the H200,
    ``shared/context/gpu-facts.md``). Every figure MODELED. Returns the rows of :func:`sim_context`
    with ``host_launch_us``, ``host`` (a label) and ``speedup`` (stage 0 over the stage, per host and
    context)."""
    import pandas as pd

    from ..sim.calibration import read

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
