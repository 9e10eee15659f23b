"""One event table split into the units the audit reports on: one per (process, device), never a sum
(:func:`split_units`), each unit's rows prepared for the rest of the audit (:func:`prepare`: calls and device work
linked by correlation, what a call's row lacks taken from its device row), and its legacy stream
(:func:`legacy_streams`). Which device a host row belongs to, and the preparation: docs/audit.md, "Units and
their preparation"."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..trace.records import api_base_name
from .calls import is_launch

#: Row kinds that are device work (they run on a stream of a device).
DEVICE_KINDS = ("kernel", "memcpy", "memset", "graph")



def unit_label(pid: int, device: int) -> str:
    """``process P, device D``, each ``not recorded`` where the trace does not say (-1)."""
    return (f"process {pid}" if pid >= 0 else "process not recorded") + ", " + (
        f"device {device}" if device >= 0 else "device not recorded")


def unit_stem(pid: int, device: int) -> str:
    """The file stem of one unit's figure where a trace holds several: ``audit-p<pid>-d<device>``, each part left out
    where the trace does not say it (never ``-d-1``)."""
    return "audit" + (f"-p{pid}" if pid >= 0 else "") + (f"-d{device}" if device >= 0 else "")

@dataclass
class Unit:
    """The rows of one (process, device) of a source, prepared: ``source``, ``tool``, ``pid``, ``device`` (-1: not
    said), ``frame`` (its rows in time order, indexed by their label in the source's frame), ``notes``."""

    source: str
    tool: str
    pid: int
    device: int
    frame: pd.DataFrame
    notes: list = field(default_factory=list)

    @property
    def label(self) -> str:
        """``process P, device D`` as the report names the unit (:func:`unit_label`)."""
        return unit_label(self.pid, self.device)


def split_units(table) -> tuple[list[Unit], list[str]]:
    """The units of an :class:`~ds4lab.trace.events.EventTable` (module docstring), each prepared, in (process, device)
    order, and notes on the rows no unit holds (host rows of an unknown device, units without any kernel)."""
    df, notes = _orphans_to_lone_process(table.frame)
    dev = df["device"].to_numpy().copy()
    kind = df["kind"].to_numpy()
    is_dev = np.isin(kind, DEVICE_KINDS)
    corr = df["correlation"].to_numpy()
    # 2. by correlation
    corr_dev = {}
    for c, d in zip(corr[is_dev], dev[is_dev]):
        if c >= 0 and d >= 0:
            corr_dev.setdefault(int(c), int(d))
    host = ~is_dev
    for i in np.flatnonzero(host & (dev < 0) & (corr >= 0)):
        d = corr_dev.get(int(corr[i]))
        if d is not None:
            dev[i] = d
    # 3. the thread's device; 4. the process's only device
    pid, tid = df["pid"].to_numpy(), df["tid"].to_numpy()
    known = host & (dev >= 0)
    thread_dev = (pd.DataFrame({"pid": pid[known], "tid": tid[known], "dev": dev[known]})
                  .groupby(["pid", "tid"])["dev"].agg(lambda s: s.value_counts().index[0]).to_dict())
    proc_devs = pd.Series(dev[is_dev & (dev >= 0)]).groupby(pid[is_dev & (dev >= 0)]).unique().to_dict()
    for i in np.flatnonzero(host & (dev < 0)):
        d = thread_dev.get((pid[i], tid[i]))
        if d is None:
            devs = proc_devs.get(pid[i], ())
            d = devs[0] if len(devs) == 1 else -1
        dev[i] = d
    frame = df.assign(device=dev)
    units = []
    for (p, d), rows in frame.groupby(["pid", "device"], sort=True):
        n_kernels = int((rows["kind"] == "kernel").sum())
        who = f"process {p if p >= 0 else '?'}, device {d if d >= 0 else '?'}"
        if n_kernels == 0:
            notes.append(f"{who}: {len(rows)} row(s) ({_kinds(rows)}) but no kernel: not audited")
            continue
        if d < 0 and not (rows["kind"] == "kernel").all():
            notes.append(f"{who}: the trace does not say which GPU these rows ran on; audited as one unit")
        u = Unit(table.source, table.tool, int(p), int(d), rows.copy())
        prepare(u)
        units.append(u)
    return units, notes


def _orphans_to_lone_process(df: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """``df`` with its device rows of no process (``pid`` -1: a Kineto trace whose calls carry no correlation id,
    so nothing links them to a process) given the process of the host rows, where exactly one process has host
    rows; and a note saying so. Otherwise ``df`` unchanged and no note."""
    is_dev = df["kind"].isin(DEVICE_KINDS).to_numpy()
    pid = df["pid"].to_numpy()
    orphan = is_dev & (pid < 0)
    hosts = set(pid[~is_dev & (pid >= 0)].tolist())
    if not orphan.any() or len(hosts) != 1:
        return df, []
    p = int(hosts.pop())
    df = df.copy()
    df.loc[orphan, "pid"] = p
    return df, [f"{int(orphan.sum())} device row(s) linked to no process (no correlation id) taken as process "
                f"{p}'s, the only process with host calls"]


def _kinds(rows) -> str:
    c = rows["kind"].value_counts()
    return ", ".join(f"{n} {k}" for k, n in c.items())


def prepare(u: Unit) -> None:
    """Pair uncorrelated launches with device rows in order per stream, then fill API rows' stream and copy fields from
    their device rows (module docstring). Changes ``u.frame`` in place."""
    f = u.frame
    api = f["kind"] == "api"
    launch = api & f["name"].map(lambda n: is_launch(n) and not api_base_name(n).startswith(("cudaGraph", "cuGraph"))
                                 ).astype(bool)
    dev = f["kind"].isin(("kernel", "memcpy", "memset"))
    lonely_dev = f.index[dev & (f["correlation"] < 0)]
    # a call is lonely when its correlation id (if any) names no device row: the trace dropped the link
    lonely_api = f.index[launch & ~f["correlation"].isin(f.loc[dev & (f["correlation"] >= 0), "correlation"])]
    if len(lonely_api) and len(lonely_dev):
        paired = 0
        for what in ("kernel", "memcpy", "memset"):  # a kernel launch pairs with a kernel, a copy with a copy
            a = lonely_api[f.loc[lonely_api, "name"].map(_issues).to_numpy() == what]
            d = lonely_dev[(f.loc[lonely_dev, "kind"] == what).to_numpy()]
            if len(a) and len(d):
                paired += _pair_in_order(u, a, d)
        if paired:
            u.notes.append(f"the trace links no launch call to its device work: {paired} launch call(s) paired with "
                           "device rows in order, per stream and kind (kernel, copy, memset)")
    corr_rows = f[dev & (f["correlation"] >= 0)].drop_duplicates("correlation")
    by_corr = corr_rows.set_index("correlation")
    idx = f.index[api & (f["correlation"] >= 0)]
    c = f.loc[idx, "correlation"]
    hit = c.isin(by_corr.index)
    idx, c = idx[hit.to_numpy()], c[hit]
    if not len(idx):
        return
    src = by_corr.loc[c.to_numpy()]
    for col, missing in (("stream", -1), ("copy_kind", ""), ("host_memory", ""), ("bytes", -1)):
        cur = f.loc[idx, col].to_numpy()
        new = src[col].to_numpy()
        fill = (cur == missing) & (new != missing)
        if fill.any():
            f.loc[idx[fill], col] = new[fill]
    if "stream_type" in f.columns:
        cur = f.loc[idx, "stream_type"].to_numpy()
        new = src["stream_type"].to_numpy()
        fill = (cur == "") & (new != "")
        if fill.any():
            f.loc[idx[fill], "stream_type"] = new[fill]


def _issues(name: str) -> str:
    """The device row kind a launch call issues: ``memcpy``, ``memset`` or ``kernel``."""
    n = api_base_name(name)
    return "memcpy" if "Memcpy" in n else "memset" if "Memset" in n else "kernel"


def _pair_in_order(u: Unit, api_idx, dev_idx) -> int:
    """Give uncorrelated launch calls and device rows matching ids: per stream, in order; a call whose stream is
    unknown pairs with the device rows in the order they start (one stream assumed). Returns how many were paired."""
    f = u.frame
    base = int(max(f["correlation"].max(), 0)) + 1
    a = f.loc[api_idx].sort_values("start_ns", kind="stable")
    d = f.loc[dev_idx].sort_values("start_ns", kind="stable")
    paired = 0
    a_known = a[a["stream"] >= 0]
    streams = set(a_known["stream"]) if len(a_known) else set()
    groups = [(a[a["stream"] == s], d[d["stream"] == s]) for s in sorted(streams)]
    if len(a_known) < len(a):
        groups.append((a[a["stream"] < 0], d[~d["stream"].isin(streams)]))
    for ga, gd in groups:
        n = min(len(ga), len(gd))
        if not n:
            continue
        ids = np.arange(base, base + n)
        f.loc[ga.index[:n], "correlation"] = ids
        f.loc[gd.index[:n], "correlation"] = ids
        base += n
        paired += n
    return paired


def legacy_streams(u: Unit) -> tuple[frozenset, str]:
    """The stream ids that are the legacy stream in this unit, and how that is known (docs/audit.md)."""
    f = u.frame
    if "stream_type" in f.columns:
        ids = set(f.loc[(f["stream_type"] == "legacy") & (f["stream"] >= 0), "stream"])
        if ids:
            return frozenset(int(i) for i in ids), "the trace marks it as the legacy stream"
    api = f[f["kind"] == "api"]
    sync = api.loc[api["name"].map(lambda n: api_base_name(n).startswith(("cudaMemset", "cudaMemcpy", "cuMemset",
                                                                      "cuMemcpy"))
                                   and not api_base_name(n).endswith("Async")).astype(bool)]
    ids = set(sync.loc[sync["stream"] >= 0, "stream"])
    if ids:
        return frozenset(int(i) for i in ids), "the stream of synchronous cudaMemset/cudaMemcpy calls"
    return frozenset({0}), "assumed: stream 0 (the trace does not mark the legacy stream)"
