"""Building an event table from a stream of rows, in bounded memory (:class:`Rows`), and the steps every source
shares (:func:`finish`: NVTX paths, the correlation join, stream types, a process's one device). How:
docs/trace-readers.md, "The event table"."""

from __future__ import annotations

from array import array

import numpy as np

from .events import COLUMNS, check_frame

_INT = [c for c, (t, _) in COLUMNS.items() if t == "int64"]
_STR = [c for c, (t, _) in COLUMNS.items() if t != "int64"]
DEVICE_KINDS = ("kernel", "memcpy", "memset", "sync", "graph")


class Rows:
    """A columnar accumulator of event rows: ``add(kind=..., ...)`` takes cells by column name (missing: ``-1`` /
    ``""``); KeyError names an unknown column."""

    def __init__(self) -> None:
        self.ints = {c: array("q") for c in _INT}
        self.strs: dict[str, list] = {c: [] for c in _STR}
        self._pool: dict[str, str] = {}
        self.n = 0

    def intern(self, s: str) -> str:
        """One shared copy of ``s`` for every row that holds it."""
        return self._pool.setdefault(s, s)

    def add(self, **cells) -> None:
        unknown = set(cells) - set(COLUMNS)
        if unknown:
            raise KeyError(f"unknown event column(s): {', '.join(sorted(unknown))}")
        pool = self._pool
        for c, col in self.ints.items():
            v = cells.get(c)
            col.append(-1 if v is None else int(v))
        for c, col in self.strs.items():
            v = cells.get(c)
            if v is None or v == "":
                col.append("")
            else:
                v = str(v)
                col.append(pool.setdefault(v, v))
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def frame(self):
        """The rows as an event-table DataFrame, stably sorted by ``start_ns``; the columns are moved out."""
        import pandas as pd

        data = {}
        for c in COLUMNS:
            if c in self.ints:
                data[c] = np.frombuffer(self.ints[c], dtype=np.int64).copy() if self.n else np.empty(0, np.int64)
                self.ints[c] = array("q")
            else:
                a = np.empty(self.n, dtype=object)
                a[:] = self.strs[c]
                data[c] = a
                self.strs[c] = []
        self.n = 0
        df = pd.DataFrame(data, columns=list(COLUMNS))
        for c in _STR:  # the event table's strings are plain objects (as make_frame), whatever pandas infers
            if df[c].dtype != object:
                df[c] = df[c].astype(object)
        if not df.start_ns.is_monotonic_increasing:
            df = df.sort_values("start_ns", kind="stable").reset_index(drop=True)
        return df


def nvtx_paths(df) -> None:
    """Fill ``nvtx_path`` of every host row with a thread, in place: the ranges open on its (pid, tid) at its start
    (``[start, end)``, not itself), outermost first, ``/``-joined. ``df`` sorted by ``start_ns``."""
    host = df[(df.kind.isin(("api", "nvtx"))) & (df.tid >= 0)]
    if host.empty or not (host.kind == "nvtx").any():
        return
    out = df["nvtx_path"].to_numpy(dtype=object, copy=True)
    kinds, starts, ends, names = (host.kind.to_numpy(), host.start_ns.to_numpy(), host.end_ns.to_numpy(),
                                  host.name.to_numpy())
    idx = host.index.to_numpy()
    keys = host.pid.to_numpy() * (1 << 32) + host.tid.to_numpy()
    order = np.lexsort((-ends, starts, keys))  # per thread, by start, the longer range first
    cache: dict[tuple, str] = {}
    open_: list = []  # (end, name) of the ranges open now, in start order
    prev = None
    for j in order:
        if keys[j] != prev:
            open_, prev = [], keys[j]
        t = starts[j]
        if open_:
            open_ = [r for r in open_ if r[0] > t]
        if open_:
            k = tuple(r[1] for r in open_)
            p = cache.get(k)
            if p is None:
                p = cache[k] = "/".join(k)
            out[idx[j]] = p
        if kinds[j] == "nvtx":
            open_.append((ends[j] if ends[j] >= 0 else np.iinfo(np.int64).max, names[j]))
    df["nvtx_path"] = out


def correlate(df) -> None:
    """The correlation join of the module docstring (step 2), in place."""
    api = df[(df.kind == "api") & (df.correlation >= 0)]
    dev = df[df.kind.isin(DEVICE_KINDS) & (df.correlation >= 0)]
    if api.empty or dev.empty:
        return
    # 1. device rows without a process: the process of the one API call with that correlation id
    if (dev.pid < 0).any():
        per = api.groupby("correlation").pid.agg(["first", "nunique"])
        one = per[per["nunique"] == 1]["first"]
        miss = dev.index[dev.pid < 0]
        got = df.loc[miss, "correlation"].map(one)
        ok = got.notna()
        df.loc[miss[ok.to_numpy()], "pid"] = got[ok].astype(np.int64).to_numpy()
        dev = df[df.kind.isin(DEVICE_KINDS) & (df.correlation >= 0)]
    key_api = api.pid.astype(np.int64) * (1 << 40) + api.correlation
    key_dev = dev.pid.astype(np.int64) * (1 << 40) + dev.correlation
    # 2. API rows: stream and device from their first device row
    first = dev.assign(_k=key_dev.to_numpy()).drop_duplicates("_k").set_index("_k")
    for col in ("stream", "device", "stream_type"):
        miss_val = COLUMNS[col][1]
        need = api.index[(api[col] == miss_val).to_numpy()]
        if len(need):
            got = key_api.loc[need].map(first[col])
            ok = got.notna() & (got != miss_val)
            if ok.any():
                df.loc[need[ok.to_numpy()], col] = got[ok].to_numpy()
    # 3. device rows: the launching call's NVTX path and Python stack
    calls = api.assign(_k=key_api.to_numpy()).drop_duplicates("_k").set_index("_k")
    for col in ("nvtx_path", "stack"):
        need = dev.index[(dev[col] == "").to_numpy()]
        if len(need):
            got = key_dev.loc[need].map(calls[col])
            ok = got.notna() & (got != "")
            if ok.any():
                df.loc[need[ok.to_numpy()], col] = got[ok].to_numpy()


def stream_types(df, types: dict) -> None:
    """Set an unknown ``stream_type`` from ``{(pid, stream): type}`` (pid -1: any process), in place."""
    if not types or df.empty:
        return
    need = (df.stream_type == "") & (df.stream >= 0)
    if not need.any():
        return
    sub = df.loc[need, ["pid", "stream"]]
    got = [types.get((p, s), types.get((-1, s), "")) for p, s in zip(sub.pid, sub.stream)]
    df.loc[need, "stream_type"] = got


def one_device(df) -> None:
    """Step 4 of the module docstring, in place."""
    dev = df[df.kind.isin(("kernel", "memcpy", "memset")) & (df.device >= 0) & (df.pid >= 0)]
    if dev.empty:
        return
    per = dev.groupby("pid").device.agg(["first", "nunique"])
    one = per[per["nunique"] == 1]["first"]
    need = df.kind.isin(("api", "sync", "graph")) & (df.device < 0) & df.pid.isin(one.index)
    if need.any():
        df.loc[need, "device"] = df.loc[need, "pid"].map(one).astype(np.int64).to_numpy()


def kernel_lengths(df, notes: list) -> None:
    """Kernels of negative or zero length counted in ``notes``, in place; a negative one's end set to its start."""
    k = (df.kind == "kernel") & (df.start_ns >= 0) & (df.end_ns >= 0)
    neg = k & (df.end_ns < df.start_ns)
    zero = k & (df.end_ns == df.start_ns)
    if neg.any():
        first = df[neg].iloc[0]
        notes.append(f"{int(neg.sum()):,} kernels of negative duration (they end before they start, the first "
                     f"{first['name']!r} by {int(first.start_ns - first.end_ns):,} ns): each taken as taking no "
                     "time (end set to start); the trace's clock or these records are wrong")
        df.loc[neg, "end_ns"] = df.loc[neg, "start_ns"]
    if zero.any():
        notes.append(f"{int(zero.sum()):,} kernels of zero length (start = end): kept, taking no time")


#: The latest time a trace's clock can plausibly read, in ns (year 2096 since the epoch; int64 ns end in 2262):
#: a time past it, or a negative one, is no time of any trace.
MAX_NS = 4 * 10**18


def impossible_time(df) -> str:
    """"" where every start of ``df`` is a plausible time (0..:data:`MAX_NS` ns) and every end is one or -1 (never
    closed); else ``row R: field F is V ns (why)`` for the first that is not (R counts the frame's rows from 1)."""
    for col, low in (("start_ns", 0), ("end_ns", -1)):
        v = df[col].to_numpy()
        bad = (v < low) | (v > MAX_NS)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            why = "negative: no clock reads it" if v[i] < low else "past any trace's clock"
            return f"row {i + 1:,} ({df['kind'].iloc[i]} {str(df['name'].iloc[i])[:60]!r}): field {col!r} is {int(v[i]):,} ns ({why})"
    return ""


def time_notes(df, notes: list) -> None:
    """Notes, in place, on times that are possible but implausible: device work that starts more than 1 µs before
    the call that launched it (the host and device clocks disagree), and launch calls whose median takes 1 ms or
    more (ns written where µs are expected: a launch call takes microseconds)."""
    api = df[(df.kind == "api") & (df.correlation >= 0)].drop_duplicates("correlation")
    dev = df[df.kind.isin(("kernel", "memcpy", "memset")) & (df.correlation >= 0)]
    call = dev["correlation"].map(dict(zip(api["correlation"], api["start_ns"])))
    early = dev[(call.notna()) & (dev["start_ns"] < call.fillna(0) - 1000)]
    if len(early):
        by = int((call[early.index] - early["start_ns"]).max())
        notes.append(f"{len(early):,} device row(s) start before the call that launched them (by up to {by:,} ns, "
                     f"the first {str(early['name'].iloc[0])[:60]!r}): the host and device clocks disagree; their "
                     "order in a token follows the calls")
    _overlaps(df, notes)
    from .records import KERNEL_LAUNCH_CALLS, api_base_name

    calls = df[df.kind == "api"]
    launch = calls[calls["name"].map(lambda n: api_base_name(n) in KERNEL_LAUNCH_CALLS).astype(bool)]
    if len(launch) >= 3:
        med = float((launch.end_ns - launch.start_ns).median())
        if med >= 1e6:
            notes.append(f"the launch calls take {med / 1e3:,.0f} µs each (median), where one takes microseconds: "
                         "the trace's times may be in ns where µs are expected (×1000); every time it gives is "
                         "read as written")


def _overlaps(df, notes: list) -> None:
    """A note, in place, on kernels that start more than 1 µs before an earlier kernel of their stream ends (a stream
    runs its kernels one after another: rows written twice with other times, or a duration that is wrong). Kernels
    of a graph (their branches run side by side) are left out; programmatic dependent launch can overlap a kernel's
    start with the one before it, which the note says."""
    k = df[(df.kind == "kernel") & (df.start_ns >= 0) & (df.end_ns >= df.start_ns)]
    if "graph_id" in k:
        k = k[~(k["graph_id"].fillna(-1) > 0)]
    if len(k) < 2:
        return
    k = k.sort_values(["device", "stream", "start_ns"], kind="stable")
    prev_end = k.groupby(["device", "stream"])["end_ns"].transform(lambda e: e.cummax().shift())
    over = k[k["start_ns"] < prev_end - 1000]
    if len(over):
        by = int((prev_end[over.index] - over["start_ns"]).max())
        notes.append(f"{len(over):,} kernel(s) start while an earlier kernel of their stream still runs (by up to "
                     f"{by:,} ns, the first {str(over['name'].iloc[0])[:60]!r}): a stream runs its kernels one after "
                     "another unless they were launched with programmatic dependent launch; rows written twice with "
                     "other times, or a wrong duration, give this")


#: The fields that make two rows the same event: nothing the tracer records twice differs in none of them.
SAME_EVENT = ("kind", "name", "pid", "tid", "device", "stream", "start_ns", "end_ns", "correlation")


def drop_repeats(df, notes: list):
    """``df`` without the rows that repeat an earlier row in every field of :data:`SAME_EVENT` (a trace whose
    events were written twice, or merged with itself), index reset; a note, in place, says how many were dropped
    and of which kinds. Returns ``df`` itself where none repeats."""
    rep = df.duplicated(subset=list(SAME_EVENT), keep="first")
    if not rep.any():
        return df
    kinds = df.loc[rep, "kind"].value_counts()
    notes.append(f"{int(rep.sum()):,} event(s) repeat another exactly (same kind, name, thread, stream, start, end "
                 f"and correlation: {', '.join(f'{n:,} {k}' for k, n in kinds.items())}): the trace holds them twice; "
                 "each kept once")
    return df[~rep].reset_index(drop=True)


def finish(df, types: dict | None = None, *, source=None, notes: list | None = None):
    """Every shared step on a sorted event table, then :func:`ds4lab.trace.events.check_frame`. Returns ``df``.
    Raises SourceError (where ``source`` is given) naming the file, kind, name and both times of a non-kernel row
    ending before it starts; else check_frame's ValueError."""
    df = drop_repeats(df, notes if notes is not None else [])
    kernel_lengths(df, notes if notes is not None else [])
    time_notes(df, notes if notes is not None else [])
    nvtx_paths(df)
    stream_types(df, types or {})
    correlate(df)
    one_device(df)
    for c in _STR:
        if df[c].dtype != object:
            df[c] = df[c].astype(object)
    try:
        check_frame(df)
    except ValueError as e:
        if source is None:
            raise
        from .sources.common import SourceError

        raise SourceError(f"{source}: {e}") from None
    return df
