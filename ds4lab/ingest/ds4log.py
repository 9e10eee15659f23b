"""ds4's ``DS4_CUDA_MOE_PROFILE`` stderr lines (``shared/context/ds4-decode.md``, "The routed MoE
kernel sequence and its profile") and the ds4-format logs ``ds4lab moe`` writes (a ``# ds4lab ...``
provenance header first). The line's grammar and validity rules are :mod:`ds4lab.moeprof.ds4log`'s
(the one implementation, shared with ``ds4lab moe``, which writes such lines); this module turns a
log into rows, strict or lenient. See :mod:`ds4lab.ingest` for the rules.

A log is streamed: read line by line and handed over :data:`CHUNK_LINES` profile lines at a time
(:meth:`ds4lab.ingest.common.Ingested.emit`), so ``ds4lab ingest`` holds one chunk, not the log: its
memory does not grow with the file (``tests/test_ingest_large.py`` measures it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..moeprof.ds4log import (DS4_PREFIX, TOTAL_NOT_SUM_MODES, TOTAL_SLACK_MS, ds4_line_problem, ds4lab_header,
                              ds4lab_header_fields, parse_ds4_line)
from .common import Ingested, RowBlock, problem as _problem, text_lines

from ..moeprof.rows import STAGES as MOE_STAGES  # ds4's six stages and their total, defined once
#: modes whose ``total`` is not the sum of the stages (CUPTI: first kernel start to last kernel end),
#: and ``unknown`` (an older ds4lab header: its lines may be CUPTI's)
_TOTAL_NOT_SUM = (*TOTAL_NOT_SUM_MODES, "unknown")
#: profile lines per chunk handed over (7 rows each): about 1.5 MB of table at a time
CHUNK_LINES = 20_000
#: the columns of table ``ds4_moe``, in order
COLUMNS = ("token", "layer", "tokens", "pairs", "stage", "ms", "mode", "backend", "routing", "modeled", "provenance",
           "file", "source")
__all__ = ["CHUNK_LINES", "COLUMNS", "DS4_PREFIX", "MOE_STAGES", "TOTAL_SLACK_MS", "read_ds4_log"]


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
            for stage, v in zip(MOE_STAGES, ms):
                add((call, "", tokens, pairs, stage, v, mode, backend, routing, bool(modeled), prov, name, src))
        return RowBlock(COLUMNS, rows)

    def frame(self, first_call: int, states: list[tuple], path: Path) -> pd.DataFrame:
        """The chunk's rows in ``ds4_moe``'s long format: one row per (call, stage)."""
        n, k = len(self.line), len(MOE_STAGES)
        st = np.repeat(np.asarray(self.state, dtype=np.int64), k)
        cols = [np.array([s[i] for s in states], dtype=object)[st] for i in range(4)]  # prov, modeled, mode, routing
        prov = cols[0]
        name = path.name
        return pd.DataFrame({
            "token": np.repeat(np.arange(first_call, first_call + n, dtype=np.int64), k),
            "layer": np.full(n * k, np.nan),
            "tokens": np.repeat(np.asarray(self.tokens, dtype=np.int64), k),
            "pairs": np.repeat(np.asarray(self.pairs, dtype=np.int64), k),
            "stage": np.tile(np.array(MOE_STAGES, dtype=object), n),
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
    """ds4 ``DS4_CUDA_MOE_PROFILE`` lines → rows (call, tokens, pairs, stage, ms): the same columns as
    ``ds4lab moe``'s table, plus ``provenance`` and ``modeled``: ``ds4`` and false for ds4's own lines
    (mode ``host-timed``, routing ``ds4``), the ``# ds4lab ...`` header's text (``modeled``, ``mode``
    and ``routing`` from it; ``unknown`` mode and routing for a header that does not name them) for
    lines ds4lab wrote; ``backend`` is ``ds4`` or ``ds4lab``; ``file`` is the log, ``source``
    ``<log name>:<line>``. A line with the prefix that does not follow the grammar, or cannot be a
    real call (:func:`ds4lab.moeprof.ds4log.ds4_line_problem`; ``total`` not checked for CUPTI's
    lines or under an older header), is malformed: IngestError naming file and line unless
    ``lenient``. A log cut off in the middle of a profile line is caught by the grammar (the line
    must end with `` ms``).

    ``res``: the record to fill (its ``sink`` receives the rows chunk by chunk, ``chunk_lines``
    profile lines at a time); a new one when None, whose ``tables["ds4_moe"]`` then holds every row."""
    path = Path(path)
    res = res if res is not None else Ingested(path, "ds4-log")
    states: list[tuple] = [("ds4", False, "host-timed", "ds4")]  # (provenance, modeled, mode, routing)
    cur = 0
    chunk, call = _Chunk(), 0
    for n, line in text_lines(res, path):
        h = ds4lab_header(line)
        if h is not None:
            text, modeled = h
            f = ds4lab_header_fields(text)
            states.append((f["provenance"], modeled, f["mode"], f["routing"]))
            cur = len(states) - 1
            continue
        if DS4_PREFIX not in line:
            continue  # the program's other output: a log is ds4's whole stderr
        why = ds4_line_problem(line, total_is_sum=states[cur][2] not in _TOTAL_NOT_SUM)
        if why:
            _problem(res, lenient, n, f"malformed ds4 MoE profile line ({why})", line)
            continue
        vals = parse_ds4_line(line)
        chunk.line.append(n)
        chunk.tokens.append(vals["tokens"])
        chunk.pairs.append(vals["pairs"])
        chunk.state.append(cur)
        chunk.ms.append([vals[s] for s in MOE_STAGES])
        if len(chunk) >= chunk_lines:
            res.emit("ds4_moe", chunk.block(call, states, path) if res.sink else chunk.frame(call, states, path))
            call += len(chunk)
            chunk = _Chunk()
    if len(chunk):
        res.emit("ds4_moe", chunk.block(call, states, path) if res.sink else chunk.frame(call, states, path))
        call += len(chunk)
    if call == 0 and not res.problems:
        _problem(res, lenient, 0, "no ds4 MoE profile line")
    if "ds4_moe" not in res.tables and res.sink is None:
        res.tables["ds4_moe"] = pd.DataFrame(columns=list(COLUMNS))
    return res
