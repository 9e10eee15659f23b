"""A multi-GPU trace read as one job across devices: its collectives paired by rank (:func:`pair_collectives`: the
k-th collective of a rank meets the k-th of every other: ``paired``, ``differ``, ``mixed capture`` or ``missing``,
rules ``nccl_pair``, ``nccl_mismatch``, ``nccl_nonuniform``, ``nccl_timeout``), and what a whole-token capture on
every rank would do (:func:`per_rank_plan`: a rank that falls back to eager beside the others' graphs is a
deadlock risk). NCCL's collectives are kernels on every rank. docs/tensor-parallel.md."""

from __future__ import annotations

import re

import pandas as pd

from .probes import INVALIDATES, REFUSED

#: NCCL's collective kernels: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (NCCL >= 2.19),
#: ``ncclKernel_AllReduce_RING_LL_Sum_float`` (older): the operation is the first word after the prefix.
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")

VERDICT_RULES = {"paired": "nccl_pair", "differ": "nccl_mismatch", "mixed capture": "nccl_nonuniform",
                 "missing": "nccl_timeout"}


def collective_op(name: str) -> str | None:
    """The collective of a kernel name (``AllReduce``, ``SendRecv``, ...), or None for a kernel not NCCL's."""
    m = NCCL_KERNEL.match(str(name))
    return m.group(1) if m else None


def _unit_label(pid: int, device: int) -> str:
    return f"p{pid}d{device}" if pid >= 0 else f"d{device}"


def pair_collectives(frame: pd.DataFrame) -> pd.DataFrame:
    """The collectives of a multi-device event table paired by position: per ``k``, ``verdict``, ``rule``, ``op``,
    and per unit (``d<device>`` or ``p<pid>d<device>``) its kernel, ``launch`` (``graph``/``eager``) and
    ``start_ns``. Empty (``k``, ``verdict``, ``rule``, ``op``) without collectives."""
    k = frame[frame.kind == "kernel"]
    ops = k["name"].map(collective_op)
    k = k[ops.notna()].assign(op=ops[ops.notna()])
    units = {}
    for (pid, dev), g in k.groupby(["pid", "device"], sort=True):
        units[_unit_label(int(pid), int(dev))] = g.sort_values("start_ns", kind="stable").reset_index(drop=True)
    rows = []
    n = max((len(g) for g in units.values()), default=0)
    for i in range(n):
        row = {"k": i}
        present = {u: g.iloc[i] for u, g in units.items() if i < len(g)}
        for u in units:
            r = present.get(u)
            row[f"{u}.name"] = "" if r is None else r["name"]
            row[f"{u}.launch"] = "" if r is None else ("graph" if int(r["graph_id"]) > 0 else "eager")
            row[f"{u}.start_ns"] = -1 if r is None else int(r["start_ns"])
        first = next(iter(present.values()))
        row["op"] = first["op"]
        if len(present) < len(units):
            v = "missing"
        elif len({r["name"] for r in present.values()}) > 1:
            v = "differ"
        elif len({row[f"{u}.launch"] for u in units}) > 1:
            v = "mixed capture"
        else:
            v = "paired"
        row["verdict"], row["rule"] = v, VERDICT_RULES[v]
        rows.append(row)
    lead = ["k", "verdict", "rule", "op"]
    if not rows:
        return pd.DataFrame(columns=lead)
    df = pd.DataFrame(rows)
    return df[lead + [c for c in df.columns if c not in lead]]


def per_rank_plan(reports, mode: str = "thread_local") -> pd.DataFrame:
    """Per unit of ``reports`` (one per device), what a whole-token capture in ``mode`` does to its collectives:
    ``unit``, ``captures``, ``falls_back_at`` (the first invalidating or refused call and where), ``collectives``,
    ``launch``, ``risk`` (``deadlock risk (rule nccl_nonuniform)`` where ranks differ, ``none``, ``no collective``;
    in global mode, ranks that are threads of one process are refused: rule nccl_global_multithread)."""
    rows = []
    for r in reports:
        calls = r.calls
        col = f"verdict_{mode}"
        bad = calls[calls[col].isin([INVALIDATES, REFUSED])] if col in calls else calls.iloc[0:0]
        where = ""
        if len(bad):
            b = bad.iloc[0]
            where = f"{b['name']}" + (f" at {b.get('where')}" if b.get("where") else "")
        f = r.unit.frame if r.unit is not None else None
        n_coll = int(f[(f.kind == "kernel")]["name"].map(collective_op).notna().sum()) if f is not None else 0
        rows.append({"unit": _unit_label(int(r.pid), int(r.device)), "captures": not len(bad), "falls_back_at": where,
                     "collectives": n_coll, "launch": "graph" if not len(bad) else "eager"})
    df = pd.DataFrame(rows, columns=["unit", "captures", "falls_back_at", "collectives", "launch"])
    pids = [int(r.pid) for r in reports]
    threads_per_gpu = any(pids.count(p) > 1 for p in set(pids))
    with_coll = df[df.collectives > 0]
    if mode == "global" and threads_per_gpu and len(with_coll) > 1:
        # one process, a thread per GPU: an NCCL call beside another thread's global capture is refused
        why = ("an NCCL call beside another thread's global-mode capture (rule nccl_global_multithread, GUESS: "
               "NCCL's 'Capture modes' asks thread-local capture of a process with a thread per GPU)")
        df.loc[df.collectives > 0, ["captures", "falls_back_at", "launch"]] = [False, why, "eager"]
        df["risk"] = f"refused: {why}; which rank's capture is invalidated first depends on timing"
        return df
    if with_coll.empty:
        risk = "no collective"
    elif with_coll.launch.nunique() > 1:
        eager = ", ".join(with_coll[with_coll.launch == "eager"].unit)
        graph = ", ".join(with_coll[with_coll.launch == "graph"].unit)
        risk = (f"deadlock risk (rule nccl_nonuniform): {eager} would run its collectives eagerly (its capture falls "
                f"back) while {graph} launch theirs from graphs: they never complete")
    else:
        risk = "none"
    df["risk"] = risk
    return df


__all__ = ["NCCL_KERNEL", "VERDICT_RULES", "collective_op", "pair_collectives", "per_rank_plan"]
