"""The stream accessor, stage 0 of ds4's CUDA-graph plan: every launch site asks :func:`current_stream`, as ds4's
``ds4_current_stream()`` does. Without an override it returns :data:`LEGACY_STREAM` (outputs bit-identical to the
unrouted path); an override is thread-local, like ds4's ``static __thread`` one, so a capture on one thread never
redirects another thread's launches."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

ENV_FLAG = "DS4_CUDA_GRAPHS"


class _Legacy:
    """Marker for the legacy default stream (CUDA stream handle 0)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LEGACY_STREAM"


#: What :func:`current_stream` returns when no override applies.
LEGACY_STREAM: Any = _Legacy()

_tls = threading.local()
_flag = os.environ.get(ENV_FLAG) == "1"


def graphs_flag() -> bool:
    """Whether ``DS4_CUDA_GRAPHS=1`` was set (read at import, or by :func:`set_graphs_enabled` /
    :func:`graphs_enabled`)."""
    return _flag


class graphs_enabled:
    """``with graphs_enabled():`` the ``DS4_CUDA_GRAPHS`` flag on (``False``: off) for the block, restored afterwards
    whatever it raised (an override counts only while the flag is on, as in ds4). ``if graphs_enabled():`` raises
    TypeError (the flag's value is :func:`graphs_flag`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        self._prev: list[bool] = []

    def __enter__(self) -> "graphs_enabled":
        self._prev.append(_flag)
        set_graphs_enabled(self.enabled)
        return self

    def __exit__(self, *exc) -> None:
        set_graphs_enabled(self._prev.pop())

    def __bool__(self) -> bool:
        raise TypeError("graphs_enabled() is a context manager; the flag's value is graphs_flag()")


def set_graphs_enabled(enabled: bool | None = None) -> bool:
    """Set the flag (``None``: re-read ``DS4_CUDA_GRAPHS``; ds4lab reads it once at import, as ds4 does). Returns it."""
    global _flag
    _flag = (os.environ.get(ENV_FLAG) == "1") if enabled is None else bool(enabled)
    return _flag


def current_stream() -> Any:
    """The stream the calling thread's next launch must use: its override while the flag is on and one is set, else
    :data:`LEGACY_STREAM`. Kept to two attribute reads: every launch calls it."""
    if _flag:
        s = getattr(_tls, "stream", None)
        if s is not None:
            return s
    return LEGACY_STREAM


def capture_set_stream(stream: Any) -> Any:
    """Set (``None``: clear) the calling thread's override, as ds4's ``ds4_capture_set_stream()``; returns the previous
    one. No effect on :func:`current_stream` while the flag is off."""
    prev = getattr(_tls, "stream", None)
    _tls.stream = stream
    return prev


def capture_get_override() -> Any:
    """The calling thread's override as set, regardless of the flag (``None`` when unset)."""
    return getattr(_tls, "stream", None)


@contextlib.contextmanager
def stream_override(stream: Any) -> Iterator[Any]:
    """Scope an override to a ``with`` block, restoring the previous one on exit (also on error)."""
    prev = capture_set_stream(stream)
    try:
        yield stream
    finally:
        capture_set_stream(prev)


#: Stream-capture modes, as ds4lab names them (CUDA Runtime API, ``cudaStreamCaptureMode``:
#: ``cudaStreamCaptureModeGlobal`` = 0, ``ThreadLocal`` = 1, ``Relaxed`` = 2, in that order).
CAPTURE_MODES = ("global", "thread_local", "relaxed")
