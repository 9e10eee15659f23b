"""The floors of a token (ds4lab.experiments.floors): arithmetic on the CPU, modeled values on the sim,
measured ones on a GPU (marked ``gpu``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ds4lab.backends import make_backend
from ds4lab.experiments import floors as FL
from ds4lab.token.config import get_preset
from ds4lab.token.model import DecodeModel, TokenOptions


def test_launch_list_floor_arithmetic():
    # 4 kernels at 4000 GB/s: 8 MB = 2 µs, 4 MB = 1 µs, 40 kB = 0.01 µs, 0 B; t_min 1.5 µs
    f = FL.launch_list_floor([8_000_000, {"nbytes": 4_000_000}, 40_000, 0], 4000.0, 1.5)
    assert f.kernels == 4 and f.bytes == 12_040_000
    assert f.bytes_floor_us == pytest.approx(3.01)
    assert f.launch_floor_us == pytest.approx(2.0 + 1.5 + 1.5 + 1.5)
    assert f.t_min_bound == 3 and f.per_kernel_us == pytest.approx([2.0, 1.5, 1.5, 1.5])
    assert set(f.as_dict()) == {"kernels", "bytes", "bandwidth_GBps", "t_min_us", "bytes_floor_us",
                                "launch_floor_us", "t_min_bound"}
    df = pd.DataFrame({"nbytes": [8_000_000, 0]})
    assert FL.launch_list_floor(df, 4000.0, 0.0).launch_floor_us == pytest.approx(2.0)


@pytest.mark.parametrize("bw,tmin", [(0.0, 1.0), (-1.0, 1.0), (4000.0, -0.1), (math.nan, 1.0)])
def test_launch_list_floor_refuses_bad_inputs(bw, tmin):
    with pytest.raises(ValueError):
        FL.launch_list_floor([1], bw, tmin)


def test_busy_is_the_union_of_kernel_intervals():
    from ds4lab.trace.records import Kernel, Memset

    recs = [Kernel(name="a", start_ns=0, end_ns=1000), Kernel(name="b", start_ns=500, end_ns=1500),  # overlap: 1.5 µs
            Memset(start_ns=1500, end_ns=9000),                                                     # not a kernel
            Kernel(name="c", start_ns=3000, end_ns=4000)]                                           # gap before it
    busy, span, n = FL.busy_us(recs)
    assert busy == pytest.approx(2.5) and span == pytest.approx(4.0) and n == 3
    assert FL.busy_us([]) == (0.0, 0.0, 0)


def test_efficiencies_say_when_a_floor_is_beaten():
    e = FL.efficiencies(200.0, 100.0)
    assert e == {"efficiency": 0.5, "over_floor": 2.0, "floor_beaten": False}
    assert FL.efficiencies(90.0, 100.0)["floor_beaten"] is True
    assert FL.efficiencies(0.0, 100.0)["efficiency"] is None


def test_kernel_figures():
    df = pd.DataFrame({"kernel": ["q8_matvec", "q8_matvec", "attention_decode", "attention_decode"],
                       "nbytes": [16_000_000, 8_000_000, 500_000, 500_000], "us": [5.0, 3.0, 4.0, 6.0]})
    k = FL.kernel_figures(df, 4000.0)
    assert k["large_kernels"] == 2 and k["large_kernel_us"] == pytest.approx(8.0)
    assert k["large_kernel_copy_fraction"] == pytest.approx(24e6 / 8e-6 / 1e9 / 4000.0)
    assert k["attention_us_per_layer"] == pytest.approx(5.0)


@pytest.fixture(scope="module")
def sim():
    return make_backend("sim", timing_only=True)


def test_t_min_on_the_sim_is_modeled(sim):
    tm = FL.measure_t_min(sim, 50, replays=3)
    cal = sim.cal
    # the sim paces graph nodes graph_node_us apart and runs each kernel for its modeled time
    expect = max(cal.graph_node_us, cal.kernel_us("empty_kernel", 0))
    assert tm.replay_us.median == pytest.approx(expect, rel=0.02)
    assert tm.kernel_us.median == pytest.approx(cal.kernel_us("empty_kernel", 0))
    assert tm.source.startswith("modeled") and tm.kernels == 50
    with pytest.raises(ValueError):
        FL.measure_t_min(sim, 0)


def test_token_floors_on_the_sim(sim):
    m = DecodeModel(get_preset("tiny"), sim, TokenOptions(vocab=True))
    with m.L.recording() as trace:
        m.token(999, 3)
    tf = FL.token_floors(sim, m, tokens=3)
    s = tf.summary()
    assert s["kernels"] == len(trace) and s["busy_source"].startswith("modeled")
    assert s["t_min_source"].startswith("modeled") and s["copy_source"].startswith("modeled")
    bw = sim.modeled_copy_GBps()[0]
    assert s["bytes_floor_us"] == pytest.approx(sum(r.nbytes for r in trace) / (bw * 1e3))
    assert s["launch_floor_us"] >= s["bytes_floor_us"]
    # the modeled token cannot beat the bytes floor; the launch-list floors are flagged when a
    # kernel's own fit prices it below the (unfitted) empty kernel: a report, never an error
    assert s["busy_vs_bytes_floor"]["floor_beaten"] is False
    for k in ("busy_vs_launch_floor_busy", "replay_vs_launch_floor"):
        assert s[k]["floor_beaten"] in (True, False), k
    assert tf.launches is not None and list(tf.launches["kernel"]) == [r.kernel for r in trace]
    assert s["attention_us_per_layer"] > 0
    assert set(FL.SUMMARY_KEYS) <= set(s)


def test_replayed_token_busy_us_on_the_sim(sim):
    from ds4lab.capture import stream as S

    m = DecodeModel(get_preset("tiny"), sim, TokenOptions(vocab=True))
    run, _ = FL.whole_token_runner(m, 500)
    with S.graphs_enabled():
        st = FL.replayed_token_busy(sim, run, tokens=3).busy
        tb = FL.replayed_token_busy(sim, lambda i: run(10 + i), tokens=2, warmup=0)
    assert st.n == 3 and st.median > 0
    assert tb.busy.median <= tb.span.median + 1e-9
    assert tb.durations is not None and tb.durations.shape == (2, tb.kernels)
    assert m.executor.stats.replays >= 4  # the token was replayed, not run eagerly
    with pytest.raises(ValueError):
        FL.replayed_token_busy(sim, run, tokens=0)


def test_replayed_token_busy_needs_a_trace():
    nb = make_backend("numpy")
    with pytest.raises(RuntimeError, match="no kernel trace"):
        FL.replayed_token_busy(nb, lambda i: None, tokens=1)


def test_copy_bandwidth_source(sim):
    assert FL.copy_GBps(sim, 4000.0) == (4000.0, "measured (device-to-device copy, same run)")
    v, why = FL.copy_GBps(sim)
    assert v == sim.modeled_copy_GBps()[0] and why.startswith("modeled")
    with pytest.raises(ValueError):
        FL.copy_GBps(make_backend("numpy"))


@pytest.mark.gpu
def test_floors_on_the_gpu(cupy_backend):
    """Measured: t_min from a replayed graph, busy from CUPTI; neither floor beaten."""
    pytest.importorskip("cupti")
    m = DecodeModel(get_preset("small"), cupy_backend, TokenOptions(vocab=True))
    tf = FL.token_floors(cupy_backend, m, tokens=5)
    s = tf.summary()
    assert s["busy_source"] == "cupti" and s["t_min_source"] == "cuda-events"
    assert 0.2 < s["t_min_us"] < 10.0
    assert s["t_min_kernel_us"] is not None and s["t_min_kernel_us"] <= s["t_min_us"] * 1.5
    assert np.isfinite(s["token_busy_us"]) and s["token_busy_us"] <= s["token_span_us"] + 1e-6
    assert s["busy_vs_bytes_floor"]["floor_beaten"] is False
    assert s["replay_vs_launch_floor"]["floor_beaten"] is False
    assert tf.launches is not None
