"""``nsys stats --format csv`` output: every report in the file told apart by its title, read into
its own table or reported as skipped by name.

Sources: Nsight Systems "Post-Collection Analysis Guide" (docs.nvidia.com/nsight-systems/
AnalysisGuide), section "Statistical Reports Shipped With Nsight Systems" for the report names, their
columns and "All time values given in nanoseconds by default"; the report names before the 2022
renaming (``gpukernsum``, ``nvtxsum``, ``cudaapisum``, ``gpumemtimesum``, ``gpumemsizesum``,
``gputrace``, ``osrtsum``) are the same reports under their older names.

How a report is recognised, in this order:

* a title line ``** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):`` (what ``nsys stats`` prints
  before each report) or a ``Processing [...] with [.../cuda_gpu_kern_sum.py]...`` line (older
  versions): the report name in it decides, whatever the columns;
* a CSV table without either line before it: by its columns, and only for the two shapes that
  cannot be mistaken (a kernel summary: ``Total Time`` and ``Instances`` and ``Name``; an NVTX
  summary: ``Total Time`` and ``Range``); any other untitled table is skipped, with a warning that
  names its columns.

A report this module does not read (``cuda_api_gpu_sum``, ``um_sum``, ...) is skipped with a warning
naming it (:attr:`Ingested.warnings`), never merged into another table.

Columns: every column of a read report is kept. A header with a unit (``Total Time (ns)``, ``Avg
(us)``, ``Total (MB)``) gives a number column named after it (``total_time_us``: times converted to
µs; other units keep theirs: ``total_mb``). A time column without a unit (older versions print
``Average``, ``Minimum``, ``Maximum``, ``Total Time``, ``StdDev``) is read in ns, the documented
default, converted to µs, and a warning says so once per report; in a size report
(``cuda_gpu_mem_size_sum``/``gpumemsizesum``) such a column has no documented default unit: it is
kept as printed, named ``<column>_unit_not_stated``, with a warning. Count columns (``Instances``,
``Num Calls``, ``Count``, ``Time (%)``/``Time(%)``, ids) are numbers; every other column is kept as
text. A number column's cell that is not a number, is negative or is not finite is a malformed row
(file and line), except an empty cell in a trace report (a memory copy has no grid), read as empty.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd

from .common import TIME_UNIT_US, Ingested, finite_nonneg, num, problem, snake

#: report name (current and older) → table name under ``--out``
REPORTS = {
    "cuda_gpu_kern_sum": "nsys_kernels", "gpukernsum": "nsys_kernels",
    "nvtx_sum": "nsys_nvtx", "nvtxsum": "nsys_nvtx", "nvtx_pushpop_sum": "nsys_nvtx",
    "nvtx_startend_sum": "nsys_nvtx", "nvtxppsum": "nsys_nvtx",
    "nvtx_kern_sum": "nsys_nvtx_kernels", "nvtxkernsum": "nsys_nvtx_kernels",
    "cuda_api_sum": "nsys_cuda_api", "cudaapisum": "nsys_cuda_api",
    "cuda_gpu_mem_time_sum": "nsys_mem_time", "gpumemtimesum": "nsys_mem_time",
    "cuda_gpu_mem_size_sum": "nsys_mem_size", "gpumemsizesum": "nsys_mem_size",
    "cuda_gpu_trace": "nsys_gpu_trace", "gputrace": "nsys_gpu_trace",
    "cuda_api_trace": "nsys_api_trace", "cudaapitrace": "nsys_api_trace",
    "osrt_sum": "nsys_osrt", "osrtsum": "nsys_osrt",
}
#: the tables this module writes (for ``--out`` clean-up)
TABLES = tuple(sorted(set(REPORTS.values())))
#: reports of sizes, not times: a unit-less column there is not read as ns
SIZE_REPORTS = ("cuda_gpu_mem_size_sum", "gpumemsizesum")
#: reports listing one row per event (an empty number cell is allowed there)
TRACE_REPORTS = ("cuda_gpu_trace", "gputrace", "cuda_api_trace", "cudaapitrace")
#: the column that names a row, per table, renamed to ``name`` (what ``compare`` reads)
NAME_COLUMN = {"nsys_kernels": ("Name",), "nsys_nvtx": ("Range", "Name"), "nsys_cuda_api": ("Name",),
               "nsys_osrt": ("Name",), "nsys_gpu_trace": ("Name",), "nsys_api_trace": ("Name",),
               "nsys_nvtx_kernels": ("Kernel Name",), "nsys_mem_time": ("Operation",),
               "nsys_mem_size": ("Operation",)}
#: unit-less headers that are times in older versions (documented default: ns)
UNITLESS_TIME = {"total time", "average", "avg", "median", "med", "minimum", "min", "maximum", "max", "stddev",
                 "std dev", "start", "duration", "end"}
#: unit-less headers that are counts, percentages or ids
COUNT_COLUMNS = {"instances", "num calls", "calls", "count", "operations", "time (%)", "time(%)", "time %",
                 "nvtx inst", "kern inst", "pid", "tid", "corrid", "grdx", "grdy", "grdz", "blkx", "blky", "blkz",
                 "reg/trd", "ctx", "strm", "greenctx"}  # "Device" is a name in cuda_gpu_trace

_TITLE = re.compile(r"^\s*\*\*\s*(?P<title>.*?)\s*\((?P<report>[A-Za-z0-9_]+)(?::[^)]*)?\)\s*:?\s*$")
_PROCESSING = re.compile(r"^\s*Processing \[.*?\] with \[(?:.*[/\\])?(?P<report>[A-Za-z0-9_]+)(?:\.py)?\]")
_UNIT = re.compile(r"^(?P<base>.+?)\s*\((?P<unit>[^()]+)\)$")


def looks_like(text: str) -> bool:
    """Whether ``text`` holds ``nsys stats`` output: a report title or processing line, or a CSV
    header with a ``Total Time`` column (summary reports) or ``Start``/``Duration`` (trace reports)."""
    if any(_TITLE.match(l) or _PROCESSING.match(l) for l in text.splitlines()[:2000]):
        return True
    return bool(re.search(r'^"?Time ?\(%\)"?,.*"?Total Time', text, re.M)
                or re.search(r'"?Total Time \((ns|us|ms|s)\)"?', text)
                and re.search(r'"?(Name|Range)"?\s*$', text, re.M))


def _header(cells: list[str]) -> bool:
    """Whether a CSV row is a report's header (all cells non-numeric text, more than one)."""
    if len(cells) < 2:
        return False
    for c in cells:
        try:
            num(c)
            return False
        except ValueError:
            pass
    return True


def read_nsys_csv(path: Path, lenient: bool) -> Ingested:
    """Every report of an ``nsys stats`` CSV file → one table per report kind (:data:`REPORTS`),
    every column kept (see the module docstring), with ``report`` (the report name), ``file`` and
    ``source`` (``<file name>:<line>``). Raises IngestError (file, line, column, value) for a
    malformed row unless ``lenient``; skipped reports and unit assumptions go to ``warnings``."""
    res = Ingested(path, "nsys-csv")
    lines = path.read_text(errors="replace").splitlines()
    rows: dict[str, list[dict]] = {}
    report, title_line = None, 0
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _TITLE.match(line) or _PROCESSING.match(line)
        if m:
            if report and m["report"] != report:
                _no_table(res, report, title_line, lines, i)
            report, title_line = m["report"], i + 1
            i += 1
            continue
        if not line.strip() or not line.lstrip().startswith('"') and "," not in line:
            i += 1
            continue
        try:
            hdr = [h.strip() for h in next(csv.reader([line]), [])]
        except csv.Error:
            i += 1
            continue
        if not _header(hdr):
            i += 1
            continue
        name = report if report else _by_columns(hdr)
        end = i + 1
        while end < len(lines) and lines[end].strip() and not (_TITLE.match(lines[end])
                                                               or _PROCESSING.match(lines[end])):
            end += 1
        table = REPORTS.get(name or "")
        if table is None:
            what = (f"report {name!r} (line {title_line})" if report else
                    f"a table without a report title at line {i + 1} (columns: {', '.join(hdr[:10])})")
            res.warnings.append(f"{path}: skipped {what}, {end - i - 1} row(s): ds4lab reads "
                                f"{', '.join(sorted({k for k in REPORTS if '_' in k}))}")
        else:
            _read_table(res, lenient, lines, i, end, hdr, name, table, rows)
        report = None
        i = end
    if report:
        _no_table(res, report, title_line, lines, len(lines))
    if not rows and not res.problems:
        skipped = "; ".join(res.warnings) if res.warnings else "no report title and no CSV table"
        problem(res, lenient, 0, f"no report ds4lab reads ({skipped})")
    for table, rs in rows.items():
        res.tables[table] = pd.DataFrame(rs)
    return res


def _no_table(res: Ingested, report: str, title_line: int, lines: list[str], end: int) -> None:
    """A report title with no table after it (nsys prints e.g. ``SKIPPED: ... does not contain CUDA
    trace data.``): a warning with the report's name and what nsys said."""
    said = next((l.strip() for l in lines[title_line:end] if l.strip()), "nothing")
    res.warnings.append(f"{res.path}:{title_line}: report {report} has no table ({said[:160]})")


def _by_columns(hdr: list[str]) -> str | None:
    """The report an untitled table must be (the two unmistakable shapes), else None."""
    cols = {re.sub(r"\s*\(.*\)$", "", h).strip() for h in hdr}
    if "Total Time" in cols and "Instances" in cols and "Name" in cols:
        return "cuda_gpu_kern_sum"
    if "Total Time" in cols and "Range" in cols:
        return "nvtx_sum"
    return None


def _columns(hdr: list[str], report: str) -> tuple[list[tuple[str, str, float | None]], list[str], list[str]]:
    """Per header cell: (header, output column, factor to apply or None for text), the unit-less
    time columns read as ns, and the unit-less columns of a size report (kept as printed, named
    ``<column>_unit_not_stated``)."""
    out, assumed, unstated, used = [], [], [], set()
    for h in hdr:
        m = _UNIT.match(h)
        low = h.lower()
        if m and m["unit"].strip() in TIME_UNIT_US:
            col, f = snake(m["base"]) + "_us", TIME_UNIT_US[m["unit"].strip()]
        elif m and m["unit"].strip() == "%":
            col, f = snake(m["base"]) + "_pct", 1.0
        elif m:
            col, f = snake(m["base"]) + "_" + snake(m["unit"]), 1.0
        elif low in UNITLESS_TIME and report not in SIZE_REPORTS:
            col, f = snake(h) + "_us", TIME_UNIT_US["ns"]
            assumed.append(h)
        elif low in UNITLESS_TIME or low == "total":  # a size report: no documented default unit
            col, f = snake(h) + "_unit_not_stated", 1.0
            unstated.append(h)
        elif low in COUNT_COLUMNS:
            col, f = snake(h), 1.0
        else:
            col, f = snake(h), None
        while col in used:
            col += "_"
        used.add(col)
        out.append((h, col, f))
    return out, assumed, unstated


def _read_table(res, lenient, lines, i, end, hdr, report, table, rows) -> None:
    path = res.path
    cols, assumed, unstated = _columns(hdr, report)
    if assumed:
        res.warnings.append(f"{path}:{i + 1}: report {report}: columns without a unit ({', '.join(assumed)}) "
                            "read as ns, the documented default of nsys stats, and converted to µs")
    if unstated:
        res.warnings.append(f"{path}:{i + 1}: report {report}: size columns without a unit ({', '.join(unstated)}) "
                            "kept as printed (no documented default), named *_unit_not_stated")
    name_from = next((h for h in NAME_COLUMN.get(table, ()) if h in hdr), None)
    trace = report in TRACE_REPORTS
    for k in range(i + 1, end):
        n = k + 1
        try:
            cells = next(csv.reader([lines[k]]))
        except csv.Error as e:
            problem(res, lenient, n, f"unreadable CSV ({e})", lines[k])
            continue
        if len(cells) != len(hdr):
            problem(res, lenient, n, f"{len(cells)} fields, the header of report {report} has {len(hdr)}", lines[k])
            continue
        row, bad = {"report": report}, None
        for (h, col, f), cell in zip(cols, cells):
            if f is None:
                row[col] = cell.strip()
                continue
            if not cell.strip() and trace:
                row[col] = float("nan")
                continue
            try:
                v = num(cell)
            except ValueError:
                bad = f"bad number in column {h!r}: {cell.strip()!r}"
                break
            why = finite_nonneg(v)
            if why:
                bad = f"{h}={cell.strip()} is {why}"
                break
            row[col] = v * f
        if bad:
            problem(res, lenient, n, bad, lines[k])
            continue
        if name_from is not None:
            row["name"] = cells[hdr.index(name_from)].strip()
        row["file"] = str(path)
        row["source"] = f"{path.name}:{n}"
        rows.setdefault(table, []).append(row)
