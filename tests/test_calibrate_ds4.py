"""``ds4lab calibrate --from-ds4``: ds4's host and kernel costs fitted from a ``ds4lab ds4`` folder, and
the sim's stages 0 and i held to ds4's islands off and on. The ds4 folder here is made by the sim
itself at a known calibration (3 µs per launch, kernels at 0.6 of ds4lab's, 1 µs of device idle before
each eager kernel): the fit must recover all three and the check must agree; a folder that is not a ds4 run, or lacks a configuration, is refused."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ds4lab.jobs.calibrate import sim_context, fit_from_ds4
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
    from ds4lab.jobs.calibrate import host_whatif

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
