"""ds4's MoE profile lines as ``ds4lab moe`` writes them (:func:`format_ds4_line`, :func:`ds4_lines`: ``nan`` for a
stage it could not time, so the format round-trips), and a log read back into the profiler's rows
(:func:`profile_rows`). The line's grammar and the one reader of ds4's logs are the trace model's
(:mod:`ds4lab.trace.sources.ds4log`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..token.model import MOE_STAGES
from ..trace.sources.ds4log import DS4_LINE, DS4_PREFIX, read_ds4_log
from .rows import ROW_COLUMNS, STAGES

__all__ = ["ds4_lines", "format_ds4_line", "profile_rows"]


# ----------------------------------------------------------------------------- one line
def format_ds4_line(tokens: int, ms: dict, pairs: int | None = None, n_used: int = 6, digits: int = 3) -> str:
    """ds4's stderr line for one call (``ds4: CUDA MoE profile tokens=<n> pairs=<n*6> xq=<ms> ... total=<ms> ms``):
    ``ms`` stage → milliseconds (missing: ``nan``; ``total`` defaults to the sum), ``pairs`` default ``tokens ×
    n_used``, ``digits`` decimals (ds4 prints 3)."""
    vals = {s: float(ms.get(s, math.nan)) for s in MOE_STAGES}
    total = ms.get("total")
    vals["total"] = float(sum(vals.values()) if total is None else total)
    return DS4_LINE.format(tokens=int(tokens), pairs=int(tokens * n_used if pairs is None else pairs),
                           **{s: f"{v:.{digits}f}" for s, v in vals.items()})


# ----------------------------------------------------------------------------- logs
def ds4_lines(df, digits: int = 3, n_used: int | None = None, header: str | None = None) -> list[str]:
    """One ds4 line per profiled call in ``df`` (rows with all six stages), in call order, after ``header`` (a ``# ``
    comment line naming where the numbers come from, which ds4's line parsers read as provenance). Raises ValueError
    when ``header`` is not one line starting with ``ds4lab``, or holds a profile line."""
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


def profile_rows(path: Path | str, n_layers: int | None = None, backend: str = "ds4"):
    """Profile rows (:data:`ROW_COLUMNS`, mode ``ds4``, routing ``model``) from a ds4 log
    (:func:`ds4lab.trace.sources.ds4log.read_ds4_log`, lenient); with ``n_layers`` layer = call index mod
    ``n_layers``, else -1; after a ``# ds4lab ...`` header the header is the ``note``, and ``modeled`` is true when
    it says ``MODELED``."""
    import pandas as pd

    d = read_ds4_log(Path(path), lenient=True).tables["ds4_moe"]
    call = d["token"].astype(int)
    token, layer = (call // n_layers, call % n_layers) if n_layers else (call, -1)
    own = d["provenance"] == "ds4"
    return pd.DataFrame({"token": token, "layer": layer, "tokens": d["tokens"], "pairs": d["pairs"],
                         "stage": d["stage"], "ms": d["ms"], "mode": "ds4", "backend": backend, "routing": "model",
                         "modeled": d["modeled"].astype(bool), "phase": "eager",
                         "note": d["provenance"].where(~own, "ds4 DS4_CUDA_MOE_PROFILE line")},
                        columns=list(ROW_COLUMNS))
