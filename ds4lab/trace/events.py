"""The trace model's one event table: every event source (a PyTorch profiler / Kineto trace, an Nsight Systems SQLite
export, an in-process CUPTI recording, ds4lab's own ``trace.json``) is read into this shape, and everything the
audit decides is decided on it. A record of :mod:`ds4lab.trace.records` becomes a row through its ``cells()``.

One row per event, in one pandas DataFrame. What a row is depends on ``kind``:

==========  ======================================================================================
``api``     a CUDA runtime or driver API call on a host thread (``name``: ``cudaLaunchKernel``,
            ``cuLaunchKernelEx``, ``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...; ``domain``:
            ``runtime`` or ``driver``); ``correlation`` links it to the device rows it launched
``kernel``  a kernel on a device (``name`` as the source gives it, demangled where it can be;
            ``grid``/``block``; ``graph_id``/``graph_node_id`` when launched from a graph)
``memcpy``  a copy on a device (``copy_kind``, ``host_memory``, ``bytes``)
``memset``  a memset on a device (``bytes``)
``sync``    a synchronization the tool recorded as such (``sync_kind``: stream, event, device,
            context, stream_wait_event)
``nvtx``    an NVTX push/pop or start/end range on a host thread (``name``: the range's message,
            ``domain``: its NVTX domain, ``start_ns``/``end_ns`` its extent)
``graph``   a whole-graph execution record (Nsight Systems without ``--cuda-graph-trace=node``)
==========  ======================================================================================

Clocks: ``start_ns``/``end_ns`` are integers in ns on the source's one clock (host and device rows of one source share
it, as CUPTI's and Nsight Systems' timestamps do). ``-1`` (integers) and ``""`` (strings) mean "the source does not
say": a reader never invents a value.

Sources: CUPTI Activity API (``CUpti_ActivityAPI``, ``CUpti_ActivityKernel*``, ``CUpti_ActivityMemcpy*``,
``CUpti_ActivityMemset*``, ``CUpti_ActivitySynchronization``, ``CUpti_ActivityMarker*``); Nsight Systems SQLite export
schema (``CUPTI_ACTIVITY_KIND_*``, ``NVTX_EVENTS``, ``StringIds``, ``ENUM_*`` tables); PyTorch profiler Chrome-trace
JSON (Kineto: categories ``cuda_runtime``, ``cuda_driver``, ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_sync``,
``python_function``, ``gpu_user_annotation``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .records import COPY_KINDS, HOST_MEMORY, STREAM_TYPES, SYNC_KINDS  # noqa: F401 - the columns' values

#: Row kinds (module docstring).
KINDS = ("api", "kernel", "memcpy", "memset", "sync", "nvtx", "graph")

#: Column → (dtype, missing value). The table always has exactly these columns, in this order.
COLUMNS: dict[str, tuple[str, object]] = {
    "kind": ("str", ""),            # one of KINDS
    "name": ("str", ""),            # API name, kernel name, NVTX message
    "domain": ("str", ""),          # api: "runtime" | "driver"; nvtx: the NVTX domain ("" = default domain)
    "pid": ("int64", -1),           # process
    "tid": ("int64", -1),           # host thread (api, nvtx rows)
    "device": ("int64", -1),        # CUDA device ordinal (device rows; api rows where known)
    "stream": ("int64", -1),        # CUDA stream id as the source numbers it
    "start_ns": ("int64", -1),
    "end_ns": ("int64", -1),
    "correlation": ("int64", -1),   # api row ↔ the device rows it launched
    "grid": ("str", ""),            # "x,y,z"
    "block": ("str", ""),           # "x,y,z"
    "shared_bytes": ("int64", -1),  # dynamic + static shared memory of a kernel
    "graph_id": ("int64", -1),      # > 0: launched from a graph (kernel, memcpy, memset, graph rows)
    "graph_node_id": ("int64", -1),
    "copy_kind": ("str", ""),       # one of COPY_KINDS
    "host_memory": ("str", ""),     # one of HOST_MEMORY
    "bytes": ("int64", -1),
    "sync_kind": ("str", ""),       # one of SYNC_KINDS
    "event": ("int64", -1),         # the CUDA event a sync/record/wait row names, where the source says
    "nvtx_path": ("str", ""),       # the NVTX ranges open on the row's thread at its start, outermost first, "a/b/c"
    "stack": ("str", ""),           # Python stack at the call, outermost first: "file:line function;..."
    "args": ("str", ""),            # a kernel's scalar arguments where the source has them (ds4lab's trace)
    "stream_type": ("str", ""),     # one of STREAM_TYPES where the source says (CUPTI stream records, Nsight's
                                    # TARGET_INFO_CUDA_STREAM / null-stream ids, ds4lab's trace); "" unknown
}


@dataclass
class EventTable:
    """Events read from one source (one file, or one in-process recording).

    Attributes:
        frame: a pandas DataFrame with exactly :data:`COLUMNS` (use :func:`make_frame`), sorted by ``start_ns``.
        source: the file it came from (or ``"<recording>"``).
        tool: what wrote it (``"pytorch-profiler"``, ``"nsys-sqlite"``, ``"cupti"``, ``"ds4lab-trace"``) and its
            version where the file says (``"nsys-sqlite (schema 3.11)"``).
        notes: what was read but not tabled, or left out, each a sentence naming what and why (shown in the report:
            nothing is dropped silently)."""

    frame: object
    source: str
    tool: str
    notes: list[str] = field(default_factory=list)

    def of(self, kind: str):
        """The rows of one ``kind`` (a view in time order). Raises ValueError for an unknown kind."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}; kinds: {', '.join(KINDS)}")
        return self.frame[self.frame.kind == kind]


def make_frame(rows):
    """A DataFrame with exactly :data:`COLUMNS` from an iterable of dicts (missing keys get the column's missing
    value), typed and sorted by ``start_ns`` (stable: equal times keep their order).

    Raises:
        ValueError: a row with a key that is not a column, or a ``kind`` not in :data:`KINDS` (names both)."""
    import pandas as pd

    rows = list(rows)
    for i, r in enumerate(rows):
        extra = set(r) - set(COLUMNS)
        if extra:
            raise ValueError(f"event row {i}: unknown column(s) {', '.join(sorted(extra))}")
        if r.get("kind") not in KINDS:
            raise ValueError(f"event row {i}: kind {r.get('kind')!r} is not one of {', '.join(KINDS)}")
    data = {c: [r.get(c, miss) for r in rows] for c, (_, miss) in COLUMNS.items()}
    df = pd.DataFrame(data, columns=list(COLUMNS))
    for c, (dtype, _) in COLUMNS.items():
        df[c] = df[c].astype("int64" if dtype == "int64" else "object")
    return df.sort_values("start_ns", kind="stable").reset_index(drop=True)


def check_frame(df) -> None:
    """Raise ValueError naming what is wrong if ``df`` is not an event table: missing or extra columns, an unknown
    ``kind``, a row that ends before it starts."""
    cols = list(df.columns)
    if cols != list(COLUMNS):
        missing = [c for c in COLUMNS if c not in cols]
        extra = [c for c in cols if c not in COLUMNS]
        raise ValueError(f"not an event table: missing {missing or 'none'}, extra {extra or 'none'}")
    bad = sorted(set(df.kind) - set(KINDS))
    if bad:
        raise ValueError(f"event table: unknown kind(s) {', '.join(map(str, bad))}")
    back = df[(df.start_ns >= 0) & (df.end_ns >= 0) & (df.end_ns < df.start_ns)]
    if len(back):
        r = back.iloc[0]
        raise ValueError(f"event table: {r.kind} {r['name']!r} ends ({r.end_ns}) before it starts ({r.start_ns})")
