"""What every ingest reader shares: the error, the result record, problem reporting (strict or
lenient), ``meta.json`` reading, the ``--out`` check and number parsing as the profilers print
numbers."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

#: time unit → factor to µs (``nsys stats`` column units; ``ncu`` metric units, long and short)
TIME_UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "µs": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                "s": 1e6, "second": 1e6}


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
    if meta.get("status") == "running" and f.name == "meta.json":
        from ..report.results import read_meta

        meta = read_meta(f.parent) or meta  # a run whose process is gone reads as "died"
    return meta


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




def problem(res: Ingested, lenient: bool, line: int, why: str, text: str = "") -> None:
    """Report one bad line of ``res.path``: raise :class:`IngestError` (``file:line: why: 'text'``)
    unless ``lenient``, else append it to ``res.problems`` (the rows read so far are kept)."""
    if not lenient:
        raise IngestError(f"{res.path}:{line}: {why}" + (f": {text.strip()[:120]!r}" if text else ""))
    res.problems.append({"file": str(res.path), "line": line, "problem": why, "text": text.strip()[:200]})


_problem = problem  # the older private name


def num(cell) -> float:
    """A number as nsys and ncu print it: plain, quoted, with thousands separators (``1,234.5``,
    narrow no-break spaces). Raises ValueError for anything else (``n/a``, text, empty)."""
    c = str(cell).strip().strip('"').replace(",", "").replace("\u202f", "").replace(" ", "")
    return float(c)


def finite_nonneg(v: float) -> str | None:
    """None for a finite number ≥ 0, else what is wrong (``negative``, ``not a finite number``)."""
    if not math.isfinite(v):
        return "not a finite number"
    return "negative" if v < 0 else None


def snake(text: str) -> str:
    """A column header as a tidy column name: ``Total Time`` → ``total_time``, ``Time (%)`` →
    ``time_pct``, ``Reg/Trd`` → ``reg_trd``."""
    t = text.strip().replace("(%)", " pct").replace("%", " pct")
    t = re.sub(r"[^0-9A-Za-z]+", "_", t).strip("_").lower()
    return t or "column"
