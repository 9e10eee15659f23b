"""ds4's ``DS4_CUDA_MOE_PROFILE`` stderr lines (``shared/context/ds4-decode.md``, "The routed MoE
kernel sequence and its profile") and the ds4-format logs ``ds4lab moe`` writes (a ``# ds4lab ...``
provenance header first). The line's grammar and validity rules are :mod:`ds4lab.moeprof.ds4log`'s
(the one implementation, shared with ``ds4lab moe``, which writes such lines); this module turns a
log into rows, strict or lenient. See :mod:`ds4lab.ingest` for the rules."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..moeprof.ds4log import (DS4_PREFIX, TOTAL_NOT_SUM_MODES, TOTAL_SLACK_MS, ds4_line_problem, ds4lab_header,
                              ds4lab_header_fields, parse_ds4_line)
from .common import Ingested, problem as _problem

from ..moeprof.rows import STAGES as MOE_STAGES  # ds4's six stages and their total, defined once
#: modes whose ``total`` is not the sum of the stages (CUPTI: first kernel start to last kernel end),
#: and ``unknown`` (an older ds4lab header: its lines may be CUPTI's)
_TOTAL_NOT_SUM = (*TOTAL_NOT_SUM_MODES, "unknown")
__all__ = ["DS4_PREFIX", "MOE_STAGES", "TOTAL_SLACK_MS", "read_ds4_log"]


def read_ds4_log(path: Path, lenient: bool) -> Ingested:
    """ds4 ``DS4_CUDA_MOE_PROFILE`` lines → rows (call, tokens, pairs, stage, ms): the same columns as
    ``ds4lab moe``'s table, plus ``provenance`` and ``modeled``: ``ds4`` and false for ds4's own lines
    (mode ``host-timed``, routing ``ds4``), the ``# ds4lab ...`` header's text (``modeled``, ``mode``
    and ``routing`` from it; ``unknown`` mode and routing for a header that does not name them) for
    lines ds4lab wrote; ``backend`` is ``ds4`` or ``ds4lab``; ``file`` is the log, ``source``
    ``<log name>:<line>``. A line with the prefix that does not follow the grammar, or cannot be a
    real call (:func:`ds4lab.moeprof.ds4log.ds4_line_problem`; ``total`` not checked for CUPTI's
    lines or under an older header), is malformed: IngestError naming file and line unless
    ``lenient``."""
    res = Ingested(path, "ds4-log")
    rows = []
    call = 0
    prov, modeled, mode, routing = "ds4", False, "host-timed", "ds4"
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        h = ds4lab_header(line)
        if h is not None:
            text, modeled = h
            f = ds4lab_header_fields(text)
            prov, mode, routing = f["provenance"], f["mode"], f["routing"]
            continue
        if DS4_PREFIX not in line:
            continue
        why = ds4_line_problem(line, total_is_sum=mode not in _TOTAL_NOT_SUM)
        if why:
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({why})", line)
            continue
        vals = parse_ds4_line(line)
        for s in MOE_STAGES:
            rows.append({"token": call, "layer": float("nan"), "tokens": vals["tokens"], "pairs": vals["pairs"],
                         "stage": s, "ms": vals[s], "mode": mode, "backend": "ds4" if prov == "ds4" else "ds4lab",
                         "routing": routing, "modeled": modeled, "provenance": prov, "file": str(path),
                         "source": f"{path.name}:{n}"})
        call += 1
    if not rows and not res.problems:
        _problem(res, lenient, 0, "no ds4 MoE profile line")
    res.tables["ds4_moe"] = pd.DataFrame(rows)
    return res
