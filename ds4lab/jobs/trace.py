"""``ds4lab trace``: one decode token per capture stage as a Chrome/Perfetto trace (CUPTI kernel
records on a GPU, the sim's modeled schedule labelled MODELED, under ds4lab's recorded NVTX ranges).
The work is :func:`ds4lab.report.trace_export.run_trace`; this module gives it the jobs' interface."""

from __future__ import annotations

from ..report.trace_export import NoKernelRecords, TraceConfig, TraceError, TraceResult, run_trace
from ..report.trace_export import check_config as _check


def check_config(cfg: TraceConfig) -> None:
    """Checks that need no backend (:func:`ds4lab.report.trace_export.check_config`). Raises TraceError (exit 2)."""
    _check(cfg)


def run(cfg: TraceConfig, be, console=None) -> TraceResult:
    """Trace ``cfg`` on ``be`` (:func:`ds4lab.report.trace_export.run_trace`); returns its :class:`TraceResult`."""
    return run_trace(cfg, be, console)


__all__ = ["NoKernelRecords", "TraceConfig", "TraceError", "TraceResult", "check_config", "run"]
