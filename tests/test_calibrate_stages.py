"""``ds4lab calibrate --from-context``: ``pdl_edge_us`` and ``graph_conditional_us`` fitted from a measured
context folder of stages 3, 3p and 3cc. The folder here is made by the sim itself at known values of
both (the tiny preset, its three default contexts): the fit must recover them (the round trip), leave
out a context whose gain is not measurable, mark the two constants MEASURED in the calibration it
writes (the shipped one keeps them GUESS), and refuse bad folders and a second mode, naming them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.calibration.modeled import sim_context
from ds4lab.calibration.from_context import (calibration_value, fit_capture_stages, measurable,
                                               read_context_gains, solve)
from ds4lab.sim.calibration import read
from ds4lab.sim.costmodel import GUESSED, default_calibration_path, guessed

PRESET, CONTEXTS, TOKENS = "tiny", [512, 1024, 2048], 16
TRUTH = {"pdl_edge_us": 0.3, "graph_conditional_us": 2.0}
HALF = 2.0  # µs: the half-width given to every measurable gain's interval
#: contexts where the 3cc gain is made not measurable (and moved, so that using it would show)
UNMEASURED = (512, 2048)


def _context_folder(tmp, table: pd.DataFrame, **meta) -> "Path":
    tmp.mkdir(parents=True, exist_ok=True)
    m = {"job": "context", "measured": True, "modeled": False, "status": "complete", "tokens": TOKENS,
         "device": "stand-in GPU", "driver": "0.0-test", "source_digest": "feedc0de", "git_revision": "t3st",
         **meta}
    (tmp / "meta.json").write_text(json.dumps(m))
    table.to_csv(tmp / "context.csv", index=False)
    return tmp


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A context folder whose gains are the sim's at TRUTH, each given a ±HALF µs interval; the 3cc gain at
    UNMEASURED moved by -50 µs and given an interval that includes zero (not measurable)."""
    base = read(default_calibration_path())
    t = sim_context({**base, **TRUTH}, PRESET, "3,3p,3cc", CONTEXTS, TOKENS).assign(modeled=False)
    t["gain_lo"], t["gain_hi"] = t.gain_us - HALF, t.gain_us + HALF
    t["gain_measurable"] = t.stage != "3"
    off = (t.stage == "3cc") & t.context.isin(UNMEASURED)
    t.loc[off, "gain_us"] -= 50.0
    t.loc[off, "gain_lo"] = t.loc[off, "gain_us"] - t.loc[off, "gain_us"].abs() - 1.0
    t.loc[off, "gain_hi"] = t.loc[off, "gain_us"].abs() + 1.0
    t.loc[off, "gain_measurable"] = False
    return base, t, _context_folder(tmp_path_factory.mktemp("stages") / "h200-like", t)


@pytest.fixture(scope="module")
def fitted(measured, tmp_path_factory):
    """The command line run once on the folder: its exit, output, calibration and fit table."""
    base, _, folder = measured
    out = tmp_path_factory.mktemp("cal") / "cal-stages.json"
    r = CliRunner().invoke(main, ["calibrate", "--from-context", str(folder), "--out", str(out)])
    assert r.exit_code == 0, r.output
    fit = pd.read_csv(out.with_name("cal-stages-fit.csv"))
    return r, read(out), fit


def test_the_fit_recovers_the_constants_the_folder_was_made_with(fitted, measured):
    _, cal, fit = fitted
    assert cal["pdl_edge_us"] == pytest.approx(TRUTH["pdl_edge_us"], abs=1e-3)
    assert cal["graph_conditional_us"] == pytest.approx(TRUTH["graph_conditional_us"], abs=1e-3)
    ok = fit[fit.status == "fitted"]
    for f, v in TRUTH.items():
        rows = ok[ok.figure == f]
        assert len(rows) and np.allclose(rows.value, v, atol=1e-6), rows
        # the calibration stores max(0, median) of the per-context values, and the sim there gives the gains measured
        assert cal[f] == pytest.approx(max(0.0, float(np.median(rows.value))), abs=1e-3)
        assert np.allclose(rows.sim_gain_at_calibration_us, rows.measured_gain_us, atol=0.05)
    # each value's interval is the measured gain's, through the sim's slope
    assert (ok.value_lo < ok.value).all() and (ok.value < ok.value_hi).all()
    assert np.allclose(ok.value_hi - ok.value_lo, 2 * HALF / ok.slope_us_per_us.abs(), rtol=1e-6)
    # the gains are linear there: 3p gains with the programmatic edges, 3cc loses with the conditional nodes
    assert ok.linear.all()
    assert (fit[fit.stage == "3p"].slope_us_per_us > 0).all() and (fit[fit.stage == "3cc"].slope_us_per_us < 0).all()


def test_a_context_whose_gain_is_not_measurable_is_left_out(fitted):
    r, cal, fit = fitted
    cc = fit[fit.figure == "graph_conditional_us"].set_index("context")
    assert set(cc.index[cc.status == "not measurable"]) == set(UNMEASURED)
    assert cc.loc[list(UNMEASURED), "value"].isna().all() and not cc.loc[list(UNMEASURED), "measurable"].any()
    # with them, the median of three would be one of the moved ones (-50 µs: 50 / 3 µs per node further)
    assert cal["graph_conditional_us"] == pytest.approx(cc.loc[1024, "value"], abs=1e-3)
    assert "not measurable" in r.output and "median of 1 measurable context)" in r.output


def test_the_calibration_written_says_where_the_constants_came_from_and_that_they_are_measured(fitted, measured):
    r, cal, _ = fitted
    base, _, folder = measured
    assert set(guessed(base)) == set(GUESSED)  # the shipped calibration: both still GUESS
    assert guessed(cal) == {}
    for k in TRUTH:
        assert cal["notes"][k].startswith("MEASURED")
    for what in (str(folder), "stand-in GPU", "driver 0.0-test", "feedc0de", "--from-context"):
        assert what in cal["source"], what
    assert cal["kernels"] == base["kernels"] and cal["host_launch_us"] == base["host_launch_us"]
    assert "(GUESS) →" in r.output and "(MEASURED" in r.output


def test_a_fitted_cost_below_zero_is_reported_and_the_calibration_stores_zero():
    # the sim's gain through (0, 0) and (1, -83): a measured gain above the gain at no cost solves below 0
    x, slope = solve([(0.0, -121.0), (1.0, -204.0)], -100.0)
    assert x < 0 and slope == pytest.approx(-83.0)
    assert calibration_value([x, x / 2, 0.1]) == 0.0
    assert calibration_value([0.2, 0.4]) == pytest.approx(0.3) and calibration_value([]) is None


def test_solve_follows_the_segment_the_target_falls_in():
    pts = [(0.0, 0.0), (1.0, 10.0), (2.0, 15.0)]  # a kink at 1 (the half-of-fit floor)
    assert solve(pts, 5.0) == pytest.approx((0.5, 10.0))
    assert solve(pts, 12.5) == pytest.approx((1.5, 5.0))
    assert solve(pts, 20.0) == pytest.approx((3.0, 5.0))  # beyond: the last segment extended
    with pytest.raises(ValueError, match="does not move"):
        solve([(0.0, 3.0), (1.0, 3.0)], 4.0)
    assert measurable(5.0, 1.0, 9.0) and not measurable(5.0, -1.0, 9.0) and not measurable(5.0, 1.0, 9.0, False)


# ----------------------------------------------------------------------------- bad input
def test_a_folder_without_a_stage_the_fit_pairs_is_refused_naming_it(measured, tmp_path):
    base, t, _ = measured
    for stage in ("3", "3p", "3cc"):
        folder = _context_folder(tmp_path / f"no-{stage}", t[t.stage != stage])
        with pytest.raises(ValueError, match=rf"no stage {stage} at context 512, 1024, 2048"):
            fit_capture_stages(base, folder)
    r = CliRunner().invoke(main, ["calibrate", "--from-context", str(tmp_path / "no-3cc"),
                                  "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "no stage 3cc" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "c-fit.csv").exists()


def test_what_is_not_a_measured_context_folder_is_refused_naming_it(measured, tmp_path):
    base, t, _ = measured
    lad = _context_folder(tmp_path / "ladder", t, job="ladder")
    t.to_csv(lad / "ladder.csv", index=False)
    with pytest.raises(ValueError, match="not a ds4lab context folder.*'ladder'"):
        read_context_gains(lad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a ds4lab ladder or context folder"):
        read_context_gains(tmp_path / "empty")
    with pytest.raises(ValueError, match="modeled on the simulated runtime"):
        read_context_gains(_context_folder(tmp_path / "sim", t, measured=False, modeled=True))
    with pytest.raises(ValueError, match="did not finish.*failed: boom"):
        read_context_gains(_context_folder(tmp_path / "failed", t, status="failed: boom"))
    with pytest.raises(ValueError, match="paired against stage 0, not stage 3"):
        read_context_gains(_context_folder(tmp_path / "vs0", t.assign(speedup_vs="0")))
    with pytest.raises(ValueError, match="lacks gain_lo"):
        read_context_gains(_context_folder(tmp_path / "old", t.drop(columns=["gain_lo"])))
    bad = t.astype({"gain_us": object})
    bad.loc[bad.stage == "3p", "gain_us"] = "fast"
    with pytest.raises(ValueError, match="gain_us of stage 3p at context 512 is 'fast'"):
        read_context_gains(_context_folder(tmp_path / "text", bad))
    with pytest.raises(ValueError, match="--preset small: .* measured tiny"):
        fit_capture_stages(base, _context_folder(tmp_path / "ok", t), preset="small")


def test_from_context_is_one_mode_at_a_time(measured, tmp_path):
    _, _, folder = measured
    for other in (["--from-ladder", str(folder)], ["--from-ds4", str(folder)], ["--moe-profile", str(folder)],
                  ["--long-context"]):
        r = CliRunner().invoke(main, ["calibrate", "--from-context", str(folder), *other,
                                      "--out", str(tmp_path / "c.json")])
        assert r.exit_code == 2 and "choose one way" in r.output and "--from-context" in r.output, (other, r.output)
    assert not (tmp_path / "c.json").exists()


def test_from_context_keeps_a_fit_table_it_did_not_write(measured, tmp_path):
    _, _, folder = measured
    mine = tmp_path / "mine-fit.csv"
    mine.write_text("someone's own table\n")
    r = CliRunner().invoke(main, ["calibrate", "--from-context", str(folder), "--out", str(tmp_path / "mine.json")])
    assert r.exit_code == 2 and "mine-fit.csv" in r.output and "never replaces" in r.output, r.output
    assert mine.read_text() == "someone's own table\n" and not (tmp_path / "mine.json").exists()
