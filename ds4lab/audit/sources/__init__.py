"""Every trace the audit reads, into the one event table (:mod:`ds4lab.audit.events`).

:func:`read` tells the format from the file's content (:func:`detect`), never from its name alone:

================  =====================================================  =================================
format            recognised by                                          reader
================  =====================================================  =================================
``nsys-sqlite``   the SQLite magic ``SQLite format 3``                   :mod:`.nsys` (through
                                                                          :mod:`ds4lab.ingest.nsys_sqlite`)
``kineto``        a JSON object with ``traceEvents`` (plain or gzip),     :mod:`.chrome`
                  or a JSON array of events
``ds4lab-trace``  the same, with ``otherData.ds4lab`` (``ds4lab trace``)  :mod:`.chrome`
``recording``     the saved-table header line (plain or gzip)            :mod:`.saved`
``nsys-report``   a raw ``.nsys-rep``/``.qdrep`` (not SQLite, not JSON)   exported with ``nsys`` when it is
                                                                          on PATH, else the command to run
================  =====================================================  =================================

Several processes or devices in one file stay apart: rows keep their ``pid`` and ``device``.
Readers stream (bounded memory: they hold the table being built, never the file's text) and show
progress over the file's bytes (or the export's rows).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .common import SourceError, head_bytes, tail_bytes

__all__ = ["SourceError", "detect", "read", "recording_beside", "FORMATS"]

FORMATS = ("nsys-sqlite", "kineto", "ds4lab-trace", "recording", "nsys-report")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def detect(path: Path) -> str:
    """The format of ``path`` (one of :data:`FORMATS`; module docstring).

    Raises:
        SourceError: no such file, a folder, an empty file, a ``.qdstrm`` (an unconverted Nsight
            stream), or content that is none of the formats (with a short escaped excerpt); where a
            saved recording sits beside such a file (:func:`recording_beside`: the outcome ``.json``
            of a bundled recording, a recorded run's ``engine.json``), the message names it.
    """
    from . import chrome, saved

    path = Path(path)
    if path.is_dir():
        raise SourceError(f"{path}: a folder; give the trace file (a .json/.json.gz profiler trace, an nsys .sqlite "
                          "export, a ds4lab trace.json or a saved recording)")
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    try:
        head = head_bytes(path)
    except OSError as e:
        raise SourceError(f"{path}: unreadable ({e.strerror or e})") from None
    if not head:
        raise SourceError(f"{path}: empty file")
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if saved.looks_like(head):
        return "recording"
    dialect = chrome.looks_like(head)
    if dialect == "kineto" and head.lstrip()[:1] == b"{" and head[:2] != b"\x1f\x8b":
        tail = tail_bytes(path)  # an older ds4lab trace.json writes otherData last
        if b'"otherData"' in tail and b'"ds4lab"' in tail and b'"kernel_source"' in tail:
            dialect = "ds4lab"
    if dialect is not None:
        return "ds4lab-trace" if dialect == "ds4lab" else "kineto"
    suffix = path.name.lower()
    if suffix.endswith(REPORT_SUFFIXES):
        return "nsys-report"
    if suffix.endswith(".qdstrm"):
        raise SourceError(f"{path}: an unconverted Nsight Systems stream (.qdstrm): let nsys finish the report "
                          "(QdstrmImporter), then nsys export --type sqlite the .nsys-rep")
    rec = recording_beside(path)
    if rec is not None:
        what = ("the outcome of a recorded decode loop (what torch.cuda.graph did with it), not its events"
                if _is_outcome(head) else f"not a trace the audit reads (it starts with {head[:40]!r})")
        raise SourceError(f"{path}: {what}; audit the recording beside it: ds4lab audit {shlex.quote(str(rec))}")
    raise SourceError(f"{path}: not a trace the audit reads (a PyTorch profiler / Kineto JSON, an nsys SQLite "
                      f"export, a ds4lab trace.json or a saved recording); it starts with {head[:40]!r}")


#: Names a saved recording beside a non-trace file may have: ``<stem>.csv.gz`` (the bundled
#: ``ds4lab/data/audit/torch-<engine>-<cache>.csv.gz`` beside its outcome ``.json``), ``<stem>.csv``,
#: and the ``recording.csv.gz`` of a recorded run (``ds4lab audit validate``'s ``engine.json`` beside it).
BESIDE = ("{stem}.csv.gz", "{stem}.csv", "recording.csv.gz")


def recording_beside(path: Path) -> Path | None:
    """The saved recording (:mod:`.saved`) in ``path``'s folder that goes with ``path`` (:data:`BESIDE`,
    ``stem``: the name before its first dot), or None; named as ``path`` is (relative stays relative)."""
    from . import saved

    path = Path(path)
    stem = path.name.split(".", 1)[0]
    for pattern in BESIDE:
        p = path.with_name(pattern.format(stem=stem))
        if p == path or not p.is_file():
            continue
        try:
            if saved.looks_like(head_bytes(p, len(saved.MAGIC))):
                return p
        except OSError:
            continue
    return None


def _is_outcome(head: bytes) -> bool:
    """Whether ``head`` is a recorded run's outcome (a JSON object with an ``outcome``, as
    :func:`ds4lab.audit.engines.recorded_outcome` reads)."""
    import json

    try:
        d = json.loads(head.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(d, dict) and "outcome" in d


def read(path: Path, *, progress=None, console=None):
    """The :class:`~ds4lab.audit.events.EventTable` of one trace file (format from :func:`detect`).

    ``progress``: None, a callable ``progress(done, total)``, or a rich Console (a progress bar);
    ``console``: where to say that ``nsys export`` runs for a raw report (default: ``progress`` when
    it is a console).

    Raises:
        SourceError: (a :class:`~ds4lab.errors.BadInput`, exit 2) naming the file and what is wrong:
            not a trace, no CUDA activity at all (and what it holds), cut (the byte offset), a raw
            Nsight report without ``nsys`` on PATH (the export command), unreadable.
    """
    from . import chrome, nsys, saved

    path = Path(path)
    fmt = detect(path)
    if console is None and hasattr(progress, "print"):
        console = progress
    try:
        if fmt == "nsys-report":
            return nsys.read_sqlite(nsys.export_report(path, console), progress)
        if fmt == "nsys-sqlite":
            return nsys.read_sqlite(path, progress)
        if fmt == "recording":
            return saved.read_saved(path, progress)
        return chrome.read_chrome(path, "ds4lab" if fmt == "ds4lab-trace" else "kineto", progress)
    except OSError as e:
        raise SourceError(f"{path}: unreadable ({e.strerror or e})") from None
