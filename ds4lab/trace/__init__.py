"""The trace model: what a trace holds, read by field name, and every reader and writer of traces.

==========================  ==========================================================================
:mod:`.records`             the typed records (kernel, copy, memset, graph execution, API call, sync, event
                            record, stream, NVTX marker and range), kernel arguments (:class:`KernelArgs`:
                            scalars, a parameter-bytes digest, each parameter's offset, size and bytes),
                            the labels of copies, memsets and syncs, CUPTI's numbering
:mod:`.events`              the one event table (``EventTable``: one row per event, named columns)
:mod:`.table`               building an event table from rows in bounded memory, and the steps every
                            source shares (NVTX paths, the correlation join, stream kinds, kernel lengths)
:mod:`.cupti`               the one process-wide CUPTI session, which builds the records
:mod:`.live`                live traces of this process (CUPTI, the sim's modeled timeline), the NVTX
                            ranges ds4lab records, the sim's call log
:mod:`.recording`           the in-process recording of any program's CUDA activity (``ds4lab audit run``)
:mod:`.chrome`              ds4lab's own trace as Chrome/Perfetto JSON (``ds4lab trace``)
:mod:`.stacks`              Python stacks as the event table holds them
:mod:`.sources`             one ``detect()`` and one reader per format (Kineto, Nsight Systems SQLite,
                            CSV and raw reports, Nsight Compute, ds4's profile lines, ds4lab's
                            recordings, traces and result folders), each yielding an event table or
                            summary tables
==========================  ==========================================================================

Layer: above the runtime (``backends``, ``sim``) and the token (``token``, ``capture``), below everything that analyses
a trace (``audit``, ``measure``, ``moeprof``, ``report``, ``jobs``): ``tests/test_layout.py`` holds it there."""

from .events import EventTable
from .records import (ApiCall, Copy, DeviceRecord, EventRecord, GraphExec, Kernel, KernelArgs, Marker, Memset,
                      ParamBytes, Range, StreamMade, Sync)

__all__ = ["ApiCall", "Copy", "DeviceRecord", "EventRecord", "EventTable", "GraphExec", "Kernel", "KernelArgs",
           "Marker", "Memset", "ParamBytes", "Range", "StreamMade", "Sync"]
