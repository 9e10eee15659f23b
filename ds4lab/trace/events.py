"""The trace model's one event table: every event source (Kineto, an Nsight Systems SQLite export, a CUPTI recording,
ds4lab's ``trace.json``) is read into this shape, one row per event in one DataFrame with :data:`COLUMNS`, and
everything the audit decides is decided on it; a record of :mod:`ds4lab.trace.records` becomes a row through its
``cells()``. What each ``kind`` of row is, the clocks, and the sources: docs/trace-readers.md, "The event table"."""

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
    """Events read from one source: ``frame`` (exactly :data:`COLUMNS`, sorted by ``start_ns``: :func:`make_frame`),
    ``source`` (the file or ``"<recording>"``), ``tool`` (what wrote it, with its version where said), ``notes``
    (what was read but not tabled, each a sentence: nothing is dropped silently)."""

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
    """A DataFrame with exactly :data:`COLUMNS` from dicts (missing keys: the column's missing value), typed and
    stably sorted by ``start_ns``. Raises ValueError: a key that is no column, or a ``kind`` not in :data:`KINDS`."""
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
