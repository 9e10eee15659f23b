"""ds4lab result folders from other machines: every CSV beside a ``meta.json`` ds4lab wrote (yields summary tables)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .common import Ingested, SourceError, csv_shape_problems, load_meta, problem

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"ds4lab-folder": "a ds4lab result folder"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("tables",)


def read_ds4lab_folder(path: Path, lenient: bool, read_meta=load_meta) -> Ingested:
    """A ds4lab result folder: every CSV beside its meta.json, tagged ``machine``, ``status`` and (where missing)
    ``modeled``; a run not ``complete`` is warned; a cut line of a table is malformed (file and line).
    ``read_meta(file)``: how ``meta.json`` is read."""
    res = Ingested(path, "ds4lab-folder")
    meta = read_meta(path / "meta.json")
    modeled = bool(meta.get("modeled"))
    where = str(meta.get("device") or "?") + (" (modeled)" if modeled else "")
    status = str(meta.get("status", "")) if "status" in meta else ("" if "job" not in meta else "no status")
    if status and status.lower() not in ("complete", "done"):
        res.warnings.append(f"{path}: meta.json status {status!r}: an incomplete run")
    csvs = sorted(f for f in path.glob("*.csv") if f.is_file())
    if not csvs:
        raise SourceError(f"{path}: a ds4lab result folder without any table: expected its result CSVs "
                          "(ladder.csv, moe.csv, summary.csv, ...) beside meta.json")
    for f in csvs:
        bad = csv_shape_problems(f)
        for line, why in bad:  # a half row would otherwise be read with its missing cells empty
            problem(res, lenient, line, f"{f.name}: {why}")
        try:
            df = pd.read_csv(f, skiprows=[line - 1 for line, _ in bad])
        except Exception as e:  # noqa: BLE001 — report which file
            problem(res, lenient, 0, f"{f.name}: unreadable CSV ({e})")
            continue
        df["machine"] = where
        df["status"] = status
        if "modeled" not in df:
            df["modeled"] = modeled
        df["file"] = str(f)
        df["source"] = str(f)
        res.tables[f"ds4lab_{f.stem}"] = df
    return res
