"""``ds4lab calibrate --from-ds4``: ds4's host and kernel costs fitted from a ``ds4lab ds4`` folder, and
the sim's stages 0 and i held to ds4's islands off and on. The ds4 folder here is made by the sim
itself at a known calibration (3 µs per launch, kernels at 0.6 of ds4lab's, 1 µs of device idle before
each eager kernel): the fit must recover all three and the check must agree; a folder that is not a ds4
run, or lacks a configuration, is refused. Two folders recorded at two contexts (ds4's kernels at another
factor at each) give one factor per recorded context, and the check labels each context fitted or held
out; one folder is fitted as before."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ds4lab.calibration.from_ds4 import fit_from_ds4
from ds4lab.calibration.modeled import sim_context
from ds4lab.sim.calibration import read
from ds4lab.sim.costmodel import default_calibration_path

PRESET, CONTEXTS = "small", [600]


@pytest.fixture(scope="module")
def truth():
    base = read(default_calibration_path())
    return base, {**base, "host_launch_us": 3.0, "host_graph_call_us": 1.5, "kernel_time_scale": 0.6,
                  "eager_gap_us": 1.0}


def _ds4_folder(tmp, truth_cal):
    """A ds4lab ds4 folder whose figures are the sim's at ``truth_cal``: stage 0 as islands off, i as on."""
    t = sim_context(truth_cal, PRESET, "0,i", CONTEXTS, tokens=4).set_index("stage")
    meta = {"job": "ds4", "status": "complete", "ds4_commit": "b0309611", "gpu": "stand-in", "driver": "-"}
    (tmp / "meta.json").write_text(json.dumps(meta))
    summary, census = [], []
    for cfg, st in (("islands-off", "0"), ("islands-on", "i")):
        r = t.loc[st]
        summary.append({"config": cfg, "context": CONTEXTS[0], "tokens": 4, "us_per_token": r.us_median,
                        "iqr_us": 0.0, "host_us": r.host_us_median})
        for tok in range(3):
            census.append({"config": cfg, "context": CONTEXTS[0], "token": tok, "launch_calls": r.kernel_launches,
                           "graph_launches": r.graph_launches, "kernels": r.kernel_launches, "busy_us": r.floor_us,
                           "enqueue_us": r.host_us_median, "launch_call_us": 1.0,
                           "span_us": r.us_median})  # the device's kernel span: the token, back to back
    pd.DataFrame(summary).to_csv(tmp / "summary.csv", index=False)
    pd.DataFrame(census).to_csv(tmp / "census.csv", index=False)
    return tmp


@pytest.fixture(scope="module")
def ds4_folder(tmp_path_factory, truth):
    return _ds4_folder(tmp_path_factory.mktemp("ds4"), truth[1])


def test_fit_from_ds4_recovers_the_host_and_kernel_costs_and_agrees(ds4_folder, truth):
    base, _ = truth
    folder = ds4_folder
    cal, fits, check = fit_from_ds4(base, folder, preset=PRESET, tokens=4, stages="0,i,3")
    # host: the sim's host enqueue over its launches is host_launch_us plus its per-call extras, within 5 %
    assert cal["host_launch_us"] == pytest.approx(3.0, rel=0.05)
    assert cal["kernel_time_scale"] == pytest.approx(0.6, rel=0.05)
    assert cal["eager_gap_us"] == pytest.approx(1.0, rel=0.05)
    assert set(fits.figure) == {"host_launch_us", "host_graph_call_us", "eager_gap_us", "kernel_time_scale"}
    measured = check[check.ds4 != ""]
    assert list(measured.stage) == ["0", "i"] and measured.agrees.all(), measured
    modeled = check[check.stage == "3"]
    assert len(modeled) == 1 and modeled.measured_us.isna().all() and modeled.gain_over_i_us.notna().all()
    assert "from-ds4" in cal["source"] and "b0309611" in cal["name"]


def test_fit_from_ds4_with_the_shipped_costs_does_not_agree_with_a_cheaper_host(ds4_folder, truth):
    """The check can fail: ds4lab's own constants priced against ds4's figures are far off."""
    base, _ = truth
    folder = ds4_folder
    t = sim_context(base, PRESET, "0", CONTEXTS, tokens=4).set_index("stage")
    s = pd.read_csv(folder / "summary.csv")
    assert t.loc["0"].us_median > 1.1 * float(s[s.config == "islands-off"].us_per_token.iloc[0])


def test_fit_from_ds4_refuses_what_is_not_a_ds4_run(tmp_path, truth):
    base, _ = truth
    (tmp_path / "meta.json").write_text(json.dumps({"job": "ladder"}))
    with pytest.raises(ValueError, match="not a ds4lab ds4 folder"):
        fit_from_ds4(base, tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"job": "ds4"}))
    with pytest.raises(ValueError, match="did not finish"):  # no status: not a finished run
        fit_from_ds4(base, tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"job": "ds4", "status": "complete"}))
    with pytest.raises(ValueError, match="summary.csv: missing"):
        fit_from_ds4(base, tmp_path)
    pd.DataFrame([{"config": "islands-off", "context": 600, "us_per_token": 1.0}]).to_csv(tmp_path / "summary.csv")
    pd.DataFrame([{"config": "islands-off", "context": 600, "launch_calls": 10, "graph_launches": 0, "busy_us": 5,
                   "enqueue_us": 30}]).to_csv(tmp_path / "census.csv")
    with pytest.raises(ValueError, match="no recorded islands-on tokens"):
        fit_from_ds4(base, tmp_path)


def test_calibrate_from_ds4_is_one_mode_at_a_time(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    r = CliRunner().invoke(main, ["calibrate", "--from-ds4", str(tmp_path), "--from-ladder", str(tmp_path),
                                  "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "choose one way" in r.output


def test_calibrate_from_ds4_keeps_a_check_table_it_did_not_write(ds4_folder, tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    mine = tmp_path / "mine-check.csv"
    mine.write_text("someone's own table\n")
    r = CliRunner().invoke(main, ["calibrate", "--from-ds4", str(ds4_folder), "--out", str(tmp_path / "mine.json")])
    assert r.exit_code == 2 and "mine-check.csv" in r.output and "never replaces" in r.output, r.output
    assert mine.read_text() == "someone's own table\n" and not (tmp_path / "mine.json").exists()


def test_calibrate_from_ds4_keeps_a_table_it_did_not_write_beside_a_calibration(ds4_folder, tmp_path):
    """A calibration file at --out does not make the CSV beside it ds4lab's: the CSV's own first line must."""
    import shutil

    from click.testing import CliRunner

    from ds4lab.cli import main
    from ds4lab.sim.calibration import default_calibration_path

    shutil.copy(default_calibration_path(), tmp_path / "mine.json")
    before = (tmp_path / "mine.json").read_bytes()
    mine = tmp_path / "mine-check.csv"
    mine.write_text("user data\n")
    r = CliRunner().invoke(main, ["calibrate", "--from-ds4", str(ds4_folder), "--out", str(tmp_path / "mine.json")])
    assert r.exit_code == 2 and "not a table ds4lab wrote" in r.output, r.output
    assert mine.read_text() == "user data\n" and (tmp_path / "mine.json").read_bytes() == before


def test_calibrate_from_ds4_names_a_run_that_did_not_finish_and_an_unwritable_out(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"job": "ds4", "status": "failed: ValueError: the recording ..."}))
    r = CliRunner().invoke(main, ["calibrate", "--from-ds4", str(run), "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "did not finish" in r.output and "failed: ValueError" in r.output, r.output
    r = CliRunner().invoke(main, ["calibrate", "--from-ds4", str(run), "--out", "/proc/c.json"])
    assert r.exit_code == 2 and "/proc/c.json" in r.output and "Traceback" not in r.output, r.output


def test_host_whatif_prices_the_same_launch_list_at_another_host_cost():
    from ds4lab.calibration.from_ds4 import host_whatif

    t = host_whatif((600,), (0.5,), preset=PRESET, stages="0,3", tokens=4)
    assert set(t.host_launch_us) == {0.5, read(default_calibration_path())["host_launch_us"]}
    py, c = (t[t.host_launch_us == h].set_index("stage") for h in sorted(set(t.host_launch_us), reverse=True))
    assert py.loc["0"].us_median > c.loc["0"].us_median  # cheaper launches: a faster eager token
    assert py.loc["0"].kernel_launches == c.loc["0"].kernel_launches  # the same launch list
    assert py.loc["3"].speedup > c.loc["3"].speedup  # and less for the graph to buy


def test_the_eager_gap_is_not_fitted_from_tokens_the_host_ran_behind(ds4_folder, truth, tmp_path):
    """Where the host enqueues slower than the device runs, the device's idle is the host's: no eager gap."""
    base, _ = truth
    import shutil

    folder = tmp_path / "behind"
    shutil.copytree(ds4_folder, folder)
    c = pd.read_csv(folder / "census.csv")
    c["enqueue_us"] = c.span_us * 1.2
    c.to_csv(folder / "census.csv", index=False)
    cal, fits, _ = fit_from_ds4({k: v for k, v in base.items() if k != "eager_gap_us"}, folder, preset=PRESET,
                                tokens=4, stages="0,i")
    assert "eager_gap_us" not in cal and "eager_gap_us" not in set(fits.figure)


# ----------------------------------------------------------------------------- the kernel time factor by context
#: A preset quick enough on the sim for several folders (``tiny``: the exactness span is computed).
QUICK = "tiny"
#: ds4's kernels at 0.6 of ds4lab's at context 600 and 0.9 at 2400 (log2-linear between).
BY_CONTEXT = [[600, 0.6], [2400, 0.9]]


@pytest.fixture(scope="module")
def truth_by_context(truth):
    base, cheap = truth
    return base, {**cheap, "kernel_time_scale": 0.75, "kernel_time_scale_by_context": BY_CONTEXT}


def _ds4_run(tmp, truth_cal, summary_contexts, recorded, preset=QUICK):
    """A ds4lab ds4 folder made by the sim at ``truth_cal``: ``summary.csv`` at ``summary_contexts``,
    ``census.csv``'s recorded tokens at ``recorded`` (stage 0 as islands off, i as islands on)."""
    t = sim_context(truth_cal, preset, "0,i", sorted(set(summary_contexts) | set(recorded)), tokens=4)
    meta = {"job": "ds4", "status": "complete", "ds4_commit": "b0309611", "gpu": "stand-in", "driver": "-"}
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "meta.json").write_text(json.dumps(meta))
    summary, census = [], []
    for cfg, st in (("islands-off", "0"), ("islands-on", "i")):
        for c in summary_contexts:
            r = t[(t.context == c) & (t.stage == st)].iloc[0]
            summary.append({"config": cfg, "context": c, "tokens": 4, "us_per_token": r.us_median, "iqr_us": 0.0,
                            "host_us": r.host_us_median})
        for c in recorded:
            r = t[(t.context == c) & (t.stage == st)].iloc[0]
            census += [{"config": cfg, "context": c, "token": tok, "launch_calls": r.kernel_launches,
                        "graph_launches": r.graph_launches, "kernels": r.kernel_launches, "busy_us": r.floor_us,
                        "enqueue_us": r.host_us_median, "launch_call_us": 1.0, "span_us": r.us_median}
                       for tok in range(3)]
    pd.DataFrame(summary).to_csv(tmp / "summary.csv", index=False)
    pd.DataFrame(census).to_csv(tmp / "census.csv", index=False)
    return tmp


@pytest.fixture(scope="module")
def two_folders(tmp_path_factory, truth_by_context):
    """Recorded at 600 (summary at 600 and 1200) and at 2400 (summary at 2400 and 3000)."""
    root = tmp_path_factory.mktemp("ds4-two")
    _, t = truth_by_context
    return _ds4_run(root / "short", t, [600, 1200], [600]), _ds4_run(root / "long", t, [2400, 3000], [2400])


def test_two_folders_give_one_factor_per_recorded_context_and_hold_the_contexts_between(two_folders,
                                                                                        truth_by_context):
    from ds4lab.sim.costmodel import Calibration

    base, t = truth_by_context
    cal, fits, check = fit_from_ds4(base, two_folders, preset=QUICK, tokens=4, stages="0,i,3")
    got = cal["kernel_time_scale_by_context"]
    assert [c for c, _ in got] == [600, 2400]  # one factor per recorded context, ascending
    for (c, s), (_, want) in zip(got, BY_CONTEXT):
        assert s == pytest.approx(want, rel=0.05), (c, s)
    # the one factor older readers use: the median of the recorded contexts' factors
    assert cal["kernel_time_scale"] == pytest.approx(sum(s for _, s in got) / 2, rel=1e-3)
    k = fits[fits.figure == "kernel_time_scale"]
    assert sorted(k.context) == [600, 2400] and set(k.folder) == {str(f) for f in two_folders}
    # host constants: medians over the recorded tokens of both folders
    assert (fits.figure == "host_launch_us").sum() == 6 and cal["host_launch_us"] == pytest.approx(3.0, rel=0.05)
    Calibration.load(cal)  # valid against the schema
    # the check: every context of every folder's summary, priced at its own factor, labelled
    measured = check[check.ds4 != ""]
    assert sorted(set(measured.context)) == [600, 1200, 2400, 3000]
    by_ctx = measured.groupby("context").first()
    assert dict(by_ctx["sample"]) == {600: "fitted", 1200: "held out (interpolated)", 2400: "fitted",
                                      3000: "held out (extrapolated)"}
    assert dict(by_ctx.folder) == {600: str(two_folders[0]), 1200: str(two_folders[0]),
                                   2400: str(two_folders[1]), 3000: str(two_folders[1])}
    fitted = Calibration.load(cal)
    for c, s in by_ctx.kernel_time_scale.items():
        assert s == fitted.scale_at(c)
    assert got[0][1] < by_ctx.kernel_time_scale[1200] < got[1][1] and by_ctx.kernel_time_scale[3000] == got[1][1]
    # ds4's truth is log2-linear between the recorded contexts: the held-out contexts agree too
    assert measured.agrees.all(), measured[["context", "stage", "ratio", "sample"]]
    modeled = check[check.ds4 == ""]
    assert list(modeled.stage) == ["3"] * 4 and (modeled.folder == "").all()


def test_one_factor_does_not_hold_both_contexts(two_folders, truth_by_context):
    """The check can fail: each folder alone fits one factor, which misses the other folder's context."""
    base, _ = truth_by_context
    cal, _, check = fit_from_ds4(base, two_folders[0], preset=QUICK, tokens=4, stages="0,i")
    assert "kernel_time_scale_by_context" not in cal
    s = pd.read_csv(two_folders[1] / "summary.csv")
    long = float(s[(s.config == "islands-off") & (s.context == 2400)].us_per_token.iloc[0])
    t = sim_context(cal, QUICK, "0", [2400], tokens=4).set_index("stage")
    assert t.loc["0"].us_median < 0.97 * long  # priced at 600's factor, 2400's token is too fast


def test_one_folder_is_fitted_as_before_whatever_the_base_held(two_folders, truth_by_context):
    """One folder with one recorded context: one factor, no by-context key (a base's own is dropped and
    not used for the sim's floor), a path and a one-folder list the same fit."""
    base, _ = truth_by_context
    folder = two_folders[0]
    stale = {**base, "kernel_time_scale": 3.0, "kernel_time_scale_by_context": [[600, 5.0], [4000, 7.0]]}
    cal, fits, check = fit_from_ds4(stale, folder, preset=QUICK, tokens=4, stages="0,i")
    assert "kernel_time_scale_by_context" not in cal
    assert cal["kernel_time_scale"] == pytest.approx(0.6, rel=0.05)
    assert (fits.figure == "kernel_time_scale").sum() == 1
    assert f"--from-ds4 {folder} (ds4 b0309611" in cal["source"] and "by context" not in cal["source"]
    assert set(check.kernel_time_scale) == {cal["kernel_time_scale"]}
    assert dict(check.groupby("context")["sample"].first()) == {600: "fitted", 1200: "held out (extrapolated)"}
    again, fits2, check2 = fit_from_ds4(stale, [folder], preset=QUICK, tokens=4, stages="0,i")
    assert again == cal
    pd.testing.assert_frame_equal(fits, fits2)
    pd.testing.assert_frame_equal(check, check2)


def test_a_folder_given_twice_or_none_is_refused(two_folders, truth):
    base, _ = truth
    with pytest.raises(ValueError, match="more than once"):
        fit_from_ds4(base, [two_folders[0], two_folders[0]])
    with pytest.raises(ValueError, match="no ds4lab ds4 folder"):
        fit_from_ds4(base, [])


def test_calibrate_from_ds4_repeated_writes_the_factor_by_context_and_labels_the_check(two_folders, tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main
    from ds4lab.sim.calibration import read as read_cal

    out = tmp_path / "both.json"
    r = CliRunner().invoke(main, ["calibrate", "--preset", QUICK, "--from-ds4", str(two_folders[0]),
                                  "--from-ds4", str(two_folders[1]), "--out", str(out)])
    assert r.exit_code == 0, r.output
    cal = read_cal(out)
    assert [c for c, _ in cal["kernel_time_scale_by_context"]] == [600, 2400]
    assert "kernel_time_scale_by_context: 600:" in r.output
    check = pd.read_csv(tmp_path / "both-check.csv")
    assert {"folder", "kernel_time_scale", "sample"} <= set(check.columns)
    assert set(check["sample"]) == {"fitted", "held out (interpolated)", "held out (extrapolated)"}
