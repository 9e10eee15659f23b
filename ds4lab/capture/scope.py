"""The one place ds4lab begins a stream capture, and the guarantee that it always ends.

:func:`capture_scope` begins a capture, runs the ``with`` block and ends the capture whatever the block raised
(``KeyboardInterrupt`` included), restoring the thread's stream override; the graph cache, the MoE profiler, the
exclusion matrix, the conformance scenarios, the benchmarks and the calibration all capture through it. Source: CUDA
Programming Guide, "CUDA Graphs" → "Stream Capture" → "Invalidation" (a capture sequence must be ended even when
invalidated)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import stream as S


@dataclass
class CaptureScope:
    """What :func:`capture_scope` did: the graph on a normal exit, or how it cleaned up.

    Attributes:
        stream: the stream the capture began on.
        mode: the capture mode asked for.
        graph: the captured graph (the backend's graph object, or CuPy's ``cupy.cuda.Graph`` for a raw stream) after a
            normal exit; None after an abort or when ending failed.
        aborted_by: the exception that left the block, as ``"KeyboardInterrupt: ..."``; "" if none.
        end_error: what ending the capture raised during an abort ("" if it ended cleanly); during an abort it is
            recorded, never raised, so the original exception goes on.
        status_after: the stream's capture status after an abort (``"none"`` when clean; ``"?"`` where the backend
            cannot tell), from ``Backend.capture_status``."""

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

    The one place ds4lab begins a capture (graph cache, MoE profiler and exclusion matrix through it, conformance
    scenarios, benchmarks, calibration). On a normal exit the capture is ended and :attr:`CaptureScope.graph` holds the
    graph; an error from ending it (an invalidated capture: ``cudaErrorStreamCaptureInvalidated``) propagates. On any
    ``BaseException`` inside the block (``KeyboardInterrupt`` included) the capture is ended anyway and the partial
    graph dropped (CUDA Programming Guide, "Stream Capture" → "Invalidation": a capture sequence must be ended with
    ``cudaStreamEndCapture`` even when invalidated, or the stream stays in capture mode and later eager work is
    captured instead of run); an error from that end is recorded in :attr:`CaptureScope.end_error`, and the original
    exception propagates. In both cases the calling thread's stream override
    (:func:`ds4lab.capture.stream.capture_set_stream`) is restored to what it was on entry.

    Args:
        be: the backend (``begin_capture(stream, mode)``, ``end_capture(stream)``, ``capture_status(stream)``), or None
            for a raw ``cupy.cuda.Stream`` (its own ``begin_capture(mode)``/``end_capture()``, with CuPy's mode
            constants).
        stream: the stream to capture (a non-blocking stream; the legacy stream is refused by CUDA).
        mode: ``"global"``, ``"thread_local"`` or ``"relaxed"`` (``cudaStreamCaptureMode``).
        begin, end: replacements for the begin/end calls, ``begin(stream, mode)`` and ``end(stream) -> graph`` (the
            conformance recorder passes recording wrappers).

    Raises:
        Whatever begin raises (nothing to clean up then), whatever end raises on a normal exit,
        and the block's own exception after the cleanup."""
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
