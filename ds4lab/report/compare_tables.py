"""Side-by-side figures of results from several folders: what ``ds4lab compare`` collects (:func:`collect`, by name
and columns: :data:`TABLES`) and draws (:func:`figures`). Next: ``docs/compare.md`` (what it reads, refuses and how
it labels each source)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

COMPLETE = ("complete", "done")
from ..errors import BadInput
from ..token.model import MOE_STAGES  # ds4's six routed-MoE stages, defined once

#: kind → (file name patterns, required columns, value column)
TABLES = {
    "ladder": (("ladder.csv", "ladder-*.csv", "ds4lab_ladder*.csv"), ("stage", "us_median"), "us_median"),
    "context": (("context.csv", "context-*.csv", "ds4lab_context*.csv"), ("stage", "context", "us_median"),
                "us_median"),
    "moe": (("moe.csv", "moe-*.csv", "ds4_moe.csv", "ds4lab_moe.csv", "ds4lab_moe-*.csv"), ("stage", "ms"), "ms"),
    "moe-summary": (("summary.csv", "summary-*.csv", "ds4lab_summary.csv", "ds4lab_summary-*.csv"),
                    ("stage", "median_ms"), "median_ms"),
    "kernels-sum": (("nsys_kernels.csv",), ("name", "total_time_us"), "total_time_us"),
    "kernels": (("kernels.csv",), ("name", "us"), "us"),
    "ncu-sites": (("ncu_sites.csv",), ("cluster", "op", "dram_pct"), "dram_pct"),
}
LOOKED_FOR = ("ladder.csv, ladder-<name>.csv, context.csv, context-<name>.csv, moe.csv, moe-<name>.csv, "
              "summary.csv, summary-<name>.csv, a ds4-format *.log, nsys_kernels.csv, kernels.csv, ncu_sites.csv, "
              "ds4_moe.csv, ds4lab_ladder*.csv, ds4lab_context*.csv, ds4lab_moe*.csv, ds4lab_summary*.csv")
#: key columns that must hold a number in every row, where a table has them (a context is a position)
NUMBER_KEYS = ("context",)


class CompareError(BadInput):
    """A folder or file compare cannot use: the message names it (exit 2)."""


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
    modeled: bool = False


def load_result_meta(f: Path) -> dict:
    """A ds4lab ``meta.json``, a dead run read as ``died``; SourceError naming the file."""
    from ..trace.sources.common import load_meta
    from . import results

    meta = load_meta(f)
    if meta.get("status") == "running" and Path(f).name == "meta.json":
        meta = results.read_meta(Path(f).parent) or meta
    return meta


def _load_meta(f: Path) -> dict:
    from ..trace.sources import SourceError

    try:
        return load_result_meta(f)
    except SourceError as e:
        raise CompareError(str(e)) from None


def _meta_for(d: Path, f: Path) -> Path | None:
    """The meta file describing table ``f`` in folder ``d`` (``docs/compare.md``)."""
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
    from ..trace.sources.common import csv_shape_problems

    cut = csv_shape_problems(f, limit=1)
    if cut:
        line, why = cut[0]
        raise CompareError(f"{f}:{line}: {why}; the table is not whole (a run killed while writing it, a "
                           "copy cut short): rerun or copy it again")
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
    for key in (c for c in need if c in NUMBER_KEYS):
        vals = pd.to_numeric(df[key], errors="coerce")
        if vals.isna().any():  # an empty cell too: a row at no known context cannot be set beside others
            i = int(vals.isna().to_numpy().argmax())
            raise CompareError(f"{f}:{i + 2}: {key}={df[key].iloc[i]!r} is not a number")
        df[key] = vals
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
    """MODELED, or where the numbers come from, else ``provenance unknown: no meta.json``."""
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
                s = ", ".join(vals[:3]) + (" backend" + ("" if t.meta else ", no meta.json") if col == "backend"
                                           else "")
                return s if len(s) <= 60 else s[:59] + "…"
    if t.meta is not None:  # a meta.json that names no device: say what it does name
        if m.get("job") == "ingest":
            inputs = m.get("inputs") if isinstance(m.get("inputs"), list) else []
            kinds = list(dict.fromkeys(str(i["kind"]) for i in inputs if isinstance(i, dict) and i.get("kind")))
            return (f"ingested {', '.join(kinds[:3])}" if kinds else "ingested") + ", no device recorded"
        return (f"ds4lab {m['job']}" if m.get("job") else "meta.json") + ", no device recorded"
    return "provenance unknown: no meta.json"


def _folder_tables(d: Path) -> list[Table]:
    from ..trace.sources import SourceError, detect
    from ..trace.sources.ds4log import read_ds4_log
    from .results import read_meta

    try:
        job = (read_meta(d) or {}).get("job")
    except ValueError:  # a meta.json that is not an object: the tables below say what the folder holds
        job = None
    if job == "ds4":  # ds4 itself has its own side-by-side: its summary.csv is not a MoE summary
        raise BadInput(f"{d}: a ds4lab ds4 folder (ds4 itself), which compare does not draw: read it with "
                       "notebooks/06_ds4_itself (--set DS4_RESULTS=...) or ds4lab calibrate --from-ds4")
    found: list[Table] = []
    seen: set[Path] = set()
    for kind, (pats, _need, _v) in TABLES.items():
        for f in sorted({p for pat in pats for p in d.glob(pat) if p.is_file()}):
            if f in seen:
                continue
            seen.add(f)
            df = _read_csv(f, kind)
            ds4lab = f.name.startswith("ds4lab_")
            by = df["file"] if "file" in df else None
            if by is not None and by.nunique(dropna=False) > 1:  # one ingested file per bar
                groups = list(df.groupby(by, sort=False, dropna=False))
                names = [Path(str(src)).name for src, _ in groups]
                for src, g in groups:
                    found.append(Table(kind, g.reset_index(drop=True), f,
                                       notes=[_source_note(src, ds4lab, names)]))
            else:
                found.append(Table(kind, df, f))
    found = [s for t in found for s in _by_device(t)]
    if not any(t.kind in ("moe", "moe-summary") for t in found):
        for f in sorted(p for p in d.glob("*.log") if p.is_file()):
            try:
                with open(f, "rb"):
                    pass
            except OSError as e:
                raise CompareError(f"{f}: unreadable ({e.strerror or e})") from None
            try:
                if detect(f) != "ds4-log":
                    continue
            except SourceError:  # a job's console output kept beside its table, any other text: no table
                continue
            try:
                df = read_ds4_log(f, lenient=False).tables["ds4_moe"]
            except SourceError as e:
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


#: columns that tell devices and processes apart in a kernel table (the SQLite export's kernels,
#: ncu's kernels per site): a table holding several is drawn one bar per device and process
DEVICE_COLUMNS = (("deviceId", "device"), ("device", "device"), ("globalPid", "process"), ("pid", "process"))


def _by_device(t: Table) -> list[Table]:
    """``t`` split into one table per device and process, each named in its label."""
    if t.kind not in ("kernels", "ncu-sites"):
        return [t]
    cols = [(c, what) for c, what in DEVICE_COLUMNS if c in t.df and t.df[c].nunique(dropna=False) > 1]
    if not cols:
        return [t]
    keys = [c for c, _ in cols]
    out = []
    for vals, g in t.df.groupby(keys, sort=True, dropna=False):
        vals = vals if isinstance(vals, tuple) else (vals,)
        note = " · ".join(f"{what} {_plain(v)}" for (_, what), v in zip(cols, vals))
        out.append(Table(t.kind, g.reset_index(drop=True), t.path, notes=[*t.notes, note]))
    return out


def _plain(v) -> str:
    """A device or process id as text (``1``, not ``1.0``)."""
    try:
        f = float(v)
        return str(int(f)) if f.is_integer() else str(v)
    except (TypeError, ValueError):
        return str(v)


def _source_note(src, ds4lab: bool, names: list) -> str:
    """What tells one input of an ingested table apart in a label: ``folder/table``, else the file's name (or path)."""
    p = Path(str(src))
    if ds4lab:
        return p.parent.name + "/" + p.stem
    return p.name if names.count(p.name) == 1 else str(p)


def _preset(meta: dict | None) -> str | None:
    """The preset a meta file names (``"preset": "small"`` or ``{"name": "small", ...}``), or None."""
    p = (meta or {}).get("preset")
    p = p.get("name") if isinstance(p, dict) else p
    return str(p) if p not in (None, "") else None


#: The settings a legend names when they differ between the sources of one figure (meta key or
#: table column → how the label says it).
SETTINGS = ("preset", "backend", "long_context", "start_pos", "stages", "calibration")


def _settings(t: Table) -> dict[str, str]:
    """What ran, as a label says it (preset, backend, ``long-context``, ``start``, ``stages``, ``calibration``), from
    the meta file or an ingested table's single-valued columns."""
    from .provenance import calibration_label

    m = t.meta or {}
    own = m if m.get("job") not in ("ingest", "compare") else {}

    def single(col):
        if col in t.df:
            vals = t.df[col].dropna().astype(str).unique()
            return vals[0] if len(vals) == 1 else None
        return None

    out = {}
    preset = _preset(own) or single("preset")
    if preset:
        out["preset"] = preset
    backend = own.get("backend") or single("backend")
    if backend in ("cupy", "sim", "numpy"):  # ds4 logs' "ds4"/"ds4lab" say who wrote the line, not a backend
        out["backend"] = f"{backend} backend"
    if "long_context" in own:
        out["long_context"] = "long-context token" if _truthy(own["long_context"]) else "standard token"
    if own.get("start_pos") is not None:
        out["start_pos"] = f"start {own['start_pos']}"
    if isinstance(own.get("stages"), list):
        out["stages"] = "stages " + ",".join(map(str, own["stages"]))
    if own.get("calibration") and _truthy(own.get("modeled")):
        out["calibration"] = f"calibration {calibration_label(own)}"
    return out


def _same_inputs(dirs) -> None:
    """Raise CompareError naming both when a folder is given twice, by path or by content."""
    from ..trace.sources.common import distinct_inputs

    distinct_inputs(dirs, CompareError, "it would be drawn twice, as two sources; give each folder once")


#: the tables drawn in one figure together (their legends name what differs between them)
FIGURES = {"ladder": ("ladder",), "context": ("context",), "moe": ("moe", "moe-summary"),
           "kernels": ("kernels-sum", "kernels"), "ncu": ("ncu-sites",)}


def collect(dirs, warn=None) -> list[Table]:
    """Every drawable table of every folder, labelled with its input, device, process, the settings that differ
    (:data:`SETTINGS`) and its provenance. Raises CompareError naming a repeated folder, each folder without a table,
    or the first unreadable file."""
    warn = warn or (lambda m: print(f"ds4lab: warning: {m}", file=sys.stderr))
    _same_inputs(dirs)
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
    settings = {id(t): _settings(t) for t in tables}
    tags = {id(t): _tag(t) for t in tables}
    differ: dict[str, set] = {}
    for fig, kinds in FIGURES.items():
        group = [t for t in tables if t.kind in kinds]
        differ[fig] = {k for k in SETTINGS if len({settings[id(t)][k] for t in group if k in settings[id(t)]}) > 1}
        # the backend shows in the provenance already (MODELED, or the GPU): named only where it does not
        if not any(len({settings[id(t)].get("backend") for t in group if tags[id(t)] == tag}) > 1
                   for tag in {tags[id(t)] for t in group}):
            differ[fig].discard("backend")
    used: set[str] = set()
    for t in tables:
        d = t.path.parent
        name = d.name or d.resolve().name
        parts = [t.path.stem] * (t.path.stem not in ("ladder", "context", "moe")) + t.notes
        preset = _preset(t.meta) if t.kind in ("ladder", "context", "moe", "moe-summary") else None
        if preset and not any(preset in p for p in parts):
            parts.append(preset)
        fig = next(f for f, kinds in FIGURES.items() if t.kind in kinds)
        for k in SETTINGS:
            v = settings[id(t)].get(k)
            if k in differ[fig] and v and not any(v in p or (k == "preset" and p == v) for p in parts):
                parts.append(v)
        part = " · ".join(parts)
        t.incomplete = _status(t)
        tag = tags[id(t)]
        t.modeled = tag.startswith("MODELED")
        label = f"{name}{' · ' + part if part else ''} ({tag})"
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


def _modeled_title(title: str, tables: list[Table]) -> str:
    """``title`` saying MODELED where any of its sources is modeled."""
    if not tables or not any(t.modeled for t in tables):
        return title
    if all(t.modeled for t in tables):
        return f"{title} — MODELED (simulated runtime), not measured"
    return f"{title} — MODELED and measured sources side by side (each source's provenance in the legend)"


def _context_points(t: Table) -> tuple[dict, dict]:
    """``({stage: {context: (median, p25, p75)}}, {stage: short name})`` of a context table (µs); rows without a
    median left out, repeated rows as their medians, p25/p75 NaN where absent."""
    nan = float("nan")
    df = t.df.assign(stage=t.df["stage"].astype(str))
    for c in ("us_p25", "us_p75"):
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df else nan
    df = df[df["us_median"].notna()]
    out: dict = {}
    for (stage, ctx), g in df.groupby(["stage", "context"], sort=False):
        out.setdefault(stage, {})[int(ctx)] = (float(g["us_median"].median()), float(g["us_p25"].median()),
                                               float(g["us_p75"].median()))
    names = {}
    if "short" in df:
        for stage, g in df.groupby("stage", sort=False):
            shorts = [str(v) for v in g["short"].dropna().unique() if str(v)]
            if shorts:
                names[stage] = shorts[0]
    return out, names


#: Which profiling mode's times stand for a run, best first: in-graph timestamps and CUPTI see the
#: kernels alone; deferred and host-timed events also count the host's launch gaps (docs/design-log.md).
MODE_PREFERENCE = ("in-graph", "cupti", "deferred", "host-timed")


def _moe_by_tokens(t: Table) -> tuple[str, dict]:
    """``(selection, {tokens: {stage: median µs per call}})`` of a MoE table in one mode and one routing."""
    df, picked = _moe_selection(t)
    col = "ms" if t.kind == "moe" else "median_ms"
    if "tokens" not in df.columns:
        df = df.assign(tokens=0)  # unknown token count: one panel
    out = {}
    for tokens, g in df.groupby("tokens"):
        out[int(tokens)] = (g.groupby("stage")[col].median() * 1e3).to_dict()
    return picked, out


def _moe_selection(t: Table):
    """The rows of ``t`` for one mode and routing (see :func:`_moe_by_tokens`), and what was picked."""
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
    return df, " · ".join(picked)


def moe_fallbacks(t: Table) -> tuple[int, int]:
    """``(calls that fell back to eager, calls)`` in the drawn mode and routing; (0, 0) where the table says nothing."""
    df, _ = _moe_selection(t)
    if {"phase", "note"} <= set(df.columns) and "stage" in df.columns:
        calls = df[df["stage"] == "total"] if (df["stage"] == "total").any() else df.drop_duplicates(
            [c for c in ("token", "layer", "tokens") if c in df.columns])
        fb = calls["phase"].astype(str).eq("eager") & calls["note"].astype(str).str.contains("fallback", case=False)
        return int(fb.sum()), len(calls)
    if {"fallback_calls", "calls"} <= set(df.columns):
        per = df.drop_duplicates([c for c in ("tokens",) if c in df.columns])
        return int(pd.to_numeric(per["fallback_calls"], errors="coerce").fillna(0).sum()), \
            int(pd.to_numeric(per["calls"], errors="coerce").fillna(0).sum())
    return 0, 0


def figures(tables: list[Table]) -> list:
    """The ``(figure, file stem)`` pairs of ``ds4lab compare`` for the tables :func:`collect` found."""
    from . import plots

    figs = []
    lads = [t for t in tables if t.kind == "ladder"]
    lad = {t.label: t.df.assign(stage=t.df["stage"].astype(str)).groupby("stage", sort=False)["us_median"]
           .mean().to_dict() for t in lads}
    if lad:
        stages = list(dict.fromkeys(s for v in lad.values() for s in v))
        figs.append((plots.grouped_bars_figure(lad, stages, "µs per token (median)", _modeled_title(
            "stage ladder, side by side (sources in the legend)", lads)), "compare_ladder"))
    ctxs = [t for t in tables if t.kind == "context"]
    if ctxs:
        from ..experiments.stages import STAGES

        per, names = {}, {}
        for t in ctxs:
            per[t.label], own = _context_points(t)
            for st, short in own.items():
                names.setdefault(st, [])
                if short not in names[st]:
                    names[st].append(short)
        seen = list(dict.fromkeys(st for pts in per.values() for st in pts))  # ladder order, then the others
        order = [st for st in STAGES if st in seen] + [st for st in seen if st not in STAGES]
        names = {st: " / ".join(names[st]) if st in names else STAGES[st].short if st in STAGES else ""
                 for st in order}
        figs.append((plots.compare_context_figure(per, order, names=names, title=_modeled_title(
            "context ladder: µs per token of each stage at each context, side by side (sources in the legend)",
            ctxs)), "compare_context"))
    moes = [t for t in tables if t.kind in ("moe", "moe-summary")]
    moe = {}
    for t in moes:
        mode, per_tokens = _moe_by_tokens(t)
        fb, calls = moe_fallbacks(t)
        fell = f" · eager fallback in {fb} of {calls} calls" if fb else ""
        moe[t.label + (f" · {mode}" if mode else "") + fell] = per_tokens
    if moe:
        figs.append((plots.compare_moe_figure(moe, MOE_STAGES, title=_modeled_title(
            "Routed-MoE stages side by side (each source's mode and provenance in the legend)", moes)),
            "compare_moe"))
    kts = [t for t in tables if t.kind in ("kernels-sum", "kernels")]
    kern = {}
    for t in kts:
        col = "total_time_us" if t.kind == "kernels-sum" else "us"
        kern[t.label] = t.df.assign(name=t.df["name"].astype(str)).groupby("name")[col].sum().to_dict()
    if kern:
        names = sorted({n for v in kern.values() for n in v}, key=lambda n: -max(v.get(n, 0) for v in kern.values()))
        note = ("nsys stats kernel summaries (nsys_kernels) add up every device and process of a report: such a "
                "bar is that sum" if any(t.kind == "kernels-sum" for t in kts) else None)
        figs.append((plots.grouped_bars_figure(kern, names[:10], "µs in total", _modeled_title(
            "largest kernels by total time, side by side", kts), rotate=True, note=note), "compare_kernels"))
    ncu = {t.label: t.df for t in tables if t.kind == "ncu-sites"}
    if ncu:
        figs.append((plots.ncu_sites_figure(ncu), "compare_ncu_sites"))
    return figs
