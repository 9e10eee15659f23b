"""The event table as a file: gzip-compressed CSV after one header line (what an in-process recording
saves, :meth:`ds4lab.audit.record.Recording.save`, and what any table can be saved as).

Layout: line 1 is ``# ds4lab audit event table v1 `` followed by a JSON object (``source``, ``tool``,
``notes``, ``columns``, and whatever the writer adds: ``exit_status``, ``argv``, ``provenance``); then
the CSV of :data:`ds4lab.audit.events.COLUMNS` with a header row (RFC 4180 quoting; ``""`` and ``-1``
as the table's missing values). Read back in chunks (``pandas.read_csv(chunksize=...)``) with progress.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ..events import COLUMNS, EventTable, check_frame
from .common import CountingReader, Progress, SourceError

MAGIC = b"# ds4lab audit event table v1 "


def looks_like(head: bytes) -> bool:
    """Whether ``head`` (the first decompressed bytes of a file) starts a saved event table."""
    return head.startswith(MAGIC)


def write_table(table: EventTable, path: Path, **extra) -> Path:
    """Save ``table`` to ``path`` (gzip CSV with the header line; written to ``path.tmp`` and moved
    into place, so a reader never sees half a file). ``extra``: JSON-able keys added to the header.
    Returns ``path``."""
    path = Path(path)
    head = {"source": table.source, "tool": table.tool, "notes": list(table.notes), "columns": list(COLUMNS), **extra}
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", newline="") as f:
        f.write(MAGIC.decode() + json.dumps(head, default=str) + "\n")
        table.frame.to_csv(f, index=False)
    tmp.replace(path)
    return path


def read_saved(path: Path, progress=None) -> EventTable:
    """A table written by :func:`write_table`. Its ``source`` is the recorded one (``<recording>`` or
    a script's command line) with the file named after it; ``notes`` keep the writer's notes and add
    the script's exit status when the header has one.

    Raises:
        SourceError: a header that is not JSON, columns that are not the event table's, or a file
            that is cut (gzip stream ended early).
    """
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
                raise SourceError(f"{path}: the file is cut at byte {raw.tell():,} of {size:,} ({e}); "
                                  "the recording was not saved whole") from None
        finally:
            raw.close()
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in COLUMNS})
    for c, (t, _) in COLUMNS.items():
        df[c] = df[c].astype("int64" if t == "int64" else "object")
    df = df.sort_values("start_ns", kind="stable").reset_index(drop=True)
    try:
        check_frame(df)
    except ValueError as e:
        raise SourceError(f"{path}: {e}") from None
    notes = list(head.get("notes") or [])
    if head.get("exit_status") not in (None, 0):
        notes.append(f"the recorded script exited with status {head['exit_status']}: what it ran until then was "
                     "recorded")
    src = head.get("source") or str(path)
    return EventTable(df, f"{path} ({src})" if src != str(path) else str(path), head.get("tool", "cupti"), notes)
