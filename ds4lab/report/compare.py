"""Side-by-side figures of results from several folders (ds4lab runs, other machines, ingested
ds4 and Nsight Systems profiles).

Every folder given must hold at least one table compare can draw, found by name and checked by its
columns (:data:`TABLES`):

* stage ladders (``stage``, ``us_median``): ``ladder.csv`` as ``ds4lab ladder`` writes it,
  ``ladder-<name>.csv`` as kept under ``docs/measurements/``, ``ds4lab_ladder*.csv`` from ``ingest``;
* routed-MoE stage rows (``stage``, ``ms``): ``moe.csv``, ``moe-<name>.csv``, ``ds4_moe.csv`` and
  ``ds4lab_moe*.csv`` from ``ingest``;
* routed-MoE summaries (``stage``, ``median_ms``): ``summary.csv``, ``summary-<name>.csv``,
  ``ds4lab_summary*.csv`` (drawn unless the same run's rows are there);
* a ds4-format log (``*.log`` holding ``ds4: CUDA MoE profile`` lines, e.g. ``moe-ds4.log``) when the
  folder has no MoE table;
* kernel summaries: ``nsys_kernels.csv`` (``name``, ``total_time_us``), ``kernels.csv`` (``name``, ``us``);
* Nsight Compute per-site tables: ``ncu_sites.csv`` (``cluster``, ``op``, ``dram_pct``) from ``ingest``
  of ``ncu --csv`` output: per launch site, the median DRAM throughput in % of peak (the achieved
  fraction of bandwidth ncu measures), drawn by :func:`ds4lab.report.plots.ncu_sites_figure`.

A table ``ingest`` wrote from several inputs is drawn one bar per input: split by its ``file`` column
(``ds4lab_*`` tables of an older ingest: by ``source``). A MoE table's bar is one profiling mode
(:data:`MODE_PREFERENCE`) and one routing (uniform first), named in its label, never a median across
modes or routings. A run's summary is not drawn beside the same run's rows (the same numbers twice):
a folder's ``summary*.csv`` beside its ``moe*.csv`` of the same meta file, an ingested
``ds4lab_summary*`` beside the ``ds4lab_moe*`` of the same source folder.

A folder with none of them, a candidate table that cannot be read or lacks its columns, and a
broken ``meta.json`` are :class:`CompareError` naming the file; nothing is drawn then.

Each table's provenance comes from its meta file (``<stem>.meta.json``, ``meta-<name>.json``,
``meta.json``; for a log, the folder's only ``meta-*.json``) and its own ``modeled``/``machine``/
``provenance`` columns: modeled numbers are labelled MODELED; a run whose status is not
``complete``/``done`` (``running`` left by a killed run, ``interrupted``, ``failed: ...``, or no
status at all in a ds4lab job's meta) is labelled ``(incomplete: <status>)`` and warned about. A
ladder or MoE label names the preset its meta file names (unless the file name already does).

``--out`` holds this run's figures only: the ``compare_*`` PNG/SVG/PDF an earlier compare left there
are removed before the new ones are written.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

COMPLETE = ("complete", "done")
from ..token.model import MOE_STAGES  # ds4's six routed-MoE stages, defined once

#: kind → (file name patterns, required columns, value column)
TABLES = {
    "ladder": (("ladder.csv", "ladder-*.csv", "ds4lab_ladder*.csv"), ("stage", "us_median"), "us_median"),
    "moe": (("moe.csv", "moe-*.csv", "ds4_moe.csv", "ds4lab_moe.csv", "ds4lab_moe-*.csv"), ("stage", "ms"), "ms"),
    "moe-summary": (("summary.csv", "summary-*.csv", "ds4lab_summary.csv", "ds4lab_summary-*.csv"),
                    ("stage", "median_ms"), "median_ms"),
    "kernels-sum": (("nsys_kernels.csv",), ("name", "total_time_us"), "total_time_us"),
    "kernels": (("kernels.csv",), ("name", "us"), "us"),
    "ncu-sites": (("ncu_sites.csv",), ("cluster", "op", "dram_pct"), "dram_pct"),
}
LOOKED_FOR = ("ladder.csv, ladder-<name>.csv, moe.csv, moe-<name>.csv, summary.csv, summary-<name>.csv, "
              "a ds4-format *.log, nsys_kernels.csv, kernels.csv, ncu_sites.csv, ds4_moe.csv, ds4lab_ladder*.csv, "
              "ds4lab_moe*.csv, ds4lab_summary*.csv")


class CompareError(ValueError):
    """A folder or file compare cannot use: the message names it."""


@dataclass
class Table:
    """One drawable table: its kind, data, file, meta file (or None) and legend label."""

    kind: str
    df: pd.DataFrame
    path: Path
    meta_path: Path | None = None
    meta: dict | None = None
    label: str = ""
    incomplete: str | None = None
    notes: list = field(default_factory=list)
    run: object = None  # what identifies the run the numbers come from (a meta file, a source folder)


def _load_meta(f: Path) -> dict:
    from ..ingest import IngestError, load_meta

    try:
        return load_meta(f)
    except IngestError as e:
        raise CompareError(str(e)) from None


def _meta_for(d: Path, f: Path) -> Path | None:
    """The meta file describing table ``f`` in folder ``d`` (see the module docstring)."""
    stem = f.stem
    cands = [d / f"{stem}.meta.json"]
    if "-" in stem:
        cands.append(d / f"meta-{stem.split('-', 1)[1]}.json")
    cands.append(d / "meta.json")
    for c in cands:
        if c.is_file():
            return c
    if f.suffix == ".log":  # ds4lab moe's moe-ds4.log, kept beside meta-<preset>.json
        others = sorted(set(d.glob("meta-*.json")) | set(d.glob("*.meta.json")))
        return others[0] if len(others) == 1 else None
    return None


def _read_csv(f: Path, kind: str) -> pd.DataFrame:
    _pats, need, value = TABLES[kind]
    try:
        df = pd.read_csv(f)
    except pd.errors.EmptyDataError:
        raise CompareError(f"{f}: empty file, no {kind} table") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as e:
        raise CompareError(f"{f}: unreadable CSV ({' '.join(str(e).split())})") from None
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise CompareError(f"{f}: not a {kind} table: no column {', '.join(missing)} "
                           f"(columns: {', '.join(map(str, df.columns[:12]))})")
    if df.empty:
        raise CompareError(f"{f}: a {kind} table without rows")
    vals = pd.to_numeric(df[value], errors="coerce")
    bad = vals.isna() & df[value].notna()
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise CompareError(f"{f}:{i + 2}: {value}={df[value].iloc[i]!r} is not a number")
    df[value] = vals
    return df


def _truthy(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    try:
        return bool(v) and v == v  # NaN is not true
    except (TypeError, ValueError):
        return False


def _status(t: Table) -> str | None:
    """The run's status when it is not complete (None when complete or not recorded anywhere)."""
    st = None
    if t.meta is not None:
        if "status" in t.meta:
            st = str(t.meta["status"])
        elif "job" in t.meta:  # every ds4lab job writes a status when it finishes
            st = "no status"
    if (st is None or st.strip().lower() in COMPLETE) and "status" in t.df:
        # an ingested table keeps each source run's status: an ingest that completed does not make
        # an interrupted run's rows complete
        bad = [str(v) for v in t.df["status"].dropna().unique() if str(v) and str(v).lower() not in COMPLETE]
        st = bad[0] if bad else st
    if st is None or st.strip().lower() in COMPLETE:
        return None
    return st if len(st) <= 40 else st[:39] + "…"


def _tag(t: Table) -> str:
    """MODELED, or where the numbers come from."""
    m = t.meta or {}
    modeled = _truthy(m.get("modeled"))
    if "modeled" in t.df:
        modeled = modeled or any(_truthy(v) for v in t.df["modeled"].unique())
    if modeled:
        cal = m.get("calibration")
        cal = cal.get("name") if isinstance(cal, dict) else cal
        return "MODELED" + (f", calibration {cal}" if cal else "")
    if m.get("device"):
        return str(m["device"])
    for col in ("machine", "provenance", "backend"):
        if col in t.df:
            vals = [str(v) for v in t.df[col].dropna().unique() if str(v)]
            if vals:
                s = ", ".join(vals[:3]) + (" backend, no meta.json" if col == "backend" else "")
                return s if len(s) <= 60 else s[:59] + "…"
    return "provenance unknown: no meta.json"


def _folder_tables(d: Path) -> list[Table]:
    from ..ingest import IngestError, detect, read_ds4_log

    found: list[Table] = []
    seen: set[Path] = set()
    for kind, (pats, _need, _v) in TABLES.items():
        for f in sorted({p for pat in pats for p in d.glob(pat) if p.is_file()}):
            if f in seen:
                continue
            seen.add(f)
            df = _read_csv(f, kind)
            ds4lab = f.name.startswith("ds4lab_")
            by = None
            if "file" in df:
                by = df["file"]
            elif "source" in df:  # an older ingest: ds4lab_* source = the CSV, else <file name>:<line>
                by = df["source"] if ds4lab else df["source"].astype(str).str.replace(r":\d+$", "", regex=True)
            if by is not None and by.nunique(dropna=False) > 1:  # one ingested file per bar
                groups = list(df.groupby(by, sort=False, dropna=False))
                names = [Path(str(src)).name for src, _ in groups]
                for src, g in groups:
                    found.append(Table(kind, g.reset_index(drop=True), f,
                                       notes=[_source_note(src, ds4lab, names)]))
            else:
                found.append(Table(kind, df, f))
    if not any(t.kind in ("moe", "moe-summary") for t in found):
        for f in sorted(p for p in d.glob("*.log") if p.is_file()):
            try:
                if detect(f) != "ds4-log":
                    continue
                df = read_ds4_log(f, lenient=False).tables["ds4_moe"]
            except IngestError as e:
                raise CompareError(str(e)) from None
            found.append(Table("moe", df, f))
    for t in found:
        t.meta_path = _meta_for(d, t.path)
        t.meta = _load_meta(t.meta_path) if t.meta_path else None
        t.run = t.meta_path
        if t.path.name.startswith("ds4lab_") and "source" in t.df:  # ingested: the run is its source folder
            srcs = t.df["source"].dropna().astype(str).unique()
            if len(srcs) == 1:
                t.run = ("source folder", str(Path(srcs[0]).parent))
    # a run's summary beside its own rows would be the same numbers twice: keep the rows
    rows_runs = {t.run for t in found if t.kind == "moe" and t.run is not None}
    return [t for t in found if not (t.kind == "moe-summary" and t.run in rows_runs)]


def _source_note(src, ds4lab: bool, names: list) -> str:
    """What tells one input of an ingested table from the others in a label: ``folder/table`` for a
    ds4lab folder's table, else the file's name (its path where two inputs share the name)."""
    p = Path(str(src))
    if ds4lab:
        return p.parent.name + "/" + p.stem
    return p.name if names.count(p.name) == 1 else str(p)


def _preset(meta: dict | None) -> str | None:
    """The preset a meta file names (``"preset": "small"`` or ``{"name": "small", ...}``), or None."""
    p = (meta or {}).get("preset")
    p = p.get("name") if isinstance(p, dict) else p
    return str(p) if p not in (None, "") else None


def collect(dirs, warn=None) -> list[Table]:
    """Every drawable table of every folder, labelled. Raises CompareError naming each folder
    without one, or the first unreadable file."""
    warn = warn or (lambda m: print(f"ds4lab: warning: {m}", file=sys.stderr))
    tables: list[Table] = []
    empty = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise CompareError(f"{d}: not a folder")
        ts = _folder_tables(d)
        if not ts:
            empty.append(d)
        tables += ts
    if empty:
        raise CompareError("no table compare can draw in " + ", ".join(map(str, empty))
                           + f" (looked for {LOOKED_FOR}); nothing written")
    used: set[str] = set()
    for t in tables:
        d = t.path.parent
        name = d.name or d.resolve().name
        parts = [t.path.stem] * (t.path.stem not in ("ladder", "moe")) + t.notes
        preset = _preset(t.meta) if t.kind in ("ladder", "moe", "moe-summary") else None
        if preset and not any(preset in p for p in parts):
            parts.append(preset)
        part = " · ".join(parts)
        t.incomplete = _status(t)
        label = f"{name}{' · ' + part if part else ''} ({_tag(t)})"
        if t.incomplete:
            label += f" (incomplete: {t.incomplete})"
            warn(f"{t.path}: the run is incomplete ({t.meta_path or 'status column'}: status "
                 f"{t.incomplete!r}); drawn, labelled (incomplete: {t.incomplete})")
        base, k = label, 2
        while label in used:
            label = f"{base} [{d}]" if k == 2 else f"{base} [{d} #{k}]"
            k += 1
        used.add(label)
        t.label = label
    return tables


#: Which profiling mode's times stand for a run, best first: in-graph timestamps and CUPTI see the
#: kernels alone; deferred and host-timed events also count the host's launch gaps (NOTES.md).
MODE_PREFERENCE = ("in-graph", "cupti", "deferred", "host-timed")


def _moe_by_tokens(t: Table) -> tuple[str, dict]:
    """(what was selected, {tokens per step: {stage: median µs per call}}) of one MoE table, from one
    profiling mode (:data:`MODE_PREFERENCE`, then the first the table has) and, where the table has
    a routing column, one routing (uniform, else the first), so that sources compare like for like
    and no median mixes modes or routings. Modes and routings with no number are passed over."""
    col = "ms" if t.kind == "moe" else "median_ms"
    df = t.df.assign(stage=t.df["stage"].astype(str))
    timed = df[pd.to_numeric(df[col], errors="coerce").notna()]
    if not timed.empty:
        df = timed
    picked = []
    if "mode" in df.columns:
        have = list(dict.fromkeys(df["mode"].astype(str)))
        mode = next((m for m in MODE_PREFERENCE if m in have), have[0])
        df = df[df["mode"].astype(str) == mode]
        picked.append("mode unknown" if mode == "unknown" else mode)
    if "routing" in df.columns:
        have = list(dict.fromkeys(df["routing"].astype(str)))
        routing = "uniform" if "uniform" in have else have[0]  # routing changes the work: uniform with uniform
        df = df[df["routing"].astype(str) == routing]
        picked.append("routing unknown" if routing == "unknown" else routing)
    mode = " · ".join(picked)
    if "tokens" not in df.columns:
        df = df.assign(tokens=0)  # unknown token count: one panel
    out = {}
    for tokens, g in df.groupby("tokens"):
        out[int(tokens)] = (g.groupby("stage")[col].median() * 1e3).to_dict()
    return mode, out


def compare(dirs, out: Path, warn=None) -> list[Path]:
    """Ladder tables (µs per token per stage), MoE stage medians (ms per stage), kernel totals
    (µs per kernel name, the largest ten) and Nsight Compute per-site DRAM % of peak (the sites
    with the most time), one bar per table (per input file of an ingested table),
    the legend beside the bars. Earlier ``compare_*`` figures in ``out`` are removed first. Returns
    the written figure paths (PNG, SVG, PDF). Raises CompareError (nothing written) for a folder without a drawable table,
    an unreadable table or meta file, or an ``out`` that cannot be a folder; ``warn`` (default:
    stderr) is told about incomplete runs."""
    from . import plots
    from ..ingest import IngestError, check_out_dir

    out = Path(out)
    try:
        check_out_dir(out)
    except IngestError as e:
        raise CompareError(str(e)) from None
    tables = collect(dirs, warn)
    figs = []
    lad = {t.label: t.df.assign(stage=t.df["stage"].astype(str)).groupby("stage", sort=False)["us_median"]
           .mean().to_dict() for t in tables if t.kind == "ladder"}
    if lad:
        stages = list(dict.fromkeys(s for v in lad.values() for s in v))
        figs.append((plots.grouped_bars_figure(lad, stages, "µs per token (median)",
                                               "stage ladder, side by side (sources in the legend)"),
                     "compare_ladder"))
    moe = {}
    for t in tables:
        if t.kind in ("moe", "moe-summary"):
            mode, per_tokens = _moe_by_tokens(t)
            moe[t.label + (f" · {mode}" if mode else "")] = per_tokens
    if moe:
        figs.append((plots.compare_moe_figure(moe, MOE_STAGES), "compare_moe"))
    kern = {}
    for t in tables:
        if t.kind in ("kernels-sum", "kernels"):
            col = "total_time_us" if t.kind == "kernels-sum" else "us"
            kern[t.label] = t.df.assign(name=t.df["name"].astype(str)).groupby("name")[col].sum().to_dict()
    if kern:
        names = sorted({n for v in kern.values() for n in v}, key=lambda n: -max(v.get(n, 0) for v in kern.values()))
        figs.append((plots.grouped_bars_figure(kern, names[:10], "µs in total",
                                               "largest kernels by total time, side by side", rotate=True),
                     "compare_kernels"))
    ncu = {t.label: t.df for t in tables if t.kind == "ncu-sites"}
    if ncu:
        figs.append((plots.ncu_sites_figure(ncu), "compare_ncu_sites"))
    written = []
    try:
        if out.is_dir():  # an earlier compare's figures would pass for this run's
            for ext in ("png", "svg", "pdf"):
                for f in out.glob(f"compare_*.{ext}"):
                    if f.is_file() or f.is_symlink():
                        f.unlink()
        for fig, stem in figs:
            written += plots.save(fig, out / stem)
    except OSError as e:
        raise CompareError(f"--out {out}: cannot write ({e.strerror or e}: {e.filename or out})") from None
    finally:
        import matplotlib.pyplot as plt

        for fig, _ in figs:
            plt.close(fig)
    return written
