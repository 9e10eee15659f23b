"""The trace model: what a trace holds, read by field name (:mod:`.records`, the one event table :mod:`.events` and its
builder :mod:`.table`), the one CUPTI session (:mod:`.cupti`), live traces of this process (:mod:`.live`), the
in-process recording (:mod:`.recording`), ds4lab's own Chrome trace (:mod:`.chrome`), Python stacks (:mod:`.stacks`)
and every reader (:mod:`.sources`). The map: ``docs/architecture.md``, "The trace model"; its layer is held by
``tests/test_layout.py``."""

from .events import EventTable
from .records import (ApiCall, Copy, DeviceRecord, EventRecord, GraphExec, Kernel, KernelArgs, Marker, Memset,
                      ParamBytes, Range, StreamMade, Sync)

__all__ = ["ApiCall", "Copy", "DeviceRecord", "EventRecord", "EventTable", "GraphExec", "Kernel", "KernelArgs",
           "Marker", "Memset", "ParamBytes", "Range", "StreamMade", "Sync"]
