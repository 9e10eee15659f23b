"""A byte is a value of the step only with evidence (:mod:`ds4lab.audit.frozen`): a word of a PyTorch
operator's kernel whose host arguments change is a frozen value where it follows one of them (a host
counter fed to ``aten::le.Scalar``: 10, 11, 12; a host-computed float scale, multiplied or divided by),
else it is listed apart as *not a value of the step* and never decides the verdict; words under an
operator whose host arguments are the same are *unset bytes*; launches outside any operator (CuPy,
Triton, C) keep the parameter-level comparison; the verdict names the strongest finding first.

The passes are the stand-in CUPTI's (:mod:`audit_args_synth`) with real parameter bytes, their launches
tagged with operator calls as :mod:`ds4lab.trace.torch_ops` describes them (:func:`describe` of raw
records: no torch needed)."""

from __future__ import annotations

import math
import struct

import pandas as pd
import pytest

import audit_args_synth as S
from ds4lab.audit import frozen as F
from ds4lab.trace.torch_ops import DICT, OPAQUE, TENSOR, describe

GARBAGE = [0x7FFD_1A2B_3C40, 0x55C3_0011_0F30, 0x7FFD_99E0_0010, 0x2290_F30A_4B0A, 0x7F11_0000_4960,
           0x4B0A_4960_0000, 0x7FFE_0101_0101]


def _tensor(shape, stride, offset=0, start=0x7F50_0000_0000, dev="cuda", values=None):
    return (TENSOR, dev, "torch.float32", tuple(shape), tuple(stride), offset, start, 4096, values, False)


def _tag(rec, kernel, op_of_token):
    """Tag every launch with an operator call: ``kernel``'s with ``op_of_token(t)`` (a dict of describe's
    fields and ``name``), the others with one call each of a constant key."""
    plain = {**describe([(0, _tensor([4], [1]), False)])}
    return S.tag_ops(rec, lambda t, kname: op_of_token(t) if kname == kernel else {"name": f"aten::{kname}", **plain})


def _op(name, *args, **kwargs):
    """describe() of an operator call with positional ``args`` (raw records or numbers) named by the schema."""
    names = ("self", "other", "alpha")
    raw = [(k, a, False) for k, a in enumerate(args)] + [(k, a, False) for k, a in kwargs.items()]
    return {"name": name, **describe(raw, names)}


class _Report:
    findings, tool = None, "cupti"

    def __init__(self, aa):
        self.arguments = aa


def test_describe_keys_host_arguments_without_data_pointers_and_lists_their_numbers():
    a = describe([(0, _tensor([2, 8], [8, 1], start=0x1000), False), (1, 10, False)], ("self", "other"))
    b = describe([(0, _tensor([2, 8], [8, 1], start=0x9000), False), (1, 10, False)], ("self", "other"))
    c = describe([(0, _tensor([2, 8], [8, 1], offset=16), False), (1, 10, False)], ("self", "other"))
    assert a["key"] == b["key"] != c["key"] and a["spans"] == [[0x1000, 4096]]
    vals = dict((k, v) for k, v in a["vals"])
    assert vals["other"] == 10 and vals["self.size1"] == 8 and vals["self.numel"] == 16 and vals["self.offset"] == 0
    cpu = describe([(0, _tensor([], [], dev="cpu", values=[26]), False)], ("self",))
    assert dict((k, v) for k, v in cpu["vals"])["self"] == 26 and "=26" in cpu["text"]
    big = describe([(0, _tensor([5000], [1], dev="cpu", values=OPAQUE), False)], ("self",))
    assert big["opaque"] and describe([(0, _tensor([1], [1], dev="cpu", values=None), True)])["text"].endswith("(written)")
    kw = describe([("out", _tensor([3], [1], start=0x5000), True), ("value", 2.5, False)])
    assert kw["spans"] == [[0x5000, 4096]] and ["value", 2.5] in kw["vals"] and "out" not in kw["text"]
    d = describe([(0, (DICT, (("k", 3),)), False)])
    assert ["k", 3] in d["vals"]


def _record(monkeypatch, struct_of, **kw):
    rec, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False, struct_of=struct_of, **kw)
    return rec


def _classes(aa, kernel="elementwise"):
    f = aa.findings[aa.findings["name"] == kernel]
    return {int(r.byte_offset): r.call_class for r in f.itertuples() if r.param == 1}


def test_a_host_counter_fed_to_an_operator_is_a_value_and_its_padding_is_not(monkeypatch):
    """``aten::le.Scalar(arange, pos)``: the word holding pos (17, 18, …) follows the operator's ``other``;
    the slots holding what the host stack held follow nothing: not a value of the step; the verdict names
    the counter, its operator's argument and how it moves."""
    rec = _record(monkeypatch, lambda pos, t: [2, GARBAGE[t], pos, GARBAGE[-1 - t]])
    st = _tag(rec, "elementwise", lambda t: _op("aten::le.Scalar", _tensor([256], [1]), 17 + t))
    aa = F.compare(st, rec.table())
    assert _classes(aa) == {24: F.FROZEN_VALUE, 16: F.NOT_VALUE, 32: F.NOT_VALUE}
    row = aa.frozen.iloc[0]
    assert row["name"] == "elementwise" and "aten::le.Scalar's other: 17, 18, 19" in row["evidence"]
    assert "+1 per token" in row["evidence"] and row["strength"] == F.STRENGTH["tracked"]
    v = F.verdict(_Report(aa))
    assert v.verdict == F.WRONG and v.lead["byte_offset"] == 24 and "parameter 1 (byte 24)" in v.why
    assert "2 word(s) not a value of the step" in v.evidence


def test_words_no_changing_argument_reaches_never_say_wrong_and_never_say_right(monkeypatch):
    """An operator whose host numbers change (a length) while its kernel's changing words follow none of
    them: nothing is frozen, and the verdict cannot say "replays right" either."""
    rec = _record(monkeypatch, lambda pos, t: [2, GARBAGE[t], 5, GARBAGE[-1 - t]])
    st = _tag(rec, "elementwise", lambda t: _op("aten::arange.start_step", 0, 1000 + 7 * t * t, 1))
    aa = F.compare(st, rec.table())
    assert set(_classes(aa).values()) == {F.NOT_VALUE} and len(aa.frozen) == 0
    v = F.verdict(_Report(aa))
    assert v.verdict == F.UNKNOWN and "follow none of them (aten::arange.start_step)" in v.why


def test_the_same_host_arguments_make_every_changing_word_unset_and_the_step_replays_right(monkeypatch):
    rec = _record(monkeypatch, lambda pos, t: [2, GARBAGE[t], 5, GARBAGE[-1 - t]])
    st = _tag(rec, "elementwise", lambda t: _op("aten::masked_fill.Scalar", _tensor([256], [1]), -math.inf))
    aa = F.compare(st, rec.table())
    assert set(_classes(aa).values()) == {F.UNSET}
    assert F.verdict(_Report(aa)).verdict == F.RIGHT


@pytest.mark.parametrize("op, host, word", [
    ("aten::mul.Tensor", lambda p: 1 / math.sqrt(p), lambda p: 1 / math.sqrt(p)),   # x * scale
    ("aten::div.Tensor", lambda p: math.sqrt(p), lambda p: 1 / math.sqrt(p)),       # x / sqrt(L): 1/s in the kernel
    ("aten::sub.Tensor", lambda p: float(p), lambda p: -float(p)),                  # alpha -1
])
def test_a_host_computed_float_scale_is_a_value_as_its_kernel_holds_it(monkeypatch, op, host, word):
    """A float the host computes from the length reaches a TensorIterator functor as float32 (opmath), in
    the low half of a word whose high half is left over: multiplied, divided by (the kernel multiplies by
    its reciprocal) or subtracted (negated)."""
    def words(pos, t):
        return [2, struct.pack("<f", word(pos)) + struct.pack("<I", 0x7FFD0000 + 17 * t), 5, 0]

    rec = _record(monkeypatch, words)
    st = _tag(rec, "elementwise", lambda t: _op(op, _tensor([1, 64], [64, 1]), host(17 + t)))
    aa = F.compare(st, rec.table())
    assert _classes(aa) == {16: F.FROZEN_VALUE}, aa.findings[["byte_offset", "call_class", "what"]]
    assert "float32" in aa.frozen.iloc[0]["what"]


def test_a_launch_outside_any_operator_keeps_the_parameter_level_comparison(monkeypatch):
    """A CuPy or Triton kernel (no operator open at its launch): a changing by-value int is a value, and
    one that moves by a constant per token is the strongest evidence there is."""
    rec = _record(monkeypatch, lambda pos, t: [2, GARBAGE[t], pos, 0])
    st = rec.arguments
    st.ops, st.op_of = {}, {}  # a torch pass whose op log saw no operator around these launches
    aa = F.compare(st, rec.table())
    assert _classes(aa) == {16: F.FROZEN_VALUE, 24: F.FROZEN_VALUE}
    first = aa.frozen.iloc[0]
    assert first["byte_offset"] == 24 and first["strength"] == F.STRENGTH["position"]
    assert "outside any PyTorch operator" in first["evidence"] and "+1 per token" in first["evidence"]


def test_the_verdict_leads_with_the_strongest_evidence_and_counts_the_others():
    """A report whose findings hold a constant masked_fill value frozen by a pass without evidence, a grid
    that changes, and a Triton position moving +1 per token: the position is named first."""
    rows = pd.DataFrame([
        {"kind": "argument", "name": "masked_fill_kernel", "call_class": F.FROZEN_VALUE, "param": 1, "byte_offset": 24,
         "values": "583613616, 1258973536", "where": "step.py:131 forward", "strength": F.STRENGTH["value"],
         "evidence": "by value outside any PyTorch operator: 583613616, 1258973536", "verdict_global": "frozen"},
        {"kind": "variation", "name": "attn_kernel", "call_class": "grid", "where": "step.py:90 attn",
         "what": "launch 3 of the token: 2 distinct grids", "verdict_global": "frozen"},
        {"kind": "argument", "name": "bias_kernel", "call_class": F.FROZEN_VALUE, "param": 3, "byte_offset": 0,
         "values": "17, 18, 19", "where": "step.py:57 step", "strength": F.STRENGTH["position"],
         "evidence": "by value outside any PyTorch operator: 17, 18, 19 (+1 per token)", "verdict_global": "frozen"},
    ])

    class R:
        findings, tool, arguments = rows, "cupti", None

    v = F.verdict(R)
    assert v.verdict == F.WRONG and v.why.startswith("kernel bias_kernel, parameter 3 (byte 0): frozen value")
    assert "+1 per token" in v.why and "at step.py:57 step" in v.why and v.why.endswith("and 2 other finding(s)")
    assert v.lead["where"] == "step.py:57 step" and v.others == 2
    assert F.strength(rows.iloc[1]) == F.STRENGTH["structure"]


def test_among_findings_of_equal_strength_the_verdict_leads_with_the_one_seen_in_more_tokens():
    """Three grid changes (equal evidence): one in 2 of 8 tokens listed first, one in every token after the
    first listed last. The verdict names the one seen in 7 tokens; its order in the table does not decide."""
    def grid(name, tokens):
        return {"kind": "variation", "name": name, "call_class": "grid", "where": "nvtx: decode_step",
                "what": "launch 1 of the token: 2 distinct grids", "tokens": tokens, "verdict_global": "frozen"}

    rows = pd.DataFrame([grid("gemv_kernel", 2), grid("cat_kernel", 6), grid("elementwise_kernel", 7)])

    class R:
        findings, tool, arguments = rows, "cupti", None

    v = F.verdict(R)
    assert v.lead["name"] == "elementwise_kernel" and v.others == 2, v.why
    rows.loc[2, "tokens"] = 1
    assert F.verdict(R).lead["name"] == "cat_kernel"


def _fill_op(t):
    """aten::fill_(ids, pos): the static input buffer written with the host's position."""
    return _op("aten::fill_", _tensor([1], [1], start=S.IDS), value=17 + t)


@pytest.mark.parametrize("at, expect", [("head", F.RIGHT), ("middle", F.WRONG)])
def test_inputs_written_at_the_head_of_the_token_are_no_part_of_its_graph(monkeypatch, at, expect):
    """A loop that writes the position into a static input buffer inside its NVTX range, before any of the
    step's work: the step's input (a graph of the step leaves it out; it is written before each replay);
    the same fill after the step's first kernel is the step's own work, and frozen."""
    rec, _, _ = S.record(monkeypatch, host_counter=False, host_slot=False, fill_at=at)
    st = _tag(rec, "fill", _fill_op)
    aa = F.compare(st, rec.table())
    fill = aa.findings[aa.findings["name"] == "fill"]
    v = F.verdict(_Report(aa))
    assert v.verdict == expect, v.why
    if at == "head":
        assert list(fill["call_class"]) == [F.INPUT] and "aten::fill_" in fill["what"].iloc[0]
        assert "write its inputs from the host" in v.evidence
    else:
        assert (fill["call_class"] == F.FROZEN_VALUE).any() and "aten::fill_'s value" in v.why


def test_a_pageable_copy_into_a_static_input_at_the_head_is_an_input_and_one_later_is_refused(monkeypatch,
                                                                                           tmp_path):
    from ds4lab.audit import arguments as AA_
    from ds4lab.trace import arguments as A

    # (fill_at: the static input buffer is allocated before the tokens, as a user's is)
    rec, _, _ = S.record(monkeypatch, tmp_path, host_counter=False, host_slot=False, fill_at="head")
    tl = AA_.token_launches(rec.table(), "decode_step")
    st = A.load(tmp_path / "arguments.json.gz")
    head = tl.tokens[2][0][2] - 1  # just before the token's first launch
    later = (tl.start_ns[3] + tl.end_ns[3]) // 2
    copy = {"name": "aten::copy_", "key": "k", "text": "cuda int64[1] (written), cpu int64[1]=[26]",
            "spans": [[S.IDS, 8]], "cpu": [[1, 1, False]], "opaque": False, "vals": [],
            "copy": {"dim": 1, "numel": 1, "direction": "h2d", "stack": "run.py:3 <module>;run.py:9 advance"}}
    st.ops = {0: {**copy, "t_ns": head}, 1: {**copy, "t_ns": later}}
    aa = F.compare(st, rec.table())
    assert list(aa.refusals["token_range"]) == ["3"]
