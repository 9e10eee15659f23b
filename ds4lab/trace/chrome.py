"""ds4lab's own trace as a Chrome/Perfetto trace: the Trace Event JSON ``ds4lab trace`` writes (:func:`chrome_trace`)
and checks back (:func:`load_trace`); :mod:`ds4lab.trace.sources.kineto` reads it into the event table. Complete
events ``X`` (``ts``, ``dur`` in µs) and metadata events ``M``, one process per stage starting at 0 µs (its
offset in ``otherData.clock_offset_ns``), as ``torch.profiler`` exports. Source: "Trace Event Format" (Google,
the document chrome://tracing and Perfetto read)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .sources.common import SourceError

HOST_TID = 1
API_TID = 2
GPU_TID0 = 100
#: Columns of the API table (one row per CUDA API call or synchronization of the traced tokens).
API_COLUMNS = ["stage", "kind", "name", "domain", "tid", "start_ns", "end_ns", "stream", "stream_type", "correlation",
               "event", "sync_kind"]
#: ``otherData`` keys copied from the trace's meta.
OTHER_DATA = ("ds4lab", "git_revision", "timestamp", "backend", "device", "driver", "cupy", "modeled", "calibration",
              "kernel_source", "nvtx_source", "api_source", "stages", "tokens", "clock_offset_ns", "sites_matched",
              "hazard")


def _opt(v):
    """A table cell as a JSON value: None for a missing one (NaN), ints as ints."""
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def chrome_trace(kern: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, api: pd.DataFrame | None = None, *,
                 processes: dict | None = None, tag: str | None = None) -> dict:
    """The Trace Event JSON object of a trace's tables: one process per stage (in ``meta["stages"]`` order, named
    ``processes[stage]`` or ``stage <name> (<tag>)``), a host thread of NVTX ranges, one of CUDA API calls
    (``cuda_runtime``/``cuda_driver``), one GPU thread per stream (kernels, memsets, copies, ``cuda_sync``); kernel
    ``args`` carry site, cluster, layer, graph and node ids, stream, correlation, scalars and ``modeled``.
    ``otherData`` comes first, for a streaming reader."""
    modeled = bool(meta.get("modeled"))
    tag = tag or ("MODELED" if modeled else "measured")
    processes = processes or {}
    api = api if api is not None else pd.DataFrame(columns=API_COLUMNS)
    ev: list[dict] = []
    for pid, name in enumerate(meta["stages"], 1):
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": processes.get(name, f"stage {name} ({tag})")}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": HOST_TID,
                   "args": {"name": "host: NVTX ranges (ds4lab)" + (" MODELED" if modeled else "")}})
        k = kern[kern.stage == name] if not kern.empty else kern
        a = api[api.stage == name] if not api.empty else api
        calls, syncs = (a[a.kind == "api"], a[a.kind == "sync"]) if not a.empty else (a, a)
        streams = list(dict.fromkeys(k["stream"])) if not k.empty else []
        tids = {s: GPU_TID0 + i for i, s in enumerate(streams)}
        for s, tid in tids.items():
            ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"GPU stream {s}" + (" (MODELED)" if modeled else "")}})
        if len(calls):
            ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": API_TID,
                       "args": {"name": "host: CUDA API" + (" (sim call log, MODELED)" if modeled else " (CUPTI)")}})
        n = nvtx[nvtx.stage == name] if not nvtx.empty else nvtx
        for r in n.itertuples():
            ev.append({"name": r.name, "cat": "nvtx", "ph": "X", "ts": float(r.start_us), "dur": float(r.dur_us),
                       "pid": pid, "tid": HOST_TID,
                       "args": {"cluster": r.cluster, "payload": None if pd.isna(r.payload) else int(r.payload),
                                "depth": int(r.depth), "modeled": modeled}})
        for r in calls.itertuples():
            ev.append({"name": r.name, "cat": f"cuda_{r.domain or 'runtime'}", "ph": "X", "ts": float(r.start_us),
                       "dur": float(r.dur_us), "pid": pid, "tid": API_TID,
                       "args": {"correlation": _opt(r.correlation), "stream": _opt(r.stream), "event": _opt(r.event),
                                "stream_type": _opt(r.stream_type) or "", "modeled": modeled}})
        for r in syncs.itertuples():
            ev.append({"name": r.sync_kind, "cat": "cuda_sync", "ph": "X", "ts": float(r.start_us),
                       "dur": float(r.dur_us), "pid": pid, "tid": API_TID + 1,
                       "args": {"sync_kind": r.sync_kind, "correlation": _opt(r.correlation), "stream": _opt(r.stream),
                                "event": _opt(r.event), "modeled": modeled}})
        for r in k.itertuples():
            args = {"stream": str(r.stream), "graph_id": int(r.graph_id), "graph_node_id": int(r.graph_node_id),
                    "modeled": modeled}
            for c in ("site", "cluster", "layer", "token", "correlation", "stream_id", "stream_type", "args", "device",
                      "copy_kind", "host_memory", "bytes"):
                v = getattr(r, c, None)
                if v is not None and not (isinstance(v, float) and pd.isna(v)):
                    args[c] = int(v) if c in ("layer", "token", "correlation", "stream_id", "device", "bytes") else v
            ev.append({"name": r.name, "cat": r.kind, "ph": "X", "ts": float(r.start_us), "dur": float(r.dur_us),
                       "pid": pid, "tid": tids[r.stream], "args": args})
    other = {k: meta.get(k) for k in OTHER_DATA if k in meta}
    other["preset"] = meta.get("preset", {}).get("name") if isinstance(meta.get("preset"), dict) else meta.get("preset")
    other["provenance"] = tag
    return {"otherData": other, "displayTimeUnit": "ns", "traceEvents": ev}


def load_trace(path: Path) -> dict:
    """A ``trace.json`` (or a folder holding one) read and checked as Trace Event JSON (``traceEvents`` with
    ``name``, ``ph``, ``pid``, and numeric ``ts``, ``dur`` ≥ 0 for ``X``). Raises SourceError naming the first bad
    event."""
    p = Path(path)
    if p.is_dir():
        p = p / "trace.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SourceError(f"{p}: not readable as JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SourceError(f"{p}: no traceEvents list")
    for i, e in enumerate(data["traceEvents"]):
        if not isinstance(e, dict) or not {"name", "ph", "pid"} <= set(e):
            raise SourceError(f"{p}: traceEvents[{i}] lacks name, ph or pid: {str(e)[:120]}")
        if e["ph"] == "X" and not (isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
                                   and e["dur"] >= 0):
            raise SourceError(f"{p}: traceEvents[{i}] is a complete event without numeric ts and dur ≥ 0")
    return data

