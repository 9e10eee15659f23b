"""ds4's MoE profile line: its format, its one parser, its validity rules, and logs of such lines.

ds4 prints one line per routed-MoE call to stderr when ``DS4_CUDA_MOE_PROFILE`` is set
(``shared/context/ds4-decode.md``, "The routed MoE kernel sequence and its profile")::

    ds4: CUDA MoE profile tokens=<n> pairs=<n*6> xq=<ms> sort=<ms> gateup=<ms> midq=<ms> down=<ms> sum=<ms> total=<ms> ms

This module is the one implementation of that line for ds4lab: ``ds4lab moe`` writes it
(:func:`format_ds4_line`, :func:`ds4_lines`), :func:`read_ds4_log` reads it back, and
``ds4lab ingest`` reads real logs with the same grammar and rules.

Grammar (:func:`parse_ds4_line`): the line starts at the ``ds4: CUDA MoE profile`` prefix (text
before it is ignored: stderr noise) and ends with `` ms`` (trailing whitespace only). ``tokens`` and
``pairs`` are whole numbers; each stage time is a decimal number (sign, ``.5``, exponent allowed) or
``nan``/``inf`` with an optional sign: what ``%.3f`` prints in C and in Python for non-finite values.
``nan`` is how ds4lab writes a stage it could not time (:func:`format_ds4_line`), so a line with one
parses, and back to NaN: the format round-trips.

Validity (:func:`ds4_line_problem`): a line that parses can still not be a real call: ``tokens=0``,
a stage time that is negative or not finite (``nan``: not timed, ``inf``/``1e999``: impossible),
``pairs`` not a positive multiple of ``tokens``, or ``total`` off the sum of the six stages by more than
the printed rounding (:data:`TOTAL_SLACK_MS`; not checked where ``total`` is a span, as CUPTI's is).
``ds4lab ingest`` calls such a line malformed; :func:`read_ds4_log` keeps every line that parses.

The ``# ds4lab ...`` comment line (:func:`ds4lab_header`) that :func:`ds4_lines` puts first says the
lines after it are ds4lab's, with their provenance, mode and routing.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..token.model import MOE_STAGES
from .rows import ROW_COLUMNS, STAGES

DS4_PREFIX = "ds4: CUDA MoE profile"
#: ds4's stderr line (context file, "The routed MoE kernel sequence and its profile").
DS4_LINE = ("ds4: CUDA MoE profile tokens={tokens} pairs={pairs} xq={xq} sort={sort} gateup={gateup} "
            "midq={midq} down={down} sum={sum} total={total} ms")
#: a finite decimal number: never a lone "." or "e". Each digit run has one way to match (no
#: ``\d+\.?\d*``, which splits a run of n digits n ways and backtracks through all of them): a
#: malformed line is rejected in time linear in its length.
FLOAT = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
#: what ``%.3f`` prints for a non-finite value (C and Python)
NONFINITE = r"[-+]?(?:nan|inf)"
_NUM = rf"(?:{FLOAT}|{NONFINITE})"
#: the whole line from its prefix (``re.match`` on the text from :data:`DS4_PREFIX` on)
DS4_LINE_RE = re.compile(
    r"ds4: CUDA MoE profile tokens=(?P<tokens>\d+) pairs=(?P<pairs>\d+)"
    + "".join(rf" {s}=(?P<{s}>{_NUM})" for s in STAGES) + r" ms\s*$")
#: the slack allowed between ``total`` and the sum of the six stages: each of the seven fields is
#: printed with 3 decimals
TOTAL_SLACK_MS = 0.001 * len(STAGES)
#: modes whose ``total`` is not the sum of the stages (CUPTI: first kernel start to last kernel end)
TOTAL_NOT_SUM_MODES = ("cupti",)

_DS4LAB_HEADER = re.compile(r"^\s*#\s*(?P<text>ds4lab\b.*?)\s*$")
_HEADER_FIELD = re.compile(r"(?:^|(?<=[\s\u00b7]))(?P<key>mode|routing)=(?P<value>[^\s\u00b7]+)")


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


def _match(line: str) -> tuple[str, re.Match | None] | None:
    i = line.find(DS4_PREFIX)
    if i < 0:
        return None
    body = line[i:]
    return body, DS4_LINE_RE.match(body)


def parse_ds4_line(line: str) -> dict | None:
    """The fields of one ds4 MoE profile line: ``tokens`` and ``pairs`` (int) and each stage of
    :data:`STAGES` in ms (float; NaN for ``nan``, ±inf for ``inf``), or None when the line holds no
    profile line that follows the grammar (module docstring). Never raises; no validity checks
    (:func:`ds4_line_problem`)."""
    got = _match(line)
    if got is None or got[1] is None:
        return None
    m = got[1]
    return {"tokens": int(m["tokens"]), "pairs": int(m["pairs"]), **{s: float(m[s]) for s in STAGES}}


def ds4_line_problem(line: str, *, total_is_sum: bool = True) -> str | None:
    """Why ``line`` is not a well-formed, possible ds4 MoE profile line (naming the field and the value
    as printed), or None when :func:`parse_ds4_line` reads it as a real call.

    ``total_is_sum``: check ``total`` against the sum of the stages (False for a span, e.g. lines of
    a mode in :data:`TOTAL_NOT_SUM_MODES`). The rules are ``ds4lab ingest``'s (module docstring)."""
    got = _match(line)
    if got is None:
        return f"no {DS4_PREFIX!r} prefix"
    body, m = got
    if m is None:
        return _why_no_match(body)
    tokens, pairs = int(m["tokens"]), int(m["pairs"])
    vals = {s: float(m[s]) for s in STAGES}
    if tokens < 1:
        return f"tokens={_clip(m['tokens'])}: a MoE call has at least one token"
    for s in STAGES:
        if not math.isfinite(vals[s]):
            return f"{s}={_clip(m[s])} is not a finite time"
        if vals[s] < 0:
            return f"{s}={_clip(m[s])} is a negative time"
    if pairs < tokens or pairs % tokens:
        return f"pairs={_clip(m['pairs'])} is not a positive multiple of tokens={_clip(m['tokens'])}"
    if total_is_sum:
        staged = sum(vals[s] for s in MOE_STAGES)
        if abs(vals["total"] - staged) > TOTAL_SLACK_MS + 1e-9:
            return (f"total={_clip(m['total'])} is not the sum of the stages ({staged:.3f} ms): off by "
                    f"{abs(vals['total'] - staged):.3f} ms, more than the rounding ({TOTAL_SLACK_MS:.3f} ms)")
    return None


def _clip(value: str, quote: bool = False, keep: int = 40) -> str:
    """A field's value as a message shows it: whole up to ``keep`` characters (quoted with
    ``quote``), else its start and its length, so a 400 KB field makes a one-line message."""
    if len(value) <= keep:
        return repr(value) if quote else value
    head = repr(value[:keep]) if quote else value[:keep]
    return f"{head}... ({len(value)} characters)"


def _why_no_match(body: str) -> str:
    """What is wrong with a ds4 profile line that does not match: the first bad or missing field.
    Linear in the line's length (its words split once; no search that rescans a long word)."""
    fields = {}
    for word in body.split():
        key, eq, value = word.partition("=")
        if eq and re.fullmatch(r"\w+", key):
            fields[key] = value
    for k in ("tokens", "pairs"):
        if k not in fields:
            return f"no {k}="
        if not re.fullmatch(r"\d+", fields[k]):
            return f"{k}={_clip(fields[k], quote=True)} is not a whole number"
    for s in STAGES:
        if s not in fields:
            return f"no {s}="
        if not re.fullmatch(_NUM, fields[s]):
            return f"{s}={_clip(fields[s], quote=True)} is not a number"
    return "fields out of order, or extra text; expected tokens= pairs= " + " ".join(
        f"{s}=" for s in STAGES) + " ms"


# ----------------------------------------------------------------------------- the provenance header
def ds4lab_header(line: str) -> tuple[str, bool] | None:
    """``(text, modeled)`` for a ``# ds4lab ...`` provenance comment line (``modeled``: the text says
    ``MODELED``), else None."""
    m = _DS4LAB_HEADER.match(line)
    if not m:
        return None
    return m["text"], bool(re.search(r"\bMODELED\b", m["text"]))


def ds4lab_header_fields(text: str) -> dict:
    """``mode``/``routing`` of a ``ds4lab ...`` header text (``unknown`` when it does not say) and
    ``provenance``: the text without those two tokens."""
    got = {m["key"]: m["value"] for m in _HEADER_FIELD.finditer(text)}
    prov = text
    if got:
        parts = [" ".join(re.sub(r"(?<!\S)(mode|routing)=\S+", "", p).split()) for p in text.split("\u00b7")]
        prov = " \u00b7 ".join(p for p in parts if p)
    return {"mode": got.get("mode", "unknown"), "routing": got.get("routing", "unknown"), "provenance": prov}


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
