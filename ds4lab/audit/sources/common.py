"""What every source reader shares: the error it raises, progress over bytes, a byte-counting reader."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

from ...errors import BadInput


class SourceError(BadInput):
    """A trace the audit cannot read (exit 2): the message names the file and what is wrong with it
    (what it holds instead, the byte where it is cut, the command that converts it)."""


class Progress:
    """Progress of a reader over ``total`` units (bytes or rows), shown on ``target``.

    ``target`` is None (nothing shown), a callable ``target(done, total)``, or a rich Console (a bar
    through :class:`ds4lab.progress.JobProgress`, redrawn at most every 0.2 s). Use as a context
    manager; :meth:`to` reports the units done so far (cheap when nothing is due)."""

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
            from ...progress import JobProgress

            self._bar = JobProgress(target, description, self.total)

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
    """A binary file-like object over ``raw`` that counts the bytes read through it (``count``) and
    reports them to a :class:`Progress` (``tell`` of ``progress_of``: the compressed offset for a
    ``.gz`` file, so the bar runs over the file's own size)."""

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


def tail_bytes(path: Path, n: int = 65536) -> bytes:
    """The last ``n`` bytes of ``path`` as stored (no decompression)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - n))
        return f.read()
