"""Launch-list variation across tokens: what a graph captured from one token replays wrong at another (a kernel
present in some tokens only, a launch count, a grid or block, a by-value scalar argument: :func:`variation`), and
how many token shapes a per-shape graph cache would need (:func:`token_shapes`). The classes: docs/audit.md,
"Calls and variation"."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd

from .verdicts import compact_ranges
from .where import where

FROZEN = "frozen"


def launches(frame: pd.DataFrame, ko: pd.DataFrame, token: pd.Series) -> pd.DataFrame:
    """The tokens' kernels in launch order: ``token``, ``k`` (the kernel's occurrence index in its token), ``name``,
    ``grid``, ``block``, ``args``, ``row``, ``call``, ``where``."""
    k = ko.assign(token=token.loc[ko["row"].to_numpy()].to_numpy())
    k = k[k["token"] >= 0].copy()
    rows = frame.loc[k["row"].to_numpy()]
    k["grid"] = rows["grid"].to_numpy()
    k["block"] = rows["block"].to_numpy()
    k["args"] = rows["args"].to_numpy()
    k["k"] = k.groupby(["token", "name"]).cumcount()
    src = np.where(k["call"].to_numpy() >= 0, k["call"].to_numpy(), k["row"].to_numpy())
    places: dict = {}
    k["where"] = [places.setdefault((a, b), where(a, b)) if (a, b) not in places else places[(a, b)]
                  for a, b in zip(frame.loc[src, "stack"].to_numpy(), frame.loc[src, "nvtx_path"].to_numpy())]
    return k.reset_index(drop=True)


def token_shapes(k: pd.DataFrame, n_tokens: int) -> tuple[list[int], int]:
    """Per token its shape id (launch list with grids and blocks; 0, 1, … by first sight), and the count."""
    ids, seen = [], {}
    by_tok = {int(t): g for t, g in k.groupby("token")}
    for t in range(n_tokens):
        g = by_tok.get(t)
        key = tuple(zip(g["name"], g["grid"], g["block"])) if g is not None else ()
        ids.append(seen.setdefault(key, len(seen)))
    return ids, len(seen)


def _parse_args(a: str) -> list[tuple[str, str]]:
    """``args`` as ``[(key, value), ...]``: a JSON list or object, or ``key=value``/plain values separated by commas or
    semicolons (positions as keys where there are no names)."""
    if not a:
        return []
    a = a.strip()
    if a[:1] in "[{":
        try:
            v = json.loads(a)
        except ValueError:
            v = None
        if isinstance(v, dict):
            return [(str(key), str(val)) for key, val in v.items()]
        if isinstance(v, list):
            return [(f"#{i}", str(val)) for i, val in enumerate(v)]
    out = []
    for i, part in enumerate(p for p in a.replace(";", ",").split(",") if p.strip()):
        key, sep, val = part.partition("=")
        out.append((key.strip(), val.strip()) if sep else (f"#{i}", part.strip()))
    return out


def _position_like(values: list[str]) -> str:
    """``"position-like (+s per token)"`` where ``values`` move by one constant non-zero step, else ""."""
    try:
        x = np.array([float(v) for v in values])
    except ValueError:
        return ""
    if len(x) < 2:
        return ""
    d = np.diff(x)
    if np.all(d == d[0]) and d[0] != 0:
        return f"position-like ({d[0]:+g} per token)"
    return ""


def variation(k: pd.DataFrame, n_tokens: int) -> tuple[pd.DataFrame, set]:
    """The variation findings, one row per (kernel, class, place): ``kind``, ``name``, ``call_class``, ``token_range``
    (tokens off the most common value), ``tokens``, ``count``, ``what``, ``where``, ``fix``; and the launch calls (row
    labels) a single graph would freeze wrongly."""
    rows = []
    flagged: set = set()
    if k.empty or n_tokens < 2:
        return pd.DataFrame(rows), set()
    counts = k.groupby(["name", "token"]).size().unstack(fill_value=0).reindex(columns=range(n_tokens), fill_value=0)
    place = k.groupby("name")["where"].first()
    for name, c in counts.iterrows():
        c = c.to_numpy()
        if c.min() == c.max():
            continue
        modal = Counter(c.tolist()).most_common(1)[0][0]
        odd = [t for t in range(n_tokens) if c[t] != modal]
        if c.min() == 0:
            present = [t for t in range(n_tokens) if c[t] > 0]
            what = (f"launched in {len(present)} of {n_tokens} tokens ({compact_ranges(present)}): a host decision; "
                    "a graph captured from a token without it never runs it, one captured with it always does")
            cls, fix = "present in some tokens only", ("make the decision on the device (launch always, exit early), "
                                                       "or keep one graph per token shape")
        else:
            what = f"launched {', '.join(str(v) for v in sorted(set(c.tolist())))} times per token"
            cls, fix = "launch count", "a fixed launch list (device-side loop bounds), or one graph per token shape"
        rows.append(_row(name, cls, odd, int(c.sum()), what, place.get(name, ""), fix, n_tokens))
        flagged.add((name, None))
    full = k.groupby(["name", "k"])
    for geom in ("grid", "block"):
        for (name, kk), g in full:
            vals = g[geom].tolist()
            if len(set(vals)) < 2 or len(g) < 2:
                continue
            modal = Counter(vals).most_common(1)[0][0]
            odd = sorted(int(t) for t, v in zip(g["token"], vals) if v != modal)
            what = (f"launch {kk + 1} of the token: {len(set(vals))} distinct {geom}s ({', '.join(sorted(set(vals))[:4])}"
                    f"{', …' if len(set(vals)) > 4 else ''})")
            rows.append(_row(name, geom, odd, len(g), what, g["where"].iloc[0],
                             f"a fixed worst-case {geom} decided on the device, or one graph per token shape", n_tokens))
            flagged.add((name, kk))
    for (name, kk), g in full:
        parsed = [_parse_args(a) for a in g["args"]]
        if not any(parsed):
            continue
        width = max(len(p) for p in parsed)
        for i in range(width):
            vals = [p[i][1] if i < len(p) else "" for p in parsed]
            if len(set(vals)) < 2:
                continue
            key = next((p[i][0] for p in parsed if i < len(p)), f"#{i}")
            modal = Counter(vals).most_common(1)[0][0]
            odd = sorted(int(t) for t, v in zip(g["token"], vals) if v != modal)
            pos = _position_like(vals)
            what = (f"launch {kk + 1} of the token: by-value argument {key} takes {len(set(vals))} values"
                    + (f", {pos}" if pos else "") + ": a graph replays the captured value")
            rows.append(_row(name, "scalar argument", odd, len(g), what, g["where"].iloc[0],
                             "read it from a device buffer written before each replay, or update the node's "
                             "parameters (cudaGraphExecUpdate / cudaGraphExecKernelNodeSetParams)", n_tokens))
            flagged.add((name, kk))
    whole = {n for n, kk in flagged if kk is None}
    hit = k["name"].isin(whole) | pd.Series([(n, kk) in flagged for n, kk in zip(k["name"], k["k"])], index=k.index)
    who = np.where(k["call"].to_numpy() >= 0, k["call"].to_numpy(), k["row"].to_numpy())  # the call, or the row itself
    return _merge(pd.DataFrame(rows)), set(int(c) for c in who[hit.to_numpy()])


def _row(name, cls, odd, count, what, place, fix, n_tokens) -> dict:
    return {"kind": "variation", "name": name, "call_class": cls, "token_range": compact_ranges(odd),
            "tokens": len(odd), "count": count, "what": what, "where": place, "fix": fix, "n_tokens": n_tokens}


def _merge(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (kernel, class, where): a kernel whose grid changes at each of its launches in a token reads once,
    with the launches counted together and the sentences of the first."""
    if df.empty:
        return df
    out = []
    for (name, cls, place), g in df.groupby(["name", "call_class", "where"], sort=False):
        r = g.iloc[0].to_dict()
        toks = sorted({t for tr in g["token_range"] for t in _expand(tr)})
        r.update(count=int(g["count"].sum()), token_range=compact_ranges(toks), tokens=len(toks),
                 what=r["what"] + (f" (and {len(g) - 1} more launch(es) of it alike)" if len(g) > 1 else ""))
        out.append(r)
    return pd.DataFrame(out).drop(columns=["n_tokens"])


def _expand(tr: str) -> list[int]:
    out = []
    for part in (tr.split(",") if tr else []):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out
