"""The audit's analysis on synthetic event tables (:mod:`audit_synth`): tokens (NVTX ranges, the
period of the kernel sequence, what is left out), every call class's verdict per capture mode (from
the sim's rules), launch-list variation, where a finding comes from, and bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from audit_synth import TraceBuilder, decode_step
from ds4lab.audit import analyze
from ds4lab.audit.analysis import AuditInputError
from ds4lab.trace.records import api_base_name
from ds4lab.trace.events import EventTable, make_frame
from ds4lab.audit.tokens import NoTokens
from ds4lab.audit.where import user_frame, where

INV, REF, NIG, OK, NR = "invalidates", "refused", "not in graph", "allowed", "no rule"


def _trace(rng, tokens=5, extra=None, **kw) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(3):
        b.launch("prefill_gemm", float(rng.uniform(10, 20)))
    b.call("cudaStreamSynchronize", stream=b.stream, waits=True)
    for p in range(tokens):
        decode_step(b, rng, layers=3, pos=100 + p, extra=extra, **kw)
    return b


# ----------------------------------------------------------------------------- tokens
def test_period_tokens_skip_prefill_and_sampling(rng):
    b = _trace(rng, tokens=7)
    for _ in range(4):
        b.launch("sampling_topk", 2.0)
    (r,) = analyze([b.table()])
    assert r.tokens.n == 7
    assert "period" in r.tokens.how and "'embed'" in r.tokens.how and "pauses" in r.tokens.how
    region = r.tokens.region
    f = r.unit.frame
    assert set(f.loc[(region == "before") & (f["kind"] == "kernel"), "name"]) == {"prefill_gemm"}
    assert set(f.loc[(region == "after") & (f["kind"] == "kernel"), "name"]) == {"sampling_topk"}
    assert any("before the first token" in n and "3 kernel(s)" in n for n in r.notes)
    assert any("after the last token" in n and "4 kernel(s)" in n for n in r.notes)
    # every token holds its 22 kernels and the sync that ends it (host rows by host time)
    assert list(r.token_table["kernels"]) == [22] * 7
    calls = r.calls
    assert (calls.groupby("token")["api"].apply(lambda s: (s == "cudaStreamSynchronize").sum()) == 1).all()


def test_period_with_emit_tokens_every_fourth(rng):
    b = TraceBuilder()
    for p in range(12):
        decode_step(b, rng, layers=3, pos=7, emit=(p % 4 == 3))
    (r,) = analyze([b.table()])
    assert r.tokens.n == 12  # the host pause marks each step: one token per step, not per 4
    assert r.n_shapes == 2
    assert r.shapes == [0, 0, 0, 1] * 3


def test_period_without_a_host_pause_takes_the_most_alike_repeats(rng):
    b = TraceBuilder()
    for _ in range(8):
        decode_step(b, rng, layers=4, pos=5, sync=False)
    (r,) = analyze([b.table()])
    assert r.tokens.n == 8 and "no host pause" in r.tokens.how and r.n_shapes == 1
    assert list(r.token_table["kernels"]) == [28] * 8  # not one layer (period 6)


@pytest.mark.parametrize("given", [None, "decode_step", "decode_*"])
def test_nvtx_tokens(rng, given):
    b = TraceBuilder()
    for _ in range(3):
        b.launch("warmup", 2.0)
    for p in range(5):
        b.push("decode_step", "torch.record_function")
        b.push("layer")  # a repeating range nested inside: never the token
        decode_step(b, rng, pos=p, sync=False)
        b.pop()
        b.pop()
        b.pause(int(rng.integers(20_000, 40_000)))
    (r,) = analyze([b.table()], token_range=given)
    assert r.tokens.n == 5 and "NVTX range" in r.tokens.how
    assert ("--token-range)" in r.tokens.how) == (given is not None)
    assert list(r.token_table["kernels"]) == [22] * 5
    assert any("3 kernel(s)" in n for n in r.notes)  # the warm-up, before the first range


def test_nvtx_range_open_at_the_end_is_cut(rng):
    b = TraceBuilder()
    for p in range(4):
        b.push("step")
        decode_step(b, rng, pos=p)
        b.pop()
    b.push("step")
    b.launch("embed", 1.0)
    (r,) = analyze([b.table()], token_range="step")
    assert r.tokens.n == 4
    assert any("never closed" in n for n in r.notes)
    assert (r.tokens.region == "cut").any()


def test_a_last_token_cut_mid_way_is_left_out_and_said(rng):
    b = _trace(rng, tokens=5)
    for k in ("embed", "rms_norm", "qkv_gemv", "rope"):
        b.launch(k, 1.0)
    (r,) = analyze([b.table()])
    assert r.tokens.n == 5
    assert any("cut mid-token" in n for n in r.notes)
    f = r.unit.frame
    assert list(f.loc[(r.tokens.region == "cut") & (f["kind"] == "kernel"), "name"]) == [
        "embed", "rms_norm", "qkv_gemv", "rope"]


def test_several_processes_and_devices_give_one_report_each(rng):
    rows = []
    for i, (pid, dev, n) in enumerate(((100, 0, 4), (100, 1, 6), (200, 0, 5))):
        b = TraceBuilder(pid=pid, tid=pid + dev, device=dev, corr0=100_000 * i)
        for p in range(n):
            decode_step(b, rng, pos=p)
        rows += b.rows
    for r in rows:
        if r["kind"] == "api":
            r.pop("device", None)  # host rows find their device through correlation and their thread
    reports = analyze([EventTable(make_frame(rows), "multi.json", "synthetic")])
    got = sorted((r.pid, r.device, r.tokens.n) for r in reports)
    assert got == [(100, 0, 4), (100, 1, 6), (200, 0, 5)]  # never one sum


# ----------------------------------------------------------------------------- bad input
def test_no_kernel_at_all_names_the_file():
    t = EventTable(make_frame([{"kind": "api", "name": "cudaGetDevice", "start_ns": 1, "end_ns": 2}]),
                   "empty_trace.json", "synthetic")
    with pytest.raises(AuditInputError, match="empty_trace.json: no kernel"):
        analyze([t])


def test_no_repeating_unit_names_the_file_and_what_it_found(rng):
    b = TraceBuilder()
    for i in range(9):
        b.launch(f"kernel_{i}", float(rng.uniform(1, 3)))
    with pytest.raises(NoTokens, match=r"one_off.json .*no repeating unit: 9 kernel launch\(es\) of 9 distinct"):
        analyze([b.table("one_off.json")])


def test_an_unknown_token_range_lists_the_ranges_seen(rng):
    b = TraceBuilder()
    for p in range(3):
        b.push("forward")
        decode_step(b, rng, pos=p)
        b.pop()
    with pytest.raises(NoTokens, match=r"no NVTX range named 'decode_step'; ranges seen: forward \(3\)"):
        analyze([b.table()], token_range="decode_step")


def test_an_unknown_mode_is_refused(rng):
    b = _trace(rng)
    with pytest.raises(AuditInputError, match="capture mode"):
        analyze([b.table()], modes=("eager",))


# ----------------------------------------------------------------------------- verdicts by call class
def _event(name, stream=None, event=-1, **kw):
    def add(b, layer):
        if layer == 1:
            b.call(name, stream=b.stream if stream is None else stream, event=event, **kw)
    return add


def _record_then(name, **kw):
    def add(b, layer):
        if layer == 1:
            b.call("cudaEventRecord", stream=b.stream, event=5)
            b.call(name, stream=b.stream, event=5, **kw)
    return add


def _launch(kernel, stream, api="cudaLaunchKernel"):
    def add(b, layer):
        if layer == 1:
            b.launch(kernel, 1.0, stream=stream, api=api)
    return add


def _copy(api, kind, mem):
    def add(b, layer):
        if layer == 1:
            b.copy(api, kind, mem)
    return add


def _memset(api, stream):
    def add(b, layer):
        if layer == 1:
            b.memset(api, stream=stream)
    return add


def _fork(b, layer):
    if layer == 1:
        b.call("cudaEventRecord", stream=b.stream, event=5)
        b.call("cudaStreamWaitEvent", stream=9, event=5)
        b.launch("side_kernel", 1.0, stream=9)
        b.call("cudaEventRecord", stream=9, event=6)
        b.call("cudaStreamWaitEvent", stream=b.stream, event=6)


CASES = [
    # (API as traced, extra, call class, verdict per mode: global, thread_local, relaxed)
    ("cudaMalloc", _event("cudaMalloc", stream=-1), "malloc", (INV, INV, OK)),
    ("cudaFree", _event("cudaFree", stream=-1), "free", (INV, INV, OK)),
    ("cudaMemset", _memset("cudaMemset", 0), "memset_sync", (NIG, NIG, NIG)),
    ("cudaMemsetAsync", _memset("cudaMemsetAsync", 0), "memset_async@legacy", (NIG, NIG, NIG)),
    ("cudaMemsetAsync", _memset("cudaMemsetAsync", 7), "memset_async@capture", (OK, OK, OK)),
    ("cudaLaunchKernel", _launch("legacy_kernel", 0), "kernel@legacy", (NIG, NIG, NIG)),
    ("cudaLaunchKernel", _launch("side_kernel", 9), "kernel@other", (NIG, NIG, NIG)),
    ("cudaLaunchKernel_ptsz", _launch("ptsz_kernel", 7, "cudaLaunchKernel_ptsz"), "kernel@capture", (OK, OK, OK)),
    ("cuLaunchKernelEx", _launch("driver_kernel", 7, "cuLaunchKernelEx"), "kernel@capture", (OK, OK, OK)),
    ("cudaMemcpyAsync", _copy("cudaMemcpyAsync", "HtoD", "pageable"), "memcpy_async.h2d.pageable@capture",
     (OK, OK, OK)),
    ("cudaMemcpyAsync", _copy("cudaMemcpyAsync", "DtoH", "pinned"), "memcpy_async.d2h.pinned@capture", (OK, OK, OK)),
    ("cudaMemcpyAsync", _copy("cudaMemcpyAsync", "DtoD", ""), "memcpy_async.d2d@capture", (OK, OK, OK)),
    ("cudaMemcpy", _copy("cudaMemcpy", "HtoD", "pageable"), "memcpy_sync.h2d", (NIG, NIG, NIG)),
    ("cudaMemcpy", _copy("cudaMemcpy", "DtoH", "pageable"), "memcpy_sync.d2h", (NIG, NIG, NIG)),
    ("cudaDeviceSynchronize", _event("cudaDeviceSynchronize", stream=-1), "device_sync", (INV, INV, INV)),
    ("cudaStreamSynchronize", _event("cudaStreamSynchronize", stream=9), "stream_sync@other", (OK, OK, OK)),
    ("cudaEventSynchronize", _record_then("cudaEventSynchronize"), "event_sync.in_token", (INV, INV, INV)),
    ("cudaEventSynchronize", _event("cudaEventSynchronize", event=77), "event_sync.before", (INV, INV, OK)),
    ("cudaEventQuery", _record_then("cudaEventQuery"), "event_query.in_token", (INV, INV, INV)),
    ("cudaEventQuery", _event("cudaEventQuery", event=77), "event_query.before", (INV, INV, OK)),
    ("cudaEventElapsedTime", _record_then("cudaEventElapsedTime"), "event_elapsed.in_token", (REF, REF, REF)),
    ("cudaEventElapsedTime", _event("cudaEventElapsedTime", event=77), "event_elapsed.before", (OK, OK, OK)),
    ("cudaEventRecord", _event("cudaEventRecord", stream=0, event=8), "event_record@legacy", (NIG, NIG, NIG)),
    ("cudaEventRecord", _event("cudaEventRecord", event=8), "event_record@capture", (OK, OK, OK)),
    ("cudaStreamWaitEvent", _event("cudaStreamWaitEvent", event=77), "wait_event.outside", (INV, INV, INV)),
    ("cudaStreamWaitEvent", _fork, "wait_event.fork", (OK, OK, OK)),
    ("cudaStreamQuery", _event("cudaStreamQuery"), "stream_query@capture", (INV, INV, INV)),
    ("cudaStreamIsCapturing", _event("cudaStreamIsCapturing"), "capture_status", (OK, OK, OK)),
    ("cudaGetDevice", _event("cudaGetDevice", stream=-1), "host_query", (OK, OK, OK)),
    ("cuCtxGetCurrent", _event("cuCtxGetCurrent", stream=-1), "host_query", (OK, OK, OK)),
    ("cudaMallocAsync", _event("cudaMallocAsync"), "malloc_async@capture", (OK, OK, OK)),
    ("cudaFreeAsync", _event("cudaFreeAsync", stream=9), "free_async@other", (NIG, NIG, NIG)),
    ("cudaHostAlloc", _event("cudaHostAlloc", stream=-1), "host_alloc", (INV, INV, OK)),
    ("cudaHostRegister", _event("cudaHostRegister", stream=-1), "host_register", (INV, INV, OK)),
    ("cublasCreate_v2", _event("cublasCreate_v2", stream=-1), "cublas_create", (INV, INV, OK)),
    ("cublasSetWorkspace_v2", _event("cublasSetWorkspace_v2", stream=-1), "cublas_settings", (OK, OK, OK)),
    ("cudaMalloc", _event("cudaMalloc", stream=-1, tid=2), "other_thread.malloc", (INV, OK, OK)),
    ("cudaGraphLaunch", _event("cudaGraphLaunch"), "graph_launch@capture", (INV, INV, INV)),
    ("cudaProfilerStart", _event("cudaProfilerStart", stream=-1), None, (NR, NR, NR)),
    ("cudaLaunchHostFunc", _event("cudaLaunchHostFunc"), None, (NR, NR, NR)),
]


@pytest.mark.parametrize("api, extra, klass, want", CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_every_call_class_gets_the_sims_verdict(rng, api, extra, klass, want):
    (r,) = analyze([_trace(rng, tokens=4, extra=extra).table()])
    calls = r.calls[(r.calls["name"] == api) & (r.calls["klass"].fillna("(none)") == (klass or "(none)"))]
    api = api_base_name(api)  # findings name the API without its version or per-thread suffix
    assert len(calls) == 4, r.calls[["api", "klass"]].drop_duplicates()  # one per token
    got = tuple(calls.iloc[0][f"verdict_{m}"] for m in ("global", "thread_local", "relaxed"))
    assert got == want
    f = r.findings
    hit = f[(f["name"] == api) & (f["call_class"] == (klass or "(none)"))]
    shown = klass is not None and (klass.startswith(("memcpy_async.h2d", "memcpy_async.d2h")) or klass == "capture_status")
    if set(want) == {OK} and not shown:
        assert hit.empty  # allowed calls are not findings
    else:  # ... but copies with the host and capture-status queries are shown
        assert len(hit) == 1 and int(hit.iloc[0]["count"]) == 4 and hit.iloc[0]["token_range"] == "0-3"
        assert hit.iloc[0]["kind"] == ("no rule" if klass is None else "call" if set(want) != {OK}
                                       else "capture path" if klass == "capture_status" else "host data")
        if klass is not None:
            assert hit.iloc[0]["rule_source"] and hit.iloc[0]["fix"]
            # rules whose conformance scenarios ran on the H200 no longer say GUESS
            if klass in ("device_sync", "stream_sync@capture", "host_alloc", "host_register", "cublas_create"):
                assert not hit.iloc[0]["rule_guess"]


def test_a_forked_stream_is_captured_after_it_joins(rng):
    (r,) = analyze([_trace(rng, tokens=3, extra=_fork).table()])
    side = r.calls[r.calls["api"] == "cudaLaunchKernel"]
    side = side[side["stream"] == 9]
    assert set(side["klass"]) == {"kernel@capture"} and set(side["verdict_global"]) == {OK}


def test_the_capture_stream_is_where_most_kernels_run_and_the_legacy_stream_is_inferred(rng):
    (r,) = analyze([_trace(rng, tokens=3, extra=_memset("cudaMemset", 3)).table()])
    assert r.capture_stream == 7 and "stream 7" in r.capture_why
    assert r.legacy == frozenset({3}) and "synchronous" in r.legacy_why


def test_first_invalidating_call_per_token_and_mode(rng):
    (r,) = analyze([_trace(rng, tokens=3, extra=_event("cudaMalloc", stream=-1)).table()])
    t = r.token_table
    assert list(t["first_invalidating_global"].str.startswith("cudaMalloc")) == [True] * 3
    assert list(t["first_invalidating_relaxed"].str.startswith("cudaStreamSynchronize")) == [True] * 3


# ----------------------------------------------------------------------------- variation
def test_every_variation_class_is_found_and_counted(rng):
    b = TraceBuilder()
    for p in range(8):
        b.launch("embed", 1.0)
        b.launch("rope", 1.0, args=f"pos={1000 + p},theta=10000.0")
        b.launch("attention", 2.0, grid=f"{1 + p // 3},1,1")
        b.launch("topk", 1.0, block="256,1,1" if p < 6 else "512,1,1")
        if p % 4 == 3:
            b.launch("emit", 1.0)
        for _ in range(1 + (p >= 5)):
            b.launch("expert", 2.0)
        b.launch("lm_head", 3.0)
        b.call("cudaStreamSynchronize", stream=b.stream, waits=True)
        b.pause(50_000)
    (r,) = analyze([b.table()])
    assert r.tokens.n == 8
    v = r.findings[r.findings["kind"] == "variation"].set_index(["name", "call_class"])
    assert set(v.index) == {("rope", "scalar argument"), ("attention", "grid"), ("topk", "block"),
                            ("emit", "present in some tokens only"), ("expert", "launch count")}
    assert "position-like (+1 per token)" in v.loc[("rope", "scalar argument"), "what"]
    assert "theta" not in v.loc[("rope", "scalar argument"), "what"]  # unchanged arguments are not findings
    assert v.loc[("emit", "present in some tokens only"), "token_range"] == "3,7"  # differ from the modal: none
    assert v.loc[("topk", "block"), "token_range"] == "6-7"
    assert set(v["verdict_global"]) == {"frozen"}
    # shapes: the grid changes at tokens 3 and 6, the block at 6, emit at 3 and 7, expert count at 5
    assert r.shapes == [0, 0, 0, 1, 2, 3, 4, 5] and r.n_shapes == 6


def test_no_variation_when_every_token_is_identical(rng):
    b = TraceBuilder()
    for _ in range(5):
        decode_step(b, rng, pos=42)
    (r,) = analyze([b.table()])
    assert r.n_shapes == 1
    assert r.findings.empty or (r.findings["kind"] != "variation").all()


# ----------------------------------------------------------------------------- where
def test_the_user_frame_skips_torch_cuda_and_ds4lab_internals():
    stack = ("generate.py:12 main;transformers/generation/utils.py:2300 _sample;"
             "transformers/models/llama/modeling_llama.py:420 forward;torch/nn/modules/module.py:1750 _call_impl;"
             "/usr/lib/python3.12/contextlib.py:81 inner;<built-in method cat of type object>")
    assert user_frame(stack) == "transformers/models/llama/modeling_llama.py:420 forward"
    assert user_frame("run.py:3 main;/x/ds4lab/capture/launch.py:90 kernel;/x/cupy/_core/core.pyx:1 get") == \
        "run.py:3 main"
    assert user_frame("torch/cuda/__init__.py:10 synchronize") == ""
    assert where("", "token/layer/moe") == "nvtx: token/layer/moe" and where("", "") == ""


def test_findings_say_where_from_the_stack_else_the_nvtx_path(rng):
    def add(b, layer):
        if layer == 1:
            b.call("cudaMalloc", stack="run.py:5 main;engine.py:77 grow_scratch;torch/cuda/memory.py:9 alloc")
            b.push("moe")
            b.call("cudaDeviceSynchronize")
            b.pop()
    (r,) = analyze([_trace(rng, tokens=3, extra=add).table()])
    f = r.findings.set_index("name")
    assert f.loc["cudaMalloc", "where"] == "engine.py:77 grow_scratch"
    assert f.loc["cudaDeviceSynchronize", "where"] == "nvtx: moe"


def test_a_trace_without_api_calls_is_audited_from_its_device_rows(rng):
    b = _trace(rng, tokens=4, extra=_launch("legacy_kernel", 0))
    kernels = [r for r in b.rows if r["kind"] != "api"]
    (r,) = analyze([EventTable(make_frame(kernels), "kernels_only.json", "synthetic")])
    assert r.tokens.n == 4
    assert any("holds no API calls" in n for n in r.notes)
    f = r.findings
    assert list(f.loc[f["call_class"] == "kernel@legacy", "count"]) == [4]
    assert isinstance(r.plans, pd.DataFrame) and not r.plans.empty


def test_every_probe_is_decided_by_a_rule_of_the_table():
    """No call class the audit knows is allowed without a rule: each probe, in each mode, fires at
    least one rule of ``ds4lab.sim.rules.RULES`` and its verdict follows from it."""
    from ds4lab.audit.probes import PROBES, probe
    from ds4lab.sim.rules import RULES

    for key in PROBES:
        for mode in ("global", "thread_local", "relaxed"):
            p = probe(key, mode)
            assert p.rules and set(p.rules) <= set(RULES) and p.verdict != NR, (key, mode, p)
            if p.error:
                assert RULES[p.rule].error == p.error, (key, mode)


def test_every_probe_is_reachable_from_a_trace_row():
    """Each probe's call class is what :func:`classify` gives some API row (so no probe is dead)."""
    from ds4lab.audit.calls import TokenContext, classify
    from ds4lab.audit.probes import PROBES

    def ctx():
        return TokenContext(capture=7, legacy=frozenset({0}), main_tid=1)

    got = set()
    for name, stream, tid, event, ck, hm in (
            ("cudaLaunchKernel", s, 1, -1, "", "") for s in (7, 0, 9)):
        got.add(classify(name, stream, tid, event, ck, hm, ctx()))
    rows = [("cudaGraphLaunch", s, 1, -1, "", "") for s in (7, 0, 9)]
    rows += [("cudaMemsetAsync", s, 1, -1, "", "") for s in (7, 0, 9)] + [("cudaMemset", -1, 1, -1, "", "")]
    rows += [("cudaMemcpyAsync", 7, 1, -1, k, m) for k in ("HtoD", "DtoH") for m in ("pageable", "pinned")]
    rows += [("cudaMemcpyAsync", 7, 1, -1, "DtoD", ""), ("cudaMemcpyAsync", 0, 1, -1, "HtoD", "pinned"),
             ("cudaMemcpyAsync", 9, 1, -1, "HtoD", "pinned")]
    rows += [("cudaMemcpy", -1, 1, -1, k, "pageable") for k in ("HtoD", "DtoH", "DtoD")]
    rows += [(n, -1, t, -1, "", "") for n in ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost",
                                                "cudaHostRegister", "cudaHostUnregister", "cublasCreate_v2")
             for t in (1, 2)]
    rows += [(n, s, 1, -1, "", "") for n in ("cudaMallocAsync", "cudaFreeAsync", "cudaStreamSynchronize",
                                              "cudaStreamQuery") for s in (7, 0, 9)]
    rows += [(n, -1, t, 77, "", "") for n in ("cudaEventSynchronize", "cudaEventQuery") for t in (1, 2)]
    rows += [("cudaEventElapsedTime", -1, 1, 77, "", ""), ("cudaDeviceSynchronize", -1, 1, -1, "", ""),
             ("cudaStreamIsCapturing", 7, 1, -1, "", ""), ("cudaGetDevice", -1, 1, -1, "", ""),
             ("cublasSetStream_v2", -1, 1, -1, "", "")]
    rows += [("cudaEventRecord", s, 1, 5, "", "") for s in (7, 0, 9)]
    for row in rows:
        got.add(classify(*row, ctx()))
    for tail in (("cudaEventSynchronize", -1), ("cudaEventQuery", -1), ("cudaEventElapsedTime", -1),
                 ("cudaStreamWaitEvent", 7), ("cudaStreamWaitEvent", 9), ("cudaStreamWaitEvent", 0)):
        c = ctx()
        classify("cudaEventRecord", 7, 1, 5, "", "", c)  # recorded in the token on the capture stream
        got.add(classify(tail[0], tail[1], 1, 5, "", "", c))
    got.add(classify("cudaStreamWaitEvent", 7, 1, 77, "", "", ctx()))
    got.add(classify("cudaStreamWaitEvent", 9, 1, 77, "", "", ctx()))
    assert set(PROBES) <= got, sorted(set(PROBES) - got)


def test_a_repeating_range_is_the_token_though_a_prefill_of_the_same_kernels_holds_more(rng):
    """A loop that marks each decode step with an NVTX range after a long prefill of the same kernels,
    outside any range, and writes the next step's inputs between ranges: the range is the token (not the
    period of the kernel sequence, which would mix prefill and decode); the prefill is left out and said."""
    b = TraceBuilder()
    for p in range(12):  # the prefill: the step's own kernels, more launches than all the decode steps
        decode_step(b, rng, pos=p, sync=False)
    for p in range(4):
        b.copy("cudaMemcpyAsync", "HtoD", "pinned")  # the inputs, written between steps
        b.push("decode_step")
        decode_step(b, rng, pos=12 + p, sync=False)
        b.pop()
        b.pause(int(rng.integers(20_000, 40_000)))
    (r,) = analyze([b.table()])
    assert r.tokens.n == 4 and r.tokens.how.startswith("NVTX range 'decode_step' (found")
    assert list(r.token_table["kernels"]) == [22] * 4
    assert any("before the first token" in n and "264 kernel(s)" in n for n in r.notes)
    f = r.unit.frame
    assert (r.tokens.region[f["kind"] == "memcpy"] != "token").all()  # the input writes are no token's
    # the three written between two ranges are the loop's, said as such (the first is before the tokens)
    assert any("between tokens" in n and "3 API call(s)" in n for n in r.notes), r.notes


def test_a_small_range_inside_unmarked_steps_is_not_the_token(rng):
    """A range around each step's sampling holds few of the launches made while it repeats: the tokens
    are the period of the kernel sequence."""
    b = TraceBuilder()
    for p in range(6):
        decode_step(b, rng, pos=p)
        b.push("sample")
        b.launch("sampling_topk", 2.0)
        b.pop()
    (r,) = analyze([b.table()])
    assert "period" in r.tokens.how and r.tokens.n >= 5
