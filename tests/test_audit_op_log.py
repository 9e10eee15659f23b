"""The operator log of an argument pass (:mod:`ds4lab.trace.torch_ops`) in the comparison
(:mod:`ds4lab.audit.frozen`): a changing word no host argument of its operator set is unset (harmless),
one set from changing host arguments stays frozen and names its operator, and a copy from pageable host
memory inside a token is a refusal. The passes are the stand-in CUPTI's (:mod:`audit_args_synth`) with
operator calls attached as the op log would attach them."""

from __future__ import annotations

import pytest

import audit_args_synth as S
from ds4lab.audit import arguments as AA
from ds4lab.audit import frozen as F
from ds4lab.trace import arguments as A


def _with_ops(rec, key_of, *, spans=(), opaque=False, name="aten::rope", kernel="rope"):
    """Tag every ``kernel`` launch with an operator call ``name`` whose key is ``key_of(token)``, the
    others with one call each of a constant key."""

    def op(t, kname):
        rope = kname == kernel
        return {"name": name if rope else f"aten::{kname}", "key": key_of(t) if rope else kname,
                "text": f"cuda float32[4], {17 + t}" if rope else "cuda float32[4]", "spans": list(spans),
                "cpu": [], "opaque": opaque}

    S.tag_ops(rec, op)
    return rec


def test_a_changing_word_no_host_argument_set_is_unset_and_the_step_replays_right(monkeypatch):
    rec, _, _ = S.record(monkeypatch, host_slot=False)
    aa = F.compare(_with_ops(rec, lambda t: "same").arguments, rec.table())
    rope = aa.findings.set_index(["name", "call_class"]).loc[("rope", F.UNSET)]
    assert rope["values"] == "17, 18, 19, 20, 21" and rope["verdict"] == "allowed"
    assert "every host argument of aten::rope" in rope["what"] and "OffsetCalculator" in rope["rule_source"]
    assert len(aa.frozen) == 0 and aa.complete and aa.op_log

    class R:
        findings, tool = None, "cupti"
    R.arguments = aa
    v = F.verdict(R)
    assert v.verdict == F.RIGHT and "1 unset word(s)" in v.evidence


def test_a_word_set_from_changing_host_arguments_stays_frozen_and_names_its_operator(monkeypatch):
    rec, _, _ = S.record(monkeypatch, host_slot=False)
    aa = F.compare(_with_ops(rec, lambda t: f"pos{t}").arguments, rec.table())
    (row,) = aa.frozen.itertuples()
    assert row.name == "rope" and row.call_class == F.FROZEN_VALUE
    assert "set by aten::rope from host arguments that change: (cuda float32[4], 17) … (cuda float32[4], 21)" in row.what


@pytest.mark.parametrize("why", ["span", "opaque", "random", "one call missing"])
def test_a_changing_word_is_never_called_unset_without_the_evidence(monkeypatch, why):
    """A value inside one of the operator's tensors (a data pointer the allocations missed), an operator
    with a host tensor too large to key, one that reads a random generator, a launch with no operator."""
    rec, _, _ = S.record(monkeypatch, host_slot=False)
    kw = {"spans": [[0, 64]]} if why == "span" else {"opaque": True} if why == "opaque" else (
        {"name": "aten::bernoulli_"} if why == "random" else {})
    _with_ops(rec, lambda t: "same", **kw)
    if why == "one call missing":
        st = rec.arguments
        rope = [c for c, i in st.op_of.items() if st.ops[i]["name"] == "aten::rope"]
        del st.op_of[rope[2]]
    aa = F.compare(rec.arguments, rec.table())
    assert list(aa.frozen["name"]) == ["rope"] and not (aa.findings["call_class"] == F.UNSET).any()


def test_without_an_op_log_a_changing_word_is_a_value_and_the_notes_say_why(monkeypatch):
    rec, _, _ = S.record(monkeypatch, host_slot=False)
    aa = F.compare(rec.arguments, rec.table())
    assert list(aa.frozen["call_class"]) == [F.FROZEN_VALUE] and not aa.op_log
    assert any("no operator log" in n for n in aa.notes)


def _copy_op(t_ns, dim=0, direction="h2d"):
    return {"name": "aten::copy_", "key": "k", "text": "cuda int64[] (written), cpu int64[]=26", "spans": [[1, 8]],
            "cpu": [[dim, 1, False]], "opaque": False, "t_ns": t_ns,
            "copy": {"dim": dim, "numel": 1, "direction": direction,
                     "stack": "run.py:3 <module>;/home/u/engine/mask.py:12 build_mask;torch/_tensor.py:40 copy_"}}


def test_a_pageable_copy_inside_a_token_is_a_refusal_and_one_outside_is_not(monkeypatch, tmp_path):
    from ds4lab.audit import analyze

    rec, _, _ = S.record(monkeypatch, tmp_path, host_counter=False, host_slot=False)
    tl = AA.token_launches(rec.table(), "decode_step")
    st = A.load(tmp_path / "arguments.json.gz")
    inside = (tl.start_ns[2] + tl.end_ns[2]) // 2
    st.ops = {0: _copy_op(inside), 1: _copy_op(tl.start_ns[0] - 10_000_000, dim=1)}
    A.save(st, tmp_path / "arguments.json.gz")
    (r,) = analyze([rec.table()], token_range="decode_step")
    F.attach(r, tmp_path / "arguments.json.gz", rec.table(), tmp_path / "arguments.csv.gz")
    (row,) = r.arguments.refusals.itertuples()
    assert row.call_class == F.HOST_COPY and row.token_range == "2" and row.where.startswith("/home/u/engine/mask.py:12")
    assert "copy of a 0-dim CPU tensor that is not pinned: PyTorch refuses it" in row.what and "Copy.cu" in row.rule_source
    v = F.verdict(r)
    assert v.verdict == F.REFUSED and "pageable host copy" in v.why and "mask.py:12" in v.why
    assert F.table([r])["call_class"].tolist()[0] == F.HOST_COPY
    assert F.meta(r)["refused_copies"] == 1 and F.meta(r)["operator_log"]


def test_the_op_log_round_trips_and_pruning_keeps_the_kept_launches_calls_and_every_copy(monkeypatch, tmp_path):
    rec, _, _ = S.record(monkeypatch, host_slot=False)
    st = _with_ops(rec, lambda t: "same").arguments
    st.ops[len(st.ops)] = _copy_op(5)
    tl = AA.token_launches(rec.table(), "decode_step")
    A.prune(st, tl)
    kept = set(st.op_of)
    assert set(st.stacks) <= kept and len(kept) == 15  # embed's, rope's, kv_write's in 5 tokens: they differ
    assert {st.ops[st.op_of[c]]["name"] for c in kept} == {"aten::rope", "aten::embed", "aten::kv_write"}
    assert any("copy" in o for o in st.ops.values()) and len(st.ops) == len(set(st.op_of.values())) + 1
    back = A.load(A.save(st, tmp_path / "a.json.gz"))
    assert back.ops == st.ops and back.op_of == st.op_of


def test_operator_keys_leave_out_data_pointers_and_written_values_and_keep_cpu_values():
    torch = pytest.importorskip("torch")
    from ds4lab.trace.torch_ops import _read, _written, describe

    a, b = torch.arange(4.0), torch.arange(4.0) + 10

    def k(*args, func=None):  # the key as the op log makes it: read raw in the call, described after the pass
        w = _written(func) if func else set()
        return describe([(i, _read(torch, x, i in w), i in w) for i, x in enumerate(args)])["key"]

    assert k(a, 3) == k(a.clone(), 3) and k(a, 3) != k(b, 3)  # another storage, same values: same key
    assert k(torch.tensor(3), 1) != k(torch.tensor(4), 1)  # a 0-dim CPU tensor's value is a host argument
    assert k(a, 3) != k(a, 4) and k(a, 3) != k(a.reshape(2, 2), 3)
    copy = torch.ops.aten.copy_.default
    assert (k(torch.empty(()), torch.tensor(3), func=copy) == k(torch.full((), 9.0), torch.tensor(3), func=copy))


@pytest.mark.parametrize("stack, ops, refused", [
    ("run.py:3 <module>;transformers/cache_utils.py:558 update", {}, True),     # torch.tensor(..., device="cuda")
    ("run.py:3 <module>;cupy/_creation/from_data.py:40 array", {}, False),    # CuPy's own copy
    ("run.py:3 <module>;transformers/cache_utils.py:558 update", None, False),  # no torch in the pass
])
def test_a_pageable_cuda_copy_in_a_token_of_a_torch_pass_is_refused_unless_another_library_made_it(
        monkeypatch, stack, ops, refused):
    import dataclasses

    import pandas as pd
    from ds4lab.trace.events import make_frame

    rec, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False)
    table = rec.table()
    tl = AA.token_launches(table, "decode_step")
    t = (tl.start_ns[1] + tl.end_ns[1]) // 2
    extra = make_frame([
        {"kind": "api", "name": "cudaMemcpyAsync", "correlation": 999_999, "start_ns": t, "end_ns": t + 10, "stack": stack},
        {"kind": "memcpy", "name": "Memcpy HtoD", "correlation": 999_999, "start_ns": t + 20, "end_ns": t + 30,
         "copy_kind": "HtoD", "host_memory": "pageable", "bytes": 8}])
    table = dataclasses.replace(table, frame=pd.concat([table.frame, extra], ignore_index=True)
                                .sort_values("start_ns", kind="stable").reset_index(drop=True))
    rec.arguments.ops = ops
    aa = F.compare(rec.arguments, table)
    if not refused:
        assert aa.refusals.empty
        return
    (row,) = aa.refusals.itertuples()
    assert row.name == "cudaMemcpyAsync" and row.token_range == "1" and row.where.startswith("transformers/cache_utils.py:558")
    assert "8 B with pageable host memory, made in a pass that ran PyTorch" in row.what


def test_a_word_that_is_a_temporary_in_some_tokens_and_no_live_address_in_others_is_harmless():
    """The operator evidence (same operator, same host arguments) with, per token, a temporary of the token,
    free space of the caching allocator, or no address at all: harmless; a live allocation that is not the
    token's own, or one of the operator's own tensors, is never explained away."""
    op = {"name": "aten::_grouped_mm", "key": "k", "text": "cuda bfloat16[4, 256]", "spans": [[0x9000, 0x100]]}
    tmp = ("torch block", 0x7000, 0x1000, 5, 9)
    seg = ("caching-allocator segment", 0x6000, 0x200000, -1, -1)
    def explained(ops, ints, locs, lives):  # as _classify tells a word the operator evidence explains
        return F._addresses_nothing(ops, ints, locs, lives) if F._same_operator(ops) else None

    assert explained([op, op], [0x7800, 0x1], [tmp, None], ["own", "unknown"]) == F.TEMPORARY
    assert explained([op, op], [0x6100, 0x6900], [seg, seg], ["unknown", "unknown"]) == F.UNSET
    assert explained([op, op], [0x7800, 0x1], [tmp, None], ["persistent", "unknown"]) is None
    assert explained([op, op], [0x9010, 0x1], [None, None], ["unknown", "unknown"]) is None
    other = {**op, "key": "k2"}
    assert explained([op, other], [0x1, 0x2], [None, None], ["unknown", "unknown"]) is None


ELSEWHERE = [[0x7F50_0000_0000, 4096]]  # the operator's own tensors, away from the cache


@pytest.mark.parametrize("case, expect", [
    ("odd, outside the operator's tensors", F.UNSET),
    ("even, outside the operator's tensors", F.FROZEN_ADDRESS),
    ("odd, inside the operator's tensors", F.FROZEN_ADDRESS),
    ("odd, the operator's tensors unknown", F.FROZEN_ADDRESS),
])
def test_a_word_inside_a_live_block_is_unset_only_when_odd_and_outside_the_operators_tensors(monkeypatch, case,
                                                                                            expect):
    """An unused 8-byte slot whose low half holds a set size (1) and whose high half what the host stack
    held can fall inside a live GPU block by chance (``0x7fb500000001`` on the H200): odd, and no tensor of
    its operator is there, it addresses nothing; an even word, or one inside the operator's tensors, or one
    whose operator's tensors are unknown, stays an address the graph freezes."""
    odd = not case.startswith("even")
    rec, _, _ = S.record(monkeypatch, slot_of=lambda pos: S.CACHE + 64 * (pos % 3) + (1 if odd else 0))
    spans = ([[S.CACHE, 1 << 20]] if "inside" in case else [] if "unknown" in case else ELSEWHERE)
    aa = F.compare(_with_ops(rec, lambda t: "same", spans=spans, name="aten::copy_", kernel="kv_write").arguments,
                   rec.table())
    kv = aa.findings[(aa.findings["name"] == "kv_write") & (aa.findings["param"] == 0)]  # param 1: a temporary
    assert list(kv["call_class"]) == [expect]
    assert (expect == F.UNSET) == (not (aa.frozen["name"] == "kv_write").any())


def test_an_argument_pass_run_on_a_script_starts_torch_first(monkeypatch):
    """``ds4lab audit run``'s argument pass starts before the script imports torch: the runner imports it
    and starts its CUDA side first, so that the op log and the caching allocator are followed (and says so);
    where torch is not installed or sees no GPU, nothing is started and nothing said."""
    import importlib.util
    import sys
    from types import SimpleNamespace

    from ds4lab.trace import recording as REC

    started = []
    fake = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True, init=lambda: started.append(1)))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "torch" else None)
    note = REC._load_torch()
    assert started == [1] and "torch imported and its CUDA side initialized before the script" in note
    fake.cuda.is_available = lambda: False
    assert REC._load_torch() == "" and started == [1]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert REC._load_torch() == ""
