"""Kernel arguments in the recording (:mod:`ds4lab.audit.arguments`) and the comparison that finds
frozen values and addresses (:mod:`ds4lab.audit.frozen`), on argument passes played through the
stand-in CUPTI with real parameter memory (:mod:`audit_args_synth`): known frozen values, a known
ring-buffer slot, known harmless temporaries, unread launches; and the verdict, which never says
"replays right" without the evidence."""

from __future__ import annotations

import struct

import pytest

import audit_args_synth as S
from ds4lab.trace import arguments as A
from ds4lab.audit import frozen as F


def _audit(rec):
    return F.compare(rec.arguments, rec.table())


def test_the_pass_stores_a_digest_per_launch_and_bytes_only_where_tokens_differ(monkeypatch):
    rec, m, q = S.record(monkeypatch)
    st = rec.arguments
    kernels = rec.table().frame.query("kind == 'kernel'")
    assert len(st.launches) == len(kernels) == 1 + 5 * 4
    # every function asked once, whatever its launches
    assert q.calls["param_layout"] == 4 and q.calls["runtime_function"] == 3
    assert {v["name"] for v in st.functions.values()} == {"embed", "rope", "kv_write", "gemm"}
    # embed's ids stay, its temporary moves; rope's pos moves; kv_write's slot moves; gemm is the same
    kept = {st.params(c)[0] for c in st.stacks}
    assert kept == {"embed", "rope", "kv_write"}
    gemm = [d for f, d in st.launches.values() if st.functions[f]["name"] == "gemm"]
    assert len(set(gemm)) == 1 and gemm[0] not in st.blobs
    # the stack at a launch that differs names the Python frame that launched it
    assert all("audit_args_synth.py" in s and " step" in s for s in st.stacks.values())
    # rope's bytes are the pointer and the int32 position
    rope = sorted((c, st.params(c)) for c in st.launches if st.params(c)[0] == "rope")
    assert [struct.unpack("<i", b[8:12])[0] for _, (_, _, b) in rope] == [17, 18, 19, 20, 21]
    # the driver was asked where the varying words lie (the cache's slots), after the pass
    assert q.calls["address_range"] >= 5 and any(b == S.CACHE for b, _ in st.ranges.values())
    # the capture's own cost is not in the table; the note says what the pass is
    assert any("kernel arguments recorded at 21 launches (0 unread)" in n for n in rec.table().notes)


def test_frozen_value_ring_slot_and_temporary_are_told_apart(monkeypatch):
    rec, _, _ = S.record(monkeypatch)
    aa = _audit(rec)
    assert aa.compared == [0, 1, 2, 3, 4] and aa.launches == 4 and aa.unread == 0
    f = aa.findings.set_index(["name", "call_class"])
    assert set(f.index) == {("rope", F.FROZEN_VALUE), ("rope", F.TEMPORARY), ("kv_write", F.RING_SLOT),
                            ("kv_write", F.TEMPORARY), ("embed", F.TEMPORARY)}
    rope = f.loc[("rope", F.FROZEN_VALUE)]
    assert rope["param"] == 1 and rope["byte_offset"] == 8 and rope["size"] == 4
    assert rope["values"] == "17, 18, 19, 20, 21" and "+1 per token" in rope["what"]
    kv = f.loc[("kv_write", F.RING_SLOT)]
    assert kv["param"] == 0 and kv["byte_offset"] == 0
    assert "+256 per token" in kv["what"] and "exists before the tokens" in kv["what"]
    emb = f.loc[("embed", F.TEMPORARY)]
    assert emb["param"] == 1 and emb["verdict"] == "allowed"
    assert "private" in emb["rule_source"] and "the token itself allocated" in emb["what"]
    assert "audit_args_synth.py" in rope["where"] and kv["launch_index"] == 2
    assert not aa.findings["name"].eq("gemm").any()


def test_a_device_counter_and_a_device_slot_replay_right(monkeypatch):
    rec, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False)
    aa = _audit(rec)
    assert aa.complete and set(aa.findings.call_class) == {F.TEMPORARY}
    assert len(aa.frozen) == 0


def test_an_unread_launch_never_gives_replays_right(monkeypatch):
    rec, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False, unreadable=True)
    aa = _audit(rec)
    assert aa.unread == 5 and aa.unread_kernels == ["gemm"] and not aa.complete
    assert any("5 launch(es) unread: cudaGetFuncBySymbol" in n for n in rec.arguments.notes)


def test_a_driver_launch_inside_an_unread_runtime_launch_fills_it_in(monkeypatch):
    from ds4lab.audit import arguments as REC
    from ds4lab.trace import cupti as C

    m = S.fake_cupti.install(monkeypatch)
    monkeypatch.setattr(C, "current_context", lambda: 0x55)
    q = S.queries(unreadable=True)
    monkeypatch.setattr(A, "CudaQueries", lambda: q)

    def inner(mm):  # the runtime launches through the driver, whose CUfunction is known
        mm.launch("cuLaunchKernel", S.KV, [S.p64(5), S.p64(6)], domain="driver", kernel="gemm")

    with REC.recording(arguments=True) as rec:
        outer = m.launch("cudaLaunchKernel_v7000", S.GEMM, [S.p64(1), S.p64(2)], kernel="gemm", nested=inner)
    st = rec.arguments
    fid, d = st.launches[outer]
    assert d is not None and st.blobs.get(d, b"") in (b"", S.p64(5) + S.p64(6))
    assert len(st.launches) == 1  # one launch, one record, under the outer call's correlation id


def test_extra_buffer_launches_are_read(monkeypatch):
    rec, _, _ = S.record(monkeypatch, extra=True)
    f = _audit(rec).findings
    assert ((f["name"] == "kv_write") & (f["call_class"] == F.RING_SLOT)).sum() == 1


def test_the_store_round_trips_and_is_found_beside_the_recording(monkeypatch, tmp_path):
    rec, _, _ = S.record(monkeypatch, tmp_path)
    p = tmp_path / "arguments.json.gz"
    assert p.is_file() and A.store_beside(tmp_path / "recording.csv.gz") == p
    back = A.load(p)
    assert back.table == "arguments.csv.gz" and back.launches == rec.arguments.launches
    assert back.blobs == rec.arguments.blobs and back.pruned
    with pytest.raises(ValueError, match="not a ds4lab arguments file"):
        A.load(tmp_path / "arguments.csv.gz")


def test_the_verdict_needs_evidence(monkeypatch, tmp_path, rng):
    """No arguments: unknown with the command; a frozen value: wrong; a complete comparison with nothing
    frozen: right. Kineto and Nsight Systems tables never yield 'replays right'."""
    from audit_synth import TraceBuilder
    from ds4lab.audit import analyze

    b = TraceBuilder()
    for p in range(5):
        b.push("decode_step")
        for k in ("embed", "qkv", "mlp", "lm_head"):
            b.launch(k, 2.0)
        b.pop()
        b.call("cudaStreamSynchronize", stream=b.stream, waits=True)
        b.pause(50_000)
    for tool in ("pytorch-profiler", "nsys-sqlite (schema 3.11)", "cupti (cupti-python 13.0.1)"):
        (r,) = analyze([b.table(tool=tool)])
        v = F.verdict(r)
        assert v.verdict == F.UNKNOWN and "ds4lab audit run" in v.command and tool.split()[0] in v.why
    rec, _, _ = S.record(monkeypatch, tmp_path)
    (r,) = analyze([rec.table()], token_range="decode_step")
    F.attach(r, tmp_path / "arguments.json.gz", rec.table(), tmp_path / "arguments.csv.gz")
    v = F.verdict(r)
    assert v.verdict == F.WRONG and "frozen value" in v.why and "5 tokens" in v.evidence
    assert (r.findings["call_class"] == F.FROZEN_VALUE).any()
    clean, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False)
    (r2,) = analyze([clean.table()], token_range="decode_step")
    r2.arguments = F.compare(clean.arguments, clean.table())
    v2 = F.verdict(r2)
    assert v2.verdict == F.RIGHT and "3 step temporaries (harmless)" in v2.evidence and not v2.command


def test_a_new_input_buffer_every_step_is_a_frozen_address(monkeypatch):
    """Token ids in a buffer the host makes between steps: the graph reads the captured step's buffer."""
    rec, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False, fresh_input=True)
    f = _audit(rec).findings
    emb = f[(f["name"] == "embed") & (f["param"] == 0)].iloc[0]
    assert emb["call_class"] == F.FROZEN_ADDRESS and "between tokens" in emb["what"]
    assert emb["verdict"] == "frozen"


def test_torch_blocks_are_placed_on_cuptis_clock():
    """The caching allocator's blocks: alive at the start (before the pass), allocated and freed during it
    (history events in wall-clock µs, mapped onto CUPTI's clock by the start and end pairs)."""
    from types import SimpleNamespace as R

    class Mem:
        def memory_snapshot(self):
            return [{"address": 0x100000, "total_size": 1 << 20,
                     "blocks": [{"address": 0x100000, "size": 4096, "state": "active_allocated"},
                                {"address": 0x101000, "size": 4096, "state": "inactive"}]}]

        def _record_memory_history(self, enabled="all", **kw):
            self.on = enabled

        def _snapshot(self):
            return {"segments": [{"address": 0x100000, "total_size": 1 << 20}], "device_traces": [[
                {"action": "alloc", "addr": 0x101000, "size": 512, "time_us": 2_000},
                {"action": "free_requested", "addr": 0x101000, "size": 512, "time_us": 3_000},
                {"action": "alloc", "addr": 0x102000, "size": 256, "time_us": 3_500}]]}

    mem = Mem()
    clock = iter([10_000_000, 20_000_000])
    t = A.MemoryTracker(lambda: next(clock), torch_module=R(cuda=R(memory=mem)))
    t.start()
    t.stop()
    assert mem.on is None  # history given back
    t.pairs = [(1_000_000, 10_000_000), (5_000_000, 20_000_000)]  # wall ns → CUPTI ns, 2.5 per ns
    allocs = t.allocations()
    assert allocs[0] == [0x100000, 4096, -1, -1, "torch block"]
    assert allocs[1] == [0x101000, 512, 12_500_000, 15_000_000, "torch block"]
    assert allocs[2][:4] == [0x102000, 256, 16_250_000, -1]
    assert t.segments == [(0x100000, 1 << 20)] and not t.notes


def test_the_cost_per_launch_is_a_paired_interleaved_difference(monkeypatch):
    """measure_overhead: plain blocks against blocks with the launch handler on, alternating; per launch."""
    m = S.fake_cupti.install(monkeypatch)
    from ds4lab.trace.cupti import CuptiSession

    q = S.queries()
    t = [0.0]

    def step():
        m.launch("cudaLaunchKernel_v7000", S.EMBED, [S.p64(S.IDS), S.p64(S.TEMP)], kernel="embed")
        t[0] += 100e-6 + (5e-6 if m.callbacks_on else 0.0)  # the handler costs 5 µs a launch

    cost = A.measure_overhead(step, 1, session=CuptiSession.get(), rounds=8, steps=2, clock=lambda: t[0], queries=q)
    assert cost["measurable"] and cost["per_launch_us"] == pytest.approx(5.0, abs=0.01)
    assert cost["n"] == 8 and "µs per launch" in cost["text"]
    assert q.calls["param_layout"] == 1  # asked once, in the warm block


def test_ds4lab_audit_reads_the_argument_pass_beside_a_recording(monkeypatch, tmp_path):
    """`ds4lab audit recording.csv.gz` with arguments.json.gz beside it: arguments.csv, the replay verdict
    in meta.json and in the summary; a trace without arguments: 'unknown from this trace' and the command."""
    import json

    from click.testing import CliRunner

    from ds4lab.cli import main

    rec, _, _ = S.record(monkeypatch, tmp_path)
    rec.save(tmp_path / "recording.csv.gz")
    monkeypatch.undo()  # the CLI needs no CUPTI
    r = CliRunner().invoke(main, ["audit", str(tmp_path / "recording.csv.gz"), "--token-range", "decode_step",
                                  "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "replay (one graph per token, global mode): replays wrong" in " ".join(r.output.split())
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    rep = meta["units"][0]["replay"]
    assert rep["verdict"] == F.WRONG and rep["compared_tokens"] == [0, 1, 2, 3, 4] and rep["unread"] == 0
    import pandas as pd

    args = pd.read_csv(tmp_path / "a" / "arguments.csv")
    assert set(args.call_class) == {F.FROZEN_VALUE, F.RING_SLOT, F.TEMPORARY}
    audit = pd.read_csv(tmp_path / "a" / "audit.csv")
    assert (audit["kind"] == "argument").sum() == 2  # the frozen ones among the findings
    (tmp_path / "arguments.json.gz").unlink()
    (tmp_path / "recording.arguments.json.gz").unlink()  # saved beside it too (the same pass)
    r = CliRunner().invoke(main, ["audit", str(tmp_path / "recording.csv.gz"), "--token-range", "decode_step",
                                  "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "b" / "meta.json").read_text())["units"][0]["replay"]
    assert rep["verdict"] == F.UNKNOWN and "ds4lab audit run" in rep["command"]
    assert not (tmp_path / "b" / "arguments.csv").exists()


class _Runtime:
    """A CUDA runtime's last-error state and cudaGetFuncBySymbol, as ctypes would call them."""

    def __init__(self, known: dict, pending: int = 0):
        self.known, self.last, self.asked = known, pending, 0

    def cudaPeekAtLastError(self):
        return self.last

    def cudaGetLastError(self):
        last, self.last = self.last, 0
        return last

    def cudaGetFuncBySymbol(self, out, host_fn):
        self.asked += 1
        f = self.known.get(host_fn.value)
        if f is None:
            self.last = 98  # cudaErrorInvalidDeviceFunction, left as the runtime's last error
            return 98
        out._obj.value = f
        return 0


def test_a_failed_function_lookup_leaves_no_error_for_the_application_to_read():
    from ds4lab.trace.arguments import CudaQueries

    other, app = _Runtime({}), _Runtime({0x1000: 0xBEEF})
    q = object.__new__(CudaQueries)
    q.runtimes = [("/x/libcudart.so.13", other), ("/y/libcudart.so.13", app)]
    assert q.runtime_function(0x1000) == (0xBEEF, "")
    assert other.last == 0 and app.last == 0  # the first runtime's failure was read back
    f, why = q.runtime_function(0x2000)  # no runtime knows it
    assert f == 0 and "cudaError 98" in why and other.last == 0 and app.last == 0
    # an error of the application's pending: that runtime is not asked, and its error stays for it
    app.last, asked = 700, app.asked
    f, why = q.runtime_function(0x1000)
    assert f == 0 and app.asked == asked and app.last == 700 and "not asked" in why


class _Driver:
    """libcuda as the capture's queries see it: ``functions`` {CUfunction: [(offset, size)]} answer
    cuFuncGetParamInfo; ``kernels`` {CUkernel: CUfunction} answer cuKernelGetFunction (a CUkernel given
    to cuFuncGetParamInfo is refused with CUDA_ERROR_INVALID_HANDLE, as the driver does)."""

    def __init__(self, functions, kernels):
        self.functions, self.kernels = functions, kernels
        self.kernel_calls = 0

    def cuFuncGetParamInfo(self, f, i, off, size):
        layout = self.functions.get(f.value)
        if layout is None:
            return 400
        if i.value >= len(layout):
            return 1
        off._obj.value, size._obj.value = layout[i.value]
        return 0

    def cuKernelGetFunction(self, out, k):
        self.kernel_calls += 1
        f = self.kernels.get(k.value)
        if f is None:
            return 400
        out._obj.value = f
        return 0

    def cuGetErrorName(self, st, name):
        name._obj.value = {400: b"CUDA_ERROR_INVALID_HANDLE", 1: b"CUDA_ERROR_INVALID_VALUE"}.get(st, b"?")
        return 0


def test_a_kernel_launched_by_its_cukernel_handle_is_read_through_its_function():
    from ds4lab.trace.arguments import CudaQueries

    drv = _Driver({0xF00: [(0, 8), (8, 4)], 0xF10: [(0, 8)]}, {0xC00: 0xF00})
    q = object.__new__(CudaQueries)
    q.cuda, q._count, q._info = drv, None, drv.cuFuncGetParamInfo
    assert q.param_layout(0xF10) == ([(0, 8)], "") and drv.kernel_calls == 0  # a CUfunction: asked as it is
    assert q.param_layout(0xC00) == ([(0, 8), (8, 4)], "")  # a CUkernel: through cuKernelGetFunction
    layout, why = q.param_layout(0xBAD)  # neither: unread, and the reason names both calls
    assert layout is None and "CUDA_ERROR_INVALID_HANDLE" in why and "cuKernelGetFunction" in why


class _LazyQueries(S.fake_cupti.FakeQueries):
    """A runtime whose module is loaded by the launch itself (lazy loading): the host stub is unknown at
    the launch's entry and known at its exit."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.loaded = False

    def runtime_function(self, host_fn):
        f, why = super().runtime_function(host_fn)
        return (f, why) if self.loaded else (0, "cudaGetFuncBySymbol: libcudart.so.13: cudaError 98")


def test_a_function_unknown_at_the_launchs_entry_is_read_at_its_exit(monkeypatch):
    from ds4lab.audit import arguments as REC
    from ds4lab.trace import cupti as C

    m = S.fake_cupti.install(monkeypatch)
    monkeypatch.setattr(C, "current_context", lambda: 0x55)
    q = _LazyQueries(layouts=S.LAYOUTS, runtime={S.GEMM: 0xA000})
    monkeypatch.setattr(A, "CudaQueries", lambda: q)

    def load(mm):  # the launch loads its module between its entry and its exit
        q.loaded = True

    with REC.recording(arguments=True) as rec:
        first = m.launch("cudaLaunchKernel_v7000", S.GEMM, [S.p64(1), S.p64(2)], kernel="gemm", nested=load)
        second = m.launch("cudaLaunchKernel_v7000", S.GEMM, [S.p64(3), S.p64(4)], kernel="gemm")
    st = rec.arguments
    assert st.launches[first][1] is not None and st.blobs[st.launches[first][1]] == S.p64(1) + S.p64(2)
    assert st.blobs[st.launches[second][1]] == S.p64(3) + S.p64(4)
    assert q.calls["runtime_function"] == 2  # looked up again once, at the exit, then kept
    assert not any("unread" in n for n in st.notes)


def test_a_function_unknown_at_entry_and_exit_stays_unread_and_is_not_asked_again(monkeypatch):
    from ds4lab.audit import arguments as REC
    from ds4lab.trace import cupti as C

    m = S.fake_cupti.install(monkeypatch)
    monkeypatch.setattr(C, "current_context", lambda: 0x55)
    q = _LazyQueries(layouts=S.LAYOUTS, runtime={S.GEMM: 0xA000})
    monkeypatch.setattr(A, "CudaQueries", lambda: q)
    with REC.recording(arguments=True) as rec:
        corrs = [m.launch("cudaLaunchKernel_v7000", S.GEMM, [S.p64(i), S.p64(i)], kernel="gemm") for i in range(3)]
    st = rec.arguments
    assert all(st.launches[c][1] is None for c in corrs)
    assert q.calls["runtime_function"] == 2  # at the first launch's entry and exit, never after
    assert any("3 launch(es) unread: cudaGetFuncBySymbol" in n for n in st.notes)


class _KernelRuntime(_Runtime):
    """A runtime that answers cudaGetFuncBySymbol with cudaErrorInvalidDeviceFunction and knows the
    stub's CUkernel (cudaGetKernel), as CUDA 12's and 13's runtimes that keep their kernels as libraries."""

    def __init__(self, kernels: dict):
        super().__init__({})
        self.kernels = kernels

    def cudaGetKernel(self, out, host_fn):
        k = self.kernels.get(host_fn.value)
        if k is None:
            self.last = 98
            return 98
        out._obj.value = k
        return 0


def test_a_runtime_stub_is_mapped_through_its_cukernel_when_the_symbol_lookup_fails():
    from ds4lab.trace.arguments import CudaQueries

    rt = _KernelRuntime({0x1000: 0xC00})
    drv = _Driver({0xF00: [(0, 8)]}, {0xC00: 0xF00})
    q = object.__new__(CudaQueries)
    q.cuda, q._count, q._info = drv, None, drv.cuFuncGetParamInfo
    q.runtimes = [("/x/libcudart.so.13", rt)]
    assert q.runtime_function(0x1000) == (0xF00, "") and rt.last == 0  # the failed lookup's error read back
    f, why = q.runtime_function(0x2000)
    assert f == 0 and "cudaGetKernel: cudaError 98" in why and rt.last == 0
