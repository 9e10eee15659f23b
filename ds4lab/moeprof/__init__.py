"""The routed-MoE timing profiler (``ds4lab moe``): ds4's seven-event profile, which a stream capture refuses, and
the modes that time the same stages under capture (:data:`MODES`). How each works: ``docs/moe-profiler.md``.

Next: :mod:`.profiler` (:class:`MoeProfiler`), :mod:`.modes`, :mod:`.rows`, :mod:`.ds4log`, :mod:`.workbench`,
:mod:`.whole_tokens`, :mod:`.exclusion` (the profiling × capture matrix)."""

from __future__ import annotations

from ..token.model import MOE_STAGES
from .ds4log import ds4_lines, format_ds4_line, profile_rows
from .modes import MODES, STAGE_MODES, ProfilerCaptureError
from .profiler import MoeProfiler
from .rows import (KERNEL_STAGE, REGIMES, ROW_COLUMNS, STAGES, TOKENS_DEFAULT, capture_status, is_modeled, kernel_stage,
                   record_stage, summarize)
from .whole_tokens import NOT_MODELED, globaltimer_resolution, overhead_table, time_tokens, token_share
from ..trace.cupti import cupti_available
from ..trace.live import trace_source
from ..timing import gc_paused
from .workbench import ROUTINGS, ZIPF_S, MoeWorkbench, iter_profile, profile

__all__ = ["MOE_STAGES", "STAGES", "MODES", "STAGE_MODES", "ROUTINGS", "REGIMES", "TOKENS_DEFAULT", "ROW_COLUMNS",
           "ZIPF_S", "KERNEL_STAGE", "kernel_stage", "record_stage", "ProfilerCaptureError",
           "capture_status", "is_modeled", "cupti_available", "trace_source", "MoeProfiler", "MoeWorkbench",
           "gc_paused", "iter_profile", "profile", "summarize", "format_ds4_line", "ds4_lines", "profile_rows",
           "time_tokens", "token_share", "overhead_table", "globaltimer_resolution", "NOT_MODELED"]
