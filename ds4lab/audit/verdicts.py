"""Per token and per call, what each capture mode would do with it: :func:`token_calls` classifies every call of a
token against its main stream (the one captured), :func:`findings` folds them into findings with each mode's
verdict from the sim's rules (:mod:`ds4lab.audit.probes`), :func:`token_outcomes` per token. The model of a
capture: docs/audit.md, "Calls and variation"."""

from __future__ import annotations

import pandas as pd

from ..capture.stream import CAPTURE_MODES
from ..sim.rules import RULES
from ..trace.records import api_base_name
from .calls import TokenContext, classify
from .probes import ALLOWED, NO_RULE, VERDICTS, has_probe, probe
from .where import where

#: What each finding class asks the engine to change (the fixes the context file's hazard table gives).
FIXES = {
    "capture_status": "the step asks whether the stream captures (torch.cuda.is_current_stream_capturing, "
                      "cudaStreamIsCapturing): under capture it may run other work than this trace shows "
                      "(transformers' is_tracing builds the attention mask the eager step skips): `ds4lab audit "
                      "run` records that path too (capture-path.csv.gz) and models the graph plans on it; from "
                      "another recorder the plans model the path recorded here; check_replay counts the "
                      "captured graph's kernels",
    "kernel@legacy": "launch on the current stream (the one being captured), not the legacy stream",
    "kernel@other": "launch on the captured stream, or make this stream join the capture (event record + "
                    "cudaStreamWaitEvent) and join back before the capture ends",
    "memset_sync": "cudaMemsetAsync on the current stream",
    "memset_async": "cudaMemsetAsync on the current stream (the one being captured)",
    "memcpy_async": "copy on the current stream (the one being captured)",
    "malloc_async": "allocate on the captured stream, or before the capture",
    "free_async": "free on the captured stream, or after the capture",
    "wait_event": "record the event on a captured stream and wait on it from a stream that may join the capture",
    "stream_query": "do not query the captured stream while capturing (check cudaStreamIsCapturing first)",
    "host_register": "register host memory before the capture",
    "host_unregister": "unregister host memory after the capture",
    "free_host": "free pinned host memory after the capture",
    "memcpy_sync": "cudaMemcpyAsync on the current stream from a pinned, preallocated host buffer written before "
                   "each replay (or keep the value on the device)",
    "malloc": "allocate before the capture (a preallocated pool, or cudaMallocAsync on the captured stream)",
    "free": "free after the capture, or cudaFreeAsync on the captured stream",
    "host_alloc": "allocate pinned host memory before the capture",
    "stream_sync": "move the synchronize out of the captured region (synchronize after the graph launch)",
    "device_sync": "move the device synchronize out of the captured region",
    "event_sync": "do not host-time while capturing: time between graph launches, or record events inside the "
                  "graph (cudaEventRecordWithFlags external)",
    "event_query": "do not query events recorded in the capture; skip host-side profiling while capturing",
    "event_elapsed": "read elapsed times after the replay, from events recorded outside the graph or external "
                     "event nodes",
    "event_record": "record on the captured stream (cudaEventRecordWithFlags external for a timing point)",
    "wait_event.outside": "record the awaited event inside the capture, or wait with cudaEventWaitExternal",
    "graph_launch": "capture the work instead of launching a graph into the capture (or add it as a child graph)",
    "other_thread": "give the other thread relaxed interaction mode (cudaThreadExchangeStreamCaptureMode) or capture "
                    "in thread-local mode",
    "cublas_create": "create the cuBLAS handle and set its workspace (cublasSetWorkspace) before the capture",
    "memcpy_async.h2d": "keep the host buffer alive and write it before each replay (pinned, preallocated), or "
                       "keep the value on the device",
    "memcpy_async.d2h": "read the host buffer only after the replay has run (synchronize after the graph launch)",
    "no rule": "no rule covers this call: check it by hand (or add a rule and a conformance scenario)",
}


def fix_for(key: str | None) -> str:
    """The fix text for call class ``key``: its own entry in :data:`FIXES`, else that of the class without its stream
    (``@…``), else of its shorter dotted prefixes; "" when none applies."""
    if key is None:
        return FIXES["no rule"]
    if key.startswith("other_thread."):
        return FIXES["other_thread"]
    if key in FIXES:
        return FIXES[key]
    base = key.split("@")[0]
    while base:
        if base in FIXES:
            return FIXES[base]
        base = base.rpartition(".")[0]
    return ""


def capture_stream(frame: pd.DataFrame, token: pd.Series) -> tuple[int, str]:
    """The tokens' main stream and why: the stream most of their kernels run on."""
    k = frame[(frame["kind"] == "kernel") & (token >= 0)]
    counts = k["stream"].value_counts()
    s = int(counts.index[0])
    return s, (f"stream {s}: {counts.iloc[0] / counts.sum():.0%} of the tokens' kernels run there "
               f"({len(counts)} stream(s) in all)")


def token_calls(frame: pd.DataFrame, token: pd.Series, capture: int, legacy: frozenset, main_tid: int,
                notes: list) -> pd.DataFrame:
    """Every call inside a token, classified: ``row``, ``token``, ``name``, ``api``, ``klass`` (None: no rule),
    ``tid``, ``stream``, ``start_ns``, ``end_ns``, ``where``, ``pseudo`` (made up from a device row)."""
    f = frame.assign(token=token)
    api = f[(f["kind"] == "api") & (f["token"] >= 0)]
    pseudo = False
    if api.empty:
        dev = f[f["kind"].isin(("kernel", "memcpy", "memset")) & (f["token"] >= 0)]
        if dev.empty:
            return _empty_calls()
        pseudo = True
        names = dev["kind"].map({"kernel": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync",
                                 "memset": "cudaMemsetAsync"})
        api = dev.assign(name=names, tid=main_tid)
        notes.append("these tokens' device rows are linked to no API call (this unit holds no API calls): one launch "
                     "per device row is assumed, on the row's stream (synchronizations, allocations and host reads "
                     "cannot be seen)")
    api = api.sort_values(["token", "start_ns"], kind="stable")
    classes = []
    assumptions: set = set()
    for tok, g in api.groupby("token", sort=True):
        ctx = TokenContext(capture, legacy, main_tid)
        for name, stream, tid, event, ck, hm in zip(g["name"], g["stream"], g["tid"], g["event"], g["copy_kind"],
                                                    g["host_memory"]):
            classes.append(classify(name, int(stream), int(tid), int(event), ck, hm, ctx))
        assumptions |= ctx.assumptions
    notes.extend(sorted(assumptions))
    return pd.DataFrame({"row": api.index.to_numpy(), "token": api["token"].to_numpy(), "name": api["name"].to_numpy(),
                         "api": api["name"].map(api_base_name).to_numpy(), "klass": classes, "tid": api["tid"].to_numpy(),
                         "stream": api["stream"].to_numpy(), "start_ns": api["start_ns"].to_numpy(),
                         "end_ns": api["end_ns"].to_numpy(),
                         "where": [where(s, p) for s, p in zip(api["stack"], api["nvtx_path"])],
                         "pseudo": pseudo})


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in ("row", "token", "name", "api", "klass", "tid", "stream", "start_ns",
                                         "end_ns", "where", "pseudo")})


def add_verdicts(calls: pd.DataFrame, modes=CAPTURE_MODES) -> pd.DataFrame:
    """``calls`` with ``verdict_<mode>`` and ``rule_<mode>`` for every mode (probes cached per class)."""
    out = calls.copy()
    keys = out["klass"].fillna("")
    for m in modes:
        got = {k: probe(k, m) for k in set(keys) if has_probe(k or None)}
        for col, of, none in (("verdict", lambda p: p.verdict, NO_RULE), ("rule", lambda p: p.rule, ""),
                              ("error", lambda p: p.error or "", "")):
            table = {k: (of(got[k]) if k in got else none) for k in set(keys)}
            out[f"{col}_{m}"] = keys.map(table)
    return out


def _caution(klass) -> bool:
    """A call every mode allows that the user should see: a host copy on the captured stream, a capture-status query."""
    return isinstance(klass, str) and (klass.startswith(("memcpy_async.h2d", "memcpy_async.d2h"))
                                       or klass == "capture_status")


def findings(calls: pd.DataFrame, modes=CAPTURE_MODES) -> pd.DataFrame:
    """One row per (call class, API, place) not *allowed* in some mode, or :func:`_caution`: ``kind``, ``name``,
    ``call_class``, ``verdict_<mode>``, ``rule_<mode>``, ``error_<mode>``, ``rule_source``, ``where``, ``count``,
    ``tokens``, ``token_range``, ``fix``, ``severity`` (index in :data:`VERDICTS` of the worst)."""
    if calls.empty:
        return pd.DataFrame()
    vcols = [f"verdict_{m}" for m in modes]
    bad = (calls[vcols] != ALLOWED).any(axis=1) | calls["klass"].map(_caution)
    sel = calls[bad].copy()
    sel["klass"] = sel["klass"].fillna("")
    rows = []
    for (klass, api, place), g in sel.groupby(["klass", "api", "where"], sort=False):
        first = g.iloc[0]
        worst = min(VERDICTS.index(first[c]) for c in vcols)
        kind = ("no rule" if not klass else "call" if worst != VERDICTS.index(ALLOWED)
                else "capture path" if klass == "capture_status" else "host data")
        rule_keys = sorted({first[f"rule_{m}"] for m in modes if first[f"rule_{m}"]})
        toks = sorted(set(int(t) for t in g["token"]))
        row = {"kind": kind, "name": api, "call_class": klass or "(none)", "where": place, "count": len(g),
               "tokens": len(toks), "token_range": compact_ranges(toks), "severity": worst,
               "rule_source": " | ".join(f"{k}: {RULES[k].source}" for k in rule_keys),
               "rule_guess": any("GUESS" in RULES[k].source for k in rule_keys),
               "fix": fix_for(klass or None), "first_row": int(first["row"])}
        for m in modes:
            row[f"verdict_{m}"] = first[f"verdict_{m}"]
            row[f"rule_{m}"] = first[f"rule_{m}"]
            row[f"error_{m}"] = first[f"error_{m}"]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["severity", "count"], ascending=[True, False], kind="stable").reset_index(drop=True)


def compact_ranges(values) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2,5,7-8"``."""
    vals = sorted(set(int(v) for v in values))
    out, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def token_outcomes(calls: pd.DataFrame, n_tokens: int, modes=CAPTURE_MODES) -> pd.DataFrame:
    """Per token and mode: ``first_invalidating_<mode>`` (name and place), ``refused_<mode>``,
    ``not_in_graph_<mode>``, ``no_rule_<mode>``."""
    rows = []
    by_tok = {int(t): g for t, g in calls.groupby("token")} if not calls.empty else {}
    for t in range(n_tokens):
        g = by_tok.get(t)
        row = {"token": t}
        for m in modes:
            v = g[f"verdict_{m}"] if g is not None else pd.Series([], dtype=object)
            inv = g[v == "invalidates"] if g is not None else None
            row[f"first_invalidating_{m}"] = (f"{inv.iloc[0]['api']} ({inv.iloc[0]['where'] or 'no place'})"
                                             if inv is not None and len(inv) else "")
            row[f"refused_{m}"] = int((v == "refused").sum())
            row[f"not_in_graph_{m}"] = int((v == "not in graph").sum())
            row[f"no_rule_{m}"] = int((v == NO_RULE).sum())
        rows.append(row)
    return pd.DataFrame(rows)
