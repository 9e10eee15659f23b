"""``nsys stats --format csv`` output: every report in the file told apart by its title (or, in the per-report files of
``-o PREFIX``, by its file name and columns: :func:`report_by_columns`), read into its own table or skipped by name
with a warning; the text format refused ("rerun with `--format csv`"). How reports are recognised and how their
columns and units are read: ``docs/trace-readers.md``, "nsys stats --format csv"."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd

from .common import TIME_UNIT_US, Ingested, ends_with_newline, finite_nonneg, num, problem, snake, text_lines

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"nsys-csv": "nsys stats CSV reports"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("tables",)

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

#: report names nsys has that ds4lab does not read (for a file name ``PREFIX_<report>.csv``)
OTHER_REPORTS = ("cuda_api_gpu_sum", "cuda_gpu_kern_gb_sum", "cuda_gpu_sum", "cuda_kern_exec_sum",
                 "cuda_kern_exec_trace", "dx11_pix_sum", "dx12_gpu_marker_sum", "dx12_pix_sum", "mpi_event_sum",
                 "mpi_event_trace", "network_sum", "nvtx_gpu_proj_sum", "nvtx_gpu_proj_trace", "nvtx_pushpop_trace",
                 "openacc_sum", "opengl_khr_gpu_range_sum", "opengl_khr_range_sum", "openmp_sum", "syscall_sum",
                 "um_cpu_page_faults_sum", "um_sum", "um_total_sum", "vulkan_api_sum", "vulkan_api_trace",
                 "vulkan_gpu_marker_sum", "vulkan_marker_sum", "wddm_queue_sum")
#: rows handed over at a time while a report is read (bounded memory for long trace reports)
CHUNK_ROWS = 50_000
#: a CUDA runtime or driver API call's name (``cudaLaunchKernel``, ``cuLaunchKernel_v7000``)
_CUDA_CALL = re.compile(r"^_*cu(da)?[A-Z]")
#: the line of dashes under the column names in the text (column) format
_DASHES = re.compile(r"^\s*-{2,}(?:\s+-{2,})+\s*$")
#: column names (units removed) nsys stats prints in the reports ds4lab reads: a CSV header has one
_KNOWN_COLUMNS = {"Time", "Total Time", "Instances", "Avg", "Med", "Min", "Max", "StdDev", "Name", "Range", "Style",
                  "NVTX Range", "Kernel Name", "Num Calls", "Count", "Operation", "Total", "Start", "Duration",
                  "Average", "Minimum", "Maximum", "Operations", "CorrId", "CorrID", "Result", "Device"}
_TITLE = re.compile(r"^\s*\*\*\s*(?P<title>.*?)\s*\((?P<report>[A-Za-z0-9_]+)(?::[^)]*)?\)\s*:?\s*$")
_PROCESSING = re.compile(r"^\s*Processing \[.*?\] with \[(?:.*[/\\])?(?P<report>[A-Za-z0-9_]+)(?:\.py)?\]")
_UNIT = re.compile(r"^(?P<base>.+?)\s*\((?P<unit>[^()]+)\)$")


def looks_like(text: str) -> bool:
    """Whether ``text`` holds ``nsys stats`` output: a report title or processing line, a CSV header with ``Total
    Time`` or ``Start``/``Duration``, or the text format's header and dashes."""
    lines = text.splitlines()[:2000]
    if any(_TITLE.match(l) or _PROCESSING.match(l) for l in lines):
        return True
    if text_format_line(lines) is not None:
        return True
    for line in lines[:50]:  # a per-report file of `nsys stats -o`: its header is the first CSV line
        if line.lstrip().startswith('"'):
            try:
                cells = [c.strip() for c in next(csv.reader([line]), [])]
            except csv.Error:
                break
            if _header(cells) and (report_by_columns(cells)[0] is not None
                                   or {"Total Time", "Num Calls", "Name"} <= {_unit_free(c) for c in cells}):
                return True
            break
    return bool(re.search(r'^"?Time ?\(%\)"?,.*"?Total Time', text, re.M)
                or re.search(r'"?Total Time \((ns|us|ms|s)\)"?', text)
                and re.search(r'"?(Name|Range)"?\s*$', text, re.M)
                or re.search(r'^"Start \((ns|us|ms|s)\)","Duration \((ns|us|ms|s)\)"', text, re.M))


def text_format_line(lines) -> int | None:
    """The 1-based line of the first line of dashes that follows a line of column names holding ``Time``, ``Name`` or
    ``Range``: ``nsys stats``'s text (column) format; None when there is none."""
    prev = ""
    for i, line in enumerate(lines):
        if _DASHES.match(line) and re.search(r"\b(Time|Name|Range|Operation|Start)\b", prev):
            return i + 1
        if line.strip():
            prev = line
    return None


def _unit_free(h: str) -> str:
    return re.sub(r"\s*\(.*\)$", "", h).strip()


def _header(cells: list[str]) -> bool:
    """Whether a CSV row is a report's header: more than one cell, none a number, at least one a column name nsys
    prints (so a data row of text cells is never taken for a header)."""
    if len(cells) < 2:
        return False
    for c in cells:
        try:
            num(c)
            return False
        except ValueError:
            pass
    return any(_unit_free(c) in _KNOWN_COLUMNS for c in cells)


def report_by_columns(hdr: list[str], names=()) -> tuple[str | None, str]:
    """The report an untitled table is, from its columns (and, for the API summaries' shared columns, its rows'
    ``names``): ``(report, "")``, or ``(None, why not)``."""
    cols = {_unit_free(h) for h in hdr}
    if "Kernel Name" in cols and ("NVTX Range" in cols or "Range" in cols):
        return "nvtx_kern_sum", ""
    if "Total Time" in cols and "Instances" in cols and "Name" in cols and not cols & {"GridXYZ", "BlockXYZ"}:
        return "cuda_gpu_kern_sum", ""
    if "Total Time" in cols and "Range" in cols:
        return "nvtx_sum", ""
    if "Operation" in cols and "Total Time" in cols and "Category" not in cols:
        return "cuda_gpu_mem_time_sum", ""
    if "Operation" in cols and "Total" in cols:
        return "cuda_gpu_mem_size_sum", ""
    if {"Start", "Duration", "Name"} <= cols and cols & {"GrdX", "Strm", "CorrId"}:
        return "cuda_gpu_trace", ""
    if {"Start", "Duration", "Name", "Result"} <= cols:
        return "cuda_api_trace", ""
    if {"Total Time", "Num Calls", "Name"} <= cols:
        names = [n for n in names if n]
        if names and all(_CUDA_CALL.match(n) for n in names):
            return "cuda_api_sum", ""
        shown = ", ".join(sorted(set(names))[:4]) or "no rows"
        return None, (f"an API summary ({', '.join(hdr[:10])}) whose rows ({shown}) are not all CUDA calls: "
                      "osrt_sum, syscall_sum, vulkan_api_sum and other reports share these columns; keep the file "
                      "name nsys stats -o gives it (PREFIX_<report>.csv), or print titles (nsys stats without -o)")
    return None, f"columns: {', '.join(hdr[:10])}"


def report_by_file_name(path: Path) -> str | None:
    """The report ``nsys stats --format csv -o PREFIX`` named the file after (``PREFIX_<report>.csv``), the longest
    known report name the name ends with; None when it names none."""
    name = Path(path).name
    known = sorted(set(REPORTS) | set(OTHER_REPORTS), key=len, reverse=True)
    return next((r for r in known if name.endswith(f"_{r}.csv") or name == f"{r}.csv"), None)


class _Table:
    """One report's table being read: its header, columns and rows so far."""

    def __init__(self, report: str | None, table: str | None, hdr: list[str], line: int, title_line: int,
                 why: str = "") -> None:
        self.report, self.table, self.hdr, self.line, self.title_line, self.why = report, table, hdr, line, \
            title_line, why
        self.cols = self.assumed = self.unstated = None
        self.rows: list[dict] = []
        self.raw: list[tuple[int, str]] = []  # rows held back until the report is known (untitled API summary)
        self.pending = False  # an untitled API summary: its rows decide which report it is
        self.count = 0
        self.skipped = 0


def read_nsys_csv(path: Path, lenient: bool, res: Ingested | None = None) -> Ingested:
    """Every report of an ``nsys stats`` CSV file → one table per report kind (:data:`REPORTS`) with ``report``,
    ``file``, ``source``, streamed :data:`CHUNK_ROWS` rows at a time. Raises SourceError (file, line, column, value)
    for a malformed row unless ``lenient``, and for the text format; the rest goes to ``warnings``."""
    path = Path(path)
    res = res if res is not None else Ingested(path, "nsys-csv")
    st = {"report": None, "title_line": 0, "said": [], "t": None, "other": [], "empty": [], "prev": "",
          "by_name": report_by_file_name(path), "cut": not ends_with_newline(path)}
    held = None  # each line is handled when the next one is read: the last one is known to be last
    for n, line in text_lines(res, path):
        if held is not None:
            _line(res, lenient, st, *held, last=False)
        held = (n, line)
    if held is not None:
        _line(res, lenient, st, *held, last=True)
    _end_table(res, lenient, st)
    if st["report"]:
        _no_table(res, st)
    if st["other"]:
        ls = st["other"]
        res.warnings.append(f"{path}: {len(ls)} line(s) outside any report, not tabled (line(s) "
                            f"{', '.join(map(str, ls[:8]))}{', ...' if len(ls) > 8 else ''}): nsys's own messages")
    if not res.counts() and not res.problems:
        if st["empty"]:
            why = "; ".join(f"report {r} (line {ln}) has its title and header but no rows" for r, ln in st["empty"])
        elif res.warnings:
            why = "; ".join(res.warnings)
        else:
            why = "no report title and no CSV table"
        problem(res, lenient, 0, f"no report ds4lab reads ({why})")
    return res


def _line(res, lenient, st, n: int, line: str, last: bool) -> None:
    """One line of the file, in the state ``st`` (the report titled, the table being read)."""
    from .common import SourceError

    if _DASHES.match(line) and re.search(r"\b(Time|Name|Range|Operation|Start)\b", st["prev"]):
        raise SourceError(f"{res.path}:{n}: this is the text format of nsys stats (columns under a line of dashes), "
                          "not CSV: rerun with `--format csv`, e.g. nsys stats --report cuda_gpu_kern_sum "
                          "--format csv REPORT.nsys-rep > stats.csv")
    if line.strip():
        st["prev"] = line
    m = _TITLE.match(line) or _PROCESSING.match(line)
    if m:
        _end_table(res, lenient, st)
        if st["report"] and m["report"] != st["report"]:
            _no_table(res, st)
        st.update(report=m["report"], title_line=n, said=[])
        return
    if not line.strip():
        _end_table(res, lenient, st)
        return
    t = st["t"]
    if t is not None:
        if last and st["cut"]:  # no newline after it: a row cut short would pass for a whole one
            problem(res, lenient, n, "the file ends in the middle of this line: cut off (truncated), not read", line)
            return
        _row(res, lenient, t, n, line)
        return
    try:
        cells = [h.strip() for h in next(csv.reader([line]), [])]
    except csv.Error:
        cells = []
    if line.lstrip().startswith('"') or "," in line:
        if _header(cells):
            _start_table(res, st, cells, n, st["by_name"])
            return
        if len(cells) >= 2:
            problem(res, lenient, n, "a data row outside any table (no header line before it)", line)
            return
    if st["report"]:
        st["said"].append(line.strip())  # what nsys printed under a title (SKIPPED: ...)
    else:
        st["other"].append(n)


def _start_table(res, st, hdr, n, by_name) -> None:
    report = st["report"] or by_name
    why = ""
    if report is None:
        report, why = report_by_columns(hdr)
        if report is None and {"Total Time", "Num Calls", "Name"} <= {_unit_free(h) for h in hdr}:
            t = _Table(None, None, hdr, n, st["title_line"], why)  # an API summary: decided by its rows
            t.pending = True
            st["t"] = t
            return
    table = REPORTS.get(report or "")
    st["t"] = _Table(report, table, hdr, n, st["title_line"], why)
    st["report"] = None


def _row(res, lenient, t: _Table, n: int, line: str) -> None:
    if t.pending:
        t.raw.append((n, line))
        return
    if t.table is None:
        t.skipped += 1
        return
    if t.cols is None:
        _prepare(res, t)
    row = _parse_row(res, lenient, t, n, line)
    if row is None:
        return
    t.rows.append(row)
    t.count += 1
    if len(t.rows) >= CHUNK_ROWS:
        res.emit(t.table, pd.DataFrame(t.rows))
        t.rows = []


def _end_table(res, lenient, st) -> None:
    t = st["t"]
    if t is None:
        return
    st["t"] = None
    path = res.path
    if t.pending:  # an untitled API summary: its rows say whether it is cuda_api_sum
        names = []
        i = next((k for k, h in enumerate(t.hdr) if h.strip() == "Name"), None)
        for _, line in t.raw:
            try:
                cells = next(csv.reader([line]))
                names.append(cells[i].strip() if i is not None and i < len(cells) else "")
            except csv.Error:
                names.append("")
        report, why = report_by_columns(t.hdr, names)
        raw, t.raw, t.pending = t.raw, [], False
        t.report, t.table, t.why = report, REPORTS.get(report or ""), why
        for n, line in raw:
            _row(res, lenient, t, n, line)
        if t.table is None:
            t.skipped = len(raw)
    if t.table is None:
        what = (f"report {t.report!r} (line {t.title_line or t.line})" if t.report else
                f"a table without a report title at line {t.line} ({t.why})")
        res.warnings.append(f"{path}: skipped {what}, {t.skipped} row(s): ds4lab reads "
                            f"{', '.join(sorted({k for k in REPORTS if '_' in k}))}")
        return
    if t.rows:
        res.emit(t.table, pd.DataFrame(t.rows))
        t.rows = []
    if t.count == 0:
        st["empty"].append((t.report, t.title_line or t.line))
        res.warnings.append(f"{path}:{t.title_line or t.line}: report {t.report} has its title and header but no "
                            "rows (nothing of this kind was recorded)")


def _no_table(res: Ingested, st) -> None:
    """A report title with no table after it (nsys prints e.g. ``SKIPPED: ... does not contain CUDA trace data.``): a
    warning with the report's name and what nsys said."""
    said = st["said"][0] if st["said"] else "nothing"
    res.warnings.append(f"{res.path}:{st['title_line']}: report {st['report']} has no table ({said[:160]})")
    st["report"] = None


def _columns(hdr: list[str], report: str) -> tuple[list[tuple[str, str, float | None]], list[str], list[str]]:
    """Per header cell: (header, output column, factor to apply or None for text), the unit-less time columns read as
    ns, and the unit-less columns of a size report (kept as printed, named ``<column>_unit_not_stated``)."""
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


def _prepare(res, t: _Table) -> None:
    t.cols, assumed, unstated = _columns(t.hdr, t.report)
    path = res.path
    if assumed:
        res.warnings.append(f"{path}:{t.line}: report {t.report}: columns without a unit ({', '.join(assumed)}) "
                            "read as ns, the documented default of nsys stats, and converted to µs")
    if unstated:
        res.warnings.append(f"{path}:{t.line}: report {t.report}: size columns without a unit "
                            f"({', '.join(unstated)}) kept as printed (no documented default), named *_unit_not_stated")
    t.name_from = next((t.hdr.index(h) for h in NAME_COLUMN.get(t.table, ()) if h in t.hdr), None)
    t.trace = t.report in TRACE_REPORTS


def _parse_row(res, lenient, t: _Table, n: int, line: str) -> dict | None:
    path = res.path
    try:
        cells = next(csv.reader([line]))
    except csv.Error as e:
        problem(res, lenient, n, f"unreadable CSV ({e})", line)
        return None
    if len(cells) != len(t.hdr):
        problem(res, lenient, n, f"{len(cells)} fields, the header of report {t.report} has {len(t.hdr)}", line)
        return None
    row = {"report": t.report}
    for (h, col, f), cell in zip(t.cols, cells):
        if f is None:
            row[col] = cell.strip()
            continue
        if not cell.strip() and t.trace:
            row[col] = float("nan")
            continue
        try:
            v = num(cell)
        except ValueError:
            problem(res, lenient, n, f"bad number in column {h!r}: {cell.strip()!r}", line)
            return None
        why = finite_nonneg(v)
        if why:
            problem(res, lenient, n, f"{h}={cell.strip()} is {why}", line)
            return None
        row[col] = v * f
    if t.name_from is not None:
        row["name"] = cells[t.name_from].strip()
    row["file"] = str(path)
    row["source"] = f"{path.name}:{n}"
    return row
