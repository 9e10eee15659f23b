"""Every trace and profile ds4lab reads, in one place: one :func:`detect` (the format from the content, never from the
name alone) and one reader module per format (:data:`READERS`), each declaring its ``FORMATS`` and ``YIELDS``: an
event table (:func:`read_events`, for ``ds4lab audit``) or summary tables (:func:`read_tables`, for ``ds4lab
ingest``). A raw ``.nsys-rep`` is exported with ``nsys`` where on PATH; a raw ``.ncu-rep`` or ``.qdstrm`` is refused
with the command that converts it. A malformed input is a :class:`SourceError` (exit 2) naming the file and where.
A new source: a reader module here, named in :data:`READERS`, recognised by :func:`detect`. The formats:
docs/architecture.md, "The trace model"; what each reader takes: docs/trace-readers.md."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from .common import Ingested, SourceError, head_bytes

__all__ = ["READERS", "Ingested", "SourceError", "detect", "formats", "read_events", "read_tables", "recording_beside",
           "yields"]

#: The reader modules, each declaring the formats it reads (``FORMATS``: name → what it is) and what it
#: yields (``YIELDS``).
READERS = ("nsys_sqlite", "saved", "kineto", "nsys_report", "ds4log", "ncu", "nsys_csv", "folder")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
#: Names of the files :func:`read_events` may read end with (Kineto/Chrome JSON, a saved recording, an nsys SQLite
#: export, a raw Nsight Systems report it names the export of).
EVENT_SUFFIXES = (".json", ".json.gz", ".csv.gz", ".sqlite", *REPORT_SUFFIXES)
_NSYS_EXPORT = ("export it first, `nsys export --type sqlite --output {stem}.sqlite {name}` (then read {stem}.sqlite), "
                "or `nsys stats --report cuda_gpu_kern_sum,nvtx_sum --format csv {name} > {stem}.csv`")
#: raw report files of the Nsight tools (binary: ds4lab reads their exports) → how to export them
RAW_REPORTS = {
    ".nsys-rep": "an Nsight Systems report: " + _NSYS_EXPORT,
    ".qdrep": "an Nsight Systems report (before 2021.4): " + _NSYS_EXPORT,
    ".ncu-rep": "an Nsight Compute report: export it first, `ncu --import {name} --csv > {stem}.csv` (add "
                "`--page raw` for one row per kernel), then read {stem}.csv",
}
#: bytes read at a time while a text format is detected (detection streams; it never loads a file)
_SCAN_BLOCK = 1 << 20
_EVENTS_HINT = ("a PyTorch profiler / Kineto JSON, an nsys SQLite export, a ds4lab trace.json or a saved "
                "recording")
_TABLES_HINT = ("a ds4 MoE profile log, an nsys stats CSV, an nsys SQLite export, ncu --csv output or a ds4lab "
                "result folder")


def formats() -> dict:
    """``{format: (reader module, what it is)}`` of every reader in :data:`READERS`."""
    import importlib

    out = {}
    for name in READERS:
        mod = importlib.import_module(f".{name}", __name__)
        out.update({fmt: (mod, what) for fmt, what in mod.FORMATS.items()})
    return out


def yields(fmt: str) -> tuple:
    """What format ``fmt``'s reader yields: ``"events"`` and/or ``"tables"`` (the module's ``YIELDS``)."""
    return tuple(formats()[fmt][0].YIELDS)


def _what(fmt: str) -> str:
    return formats()[fmt][1]


def detect(path: Path, want: str | None = None) -> str:
    """The format of ``path`` (one of :func:`formats`), from its content; ``want`` (``"events"`` or ``"tables"``) only
    words the error. Raises SourceError: no such file, empty or unreadable, a folder that is not a result folder, a
    ``.qdstrm``, a raw ``.ncu-rep`` (with the export command), or none of the formats (with an escaped excerpt),
    naming a saved recording beside it where there is one (:func:`recording_beside`)."""
    from . import kineto, saved

    path = Path(path)
    if path.is_dir():
        meta = path / "meta.json"
        if meta.is_file():
            from .common import load_meta

            m = load_meta(meta)
            if "ds4lab" in m or "job" in m:  # the conformance suite's and other early folders name only job
                return "ds4lab-folder"
            raise SourceError(f"{meta}: not written by ds4lab (no \"ds4lab\" or \"job\" key)")
        if want == "events":
            raise SourceError(f"{path}: a folder; give the trace file (a .json/.json.gz profiler trace, an nsys .sqlite "
                              "export, a ds4lab trace.json or a saved recording)")
        raise SourceError(f"{path}: a folder without a ds4lab meta.json")
    head = _head(path)
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if saved.looks_like(head):
        return "recording"
    dialect = kineto.looks_like(head)
    if dialect is not None:
        return "ds4lab-trace" if dialect == "ds4lab" else "kineto"
    name = path.name.lower()
    if name.endswith(REPORT_SUFFIXES):
        return "nsys-report"
    if name.endswith(".qdstrm"):
        raise SourceError(f"{path}: an unconverted Nsight Systems stream (.qdstrm): let nsys finish the report "
                          "(QdstrmImporter), then nsys export --type sqlite the .nsys-rep")
    hint = RAW_REPORTS.get(path.suffix.lower())
    if hint:
        raise SourceError(f"{path}: " + hint.format(name=path.name, stem=path.stem))
    try:
        found = _scan(path)
    except OSError as e:
        raise SourceError(f"{path}: unreadable ({e.strerror or e})") from None
    if found:
        return found
    rec = recording_beside(path)
    if rec is not None:
        what = ("the outcome of a recorded decode loop (what torch.cuda.graph did with it), not its events"
                if _is_outcome(head) else f"not a trace the audit reads (it starts with {head[:40]!r})")
        raise SourceError(f"{path}: {what}; audit the recording beside it: ds4lab audit {shlex.quote(str(rec))}")
    if want == "tables":
        raise SourceError(f"{path}: not {_TABLES_HINT} (starts with {head[:40]!r})")
    if want == "events":
        raise SourceError(f"{path}: not a trace the audit reads ({_EVENTS_HINT}); it starts with {head[:40]!r}")
    raise SourceError(f"{path}: not a trace or profile ds4lab reads ({_EVENTS_HINT}; or {_TABLES_HINT}); it starts "
                      f"with {head[:40]!r}")


def _head(path: Path) -> bytes:
    """The first bytes of the file at ``path`` (decompressed); SourceError for none, an unreadable or an empty one."""
    what = "no such file" if not path.is_file() else None
    head = b""
    if what is None:
        try:
            head = head_bytes(path)
        except OSError as e:
            what = f"unreadable ({e.strerror or e})"
    if what or not head:
        raise SourceError(f"{path}: {what or 'empty file'}")
    return head


def _read_block(f, n: int) -> bytes:
    """The next ``n`` bytes of ``f``; b"" where a gzip stream ends early (what came before still counts)."""
    import gzip
    import zlib

    try:
        return f.read(n)
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return b""


def _scan(path: Path) -> str | None:
    """The text format ``path`` holds, scanned a block at a time: ds4's prefix, ncu's CSV header, nsys stats'."""
    from . import ncu, nsys_csv
    from .ds4log import DS4_PREFIX

    import gzip

    from .common import is_gzip

    text_formats = (("ncu-csv", ncu.looks_like), ("nsys-csv", nsys_csv.looks_like))
    kinds: set[str] = set()
    tail = ""
    seen = 0
    with (gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")) as f:
        block = _read_block(f, 4096)
        while block:
            text = tail + block.decode("utf-8", errors="replace")
            cut = text.rfind("\n")
            lines, tail = (text[:cut], text[cut + 1:]) if cut >= 0 else ("", text)
            tail = tail[-65536:]  # a line longer than this is no format's marker
            if DS4_PREFIX in lines or DS4_PREFIX in tail:
                return "ds4-log"
            for k, looks in text_formats:
                if k not in kinds and (k == "ncu-csv" or seen < 64 * _SCAN_BLOCK) and looks(lines):
                    kinds.add(k)
            seen += len(block)
            block = _read_block(f, _SCAN_BLOCK)
    for k, looks in text_formats:  # ncu's first where both match
        if k in kinds or tail and looks(tail):
            return k
    return None


#: Names a saved recording beside a non-trace file may have: ``<stem>.csv.gz`` (the bundled
#: ``ds4lab/data/audit/torch-<engine>-<cache>.csv.gz`` beside its outcome ``.json``), ``<stem>.csv``,
#: and the ``recording.csv.gz`` of a recorded run (``ds4lab audit validate``'s ``engine.json`` beside it).
BESIDE = ("{stem}.csv.gz", "{stem}.csv", "recording.csv.gz")


def recording_beside(path: Path) -> Path | None:
    """The saved recording (:mod:`.saved`) in ``path``'s folder that goes with ``path`` (:data:`BESIDE`, ``stem``: the
    name before its first dot), or None; named as ``path`` is (relative stays relative)."""
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
    """Whether ``head`` is a recorded run's outcome (a JSON object with an ``outcome``)."""
    try:
        d = json.loads(head.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(d, dict) and "outcome" in d


def read_events(path: Path, *, progress=None, console=None):
    """The :class:`~ds4lab.trace.events.EventTable` of one trace file. ``progress``: None, ``progress(done, total)``
    or a rich Console; ``console``: where ``nsys export`` is said (default: ``progress`` when a console). Raises
    SourceError naming the file and what is wrong: not a trace (a summary format named, with its command), no CUDA
    activity, cut, a malformed event, a raw Nsight report without ``nsys``, unreadable."""
    from . import kineto, nsys_report, nsys_sqlite, saved

    path = Path(path)
    fmt = detect(path, want="events")
    if console is None and hasattr(progress, "print"):
        console = progress
    if "events" not in yields(fmt) and fmt != "nsys-report":
        raise SourceError(f"{path}: not a trace the audit reads: {_what(fmt)}, which holds summary tables, not "
                          f"events (ds4lab ingest reads it); the audit reads {_EVENTS_HINT}")
    try:
        if fmt == "nsys-report":
            return nsys_sqlite.read_sqlite(nsys_report.export_report(path, console), progress)
        if fmt == "nsys-sqlite":
            return nsys_sqlite.read_sqlite(path, progress)
        if fmt == "recording":
            return saved.read_saved(path, progress)
        return kineto.read_chrome(path, "ds4lab" if fmt == "ds4lab-trace" else "kineto", progress)
    except OSError as e:
        raise SourceError(f"{path}: unreadable ({e.strerror or e})") from None


def read_tables(path: Path, lenient: bool = False, *, sink=None, progress=None, read_meta=None) -> Ingested:
    """The summary tables of one input as an :class:`Ingested` (ds4 logs and nsys stats CSV streamed to
    ``sink(table, rows)`` when given); ``progress(n)`` told of each ``n`` bytes; ``read_meta``: how a ds4lab folder's
    ``meta.json`` is read. Raises SourceError: a malformed line unless ``lenient`` (file and line); an input that is
    not one (an event format named, with its command) or cannot be read."""
    from .common import input_size

    path = Path(path)
    fmt = detect(path, want="tables")
    if fmt == "nsys-report":
        raise SourceError(f"{path}: " + RAW_REPORTS[path.suffix.lower() if path.suffix.lower() in RAW_REPORTS
                                                    else ".nsys-rep"].format(name=path.name, stem=path.stem))
    if "tables" not in yields(fmt):
        raise SourceError(f"{path}: {_what(fmt)}: an event table, which ds4lab ingest does not table; "
                          "ds4lab audit reads it")
    mod = formats()[fmt][0]
    res = Ingested(path, fmt, sink=sink, progress=progress)
    reader = {"ds4-log": "read_ds4_log", "nsys-csv": "read_nsys_csv", "nsys-sqlite": "read_nsys_sqlite",
              "ncu-csv": "read_ncu_csv", "ds4lab-folder": "read_ds4lab_folder"}[fmt]
    try:
        if fmt in ("ds4-log", "nsys-csv"):  # streamed: they fill the record whose sink gets their rows
            getattr(mod, reader)(path, lenient, res)
            return res
        kw = {"read_meta": read_meta} if fmt == "ds4lab-folder" and read_meta is not None else {}
        got = getattr(mod, reader)(path, lenient, **kw)
    except OSError as e:
        raise SourceError(f"{path}: unreadable ({e.strerror or e})") from None
    res.tables, res.problems, res.warnings = got.tables, got.problems, got.warnings
    if progress is not None:
        progress(input_size(path))
    return res
