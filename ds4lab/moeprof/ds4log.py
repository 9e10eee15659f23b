"""ds4's MoE profile line: its format, its parser, and logs of such lines.

ds4 prints one line per routed-MoE call to stderr when ``DS4_CUDA_MOE_PROFILE`` is set
(``shared/context/ds4-decode.md``, "The routed MoE kernel sequence and its profile")::

    ds4: CUDA MoE profile tokens=<n> pairs=<n*6> xq=<ms> sort=<ms> gateup=<ms> midq=<ms> down=<ms> sum=<ms> total=<ms> ms

``ds4lab moe`` writes it (:func:`format_ds4_line`, :func:`ds4_lines`) and :func:`read_ds4_log` reads
it back.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..model import MOE_STAGES
from .rows import ROW_COLUMNS, STAGES

#: ds4's stderr line (context file, "The routed MoE kernel sequence and its profile").
DS4_LINE = ("ds4: CUDA MoE profile tokens={tokens} pairs={pairs} xq={xq} sort={sort} gateup={gateup} "
            "midq={midq} down={down} sum={sum} total={total} ms")
_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
DS4_LINE_RE = re.compile(r"ds4: CUDA MoE profile tokens=(\d+) pairs=(\d+) "
                         + " ".join(f"{s}={_NUM}" for s in STAGES) + r" ms")


def format_ds4_line(tokens: int, ms: dict, pairs: int | None = None, n_used: int = 6, digits: int = 3) -> str:
    """ds4's stderr line for one call: ``ds4: CUDA MoE profile tokens=<n> pairs=<n*6> xq=<ms> ... total=<ms> ms``.

    ``ms``: stage → milliseconds (missing stages print ``nan``; ``total`` defaults to the sum).
    """
    vals = {s: float(ms.get(s, math.nan)) for s in MOE_STAGES}
    total = ms.get("total")
    vals["total"] = float(sum(vals.values()) if total is None else total)
    return DS4_LINE.format(tokens=int(tokens), pairs=int(tokens * n_used if pairs is None else pairs),
                           **{s: f"{v:.{digits}f}" for s, v in vals.items()})


def parse_ds4_line(line: str) -> dict | None:
    """The fields of one ds4 MoE profile line (``tokens``, ``pairs`` and each stage in ms), or None."""
    m = DS4_LINE_RE.search(line)
    if not m:
        return None
    g = m.groups()
    return {"tokens": int(g[0]), "pairs": int(g[1]), **{s: float(v) for s, v in zip(STAGES, g[2:])}}


def ds4_lines(df, digits: int = 3, n_used: int | None = None, header: str | None = None) -> list[str]:
    """One ds4 line per profiled call in ``df`` (rows with all six stages), in call order.

    ``header``: where the numbers come from (e.g. ``"ds4lab moe · " + provenance.label(meta)``), put
    first as a ``# `` comment line when there is any call. ds4's line parsers (:func:`read_ds4_log`,
    ``ds4lab ingest``) skip it as a profile line but read it as provenance: the lines are ds4lab's,
    modeled when the header says ``MODELED``. It must be one line and start with ``ds4lab``."""
    hdr = None
    if header is not None:
        hdr = str(header).strip().lstrip("#").strip()
        if "\n" in hdr or "\r" in hdr or not hdr.startswith("ds4lab") or "ds4: CUDA MoE profile" in hdr:
            raise ValueError(f"ds4 log header must be one line starting with 'ds4lab' and not a profile "
                             f"line: {header!r}")
    out = []
    d = df[df["stage"].isin(STAGES)]
    for (_mode, _routing, _t, _tok, _layer), g in d.groupby(["mode", "routing", "token", "tokens", "layer"],
                                                         sort=False):
        ms = dict(zip(g["stage"], g["ms"].astype(float)))
        if not all(s in ms and np.isfinite(ms[s]) for s in MOE_STAGES):
            continue
        pairs = int(g["pairs"].iloc[0]) if "pairs" in g else None
        out.append(format_ds4_line(int(_tok), ms, pairs=pairs, n_used=n_used or 6, digits=digits))
    return ([f"# {hdr}"] if hdr and out else []) + out


def read_ds4_log(text: str, n_layers: int | None = None, backend: str = "ds4"):
    """Profile rows (:data:`ROW_COLUMNS`) from a ds4 stderr log: one call per matching line; with
    ``n_layers``, calls are numbered token by token (layer = call index mod ``n_layers``).

    A ``# ds4lab ...`` header line (:func:`ds4_lines`) marks the lines after it as ds4lab's: their
    ``note`` is the header and ``modeled`` is true when it says ``MODELED``."""
    import pandas as pd

    from ..ingest import ds4lab_header

    rows = []
    i = 0
    note, modeled = "ds4 DS4_CUDA_MOE_PROFILE line", False
    for line in text.splitlines():
        h = ds4lab_header(line)
        if h is not None:
            note, modeled = h
            continue
        d = parse_ds4_line(line)
        if d is None:
            continue
        token, layer = (i // n_layers, i % n_layers) if n_layers else (i, -1)
        base = {"token": token, "layer": layer, "tokens": d["tokens"], "pairs": d["pairs"], "mode": "ds4",
                "backend": backend, "routing": "model", "modeled": modeled, "phase": "eager", "note": note}
        rows.extend({**base, "stage": s, "ms": d[s]} for s in STAGES)
        i += 1
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))
