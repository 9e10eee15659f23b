"""What every trace reader shares: the error it raises, the tables a summary reader returns (:class:`Ingested`),
problem reporting (strict or lenient), progress over bytes, a byte-counting reader, streamed lines, an input's
content hash, ``meta.json`` reading and number parsing as the profilers print numbers."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from ...errors import BadInput


class SourceError(BadInput):
    """A trace or profile that cannot be read (exit 2): the message names the file and what is wrong with it (the line,
    event or row and the field; what it holds instead; the byte where it is cut; the command that converts it)."""


#: time unit → factor to µs (``nsys stats`` column units; ``ncu`` metric units, long and short)
TIME_UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "µs": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                "s": 1e6, "second": 1e6}


@dataclass
class Ingested:
    """What one input gave: tables by name, the bad lines (lenient mode) and the warnings. Streamed rows go to
    ``sink`` when set (:meth:`emit`), else into :attr:`tables`; ``rows`` counts each table's rows;
    ``progress(n)`` is told of every ``n`` bytes read."""

    path: Path
    kind: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    problems: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    sink: Callable[[str, pd.DataFrame], None] | None = None
    progress: Callable[[int], None] | None = None

    def emit(self, table: str, df) -> None:
        """Hand rows of ``table`` (a DataFrame or :class:`RowBlock`) to :attr:`sink`, or into :attr:`tables`."""
        if len(df) == 0:
            return
        self.rows[table] = self.rows.get(table, 0) + len(df)
        if self.sink is not None:
            self.sink(table, df)
            return
        if isinstance(df, RowBlock):
            df = df.frame()
        if table in self.tables:
            self.tables[table] = pd.concat([self.tables[table], df], ignore_index=True)
        else:
            self.tables[table] = df.reset_index(drop=True)

    def counts(self) -> dict[str, int]:
        """Rows per table: those emitted, and those of :attr:`tables` a reader set whole."""
        out = dict(self.rows)
        for name, df in self.tables.items():
            out.setdefault(name, len(df))
        return out

    def read(self, n: int) -> None:
        """Tell :attr:`progress` that ``n`` more bytes were read."""
        if self.progress is not None:
            self.progress(n)


@dataclass
class RowBlock:
    """Rows of one table as tuples in ``columns`` order, for the CSV writer without a DataFrame (``""``: empty)."""

    columns: tuple
    rows: list

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (empty cells as NaN)."""
        return pd.DataFrame(self.rows, columns=list(self.columns)).replace("", float("nan"))


GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    """Whether ``path`` is a gzip file (its magic bytes ``1f 8b``), whatever its name."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def text_lines(res: Ingested, path: Path, report_every: int = 1 << 20):
    """``(line number, text)`` of every line of ``path`` (gzip decompressed), streamed, UTF-8 with replacement,
    progress told every ``report_every`` bytes. Raises SourceError: a damaged or cut gzip stream (naming the
    file and the line reached)."""
    import gzip

    pending = 0
    with open(path, "rb") as raw:
        gz = is_gzip(path)
        f = gzip.GzipFile(fileobj=raw) if gz else raw
        at = 0
        n = 0
        try:
            for n, line in enumerate(f, 1):
                pos = raw.tell() if gz else at + len(line)  # progress over the file's own bytes
                pending, at = pending + pos - at, pos
                if pending >= report_every:
                    res.read(pending)
                    pending = 0
                yield n, line.decode("utf-8", errors="replace").rstrip("\r\n")
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise SourceError(f"{path}: its gzip stream ends early or is damaged after line {n:,} ({e}): cut off "
                              "(truncated); copy it again") from None
    if pending:
        res.read(pending)


def ends_with_newline(path: Path) -> bool:
    """Whether the (decompressed) file's last byte is a newline (empty: True): every tool ds4lab reads ends
    its output with one, so a file without it was cut off."""
    import gzip

    if is_gzip(path):
        last = b""
        try:
            with gzip.open(path, "rb") as g:
                for block in iter(lambda: g.read(1 << 20), b""):
                    last = block[-1:]
        except (EOFError, OSError, zlib.error):
            return False
        return last in (b"", b"\n")
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def content_sha256(path: Path) -> str:
    """SHA-256 of an input's content, streamed: a file's bytes; for a folder, its files (names relative to it, sorted,
    and bytes; sub-folders included). Two inputs with the same hash hold the same data, whatever their paths."""
    h = hashlib.sha256()
    path = Path(path)
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            rel = f.relative_to(path).as_posix()
            if rel.startswith(".") or "/." in rel:  # locks and staging folders are not content
                continue
            h.update(rel.encode() + b"\0")
            _hash_file(h, f)
            h.update(b"\0")
        return h.hexdigest()
    _hash_file(h, path)
    return h.hexdigest()


def distinct_inputs(paths, error, twice: str) -> list[tuple[Path, str]]:
    """Each input once, by path and by content (:func:`content_sha256`), as ``[(path, sha256)]``. Raises
    ``error`` naming an input given twice with both names and ``twice`` (why that is wrong), or one unreadable."""
    seen: dict[Path, Path] = {}
    for p in map(Path, paths):
        key = p.resolve()
        if key in seen:
            same = "" if str(seen[key]) == str(p) else f" (as {seen[key]} and as {p})"
            raise error(f"{p}: given twice{same}: {twice}")
        seen[key] = p
    by_hash: dict[str, Path] = {}
    out = []
    for p in seen.values():
        if not p.exists():
            raise error(f"{p}: no such file")
        try:
            digest = content_sha256(p)
        except OSError as e:
            raise error(f"{p}: unreadable ({e.strerror or e}: {e.filename or p})") from None
        if digest in by_hash:
            raise error(f"{p}: the same content as {by_hash[digest]} (sha256 {digest[:12]}): {twice}")
        by_hash[digest] = p
        out.append((p, digest))
    return out


def csv_shape_problems(path: Path, limit: int = 20) -> list[tuple[int, str]]:
    """``(line, why)`` of CSV rows off the header's field count, and a cut last line; at most ``limit``."""
    import csv

    out: list[tuple[int, str]] = []
    last = 0
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rd = csv.reader(f)
        try:
            header = next(rd, None)
            if header is None:
                return out
            last = rd.line_num
            for row in rd:
                last = rd.line_num
                if row and len(row) != len(header) and len(out) < limit:
                    out.append((rd.line_num, f"{len(row)} fields, the header has {len(header)}"))
        except csv.Error as e:
            out.append((rd.line_num, f"unreadable CSV ({e})"))
    if last and not ends_with_newline(path):
        out = [p for p in out if p[0] != last]
        out.append((last, "the file ends in the middle of a line: cut off (truncated)"))
    return out


def input_size(path: Path) -> int:
    """An input's size in bytes: a file's, or the files directly in a folder together."""
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.glob("*") if f.is_file())
    return p.stat().st_size


def _hash_file(h, f: Path) -> None:
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)


_JSON_TYPE = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def load_meta(f: Path) -> dict:
    """A ds4lab ``meta.json`` as a dict. Raises SourceError naming the file (and the line of a JSON syntax error) when
    it cannot be read, is not JSON, or is not a JSON object."""
    f = Path(f)
    try:
        text = f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{f}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise SourceError(f"{f}: empty file, not a ds4lab meta.json")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise SourceError(f"{f}:{e.lineno}: broken JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(meta, dict):
        raise SourceError(f"{f}: a JSON {_JSON_TYPE.get(type(meta), type(meta).__name__)}, not the object "
                          "ds4lab writes")
    return meta


def check_out_dir(out: Path) -> None:
    """Raise IngestError unless ``out`` is, or can be made, a writable folder (an existing file at ``out`` or above it,
    or a read-only parent, is named). Creates nothing."""
    out = Path(out)
    for q in (out, *out.parents):
        if q.is_dir():
            if not os.access(q, os.W_OK | os.X_OK):
                raise SourceError(f"--out {out}: {q} is not writable")
            return
        if q.exists() or q.is_symlink():
            what = "is a file, not a folder" if q == out else "is a file, so no folder can be made below it"
            raise SourceError(f"--out {out}: {q} {what}")




def problem(res: Ingested, lenient: bool, line: int, why: str, text: str = "") -> None:
    """Report one bad line of ``res.path``: raise :class:`SourceError` (``file:line: why: 'text'``) unless ``lenient``,
    else append it to ``res.problems`` (the rows read so far are kept)."""
    if not lenient:
        raise SourceError(f"{res.path}:{line}: {why}" + (f": {text.strip()[:120]!r}" if text else ""))
    res.problems.append({"file": str(res.path), "line": line, "problem": why, "text": text.strip()[:200]})


def num(cell) -> float:
    """A number as nsys and ncu print it: plain, quoted, with thousands separators (``1,234.5``, narrow no-break
    spaces). Raises ValueError for anything else (``n/a``, text, empty)."""
    c = str(cell).strip().strip('"').replace(",", "").replace("\u202f", "").replace(" ", "")
    return float(c)


def finite_nonneg(v: float) -> str | None:
    """None for a finite number ≥ 0, else what is wrong (``negative``, ``not a finite number``)."""
    if not math.isfinite(v):
        return "not a finite number"
    return "negative" if v < 0 else None


def snake(text: str) -> str:
    """A header as a column name: ``Total Time`` → ``total_time``, ``Time (%)`` → ``time_pct``."""
    t = text.strip().replace("(%)", " pct").replace("%", " pct")
    t = re.sub(r"[^0-9A-Za-z]+", "_", t).strip("_").lower()
    return t or "column"


class Progress:
    """Progress of a reader over ``total`` units on ``target``: None, a callable ``target(done, total)``, or a
    rich Console (a bar redrawn at most every 0.2 s). A context manager; :meth:`to` reports the units done."""

    def __init__(self, target, description: str, total: int) -> None:
        self.target = target
        self.total = max(int(total), 1)
        self.done = 0
        self._bar = None
        self._call = None
        self._last = 0.0
        if target is None:
            return
        if callable(target) and not hasattr(target, "print"):
            self._call = target
        else:
            from ...progress import LONG_PHASE_S, JobProgress

            # with an estimate; off a terminal no line for a read shorter than a long phase
            self._bar = JobProgress(target, description, self.total, eta=True, quiet_s=LONG_PHASE_S)

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.to(self.total)
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def to(self, done: int) -> None:
        """``done`` units of :attr:`total` are read."""
        done = min(int(done), self.total)
        if done <= self.done:
            return
        if self._bar is not None:
            self._bar.advance(done - self.done)
        elif self._call is not None:
            now = time.perf_counter()  # a host clock for a redraw rate, nothing measured
            if now - self._last >= 0.2 or done == self.total:
                self._last = now
                self._call(done, self.total)
        self.done = done


class CountingReader:
    """A binary reader over ``raw`` counting the bytes read (``count``) and reporting ``progress_of``'s ``tell``."""

    def __init__(self, raw, progress: Progress | None = None, progress_of=None) -> None:
        self.raw = raw
        self.count = 0
        self.progress = progress
        self.progress_of = progress_of

    def read(self, n: int = -1) -> bytes:
        b = self.raw.read(n)
        self.count += len(b)
        if self.progress is not None:
            self.progress.to(self.progress_of.tell() if self.progress_of is not None else self.count)
        return b


def head_bytes(path: Path, n: int = 65536) -> bytes:
    """The first ``n`` bytes of ``path``, decompressed when it is a gzip file (magic ``1f 8b``)."""
    import gzip

    with open(path, "rb") as f:
        head = f.read(n)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                return g.read(n)
        except (OSError, EOFError, zlib.error):  # a cut or damaged file: what decompresses
            with open(path, "rb") as f:
                return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(f.read(1 << 20), n)
    return head

