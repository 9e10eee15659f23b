"""``ds4lab audit``: what CUDA-graph capture would refuse, break or silently get wrong in any engine's decode step, and
what it would save, from the traces people already take.

``events``: the one event table every source is read into; ``sources``: the readers; ``analysis``: :func:`analyze` (one
:class:`AuditReport` per source, process and device); ``report``: the files, figure and terminal summary. ``analyze``
and ``AuditReport`` are imported on first use, so reading the event table's definition never imports the analysis.
``check_replay`` (:mod:`ds4lab.audit.replay_check`): capture a PyTorch step and hold its replays to an eager twin."""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("analyze", "AuditReport"):
        from . import analysis

        return getattr(analysis, name)
    if name == "check_replay":
        from .replay_check import check_replay

        return check_replay
    raise AttributeError(f"module 'ds4lab.audit' has no attribute {name!r}")
