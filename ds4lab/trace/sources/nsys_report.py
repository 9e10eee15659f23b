"""A raw Nsight Systems report (``.nsys-rep``/``.qdrep``, binary: only ``nsys`` reads it): exported to SQLite with
``nsys export --type sqlite`` when ``nsys`` is on PATH (then read by :mod:`ds4lab.trace.sources.nsys_sqlite`), else
refused with the command to run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .common import SourceError

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"nsys-report": "a raw Nsight Systems report"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ()

def export_report(path: Path, console=None) -> Path:
    """The SQLite export of a raw report: ``nsys export --type sqlite`` when on PATH (said on ``console``), the
    ``.sqlite`` beside it (a newer one reused). Raises SourceError with the command to run without ``nsys``, or with
    nsys's message when it fails."""
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
