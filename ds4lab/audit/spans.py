"""Capturable spans: the runs of a token's calls between hazards (ds4's decode "islands", found from the trace).

:func:`token_items` gives a token's main-thread calls in order (:class:`Item`: the gap before, the duration, the
device work issued, whether it blocks the host: CUDA Runtime API, "API synchronization behavior", the verdict per
mode). In one mode a span is a maximal run of calls each *allowed* and not a launch a graph would freeze wrongly
(:mod:`ds4lab.audit.variation`), holding at least ``min_launches`` launches (:func:`spans_of`); :func:`span_table`
lists them largest first for a representative token (the first of the most common shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .probes import ALLOWED

#: Call classes whose call blocks the host until device work is done (see module docstring).
BLOCKING_PREFIXES = ("stream_sync", "device_sync", "event_sync", "memcpy_sync", "memcpy_async.d2h.pageable")
#: Call classes that issue device work (a graph node when captured).
WORK_PREFIXES = ("kernel", "memset", "memcpy", "graph_launch")
MIN_LAUNCHES = 2


@dataclass
class Item:
    """One call of a token's main thread (module docstring); times in µs."""

    row: int
    api: str
    klass: str | None
    where: str
    gap_us: float
    dur_us: float
    dev_us: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    blocking: bool = False
    work: bool = False
    frozen: bool = False
    verdict: dict = field(default_factory=dict)


def token_items(frame: pd.DataFrame, calls: pd.DataFrame, main_tid: int, frozen_calls: set, modes) -> dict:
    """``{token: [Item, ...]}`` for every token (main-thread calls in order; module docstring)."""
    dev = frame[frame["kind"].isin(("kernel", "memcpy", "memset")) & (frame["correlation"] >= 0)]
    by_corr: dict = {}
    for c, s, e, k, name in zip(dev["correlation"], dev["start_ns"], dev["end_ns"], dev["kind"], dev["name"]):
        by_corr.setdefault(int(c), []).append((s, max(e - s, 0) / 1e3, name if k == "kernel" else ""))
    out: dict = {}
    if calls.empty:
        return out
    main = calls[(calls["tid"] == main_tid) | calls["pseudo"]] if main_tid >= 0 else calls
    rows = frame.loc[main["row"].to_numpy()]
    main = main.assign(corr=rows["correlation"].to_numpy(), dkind=rows["kind"].to_numpy(),
                       dname=rows["name"].to_numpy(), d0=rows["start_ns"].to_numpy(),
                       d1=rows["end_ns"].to_numpy()).sort_values(["token", "start_ns"], kind="stable")
    cols = ["token", "row", "api", "klass", "where", "start_ns", "end_ns", "pseudo", "corr", "dkind", "dname", "d0",
            "d1", *[f"verdict_{m}" for m in modes]]
    data = {c: main[c].tolist() for c in cols}
    prev_tok, prev_end, items = None, None, None
    for i in range(len(main)):
        tok = int(data["token"][i])
        if tok != prev_tok:
            items = out.setdefault(tok, [])
            prev_tok, prev_end = tok, None
        row, klass = int(data["row"][i]), data["klass"][i]
        klass = klass if isinstance(klass, str) else None
        if data["pseudo"][i]:  # the call stands for this device row itself
            d0, d1 = data["d0"][i], data["d1"][i]
            work = [(d0, max(d1 - d0, 0) / 1e3, data["dname"][i] if data["dkind"][i] == "kernel" else "")]
        else:
            c = int(data["corr"][i])
            work = sorted(by_corr.get(c, [])) if c >= 0 else []
        k = klass or ""
        s0, s1 = data["start_ns"][i], data["end_ns"][i]
        items.append(Item(row, data["api"][i], klass, data["where"][i],
                          0.0 if prev_end is None else max(s0 - prev_end, 0) / 1e3, max(s1 - s0, 0) / 1e3,
                          [w[1] for w in work], [w[2] for w in work if w[2]], k.startswith(BLOCKING_PREFIXES),
                          k.startswith(WORK_PREFIXES) or bool(work), row in frozen_calls,
                          {m: data[f"verdict_{m}"][i] for m in modes}))
        prev_end = s1
    return out


def spans_of(items: list, mode: str, min_launches: int = MIN_LAUNCHES) -> list[tuple[int, int]]:
    """The spans of one token in ``mode``: ``[(first, last), ...]`` item indices, inclusive, in order."""
    out, start = [], None
    for i, it in enumerate(items + [None]):
        ok = it is not None and it.verdict.get(mode) == ALLOWED and not it.frozen
        if ok and start is None:
            start = i
        if not ok and start is not None:
            if sum(1 for x in items[start:i] if x.work) >= min_launches:
                out.append((start, i - 1))
            start = None
    return out


def representative(shapes: list, items_by_token: dict) -> int:
    """The token shown: the first of the most common shape with calls (else the first with calls)."""
    for shape in pd.Series(shapes).value_counts().index:
        for t, s in enumerate(shapes):
            if s == shape and t in items_by_token:
                return t
    return min(items_by_token)


def span_table(items_by_token: dict, shapes: list[int], modes, replay_us) -> pd.DataFrame:
    """``spans.csv``: per mode, the representative token's spans, largest first: ``launches``, ``first_kernel``,
    ``last_kernel``, ``from_where``/``to_where``, ``broken_before``/``broken_after``, ``gpu_us``, ``eager_host_us``,
    ``replay_us`` (MODELED), ``tokens_with_it``."""
    if not items_by_token:
        return pd.DataFrame()
    rep = representative(shapes, items_by_token)
    rows = []
    for m in modes:
        sigs = {}
        for t, items in items_by_token.items():
            for a, b in spans_of(items, m):
                sigs.setdefault(_sig(items[a:b + 1]), set()).add(t)
        items = items_by_token[rep]
        for a, b in spans_of(items, m):
            sp = items[a:b + 1]
            dev = [d for it in sp for d in it.dev_us]
            kern = [k for it in sp for k in it.kernels]
            rows.append({"mode": m, "token": rep, "launches": sum(1 for it in sp if it.work),
                         "first_kernel": kern[0] if kern else "", "last_kernel": kern[-1] if kern else "",
                         "from_where": sp[0].where, "to_where": sp[-1].where,
                         "broken_before": _breaker(items, a - 1, m), "broken_after": _breaker(items, b + 1, m),
                         "gpu_us": float(np.sum(dev)),
                         "eager_host_us": float(sum(it.gap_us + it.dur_us for it in sp[1:]) + sp[0].dur_us),
                         "replay_us": replay_us(dev), "tokens_with_it": len(sigs.get(_sig(sp), ()))})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df = df.sort_values(["mode", "launches"], ascending=[True, False], kind="stable")
    df.insert(1, "rank", df.groupby("mode").cumcount() + 1)
    return df.reset_index(drop=True)


def _sig(sp: list) -> tuple:
    kern = [k for it in sp for k in it.kernels]
    return (sum(1 for it in sp if it.work), kern[0] if kern else "", kern[-1] if kern else "")


def _breaker(items: list, i: int, mode: str) -> str:
    if i < 0 or i >= len(items):
        return "token boundary"
    it = items[i]
    why = "frozen launch" if it.frozen and it.verdict.get(mode) == ALLOWED else it.verdict.get(mode, "")
    name = it.kernels[0] if it.kernels and it.frozen else it.api
    return f"{name} ({why})" + (f" at {it.where}" if it.where else "")
