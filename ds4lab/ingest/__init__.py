"""Read real profiles into ds4lab's tidy tables: ds4's MoE profile lines, Nsight Systems exports
(``nsys stats`` CSV reports, the SQLite export), Nsight Compute CSV output, and ds4lab result folders
from other machines. One module per format:

* :mod:`.ds4log` — ds4's ``DS4_CUDA_MOE_PROFILE`` stderr lines and the ds4-format logs ``ds4lab moe``
  writes (``ds4-log`` → table ``ds4_moe``);
* :mod:`.nsys_csv` — every ``nsys stats --format csv`` report, told apart by its title line
  (``nsys-csv`` → ``nsys_kernels``, ``nsys_nvtx``, ``nsys_nvtx_kernels``, ``nsys_cuda_api``,
  ``nsys_mem_time``, ``nsys_mem_size``, ``nsys_gpu_trace``, ``nsys_api_trace``, ``nsys_osrt``; other
  reports skipped by name);
* :mod:`.nsys_sqlite` — ``nsys export --type sqlite`` (``nsys-sqlite`` → ``kernels``, ``graphs``,
  ``nvtx`` with domain names; a warning when graph executions come without their kernels);
* :mod:`.ncu` — ``ncu --csv`` details or raw page (``ncu-csv`` → ``ncu_kernels``, ``ncu_metrics``;
  with ``sites=PRESET`` also ``ncu_sites``, joined to ds4lab's launch sites);
* :mod:`.folder` — ds4lab result folders (``ds4lab-folder`` → ``ds4lab_<table>``).

The format is detected from the content, never from the file name (:func:`detect`): a folder with a
ds4lab ``meta.json``; a file starting ``SQLite format 3``; text with ``ds4: CUDA MoE profile`` lines;
text with an ncu CSV header (``"ID","Process ID"``); text with ``nsys stats`` reports.

Every table has a ``file`` column (the input it came from: one source per file, so that ``compare``
draws one bar per file) and a ``source`` column (``file:line``, the SQLite row number, or the CSV a
ds4lab folder's table came from).

Malformed input raises :class:`IngestError` naming the file and line; with ``lenient=True`` the good
rows are kept and every bad line is reported (:attr:`Ingested.problems`), never dropped silently.
What is read but not turned into rows (a report ds4lab does not read, unit assumptions, graph
executions without their kernels) is named in :attr:`Ingested.warnings`. An input that cannot be
read at all (no such file, a broken ``meta.json``, a ds4lab folder without a table, an unreadable
SQLite database), the same input given twice, and an ``--out`` that cannot be a folder are
IngestErrors in either mode.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import ncu as _ncu
from . import nsys_csv as _nsys_csv_mod
from ..moeprof.ds4log import ds4lab_header, ds4lab_header_fields
from .common import IngestError, Ingested, check_out_dir, load_meta
from .ds4log import DS4_PREFIX, MOE_STAGES, TOTAL_SLACK_MS, read_ds4_log
from .folder import read_ds4lab_folder
from .ncu import read_ncu_csv
from .nsys_csv import read_nsys_csv
from .nsys_sqlite import read_nsys_sqlite

__all__ = ["IngestError", "Ingested", "MOE_STAGES", "OUTPUT_GLOBS", "TOTAL_SLACK_MS", "check_out_dir", "detect",
           "ds4lab_header", "ds4lab_header_fields", "ingest", "ingest_all", "load_meta", "read_ds4_log"]

#: every table name ingest writes (``<name>.csv`` under ``--out``), and the problems file
OUTPUT_GLOBS = ("ds4_moe.csv", "nsys_*.csv", "kernels.csv", "graphs.csv", "nvtx.csv", "ncu_*.csv", "ds4lab_*.csv",
                "ingest_problems.csv", "ingest_warnings.csv")
_READERS = {"ds4-log": read_ds4_log, "nsys-csv": read_nsys_csv, "nsys-sqlite": read_nsys_sqlite,
            "ncu-csv": read_ncu_csv, "ds4lab-folder": read_ds4lab_folder}


def detect(path: Path) -> str:
    """The input's format from its content (see the module docstring): ``ds4lab-folder``,
    ``nsys-sqlite``, ``ds4-log``, ``ncu-csv`` or ``nsys-csv``. Raises IngestError naming the path
    (and a short escaped excerpt of an unrecognised file)."""
    path = Path(path)
    if path.is_dir():
        meta = path / "meta.json"
        if meta.is_file():
            if "ds4lab" in load_meta(meta):
                return "ds4lab-folder"
            raise IngestError(f"{meta}: not written by ds4lab (no \"ds4lab\" key)")
        raise IngestError(f"{path}: a folder without a ds4lab meta.json")
    if not path.is_file():
        raise IngestError(f"{path}: no such file")
    try:
        head = path.read_bytes()[:4096]
        full = path.read_text(errors="replace")
    except OSError as e:
        raise IngestError(f"{path}: unreadable ({e.strerror or e})") from None
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if DS4_PREFIX in full:
        return "ds4-log"
    if _ncu.looks_like(full):
        return "ncu-csv"
    if _nsys_csv_mod.looks_like(full):
        return "nsys-csv"
    raise IngestError(f"{path}: not a ds4 MoE profile log, an nsys stats CSV, an nsys SQLite export, ncu --csv "
                      f"output or a ds4lab result folder (starts with {head[:40]!r})")


def ingest(path: Path, lenient: bool = False, sites: str | None = None) -> Ingested:
    """Read one input (format from :func:`detect`). ``sites`` (a preset name) joins ncu kernels to
    ds4lab's launch sites of that preset (:func:`ds4lab.ingest.ncu.join_sites`) and adds the
    per-site table ``ncu_sites``; without it ``ncu_sites`` groups by the NVTX cluster and op alone.
    Raises IngestError (file and line) unless ``lenient``; an unknown preset is an IngestError."""
    kind = detect(path)
    try:
        res = _READERS[kind](Path(path), lenient)
    except OSError as e:
        raise IngestError(f"{path}: unreadable ({e.strerror or e})") from None
    k = res.tables.get("ncu_kernels")
    if k is not None and not k.empty:
        if sites:
            from ..token.config import ConfigError

            try:
                st = _ncu.site_table(sites)
            except (ConfigError, KeyError) as e:
                raise IngestError(f"--sites {sites}: {e.args[0] if e.args else 'unknown preset'}") from None
            k = _ncu.join_sites(k, st)
            res.tables["ncu_kernels"] = k
            unknown = sorted({f"{c}/{o}" for c, o, ok in zip(k["cluster"], k["op"], k["site_known"])
                              if not ok and isinstance(o, str)})
            if unknown:
                res.warnings.append(f"{path}: {len(unknown)} NVTX cluster/op pair(s) that ds4lab's {sites} token "
                                    f"does not launch: {', '.join(unknown[:6])}")
        elif k["op"].isna().all():
            res.warnings.append(f"{path}: no kernel carries ds4lab's NVTX stack (profile with ncu --nvtx and "
                                "ds4lab --nvtx): sites cannot be told apart")
        res.tables["ncu_sites"] = _ncu.per_site(k)
    return res


def ingest_all(paths, out: Path, lenient: bool = False, sites: str | None = None) -> list[Ingested]:
    """Ingest every path and write each table to ``out/<table>.csv`` (the rows of all inputs, each
    row's ``file`` naming its input), the bad lines to ``out/ingest_problems.csv`` and the warnings
    to ``out/ingest_warnings.csv``. Once every
    input was read, the tables an earlier ingest left in ``out`` (:data:`OUTPUT_GLOBS`) are removed
    first, so that ``out`` holds this run's tables only. Raises IngestError on the first bad input
    unless ``lenient`` (a file that cannot be read at all, a broken ``meta.json``, the same input
    given twice, and an ``out`` that cannot be a folder are errors either way); ``out`` is left
    untouched then."""
    out = Path(out)
    check_out_dir(out)
    given: dict[Path, Path] = {}
    for p in map(Path, paths):
        key = p.resolve()
        if key in given:
            same = "" if str(given[key]) == str(p) else f" (as {given[key]} and as {p})"
            raise IngestError(f"{p}: given twice{same}: its rows would be counted twice; give each input once")
        given[key] = p
    results = [ingest(Path(p), lenient, sites) for p in paths]
    merged: dict[str, list[pd.DataFrame]] = {}
    for r in results:
        for name, df in r.tables.items():
            if not df.empty:
                merged.setdefault(name, []).append(df)
    problems = [p for r in results for p in r.problems]
    try:
        if out.is_dir():
            for pat in OUTPUT_GLOBS:
                for f in out.glob(pat):
                    if f.is_file() or f.is_symlink():
                        f.unlink()
        out.mkdir(parents=True, exist_ok=True)
        for name, dfs in merged.items():
            pd.concat(dfs, ignore_index=True).to_csv(out / f"{name}.csv", index=False)
        if problems:
            pd.DataFrame(problems).to_csv(out / "ingest_problems.csv", index=False)
        warned = [{"file": str(r.path), "warning": w} for r in results for w in r.warnings]
        if warned:
            pd.DataFrame(warned).to_csv(out / "ingest_warnings.csv", index=False)
    except OSError as e:
        raise IngestError(f"--out {out}: cannot write ({e.strerror or e}: {e.filename or out})") from None
    return results
