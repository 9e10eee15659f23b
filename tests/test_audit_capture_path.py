"""The capture-path pass (:mod:`ds4lab.trace.capture_path`, :mod:`ds4lab.audit.capture_path`): PyTorch's
question answered yes inside the block and put back after it; the pass found beside a recording; the graph
plans modeled on its tokens (which launch the mask a graph of the step holds), the recorded path's beside
them; ``audit validate``'s comparison using the modeled token's kernels and holding the time of every
captured step."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest

from audit_synth import TraceBuilder, decode_step
from ds4lab.audit import analyze
from ds4lab.audit import capture_path as ACP
from ds4lab.audit.validate import against_torch
from ds4lab.trace import capture_path as CP
from ds4lab.trace.events import make_frame

RANGE = "decode_step"
MASK_US = 6.0


# ----------------------------------------------------------------------------- the pass itself
def _torch_standin():
    real = lambda: False  # noqa: E731 - what CUDA answers eagerly
    graphs = types.SimpleNamespace(is_current_stream_capturing=real)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_current_stream_capturing=real, graphs=graphs)), real


def test_inside_the_block_pytorch_says_the_stream_captures_and_the_questions_are_counted():
    torch, real = _torch_standin()
    with CP.as_if_capturing(torch) as asked:
        assert torch.cuda.is_current_stream_capturing() is True
        assert torch.cuda.graphs.is_current_stream_capturing() is True
        torch.cuda.is_current_stream_capturing()
    assert asked.count == 3
    assert torch.cuda.is_current_stream_capturing is real and torch.cuda.graphs.is_current_stream_capturing is real


def test_the_answer_is_put_back_when_the_block_raises():
    torch, real = _torch_standin()
    with pytest.raises(RuntimeError, match="the step failed"):
        with CP.as_if_capturing(torch):
            raise RuntimeError("the step failed")
    assert torch.cuda.is_current_stream_capturing is real and torch.cuda.is_current_stream_capturing() is False


def test_a_torch_without_the_question_is_refused_by_name():
    with pytest.raises(ImportError, match="is_current_stream_capturing"):
        with CP.as_if_capturing(types.SimpleNamespace(cuda=types.SimpleNamespace())):
            pass


def test_the_questions_are_counted_in_any_suffixed_form_and_nothing_else_is():
    names = ["cudaStreamIsCapturing", "cudaStreamIsCapturing_v10000", "cudaStreamGetCaptureInfo_v2_ptsz",
             "cuStreamIsCapturing", "cudaLaunchKernel", "cudaStreamSynchronize", "cudaStreamIsCapturingX"]
    frame = make_frame([{"kind": "api", "name": n, "start_ns": i, "end_ns": i + 1} for i, n in enumerate(names)]
                       + [{"kind": "kernel", "name": "cudaStreamIsCapturing", "start_ns": 9, "end_ns": 10}])
    assert CP.asks_capture_status(frame) == 4
    assert CP.asks_capture_status(make_frame([])) == 0


def test_the_pass_is_found_beside_its_recording_and_never_beside_itself(tmp_path):
    rec, other = tmp_path / "recording.csv.gz", tmp_path / "run.csv.gz"
    assert CP.capture_path_name(rec) == tmp_path / "capture-path.csv.gz"
    assert CP.capture_path_name(other) == tmp_path / "run.capture-path.csv.gz"
    # a dotted stem keeps its dots, and a sibling of recording.csv.gz never takes its pass
    assert CP.capture_path_name(tmp_path / "my.run.csv.gz") == tmp_path / "my.run.capture-path.csv.gz"
    assert CP.capture_path_name(tmp_path / "recording.old.csv.gz") == tmp_path / "recording.old.capture-path.csv.gz"
    assert CP.capture_path_name(tmp_path / "trace.json") == tmp_path / "trace.capture-path.csv.gz"
    assert CP.is_capture_path(tmp_path / "x.capture-path.csv.gz") and not CP.is_capture_path(rec)
    assert CP.capture_path_beside(rec) is None  # not recorded
    (tmp_path / "capture-path.csv.gz").write_bytes(b"")
    assert CP.capture_path_beside(rec) == tmp_path / "capture-path.csv.gz"
    assert CP.capture_path_beside(tmp_path / "capture-path.csv.gz") is None and CP.capture_path_beside(None) is None


# ----------------------------------------------------------------------------- the plans on it
def _loop(rng, *, capture_path: bool, tokens: int = 10, layers: int = 3, t0: int = 1_000_000, asks: bool = True,
          nvtx: bool = True):
    """A decode loop whose step asks whether the stream captures; on its capture path each layer also
    builds a mask (a kernel of MASK_US µs) before its attention. The other kernels' durations are drawn
    from a generator seeded by ``rng`` (a seed), so both paths of one seed run the same work besides."""
    rng = np.random.default_rng(rng)
    b = TraceBuilder(t0=t0)

    def extra(b, layer):
        if asks:
            b.call("cudaStreamIsCapturing", stream=b.stream)
        if capture_path:
            b.launch("build_causal_mask", MASK_US)

    for p in range(tokens):
        b.pause(20_000)
        if nvtx:
            b.push(RANGE)
        decode_step(b, rng, layers=layers, pos=40, sync=False, extra=extra)
        if nvtx:
            b.pop()
    return b.table("recording.csv.gz" if not capture_path else "capture-path.csv.gz", tool="cupti")


@pytest.fixture
def seed(rng) -> int:
    return int(rng.integers(2**31))


def _plans(rep) -> pd.DataFrame:
    return rep.plans.set_index("plan")


def test_the_graph_plans_are_modeled_on_the_capture_path_and_the_recorded_ones_stay_beside(seed):
    (rep,) = analyze([_loop(seed, capture_path=False)], token_range=RANGE)
    before = _plans(rep)
    spans_before = rep.plans[rep.plans["plan"] == "spans today"].reset_index(drop=True)
    info = ACP.attach(rep, _loop(seed, capture_path=True), token_range=RANGE)
    p = _plans(rep)
    assert info.kernels_per_token == info.recorded_kernels_per_token + 3
    assert info.gpu_busy_us == pytest.approx(info.recorded_gpu_busy_us + 3 * MASK_US, rel=0.15)
    for plan in ACP.GRAPH_PLANS:
        assert p.loc[plan, "path"] == info.label == "capture path (capture-path.csv.gz)"
        recorded = p.loc[plan + ACP.RECORDED_SUFFIX]
        assert recorded["path"] == "recorded"
        assert recorded["predicted_us"] == pytest.approx(before.loc[plan, "predicted_us"])
        # the graph runs three more kernels a token: at least their time, paced with the rest
        assert p.loc[plan, "predicted_us"] - recorded["predicted_us"] >= 0.9 * 3 * MASK_US
        # the saving is paired with the recorded tokens' measured eager µs (the step run today)
        assert p.loc[plan, "eager_measured_us"] == pytest.approx(before.loc[plan, "eager_measured_us"])
    spans_after = rep.plans[rep.plans["plan"] == "spans today"].reset_index(drop=True)
    pd.testing.assert_series_equal(spans_after["predicted_us"], spans_before["predicted_us"])
    assert (spans_after["path"] == "recorded").all()
    assert any(n.startswith("capture path:") and f"launches {info.kernels_per_token} kernels per token" in n
               and f"recorded tokens' {info.recorded_kernels_per_token}" in n for n in rep.notes)


def test_a_pass_without_tokens_is_refused_and_leaves_the_plans(seed):
    (rep,) = analyze([_loop(seed, capture_path=False)], token_range=RANGE)
    before = rep.plans.copy()
    empty = TraceBuilder()
    empty.launch("lonely", 1.0)
    with pytest.raises(ValueError, match="capture-path"):
        ACP.attach(rep, empty.table("x.capture-path.csv.gz"), token_range=RANGE)
    pd.testing.assert_frame_equal(rep.plans, before)
    assert rep.capture_path is None


def test_a_broken_pass_beside_a_recording_is_said_and_the_plans_stay(seed, tmp_path):
    (rep,) = analyze([_loop(seed, capture_path=False)], token_range=RANGE)
    before = rep.plans.copy()
    (tmp_path / "capture-path.csv.gz").write_bytes(b"not a table")
    assert ACP.attach_beside(rep, tmp_path / "recording.csv.gz", token_range=RANGE) is None
    pd.testing.assert_frame_equal(rep.plans, before)
    assert any(n.startswith("capture-path pass not used:") and "capture-path.csv.gz" in n for n in rep.notes)


def test_validate_compares_the_graph_with_the_modeled_token_and_holds_every_time(seed):
    (rep,) = analyze([_loop(seed, capture_path=False)], token_range=RANGE)
    recorded_whole = float(_plans(rep).loc["whole token", "predicted_us"])
    ACP.attach(rep, _loop(seed, capture_path=True), token_range=RANGE)
    whole = float(_plans(rep).loc["whole token", "predicted_us"])
    kernels = rep.capture_path.kernels_per_token
    run = {"outcome": "captured, replays right", "replay_us": whole, "replay_sync_us": whole * 3,
           "graph_kernels": kernels}
    row = against_torch(rep, run)
    assert row["token_kernels"] == kernels and row["same_work"] is True and row["plan_path"].startswith("capture path")
    assert row["predicted_us"] == pytest.approx(whole) and row["time_agrees"] is True
    # a graph of yet other work: named, and the time still held (here outside: the recorded path's plan was
    # short of this replay by the masks)
    other = against_torch(rep, {**run, "graph_kernels": kernels + 5, "replay_us": whole * 1.3})
    assert other["same_work"] is False and other["time_agrees"] is False
    assert recorded_whole < whole


def test_the_audit_job_models_the_plans_on_the_pass_beside_a_recording(seed, tmp_path):
    from ds4lab.jobs.audit import AuditConfig, run
    from ds4lab.trace.sources.saved import write_table

    write_table(_loop(seed, capture_path=False), tmp_path / "recording.csv.gz")
    write_table(_loop(seed, capture_path=True), tmp_path / "capture-path.csv.gz")
    res = run(AuditConfig(files=(str(tmp_path / "recording.csv.gz"),), token_range=RANGE, out=tmp_path / "audit"))
    plans = pd.read_csv(tmp_path / "audit" / "plans.csv").set_index("plan")
    assert plans.loc["whole token", "path"] == "capture path (capture-path.csv.gz)"
    assert plans.loc["whole token (recorded path)", "path"] == "recorded"
    (rep,) = res.value
    import json

    meta = json.loads((tmp_path / "audit" / "meta.json").read_text())
    assert meta["units"][0]["capture_path"]["kernels_per_token"] == rep.capture_path.kernels_per_token


def test_a_graph_matches_any_token_count_of_the_modeled_tokens():
    """The graph is captured at one position; the capture path's launch list changes with the position
    (a mask padded at some lengths only: 358 kernels at most tokens, 350 at others on the H200)."""
    from ds4lab.audit.validate import same_work

    assert same_work(350, 358, (350, 358)) is True and same_work(358, 358) is True
    assert same_work(349, 358, (350, 358)) is False
    assert same_work(None, 358, (358,)) is None and same_work(350.0, None) is None


def test_the_pass_has_its_own_model_check_beside_the_recorded_one(seed):
    (rep,) = analyze([_loop(seed, capture_path=False)], token_range=RANGE)
    ACP.attach(rep, _loop(seed, capture_path=True), token_range=RANGE)
    checks = rep.plans[rep.plans["plan"] == "eager (model check)"].set_index("path")
    assert set(checks.index) == {"recorded", rep.capture_path.label}
    own = checks.loc[rep.capture_path.label]
    assert own["predicted_us"] == pytest.approx(own["eager_measured_us"], rel=0.1)  # the pass's own tokens


def test_a_pass_that_cannot_be_this_steps_capture_path_is_refused_and_said(seed, tmp_path):
    """Beside a recording whose tokens never ask whether the stream captures; from another step (the header's
    engine); in which PyTorch was never asked; whose tokens are not found by the recording's NVTX range."""
    from ds4lab.trace.sources.saved import write_table

    (quiet,) = analyze([_loop(seed, capture_path=False, asks=False)], token_range=RANGE)
    with pytest.raises(ValueError, match="never ask whether the stream captures"):
        ACP.attach(quiet, _loop(seed, capture_path=True), token_range=RANGE)
    rec = _loop(seed, capture_path=False)
    rec.header = {"engine": "qwen2", "cache": "dynamic", "dtype": "float32"}
    (rep,) = analyze([rec], token_range=RANGE)
    other = _loop(seed, capture_path=True)
    other.header = {"engine": "llama", "cache": "dynamic", "dtype": "float32", "capture_path_asked": 8}
    with pytest.raises(ValueError, match="another step than the recording .*engine 'llama' against 'qwen2'"):
        ACP.attach(rep, other, token_range=RANGE, recorded=rec)
    unasked = _loop(seed, capture_path=True)
    unasked.header = {"capture_path_asked": 0}
    with pytest.raises(ValueError, match="never asked"):
        ACP.attach(rep, unasked, token_range=RANGE)
    with pytest.raises(ValueError, match="no token|would not pair"):
        ACP.attach(rep, _loop(seed, capture_path=True, nvtx=False))
    assert rep.capture_path is None and (rep.plans["path"] == "recorded").all()
    # beside a recording on disk: said in a note that validate puts in its row
    write_table(_loop(seed, capture_path=True), tmp_path / "capture-path.csv.gz")
    assert ACP.attach_beside(quiet, tmp_path / "recording.csv.gz", token_range=RANGE) is None
    assert ACP.not_used(quiet).startswith(ACP.NOT_USED) and "another step" in ACP.not_used(quiet)


def test_auditing_a_pass_itself_says_what_it_is_and_takes_no_argument_pass(seed, tmp_path):
    from ds4lab.jobs.audit import AuditConfig, run
    from ds4lab.trace.sources.saved import write_table

    write_table(_loop(seed, capture_path=False), tmp_path / "recording.csv.gz")
    write_table(_loop(seed, capture_path=True), tmp_path / "capture-path.csv.gz")
    (tmp_path / "arguments.json.gz").write_bytes(b"")  # the recording's argument pass: not the pass's
    res = run(AuditConfig(files=(str(tmp_path / "capture-path.csv.gz"),), token_range=RANGE, out=tmp_path / "a"))
    (rep,) = res.value
    assert rep.arguments is None and rep.capture_path is None
    assert any(n.startswith("capture-path.csv.gz is a capture-path pass") for n in rep.notes)
