"""The event table as a file (ds4lab's own recordings; yields an event table): line 1 ``# ds4lab audit event table v1 ``
and a JSON header (``source``, ``tool``, ``notes``, ``columns``, and the writer's keys), then the gzip CSV of
:data:`ds4lab.trace.events.COLUMNS` (RFC 4180; ``""`` and ``-1`` missing), read back in chunks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ..events import COLUMNS, EventTable, check_frame
from .common import CountingReader, Progress, SourceError

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"recording": "a ds4lab recording (saved event table)"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("events",)
MAGIC = b"# ds4lab audit event table v1 "


def looks_like(head: bytes) -> bool:
    """Whether ``head`` (the first decompressed bytes of a file) starts a saved event table."""
    return head.startswith(MAGIC)


def write_table(table: EventTable, path: Path, **extra) -> Path:
    """Save ``table`` to ``path`` (via ``path.tmp``: never half a file), ``extra`` in the header. Returns ``path``."""
    path = Path(path)
    head = {"source": table.source, "tool": table.tool, "notes": list(table.notes), "columns": list(COLUMNS), **extra}
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", newline="") as f:
        f.write(MAGIC.decode() + json.dumps(head, default=str) + "\n")
        table.frame.to_csv(f, index=False)
    tmp.replace(path)
    return path


def read_saved(path: Path, progress=None) -> EventTable:
    """A table written by :func:`write_table`, ``source`` naming the file, the exit status in ``notes`` where the
    header has one. Raises SourceError: a header that is not JSON, other columns, a cut file, or an integer cell that
    is not a whole number (row, field, value)."""
    import pandas as pd

    path = Path(path)
    size = path.stat().st_size
    with Progress(progress, f"reading {path.name}", size) as prog:
        raw = open(path, "rb")
        try:
            gz = gzip.GzipFile(fileobj=raw) if raw.read(2) == b"\x1f\x8b" else None
            raw.seek(0)
            if gz is not None:
                gz = gzip.GzipFile(fileobj=raw)
            rd = CountingReader(gz if gz is not None else raw, prog, raw)
            first = b""
            while not first.endswith(b"\n"):
                c = rd.read(1)
                if not c:
                    break
                first += c
            try:
                head = json.loads(first[len(MAGIC):].decode())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise SourceError(f"{path}: a saved event table whose header line is not JSON ({e})") from None
            if head.get("columns") != list(COLUMNS):
                raise SourceError(f"{path}: saved with other columns ({head.get('columns')}) than this ds4lab's event "
                                  f"table ({list(COLUMNS)}); record it again")
            dtypes = {c: ("int64" if t == "int64" else "object") for c, (t, _) in COLUMNS.items()}
            parts = []
            try:
                for chunk in pd.read_csv(rd, dtype=dtypes, keep_default_na=False, na_values=[], chunksize=200_000):
                    parts.append(chunk)
            except (EOFError, OSError) as e:
                # the gzip stream ends before its end marker: the file on disk is all there is of it
                raise SourceError(f"{path}: its compressed stream ends early ({size:,} bytes on disk, {e}): "
                                  "the recording was not saved whole") from None
            except (ValueError, OverflowError):  # a cell pandas cannot read as its column's integer: name it
                raise SourceError(_bad_cell(path)) from None
        finally:
            raw.close()
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in COLUMNS})
    for c, (t, _) in COLUMNS.items():
        df[c] = df[c].astype("int64" if t == "int64" else "object")
    from ..table import drop_repeats, impossible_time, kernel_lengths, time_notes

    bad = impossible_time(df)
    if bad:
        raise SourceError(f"{path}: {bad}; the saved table is damaged or was written by another program")
    df = df.sort_values("start_ns", kind="stable").reset_index(drop=True)
    notes = list(head.get("notes") or [])
    df = drop_repeats(df, notes)
    kernel_lengths(df, notes)
    time_notes(df, notes)
    try:
        check_frame(df)
    except ValueError as e:
        raise SourceError(f"{path}: {e}") from None
    if head.get("exit_status") not in (None, 0):
        notes.append(f"the recorded script exited with status {head['exit_status']}: what it ran until then was "
                     "recorded")
    src = head.get("source") or str(path)
    table = EventTable(df, f"{path} ({src})" if src != str(path) else str(path), head.get("tool", "cupti"), notes)
    table.header = {k: v for k, v in head.items() if k not in ("columns", "notes")}  # what the writer added
    return table


def _bad_cell(path: Path) -> str:
    """Where a saved table holds a cell that is not a whole number in an integer column: ``path: row
    R (line L): field F is V``, read again as text to find it."""
    import pandas as pd

    ints = [c for c, (t, _) in COLUMNS.items() if t == "int64"]
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt", encoding="utf-8", newline="") if gz else open(path, encoding="utf-8", newline="")) as f:
        f.readline()  # the header line
        first = 0
        for chunk in pd.read_csv(f, dtype=str, keep_default_na=False, na_values=[], chunksize=200_000):
            for c in ints:
                if c not in chunk:
                    continue
                v = chunk[c].str.strip()
                bad = ~v.str.fullmatch(r"-?\d+")
                long_ = ~bad & (v.str.len() >= 19)  # a whole number, but perhaps beyond a 64-bit integer
                bad[long_] = ~v[long_].map(lambda x: -2**63 <= int(x) < 2**63).astype(bool)
                if bad.any():
                    i = int(bad.to_numpy().nonzero()[0][0])
                    cell = v.iloc[i]
                    what = ("NaN, not a whole number" if cell.lower() == "nan" else
                            "empty, not a whole number" if cell == "" else
                            f"{cell}, beyond a 64-bit integer (overflow)" if cell.lstrip("-").isdigit() else
                            f"{cell!r}, not a whole number")
                    row = first + i + 1  # the table's rows from 1, after the header line and the CSV's
                    return (f"{path}: row {row:,} (line {row + 2:,}): field {c!r} is {what}; "
                            "the saved table is damaged or was written by another program")
            first += len(chunk)
    return f"{path}: a cell of an integer column is not a whole number; the saved table is damaged"
