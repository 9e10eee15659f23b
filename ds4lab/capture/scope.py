"""The one place ds4lab begins a stream capture (:func:`capture_scope`), and the guarantee that it always ends."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import stream as S


@dataclass
class CaptureScope:
    """What :func:`capture_scope` did: ``stream``, ``mode``; ``graph`` after a normal exit (else None); ``aborted_by``
    (``"KeyboardInterrupt: ..."``, "" if none); ``end_error`` (what ending raised during an abort, recorded, never
    raised); ``status_after`` (capture status after an abort, ``"?"`` where the backend cannot tell)."""

    stream: Any
    mode: str
    graph: Any = None
    aborted_by: str = ""
    end_error: str = ""
    status_after: str = ""


@contextlib.contextmanager
def capture_scope(be, stream, mode: str = "thread_local", *, begin: Callable | None = None,
                  end: Callable | None = None) -> Iterator[CaptureScope]:
    """Begin a stream capture, run the ``with`` block, and always end the capture.

    On a normal exit :attr:`CaptureScope.graph` holds the graph and an error from ending propagates. On any
    ``BaseException`` in the block the capture is ended anyway (CUDA Programming Guide, "Stream Capture" →
    "Invalidation": a capture sequence must be ended even when invalidated), the end's error recorded, and the
    original exception propagates. The thread's stream override is restored either way.

    ``be``: the backend, or None for a raw ``cupy.cuda.Stream``; ``mode``: ``"global"``, ``"thread_local"`` or
    ``"relaxed"``; ``begin(stream, mode)``, ``end(stream) -> graph``: replacements (the conformance recorder's).

    Raises:
        Whatever begin raises, whatever end raises on a normal exit, and the block's own exception after the
        cleanup."""
    if begin is None:
        begin = be.begin_capture if be is not None else _raw_begin
    if end is None:
        end = be.end_capture if be is not None else (lambda s: s.end_capture())
    scope = CaptureScope(stream, mode)
    override = S.capture_get_override()
    begin(stream, mode)
    try:
        yield scope
    except BaseException as exc:
        scope.aborted_by = f"{type(exc).__name__}: {exc}"
        try:
            end(stream)
        except BaseException as e2:  # recorded, never raised: the block's exception goes on
            scope.end_error = f"{type(e2).__name__}: {e2}"
        scope.status_after = _status(be, stream)
        S.capture_set_stream(override)
        raise
    try:
        scope.graph = end(stream)
    finally:
        S.capture_set_stream(override)


def _raw_begin(stream, mode: str) -> None:
    """``cupy.cuda.Stream.begin_capture`` with the mode named as ds4lab names it."""
    import cupy

    rt = cupy.cuda.runtime
    m = {"global": rt.streamCaptureModeGlobal, "thread_local": rt.streamCaptureModeThreadLocal,
         "relaxed": rt.streamCaptureModeRelaxed}[mode]
    stream.begin_capture(m)


def _status(be, stream) -> str:
    try:
        if be is not None:
            return be.capture_status(stream)
        return "active" if stream.is_capturing() else "none"
    except Exception:
        return "?"
