"""Decode tokens in one unit of a trace (:class:`~ds4lab.audit.units.Unit`): which rows belong to which
token, and what was left outside them.

:func:`find_tokens` finds them by an NVTX range (``--token-range``, or a repeating range found by itself)
or by the period of the kernel sequence; :func:`outside_device` and :func:`untraced_ranges` give the loop's
work between them and a markers pass's untraced times. How: docs/audit.md ("How the tokens are found")."""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import BadInput
from .calls import is_launch
from .units import DEVICE_KINDS, Unit

GAP_TOLERANCE = 0.2
PAUSE_RATIO = 1.5
ALIKE = 0.9
EDGE_ALIKE = 0.8


class NoTokens(BadInput):
    """No decode token in a unit (exit 2): names the file, the unit and what was found instead."""


@dataclass
class Tokens:
    """The tokens of one unit: ``how`` (one sentence), ``n``, ``token`` (per row of the unit's frame, its token,
    -1: none), ``region`` (per row: ``token``, ``before``, ``after``, ``cut``, ``between`` or ""), ``start_ns`` and
    ``end_ns`` (each token's host window), ``main_tid``, ``notes`` (what was left out, what was assumed),
    ``range_name`` (the NVTX range they were found from, else None)."""

    how: str
    n: int
    token: pd.Series
    region: pd.Series
    start_ns: list
    end_ns: list
    main_tid: int
    notes: list = field(default_factory=list)
    #: the NVTX range that marks them, when they were found from one (None: the kernel sequence's period)
    range_name: str | None = None


def launch_order(u: Unit) -> pd.DataFrame:
    """The unit's kernels in launch order: columns ``row`` (label), ``name``, ``t`` (the launch call's
    start, or the kernel's start), ``t_end`` (the call's end, or the kernel's end), ``call`` (the
    call's label or -1), ``tid`` (the call's thread or -1)."""
    f = u.frame
    k = f[f["kind"] == "kernel"]
    api = f[(f["kind"] == "api") & (f["correlation"] >= 0)]
    calls = api.loc[api["name"].map(is_launch).astype(bool)].drop_duplicates("correlation", keep="first")
    by = pd.DataFrame({"correlation": calls["correlation"].to_numpy(), "call": calls.index.to_numpy(),
                       "t_call": calls["start_ns"].to_numpy(), "e_call": calls["end_ns"].to_numpy(),
                       "tid": calls["tid"].to_numpy()})
    out = pd.DataFrame({"row": k.index.to_numpy(), "name": k["name"].to_numpy(),
                        "correlation": k["correlation"].to_numpy(), "start": k["start_ns"].to_numpy(),
                        "end": k["end_ns"].to_numpy()})
    out = out.merge(by, on="correlation", how="left")
    has = out["call"].notna()
    out["t"] = np.where(has, out["t_call"], out["start"]).astype("int64")
    out["t_end"] = np.where(has, out["e_call"], out["end"]).astype("int64")
    out["call"] = out["call"].fillna(-1).astype("int64")
    out["tid"] = out["tid"].fillna(-1).astype("int64")
    return out.sort_values(["t", "start"], kind="stable").reset_index(drop=True)[
        ["row", "name", "t", "t_end", "call", "tid", "start"]]


def find_tokens(u: Unit, token_range: str | None = None) -> Tokens:
    """The tokens of unit ``u``. Raises NoTokens: ``token_range`` names no range of the unit (listing those
    seen), or no repeating unit (saying what the kernel sequence holds)."""
    ko = launch_order(u)
    if token_range is not None:
        return _by_range(u, ko, token_range, given=True)
    auto = _auto_range(u, ko)
    if auto is not None:
        return _by_range(u, ko, auto, given=False)
    return _by_period(u, ko)


# ----------------------------------------------------------------------------- NVTX ranges
def _range_rows(u: Unit, pattern: str) -> pd.DataFrame:
    n = u.frame[u.frame["kind"] == "nvtx"]
    if any(ch in pattern for ch in "*?["):
        return n.loc[n["name"].map(lambda s: fnmatch.fnmatchcase(s, pattern)).astype(bool)]
    return n[n["name"] == pattern]


def _outermost(r: pd.DataFrame) -> pd.DataFrame:
    """Ranges not inside another of the set on the same thread (one still open, ``end_ns`` -1, holds all after it)."""
    keep = []
    big = np.iinfo(np.int64).max
    for _, g in r.sort_values("start_ns", kind="stable").groupby("tid", sort=False):
        outer_end = -1
        for idx, s, e in zip(g.index, g["start_ns"].to_numpy(), g["end_ns"].to_numpy()):
            e = big if e < 0 else e
            if s < outer_end and e <= outer_end:
                continue  # nested in the range kept last
            keep.append(idx)
            outer_end = e
    return r.loc[keep].sort_values("start_ns", kind="stable")


def last_event_ns(f: pd.DataFrame) -> int | None:
    """The latest time (ns) any row of ``f`` other than an NVTX range starts or ends at: where the trace stops
    seeing the program. None for a frame of NVTX ranges alone (a markers pass)."""
    o = f[f["kind"] != "nvtx"]
    if o.empty:
        return None
    return int(max(o["start_ns"].max(), o["end_ns"].max()))


def _open_mask(f: pd.DataFrame, r: pd.DataFrame, ko: pd.DataFrame) -> pd.Series:
    """Per range of ``r`` (one name): whether it does not close inside the trace: no end (``end_ns`` -1); an end
    after the trace's last event while a later range starts (it holds every range after it); or, the last range,
    an end after the trace's last event and its events stopping inside it (:func:`_stops_inside`). A last range
    that ends after its last call with all its work recorded (the step's host tail) is closed."""
    last = last_event_ns(f)
    opened = r["end_ns"] < 0
    if last is None or len(r) == 0:
        return opened
    beyond = r["end_ns"] > last
    latest = r["start_ns"] == r["start_ns"].max()
    opened |= beyond & ~latest
    prev = r[~latest & ~opened].sort_values("start_ns")
    for i in r.index[beyond & latest]:
        opened[i] = _stops_inside(f, ko, r.loc[i], prev.iloc[-1] if len(prev) else None)
    return opened


def _stops_inside(f: pd.DataFrame, ko: pd.DataFrame, rng: pd.Series, prev: pd.Series | None) -> bool:
    """Whether the trace's events stop inside range ``rng``: a launch call in it whose device work is missing
    (no row of its correlation); its API calls (names, in time order) a proper prefix of the range before it,
    ``prev``; or fewer kernel launches than ``prev``."""
    s, e = int(rng["start_ns"]), int(rng["end_ns"])
    api = f[(f["kind"] == "api") & (f["start_ns"] >= s) & (f["start_ns"] < e)].sort_values("start_ns", kind="stable")
    calls = api[api["name"].map(is_launch).astype(bool) & (api["correlation"] >= 0)]
    device = f.loc[f["kind"].isin(DEVICE_KINDS), "correlation"]
    if len(calls) and not calls["correlation"].isin(device).all():
        return True
    if prev is None:
        return False
    ps, pe = int(prev["start_ns"]), int(prev["end_ns"])
    before = f[(f["kind"] == "api") & (f["start_ns"] >= ps) & (f["start_ns"] < pe)].sort_values("start_ns",
                                                                                                 kind="stable")
    ours, theirs = list(api["name"]), list(before["name"])
    if len(ours) < len(theirs) and theirs[:len(ours)] == ours:
        return True
    if ko.empty:
        return False
    t = np.sort(ko["t"].to_numpy())

    def held(a, b):
        return int(np.searchsorted(t, b, "left") - np.searchsorted(t, a, "left"))

    return held(s, e) < held(ps, pe)


def _closed(u: Unit, r: pd.DataFrame, name: str, ko: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """The ranges ``r`` (one name) that can be tokens: closed inside the trace (:func:`_open_mask`), outermost.
    Returns them, the ranges cut by the end of the trace (open, and starting after every closed one: a last token
    cut by the end of the trace), and a note for each kind of range dropped, with its count: cut, never closed
    while later ranges of the name close, nested in another of the name."""
    opened = _open_mask(u.frame, r, ko)
    closed, open_ = r[~opened], r[opened]
    last_closed = int(closed["start_ns"].max()) if len(closed) else -1
    cut, never = open_[open_["start_ns"] > last_closed], open_[open_["start_ns"] <= last_closed]
    notes = []
    if len(never):
        notes.append(f"{len(never)} range(s) {name!r} never closed (no end, or an end after the trace's last "
                     "event while later ranges of the name start inside it): dropped, not tokens")
    if len(cut):
        notes.append(f"{len(cut)} last range(s) {name!r} cut by the end of the trace (never closed, or ending "
                     "past the trace's last event with fewer launches than the range before): left out")
    outer = _outermost(closed)
    if len(outer) < len(closed):
        notes.append(f"{len(closed) - len(outer)} range(s) {name!r} nested inside another of the name: not tokens "
                     "of their own")
    return outer, cut, notes


def _auto_range(u: Unit, ko: pd.DataFrame) -> str | None:
    """A repeating, outermost NVTX range holding at least half the launches between its first start and last end
    (ranges that never close inside the trace not counted)."""
    n = u.frame[u.frame["kind"] == "nvtx"]
    n = pd.concat([g[~_open_mask(u.frame, g, ko)] for _, g in n.groupby("name", sort=False)]) if len(n) else n
    if n.empty or ko.empty:
        return None
    t = np.sort(ko["t"].to_numpy())
    good = []
    for name, g in n.groupby("name", sort=False):
        if len(g) < 2 or len(_outermost(g)) != len(g):
            continue
        held = sum(int(np.searchsorted(t, e, "left") - np.searchsorted(t, s, "left"))  # launches in [start, end)
                   for s, e in zip(g["start_ns"], g["end_ns"]))
        span = int(np.searchsorted(t, g["end_ns"].max(), "left") - np.searchsorted(t, g["start_ns"].min(), "left"))
        if held and held >= 0.5 * span:
            good.append((name, held, len(g), int((g["end_ns"] - g["start_ns"]).sum())))
    if not good:
        return None
    # the outermost of them: it holds the most launches; of those, it repeats the fewest times and lasts longest
    good.sort(key=lambda x: (-x[1], x[2], -x[3]))
    return str(good[0][0])


def _by_range(u: Unit, ko: pd.DataFrame, name: str, given: bool) -> Tokens:
    r = _range_rows(u, name)
    if r.empty:
        seen = u.frame.loc[u.frame["kind"] == "nvtx", "name"].value_counts()
        listing = ", ".join(f"{k} ({v})" for k, v in seen.head(12).items()) or "none"
        raise NoTokens(f"{u.source} ({u.label}): no NVTX range named {name!r}; ranges seen: {listing}")
    r, cut, notes = _closed(u, r, name, ko)
    if r.empty:
        raise NoTokens(f"{u.source} ({u.label}): every NVTX range {name!r} is cut by the end of the trace or never "
                       "closes" + (f" ({'; '.join(notes)})" if notes else ""))
    starts, ends = r["start_ns"].to_numpy(), r["end_ns"].to_numpy()
    tids = r["tid"].to_numpy()
    f = u.frame
    token = pd.Series(-1, index=f.index, dtype="int64")
    api = f[f["kind"].isin(("api", "nvtx", "sync"))]
    a_t = api["start_ns"].to_numpy()
    for i, (s, e) in enumerate(zip(starts, ends)):
        inside = (a_t >= s) & (a_t < e)  # a call that starts as the range ends is after it
        token.loc[api.index[inside]] = i
    _device_rows(f, token, starts, np.append(starts[1:], ends[-1] + max(int(np.median(ends - starts)), 1)))
    main_tid = int(pd.Series(tids).mode().iloc[0])
    how = (f"NVTX range {name!r}" + (" (--token-range)" if given else
                                    " (found: it repeats and holds most launches made while it repeats; "
                                    "--token-range overrides)"))
    region = _regions(f, token, starts[0], cut_after=int(cut["start_ns"].min()) if len(cut) else None)
    t = host_time(f)
    # the loop's own work between two ranges (the next step's inputs, sampling): calls and device work alike
    between = (token < 0) & (f["kind"] != "nvtx") & (t >= starts[0]) & (t <= ends[-1])
    region[between & (region != "cut")] = "between"
    toks = Tokens(how, len(r), token, region, list(map(int, starts)), list(map(int, ends)), main_tid, notes,
                  range_name=str(r["name"].iloc[0]))
    _left_out_notes(u, toks)
    return toks


def _device_rows(f: pd.DataFrame, token: pd.Series, d_start, d_end, kinds=DEVICE_KINDS) -> None:
    """Device rows of ``kinds``: by correlation to an assigned API row, else by start in ``[d_start, d_end)``."""
    api = f[(f["kind"] == "api") & (f["correlation"] >= 0)]
    corr_tok = pd.Series(token.loc[api.index].to_numpy(), index=api["correlation"].to_numpy())
    corr_tok = corr_tok[corr_tok >= 0]
    corr_tok = corr_tok[~corr_tok.index.duplicated()]
    dev = f[f["kind"].isin(kinds)]
    c = dev["correlation"]
    via = c.map(corr_tok).fillna(-1).astype("int64")
    linked = c.isin(api["correlation"])
    token.loc[dev.index[linked.to_numpy()]] = via[linked].to_numpy()
    rest = dev[~linked.to_numpy()]
    if len(rest):
        t = rest["start_ns"].to_numpy()
        k = np.searchsorted(np.asarray(d_start), t, "right") - 1
        ok = (k >= 0) & (t < np.asarray(d_end)[np.clip(k, 0, None)])
        token.loc[rest.index[ok]] = k[ok]


def host_time(f: pd.DataFrame) -> pd.Series:
    """Each row's host time: a device row's launch call's start where linked, else the row's own start."""
    api = f[(f["kind"] == "api") & (f["correlation"] >= 0)].drop_duplicates("correlation")
    by = pd.Series(api["start_ns"].to_numpy(), index=api["correlation"].to_numpy())
    t = f["start_ns"].copy()
    dev = f["kind"].isin(DEVICE_KINDS) & f["correlation"].isin(by.index)
    t[dev] = f.loc[dev, "correlation"].map(by).to_numpy()
    return t


def _regions(f: pd.DataFrame, token: pd.Series, first_start: int, cut_after: int | None) -> pd.Series:
    """``token`` for rows in a token; else ``before``/``after``/``cut`` by their host time."""
    region = pd.Series("", index=f.index, dtype=object)
    region[token >= 0] = "token"
    out = (token < 0) & (f["kind"] != "nvtx")
    t = host_time(f)
    region[out & (t < first_start)] = "before"
    region[out & (t >= first_start)] = "after"
    if cut_after is not None:
        region[out & (t >= cut_after)] = "cut"
    return region


def _left_out_notes(u: Unit, t: Tokens) -> None:
    f = u.frame
    for reg, what in (("before", "before the first token (prefill, warm-up, set-up)"),
                      ("after", "after the last token (sampling, teardown)"),
                      ("between", "between tokens, outside every token range"),
                      ("cut", "in a last token cut by the end of the trace")):
        rows = f[t.region == reg]
        if rows.empty:
            continue
        k = int((rows["kind"] == "kernel").sum())
        a = int((rows["kind"] == "api").sum())
        t.notes.append(f"left out {what}: {k} kernel(s), {a} API call(s)")


# ----------------------------------------------------------------------------- the period
@dataclass
class _Cand:
    code: int
    pos: np.ndarray       # the anchor's occurrences in the run (launch indices)
    period: float
    cover: int
    score: float = 0.0
    purity: float = 0.0


def _alike(a: np.ndarray, b: np.ndarray) -> float:
    """Name-count similarity of two launch lists: shared names (with counts) over the longer list."""
    if not len(a) or not len(b):
        return 0.0
    ca, cb = Counter(a.tolist()), Counter(b.tolist())
    return sum((ca & cb).values()) / max(len(a), len(b))


def _candidates(codes: np.ndarray) -> list[_Cand]:
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    bounds = np.flatnonzero(np.diff(sc)) + 1
    out = []
    for grp in np.split(order, bounds):
        pos = np.sort(grp)
        if len(pos) < 2:
            continue
        gaps = np.diff(pos)
        m = float(np.median(gaps))
        ok = np.abs(gaps - m) <= GAP_TOLERANCE * m  # the longest run of gaps within ±20 % of their median
        if not ok.any():
            continue
        edges = np.diff(np.concatenate(([0], ok.astype(np.int8), [0])))
        run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        r = int(np.argmax(run_ends - run_starts))
        a, b = int(run_starts[r]), int(run_ends[r])
        period = float(np.median(gaps[a:b]))
        if period < 2:
            continue
        run = pos[a:b + 1]
        if len(run) == 2:  # one gap: the launches after it must repeat the first token
            first, nxt = codes[run[0]:run[1]], codes[run[1]:run[1] + len(codes[run[0]:run[1]])]
            if len(nxt) < len(first) or _alike(first, nxt) < ALIKE:
                continue
        out.append(_Cand(int(codes[pos[0]]), run, period, int(min(n, run[-1] + period) - run[0])))
    return out


def _score(c: _Cand, codes: np.ndarray, pause: np.ndarray) -> None:
    lo, hi = c.pos[0], int(min(len(codes), c.pos[-1] + c.period))
    typical = float(np.median(pause[lo + 1:hi])) if hi - lo > 1 else 0.0
    c.score = float(np.median(pause[c.pos])) / max(typical, 1.0)
    shapes = Counter(codes[a:b].tobytes() for a, b in zip(c.pos[:-1], c.pos[1:]))
    c.purity = shapes.most_common(1)[0][1] / max(1, len(c.pos) - 1)


def _by_period(u: Unit, ko: pd.DataFrame) -> Tokens:
    names = ko["name"].to_numpy()
    codes, uniq = pd.factorize(pd.Series(names))
    codes = np.asarray(codes, dtype=np.int64)
    n = len(codes)
    t, t_end = ko["t"].to_numpy(), ko["t_end"].to_numpy()
    pause = np.zeros(n)
    if n > 1:
        pause[1:] = np.maximum(t[1:] - t_end[:-1], 0)
    cands = _candidates(codes) if n >= 4 else []
    if cands:
        best_cover = max(c.cover for c in cands)
        cands = [c for c in cands if c.cover >= 0.5 * best_cover]
        for c in cands:
            _score(c, codes, pause)
    if not cands:
        kinds = len(uniq)
        raise NoTokens(f"{u.source} ({u.label}): no repeating unit: {n} kernel launch(es) of {kinds} distinct "
                       "name(s), and no kernel sequence repeats at an even period at least twice; give the token's "
                       "NVTX range with --token-range, or trace more decode steps")
    top = max(c.score for c in cands)
    if top >= PAUSE_RATIO:
        pick = min((c for c in cands if c.score >= 0.8 * top), key=lambda c: (c.period, -c.score))
        why = f"the host pauses {top:.1f}× the median launch gap before it"
    else:
        pick = min(cands, key=lambda c: (-round(c.purity, 2), c.period, -c.score))
        why = f"no host pause marks a step; {pick.purity:.0%} of its repeats are identical"
    bounds = [int(p) for p in pick.pos]
    notes = []
    end_last, cut = _last_end(codes, bounds, pause, pick.score >= PAUSE_RATIO)
    ends = bounds[1:] + ([end_last] if end_last is not None else [])
    starts = bounds[:len(ends)]
    segs = [codes[a:b] for a, b in zip(starts, ends)]
    modal = Counter(s.tobytes() for s in segs).most_common(1)[0][0]
    ref = np.frombuffer(modal, dtype=np.int64)
    while len(segs) > 2 and _foreign(segs, 0, ref):
        segs.pop(0), starts.pop(0), ends.pop(0)
    while len(segs) > 2 and _foreign(segs, len(segs) - 1, ref):
        segs.pop(), starts.pop(), ends.pop()
        cut = False
    if len(starts) < 2:
        raise NoTokens(f"{u.source} ({u.label}): no repeating unit: only {len(starts)} token(s) of {int(pick.period)} "
                       f"launches anchored at {uniq[pick.code]!r}; trace more decode steps")
    cut_t = int(t[bounds[-1]]) if cut else None
    return _assign_period(u, ko, starts, ends, cut_t, uniq[codes[starts[0]]], pick, why, notes)


def _foreign(segs: list, i: int, ref: np.ndarray) -> bool:
    """An edge token that is no decode token: it launches a kernel no other does and is < 80 % alike the most common."""
    others = set(np.concatenate([s for j, s in enumerate(segs) if j != i]).tolist())
    return bool(set(segs[i].tolist()) - others) and _alike(segs[i], ref) < EDGE_ALIKE


def _last_end(codes: np.ndarray, bounds: list, pause: np.ndarray, paused: bool) -> tuple[int | None, bool]:
    """Where the token at the last anchor ends, and whether the trace cuts it (None, False: no token follows)."""
    last = bounds[-1]
    rest = codes[last:]
    shapes = {codes[a:b].tobytes(): b - a for a, b in zip(bounds[:-1], bounds[1:])}
    fits = [n for key, n in shapes.items() if n <= len(rest) and rest[:n].tobytes() == key]
    if fits:
        return last + max(fits), False
    prev = codes[bounds[-2]:last]
    if paused:
        marks = pause[bounds[1:]]
        big = np.flatnonzero(pause[last + 1:] >= 0.5 * float(np.median(marks)))
        end = last + 1 + int(big[0]) if len(big) else len(codes)
        if _alike(prev, codes[last:end]) >= EDGE_ALIKE:  # the pause marks the end: alike enough
            return end, False
    if len(rest) >= len(prev) and _alike(prev, rest[:len(prev)]) >= ALIKE:
        return last + len(prev), False
    if len(rest) < len(prev) and _alike(prev[:len(rest)], rest) >= ALIKE:
        return None, True
    return None, False


def _assign_period(u, ko, starts, ends, cut_t, anchor, pick, why, notes) -> Tokens:
    f = u.frame
    token = pd.Series(-1, index=f.index, dtype="int64")
    kt = np.full(len(ko), -1)
    for i, (a, b) in enumerate(zip(starts, ends)):
        kt[a:b] = i
    token.loc[ko["row"].to_numpy()[kt >= 0]] = kt[kt >= 0]
    t = ko["t"].to_numpy()
    h_start = [int(t[a]) for a in starts]
    after_t = int(t[ends[-1]]) if ends[-1] < len(ko) else np.iinfo(np.int64).max
    h_end = h_start[1:] + [after_t]
    host = f[f["kind"].isin(("api", "sync"))]
    ht = host["start_ns"].to_numpy()
    k = np.searchsorted(np.asarray(h_start), ht, "right") - 1
    ok = (k >= 0) & (ht < np.asarray(h_end)[np.clip(k, 0, None)])
    # the launch calls of the tokens' kernels belong to them whatever the time says
    token.loc[host.index[ok]] = k[ok]
    calls = ko["call"].to_numpy()
    sel = (kt >= 0) & (calls >= 0)
    token.loc[calls[sel]] = kt[sel]
    d_start = [int(ko["start"].iloc[a]) for a in starts]
    d_end = d_start[1:] + [int(ko["start"].iloc[ends[-1]]) if ends[-1] < len(ko) else np.iinfo(np.int64).max]
    _device_rows(f, token, d_start, d_end, kinds=("memcpy", "memset", "graph"))  # kernels: by the period
    tids = ko["tid"].to_numpy()[kt >= 0]
    tids = tids[tids >= 0]
    main_tid = int(pd.Series(tids).mode().iloc[0]) if len(tids) else -1
    region = _regions(f, token, h_start[0], cut_after=cut_t)
    if cut_t is not None:
        notes.append("the trace ends inside a last token: it is left out (cut mid-token)")
    ends_ns = []
    for i in range(len(starts)):
        rows = f[token == i]
        ends_ns.append(int(max(rows["end_ns"].max(), rows["start_ns"].max())))
    how = (f"the period of the kernel sequence: {int(round(pick.period))} launches, each token starting at "
           f"{anchor!r} ({why})")
    toks = Tokens(how, len(starts), token, region, h_start, ends_ns, main_tid, notes)
    _left_out_notes(u, toks)
    return toks


# ----------------------------------------------------------------------------- work outside the tokens
def outside_device(f: pd.DataFrame, tk: Tokens) -> dict:
    """Per NVTX-range token, the durations (µs, in order) of the device rows launched between its range's end and
    the next range's start (the last token gets the one before it's); {} for tokens found by the kernel period."""
    if tk.range_name is None or tk.n < 2:
        return {}
    dev = f[f["kind"].isin(DEVICE_KINDS) & (tk.token < 0)]
    if dev.empty:
        return {}
    t = host_time(f).loc[dev.index].to_numpy()
    dur = ((dev["end_ns"] - dev["start_ns"]).clip(lower=0) / 1e3).to_numpy()
    order = np.argsort(dev["start_ns"].to_numpy(), kind="stable")
    out = {}
    for i in range(tk.n - 1):
        inside = (t[order] >= tk.end_ns[i]) & (t[order] < tk.start_ns[i + 1])
        out[i] = [float(x) for x in dur[order][inside]]
    out[tk.n - 1] = list(out[tk.n - 2])
    return out


def untraced_ranges(table, tk: Tokens) -> tuple[list, list]:
    """Per token of ``tk``, the µs inside its range and outside it (to the next range; the last: the others'
    median) in the markers pass ``table``, paired by position. Raises ValueError: ``tk`` not found from an NVTX
    range, or the pass's closed outermost ranges of that name not as many as the tokens (naming both counts)."""
    if tk.range_name is None:
        raise ValueError(f"{table.source}: the recording's tokens are found by {tk.how}, and a markers pass holds "
                         "NVTX ranges only: their positions would not pair")
    f = table.frame
    r = f[(f["kind"] == "nvtx") & (f["name"] == tk.range_name)]
    r = _outermost(r) if len(r) else r
    r = r[r["end_ns"] >= 0]
    if len(r) != tk.n:
        raise ValueError(f"{table.source}: {len(r)} closed NVTX range(s) {tk.range_name!r}, the recording's tokens "
                         f"{tk.n}: not the same loop")
    s, e = r["start_ns"].to_numpy(), r["end_ns"].to_numpy()
    inside = [float(x) / 1e3 for x in e - s]
    outside = [float(x) / 1e3 for x in np.clip(s[1:] - e[:-1], 0, None)]
    if tk.n > 1:
        outside.append(float(np.median(outside)))
    else:
        outside.append(0.0)
    return inside, outside
