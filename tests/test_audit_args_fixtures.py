"""The argument fixtures recorded on an H200 (``scripts/make_audit_fixtures.py``, or ``--from`` an ``audit
validate`` folder, writes them into ``tests/data/audit_args/``): on the CPU, the audit of each recording
with its argument pass is held to what torch.cuda.graph did with the same step (``engine.json`` beside
it), through the same path as ``ds4lab audit validate --runs-from``. The rules held on every fixture
there (whichever are present): the verdict names torch's outcome; a step that replays right has no frozen
finding, and every changing word of it is listed apart (unset bytes, not a value of the step); a step
that replays wrong leads with the cause its truth names; check_replay agrees where it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4lab.audit.analysis import analyze
from ds4lab.audit.arguments import store_beside
from ds4lab.audit.capture_path import RECORDED_SUFFIX, attach_beside
from ds4lab.audit.frozen import HOST_COPY, NOT_VALUES, RIGHT, TEMPORARY, UNSET, WRONG, attach, verdict
from ds4lab.audit.plans import TRACED, attach_untraced_beside
from ds4lab.trace.sources import read_events as read
from ds4lab.audit.steps import steps_folder
from ds4lab.audit.validate import OUTCOMES, TIME_TOLERANCE, against_torch, cause_first, saved_run

ROOT = Path(__file__).parent / "data" / "audit_args"
RUNS = sorted(p for p in ROOT.glob("*") if (p / "engine.json").is_file()) if ROOT.is_dir() else []
#: Runs the audit still gets wrong, and why (strict: a fix turns them into failures until removed here).
KNOWN_WRONG: dict = {}


def _audit(run: Path):
    # as audit validate --runs-from does: the tokens found as a user's are (the step's own NVTX range); the
    # markers pass (none in these runs: recorded before it existed), then the capture-path pass
    table = read(run / "recording.csv.gz")
    rep = analyze([table])[0]
    attach(rep, store_beside(run / "recording.csv.gz"))
    attach_untraced_beside(rep, run / "recording.csv.gz", recorded=table)
    attach_beside(rep, run / "recording.csv.gz", recorded=table)
    assert rep.tokens.range_name, rep.tokens.how  # every fixture marks its steps with an NVTX range
    return rep, saved_run(run)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_step_that_replays_right_has_no_frozen_finding_and_its_changing_words_are_listed_apart(run):
    rep, torch_run = _audit(run)
    if OUTCOMES.get(torch_run["outcome"]) != RIGHT:
        pytest.skip(f"torch: {torch_run['outcome']}")
    f = rep.arguments.findings
    assert len(rep.arguments.frozen) == 0, rep.arguments.frozen[["name", "call_class", "evidence"]].to_string()
    words = f[~f["call_class"].isin((TEMPORARY,))] if len(f) else f
    assert words.empty or words["call_class"].isin(NOT_VALUES).all(), words[["name", "call_class"]].to_string()
    assert all(v == "allowed" for v in words.get("verdict", []))


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_step_that_replays_wrong_leads_with_its_true_cause(run):
    rep, torch_run = _audit(run)
    cause = torch_run.get("cause")
    if OUTCOMES.get(torch_run["outcome"]) != WRONG or not cause:
        pytest.skip("no wrong replay with a cause its truth names")
    v = verdict(rep)
    assert v.verdict == WRONG and cause_first(v.lead, cause, steps_folder()), (v.why, cause)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_check_replay_named_torchs_outcome(run):
    torch_run = saved_run(run)
    chk = torch_run.get("check")
    if not chk:
        pytest.skip("a run made before check_replay was kept beside the truth")
    assert chk.get("verdict") == OUTCOMES[torch_run["outcome"]], chk


def test_the_fixtures_are_shipped():
    assert {p.name for p in RUNS} >= {"handwritten-host-counter-float32", "handwritten-device-counter-float32",
                                       "handwritten-host-read-float32", "mistral-static-float32",
                                       "qwen2-dynamic-float32", "llama-static-float32"}


@pytest.mark.parametrize("run", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_WRONG[p.name], strict=True))
                                 if p.name in KNOWN_WRONG else p for p in RUNS], ids=lambda p: p.name)
def test_the_audit_with_arguments_names_what_torch_did(run):
    rep, torch_run = _audit(run)
    row = against_torch(rep, torch_run)
    assert row["audit_verdict"] == OUTCOMES[torch_run["outcome"]], (row["audit_verdict"], row["audit_why"])
    assert not (row["audit_verdict"] == RIGHT and OUTCOMES[torch_run["outcome"]] != RIGHT)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_launch_was_read_and_the_plan_meets_the_replay(run):
    """The whole-token plan meets the truth's loop that never waits. These runs carry no markers pass (they
    were recorded before it existed), so their plans price the loop's work outside the token at its traced
    cost; where that traced cost sets the plan and the measured replay lies between the plan and its device
    floor (only the loop's untraced times could place it), the time is not held, and the test says so
    (validate's time_note) instead of passing or failing on a figure the recording cannot give."""
    rep, torch_run = _audit(run)
    assert rep.arguments is not None and rep.arguments.unread == 0
    row = against_torch(rep, torch_run)
    if torch_run["outcome"] != "refused":
        assert row["measured_loop"].startswith("never waits")
        if row["time_agrees"] is None:
            assert rep.untraced is None and row["host_times"] == TRACED
            assert row["device_floor_us"] <= row["replay_us"] * (1 + TIME_TOLERANCE) < row["predicted_us"]
            pytest.skip(f"{run.name}: {row['time_note']}")
        assert row["time_agrees"], row["predicted_over_measured"]
        assert abs(row["predicted_over_measured"] - 1) <= TIME_TOLERANCE


def test_the_host_counters_mask_bound_is_named_as_a_frozen_value():
    run = ROOT / "handwritten-host-counter-float32"
    rep, _ = _audit(run)
    fr = rep.arguments.frozen
    bound = [r for _, r in fr.iterrows() if "compare" in str(r["name"]).lower() or "vectorized" in str(r["name"])]
    steps = []
    for r in bound:
        vals = [int(v) for v in str(r["values"]).replace("…", "").split(",") if v.strip().lstrip("-").isdigit()]
        if len(vals) >= 3 and all(b - a == 1 for a, b in zip(vals, vals[1:])):
            steps.append(r)
    assert steps, "the mask bound (the host's position, one more at every token) is among the frozen values"
    r = steps[0]
    assert r["param"] >= 0 and r["byte_offset"] >= 0 and "kernel" in str(r["name"])
    assert "ds4lab/audit/families.py" in str(r["where"]) and "__call__" in str(r["where"])  # the step's own line
    # the operator that set it from host arguments that change, named with them
    assert "set by aten::" in r["what"] and "from host arguments that change" in r["what"]


def test_the_device_counters_changing_words_are_bytes_no_argument_set():
    """The device-counter decoder replays right on the H200; its TensorIterator kernels' by-value structs
    change at every token (host stack and heap left in unused slots) under operators whose host arguments
    do not: unset bytes, harmless, and the verdict is "replays right"."""
    rep, torch_run = _audit(ROOT / "handwritten-device-counter-float32")
    f = rep.arguments.findings
    unset = f[f["call_class"] == UNSET]
    assert torch_run["outcome"] == "captured, replays right" and len(unset) >= 3
    assert all("every host argument of aten::" in w for w in unset["what"]) and len(rep.arguments.frozen) == 0
    assert rep.arguments.op_log and (unset["verdict"] == "allowed").all()


def test_a_pageable_copy_in_a_sliding_window_cache_update_is_pytorchs_refusal():
    """Mistral with a static cache: once the sliding layer is full its update builds an index with
    torch.tensor([-1], device=...) every token, a pageable host-to-device copy PyTorch refuses under capture
    (CUDA alone would capture it), named at transformers' line."""
    rep, torch_run = _audit(ROOT / "mistral-static-float32")
    r = rep.arguments.refusals
    assert torch_run["outcome"] == "refused" and "pinned" in torch_run["detail"]
    assert len(r) and (r["call_class"] == HOST_COPY).all()
    assert any("transformers/cache_utils.py" in w for w in r["where"]) and "Copy.cu" in r["rule_source"].iloc[0]


def test_the_plan_is_held_to_every_graph_and_other_work_is_named():
    """A graph with other kernel nodes than the modeled token launches (work the recording did not see)
    is named beside the time, and the time is still held to the plan: no captured step is left out."""
    from ds4lab.audit.validate import same_work

    run = ROOT / "handwritten-device-counter-float32"
    rep, torch_run = _audit(run)
    same = against_torch(rep, {**torch_run, "graph_kernels": 35})
    assert same["token_kernels"] == 35 and same["same_work"] is True and same["time_agrees"] is True
    assert same["plan_path"] == "recorded"  # this step never asks whether the stream captures
    slow = {**torch_run, "graph_kernels": 41, "replay_us": torch_run["replay_us"] * 1.5}
    other = against_torch(rep, slow)
    assert other["same_work"] is False and other["time_agrees"] is False
    assert other["predicted_over_measured"] == pytest.approx(same["predicted_over_measured"] / 1.5)
    assert against_torch(rep, {k: v for k, v in torch_run.items() if k != "graph_kernels"})["same_work"] is None
    assert same_work(None, 35) is None and same_work(35.0, 35) is True


def test_a_step_that_asks_whether_the_stream_captures_is_modeled_on_its_capture_path():
    """Qwen2 with a dynamic cache on the H200: transformers asks whether the stream captures; its capture-path
    pass launches the mask and the memory-efficient attention the graph holds (198 kernel nodes, the count
    of some of the pass's tokens: the mask is padded at some positions only), not the recorded tokens'
    math attention; the whole-token plan is modeled on it and meets the replay, the recorded path's plan
    beside it."""
    rep, torch_run = _audit(ROOT / "qwen2-dynamic-float32")
    cp = rep.capture_path
    assert cp is not None and torch_run["graph_kernels"] in cp.kernel_counts
    assert torch_run["graph_kernels"] != cp.recorded_kernels_per_token  # the eager tokens are other work
    row = against_torch(rep, torch_run)
    assert row["plan_path"] == "capture path (capture-path.csv.gz)" and row["same_work"] is True
    assert row["time_agrees"]
    plans = rep.plans.set_index("plan")
    assert plans.loc["whole token", "path"] == row["plan_path"]
    assert plans.loc["whole token" + RECORDED_SUFFIX, "path"] == "recorded"


def test_an_odd_word_inside_a_live_block_is_unset_bytes_not_a_frozen_address():
    """Llama with a static cache replays right on the H200. One token's direct-copy kernel (repeat_kv)
    carries 0x7fb7_0000_0001 where the others carry 0x7fb5_0000_0001 in an unused offset-calculator slot
    (a set 1 in the low half, the top of a host pointer in the high): inside a live torch block by chance,
    odd, and outside every tensor of aten::copy_: bytes no argument set, and the verdict replays right."""
    rep, torch_run = _audit(ROOT / "llama-static-float32")
    f = rep.arguments.findings
    odd = f[f["values"].astype(str).str.contains("0x7fb500000001")]
    assert len(odd) and (odd["call_class"] == UNSET).all()
    assert len(rep.arguments.frozen) == 0 and against_torch(rep, torch_run)["audit_verdict"] == RIGHT


def test_validate_runs_from_finds_the_true_cause_of_a_run_copied_from_where_it_ran(tmp_path):
    """A fixture names its script as it ran (``cupy_kv_row.py``, no folder): the statement holding the cause's
    line is read from the steps folder, as the fixture test reads it, so ``--runs-from`` agrees with it."""
    from ds4lab.audit.validate import validate

    df = validate(("cupy_kv_row",), (), tmp_path / "v", runs_from=ROOT, say=lambda *a: None)
    row = df.iloc[0]
    assert row["audit_verdict"] == WRONG and row["cause_first"] == True  # noqa: E712
    assert row["time_agrees"] is None and "no untraced (markers) pass" in row["time_note"]
