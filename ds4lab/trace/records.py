"""The trace model's records: one frozen, typed record per thing a trace holds (:class:`Kernel`, :class:`Copy`,
:class:`Memset`, :class:`GraphExec`, :class:`ApiCall`, :class:`Sync`, :class:`EventRecord`, :class:`StreamMade`,
:class:`Marker`, :class:`Range`, :class:`MemoryOp`); ``-1`` and ``""`` mean "the source does not say". Also the
labels of copies, memsets and synchronizations, CUPTI's kind numbering (``cupti_activity.h``, CUDA 13) and CUDA
API names (:func:`api_base_name`). The map: docs/architecture.md, "The trace model"."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import ClassVar

# ----------------------------------------------------------------------------- ds4lab's names
#: Copy kinds, as CUPTI names them without the prefix (``CUPTI_ACTIVITY_MEMCPY_KIND_HTOD`` → ``HtoD``).
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "HtoA", "AtoH", "AtoA", "DtoA", "AtoD")
#: Host memory of a copy's host side (``CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE`` / ``PINNED`` / ``MANAGED``).
HOST_MEMORY = ("pageable", "pinned", "managed")
#: What a synchronization synchronized (``CUpti_ActivitySynchronizationType``, and ``device``).
SYNC_KINDS = ("stream", "event", "device", "context", "stream_wait_event")
#: What kind of stream a stream id is (CUPTI ``CUpti_ActivityStreamFlag``: ``NULL`` is the legacy
#: default stream, ``DEFAULT`` a blocking stream, ``NON_BLOCKING`` one created with
#: ``cudaStreamNonBlocking``; ``per_thread`` is ``cudaStreamPerThread``).
STREAM_TYPES = ("legacy", "per_thread", "blocking", "non_blocking")

# ----------------------------------------------------------------------------- CUPTI's numbers
#: ``CUpti_ActivityMemcpyKind`` → ds4lab's copy kind.
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
                10: "PtoP"}
#: ``CUpti_ActivityMemoryKind`` → its label as CUPTI's samples and Kineto print it.
MEMORY_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}
#: ``CUpti_ActivitySynchronizationType`` → ds4lab's sync kind.
SYNC_TYPES = {1: "event", 2: "stream_wait_event", 3: "stream", 4: "context"}
#: ``CUpti_ActivityStreamFlag`` → ds4lab's stream type.
STREAM_FLAGS = {1: "blocking", 2: "non_blocking", 3: "legacy"}
#: ``CUPTI_ACTIVITY_FLAG_MARKER_START`` / ``_END`` / ``_INSTANTANEOUS`` (``cupti_activity.h``; the
#: binding's ``ActivityFlag`` enum lacks ``MARKER_END``).
MARKER_START, MARKER_END, MARKER_INSTANT = 1 << 1, 1 << 2, 1 << 0
#: ``CUPTI_SYNCHRONIZATION_INVALID_VALUE``: no stream or event applies.
INVALID_ID = 0xFFFFFFFF

# ----------------------------------------------------------------------------- labels
SYNC_LABELS = {"event": "Event Sync", "stream_wait_event": "Stream Wait Event", "stream": "Stream Sync",
               "context": "Context Sync", "device": "Device Sync"}
_SYNC_OF_LABEL = {v.lower(): k for k, v in SYNC_LABELS.items()}
_COPY_LABEL = re.compile(r"^Memcpy (\w+) \(([^)]*?) -> ([^)]*)\)")
_COPY_OF_LOWER = {v.lower(): v for v in COPY_KINDS}
#: A memory-kind label (lower case) → ds4lab's host memory (:data:`HOST_MEMORY`).
HOST_MEMORY_OF = {"pageable": "pageable", "pinned": "pinned", "managed": "managed", "managed static": "managed"}


def copy_label(copy_kind: str, src: str, dst: str) -> str:
    """A copy's name as CUPTI's samples and Kineto print it: ``Memcpy HtoD (Pageable -> Device)``."""
    return f"Memcpy {copy_kind or '?'} ({src or 'Unknown'} -> {dst or 'Unknown'})"


def parse_copy_label(name: str) -> tuple[str, str, str] | None:
    """``(copy kind, source memory, destination memory)`` of a :func:`copy_label` name (the copy kind as
    :data:`COPY_KINDS` spells it, ``""`` for one it does not know); None for another name."""
    m = _COPY_LABEL.match(name)
    if m is None:
        return None
    return _COPY_OF_LOWER.get(m.group(1).lower(), ""), m.group(2), m.group(3)


def memset_label(memory: str) -> str:
    """A memset's name: ``Memset (Device)``."""
    return f"Memset ({memory or 'Unknown'})"


def sync_label(sync_kind: str) -> str:
    """A synchronization's name: ``Stream Sync``, ``Event Sync``, ... (``Unknown Sync`` for none)."""
    return SYNC_LABELS.get(sync_kind, "Unknown Sync")


def sync_kind_of_label(label: str) -> str:
    """The sync kind a :func:`sync_label` (any case) names; ``""`` for another label."""
    return _SYNC_OF_LABEL.get(label.strip().lower(), "")


def host_memory(copy_kind: str, src: str, dst: str) -> str:
    """The host side's memory kind of a copy (``pageable``, ``pinned``, ``managed`` or ``""``): the source of a copy
    from the host, the destination of a copy to the host."""
    src, dst = src.strip().lower(), dst.strip().lower()
    if copy_kind in ("HtoD", "HtoA"):
        side = src
    elif copy_kind in ("DtoH", "AtoH"):
        side = dst
    elif copy_kind == "HtoH":
        side = "pageable" if "pageable" in (src, dst) else src
    else:
        return ""
    return HOST_MEMORY_OF.get(side, "")


_API_SUFFIX = re.compile(r"(_v\d+|_pt(sz|ds))$")


@functools.lru_cache(maxsize=4096)
def api_base_name(name: str) -> str:
    """A CUDA API name without CUPTI's and Nsight's version and per-thread suffixes
    (``cudaMemcpyAsync_ptsz_v7000`` → ``cudaMemcpyAsync``): the one normalizer of API names in ds4lab."""
    prev = None
    while prev != name:
        prev, name = name, _API_SUFFIX.sub("", name)
    return name


#: Kernel launch calls, base names (CUDA Runtime and Driver API, "Execution Control"): the one list.
KERNEL_LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice",
    "cuLaunchGrid", "cuLaunchGridAsync"})
#: Graph launch calls, base names.
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})


def dims(v) -> str:
    """A grid or block as the event table writes it: ``"x,y,z"`` (``""`` for none)."""
    return ",".join(str(int(x)) for x in v) if v else ""


# ----------------------------------------------------------------------------- kernel arguments
@dataclass(frozen=True, slots=True)
class ParamBytes:
    """One kernel parameter as stored: its byte offset in the packed parameter buffer, its size and its bytes."""

    offset: int
    size: int
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class KernelArgs:
    """A kernel launch's arguments as far as recorded: ``scalars`` (``index=value`` joined by ``,``; ``""``: none),
    ``digest`` (of the packed parameter bytes; ``""``: not captured), ``params`` (:class:`ParamBytes`, where stored)."""

    scalars: str = ""
    digest: str = ""
    params: tuple[ParamBytes, ...] = ()


# ----------------------------------------------------------------------------- device records
@dataclass(frozen=True, slots=True, kw_only=True)
class Timed:
    """What every record with an extent has: start and end in ns on the source's clock, and the correlation id that
    links a call to the device work it launched (-1: the source does not say)."""

    kind: ClassVar[str] = ""
    start_ns: float
    end_ns: float
    correlation: int = -1

    @property
    def dur_ns(self) -> float:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRecord(Timed):
    """What every piece of device work has; ``stream``: the source's stream id (CUPTI's, or the sim's name)."""

    device: int = -1
    stream: int | str = -1
    graph_id: int = 0
    graph_node_id: int = 0

    def cells(self) -> dict:
        """The record as event-table cells (:data:`ds4lab.trace.events.COLUMNS`)."""
        return {"kind": self.kind, "name": self.name, "start_ns": self.start_ns, "end_ns": self.end_ns,
                "device": self.device, "stream": self.stream, "correlation": self.correlation,
                "graph_id": self.graph_id, "graph_node_id": self.graph_node_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel(DeviceRecord):
    """A kernel (CUPTI ``CONCURRENT_KERNEL``; the sim's modeled kernel)."""

    kind: ClassVar[str] = "kernel"
    name: str
    grid: tuple = ()
    block: tuple = ()
    shared_bytes: int = -1
    args: KernelArgs | None = None

    def cells(self) -> dict:
        return {**DeviceRecord.cells(self), "grid": dims(self.grid), "block": dims(self.block),
                "shared_bytes": self.shared_bytes, "args": self.args.scalars if self.args is not None else ""}


@dataclass(frozen=True, slots=True, kw_only=True)
class Copy(DeviceRecord):
    """A copy (CUPTI ``MEMCPY``); ``src_memory``/``dst_memory`` as :data:`MEMORY_KINDS` labels them."""

    kind: ClassVar[str] = "memcpy"
    copy_kind: str = ""
    src_memory: str = "Unknown"
    dst_memory: str = "Unknown"
    bytes: int = -1
    label: str = ""

    @property
    def name(self) -> str:
        """``label`` where the source named the copy itself (the sim), else :func:`copy_label`."""
        return self.label or copy_label(self.copy_kind, self.src_memory, self.dst_memory)

    @property
    def host_memory(self) -> str:
        return host_memory(self.copy_kind, self.src_memory, self.dst_memory)

    def cells(self) -> dict:
        return {**DeviceRecord.cells(self), "copy_kind": self.copy_kind, "host_memory": self.host_memory,
                "bytes": self.bytes}


@dataclass(frozen=True, slots=True, kw_only=True)
class Memset(DeviceRecord):
    """A memset (CUPTI ``MEMSET``; the sim's modeled memset); ``memory`` as :data:`MEMORY_KINDS` labels it."""

    kind: ClassVar[str] = "memset"
    memory: str = "Unknown"
    bytes: int = -1
    label: str = ""

    @property
    def name(self) -> str:
        """``label`` where the source named the memset itself (the sim), else :func:`memset_label`."""
        return self.label or memset_label(self.memory)

    def cells(self) -> dict:
        return {**DeviceRecord.cells(self), "bytes": self.bytes}


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphExec(DeviceRecord):
    """A whole-graph execution (CUPTI ``GRAPH_TRACE``)."""

    kind: ClassVar[str] = "graph"

    @property
    def name(self) -> str:
        return f"graph {self.graph_id}"


# ----------------------------------------------------------------------------- host records
@dataclass(frozen=True, slots=True, kw_only=True)
class ApiCall(Timed):
    """A CUDA runtime or driver call: ``name`` without the version suffix, ``domain``, process and thread, ``cbid``,
    the return value, and ``stream`` where the source says (-1: not)."""

    kind: ClassVar[str] = "api"
    name: str
    domain: str
    pid: int = -1
    tid: int = -1
    cbid: int = -1
    return_value: int = 0
    stream: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Sync(Timed):
    """A synchronization (CUPTI ``SYNCHRONIZATION``): ``sync_kind`` of :data:`SYNC_KINDS`; the context, and the
    ``stream`` and ``event`` it waited on (-1 where none applies)."""

    kind: ClassVar[str] = "sync"
    sync_kind: str
    context: int = -1
    stream: int = -1
    event: int = -1

    @property
    def name(self) -> str:
        return sync_label(self.sync_kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    """A CUDA event record (CUPTI ``CUDA_EVENT``): stream and event of the ``cudaEventRecord``."""

    kind: ClassVar[str] = "cuda_event"
    event: int
    device: int = -1
    stream: int = -1
    correlation: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamMade:
    """A stream created while recording (CUPTI ``STREAM``): ``stream_type`` of :data:`STREAM_TYPES` or ``""``."""

    kind: ClassVar[str] = "stream"
    stream: int
    stream_type: str = ""
    context: int = -1
    correlation: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    """One NVTX marker record: ``phase`` ``start``, ``end`` or ``instant``; a range's two share ``id``."""

    kind: ClassVar[str] = "marker"
    phase: str
    timestamp_ns: int
    id: int = -1
    name: str = ""
    domain: str = ""
    pid: int = -1
    tid: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOp:
    """One device memory allocation (``operation`` 1) or release (2), CUPTI ``MEMORY2``."""

    kind: ClassVar[str] = "memory"
    operation: int
    address: int
    bytes: int
    timestamp_ns: int
    device: int = -1
    stream: int = -1
    correlation: int = -1
    memory_kind: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Range(Timed):
    """An NVTX range as ds4lab's launch layer pushed and popped it: message, cluster, payload, times (ns), depth."""

    kind: ClassVar[str] = "nvtx"
    name: str
    cluster: str
    payload: int | None
    depth: int


DEVICE_TYPES = (Kernel, Copy, Memset, GraphExec)
__all__ = ["ApiCall", "Copy", "DeviceRecord", "EventRecord", "GraphExec", "Kernel", "KernelArgs", "Marker", "MemoryOp", "Memset",
           "ParamBytes", "Range", "StreamMade", "Sync", "Timed"]


def marker_phase(flags: int) -> str:
    """A CUPTI marker record's ``flags`` as its :attr:`Marker.phase`."""
    if flags & MARKER_START:
        return "start"
    if flags & MARKER_END:
        return "end"
    return "instant"


def api_context(records) -> tuple[dict, dict]:
    """What the API level's side records say about the calls: ``({correlation: (stream, event)}`` of every
    :class:`EventRecord`, ``{stream: type}`` of every :class:`StreamMade` with a known type)."""
    events, types = {}, {}
    for r in records:
        if isinstance(r, EventRecord):
            events[r.correlation] = (r.stream, r.event)
        elif isinstance(r, StreamMade) and r.stream_type:
            types.setdefault(r.stream, r.stream_type)
    return events, types
