"""``nsys export --type sqlite`` databases: kernels, graph executions and NVTX ranges with their
domain names.

Sources: the Nsight Systems export schema ("Exporter" section of the Nsight Systems user guide; the
tables are named after the CUPTI activity kinds, ``CUPTI_ACTIVITY_KIND_KERNEL`` and
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``, with times in ns and names as ``StringIds`` ids), CUPTI's
``CUpti_ActivityGraphTrace2`` record ("execution for a graph without giving visibility about the
execution of its nodes"), and the NVTX event types the export uses in ``NVTX_EVENTS.eventType``: 59
push/pop range, 60 start/end range, 75 domain creation (the row's ``text`` is the domain's name, its
``domainId`` the id later rows carry; domain ids are per process, the process being bits 24–47 of
``globalTid``). Where the export has the ``ENUM_NSYS_EVENT_TYPE`` table, the domain-creation id is
read from it instead (name ``NvtxDomainCreate``).

Nsight Systems traces CUDA graphs whole by default (``--cuda-graph-trace=graph``): the export then
holds one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row per graph execution and no kernel rows for the
graph's nodes. Such a file gives a ``graphs`` table and a warning that names the fix
(``--cuda-graph-trace=node``), so an empty or partial kernel table is never taken for the whole.

A table is found whatever version suffix the export gives it (``CUPTI_ACTIVITY_KIND_KERNEL``,
``..._V2``, ``..._2``: the highest is read).
"""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path

import pandas as pd

from .common import IngestError, Ingested, problem

#: NVTX_EVENTS.eventType of a domain creation when the export has no ENUM_NSYS_EVENT_TYPE table
NVTX_DOMAIN_CREATE = 75
GRAPH_FIX = ("the export holds whole-graph executions (CUPTI_ACTIVITY_KIND_GRAPH_TRACE) without the kernels "
             "inside them: the kernel table lacks every graph-launched kernel; profile again with "
             "nsys profile --cuda-graph-trace=node to see them")


def find_table(tables: set[str], base: str) -> str | None:
    """The table named ``base`` or ``base`` with a version suffix (``_V2``, ``_2``), the highest
    version first; None when there is none."""
    pat = re.compile(rf"^{re.escape(base)}(?:_V?(\d+))?$", re.I)
    found = [(int(m.group(1) or 0), t) for t in tables if (m := pat.match(t))]
    return max(found)[1] if found else None


def _ns(v) -> int | float | None:
    """A timestamp cell as a number, or None (NULL, text, blob, NaN)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)):
        return v
    return None


def _cols(con, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'pragma table_info("{table}")')]


def read_nsys_sqlite(path: Path, lenient: bool) -> Ingested:
    """Tables: ``kernels`` (name, start_ns, end_ns, us, and streamId, graphId, graphNodeId,
    deviceId, correlationId, grid and block sizes where the export has them), ``graphs`` (one row
    per graph execution: start_ns, end_ns, us, graphId, graphExecId, streamId, correlationId) and
    ``nvtx`` (name, start_ns, end_ns, us, domain (its name), domain_id), each with ``file`` and
    ``source`` (``<file name>:<row number>``). Raises IngestError for an unreadable database, a
    database without any of these tables, or (unless ``lenient``) a row whose start/end is not a
    number or ends before it starts."""
    res = Ingested(path, "nsys-sqlite")
    con = None
    try:
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        strings = dict(con.execute("select id, value from StringIds")) if "StringIds" in tables else {}
        kt = find_table(tables, "CUPTI_ACTIVITY_KIND_KERNEL")
        gt = find_table(tables, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
        nt = find_table(tables, "NVTX_EVENTS")
        if kt:
            res.tables["kernels"] = _kernels(res, lenient, con, kt, strings)
        if gt:
            res.tables["graphs"] = _graphs(res, lenient, con, gt)
        if nt:
            res.tables["nvtx"] = _nvtx(res, lenient, con, nt, strings, tables)
        if not (kt or gt or nt):
            problem(res, lenient, 0, "no CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_GRAPH_TRACE or NVTX_EVENTS "
                                     f"table (tables: {', '.join(sorted(tables)[:12]) or 'none'})")
        g = res.tables.get("graphs")
        if g is not None and not g.empty:
            k = res.tables.get("kernels")
            launched = set()
            if k is not None and "graphId" in k:
                launched = {int(x) for x in k["graphId"].dropna() if int(x) != 0}
            missing = sorted({int(x) for x in g["graphId"].dropna()} - launched) if "graphId" in g else ["?"]
            if missing:
                res.warnings.append(f"{path}: {len(g)} graph execution(s) of {len(missing)} graph(s) "
                                    f"(graphId {', '.join(map(str, missing[:8]))}): {GRAPH_FIX}")
    except sqlite3.Error as e:
        raise IngestError(f"{path}: unreadable SQLite export ({e})") from None
    finally:
        if con is not None:
            con.close()
    return res


def _rows(res, lenient, what, cur, nstart, nend):
    """(row number, row, start, end) of rows with numeric start ≤ end; reports the others."""
    for k, r in enumerate(cur, 1):
        start, end = _ns(r[nstart]), _ns(r[nend])
        if start is None or end is None:
            problem(res, lenient, k, f"{what} with a start/end that is not a number "
                                     f"(start={r[nstart]!r}, end={r[nend]!r})", str(r))
            continue
        if end < start:
            problem(res, lenient, k, f"{what} ending before it starts (a missing or negative duration: "
                                     f"start={start}, end={end})", str(r))
            continue
        yield k, r, start, end


def _kernels(res, lenient, con, table, strings) -> pd.DataFrame:
    cols = _cols(con, table)
    name_col = next((c for c in ("demangledName", "shortName", "mangledName") if c in cols), None)
    extra = [c for c in ("streamId", "graphId", "graphNodeId", "deviceId", "correlationId", "gridX", "gridY",
                         "gridZ", "blockX", "blockY", "blockZ", "registersPerThread") if c in cols]
    q = (f'select start, end, {name_col or "NULL"}{"".join(", " + c for c in extra)} from "{table}"')
    rows = []
    for k, r, start, end in _rows(res, lenient, "kernel row", con.execute(q), 0, 1):
        row = {"name": strings.get(r[2], r[2]), "start_ns": start, "end_ns": end, "us": (end - start) / 1e3}
        row.update(dict(zip(extra, r[3:])))
        row.update(file=str(res.path), source=f"{res.path.name}:{k}")
        rows.append(row)
    return pd.DataFrame(rows)


def _graphs(res, lenient, con, table) -> pd.DataFrame:
    cols = _cols(con, table)
    extra = [c for c in ("graphId", "graphExecId", "streamId", "correlationId", "deviceId", "contextId") if c in cols]
    q = f'select start, end{"".join(", " + c for c in extra)} from "{table}"'
    rows = []
    for k, r, start, end in _rows(res, lenient, "graph execution row", con.execute(q), 0, 1):
        row = {"start_ns": start, "end_ns": end, "us": (end - start) / 1e3}
        row.update(dict(zip(extra, r[2:])))
        row.update(file=str(res.path), source=f"{res.path.name}:{k}")
        rows.append(row)
    return pd.DataFrame(rows)


def _domain_create_type(con, tables) -> int:
    if "ENUM_NSYS_EVENT_TYPE" in tables:
        cols = _cols(con, "ENUM_NSYS_EVENT_TYPE")
        if "id" in cols and "name" in cols:
            r = con.execute("select id from ENUM_NSYS_EVENT_TYPE where name = 'NvtxDomainCreate'").fetchone()
            if r is not None:
                return int(r[0])
    return NVTX_DOMAIN_CREATE


def _pid(gtid):
    return (int(gtid) >> 24) & 0xFFFFFF if isinstance(gtid, int) else None


def _nvtx(res, lenient, con, table, strings, tables) -> pd.DataFrame:
    cols = _cols(con, table)
    opt = {c: (c if c in cols else "NULL") for c in ("text", "textId", "domainId", "eventType", "globalTid")}
    create = _domain_create_type(con, tables)
    domains: dict[tuple, str] = {}
    if opt["eventType"] != "NULL":
        for text, tid, dom, gtid in con.execute(
                f'select {opt["text"]}, {opt["textId"]}, {opt["domainId"]}, {opt["globalTid"]} from "{table}" '
                f"where eventType = ?", (create,)):
            name = text if text is not None else strings.get(tid)
            if name is not None and dom is not None:
                domains[(_pid(gtid), dom)] = str(name)
                domains.setdefault((None, dom), str(name))
    q = (f'select start, end, {opt["text"]}, {opt["textId"]}, {opt["domainId"]}, {opt["eventType"]}, '
         f'{opt["globalTid"]} from "{table}"')
    rows = []
    cur = ((k, r) for k, r in enumerate(con.execute(q), 1))
    for k, r in cur:
        start0, end0, text, tid, dom, etype, gtid = r
        if end0 is None or etype == create:
            continue  # marks and domain registrations have no end
        start, end = _ns(start0), _ns(end0)
        if start is None or end is None:
            problem(res, lenient, k, f"NVTX range with a start/end that is not a number "
                                     f"(start={start0!r}, end={end0!r})", str((start0, end0, text)))
            continue
        if end < start:
            problem(res, lenient, k, "NVTX range ending before it starts", str((start, end, text)))
            continue
        if dom in (None, 0):
            dname = "" if dom is None else "default"
        else:
            dname = (domains.get((_pid(gtid), dom)) or domains.get((None, dom))
                     or f"domain {dom} (not named in the export)")
        rows.append({"name": text if text is not None else strings.get(tid, ""), "start_ns": start, "end_ns": end,
                     "us": (end - start) / 1e3, "domain": dname, "domain_id": dom, "file": str(res.path),
                     "source": f"{res.path.name}:{k}"})
    return pd.DataFrame(rows)
