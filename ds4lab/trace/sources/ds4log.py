"""ds4's stderr: the one grammar of its lines (:func:`parse_ds4_line`, :func:`ds4_line_problem`, :func:`ds4_event`,
:func:`ds4lab_header`) and the one reader of its logs (:func:`read_ds4_log`, yields summary tables ``ds4_moe``
and ``ds4_events``, streamed :data:`CHUNK_LINES` profile lines at a time). The line's grammar and validity:
docs/trace-readers.md, "ds4's stderr"."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ...token.model import MOE_STAGES
from .common import Ingested, RowBlock, problem, text_lines

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"ds4-log": "ds4's stderr: MoE profile, decode-island and model-load lines"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("tables",)

#: ds4's six stages and their total: the fields of the line after ``tokens`` and ``pairs``.
STAGES = MOE_STAGES + ("total",)
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
#: ``modes a, b, c`` in a header of several modes mixed in one log
_HEADER_MODES = re.compile(r"\bmodes\s+(?P<modes>[\w-]+(?:\s*,\s*[\w-]+)*)")



def _match(line: str) -> tuple[str, re.Match | None] | None:
    i = line.find(DS4_PREFIX)
    if i < 0:
        return None
    body = line[i:]
    return body, DS4_LINE_RE.match(body)


def parse_ds4_line(line: str) -> dict | None:
    """``tokens``, ``pairs`` (int) and each stage of :data:`STAGES` in ms (NaN, ±inf allowed) of one profile line,
    or None where none follows the grammar. Never raises; no validity checks."""
    got = _match(line)
    if got is None or got[1] is None:
        return None
    m = got[1]
    return {"tokens": int(m["tokens"]), "pairs": int(m["pairs"]), **{s: float(m[s]) for s in STAGES}}


def ds4_line_problem(line: str, *, total_is_sum: bool = True) -> str | None:
    """Why ``line`` is not a well-formed, possible profile line (naming the field and value as printed), or None.
    ``total_is_sum``: check ``total`` against the stages' sum (False for a span)."""
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
    """A field's value as a message shows it: whole up to ``keep`` characters (quoted with ``quote``), else its start
    and its length, so a 400 KB field makes a one-line message."""
    if len(value) <= keep:
        return repr(value) if quote else value
    head = repr(value[:keep]) if quote else value[:keep]
    return f"{head}... ({len(value)} characters)"


def _why_no_match(body: str) -> str:
    """What is wrong with a ds4 profile line that does not match: the first bad or missing field. Linear in the line's
    length (its words split once; no search that rescans a long word)."""
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
    """``(text, modeled)`` of a ``# ds4lab ...`` provenance line (``modeled``: it says MODELED), else None."""
    m = _DS4LAB_HEADER.match(line)
    if not m:
        return None
    return m["text"], bool(re.search(r"\bMODELED\b", m["text"]))


def ds4lab_header_fields(text: str) -> dict:
    """``mode``/``routing`` of a ``ds4lab ...`` header (``unknown``: not said), ``provenance`` (the text without
    them), ``modes`` (the modes the lines after it may be in: ``(mode,)``, a header's ``modes a, b, c``, or ``()``)."""
    got = {m["key"]: m["value"] for m in _HEADER_FIELD.finditer(text)}
    prov = text
    if got:
        parts = [" ".join(re.sub(r"(?<!\S)(mode|routing)=\S+", "", p).split()) for p in text.split("\u00b7")]
        prov = " \u00b7 ".join(p for p in parts if p)
    mixed = _HEADER_MODES.search(text)
    modes = ((got["mode"],) if "mode" in got
             else tuple(m.strip() for m in mixed["modes"].split(",")) if mixed else ())
    return {"mode": got.get("mode", "unknown"), "routing": got.get("routing", "unknown"), "provenance": prov,
            "modes": modes}


# ----------------------------------------------------------------------------- ds4's other lines
#: ds4's decode-island lines (``ds4_cuda.cu``, ``cuda_decode_graph_*`` at ``b0309611``, printed with
#: ``DS4_CUDA_DECODE_GRAPH_LOG=1`` or on failure).
ISLAND_LINE = re.compile(r"ds4: decode graph (?P<what>captured|capture failed|instantiate failed|first launch "
                         r"failed|replay failed) \(?il=(?P<il>\d+) island=(?P<island>\d+)\)?(?::\s*(?P<error>.*))?")
#: A launch ds4 checked inside a capture that had already failed (``cuda_ok`` after a launch): the island's
#: capture is lost, and ds4 prints no "decode graph capture failed" line for it (seen with
#: ``DS4_CUDA_MOE_PROFILE=1``).
CAPTURE_LAUNCH_LINE = re.compile(r"ds4: CUDA (?P<what>.+?) launch failed: (?P<error>.*during capture.*)")
DISABLED_LINE = re.compile(r"ds4: DS4_CUDA_DECODE_GRAPHS=\S+ - decode graph capture disabled")
MODEL_COPY_LINE = re.compile(r"ds4: CUDA model copy complete in (?P<s>[\d.]+)s")
#: Where ds4 put the weights (``ds4_cuda.cu`` at ``b0309611``): copied into GPU memory, or the model's
#: mapping registered for device access (every weight read over PCIe at each use).
WEIGHTS_LINES = (("gpu-memory", re.compile(r"ds4: CUDA (copying|chunk-copying) [\d.]+ GiB model")),
                 ("host-mapped", re.compile(r"ds4: CUDA (\(no-copy\) )?registered [\d.]+ GiB model mapping")))
#: the columns of table ``ds4_events``: one row per island, failed-launch-in-capture, switch or model-load line
EVENT_COLUMNS = ("event", "layer", "island", "call", "error", "seconds", "file", "source")


def ds4_event(line: str) -> dict | None:
    """The ``ds4_events`` fields of one of ds4's island or model-load lines, or None (``event``: an island step
    with ``layer``, ``island``, ``error``; ``launch failed in capture``; ``capture disabled``; ``model copy
    complete``; ``weights gpu-memory``/``host-mapped``)."""
    if (m := ISLAND_LINE.search(line)) is not None:
        return {"event": m["what"], "layer": int(m["il"]), "island": int(m["island"]),
                "error": (m["error"] or "").strip()}
    if (m := CAPTURE_LAUNCH_LINE.search(line)) is not None:
        return {"event": "launch failed in capture", "call": m["what"], "error": m["error"].strip()}
    if DISABLED_LINE.search(line):
        return {"event": "capture disabled"}
    if (m := MODEL_COPY_LINE.search(line)) is not None:
        return {"event": "model copy complete", "seconds": float(m["s"])}
    return next(({"event": f"weights {where}"} for where, pat in WEIGHTS_LINES if pat.search(line)), None)


#: profile lines per chunk handed over (7 rows each): about 1.5 MB of table at a time
CHUNK_LINES = 20_000
#: the columns of table ``ds4_moe``, in order
COLUMNS = ("token", "layer", "tokens", "pairs", "stage", "ms", "mode", "backend", "routing", "modeled", "provenance",
           "file", "source")
__all__ = ["CHUNK_LINES", "COLUMNS", "EVENT_COLUMNS", "DS4_LINE", "DS4_LINE_RE", "DS4_PREFIX", "STAGES", "TOTAL_NOT_SUM_MODES",
           "TOTAL_SLACK_MS", "ds4_event", "ds4_line_problem", "ds4lab_header", "ds4lab_header_fields", "parse_ds4_line", "read_ds4_log"]


class _Chunk:
    """Profile lines of one chunk, column by column (one entry per line, not per row)."""

    def __init__(self) -> None:
        self.line, self.tokens, self.pairs, self.state, self.ms = [], [], [], [], []

    def __len__(self) -> int:
        return len(self.line)

    def block(self, first_call: int, states: list[tuple], path: Path) -> RowBlock:
        """The chunk's rows in ``ds4_moe``'s long format (one row per call and stage), as tuples."""
        name = str(path)
        rows = []
        add = rows.append
        for i, (ln, tokens, pairs, st, ms) in enumerate(zip(self.line, self.tokens, self.pairs, self.state, self.ms)):
            prov, modeled, mode, routing = states[st]
            backend = "ds4" if prov == "ds4" else "ds4lab"
            src = f"{path.name}:{ln}"
            call = first_call + i
            for stage, v in zip(STAGES, ms):
                add((call, "", tokens, pairs, stage, v, mode, backend, routing, bool(modeled), prov, name, src))
        return RowBlock(COLUMNS, rows)

    def frame(self, first_call: int, states: list[tuple], path: Path) -> pd.DataFrame:
        """The chunk's rows in ``ds4_moe``'s long format: one row per (call, stage)."""
        n, k = len(self.line), len(STAGES)
        st = np.repeat(np.asarray(self.state, dtype=np.int64), k)
        cols = [np.array([s[i] for s in states], dtype=object)[st] for i in range(4)]  # prov, modeled, mode, routing
        prov = cols[0]
        name = path.name
        return pd.DataFrame({
            "token": np.repeat(np.arange(first_call, first_call + n, dtype=np.int64), k),
            "layer": np.full(n * k, np.nan),
            "tokens": np.repeat(np.asarray(self.tokens, dtype=np.int64), k),
            "pairs": np.repeat(np.asarray(self.pairs, dtype=np.int64), k),
            "stage": np.tile(np.array(STAGES, dtype=object), n),
            "ms": np.asarray(self.ms, dtype=np.float64).reshape(-1),
            "mode": cols[2],
            "backend": np.where(prov == "ds4", "ds4", "ds4lab"),
            "routing": cols[3],
            "modeled": cols[1].astype(bool),
            "provenance": prov,
            "file": str(path),
            "source": np.repeat(np.array([f"{name}:{ln}" for ln in self.line], dtype=object), k),
        }, columns=list(COLUMNS))


def read_ds4_log(path: Path, lenient: bool, res: Ingested | None = None, chunk_lines: int = CHUNK_LINES) -> Ingested:
    """A ds4 log → ``ds4_moe`` (rows call, tokens, pairs, stage, ms, as ``ds4lab moe``'s table, with ``provenance``,
    ``modeled``, ``mode``, ``routing``, ``backend``, ``file``, ``source``: ds4's own lines ``ds4``/``host-timed``,
    ds4lab's from their header) and ``ds4_events`` (:data:`EVENT_COLUMNS`). A prefixed line off the grammar or
    impossible (:func:`ds4_line_problem`), or a log with neither kind of line: SourceError naming file and line
    unless ``lenient``. ``res``: the record to fill (its ``sink`` gets ``chunk_lines`` lines at a time; None: new)."""
    path = Path(path)
    res = res if res is not None else Ingested(path, "ds4-log")
    states: list[tuple] = [("ds4", False, "host-timed", "ds4")]  # (provenance, modeled, mode, routing)
    cur = 0
    total_is_sum = True  # False after a header naming a mode whose total is a span (alone, or mixed in)
    chunk, call, events = _Chunk(), 0, []
    for n, line in text_lines(res, path):
        h = ds4lab_header(line)
        if h is not None:
            text, modeled = h
            f = ds4lab_header_fields(text)
            states.append((f["provenance"], modeled, f["mode"], f["routing"]))
            cur = len(states) - 1
            span = [m for m in f["modes"] if m in TOTAL_NOT_SUM_MODES]
            total_is_sum = not span
            if span and len(f["modes"]) > 1:
                res.warnings.append(f"{path.name}:{n}: the lines after this header mix modes {', '.join(f['modes'])}; "
                                    f"{', '.join(span)}'s total is the step's span, not the sum of the stages, so no "
                                    "line's total is checked against its stages (their mode: unknown)")
            continue
        if DS4_PREFIX not in line:  # ds4's other lines, or the program's other output (a log is its whole stderr)
            ev = ds4_event(line) if "ds4: " in line else None
            if ev is not None:
                events.append({**ev, "file": str(path), "source": f"{path.name}:{n}"})
            continue
        why = ds4_line_problem(line, total_is_sum=total_is_sum)
        if why:
            problem(res, lenient, n, f"malformed ds4 MoE profile line ({why})", line)
            continue
        vals = parse_ds4_line(line)
        chunk.line.append(n)
        chunk.tokens.append(vals["tokens"])
        chunk.pairs.append(vals["pairs"])
        chunk.state.append(cur)
        chunk.ms.append([vals[s] for s in STAGES])
        if len(chunk) >= chunk_lines:
            res.emit("ds4_moe", chunk.block(call, states, path) if res.sink else chunk.frame(call, states, path))
            call += len(chunk)
            chunk = _Chunk()
    if len(chunk):
        res.emit("ds4_moe", chunk.block(call, states, path) if res.sink else chunk.frame(call, states, path))
        call += len(chunk)
    res.emit("ds4_events", pd.DataFrame(events, columns=list(EVENT_COLUMNS)))
    if call == 0 and not events and not res.problems:
        problem(res, lenient, 0, "no ds4 MoE profile line, island line or model-load line")
    if "ds4_moe" not in res.tables and res.sink is None:
        res.tables["ds4_moe"] = pd.DataFrame(columns=list(COLUMNS))
    return res
