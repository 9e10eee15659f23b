"""The plans priced at a loop's untraced host times (:func:`ds4lab.audit.plans.attach_untraced`): a synthetic
user loop recorded with its host 5x slower than it runs (a tracer's cost on every call), and the markers pass of
the same loop untraced (its NVTX ranges alone). With the pass the whole-token plan keeps the loop's work outside
the token at its untraced time and is set by the device where the device is slower; the savings are set against
the untraced eager tokens, paired; a pass of another program, or of another number of tokens, is refused and
leaves the plans as they were."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from audit_synth import TraceBuilder, markers_pass, user_loop
from ds4lab.audit import analyze
from ds4lab.audit import capture_path as ACP
from ds4lab.audit.plans import (MARKERS_NOT_USED, TRACED, UNTRACED, Untraced, attach_untraced,
                                attach_untraced_beside)
from ds4lab.audit.validate import against_torch, held
from ds4lab.sim.costmodel import Calibration

CAL = Calibration.load(None)
INFLATE = 5.0
#: a graph of 10 nodes of 5 µs: paced by their durations, each boundary the calibration's node gap
GRAPH_US = 10 * 5.0 + 9 * CAL.graph_node_gap_us
LOOP_DEVICE_US = 1.0 + 3.0  # the loop's fill and argmax, after the token's work on the same queue


def _audit(**kw):
    """The traced recording's report, and the markers pass of the same loop untraced."""
    (rep,) = analyze([user_loop(inflate=INFLATE, **kw).table("recording.csv.gz", tool="cupti")])
    return rep, markers_pass(user_loop(inflate=1.0, **kw))


def _whole(rep) -> pd.Series:
    return rep.plans.set_index("plan").loc["whole token"]


def test_a_device_bound_loop_is_priced_at_its_untraced_outside_work_and_set_by_its_device():
    """Outside the token the loop takes 20 µs untraced, 100 traced; the graph and the loop's kernels take
    ~58 µs of device: traced, the host (100 µs and more) sets the plan; untraced, the device does."""
    rep, marks = _audit(outside_us=20.0)
    traced = _whole(rep)
    assert traced["host_times"] == TRACED and traced["predicted_us"] > 5 * 20.0
    assert rep.model.host_sets_whole(rep.scalars)
    u = attach_untraced(rep, marks)
    whole = _whole(rep)
    assert whole["host_times"] == u.label == "untraced (recording.markers.csv.gz)"
    assert whole["predicted_us"] == pytest.approx(GRAPH_US + LOOP_DEVICE_US, rel=1e-6)
    assert whole["predicted_us"] == pytest.approx(whole["device_floor_us"])  # the device sets it
    assert u.outside_us == pytest.approx([20.0] * 8) and np.median(u.inside_us) == pytest.approx(10 * 5 + 4)
    assert not rep.model.untraced(u).host_sets_whole(rep.scalars)
    # the model check stays the trace as it is: the traced eager token through the model
    check = rep.plans.set_index("plan").loc["eager (model check)"]
    assert check["host_times"] == TRACED and check["predicted_us"] == pytest.approx(check["eager_measured_us"], rel=0.05)
    assert any(n.startswith("untraced host times:") and "20 µs after it" in n for n in rep.notes)


def test_a_host_bound_loop_keeps_its_untraced_outside_work_and_drops_the_steps_own_code():
    """Outside the token 80 µs untraced (400 traced) against ~58 µs of device: the whole token's host is the
    loop's untraced 80 µs and the graph launch; the step's Python after its last call (4 µs) runs no more."""
    rep, marks = _audit(outside_us=80.0)
    traced = float(_whole(rep)["predicted_us"])
    assert traced == pytest.approx(INFLATE * (80.0 + 4.0) + CAL.host_graph_launch_us, rel=1e-3)
    attach_untraced(rep, marks)
    whole = _whole(rep)
    assert whole["predicted_us"] == pytest.approx(80.0 + CAL.host_graph_launch_us, rel=1e-3)
    assert whole["predicted_us"] > whole["device_floor_us"] == pytest.approx(GRAPH_US + LOOP_DEVICE_US, rel=1e-6)


def test_the_calls_that_stay_eager_are_priced_at_the_tokens_untraced_share():
    rep, marks = _audit(outside_us=20.0)
    u = attach_untraced(rep, marks)
    m, mu = rep.model, rep.model.untraced(u)
    t = m.tokens[3]
    k = u.inside_us[3] / m.ranges_us[t]
    assert k == pytest.approx(1 / INFLATE, rel=1e-3)
    assert [it.dur_us for it in mu.items[t]] == pytest.approx([it.dur_us * k for it in m.items[t]])
    assert [it.gap_us for it in mu.items[t]] == pytest.approx([it.gap_us * k for it in m.items[t]])
    spans = rep.plans[rep.plans["plan"] == "spans today"]
    assert (spans["host_times"] == u.label).all()


def test_the_savings_are_against_the_untraced_eager_tokens_paired_by_position():
    rep, marks = _audit(outside_us=20.0)
    u = attach_untraced(rep, marks)
    period = [a + b for a, b in zip(u.inside_us, u.outside_us)]
    assert u.eager_us == pytest.approx(period)  # host-bound eager: its untraced period (74 µs > 58 of device)
    p = rep.plans.set_index("plan")
    whole = p.loc["whole token"]
    assert whole["baseline"] == UNTRACED and whole["eager_untraced_us"] == pytest.approx(float(np.median(period)))
    assert whole["saving_untraced_lo"] <= whole["saving_untraced_us"] <= whole["saving_untraced_hi"]
    assert whole["saving_untraced_us"] == pytest.approx(np.median(period) - (GRAPH_US + LOOP_DEVICE_US), rel=0.02)
    assert "markers pass recording.markers.csv.gz" in whole["untraced_source"]
    assert pd.isna(p.loc["eager (model check)", "saving_untraced_us"])
    # the traced saving stays beside it, against the 5x slower traced token
    assert whole["saving_us"] > 4 * whole["saving_untraced_us"]


def test_a_loop_whose_device_is_slower_than_its_untraced_host_is_timed_by_its_device():
    """A loop that never waits enqueues faster than the device runs: its untraced host period is the enqueue
    rate; the untraced eager token is the token's device work (and the loop's) where that is longer."""
    rep, marks = _audit(outside_us=20.0, kernel_us=30.0)
    u = attach_untraced(rep, marks)
    device = 10 * 30.0 + LOOP_DEVICE_US
    assert u.eager_us == pytest.approx([device] * 8)
    assert all(a + b < device for a, b in zip(u.inside_us, u.outside_us))


def test_validate_holds_the_untraced_plan_and_says_when_a_traced_one_cannot_be_held():
    rep, marks = _audit(outside_us=20.0)
    traced = against_torch(rep, {"outcome": "captured, replays right", "replay_us": GRAPH_US + LOOP_DEVICE_US})
    assert traced["time_agrees"] is None and "no untraced (markers) pass" in traced["time_note"]
    attach_untraced(rep, marks)
    row = against_torch(rep, {"outcome": "captured, replays right", "replay_us": GRAPH_US + LOOP_DEVICE_US,
                              "loop_body": True})
    assert row["time_agrees"] is True and row["host_times"].startswith("untraced") and not row["time_note"]
    assert row["measured_loop"] == "never waits; the script's loop body"
    assert row["untraced_eager_us"] == pytest.approx(float(np.median(rep.untraced.eager_us)))
    slow = against_torch(rep, {"outcome": "captured, replays right", "replay_us": 2 * (GRAPH_US + LOOP_DEVICE_US)})
    assert slow["time_agrees"] is False


def test_held_needs_the_whole_range_a_traced_host_leaves_open():
    assert held(100.0, 60.0, 100.0, untraced=True) == (True, "")
    assert held(104.0, 98.0, 100.0, untraced=False) == (True, "")  # floor and plan both meet it
    assert held(250.0, 200.0, 100.0, untraced=False) == (False, "")  # no host time brings the floor down
    assert held(80.0, 60.0, 100.0, untraced=False) == (False, "")  # the traced plan already below
    ok, why = held(250.0, 98.0, 100.0, untraced=False)
    assert ok is None and "is met by the floor" in why and "250 µs" in why and "98 µs" in why
    assert held(250.0, 60.0, 100.0, untraced=False)[1].count("lies between them") == 1


@pytest.mark.parametrize("change, why", [
    (lambda t: t.header.update(argv=["other.py"]), "another program"),
    (lambda t: t.header.update(exit_status=1), "exited with status 1"),
    (lambda t: t.header.update({"pass": None}), "not a markers pass"),
    (lambda t: setattr(t, "frame", t.frame.iloc[:-1]), "7 closed NVTX range"),
])
def test_a_pass_that_is_not_this_loop_is_refused_and_the_plans_stay(change, why, tmp_path):
    from ds4lab.trace.sources.saved import write_table

    rep, marks = _audit(outside_us=20.0)
    recorded = user_loop(inflate=INFLATE).table("recording.csv.gz", tool="cupti")
    recorded.header = {"argv": ["decode.py"], "exit_status": 0}
    change(marks)
    before = rep.plans.copy()
    with pytest.raises(ValueError, match=why):
        attach_untraced(rep, marks, recorded=recorded)
    pd.testing.assert_frame_equal(rep.plans, before)
    write_table(marks, tmp_path / "recording.markers.csv.gz", **{k: v for k, v in marks.header.items() if v})
    assert attach_untraced_beside(rep, tmp_path / "recording.csv.gz", recorded=recorded) is None
    assert rep.untraced is None and any(n.startswith(MARKERS_NOT_USED) for n in rep.notes)
    pd.testing.assert_frame_equal(rep.plans, before)


def test_tokens_found_by_the_kernel_period_cannot_pair_with_a_markers_pass():
    b = TraceBuilder()
    for _ in range(6):
        for k in range(5):
            b.launch(f"k{k}", 5.0)
        b.call("cudaStreamSynchronize", stream=b.stream, waits=True)
        b.pause(30_000)
    (rep,) = analyze([b.table()])
    with pytest.raises(ValueError, match="would not pair"):
        attach_untraced(rep, markers_pass(user_loop(tokens=6)))


def test_without_a_markers_pass_the_plans_stay_traced_and_say_so(tmp_path):
    rep, _ = _audit(outside_us=20.0)
    before = rep.plans.copy()
    assert attach_untraced_beside(rep, tmp_path / "recording.csv.gz") is None
    pd.testing.assert_frame_equal(rep.plans, before)
    assert (rep.plans["host_times"] == TRACED).all()
    assert any("(traced) host times: no markers pass beside it" in n for n in rep.notes)


def test_a_capture_path_pass_takes_the_same_untraced_times(tmp_path):
    """Attached after the markers pass, the capture-path pass's graph plans keep the loop outside the token at
    its untraced time too: the graph holds the mask's 8 µs more device work."""
    (rep,) = analyze([user_loop(inflate=INFLATE, asks=True).table("recording.csv.gz", tool="cupti")])
    attach_untraced(rep, markers_pass(user_loop(asks=True)))
    ACP.attach(rep, user_loop(inflate=INFLATE, asks=True, mask_us=8.0).table("capture-path.csv.gz", tool="cupti"))
    with pytest.raises(ValueError, match="before the capture-path pass"):
        attach_untraced(rep, markers_pass(user_loop(asks=True)))
    whole = _whole(rep)
    assert whole["path"] == "capture path (capture-path.csv.gz)" and whole["host_times"].startswith("untraced")
    floor = 11 * 5.0 + 8.0 - 5.0 + 10 * CAL.graph_node_gap_us + LOOP_DEVICE_US  # ten 5 µs nodes and the mask
    assert whole["predicted_us"] == pytest.approx(floor, rel=1e-6)
    recorded = rep.plans.set_index("plan").loc["whole token" + ACP.RECORDED_SUFFIX]
    assert recorded["host_times"].startswith("untraced")
    assert recorded["predicted_us"] == pytest.approx(GRAPH_US + LOOP_DEVICE_US, rel=1e-6)


def test_the_audit_job_prices_a_recording_at_the_markers_pass_beside_it(tmp_path):
    from ds4lab.jobs.audit import AuditConfig, run
    from ds4lab.trace.sources.saved import write_table

    write_table(user_loop(inflate=INFLATE).table("<recording>", tool="cupti"), tmp_path / "recording.csv.gz",
                argv=["decode.py"])
    write_table(markers_pass(user_loop()), tmp_path / "recording.markers.csv.gz", argv=["decode.py"], **{"pass": "markers"})
    res = run(AuditConfig(files=(str(tmp_path / "recording.csv.gz"),), out=tmp_path / "audit"))
    plans = pd.read_csv(tmp_path / "audit" / "plans.csv").set_index("plan")
    assert plans.loc["whole token", "host_times"] == "untraced (recording.markers.csv.gz)"
    assert plans.loc["whole token", "baseline"] == UNTRACED
    assert plans.loc["whole token", "predicted_us"] == pytest.approx(GRAPH_US + LOOP_DEVICE_US, rel=1e-6)
    (rep,) = res.value
    meta = json.loads((tmp_path / "audit" / "meta.json").read_text())
    assert meta["units"][0]["untraced"]["source"].endswith("recording.markers.csv.gz")
    assert isinstance(rep.untraced, Untraced)


def test_validate_runs_from_prices_a_saved_run_at_its_markers_pass(tmp_path):
    """A saved run of ``audit validate`` with its markers pass beside the recording: the row's plan is the
    untraced one, held to the truth's loop-body replay; the same run without the pass is not held, and says so."""
    from ds4lab.audit.validate import validate
    from ds4lab.trace.sources.saved import write_table

    run = tmp_path / "runs" / "loop-default-float32"
    run.mkdir(parents=True)
    write_table(user_loop(inflate=INFLATE).table("<recording>", tool="cupti"), run / "recording.csv.gz",
                argv=["loop.py", "--cache", "default", "--dtype", "float32"])
    write_table(markers_pass(user_loop()), run / "recording.markers.csv.gz", **{"pass": "markers"},
                argv=["loop.py", "--cache", "default", "--dtype", "float32"])
    replay = GRAPH_US + LOOP_DEVICE_US
    (run / "engine.json").write_text(json.dumps({
        "family": "loop", "cache": "default", "dtype": "float32", "outcome": "replays right", "replay_us": replay,
        "eager_us": 80.0, "loop_body": True, "truth": {"outcome": "replays right", "loop_body": True}}))
    say = []
    df = validate((), (), tmp_path / "v", runs_from=tmp_path / "runs", say=say.append)
    row = df.iloc[0]
    assert row["host_times"] == "untraced (recording.markers.csv.gz)" and row["time_agrees"] == True  # noqa: E712
    assert row["predicted_us"] == pytest.approx(replay, rel=1e-6) and row["untraced_eager_us"] > replay
    assert "; host untraced (recording.markers.csv.gz))" in say[-1]
    (run / "recording.markers.csv.gz").unlink()
    row = validate((), (), tmp_path / "w", runs_from=tmp_path / "runs", say=lambda *a: None).iloc[0]
    assert row["host_times"] == TRACED and row["time_agrees"] is None and "no untraced (markers) pass" in row["time_note"]


def test_fixtures_copied_from_a_validate_run_keep_its_markers_pass(tmp_path):
    """``scripts/make_audit_fixtures.py --from``: a run's markers pass travels with its recording, and the
    fixture's engine.json names it by its own file."""
    import importlib.util
    import shutil
    from pathlib import Path

    from ds4lab.trace.sources.saved import write_table

    run = tmp_path / "v" / "loop-default-float32"
    run.mkdir(parents=True)
    write_table(user_loop(inflate=INFLATE).table("<recording>", tool="cupti"), run / "recording.csv.gz")
    write_table(markers_pass(user_loop()), run / "recording.markers.csv.gz", **{"pass": "markers"})
    for name in ("arguments.csv.gz", "arguments.json.gz"):
        shutil.copy(run / "recording.csv.gz", run / name)  # stand-ins: the script copies files, reads none
    (run / "engine.json").write_text(json.dumps({"family": "loop", "cache": "default", "dtype": "float32",
                                                 "outcome": "replays right", "script": "/gpu/steps/loop.py",
                                                 "argv": ["/gpu/steps/loop.py"],
                                                 "markers": str(run / "recording.markers.csv.gz")}))
    path = Path(__file__).resolve().parents[1] / "scripts" / "make_audit_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_audit_fixtures", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--from", str(tmp_path / "v"), "--out", str(tmp_path / "fx"), "loop/default"]) == 0
    got = tmp_path / "fx" / "loop-default-float32"
    assert (got / "recording.markers.csv.gz").is_file()
    assert json.loads((got / "engine.json").read_text())["markers"] == "recording.markers.csv.gz"
