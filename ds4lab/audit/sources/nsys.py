"""Nsight Systems SQLite exports (``nsys export --type sqlite``) into the event table, through
:func:`ds4lab.ingest.nsys_sqlite.read_events` (the one SQLite reader, which ``ds4lab ingest`` uses too),
and what to do with a raw ``.nsys-rep``/``.qdrep`` report."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

from .common import Progress, SourceError
from .table import Rows, finish

#: The CUDA tables whose absence makes an export useless to the audit.
CUDA_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
               "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def read_sqlite(path: Path, progress=None):
    """An :class:`~ds4lab.audit.events.EventTable` of an Nsight Systems SQLite export; ``tool`` names
    the export's schema and Nsight Systems version (``META_DATA_EXPORT``).

    Raises:
        SourceError: an unreadable database, or one without any CUDA table (names the tables it has
            and the ``nsys profile --trace=cuda`` that records them).
    """
    from ...ingest.nsys_sqlite import read_events
    from ..events import EventTable

    path = Path(path)
    rows = Rows()
    bar = {}

    def prog(done, total):
        if progress is None:
            return
        if "p" not in bar:
            bar["p"] = Progress(progress, f"reading {path.name}", total).__enter__()
        bar["p"].to(done)

    try:
        info = read_events(path, rows, prog)
    except sqlite3.Error as e:
        raise SourceError(f"{path}: unreadable SQLite database ({e})") from None
    finally:
        if "p" in bar:
            bar["p"].__exit__(None, None, None)
    if not any(t for t in info["tables"] if t.startswith("CUPTI_ACTIVITY_KIND_")):
        have = [t for t in info["all_tables"] if not t.startswith(("ENUM_", "sqlite_"))]
        raise SourceError(f"{path}: an Nsight Systems export without CUDA tables (no "
                          f"{', '.join(CUDA_TABLES)}); it holds {', '.join(have[:14]) or 'no table'}"
                          f"{' …' if len(have) > 14 else ''}. Profile with nsys profile --trace=cuda,nvtx")
    from ...ingest.nsys_sqlite import GRAPH_FIX

    df = finish(rows.frame(), info["stream_types"])
    notes = list(info["notes"])
    graphs = df[df.kind == "graph"]
    if len(graphs):
        k = df[df.kind == "kernel"]
        if not ((k.graph_id > 0) | (k.graph_node_id > 0)).any():
            notes.append(f"{len(graphs):,} whole-graph executions and no kernel launched from a graph: {GRAPH_FIX}")
    return EventTable(df, str(path), f"nsys-sqlite ({info['version']})", notes)


def export_report(path: Path, console=None) -> Path:
    """The SQLite export of a raw Nsight Systems report (``.nsys-rep``/``.qdrep``): runs
    ``nsys export --type sqlite`` when ``nsys`` is on PATH (saying so on ``console``) and returns the
    ``.sqlite`` beside it (an existing one newer than the report is reused). Raises SourceError with
    the command to run when ``nsys`` is not on PATH, or with nsys's own message when it fails."""
    path = Path(path)
    out = path.with_suffix(".sqlite")
    cmd = ["nsys", "export", "--type", "sqlite", "--output", str(out), str(path)]
    if out.is_file() and out.stat().st_mtime >= path.stat().st_mtime:
        if console is not None:
            console.print(f"{path}: reading its existing SQLite export {out}")
        return out
    exe = shutil.which("nsys")
    if exe is None:
        raise SourceError(f"{path}: a raw Nsight Systems report, which only nsys can read; export it first:\n  "
                          + " ".join(cmd) + "\nand give the audit the .sqlite file")
    if console is not None:
        console.print(f"{path}: a raw Nsight Systems report; running {' '.join(cmd)}")
    try:
        r = subprocess.run([exe] + cmd[1:], capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceError(f"{path}: {' '.join(cmd)} did not run ({e})") from None
    if r.returncode != 0 or not out.is_file():
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-3:]
        raise SourceError(f"{path}: {' '.join(cmd)} failed (exit {r.returncode}): {' | '.join(tail) or 'no output'}")
    return out
