"""The sim's kernel time factor by context (``kernel_time_scale_by_context``): the schema refuses a bad
list naming the bad value; :meth:`Calibration.scale_at` is exact at the listed contexts, linear in
log2(context) between them and constant outside; the device prices every kernel of a token at the
context a ladder names, eager launches and graph nodes captured at another context alike. CPU only."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ds4lab.errors import CalibrationError
from ds4lab.sim import SimBackend
from ds4lab.sim.calibration import validate
from ds4lab.sim.costmodel import Calibration

CAL = {"name": "test", "device": "test device", "source": "unit test", "measured": False,
       "host_launch_us": 1.0, "host_graph_launch_us": 1.0, "host_api_us": 1.0, "kernel_fixed_us": 2.0,
       "graph_node_us": 0.5, "bandwidth_GBps": 1000.0, "memset_us": 1.0,
       "kernels": {"spin": {"fixed_us": 500.0}}}
PTS = [[1024, 1.5], [4096, 1.7], [16384, 2.0]]


def _cal(pts=PTS, **kw) -> Calibration:
    return Calibration.load({**CAL, "kernel_time_scale": 1.25, "kernel_time_scale_by_context": pts, **kw})


def test_the_factor_is_exact_at_each_listed_context_and_constant_outside():
    cal = _cal()
    for c, s in PTS:
        assert cal.scale_at(c) == s
    for c in (1, 100, 1023, 1023.5):
        assert cal.scale_at(c) == PTS[0][1]
    for c in (16385, 65536, 10**9):
        assert cal.scale_at(c) == PTS[-1][1]


def test_the_factor_is_linear_in_log2_of_the_context_between_two_listed_contexts():
    cal = _cal()
    for (c0, s0), (c1, s1) in zip(PTS, PTS[1:]):
        mid = math.sqrt(c0 * c1)  # halfway in log2
        assert cal.scale_at(mid) == pytest.approx((s0 + s1) / 2, rel=1e-12)
        xs = np.linspace(math.log2(c0), math.log2(c1), 9)
        ys = [cal.scale_at(2.0 ** x) for x in xs]
        steps = np.diff(ys)
        assert np.allclose(steps, steps[0], rtol=1e-9, atol=1e-12)  # equal steps in log2: a straight line
        assert min(s0, s1) <= min(ys) and max(ys) <= max(s0, s1)
    # not linear in the context itself: a quarter of the way from 1024 to 4096 in context is past a quarter in log2
    assert cal.scale_at(1024 + (4096 - 1024) / 4) > 1.5 + 0.25 * (1.7 - 1.5)


def test_without_the_key_every_context_has_kernel_time_scale():
    cal = Calibration.load({**CAL, "kernel_time_scale": 1.25})
    assert cal.kernel_time_scale_by_context is None
    assert {cal.scale_at(c) for c in (1, 1024, 65536, None)} == {1.25}
    assert _cal().scale_at(None) == 1.25  # no context named: the one factor older readers use
    one = _cal([[4096, 3.0]])
    assert {one.scale_at(c) for c in (1, 4096, 65536)} == {3.0}


@pytest.mark.parametrize("bad", [0, -5, float("nan"), "x"])
def test_a_context_that_is_not_positive_is_refused(bad):
    with pytest.raises(ValueError, match="positive"):
        _cal().scale_at(bad)


@pytest.mark.parametrize("pts, where, names", [
    ([[4096, 1.7], [1024, 1.5]], "kernel_time_scale_by_context", "1024 after 4096"),  # unsorted
    ([[1024, 1.5], [1024, 1.7]], "kernel_time_scale_by_context", "1024 after 1024"),  # repeated
    ([[0, 1.5]], "kernel_time_scale_by_context.0.0", "0 is less than the minimum"),  # context not positive
    ([[1024, 1.5], [-8, 1.7]], "kernel_time_scale_by_context.1.0", "-8"),
    ([[1024, 0.0]], "kernel_time_scale_by_context.0.1", "0.0"),  # scale not positive
    ([[1024, -1.0]], "kernel_time_scale_by_context.0.1", "-1.0"),
    ([[1024, float("nan")]], "kernel_time_scale_by_context.0.1", "nan is not a finite number"),
    ([[1024, float("inf")]], "kernel_time_scale_by_context.0.1", "inf is not a finite number"),
    ([[1024, 101.0]], "kernel_time_scale_by_context.0.1", "101.0 is greater than the maximum of 100"),
    ([[1024.5, 1.5]], "kernel_time_scale_by_context.0.0", "1024.5 is not of type 'integer'"),
    ([[1024]], "kernel_time_scale_by_context.0", "[1024] is too short"),
    ([], "kernel_time_scale_by_context", "[] should be non-empty"),
    ({"1024": 1.5}, "kernel_time_scale_by_context", "is not of type 'array'"),
])
def test_the_schema_refuses_a_bad_list_naming_the_value(pts, where, names):
    with pytest.raises(CalibrationError) as ei:
        validate({**CAL, "kernel_time_scale_by_context": pts}, "cal.json")
    got = dict(ei.value.problems)
    assert where in got and names in got[where], got
    assert "cal.json" in str(ei.value)
    with pytest.raises(CalibrationError):
        Calibration.load({**CAL, "kernel_time_scale_by_context": pts})


def test_the_schema_accepts_a_good_list():
    d = {**CAL, "kernel_time_scale_by_context": PTS}
    assert validate(d) is d


def _spin_us(be, stream, context, *, graph=None) -> float:
    """Modeled device µs of one ``spin`` kernel (eager, or a replay of ``graph``) at ``context``."""
    be.model_context(context)
    t0 = be.rt.dev.busy_us
    if graph is None:
        be.launch(stream, "spin", (1,), (32,), (), 0, lambda: None, 0)
    else:
        be.graph_launch(graph, stream)
    be.synchronize()
    return be.rt.dev.busy_us - t0


def test_the_device_prices_each_kernel_at_the_context_eager_and_replayed():
    be = SimBackend(calibration={**CAL, "kernel_time_scale": 1.25, "kernel_time_scale_by_context": PTS},
                    timing_only=True)
    s = be.new_stream()
    fit = CAL["kernels"]["spin"]["fixed_us"]
    for c in (512, 1024, 2048, 4096, 65536):
        assert _spin_us(be, s, c) == pytest.approx(fit * be.cal.scale_at(c), rel=1e-12)
        assert be.modeled_kernel_us("spin", 0) == pytest.approx(fit * be.cal.scale_at(c), rel=1e-12)
    # a graph captured at one context, replayed at another: its node is priced where it runs
    be.model_context(1024)
    be.begin_capture(s)
    be.launch(s, "spin", (1,), (32,), (), 0, lambda: None, 0)
    g = be.graph_instantiate(be.end_capture(s))
    for c in (1024, 16384, 2048):
        assert _spin_us(be, s, c, graph=g) == pytest.approx(fit * be.cal.scale_at(c), rel=1e-12)
    assert _spin_us(be, s, None) == pytest.approx(fit * 1.25, rel=1e-12)  # no context: kernel_time_scale


def test_without_the_key_naming_a_context_changes_nothing():
    be = SimBackend(calibration={**CAL, "kernel_time_scale": 1.25}, timing_only=True)
    s = be.new_stream()
    assert {_spin_us(be, s, c) for c in (None, 1024, 65536)} == {500.0 * 1.25}
