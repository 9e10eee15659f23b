"""ds4's ``DS4_CUDA_MOE_PROFILE`` stderr lines (``shared/context/ds4-decode.md``, "The routed MoE
kernel sequence and its profile") and the ds4-format logs ``ds4lab moe`` writes (a ``# ds4lab ...``
provenance header first). See :mod:`ds4lab.ingest` for the rules."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from .common import Ingested, ds4lab_header, ds4lab_header_fields, problem as _problem

MOE_STAGES = ("xq", "sort", "gateup", "midq", "down", "sum", "total")
DS4_PREFIX = "ds4: CUDA MoE profile"
_DS4_PREFIX = DS4_PREFIX
_FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"  # a number: never a lone "." or "e"
_DS4_LINE = re.compile(
    r"^ds4: CUDA MoE profile tokens=(?P<tokens>\d+) pairs=(?P<pairs>\d+)"
    + "".join(rf" {s}=(?P<{s}>{_FLOAT})" for s in MOE_STAGES) + r" ms\s*$")
#: the slack allowed between ``total`` and the sum of the six stages: each of the seven fields is
#: printed with 3 decimals
TOTAL_SLACK_MS = 0.001 * (len(MOE_STAGES))
#: modes whose ``total`` is not the sum of the stages (CUPTI: first kernel start to last kernel end),
#: and ``unknown`` (an older ds4lab header: its lines may be CUPTI's)
_TOTAL_NOT_SUM = ("cupti", "unknown")


def read_ds4_log(path: Path, lenient: bool) -> Ingested:
    """ds4 ``DS4_CUDA_MOE_PROFILE`` lines → rows (call, tokens, pairs, stage, ms): the same columns as
    ``ds4lab moe``'s table, plus ``provenance`` and ``modeled``: ``ds4`` and false for ds4's own lines
    (mode ``host-timed``, routing ``ds4``), the ``# ds4lab ...`` header's text (``modeled``, ``mode``
    and ``routing`` from it; ``unknown`` mode and routing for a header that does not name them) for
    lines ds4lab wrote; ``backend`` is ``ds4`` or ``ds4lab``; ``file`` is the log, ``source``
    ``<log name>:<line>``."""
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
        if _DS4_PREFIX not in line:
            continue
        body = line[line.index(_DS4_PREFIX):]
        m = _DS4_LINE.match(body)
        if not m:
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({_ds4_why(body)})", line)
            continue
        try:
            tokens, pairs = int(m["tokens"]), int(m["pairs"])
            vals = {s: float(m[s]) for s in MOE_STAGES}
        except ValueError as e:  # the pattern admits only numbers; kept as a guard
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({e})", line)
            continue
        why = _ds4_impossible(m, tokens, pairs, vals, mode)
        if why:
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({why})", line)
            continue
        for s in MOE_STAGES:
            rows.append({"token": call, "layer": float("nan"), "tokens": tokens, "pairs": pairs, "stage": s,
                         "ms": vals[s], "mode": mode, "backend": "ds4" if prov == "ds4" else "ds4lab",
                         "routing": routing, "modeled": modeled, "provenance": prov, "file": str(path),
                         "source": f"{path.name}:{n}"})
        call += 1
    if not rows and not res.problems:
        _problem(res, lenient, 0, "no ds4 MoE profile line")
    res.tables["ds4_moe"] = pd.DataFrame(rows)
    return res


def _ds4_impossible(m: re.Match, tokens: int, pairs: int, vals: dict, mode: str) -> str | None:
    """Why a well-formed ds4 line cannot be a real call (the field and its value), or None."""
    if tokens < 1:
        return f"tokens={m['tokens']}: a MoE call has at least one token"
    for s in MOE_STAGES:
        if not math.isfinite(vals[s]):
            return f"{s}={m[s]} is not a finite time"
        if vals[s] < 0:
            return f"{s}={m[s]} is a negative time"
    if pairs < tokens or pairs % tokens:
        return f"pairs={pairs} is not a positive multiple of tokens={tokens}"
    if mode not in _TOTAL_NOT_SUM:
        staged = sum(vals[s] for s in MOE_STAGES if s != "total")
        if abs(vals["total"] - staged) > TOTAL_SLACK_MS + 1e-9:
            return (f"total={m['total']} is not the sum of the stages ({staged:.3f} ms): off by "
                    f"{abs(vals['total'] - staged):.3f} ms, more than the rounding ({TOTAL_SLACK_MS:.3f} ms)")
    return None


def _ds4_why(body: str) -> str:
    """What is wrong with a ds4 profile line that does not match: the first bad or missing field."""
    fields = dict(re.findall(r"(\w+)=(\S*)", body))
    for k in ("tokens", "pairs"):
        if k not in fields:
            return f"no {k}="
        if not re.fullmatch(r"\d+", fields[k]):
            return f"{k}={fields[k]!r} is not a whole number"
    for s in MOE_STAGES:
        if s not in fields:
            return f"no {s}="
        if not re.fullmatch(_FLOAT, fields[s]):
            return f"{s}={fields[s]!r} is not a number"
    return "fields out of order, or extra text; expected tokens= pairs= " + " ".join(
        f"{s}=" for s in MOE_STAGES) + " ms"




_ds4_log = read_ds4_log  # the older private name
