"""The one timing loop and the paired-difference statistics (:mod:`ds4lab.timing`), on the sim."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ds4lab.backends import make_backend
from ds4lab.capture.stream import LEGACY_STREAM
from ds4lab.timing import Difference, interleaved_pairs, median_ci, paired_difference, time_steps


def test_time_steps_returns_raw_samples_with_sources_and_calls_hooks_in_order():
    be = make_backend("sim", timing_only=True)
    buf = be.zeros((1 << 20,), np.float32)
    calls, seen = [], []
    smp = time_steps(be, lambda i: (calls.append(i), be.memset_async(LEGACY_STREAM, buf, 0)), 5,
                     stream=LEGACY_STREAM, warmup=2, on_warm=lambda: seen.append("warm"),
                     on_sample=lambda j, d, h: seen.append(j))
    assert calls == list(range(7))
    assert seen == ["warm", 0, 1, 2, 3, 4]
    assert len(smp.device_us) == len(smp.host_us) == 5
    # a 4 MiB memset on the modeled device takes time; the host only enqueued it
    assert all(d > 0 for d in smp.device_us)
    assert smp.device_source.startswith("modeled (sim, calibration")


def test_time_steps_refuses_a_backend_that_makes_no_timing_claim():
    with pytest.raises(ValueError, match="neither measures nor models time"):
        time_steps(make_backend("numpy"), lambda i: None, 3, stream=LEGACY_STREAM)
    with pytest.raises(ValueError, match="n=0"):
        time_steps(make_backend("sim"), lambda i: None, 0, stream=LEGACY_STREAM)


def test_median_ci_is_the_sign_test_interval():
    v = np.arange(1.0, 21.0)  # n = 20: at 95 % the interval is the 6th and 15th order statistics
    assert median_ci(v, 0.95) == (6.0, 15.0)
    lo, hi = median_ci(v, 0.5)
    assert 6.0 < lo <= 10.0 and 11.0 <= hi < 15.0
    with pytest.raises(ValueError):
        median_ci([], 0.95)


def test_too_few_pairs_are_never_measurable_and_say_so():
    """3 pairs cannot reach 95 % whatever they hold (6 can): the text says too few, not "not measurable"."""
    d = paired_difference([10, 10, 10], [12, 12, 12])
    assert not d.measurable and d.fmt() == "too few pairs to tell (n=3, 6 needed for a 95 % interval; median +2.0 µs)"
    six = paired_difference([10] * 6, [12] * 6)
    assert six.measurable and "the same in every pair, n=6" in six.fmt()


def test_a_clear_cost_is_measurable_and_a_noise_difference_is_not():
    rng = np.random.default_rng(0)
    base = 100 + rng.normal(0, 1, 40)
    d = paired_difference(base, base + 5 + rng.normal(0, 1, 40))
    assert d.measurable and 4 < d.median < 6 and d.lo > 0 and "+5" in d.fmt()
    assert math.isclose(d.pct, 100 * d.median / d.baseline)
    noise = paired_difference(base, base + rng.normal(0, 3, 40))
    assert not noise.measurable and noise.fmt().startswith("not measurable (±")


def test_paired_difference_drops_non_finite_pairs_and_checks_lengths():
    d = paired_difference([1, 2, math.nan, 4, 5, 6, 7, 8], [3, 4, 9, 6, 7, 8, 9, 10])
    assert d.n == 7 and d.median == 2.0
    with pytest.raises(ValueError, match="same length"):
        paired_difference([1, 2], [1])
    assert isinstance(paired_difference([], []), Difference) and not paired_difference([], []).measurable


def test_interleaved_pairs_alternate_the_order():
    order = []
    a, b = interleaved_pairs(lambda: order.append("a") or 1.0, lambda: order.append("b") or 2.0, 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert a == [1.0] * 4 and b == [2.0] * 4


def test_median_ci_for_a_long_run():
    """10 million tokens per stage (``--tokens 10000000``): the sign-test rank from the normal
    approximation, within one rank of the exact sum past 1 000 values (2.0 ** n overflowed at 1 024
    values, after the first round of a long run)."""
    import time
    from fractions import Fraction
    from math import comb

    def exact_rank(n):
        cdf, k, total = Fraction(0), 0, 2 ** n
        while cdf + Fraction(comb(n, k), total) <= Fraction(1, 40):
            cdf += Fraction(comb(n, k), total)
            k += 1
        return k

    for n in (1001, 1024, 2500):
        lo, hi = median_ci(np.arange(n, dtype=float))
        assert abs((int(lo) + 1) - exact_rank(n)) <= 1 and int(lo) + int(hi) == n - 1
    t0 = time.perf_counter()
    lo, hi = median_ci(np.linspace(0.0, 1.0, 10_000_001))
    assert lo < 0.5 < hi and hi - lo < 1e-3 and time.perf_counter() - t0 < 5


def test_no_interval_is_shown_where_the_samples_have_no_spread():
    """A deterministic sim's samples are all equal: no "IQR 5.0–5.0" or "CI 2.0–2.0" (false precision)."""
    from ds4lab.timing import Stats

    assert Stats.of([5.0] * 8).fmt() == "5.0 µs (no spread, n=8)"
    assert "IQR 4.0–6.0" in Stats.of([4.0, 4.0, 5.0, 6.0, 6.0]).fmt()
    same = paired_difference([10.0] * 6, [12.0] * 6)
    assert same.measurable and same.fmt() == "+2.0 µs (+20.0 %, the same in every pair, n=6)"
    assert paired_difference([10.0] * 6, [10.0] * 6).fmt() == "none (0 µs in every pair, n=6)"
    noisy = paired_difference([10.0] * 12, [12.0, 13, 14, 12.5, 13.5, 12, 14, 13, 12.5, 13.5, 13, 14])
    assert "95% CI" in noisy.fmt()
