"""Routed-MoE timing profiler with capture-compatible modes, and its workloads (a package).

ds4 times its routed MoE (``DS4_CUDA_MOE_PROFILE``) with seven CUDA events around six stages,
waits on the last one with ``cudaEventSynchronize`` and reads the elapsed times on the host, every
call (``shared/context/ds4-decode.md``, "The routed MoE kernel sequence and its profile"). That is
legal eagerly and fatal inside a stream capture: on the H200, the synchronize fails with
``cudaErrorCapturedEvent`` and invalidates the capture (``docs/measurements/h200-2026-11-29/
conformance-cupy.json``, scenarios ``event_sync_captured`` and ``event_elapsed_captured``). This
module times the same stages (``xq``, ``sort``, ``gateup``, ``midq``, ``down``, ``sum``, ``total``)
in six modes:

==================  ===========================================================================
``host-timed``      ds4's way (``TokenOptions(moe_profile=True, moe_host_timed=True)``): events,
                    synchronize, elapsed times read on the host, per call. Guarded: while the
                    stream captures (``capture_status != "none"``, an invalidated capture included)
                    it refuses with :class:`ProfilerCaptureError` before any synchronize, or, with
                    ``fallback=True``, switches that call to ``in-graph`` (or ``deferred``) and says
                    so (a warning and the row's ``note``).
``deferred``        the same seven events per call, each call its own events from a pool, read after
                    the token (or every ``read_every`` calls): no synchronization mid-token. Eager
                    only: events recorded in a capture make no graph node, and on the H200 reading
                    them afterwards fails (``cudaErrorInvalidValue``) until they are re-recorded.
``graph-boundary``  the MoE cluster captured and replayed through a :class:`~ds4lab.capture.cache.GraphCache`;
                    two events between graph launches bracket each replay: ``total`` only.
``in-graph``        a one-thread kernel (``kernels/timestamp.cu:stamp_time``) writes ``%globaltimer``
                    (ns) into a device slot at each stage boundary. Captured, the stamps are kernel
                    nodes, so every replay writes fresh times; the slots are read after the replay.
                    (An event record inside a capture makes no graph node and its elapsed time is
                    refused, as measured on the H200; a kernel is what CUDA allows.) Clock caveat:
                    ``%globaltimer`` counts ns but advances in implementation-defined steps (PTX ISA;
                    often about 1 µs, finer while a profiler is attached): stages of a few µs can be
                    quantized. :func:`globaltimer_resolution` measures the step (32 ns on the H200,
                    2026-11-29). Every stage includes one stamp kernel (about 1 µs on the H200: the
                    ``sort`` stage at 1 token, which is empty, shows its cost).
``cupti``           per-kernel activity records (``cupti-python``, imported lazily; "unavailable:
                    <reason>" when it is missing), attributed to stages by kernel name and to layers
                    by order. On ``sim`` the modeled timeline plays the part of the records.
``nvtx``            NVTX ranges per stage (domain ``ds4lab``) and no timing: rows with ``ms`` NaN.
==================  ===========================================================================

Results are tidy rows (:data:`ROW_COLUMNS`), summarized by :func:`summarize` (median and IQR per
mode, routing, token count and stage), and printable as ds4's stderr line (:func:`format_ds4_line`)
for a side-by-side comparison with a real ds4 run (:func:`read_ds4_log`).

Workloads (:class:`MoeWorkbench`): 1 token (decode), 2 and 3 (multi-token-prediction verification)
and batches (16..512); routing ``uniform`` (distinct random experts per token), ``zipf`` (skewed
expert popularity), ``hash`` (the model's hash-routed layers, through ``model.router``) and
``worst`` (every token to the same ``n_used`` experts). Except for ``hash``, the chosen expert ids
and weights are written into the router's output buffers (``model.moe_buf.ids``/``wts``) on the
device, on the current stream, after the router ran and before the routed-MoE launches, so the
sort, the tiles and the expert load really change; the router stays outside the timed stages.

How the profiler attaches: it becomes the model's ``moe_observer`` for as long as it is attached
(:meth:`MoeProfiler.attached`; :class:`ds4lab.token.model.MoeObserver`). The model calls it around
every ``moe`` cluster run (brackets, eager/capture/replay bookkeeping) and every routed-MoE call
(the capture guard and the per-call instrumentation), and the seven profiling points call a
:class:`ds4lab.token.model.ProfileMarker`'s ``fire`` where the mode puts stamps or NVTX marks instead
of CUDA events. With no profiler attached the model runs exactly as before; detached, the model's
options are what they were, except for changes made meanwhile (:meth:`MoeProfiler.detach`).

The package, module by module:

==================  ===========================================================================
``profiler``        :class:`MoeProfiler`: picks the mode class, attaches, classifies each call
                    (eager, capture, replay), keeps the calls until a read, records errors
``modes``           one class per mode behind one interface (:class:`~.modes.base.ProfilingMode`:
                    instrument a call, read back rows); ``host-timed`` hands a refused call to an
                    in-graph or deferred instance (its fallback)
``rows``            stages, row columns, the record of a call and its rows, :func:`summarize`
``traces``          trace sources: the sim's modeled timeline, the CUPTI session
``ds4log``          ds4's profile line: format, the one parser, validity rules, logs
``workbench``       :class:`MoeWorkbench` (model, inputs, routing patterns), :func:`iter_profile`
``tokens``          whole tokens: :func:`time_tokens`, :func:`token_share`, :func:`overhead_table`,
                    :func:`globaltimer_resolution`
==================  ===========================================================================
"""

from __future__ import annotations

from ..token.model import MOE_STAGES
from .ds4log import (DS4_LINE, DS4_LINE_RE, DS4_PREFIX, ds4_line_problem, ds4_lines, ds4lab_header, format_ds4_line,
                     parse_ds4_line, read_ds4_log)
from .modes import MODES, STAGE_MODES, ProfilerCaptureError
from .profiler import MoeProfiler
from .rows import (KERNEL_STAGE, REGIMES, ROW_COLUMNS, STAGES, TOKENS_DEFAULT, capture_status, is_modeled, kernel_stage,
                   record_stage, summarize)
from .tokens import NOT_MODELED, globaltimer_resolution, overhead_table, time_tokens, token_share
from ..trace.cupti import cupti_available
from ..trace.live import trace_source
from ..timing import gc_paused
from .workbench import ROUTINGS, ZIPF_S, MoeWorkbench, iter_profile, profile

__all__ = ["MOE_STAGES", "STAGES", "MODES", "STAGE_MODES", "ROUTINGS", "REGIMES", "TOKENS_DEFAULT", "ROW_COLUMNS",
           "ZIPF_S", "KERNEL_STAGE", "DS4_LINE", "DS4_LINE_RE", "kernel_stage", "record_stage", "ProfilerCaptureError",
           "capture_status", "is_modeled", "cupti_available", "trace_source", "MoeProfiler", "MoeWorkbench",
           "gc_paused", "iter_profile", "profile", "summarize", "format_ds4_line", "parse_ds4_line", "ds4_lines",
           "ds4_line_problem", "ds4lab_header", "DS4_PREFIX",
           "read_ds4_log", "time_tokens", "token_share", "overhead_table", "globaltimer_resolution", "NOT_MODELED"]
