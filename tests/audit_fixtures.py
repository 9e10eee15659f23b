"""Synthetic traces of a small decode loop, written in the published formats the audit reads.

One decode loop, three views of it:

* a PyTorch profiler / Kineto Chrome trace (libkineto ``output_json.cpp``: host events with the process
  and thread ids, device events with ``pid`` = device and ``tid`` = stream; categories ``cuda_runtime``,
  ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_sync``, ``cuda_event``, ``user_annotation``,
  ``gpu_user_annotation``, ``cpu_op``, ``python_function``, flow events ``ac2g``), with or without
  ``with_stack`` frames, plain or gzip;
* Nsight Systems SQLite exports of three schema generations (:data:`GENERATIONS`), built from the
  published schema text: 2020 (no ``ENUM_*`` tables, no ``eventClass``, no graph columns, no
  ``META_DATA_EXPORT``), 2024.6 (schema 3.16: ``ENUM_*`` tables, ``callchainId``, ``graphNodeId``,
  ``META_DATA_EXPORT``, ``CUDA_EVENT``, ``GRAPH_TRACE``, ``TARGET_INFO_CUDA_*``) and 2026.1 (schema
  3.24: ``greenContextId``, backtrace rows of ``ENUM_NSYS_EVENT_CLASS`` 67, rows not in time order,
  two processes).

The loop, per token ``t`` (times in ns from ``T0 + t * TOKEN_NS``): an NVTX / ``record_function``
range ``decode_step`` around ``K`` kernel launches (``cudaLaunchKernel`` → kernel ``k<i>`` on stream 7,
grid ``(i+1, 1, 1)``), one pageable ``cudaMemcpyAsync`` host-to-device of 4 bytes, one
``cudaMemsetAsync``, one ``cudaEventRecord``, and a ``cudaStreamSynchronize``; token 0 also calls
``cudaMalloc``. Python frames (with stacks): ``gen.py(10): generate`` → ``model.py(20): forward`` →
``layer.py(30): step`` around the launches, ``<built-in method item of Tensor object at 0x7f...>``
around the sync.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

PID, TID, DEVICE, STREAM = 4242, 4243, 0, 7
K = 4
T0, TOKEN_NS = 1_000_000, 200_000
GENERATIONS = ("2020", "2024", "2026")


def loop(tokens: int = 3):
    """The loop's calls: dicts with name, start, end, corr, and the device work (kind, start, end, ...)."""
    out, corr = [], 100
    for t in range(tokens):
        base = T0 + t * TOKEN_NS
        tok = {"token": t, "start": base, "end": base + 150_000, "calls": []}
        at = base + 1000
        if t == 0:
            tok["calls"].append({"name": "cudaMalloc", "start": at, "end": at + 8000, "corr": corr, "dev": None})
            corr, at = corr + 1, at + 9000
        for i in range(K):
            tok["calls"].append({"name": "cudaLaunchKernel", "start": at, "end": at + 5000, "corr": corr,
                                 "dev": ("kernel", at + 6000, at + 9000, {"name": f"k{i}", "grid": (i + 1, 1, 1),
                                                                          "block": (128, 1, 1)})})
            corr, at = corr + 1, at + 10_000
        tok["calls"].append({"name": "cudaMemcpyAsync", "start": at, "end": at + 4000, "corr": corr,
                             "dev": ("memcpy", at + 5000, at + 6000, {"bytes": 4})})
        corr, at = corr + 1, at + 10_000
        tok["calls"].append({"name": "cudaMemsetAsync", "start": at, "end": at + 3000, "corr": corr,
                             "dev": ("memset", at + 4000, at + 4500, {"bytes": 64})})
        corr, at = corr + 1, at + 10_000
        tok["calls"].append({"name": "cudaEventRecord", "start": at, "end": at + 2000, "corr": corr,
                             "dev": ("cuda_event", at + 2000, at + 2000, {"event": 5})})
        corr, at = corr + 1, at + 10_000
        tok["calls"].append({"name": "cudaStreamSynchronize", "start": at, "end": at + 20_000, "corr": corr,
                             "dev": ("sync", at + 1000, at + 19_000, {})})
        corr += 1
        out.append(tok)
    return out


# ----------------------------------------------------------------------------- Kineto
def _x(cat, name, pid, tid, start, end, args=None):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(start / 1000, 3),
         "dur": round((end - start) / 1000, 3)}
    if args is not None:
        e["args"] = args
    return e


def kineto_events(tokens: int = 3, with_stack: bool = True) -> list[dict]:
    """The loop as Kineto trace events (in the order Kineto writes them: host, then device)."""
    host, dev = [], []
    for tok in loop(tokens):
        host.append(_x("user_annotation", "decode_step", PID, TID, tok["start"], tok["end"],
                       {"External id": 1, "Record function id": 0}))
        if with_stack:
            host.append(_x("python_function", "gen.py(10): generate", PID, TID, tok["start"] - 500, tok["end"] + 500,
                           {"Python id": 1, "Python parent id": None}))
            launches = [c for c in tok["calls"] if c["name"] == "cudaLaunchKernel"]
            host.append(_x("python_function", "model.py(20): forward", PID, TID, launches[0]["start"] - 100,
                           launches[-1]["end"] + 100, {"Python id": 2, "Python parent id": 1}))
            for c in launches:
                host.append(_x("python_function", "layer.py(30): step", PID, TID, c["start"] - 50, c["end"] + 50))
            sync = tok["calls"][-1]
            host.append(_x("python_function", "<built-in method item of Tensor object at 0x7f3a9c0d1e20>", PID, TID,
                           sync["start"] - 50, sync["end"] + 50))
        for c in tok["calls"]:
            host.append(_x("cpu_op", "aten::op", PID, TID, c["start"] - 20, c["end"] + 20, {"External id": 7}))
            host.append(_x("cuda_runtime", c["name"], PID, TID, c["start"], c["end"],
                           {"cbid": 211, "correlation": c["corr"]}))
            d = c["dev"]
            if d is None:
                continue
            kind, s, e, a = d
            common = {"device": DEVICE, "context": 1, "stream": STREAM, "correlation": c["corr"]}
            if kind == "kernel":
                dev.append(_x("kernel", a["name"], DEVICE, STREAM, s, e,
                              {**common, "grid": list(a["grid"]), "block": list(a["block"]), "shared memory": 0,
                               "registers per thread": 32, "graph id": 0, "graph node id": 0}))
                dev.append({"ph": "f", "id": c["corr"], "pid": DEVICE, "tid": STREAM, "ts": s / 1000, "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})
            elif kind == "memcpy":
                dev.append(_x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", DEVICE, STREAM, s, e,
                              {**common, "bytes": a["bytes"], "memory bandwidth (GB/s)": 0.004}))
            elif kind == "memset":
                dev.append(_x("gpu_memset", "Memset (Device)", DEVICE, STREAM, s, e, {**common, "bytes": a["bytes"]}))
            elif kind == "cuda_event":
                dev.append(_x("cuda_event", "cudaEvent", DEVICE, STREAM, s, e,
                              {"event_id": a["event"], "stream": STREAM, "correlation": c["corr"], "device": DEVICE}))
            elif kind == "sync":
                dev.append(_x("cuda_sync", "Stream Sync", DEVICE, STREAM + 0x40000000, s, e,
                              {"cuda_sync_kind": "Stream Sync", "stream": STREAM, "correlation": c["corr"],
                               "device": DEVICE, "context": 1}))
        dev.append(_x("gpu_user_annotation", "decode_step", DEVICE, STREAM, tok["start"] + 6000, tok["end"]))
    meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "python"}},
            {"name": "process_name", "ph": "M", "ts": 0, "pid": DEVICE, "tid": 0, "args": {"name": "python"}}]
    return meta + host + dev


def write_kineto(path: Path, tokens: int = 3, with_stack: bool = True) -> Path:
    """A Kineto trace file (gzip when ``path`` ends in ``.gz``), metadata first as Kineto writes it."""
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "cupti_version": 24,
           "cuda_runtime_version": 13000, "with_stack": int(with_stack), "displayTimeUnit": "ms",
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": kineto_events(tokens, with_stack),
           "traceName": str(path)}
    text = json.dumps(doc, indent=1).encode()
    path = Path(path)
    if path.name.endswith(".gz"):
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(text)
    else:
        path.write_bytes(text)
    return path


# ----------------------------------------------------------------------------- Nsight Systems SQLite
_DDL = {
    "2020": """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL, globalTid INT, correlationId INT,
  nameId INT NOT NULL, returnValue INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
  contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT, globalPid INT, demangledName INT NOT NULL,
  shortName INT NOT NULL, launchType INT, cacheConfig INT, registersPerThread INT NOT NULL, gridX INT NOT NULL,
  gridY INT NOT NULL, gridZ INT NOT NULL, blockX INT NOT NULL, blockY INT NOT NULL, blockZ INT NOT NULL,
  staticSharedMemory INT NOT NULL, dynamicSharedMemory INT NOT NULL, localMemoryPerThread INT NOT NULL,
  localMemoryTotal INT NOT NULL, gridId INT NOT NULL, sharedMemoryExecuted INT);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
  contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT, globalPid INT, bytes INT NOT NULL,
  copyKind INT NOT NULL, deprecatedSrcId INT, srcKind INT, dstKind INT, srcDeviceId INT, srcContextId INT,
  dstDeviceId INT, dstContextId INT);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
  contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT, globalPid INT, value INT NOT NULL,
  bytes INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
  contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT, globalPid INT, syncType INT NOT NULL,
  eventId INT NOT NULL);
CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT,
  color INT, text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT, uint64Value INT,
  int64Value INT, doubleValue REAL, uint32Value INT, int32Value INT, floatValue REAL, jsonTextId INT,
  jsonText TEXT);
""",
    "2024": """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
  launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL,
  gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
  blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
  localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
  sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER,
  dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER,
  migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL,
  callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_CUDA_EVENT (timestamp INTEGER, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, eventId INTEGER NOT NULL, eventSyncId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
CREATE TABLE TARGET_INFO_CUDA_CONTEXT_INFO (nullStreamId INTEGER NOT NULL, hwId INTEGER NOT NULL,
  vmId INTEGER NOT NULL, processId INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
  parentContextId INTEGER, isGreenContext INTEGER);
CREATE TABLE TARGET_INFO_CUDA_STREAM (streamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL,
  processId INTEGER NOT NULL, contextId INTEGER NOT NULL, priority INTEGER NOT NULL, flag INTEGER NOT NULL);
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_NSYS_EVENT_CLASS (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUPTI_STREAM_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES(0,'CUDA_MEMCPY_KIND_UNKNOWN','Unknown');
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES(1,'CUDA_MEMCPY_KIND_HTOD','Host-to-Device');
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES(2,'CUDA_MEMCPY_KIND_DTOH','Device-to-Host');
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES(8,'CUDA_MEMCPY_KIND_DTOD','Device-to-Device');
INSERT INTO ENUM_CUDA_MEM_KIND VALUES(0,'CUDA_MEMOPR_MEMORY_KIND_PAGEABLE','Pageable');
INSERT INTO ENUM_CUDA_MEM_KIND VALUES(1,'CUDA_MEMOPR_MEMORY_KIND_PINNED','Pinned');
INSERT INTO ENUM_CUDA_MEM_KIND VALUES(2,'CUDA_MEMOPR_MEMORY_KIND_DEVICE','Device');
INSERT INTO ENUM_CUDA_MEM_KIND VALUES(4,'CUDA_MEMOPR_MEMORY_KIND_MANAGED','Managed');
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES(0,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN','Unknown');
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES(1,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE','Event sync');
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES(2,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT','Stream wait sync');
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES(3,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE','Stream sync');
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES(4,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE','Context sync');
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES(34,'NvtxMark','NvtxMark');
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES(59,'NvtxPushPopRange','NvtxPushPopRange');
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES(60,'NvtxStartEndRange','NvtxStartEndRange');
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES(75,'NvtxDomainCreate','NvtxDomainCreate');
INSERT INTO ENUM_NSYS_EVENT_CLASS VALUES(0,'TRACE_PROCESS_EVENT_CUDA_RUNTIME','CUDA runtime');
INSERT INTO ENUM_NSYS_EVENT_CLASS VALUES(1,'TRACE_PROCESS_EVENT_CUDA_DRIVER','CUDA driver');
INSERT INTO ENUM_NSYS_EVENT_CLASS VALUES(67,'TRACE_PROCESS_EVENT_CUDABACKTRACE','CUDA backtrace');
INSERT INTO ENUM_CUPTI_STREAM_TYPE VALUES(1,'CUPTI_ACTIVITY_STREAM_CREATE_FLAG_DEFAULT','Default');
INSERT INTO ENUM_CUPTI_STREAM_TYPE VALUES(2,'CUPTI_ACTIVITY_STREAM_CREATE_FLAG_NON_BLOCKING','Non-blocking');
INSERT INTO ENUM_CUPTI_STREAM_TYPE VALUES(3,'CUPTI_ACTIVITY_STREAM_CREATE_FLAG_NULL','Null');
""",
}
_DDL["2026"] = _DDL["2024"]
VERSIONS = {"2024": ("3.16.1", "2024.6.2.225"), "2026": ("3.24.14", "2026.1.1.204")}
NVTX_DOMAIN_ID = 3


def write_nsys(path: Path, generation: str, tokens: int = 3, processes=(PID,)) -> Path:
    """An Nsight Systems SQLite export of the loop in schema ``generation`` (:data:`GENERATIONS`);
    each process in ``processes`` runs the whole loop (on its own thread, device ``index``)."""
    path = Path(path)
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    con.executescript(_DDL[generation])
    strings: dict[str, int] = {}

    def sid(s):
        if s not in strings:
            strings[s] = len(strings) + 1
            con.execute("insert into StringIds values (?, ?)", (strings[s], s))
        return strings[s]

    new = generation != "2020"
    if new:
        ver = VERSIONS[generation]
        con.executemany("insert into META_DATA_EXPORT values (?, ?)",
                        [("EXPORT_SCHEMA_VERSION", ver[0]), ("EXPORT_PRODUCT_VERSION", ver[1])])
    rows: dict[str, list] = {}
    for dev, pid in enumerate(processes):
        gtid, gpid = (pid << 24) | (pid + 1), pid << 24
        if new:
            rows.setdefault("ctx", []).append((STREAM, 0, 0, pid, dev, 1, None, 0))
            rows.setdefault("streams", []).append((13, 0, 0, pid, 1, 0, 2))
        rows.setdefault("nvtx", []).append((0, None, 75, None, None, None, "llm", gtid, None, None, NVTX_DOMAIN_ID)
                                           + (None,) * 8 + ((None,) if new else ()))
        rows["nvtx"].append((T0 - 10, T0 - 10, 34, None, None, None, "mark", gtid, None, None, 0)
                            + (None,) * 8 + ((None,) if new else ()))
        for tok in loop(tokens):
            rows["nvtx"].append((tok["start"], tok["end"], 59, None, None, None, "decode_step", gtid, None, None,
                                 NVTX_DOMAIN_ID) + (None,) * 8 + ((None,) if new else ()))
            for c in tok["calls"]:
                name = {"cudaLaunchKernel": "cudaLaunchKernel_v7000", "cudaMalloc": "cudaMalloc_v3020"}.get(
                    c["name"], c["name"] + "_v3020")
                if new:
                    rows.setdefault("api", []).append((c["start"], c["end"], 0, gtid, c["corr"], sid(name), 0, None))
                    if generation == "2026" and c["name"] == "cudaStreamSynchronize":
                        rows["api"].append((c["start"] - 1, c["end"] + 1, 67, gtid, c["corr"], sid(name), 0, None))
                else:
                    rows.setdefault("api", []).append((c["start"], c["end"], gtid, c["corr"], sid(name), 0))
                d = c["dev"]
                if d is None:
                    continue
                kind, s, e, a = d
                if kind == "kernel":
                    nm = sid(a["name"])
                    gx, gy, gz = a["grid"]
                    bx, by, bz = a["block"]
                    if new:
                        rows.setdefault("kernel", []).append((s, e, dev, 1, None, STREAM, c["corr"], gpid, nm, nm,
                                                              None, 0, 0, 32, gx, gy, gz, bx, by, bz, 0, 128, 0, 0,
                                                              1, 0, 0, 0))
                    else:
                        rows.setdefault("kernel", []).append((s, e, dev, 1, STREAM, c["corr"], gpid, nm, nm, 0, 0, 32,
                                                              gx, gy, gz, bx, by, bz, 0, 128, 0, 0, 1, 0))
                elif kind == "memcpy":
                    if new:
                        rows.setdefault("memcpy", []).append((s, e, dev, 1, None, STREAM, c["corr"], gpid, a["bytes"],
                                                              1, None, 0, 2, dev, 1, dev, 1, None, 0, None))
                    else:
                        rows.setdefault("memcpy", []).append((s, e, dev, 1, STREAM, c["corr"], gpid, a["bytes"], 1,
                                                              None, 1, 3, dev, 1, dev, 1))
                elif kind == "memset":
                    if new:
                        rows.setdefault("memset", []).append((s, e, dev, 1, None, STREAM, c["corr"], gpid, 0,
                                                              a["bytes"], 0, 2))
                    else:
                        rows.setdefault("memset", []).append((s, e, dev, 1, STREAM, c["corr"], gpid, 0, a["bytes"]))
                elif kind == "cuda_event":
                    if new:
                        rows.setdefault("event", []).append((s, dev, 1, None, STREAM, c["corr"], gpid, a["event"],
                                                             None))
                elif kind == "sync":
                    if new:
                        rows.setdefault("sync", []).append((s, e, dev, 1, None, STREAM, c["corr"], gpid, 3,
                                                            0xFFFFFFFF))
                    else:
                        rows.setdefault("sync", []).append((s, e, dev, 1, STREAM, c["corr"], gpid, 3, 0xFFFFFFFF))
        if new:
            g0 = T0 + tokens * TOKEN_NS
            rows.setdefault("graph", []).append((g0, g0 + 5000, dev, 1, None, 13, 9999, gpid, 1, 1))
    if generation == "2026":  # Nsight Systems 2025.6 on: rows are no longer written in time order
        for v in rows.values():
            v.reverse()
    ins = {"api": "CUPTI_ACTIVITY_KIND_RUNTIME", "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
           "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY", "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
           "sync": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "nvtx": "NVTX_EVENTS",
           "event": "CUPTI_ACTIVITY_KIND_CUDA_EVENT", "graph": "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
           "ctx": "TARGET_INFO_CUDA_CONTEXT_INFO", "streams": "TARGET_INFO_CUDA_STREAM"}
    for k, v in rows.items():
        if v:
            con.executemany(f"insert into {ins[k]} values ({','.join('?' * len(v[0]))})", v)
    con.commit()
    con.close()
    return path


def write_all(folder: Path) -> list[Path]:
    """Every committed fixture into ``folder`` (what ``tests/data/audit/`` holds)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = [write_kineto(folder / "kineto_stack.json"), write_kineto(folder / "kineto_nostack.json", with_stack=False),
           write_kineto(folder / "kineto_stack.json.gz")]
    for g in GENERATIONS:
        out.append(write_nsys(folder / f"nsys_{g}.sqlite", g, processes=(PID, PID + 100) if g == "2026" else (PID,)))
    return out


if __name__ == "__main__":
    import sys

    for p in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "data" / "audit")):
        print(p, p.stat().st_size)
