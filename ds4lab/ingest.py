"""Read real profiles into ds4lab's tidy tables: ds4's MoE profile lines, Nsight Systems exports,
and ds4lab result folders from other machines.

The format is detected from the content, never from the file name:

* a folder holding a ``meta.json`` written by ds4lab → its result tables (``ds4lab-folder``);
* a file starting with ``SQLite format 3`` → an ``nsys export --type sqlite`` database
  (``nsys-sqlite``): the kernel activity table and the NVTX events table;
* text with ``ds4: CUDA MoE profile`` lines → ds4's ``DS4_CUDA_MOE_PROFILE`` stderr (``ds4-log``);
  other lines of the log are ignored, but a profile line that does not parse is an error. A
  ``# ds4lab ...`` comment line (the provenance header ``ds4lab moe`` puts first in the
  ``moe-ds4.log`` it writes) marks the lines after it as written by ds4lab, not by ds4: their
  ``provenance`` column holds the header and ``modeled`` is true when the header says ``MODELED``;
  its ``mode=<mode>`` and ``routing=<routing>`` tokens (``# ds4lab moe · mode=in-graph ·
  routing=uniform · measured on ...``) give the lines' ``mode`` and ``routing`` (and are left out of
  ``provenance``); an older header without them gives ``unknown`` for both. Lines without such a
  header are ds4's own (``provenance`` ``ds4``, ``modeled`` false, mode ``host-timed``, routing
  ``ds4``). A line that cannot be a real call is malformed too: ``tokens=0``, a stage time that is
  negative or not finite, ``pairs`` not a positive multiple of ``tokens``, or ``total`` differing
  from the sum of the six stages by more than the printed rounding (0.001 ms per field, 0.007 ms;
  not checked for ``mode=cupti`` lines, whose total is first kernel start to last kernel end, nor
  under an older header, whose lines may be CUPTI's);
* text with ``nsys stats`` CSV reports → the CUDA GPU kernel summary (``cuda_gpu_kern_sum``) and
  the NVTX range summary (``nvtx_sum``/``nvtx_pushpop_sum``); several reports may share one file,
  text may come before each table, time columns may be in ns, us or ms, numbers may carry
  thousands separators; a negative or non-finite number is a malformed row.

Every table has a ``file`` column (the input it came from: one source per file, so that ``compare``
draws one bar per file) and a ``source`` column (``file:line``, the SQLite row number, or the CSV a
ds4lab folder's table came from).

Malformed input raises :class:`IngestError` naming the file and line; with ``lenient=True`` the good
rows are kept and every bad line is reported (:attr:`Ingested.problems`), never dropped silently.
An input that cannot be read at all (no such file, a broken ``meta.json``, a ds4lab folder without
a table, an unreadable SQLite database), the same input given twice, and an ``--out`` that cannot be
a folder are IngestErrors in either mode.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

MOE_STAGES = ("xq", "sort", "gateup", "midq", "down", "sum", "total")
_DS4_PREFIX = "ds4: CUDA MoE profile"
_FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"  # a number: never a lone "." or "e"
_DS4_LINE = re.compile(
    r"^ds4: CUDA MoE profile tokens=(?P<tokens>\d+) pairs=(?P<pairs>\d+)"
    + "".join(rf" {s}=(?P<{s}>{_FLOAT})" for s in MOE_STAGES) + r" ms\s*$")
_DS4LAB_HEADER = re.compile(r"^\s*#\s*(?P<text>ds4lab\b.*?)\s*$")
_HEADER_FIELD = re.compile(r"(?:^|(?<=[\s\u00b7]))(?P<key>mode|routing)=(?P<value>[^\s\u00b7]+)")
#: the slack allowed between ``total`` and the sum of the six stages: each of the seven fields is
#: printed with 3 decimals
TOTAL_SLACK_MS = 0.001 * (len(MOE_STAGES))
#: modes whose ``total`` is not the sum of the stages (CUPTI: first kernel start to last kernel end),
#: and ``unknown`` (an older ds4lab header: its lines may be CUPTI's)
_TOTAL_NOT_SUM = ("cupti", "unknown")
#: every table name ingest writes (``<name>.csv`` under ``--out``), and the problems file
OUTPUT_GLOBS = ("ds4_moe.csv", "nsys_kernels.csv", "nsys_nvtx.csv", "kernels.csv", "nvtx.csv", "ds4lab_*.csv",
                "ingest_problems.csv")
_UNIT = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}


class IngestError(ValueError):
    """Input that cannot be read: the message names the file and the line."""


@dataclass
class Ingested:
    """What one input gave: tables by name (tidy DataFrames) and the bad lines (lenient mode)."""

    path: Path
    kind: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    problems: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


_JSON_TYPE = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def load_meta(f: Path) -> dict:
    """A ds4lab ``meta.json`` as a dict. Raises IngestError naming the file (and the line of a JSON
    syntax error) when it cannot be read, is not JSON, or is not a JSON object."""
    f = Path(f)
    try:
        text = f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise IngestError(f"{f}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise IngestError(f"{f}: empty file, not a ds4lab meta.json")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise IngestError(f"{f}:{e.lineno}: broken JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(meta, dict):
        raise IngestError(f"{f}: a JSON {_JSON_TYPE.get(type(meta), type(meta).__name__)}, not the object "
                          "ds4lab writes")
    return meta


def ds4lab_header(line: str) -> tuple[str, bool] | None:
    """``(text, modeled)`` for a ``# ds4lab ...`` provenance comment line (``modeled``: the text says
    ``MODELED``), else None."""
    m = _DS4LAB_HEADER.match(line)
    if not m:
        return None
    return m["text"], bool(re.search(r"\bMODELED\b", m["text"]))


def ds4lab_header_fields(text: str) -> dict:
    """``mode``/``routing`` of a ``ds4lab ...`` header text (``unknown`` when it does not say) and
    ``provenance``: the text without those two tokens."""
    got = {m["key"]: m["value"] for m in _HEADER_FIELD.finditer(text)}
    prov = text
    if got:
        parts = [" ".join(re.sub(r"(?<!\S)(mode|routing)=\S+", "", p).split()) for p in text.split("\u00b7")]
        prov = " \u00b7 ".join(p for p in parts if p)
    return {"mode": got.get("mode", "unknown"), "routing": got.get("routing", "unknown"), "provenance": prov}


def check_out_dir(out: Path) -> None:
    """Raise IngestError unless ``out`` is, or can be made, a writable folder (an existing file at
    ``out`` or above it, or a read-only parent, is named). Creates nothing."""
    out = Path(out)
    for q in (out, *out.parents):
        if q.is_dir():
            if not os.access(q, os.W_OK | os.X_OK):
                raise IngestError(f"--out {out}: {q} is not writable")
            return
        if q.exists() or q.is_symlink():
            what = "is a file, not a folder" if q == out else "is a file, so no folder can be made below it"
            raise IngestError(f"--out {out}: {q} {what}")


def detect(path: Path) -> str:
    """The input's format from its content (see module docstring). Raises IngestError."""
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
    if _DS4_PREFIX in full:
        return "ds4-log"
    if re.search(r'"?Total Time \((ns|us|ms|s)\)"?', full) and re.search(r'"?(Name|Range)"?\s*$', full, re.M):
        return "nsys-csv"
    raise IngestError(f"{path}: not a ds4 MoE profile log, an nsys stats CSV, an nsys SQLite export or a "
                      f"ds4lab result folder (starts with {head[:40]!r})")


def ingest(path: Path, lenient: bool = False) -> Ingested:
    """Read one input. Raises IngestError (file and line) unless ``lenient``."""
    kind = detect(path)
    try:
        return {"ds4-log": _ds4_log, "nsys-csv": _nsys_csv, "nsys-sqlite": _nsys_sqlite,
                "ds4lab-folder": _ds4lab_folder}[kind](Path(path), lenient)
    except OSError as e:
        raise IngestError(f"{path}: unreadable ({e.strerror or e})") from None


def _problem(res: Ingested, lenient: bool, line: int, why: str, text: str = "") -> None:
    if not lenient:
        raise IngestError(f"{res.path}:{line}: {why}" + (f": {text.strip()[:120]!r}" if text else ""))
    res.problems.append({"file": str(res.path), "line": line, "problem": why, "text": text.strip()[:200]})


# ----------------------------------------------------------------------------- ds4 log
def _ds4_log(path: Path, lenient: bool) -> Ingested:
    """ds4 ``DS4_CUDA_MOE_PROFILE`` lines → rows (call, tokens, pairs, stage, ms): the same columns as
    ``ds4lab moe``'s table, plus ``provenance`` and ``modeled``: ``ds4`` and false for ds4's own lines
    (mode ``host-timed``, routing ``ds4``), the ``# ds4lab ...`` header's text (``modeled``, ``mode``
    and ``routing`` from it; ``unknown`` mode and routing for a header that does not name them) for
    lines ds4lab wrote; ``backend`` is ``ds4`` or ``ds4lab``; ``file`` is the log, ``source``
    ``<log name>:<line>``."""
    res = Ingested(path, "ds4-log")
    rows = []
    call = 0
    prov, modeled, mode, routing = "ds4", False, "host-timed", "ds4"
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        h = ds4lab_header(line)
        if h is not None:
            text, modeled = h
            f = ds4lab_header_fields(text)
            prov, mode, routing = f["provenance"], f["mode"], f["routing"]
            continue
        if _DS4_PREFIX not in line:
            continue
        body = line[line.index(_DS4_PREFIX):]
        m = _DS4_LINE.match(body)
        if not m:
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({_ds4_why(body)})", line)
            continue
        try:
            tokens, pairs = int(m["tokens"]), int(m["pairs"])
            vals = {s: float(m[s]) for s in MOE_STAGES}
        except ValueError as e:  # the pattern admits only numbers; kept as a guard
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({e})", line)
            continue
        why = _ds4_impossible(m, tokens, pairs, vals, mode)
        if why:
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({why})", line)
            continue
        for s in MOE_STAGES:
            rows.append({"token": call, "layer": float("nan"), "tokens": tokens, "pairs": pairs, "stage": s,
                         "ms": vals[s], "mode": mode, "backend": "ds4" if prov == "ds4" else "ds4lab",
                         "routing": routing, "modeled": modeled, "provenance": prov, "file": str(path),
                         "source": f"{path.name}:{n}"})
        call += 1
    if not rows and not res.problems:
        _problem(res, lenient, 0, "no ds4 MoE profile line")
    res.tables["ds4_moe"] = pd.DataFrame(rows)
    return res


def _ds4_impossible(m: re.Match, tokens: int, pairs: int, vals: dict, mode: str) -> str | None:
    """Why a well-formed ds4 line cannot be a real call (the field and its value), or None."""
    if tokens < 1:
        return f"tokens={m['tokens']}: a MoE call has at least one token"
    for s in MOE_STAGES:
        if not math.isfinite(vals[s]):
            return f"{s}={m[s]} is not a finite time"
        if vals[s] < 0:
            return f"{s}={m[s]} is a negative time"
    if pairs < tokens or pairs % tokens:
        return f"pairs={pairs} is not a positive multiple of tokens={tokens}"
    if mode not in _TOTAL_NOT_SUM:
        staged = sum(vals[s] for s in MOE_STAGES if s != "total")
        if abs(vals["total"] - staged) > TOTAL_SLACK_MS + 1e-9:
            return (f"total={m['total']} is not the sum of the stages ({staged:.3f} ms): off by "
                    f"{abs(vals['total'] - staged):.3f} ms, more than the rounding ({TOTAL_SLACK_MS:.3f} ms)")
    return None


def _ds4_why(body: str) -> str:
    """What is wrong with a ds4 profile line that does not match: the first bad or missing field."""
    fields = dict(re.findall(r"(\w+)=(\S*)", body))
    for k in ("tokens", "pairs"):
        if k not in fields:
            return f"no {k}="
        if not re.fullmatch(r"\d+", fields[k]):
            return f"{k}={fields[k]!r} is not a whole number"
    for s in MOE_STAGES:
        if s not in fields:
            return f"no {s}="
        if not re.fullmatch(_FLOAT, fields[s]):
            return f"{s}={fields[s]!r} is not a number"
    return "fields out of order, or extra text; expected tokens= pairs= " + " ".join(
        f"{s}=" for s in MOE_STAGES) + " ms"


# ----------------------------------------------------------------------------- nsys stats CSV
def _num(cell: str) -> float:
    """A number as nsys prints it: plain, quoted, with thousands separators."""
    c = cell.strip().strip('"').replace(",", "").replace("\u202f", "").replace(" ", "")
    return float(c)


def _nsys_csv(path: Path, lenient: bool) -> Ingested:
    """Every kernel-summary and NVTX-summary table in the file → ``nsys_kernels`` / ``nsys_nvtx``
    (times converted to µs, whatever unit the header says)."""
    res = Ingested(path, "nsys-csv")
    lines = path.read_text(errors="replace").splitlines()
    kern, nvtx = [], []
    i = 0
    while i < len(lines):
        hdr = next(csv.reader([lines[i]]), [])
        cols = [h.strip() for h in hdr]
        is_k = "Name" in cols and any(c.startswith("Total Time (") for c in cols)
        is_n = "Range" in cols and any(c.startswith("Total Time (") for c in cols)
        if not (is_k or is_n):
            i += 1
            continue
        unit = {}
        for c in cols:
            m = re.match(r"(.+) \((ns|us|µs|ms|s)\)$", c)
            if m:
                unit[c] = _UNIT[m.group(2)]
        i += 1
        while i < len(lines) and lines[i].strip():
            n = i + 1
            try:
                cells = next(csv.reader([lines[i]]))
            except csv.Error as e:
                _problem(res, lenient, n, f"unreadable CSV ({e})", lines[i])
                i += 1
                continue
            if len(cells) != len(cols):
                _problem(res, lenient, n, f"{len(cells)} fields, the header has {len(cols)}", lines[i])
                i += 1
                continue
            rec = dict(zip(cols, cells))
            try:
                row = {"name": rec["Name" if is_k else "Range"].strip()}
                for c, f in unit.items():
                    key = re.sub(r" \((ns|us|µs|ms|s)\)$", "", c).lower().replace(" ", "_") + "_us"
                    row[key] = _num(rec[c]) * f
                for c in ("Instances", "Time (%)"):
                    if c in rec:
                        row[c.lower().replace(" ", "_").replace("(%)", "pct")] = _num(rec[c])
            except (ValueError, KeyError) as e:
                _problem(res, lenient, n, f"bad number ({e})", lines[i])
                i += 1
                continue
            bad = next((c for c in [*unit, "Instances", "Time (%)"] if c in rec
                        and not (math.isfinite(_num(rec[c])) and _num(rec[c]) >= 0)), None)
            if bad is not None:
                what = "negative" if _num(rec[bad]) < 0 else "not a finite number"
                _problem(res, lenient, n, f"{bad}={rec[bad].strip()} is {what}", lines[i])
                i += 1
                continue
            row["file"] = str(path)
            row["source"] = f"{path.name}:{n}"
            (kern if is_k else nvtx).append(row)
            i += 1
    if not kern and not nvtx and not res.problems:
        _problem(res, lenient, 0, "no kernel or NVTX summary table")
    if kern:
        res.tables["nsys_kernels"] = pd.DataFrame(kern)
    if nvtx:
        res.tables["nsys_nvtx"] = pd.DataFrame(nvtx)
    return res


# ----------------------------------------------------------------------------- nsys SQLite
def _nsys_sqlite(path: Path, lenient: bool) -> Ingested:
    """``CUPTI_ACTIVITY_KIND_KERNEL`` → ``kernels`` (name, start/end ns, µs, stream, graph ids);
    ``NVTX_EVENTS`` push/pop and start/end ranges → ``nvtx`` (name, start/end ns, µs, domain); both
    with ``file`` and ``source`` (``<name>:<row number>``)."""
    res = Ingested(path, "nsys-sqlite")
    con = None
    try:
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        strings = {}
        if "StringIds" in tables:
            strings = dict(con.execute("select id, value from StringIds"))
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
            cols = {r[1] for r in con.execute("pragma table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
            name_col = "demangledName" if "demangledName" in cols else "shortName"
            extra = [c for c in ("streamId", "graphId", "graphNodeId", "deviceId") if c in cols]
            q = f"select start, end, {name_col}{''.join(', ' + c for c in extra)} from CUPTI_ACTIVITY_KIND_KERNEL"
            rows = []
            for k, r in enumerate(con.execute(q), 1):
                start, end, nm = _ns(r[0]), _ns(r[1]), r[2]
                if start is None or end is None:
                    _problem(res, lenient, k, f"kernel row with a start/end that is not a number "
                                              f"(start={r[0]!r}, end={r[1]!r})", str(r))
                    continue
                if end < start:
                    _problem(res, lenient, k, "kernel row with a missing or negative duration", str(r))
                    continue
                row = {"name": strings.get(nm, nm), "start_ns": start, "end_ns": end, "us": (end - start) / 1e3}
                row.update(dict(zip(extra, r[3:])))
                row.update(file=str(path), source=f"{path.name}:{k}")
                rows.append(row)
            res.tables["kernels"] = pd.DataFrame(rows)
        if "NVTX_EVENTS" in tables:
            cols = {r[1] for r in con.execute("pragma table_info(NVTX_EVENTS)")}
            sel = ["start", "end", "text" if "text" in cols else "NULL",
                   "textId" if "textId" in cols else "NULL", "domainId" if "domainId" in cols else "NULL"]
            rows = []
            for k, (start0, end0, text, tid, dom) in enumerate(con.execute(
                    f"select {', '.join(sel)} from NVTX_EVENTS"), 1):
                if end0 is None:
                    continue  # marks and domain registrations have no end
                start, end = _ns(start0), _ns(end0)
                if start is None or end is None:
                    _problem(res, lenient, k, f"NVTX range with a start/end that is not a number "
                                              f"(start={start0!r}, end={end0!r})", str((start0, end0, text)))
                    continue
                if end < start:
                    _problem(res, lenient, k, "NVTX range ending before it starts", str((start, end, text)))
                    continue
                rows.append({"name": text if text is not None else strings.get(tid, ""), "start_ns": start,
                             "end_ns": end, "us": (end - start) / 1e3, "domain": dom, "file": str(path),
                             "source": f"{path.name}:{k}"})
            res.tables["nvtx"] = pd.DataFrame(rows)
        if not res.tables:
            _problem(res, lenient, 0, "no CUPTI_ACTIVITY_KIND_KERNEL or NVTX_EVENTS table")
    except sqlite3.Error as e:
        raise IngestError(f"{path}: unreadable SQLite export ({e})") from None
    finally:
        if con is not None:
            con.close()
    return res


def _ns(v) -> int | float | None:
    """A timestamp cell as a number, or None (NULL, text, blob, NaN)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)):
        return v
    return None


# ----------------------------------------------------------------------------- ds4lab folders
def _ds4lab_folder(path: Path, lenient: bool) -> Ingested:
    """A ds4lab result folder: every CSV beside its meta.json, tagged with the machine it came from
    (``machine``), the run's ``status`` and, where the table lacks it, ``modeled``. A run whose
    status is not ``complete`` is named in :attr:`Ingested.warnings`."""
    res = Ingested(path, "ds4lab-folder")
    meta = load_meta(path / "meta.json")
    modeled = bool(meta.get("modeled"))
    where = str(meta.get("device") or "?") + (" (modeled)" if modeled else "")
    status = str(meta.get("status", "")) if "status" in meta else ("" if "job" not in meta else "no status")
    if status and status.lower() not in ("complete", "done"):
        res.warnings.append(f"{path}: meta.json status {status!r}: an incomplete run")
    csvs = sorted(f for f in path.glob("*.csv") if f.is_file())
    if not csvs:
        raise IngestError(f"{path}: a ds4lab result folder without any table: expected its result CSVs "
                          "(ladder.csv, moe.csv, summary.csv, ...) beside meta.json")
    for f in csvs:
        try:
            df = pd.read_csv(f)
        except Exception as e:  # noqa: BLE001 — report which file
            _problem(res, lenient, 0, f"{f.name}: unreadable CSV ({e})")
            continue
        df["machine"] = where
        df["status"] = status
        if "modeled" not in df:
            df["modeled"] = modeled
        df["file"] = str(f)
        df["source"] = str(f)
        res.tables[f"ds4lab_{f.stem}"] = df
    return res


def ingest_all(paths, out: Path, lenient: bool = False) -> list[Ingested]:
    """Ingest every path and write each table to ``out/<table>.csv`` (the rows of all inputs, each
    row's ``file`` naming its input) and the bad lines to ``out/ingest_problems.csv``. Once every
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
    results = [ingest(Path(p), lenient) for p in paths]
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
    except OSError as e:
        raise IngestError(f"--out {out}: cannot write ({e.strerror or e}: {e.filename or out})") from None
    return results
