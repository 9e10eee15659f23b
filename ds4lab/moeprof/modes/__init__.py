"""The profiling modes, one class each behind :class:`~.base.ProfilingMode`, and the factory (:func:`make_mode`);
:data:`MODES` and :data:`STAGE_MODES` follow from :data:`MODE_CLASSES`."""

from __future__ import annotations

from .base import ProfilingMode
from .cupti import Cupti
from .deferred import Deferred
from .graph_boundary import GraphBoundary
from .host_timed import HostTimed, ProfilerCaptureError
from .in_graph import InGraph
from .nvtx import Nvtx

#: mode name → class, in :data:`MODES` order
MODE_CLASSES: dict[str, type[ProfilingMode]] = {
    cls.name: cls for cls in (HostTimed, Deferred, GraphBoundary, InGraph, Cupti, Nvtx)}
MODES = tuple(MODE_CLASSES)
#: Modes whose rows carry per-stage times (graph-boundary: total only; nvtx: none).
STAGE_MODES = tuple(name for name, cls in MODE_CLASSES.items() if cls.per_stage)
#: the modes ``host-timed`` can hand a refused call to (``fallback=``)
FALLBACKS: dict[str, type[ProfilingMode]] = {"in-graph": InGraph, "deferred": Deferred}


def check_mode(name: str, fallback: str | bool | None = None) -> None:
    """Raises ValueError for a mode ``name`` not in :data:`MODES`, or a ``fallback`` that is neither None, False nor a
    key of :data:`FALLBACKS` (the messages name the choices)."""
    if name not in MODE_CLASSES:
        raise ValueError(f"unknown profiling mode {name!r}; choose one of: {', '.join(MODES)}")
    if fallback not in (False, None, *FALLBACKS):
        raise ValueError(f"fallback={fallback!r}: choose True, 'in-graph' or 'deferred'")


def make_mode(prof, name: str, *, guard: bool = True, fallback: str | None = None,
              slots: int | None = None) -> ProfilingMode:
    """The mode object for profiler ``prof``: ``name`` from :data:`MODES`; ``fallback`` (a key of :data:`FALLBACKS` or
    None) is built only for a mode that accepts one. Raises ValueError for an unknown name or fallback
    (:func:`check_mode`)."""
    check_mode(name, fallback)
    cls = MODE_CLASSES[name]
    fb = FALLBACKS[fallback].as_fallback(prof, slots=slots) if (fallback and cls.accepts_fallback) else None
    return cls.build(prof, guard=guard, fallback=fb, slots=slots)


def auto_regime(name: str) -> str:
    """The regime ``regime="auto"`` means for mode ``name`` (``eager`` for an unknown name: the profiler refuses it
    later)."""
    cls = MODE_CLASSES.get(name)
    return cls.auto_regime if cls is not None else "eager"


def runs_last(name: str) -> bool:
    """Whether mode ``name`` stays loaded in the process once started (run it after the others)."""
    cls = MODE_CLASSES.get(name)
    return bool(cls is not None and cls.process_wide)


__all__ = ["MODE_CLASSES", "MODES", "STAGE_MODES", "FALLBACKS", "ProfilingMode", "HostTimed", "Deferred",
           "GraphBoundary", "InGraph", "Cupti", "Nvtx", "ProfilerCaptureError", "check_mode", "make_mode",
           "auto_regime", "runs_last"]
