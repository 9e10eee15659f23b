"""The modeled what-if sweeps (simulated runtime, timing only, shipped H200 calibration)."""

from __future__ import annotations

import pytest

from ds4lab.report import plots
from ds4lab.experiments import whatif


@pytest.fixture(scope="module")
def launch():
    return whatif.sweep_launch_cost([1.0, 9.4, 20.0])


def test_launch_cost_sweep(launch):
    # Cheap launches leave the token GPU-bound (nothing for capture to win); dear ones make the
    # eager token host-bound, and stage 3 does not depend on the eager launch cost at all.
    assert launch["gain"].is_monotonic_increasing
    assert launch["gain"].iloc[0] == pytest.approx(1.0, abs=0.02)
    assert launch["gain"].iloc[-1] > 1.5
    assert launch["stage 3 µs"].max() == pytest.approx(launch["stage 3 µs"].min(), rel=1e-9)
    assert launch["source"].str.startswith("modeled (sim").all()


def test_layer_sweep_scales_both_stages():
    df = whatif.sweep_layers([2, 8])
    assert (df["stage 3 µs"] < df["stage 0 µs"]).all()
    assert df["stage 0 µs"].iloc[1] > 3 * df["stage 0 µs"].iloc[0]


def test_moe_token_sweep_gain_shrinks_with_work():
    df = whatif.sweep_moe_tokens([1, 64])
    assert df["gain"].iloc[0] > 1.1  # decode: the call is launch-bound, the graph wins
    assert df["gain"].iloc[1] == pytest.approx(1.0, abs=0.05)  # 64 tokens: the kernels dominate
    assert df["eager µs"].iloc[1] > 10 * df["eager µs"].iloc[0]


@pytest.mark.parametrize("call,match", [
    (lambda: whatif.sweep_moe_tokens([0, 2]), "≥ 1"),
    (lambda: whatif.sweep_launch_cost([-1.0]), "-1.0"),
    (lambda: whatif.sweep_layers([4], preset="nope"), "nope"),
])
def test_bad_input_names_the_value(call, match):
    with pytest.raises(Exception, match=match):
        call()


def test_figure_says_modeled(launch):
    fig = plots.whatif_figure(launch=launch, tokens=whatif.sweep_moe_tokens([1, 2]))
    assert len(fig.axes) == 2
    assert "MODELED" in fig._suptitle.get_text() and "NVIDIA H200" in fig._suptitle.get_text()
