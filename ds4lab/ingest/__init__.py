"""Read real profiles into ds4lab's tidy tables: ds4's MoE profile lines, Nsight Systems exports
(``nsys stats`` CSV reports, the SQLite export), Nsight Compute CSV output, and ds4lab result folders
from other machines. One module per format:

* :mod:`.ds4log` — ds4's ``DS4_CUDA_MOE_PROFILE`` stderr lines and the ds4-format logs ``ds4lab moe``
  writes (``ds4-log`` → table ``ds4_moe``);
* :mod:`.nsys_csv` — every ``nsys stats --format csv`` report, told apart by its title line, or in
  the per-report files of ``-o PREFIX`` by their file name and columns (``nsys-csv`` →
  ``nsys_kernels``, ``nsys_nvtx``, ``nsys_nvtx_kernels``, ``nsys_cuda_api``, ``nsys_mem_time``,
  ``nsys_mem_size``, ``nsys_gpu_trace``, ``nsys_api_trace``, ``nsys_osrt``; other reports skipped by
  name; the text format refused with "rerun with --format csv");
* :mod:`.nsys_sqlite` — ``nsys export --type sqlite`` (``nsys-sqlite`` → ``kernels``, ``graphs``,
  ``nvtx`` with domain names; a warning when graph executions come without their kernels);
* :mod:`.ncu` — ``ncu --csv`` details or raw page (``ncu-csv`` → ``ncu_kernels``, ``ncu_metrics`` keyed
  by section and name with units, ``ncu_rules``; ``ncu_sites``, with ``sites=PRESET`` joined to
  ds4lab's launch sites);
* :mod:`.folder` — ds4lab result folders (``ds4lab-folder`` → ``ds4lab_<table>``).

The format is detected from the content, never from the file name (:func:`detect`, scanning in
blocks): a folder with a ds4lab ``meta.json``; a file starting ``SQLite format 3``; text with ``ds4:
CUDA MoE profile`` lines; text with an ncu CSV header (``"ID","Process ID"``); text with ``nsys stats``
reports. A raw ``.nsys-rep``/``.qdrep``/``.ncu-rep`` is refused with the command that exports it.
Large inputs are streamed: ds4 logs and ``nsys stats`` CSV are read line by line and written in
chunks (:meth:`Ingested.emit`), so memory does not grow with the file.

Every table has a ``file`` column (the input it came from: one source per file, so that ``compare``
draws one bar per file) and a ``source`` column (``file:line``, the SQLite row number, or the CSV a
ds4lab folder's table came from).

Malformed input raises :class:`IngestError` naming the file and line; with ``lenient=True`` the good
rows are kept and every bad line is reported (:attr:`Ingested.problems`), never dropped silently.
What is read but not turned into rows (a report ds4lab does not read, unit assumptions, graph
executions without their kernels) is named in :attr:`Ingested.warnings`. An input that cannot be
read at all (no such file, a broken ``meta.json``, a ds4lab folder without a table, an unreadable
SQLite database), a file cut off in the middle of its last line, the same input given twice (by
path or by content: :func:`check_inputs`), and an ``--out`` that cannot be this folder are
IngestErrors in either mode. :func:`ingest_all` writes into a ds4lab result folder
(:func:`ds4lab.report.results.job_folder`: locked, staged, ``meta.json`` naming the inputs).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import ncu as _ncu
from . import nsys_csv as _nsys_csv_mod
from ..moeprof.ds4log import ds4lab_header, ds4lab_header_fields
from .common import IngestError, Ingested, RowBlock, check_out_dir, distinct_inputs, load_meta
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


#: raw report files of the Nsight tools (binary: ds4lab reads their exports) → how to export them
RAW_REPORTS = {
    ".nsys-rep": "an Nsight Systems report: export it first, `nsys export --type sqlite --output {stem}.sqlite "
                 "{name}` (then ingest {stem}.sqlite), or `nsys stats --report cuda_gpu_kern_sum,nvtx_sum "
                 "--format csv {name} > {stem}.csv`",
    ".qdrep": "an Nsight Systems report (before 2021.4): export it first, `nsys export --type sqlite --output "
              "{stem}.sqlite {name}` (then ingest {stem}.sqlite), or `nsys stats --report cuda_gpu_kern_sum,nvtx_sum "
              "--format csv {name} > {stem}.csv`",
    ".ncu-rep": "an Nsight Compute report: export it first, `ncu --import {name} --csv > {stem}.csv` (add "
                "`--page raw` for one row per kernel), then ingest {stem}.csv",
}
#: bytes read at a time while the format is detected (detection streams; it never loads a file)
_SCAN_BLOCK = 1 << 20


def _is_ds4lab_meta(meta: dict) -> bool:
    """A ``meta.json`` ds4lab wrote: it names the ds4lab version, or the job that wrote it (the
    conformance suite's and other early folders name only ``job``)."""
    return "ds4lab" in meta or "job" in meta


def detect(path: Path) -> str:
    """The input's format from its content (see the module docstring): ``ds4lab-folder``,
    ``nsys-sqlite``, ``ds4-log``, ``ncu-csv`` or ``nsys-csv``. The file is scanned in blocks (bounded
    memory, whatever its size). Raises IngestError naming the path: a raw Nsight report (binary,
    with the export command for it), a text format ``nsys stats`` wrote without ``--format csv``
    (detected as ``nsys-csv`` and refused when read), or an unrecognised file (a short escaped excerpt)."""
    path = Path(path)
    if path.is_dir():
        meta = path / "meta.json"
        if meta.is_file():
            if _is_ds4lab_meta(load_meta(meta)):
                return "ds4lab-folder"
            raise IngestError(f"{meta}: not written by ds4lab (no \"ds4lab\" or \"job\" key)")
        raise IngestError(f"{path}: a folder without a ds4lab meta.json")
    if not path.is_file():
        raise IngestError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if head.startswith(b"SQLite format 3\x00"):
                return "nsys-sqlite"
            hint = RAW_REPORTS.get(path.suffix.lower())
            if b"\x00" in head or hint:
                if hint:
                    raise IngestError(f"{path}: " + hint.format(name=path.name, stem=path.stem))
            found = _scan(f, head)
    except OSError as e:
        raise IngestError(f"{path}: unreadable ({e.strerror or e})") from None
    if found:
        return found
    raise IngestError(f"{path}: not a ds4 MoE profile log, an nsys stats CSV, an nsys SQLite export, ncu --csv "
                      f"output or a ds4lab result folder (starts with {head[:40]!r})")


def _scan(f, head: bytes) -> str | None:
    """The format the text of open file ``f`` (its first bytes ``head`` already read) holds, by the
    markers each format has, scanned a block at a time: ds4's profile prefix first (a log is any
    program's stderr), then ncu's CSV header, then nsys stats' reports."""
    kinds: set[str] = set()
    tail = ""
    block = head
    seen = 0
    while block:
        text = tail + block.decode("utf-8", errors="replace")
        cut = text.rfind("\n")
        lines, tail = (text[:cut], text[cut + 1:]) if cut >= 0 else ("", text)
        tail = tail[-65536:]  # a line longer than this is no format's marker
        if DS4_PREFIX in lines or DS4_PREFIX in tail:
            return "ds4-log"
        if "ncu-csv" not in kinds and _ncu.looks_like(lines):
            kinds.add("ncu-csv")
        if "nsys-csv" not in kinds and seen < 64 * _SCAN_BLOCK and _nsys_csv_mod.looks_like(lines):
            kinds.add("nsys-csv")
        seen += len(block)
        block = f.read(_SCAN_BLOCK)
    if tail and "ncu-csv" not in kinds and _ncu.looks_like(tail):
        kinds.add("ncu-csv")
    if tail and "nsys-csv" not in kinds and _nsys_csv_mod.looks_like(tail):
        kinds.add("nsys-csv")
    for k in ("ncu-csv", "nsys-csv"):
        if k in kinds:
            return k
    return None


#: readers that stream (they take the record to fill, whose ``sink`` gets their rows chunk by chunk)
_STREAMED = {"ds4-log", "nsys-csv"}


def ingest(path: Path, lenient: bool = False, sites: str | None = None, *, sink=None, progress=None) -> Ingested:
    """Read one input (format from :func:`detect`). ``sites`` (a preset name) joins ncu kernels to
    ds4lab's launch sites of that preset (:func:`ds4lab.ingest.ncu.join_sites`) and adds the
    per-site table ``ncu_sites``; without it ``ncu_sites`` groups by the NVTX cluster and op alone.
    ``sink(table, rows)``: receives the rows of a streamed input (ds4 logs, nsys stats CSV) chunk by
    chunk instead of :attr:`Ingested.tables` (bounded memory); ``progress(n)`` is told of each ``n``
    bytes read. Raises IngestError (file and line) unless ``lenient``; an unknown preset is an
    IngestError."""
    kind = detect(path)
    res = Ingested(Path(path), kind, sink=sink, progress=progress)
    try:
        if kind in _STREAMED:
            _READERS[kind](Path(path), lenient, res)
        else:
            got = _READERS[kind](Path(path), lenient)
            res.tables, res.problems, res.warnings = got.tables, got.problems, got.warnings
            if progress is not None:
                progress(_size(path))
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


def _size(path: Path) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.glob("*") if f.is_file())
    return p.stat().st_size


def check_inputs(paths, out: Path) -> list[dict]:
    """Checks before anything is read or written: every input exists once, by path and by content
    (:func:`ds4lab.ingest.common.content_sha256`: an identical copy would count its rows twice), and
    ``out`` is not an input nor holds one (the tables would replace what they are read from).
    Returns ``[{"path", "sha256"}]`` in order.

    Raises:
        IngestError: naming the input given twice (and both names), or the input ``out`` would replace.
    """
    found = distinct_inputs(paths, IngestError, "its rows would be counted twice; give each input once")
    o = Path(out).resolve()
    for p, _ in found:
        key = p.resolve()
        if key == o or o in key.parents:
            raise IngestError(f"--out {out}: it {'is' if key == o else 'holds'} the input {p}: the tables would "
                              "replace what they are read from; choose another --out")
    return [{"path": str(p), "sha256": digest} for p, digest in found]


class _TableFiles:
    """The tables of one ingest, written to CSV in ``folder`` as their rows come (bounded memory).
    A table's rows with other columns than its first ones (two nsys versions, two reports into one
    table) go to a part file of their own; :meth:`close` merges the parts under the union of their
    columns, row by row, values as written."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.parts: dict[str, list[tuple[list[str], Path]]] = {}
        self.rows: dict[str, int] = {}

    def add(self, table: str, df) -> None:
        """Append ``df`` (a DataFrame, or a :class:`ds4lab.ingest.common.RowBlock`) to ``table``.

        Raises:
            ds4lab.report.results.WriteFailed: the rows could not be written (a full disk), naming
                the file; the file keeps its whole rows. Not an OSError, so that a reader streaming
                into it does not take it for its input being unreadable.
        """
        from ..report.folder_io import WriteFailed, os_reason

        try:
            self._add(table, df)
        except OSError as e:
            err = WriteFailed(f"cannot write {e.filename or self.folder / (table + '.csv')}: {os_reason(e)}", e.errno)
            err.files_not_written = getattr(e, "files_not_written", ())
            raise err from e

    def _add(self, table: str, df) -> None:
        if len(df) == 0:
            return
        cols = [str(c) for c in df.columns]
        parts = self.parts.setdefault(table, [])
        part = next((p for c, p in parts if c == cols), None)
        new = part is None
        if new:
            part = self.folder / (f"{table}.csv" if not parts else f".{table}.part{len(parts)}.csv")
            parts.append((cols, part))
        from ..report.folder_io import appending

        with appending(part):  # a write cut part way (a full disk) is cut back: whole rows only
            if isinstance(df, RowBlock):
                import csv

                with open(part, "a" if not new else "w", newline="") as f:
                    w = csv.writer(f, lineterminator="\n")
                    if new:
                        w.writerow(cols)
                    w.writerows(df.rows)
            else:
                df.to_csv(part, mode="w" if new else "a", header=new, index=False)
        self.rows[table] = self.rows.get(table, 0) + len(df)

    def close(self) -> None:
        import csv

        for table, parts in self.parts.items():
            if len(parts) == 1:
                continue
            union = list(dict.fromkeys(c for cols, _ in parts for c in cols))
            merged = self.folder / f".{table}.merged.csv"
            with open(merged, "w", newline="") as out:
                w = csv.writer(out)
                w.writerow(union)
                for cols, part in parts:
                    with open(part, newline="") as f:
                        rd = csv.reader(f)
                        next(rd, None)
                        at = [cols.index(c) if c in cols else None for c in union]
                        for row in rd:
                            w.writerow(["" if i is None else row[i] for i in at])
            for _, part in parts:
                part.unlink()
            merged.replace(self.folder / f"{table}.csv")


def ingest_all(paths, out: Path, lenient: bool = False, sites: str | None = None, progress=None,
               ran: dict | None = None) -> list[Ingested]:
    """Ingest every path into result folder ``out``: each table to ``out/<table>.csv`` (the rows of
    all inputs, each row's ``file`` naming its input; streamed inputs written as they are read),
    the bad lines to ``out/ingest_problems.csv``, the warnings to ``out/ingest_warnings.csv`` and
    ``meta.json`` (``job: ingest``, the inputs with their format, SHA-256 and rows, the status).

    The folder is a ds4lab result folder (:func:`ds4lab.report.results.job_folder`): written aside,
    locked against a second run, swapped in only when every input was read; a job's folder (a
    ladder's, a moe run's) or a folder ds4lab did not write is refused. Raises IngestError on the
    first bad input unless ``lenient`` (a file that cannot be read at all, a broken ``meta.json``, an
    input given twice by path or by content, and an ``out`` that is or holds an input are errors
    either way); ``out`` is left as it was then. A write that fails (a full disk) raises
    :class:`ds4lab.report.results.WriteFailed` (exit 1, as for every command: the inputs were good),
    the tables whole so far kept. ``progress(done_bytes, total_bytes)`` is called as
    the inputs are read. ``ran``: what sets this ingest apart, for the default folder (its inputs:
    :func:`ds4lab.report.results.job_folder` keeps another ingest's results beside)."""
    from ..report import results

    out = Path(out)
    check_out_dir(out)
    inputs = check_inputs(paths, out)
    total = sum(_size(Path(i["path"])) for i in inputs) or 1
    done = [0]

    def read(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(min(done[0], total), total)

    meta = {"job": "ingest", "inputs": inputs, "lenient": lenient, "sites": sites}
    found: list[Ingested] = []
    try:
        with results.job_folder(out, meta, OUTPUT_GLOBS, discard_on=(IngestError,), ran=ran) as folder:
            files = _TableFiles(folder)
            for spec in inputs:
                r = ingest(Path(spec["path"]), lenient, sites, sink=files.add, progress=read)
                for name, df in r.tables.items():
                    files.add(name, df)
                found.append(r)
                spec.update(kind=r.kind, rows=r.counts(), problems=len(r.problems), warnings=len(r.warnings))
            files.close()
            problems = [p for r in found for p in r.problems]
            if problems:
                results.write_csv(pd.DataFrame(problems), folder / "ingest_problems.csv")
            warned = [{"file": str(r.path), "warning": w} for r in found for w in r.warnings]
            if warned:
                results.write_csv(pd.DataFrame(warned), folder / "ingest_warnings.csv")
            meta.update(tables=files.rows, problems=len(problems), warnings=len(warned))
    except results.OutputError as e:
        raise IngestError(str(e)) from None
    return found
