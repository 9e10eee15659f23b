"""Nsight Systems SQLite exports (``nsys export --type sqlite``): the one SQLite reader, yielding an event table
(:func:`read_sqlite`, for ``ds4lab audit``) and summary tables (:func:`read_nsys_sqlite`: kernels, graph
executions, NVTX ranges, for ``ds4lab ingest``) from the same tables and checks. Graphs traced whole give
``graphs`` rows and a warning naming ``--cuda-graph-trace=node``; a row whose start or end is not a number is
malformed. Sources: the Nsight Systems export schema (user guide, "Exporter"), CUPTI's
``CUpti_ActivityGraphTrace2`` and ``NVTX_EVENTS.eventType``. Which table gives which rows: docs/trace-readers.md."""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path

import pandas as pd

from ..records import (INVALID_ID, MEMCPY_KINDS, SYNC_TYPES, api_base_name, copy_label, host_memory, memset_label,
                       sync_label)
from .common import Ingested, Progress, SourceError, problem

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"nsys-sqlite": "an Nsight Systems SQLite export"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("tables", "events")

#: NVTX_EVENTS.eventType of a domain creation when the export has no ENUM_NSYS_EVENT_TYPE table
NVTX_DOMAIN_CREATE = 75
GRAPH_FIX = ("the export holds whole-graph executions (CUPTI_ACTIVITY_KIND_GRAPH_TRACE) without the kernels "
             "inside them: the kernel table lacks every graph-launched kernel; profile again with "
             "nsys profile --cuda-graph-trace=node to see them")


def find_table(tables: set[str], base: str) -> str | None:
    """The table ``base``, or with a version suffix (``_V2``, ``_2``: the highest), or None."""
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
    """Tables ``kernels``, ``graphs`` (one row per graph execution) and ``nvtx`` (with domain names), each with
    ``file`` and ``source`` (``<file>:<row>``). Raises IngestError for an unreadable database, one without these
    tables, or (unless ``lenient``) a row whose start/end is not a number or ends before it starts."""
    res = Ingested(path, "nsys-sqlite")
    con = None
    try:
        con = connect(path)
        tables = table_names(con)
        strings = string_ids(con, tables)
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
        raise SourceError(f"{path}: unreadable SQLite export ({e})") from None
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


def connect(path: Path):
    """A read-only connection to the export (a path with URI characters in it works too)."""
    return sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)


def table_names(con) -> set[str]:
    return {r[0] for r in con.execute("select name from sqlite_master where type='table'")}


def string_ids(con, tables) -> dict:
    """``StringIds`` as ``{id: value}`` ({} when the export has none)."""
    return dict(con.execute("select id, value from StringIds")) if "StringIds" in tables else {}


def _kernels(res, lenient, con, table, strings) -> pd.DataFrame:
    cols = _cols(con, table)
    name_col = next((c for c in ("demangledName", "shortName", "mangledName") if c in cols), None)
    extra = [c for c in ("streamId", "graphId", "graphNodeId", "deviceId", "correlationId", "gridX", "gridY",
                         "gridZ", "blockX", "blockY", "blockZ", "registersPerThread") if c in cols]
    q = (f'select start, end, {name_col or "NULL"}{"".join(", " + c for c in extra)} from "{table}"')
    rows = []
    zero = 0
    for k, r, start, end in _rows(res, lenient, "kernel row", con.execute(q), 0, 1):
        row = {"name": strings.get(r[2], r[2]), "start_ns": start, "end_ns": end, "us": (end - start) / 1e3}
        row.update(dict(zip(extra, r[3:])))
        row.update(file=str(res.path), source=f"{res.path.name}:{k}")
        rows.append(row)
        zero += end == start
    if zero:
        res.warnings.append(f"{res.path}: {zero:,} kernel row(s) of zero length (start = end) in {table}")
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


def _nvtx_cursor(con, table):
    """``(domain map, the domain-creation event type, cursor over (start, end, text, textId, domainId, eventType,
    globalTid))`` of an ``NVTX_EVENTS`` table: both views read it through this."""
    cols = _cols(con, table)
    opt = {c: (c if c in cols else "NULL") for c in ("text", "textId", "domainId", "eventType", "globalTid")}
    return opt, (f'select start, end, {opt["text"]}, {opt["textId"]}, {opt["domainId"]}, {opt["eventType"]}, '
                 f'{opt["globalTid"]} from "{table}"')


def _nvtx_domains(con, table, opt, strings, create) -> dict:
    """``{(pid, domainId): name}`` (and ``(None, domainId)`` for the first process naming it) from the domain-creation
    rows of ``NVTX_EVENTS``; ``opt`` maps each optional column to itself or ``NULL``."""
    domains: dict[tuple, str] = {}
    if opt["eventType"] != "NULL":
        for text, tid, dom, gtid in con.execute(
                f'select {opt["text"]}, {opt["textId"]}, {opt["domainId"]}, {opt["globalTid"]} from "{table}" '
                f"where eventType = ?", (create,)):
            name = text if text is not None else strings.get(tid)
            if name is not None and dom is not None:
                domains[(_pid(gtid), dom)] = str(name)
                domains.setdefault((None, dom), str(name))
    return domains


def _nvtx(res, lenient, con, table, strings, tables) -> pd.DataFrame:
    opt, q = _nvtx_cursor(con, table)
    create = _domain_create_type(con, tables)
    domains = _nvtx_domains(con, table, opt, strings, create)
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


# ----------------------------------------------------------------------------- every CUDA event, for the audit
#: ``copyKind`` and ``syncType`` numbers without the ``ENUM_CUDA_MEMCPY_OPER`` / ``ENUM_CUPTI_SYNC_TYPE``
#: tables are CUPTI's (:data:`ds4lab.trace.records.MEMCPY_KINDS`, ``SYNC_TYPES``; the tables, where
#: present, have the same ids: checked on a 2024.6 export).
#: ``NVTX_EVENTS.eventType`` values without ``ENUM_NSYS_EVENT_TYPE``: mark, push/pop range, start/end range.
NVTX_MARK, NVTX_PUSHPOP, NVTX_STARTEND = 34, 59, 60


def split_global_id(gid) -> tuple[int, int]:
    """(pid, tid) of an Nsight Systems serialized ``globalTid``/``globalPid`` (bits 24–47 the process, 0–23 the thread;
    "Serialized process and thread identifiers" in the export documentation); (-1, -1) for NULL."""
    if not isinstance(gid, int):
        return -1, -1
    return (gid >> 24) & 0xFFFFFF, gid & 0xFFFFFF


def _enum(con, tables, name) -> dict:
    """``{id: symbol name}`` of an ``ENUM_*`` table, or {} when the export has none."""
    if name not in tables or not {"id", "name"} <= set(_cols(con, name)):
        return {}
    return {int(i): str(n or "") for i, n in con.execute(f'select id, name from "{name}"')}


def _copy_kind(sym: str) -> str:
    m = re.search(r"KIND_(?:UVM_)?([A-Z])TO([A-Z])$", sym or "")
    return f"{m.group(1)}to{m.group(2)}" if m else ""


def _mem_label(sym: str) -> str:
    m = re.search(r"MEMORY_KIND_(\w+)$", sym or "")
    return m.group(1).replace("_", " ").title() if m else "Unknown"


def export_version(con, tables) -> str:
    """``"schema 3.16.1, Nsight Systems 2024.6.2.225"`` from ``META_DATA_EXPORT`` (or the older ``EXPORT_META_DATA``);
    ``"schema not recorded"`` when the export has neither."""
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in tables and {"name", "value"} <= set(_cols(con, t)):
            kv = dict(con.execute(f'select name, value from "{t}"'))
            parts = []
            if kv.get("EXPORT_SCHEMA_VERSION"):
                parts.append(f"schema {kv['EXPORT_SCHEMA_VERSION']}")
            if kv.get("EXPORT_PRODUCT_VERSION"):
                parts.append(f"Nsight Systems {kv['EXPORT_PRODUCT_VERSION']}")
            if parts:
                return ", ".join(parts)
    return "schema not recorded"


def read_events(path: Path, sink, progress=None) -> dict:
    """Every CUDA event of the database, streamed into ``sink`` (``add(**cells)``: a
    :class:`~ds4lab.trace.table.Rows`); ``progress(rows_done, rows_total)`` every 20 000 rows. Returns ``{"version",
    "notes", "stream_types", "tables"}`` (rows unsorted). Raises ``sqlite3.Error`` (unreadable) and SourceError."""
    con = connect(path)
    try:
        return _read_events(con, Path(path), sink, progress)
    finally:
        con.close()


def _read_events(con, path, sink, progress) -> dict:
    tables = table_names(con)
    strings = string_ids(con, tables)
    notes: list[str] = []
    found = {k: find_table(tables, f"CUPTI_ACTIVITY_KIND_{k}") for k in
             ("RUNTIME", "DRIVER", "KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "CUDA_EVENT", "GRAPH_TRACE")}
    found["NVTX"] = find_table(tables, "NVTX_EVENTS")
    read = [t for t in found.values() if t]
    total = sum(con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in read) or 1
    done = [0]

    def tick():
        done[0] += 1
        if progress is not None and done[0] % 20000 == 0:
            progress(done[0], total)

    events = {}
    if found["CUDA_EVENT"]:
        cols = _cols(con, found["CUDA_EVENT"])
        if {"correlationId", "streamId", "eventId"} <= set(cols):
            gp = "globalPid" if "globalPid" in cols else "NULL"
            for corr, stream, ev, g in con.execute(
                    f'select correlationId, streamId, eventId, {gp} from "{found["CUDA_EVENT"]}"'):
                events[(split_global_id(g)[0], corr)] = (stream, ev)
                tick()
    cls = _enum(con, tables, "ENUM_NSYS_EVENT_CLASS")
    for key in ("RUNTIME", "DRIVER"):
        if found[key]:
            _api_rows(con, path, found[key], strings, cls, events, sink, notes, tick, key)
    if found["KERNEL"]:
        _kernel_rows(con, path, tables, found["KERNEL"], strings, sink, notes, tick)
    if found["MEMCPY"]:
        _memcpy_rows(con, path, tables, found["MEMCPY"], sink, notes, tick)
    if found["MEMSET"]:
        _memset_rows(con, path, tables, found["MEMSET"], sink, tick)
    if found["SYNCHRONIZATION"]:
        _sync_rows(con, path, tables, found["SYNCHRONIZATION"], sink, notes, tick)
    if found["GRAPH_TRACE"]:
        _graph_rows(con, path, found["GRAPH_TRACE"], sink, tick)
    if found["NVTX"]:
        _nvtx_rows(con, path, tables, found["NVTX"], strings, sink, notes, tick)
    return {"version": export_version(con, tables), "notes": notes, "tables": sorted(read),
            "stream_types": _stream_types(con, tables, notes), "all_tables": sorted(tables)}


def timed_rows(cursor, path, table: str, *, end_optional: bool = False):
    """The rows of ``cursor`` (``start`` and ``end`` first) whose times are whole ns (``end`` may be NULL where
    ``end_optional``). Raises SourceError naming file, table, row and field of the first that is not."""
    for k, r in enumerate(cursor, 1):
        for field, v in (("start", r[0]), ("end", r[1])):
            if v is None and field == "end" and end_optional:
                continue
            if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
                what = "NaN" if isinstance(v, float) and math.isnan(v) else repr(v)
                raise SourceError(f"{path}: {table} row {k}: field {field} is {what}, not a time in ns; the "
                                  "export is damaged or not one Nsight Systems wrote")
        yield r


def _sel(cols, want: dict) -> str:
    """``select`` items: each wanted column or NULL when the export lacks it."""
    return ", ".join((c if c in cols else "NULL") for c in want)


def _missing(notes, table, cols, needed, what) -> None:
    lack = [c for c in needed if c not in cols]
    if lack:
        notes.append(f"{table} has no {', '.join(lack)} column (an export schema ds4lab does not know): {what}")


def _gpid(v) -> int:
    return split_global_id(v)[0]


def _api_rows(con, path, table, strings, cls, events, sink, notes, tick, key) -> None:
    cols = _cols(con, table)
    _missing(notes, table, cols, ("globalTid", "correlationId"),
             "process, thread or correlation of those calls unknown")
    q = f'select start, end, {_sel(cols, ["nameId", "globalTid", "correlationId", "eventClass"])} from "{table}"'
    skipped = 0
    for start, end, name_id, gtid, corr, ecls in timed_rows(con.execute(q), path, table):
        tick()
        sym = cls.get(ecls, "") if ecls is not None else ""
        if "BACKTRACE" in sym:
            skipped += 1
            continue
        name = api_base_name(str(strings.get(name_id, name_id if name_id is not None else "")))
        if "DRIVER" in sym or key == "DRIVER":
            domain = "driver"
        elif "RUNTIME" in sym:
            domain = "runtime"
        else:
            domain = "runtime" if name.startswith("cuda") else "driver" if name.startswith("cu") else ""
        pid, tid = split_global_id(gtid)
        stream, ev = events.get((pid, corr), (None, None))
        sink.add(kind="api", name=name, domain=domain, pid=pid, tid=tid, start_ns=start, end_ns=end,
                 correlation=corr, stream=None if stream in (None, INVALID_ID) else stream,
                 event=None if ev in (None, INVALID_ID) else ev)
    if skipped:
        notes.append(f"{skipped:,} {table} rows of the CUDA backtrace event class skipped (each repeats a call "
                     "that has its own row)")


def _kernel_rows(con, path, tables, table, strings, sink, notes, tick) -> None:
    cols = _cols(con, table)
    _missing(notes, table, cols, ("correlationId", "streamId", "gridX", "blockX"),
             "those cells of every kernel are unknown (no launching call, stream or geometry)")
    name_col = next((c for c in ("demangledName", "shortName", "name", "mangledName") if c in cols), None)
    want = [name_col or "name", "deviceId", "streamId", "correlationId", "globalPid", "gridX", "gridY", "gridZ",
            "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory", "graphId", "graphNodeId"]
    q = f'select start, end, {_sel(cols, want)} from "{table}"'
    node_graph = _node_graphs(con, tables)
    lacks_graph = 0
    for r in timed_rows(con.execute(q), path, table):
        tick()
        (start, end, nm, dev, stream, corr, gpid, gx, gy, gz, bx, by, bz, ss, ds, gid, gnode) = r
        if gid is None and gnode == 0:
            gid = 0  # CUPTI: graphNodeId is 0 for a kernel not launched from a graph
        elif gid is None and gnode:
            gid = node_graph.get(gnode)
            if gid is None:
                lacks_graph += 1
        sh = (ss or 0) + (ds or 0) if (ss is not None or ds is not None) else None
        sink.add(kind="kernel", name=strings.get(nm, nm) if nm is not None else "", device=dev, stream=stream,
                 correlation=corr, pid=_gpid(gpid), start_ns=start, end_ns=end,
                 grid=f"{gx},{gy},{gz}" if gx is not None else "", block=f"{bx},{by},{bz}" if bx is not None else "",
                 shared_bytes=sh, graph_id=gid, graph_node_id=gnode)
    if lacks_graph:
        notes.append(f"{lacks_graph:,} kernels ran from a graph (graphNodeId set) but {table} has no graphId column "
                     "and no CUDA_GRAPH_NODE_EVENTS row names their graph: graph_id is -1 for them")


def _node_graphs(con, tables) -> dict:
    t = find_table(tables, "CUDA_GRAPH_NODE_EVENTS")
    if t and {"graphNodeId", "graphId"} <= set(_cols(con, t)):
        return {n: g for n, g in con.execute(f'select graphNodeId, graphId from "{t}"') if g is not None}
    return {}


def _memcpy_rows(con, path, tables, table, sink, notes, tick) -> None:
    cols = _cols(con, table)
    oper = _enum(con, tables, "ENUM_CUDA_MEMCPY_OPER")
    memk = _enum(con, tables, "ENUM_CUDA_MEM_KIND")
    if not memk and "srcKind" in cols:
        notes.append(f"{table}: the export has no ENUM_CUDA_MEM_KIND table, so whether a copy's host memory is "
                     "pageable or pinned is left unknown (srcKind/dstKind numbers are not documented without it)")
    want = ["deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind", "srcKind", "dstKind",
            "graphId", "graphNodeId"]
    for r in timed_rows(con.execute(f'select start, end, {_sel(cols, want)} from "{table}"'), path, table):
        tick()
        start, end, dev, stream, corr, gpid, nbytes, ck, sk, dk, gid, gnode = r
        gid = 0 if gid is None and gnode == 0 else gid
        kind = _copy_kind(oper[ck]) if oper and ck in oper else MEMCPY_KINDS.get(ck, "")
        src = _mem_label(memk[sk]) if memk and sk in memk else "Unknown"
        dst = _mem_label(memk[dk]) if memk and dk in memk else "Unknown"
        sink.add(kind="memcpy", name=copy_label(kind, src, dst), copy_kind=kind,
                 host_memory=host_memory(kind, src, dst) if memk else "", bytes=nbytes, device=dev, stream=stream,
                 correlation=corr, pid=_gpid(gpid), start_ns=start, end_ns=end, graph_id=gid, graph_node_id=gnode)


def _memset_rows(con, path, tables, table, sink, tick) -> None:
    cols = _cols(con, table)
    memk = _enum(con, tables, "ENUM_CUDA_MEM_KIND")
    want = ["deviceId", "streamId", "correlationId", "globalPid", "bytes", "memKind", "graphId", "graphNodeId"]
    for r in timed_rows(con.execute(f'select start, end, {_sel(cols, want)} from "{table}"'), path, table):
        tick()
        start, end, dev, stream, corr, gpid, nbytes, mk, gid, gnode = r
        gid = 0 if gid is None and gnode == 0 else gid
        label = _mem_label(memk[mk]) if memk and mk in memk else "Device"
        sink.add(kind="memset", name=memset_label(label), bytes=nbytes, device=dev, stream=stream, correlation=corr,
                 pid=_gpid(gpid), start_ns=start, end_ns=end, graph_id=gid, graph_node_id=gnode)


def _sync_rows(con, path, tables, table, sink, notes, tick) -> None:
    cols = _cols(con, table)
    _missing(notes, table, cols, ("syncType", "correlationId"), "what each synchronization waited on is unknown")
    sync = _enum(con, tables, "ENUM_CUPTI_SYNC_TYPE")
    want = ["deviceId", "streamId", "correlationId", "globalPid", "syncType", "eventId"]
    for r in timed_rows(con.execute(f'select start, end, {_sel(cols, want)} from "{table}"'), path, table):
        tick()
        start, end, dev, stream, corr, gpid, st, ev = r
        if sync and st in sync:
            m = re.search(r"TYPE_(\w+)$", sync[st])
            kind = {"EVENT_SYNCHRONIZE": "event", "STREAM_WAIT_EVENT": "stream_wait_event",
                    "STREAM_SYNCHRONIZE": "stream", "CONTEXT_SYNCHRONIZE": "context"}.get(m.group(1) if m else "", "")
        else:
            kind = SYNC_TYPES.get(st, "")
        sink.add(kind="sync", name=sync_label(kind), sync_kind=kind, device=dev,
                 stream=None if stream in (None, INVALID_ID) else stream, correlation=corr, pid=_gpid(gpid),
                 start_ns=start, end_ns=end, event=None if ev in (None, INVALID_ID) else ev)


def _graph_rows(con, path, table, sink, tick) -> None:
    cols = _cols(con, table)
    want = ["deviceId", "streamId", "correlationId", "globalPid", "graphId"]
    for r in timed_rows(con.execute(f'select start, end, {_sel(cols, want)} from "{table}"'), path, table):
        tick()
        start, end, dev, stream, corr, gpid, gid = r
        sink.add(kind="graph", name=f"graph {gid}" if gid is not None else "graph", device=dev, stream=stream,
                 correlation=corr, pid=_gpid(gpid), start_ns=start, end_ns=end, graph_id=gid)


def _nvtx_rows(con, path, tables, table, strings, sink, notes, tick) -> None:
    opt, q = _nvtx_cursor(con, table)
    etypes = _enum(con, tables, "ENUM_NSYS_EVENT_TYPE")
    create = _domain_create_type(con, tables)
    ranges = {i for i, n in etypes.items() if n in ("NvtxPushPopRange", "NvtxStartEndRange")} or {NVTX_PUSHPOP,
                                                                                                  NVTX_STARTEND}
    domains = _nvtx_domains(con, table, opt, strings, create)
    other = 0
    for start, end, text, tid_, dom, etype, gtid in timed_rows(con.execute(q), path, table, end_optional=True):
        tick()
        if etype is not None and etype not in ranges:
            other += etype != create
            continue
        if end is None:
            other += 1
            continue
        pid, tid = split_global_id(gtid)
        dname = "" if dom in (None, 0) else domains.get((pid, dom)) or domains.get((None, dom), f"domain {dom}")
        sink.add(kind="nvtx", name=text if text is not None else strings.get(tid_, ""), domain=dname, pid=pid,
                 tid=tid, start_ns=start, end_ns=end)
    if other:
        notes.append(f"{other:,} NVTX marks and other non-range NVTX events not tabled")


def _stream_types(con, tables, notes) -> dict:
    out: dict = {}
    t = "TARGET_INFO_CUDA_CONTEXT_INFO"
    if t in tables and {"nullStreamId", "processId"} <= set(_cols(con, t)):
        for sid, pid in con.execute(f'select nullStreamId, processId from "{t}"'):
            out[(int(pid), int(sid))] = "legacy"
    t = "TARGET_INFO_CUDA_STREAM"
    flags = _enum(con, tables, "ENUM_CUPTI_STREAM_TYPE")
    if t in tables and {"streamId", "flag"} <= set(_cols(con, t)):
        cols = _cols(con, t)
        pid_col = "processId" if "processId" in cols else "-1"
        unknown = 0
        for sid, pid, flag in con.execute(f'select streamId, {pid_col}, flag from "{t}"'):
            sym = flags.get(flag, "")
            typ = ("non_blocking" if "NON_BLOCKING" in sym else "legacy" if sym.endswith("NULL")
                   else "blocking" if sym.endswith("DEFAULT") else "")
            if typ:
                out.setdefault((int(pid), int(sid)), typ)
            else:
                unknown += 1
        if unknown:
            notes.append(f"{unknown} streams of {t} with a flag this export does not name (no ENUM_CUPTI_STREAM_TYPE): "
                         "blocking or non-blocking left unknown")
    return out


# ----------------------------------------------------------------------------- the event table
#: The CUDA tables whose absence makes an export useless to the audit.
CUDA_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
               "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def read_sqlite(path: Path, progress=None):
    """The :class:`~ds4lab.trace.events.EventTable` of an export (``tool`` names its schema and version). Raises
    SourceError: unreadable, no CUDA table (naming its tables and the ``nsys profile --trace=cuda`` that records
    them), or a row whose times are not numbers."""
    from ..events import EventTable
    from ..table import Rows, finish

    path = Path(path)
    rows = Rows()
    bar = {}

    def prog(done, total):
        if progress is None:
            return
        if "p" not in bar:
            bar["p"] = Progress(progress, f"reading {path.name}", total).__enter__()
        bar["p"].to(done)

    try:
        info = read_events(path, rows, prog)
    except sqlite3.Error as e:
        raise SourceError(f"{path}: unreadable SQLite database ({e})") from None
    finally:
        if "p" in bar:
            bar["p"].__exit__(None, None, None)
    if not any(t for t in info["tables"] if t.startswith("CUPTI_ACTIVITY_KIND_")):
        have = [t for t in info["all_tables"] if not t.startswith(("ENUM_", "sqlite_"))]
        raise SourceError(f"{path}: an Nsight Systems export without CUDA tables (no "
                          f"{', '.join(CUDA_TABLES)}); it holds {', '.join(have[:14]) or 'no table'}"
                          f"{' …' if len(have) > 14 else ''}. Profile with nsys profile --trace=cuda,nvtx")
    notes = list(info["notes"])
    df = finish(rows.frame(), info["stream_types"], source=path, notes=notes)
    graphs = df[df.kind == "graph"]
    if len(graphs):
        k = df[df.kind == "kernel"]
        if not ((k.graph_id > 0) | (k.graph_node_id > 0)).any():
            notes.append(f"{len(graphs):,} whole-graph executions and no kernel launched from a graph: {GRAPH_FIX}")
    return EventTable(df, str(path), f"nsys-sqlite ({info['version']})", notes)
