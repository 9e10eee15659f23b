"""ds4's MoE profile lines as ``ds4lab moe`` writes them, and a log of such lines read back into the
profiler's rows.

ds4 prints one line per routed-MoE call to stderr when ``DS4_CUDA_MOE_PROFILE`` is set; the line's
grammar, its one parser and its validity rules are the trace model's
(:mod:`ds4lab.trace.sources.ds4log`, the reader ``ds4lab ingest`` uses). This module writes the lines
(:func:`format_ds4_line`, :func:`ds4_lines`: ``nan`` for a stage it could not time, so the format
round-trips) and reads a log's text back into :data:`ds4lab.moeprof.rows.ROW_COLUMNS` rows
(:func:`read_ds4_log`, no validity checks). The ``# ds4lab ...`` comment line that :func:`ds4_lines`
puts first says the lines after it are ds4lab's, with their provenance, mode and routing.
"""

from __future__ import annotations

import math

import numpy as np

from ..token.model import MOE_STAGES
from ..trace.sources.ds4log import (DS4_LINE, DS4_LINE_RE, DS4_PREFIX, TOTAL_NOT_SUM_MODES, TOTAL_SLACK_MS,
                                    ds4_line_problem, ds4lab_header, ds4lab_header_fields, parse_ds4_line)
from .rows import ROW_COLUMNS, STAGES

__all__ = ["DS4_LINE", "DS4_LINE_RE", "DS4_PREFIX", "TOTAL_NOT_SUM_MODES", "TOTAL_SLACK_MS", "ds4_line_problem",
           "ds4_lines", "ds4lab_header", "ds4lab_header_fields", "format_ds4_line", "parse_ds4_line",
           "read_ds4_log"]


# ----------------------------------------------------------------------------- one line
def format_ds4_line(tokens: int, ms: dict, pairs: int | None = None, n_used: int = 6, digits: int = 3) -> str:
    """ds4's stderr line for one call: ``ds4: CUDA MoE profile tokens=<n> pairs=<n*6> xq=<ms> ... total=<ms> ms``.

    ``ms``: stage → milliseconds (missing stages print ``nan``; ``total`` defaults to the sum).
    ``pairs`` defaults to ``tokens × n_used``; ``digits`` decimals per time (ds4 prints 3).
    """
    vals = {s: float(ms.get(s, math.nan)) for s in MOE_STAGES}
    total = ms.get("total")
    vals["total"] = float(sum(vals.values()) if total is None else total)
    return DS4_LINE.format(tokens=int(tokens), pairs=int(tokens * n_used if pairs is None else pairs),
                           **{s: f"{v:.{digits}f}" for s, v in vals.items()})


# ----------------------------------------------------------------------------- logs
def ds4_lines(df, digits: int = 3, n_used: int | None = None, header: str | None = None) -> list[str]:
    """One ds4 line per profiled call in ``df`` (rows with all six stages), in call order.

    ``header``: where the numbers come from (e.g. ``"ds4lab moe · " + provenance.label(meta)``), put
    first as a ``# `` comment line when there is any call. ds4's line parsers (:func:`read_ds4_log`,
    ``ds4lab ingest``) skip it as a profile line but read it as provenance: the lines are ds4lab's,
    modeled when the header says ``MODELED``. Raises ValueError when it is not one line starting
    with ``ds4lab``, or holds a profile line."""
    hdr = None
    if header is not None:
        hdr = str(header).strip().lstrip("#").strip()
        if "\n" in hdr or "\r" in hdr or not hdr.startswith("ds4lab") or DS4_PREFIX in hdr:
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
    """Profile rows (:data:`ROW_COLUMNS`) from a ds4 stderr log: one call per line that
    :func:`parse_ds4_line` reads (other lines skipped, no validity checks); with ``n_layers``, calls
    are numbered token by token (layer = call index mod ``n_layers``).

    A ``# ds4lab ...`` header line (:func:`ds4_lines`) marks the lines after it as ds4lab's: their
    ``note`` is the header and ``modeled`` is true when it says ``MODELED``."""
    import pandas as pd

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
