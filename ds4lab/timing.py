"""Measurement helpers: CUDA-event timing (:func:`time_steps`), summary statistics and paired differences, the
bytes-moved floor's numerator.

Device time comes from CUDA events on the work's stream, after warm-up, over many repeats, as a median with its IQR;
the host clock times host-side work (enqueue) only, labelled so. Next: METHODS in the README."""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .token.config import ModelConfig
from .token import weights as W


def has_spread(lo: float, hi: float) -> bool:
    """Whether ``lo`` and ``hi`` differ by more than float rounding (relative 1e-9)."""
    return hi - lo > 1e-9 * max(abs(lo), abs(hi), 1.0)


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as the samples)."""

    n: int
    median: float
    p25: float
    p75: float
    min: float
    max: float

    @classmethod
    def of(cls, samples) -> "Stats":
        """Stats of a non-empty sequence. Raises ValueError on an empty one."""
        a = np.asarray(samples, dtype=np.float64)
        if a.size == 0:
            raise ValueError("no samples to summarize")
        p25, med, p75 = np.percentile(a, [25, 50, 75])
        return cls(int(a.size), float(med), float(p25), float(p75), float(a.min()), float(a.max()))

    @property
    def spread(self) -> bool:
        """Whether the samples differ beyond float rounding (a deterministic sim's do not: no interval to show)."""
        return has_spread(self.min, self.max)

    def fmt(self, unit: str = "µs", digits: int = 1) -> str:
        """``12.3 µs (IQR 11.9–12.8, n=16)``, or ``12.3 µs (no spread, n=16)`` where every sample is equal."""
        if not self.spread:
            return f"{self.median:.{digits}f} {unit} (no spread, n={self.n})"
        return (f"{self.median:.{digits}f} {unit} (IQR {self.p25:.{digits}f}–{self.p75:.{digits}f}, "
                f"n={self.n})")


def event_ms(start, end) -> float:
    """Milliseconds between two recorded CUDA events (synchronizes on ``end``)."""
    import cupy

    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end))


def copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 20) -> Stats:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), CUDA events, median."""
    import cupy

    src = cupy.empty(nbytes // 4, dtype=np.float32)
    src.fill(1.5)
    dst = cupy.empty_like(src)
    s = cupy.cuda.Stream(non_blocking=True)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    with s:
        for _ in range(3):
            dst[...] = src
    out = []
    for _ in range(repeats):
        e0.record(s)
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, s.ptr)
        e1.record(s)
        out.append(2 * src.nbytes / (event_ms(e0, e1) * 1e-3) / 1e9)
    del src, dst
    return Stats.of(out)


def token_bytes(cfg: ModelConfig, vocab: bool, n_layers: int | None = None) -> dict[str, int]:
    """Fewest bytes one decode token must read from device memory, by part: weights, the ``n_used`` experts in
    ``cfg.expert_format``, each layer's fp32 KV window, the vocabulary projection when on."""
    L = cfg.n_layers if n_layers is None else n_layers
    layer = sum(W.spec_bytes(s) for s in W.layer_specs(cfg, 0).values())
    bank = W.bank_specs(cfg, 0)
    per_expert = sum(W.spec_bytes(s) // s.subs for s in bank.values())
    out = {
        "layer_weights": L * layer,
        "routed_experts": L * cfg.n_used * per_expert,
        "kv_window": L * cfg.window * cfg.head_dim * 4,
    }
    if vocab:
        out["vocab"] = W.spec_bytes(W.global_specs(cfg)["vocab"])
    return out


@contextlib.contextmanager
def profiler_range(be):
    """``cudaProfilerStart``/``Stop`` around a region on a GPU (``nsys --capture-range=cudaProfilerApi``)."""
    be.profiler_start()
    try:
        yield
    finally:
        be.profiler_stop()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The garbage collector collected once, then off for the block, restored after; nested, it does nothing."""
    if not gc.isenabled():
        yield
        return
    gc.collect(1)  # the young generations: a full collection costs more than the work in a big process
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ----------------------------------------------------------------------------- the timing loop
@dataclass
class Samples:
    """Raw per-iteration samples of :func:`time_steps` (µs): ``device_us`` (CUDA events, or the sim's), ``host_us``
    (enqueue only), and their sources (``cuda-events``/``host-clock``, or the sim's ``modeled (...)``)."""

    device_us: list[float] = field(default_factory=list)
    host_us: list[float] = field(default_factory=list)
    device_source: str = ""
    host_source: str = ""


def sources(be) -> tuple[str, str]:
    """``(device source, host source)`` labels of the figures ``be`` gives (see :class:`Samples`)."""
    if be.models_time:
        m = f"modeled ({be.name}, calibration {be.calibration_name})"
        return m, m
    return ("cuda-events", "host-clock") if be.measures_time else ("", "")


def time_steps(be, step: Callable[[int], None], n: int, *, stream, warmup: int = 0,
               sync: Callable[[], None] | None = None, on_sample: Callable[[int, float, float], None] | None = None,
               on_warm: Callable[[], None] | None = None, progress: Callable[[], None] | None = None,
               samples: Samples | None = None) -> Samples:
    """The one timing loop of ds4lab: ``warmup`` untimed then ``n`` timed calls of ``step(i)``, each between two events
    on ``stream`` and the host clock, then ``sync()`` (default ``be.synchronize()``, as ds4 ends a token); the garbage
    collector off. Returns raw samples; statistics are the caller's.

    Args:
        be: a backend that measures or models time (``cupy`` or ``sim``).
        step: the work; ``i`` counts from 0 over warm-up and timed iterations.
        n: timed iterations (>= 1).
        stream: where the events are recorded (the work's stream, or ``LEGACY_STREAM``).
        on_sample: ``on_sample(j, device_us, host_us)`` after timed iteration ``j``.
        on_warm: called once between warm-up and timing.
        progress: called after every iteration, warm-up included.
        samples: append to these (interleaved rounds) instead of a new :class:`Samples`.

    Raises:
        ValueError: ``n < 1`` or ``warmup < 0``; a backend that neither measures nor models time.
        ds4lab.errors.CudaError: what a runtime call raised (samples so far kept in ``samples`` when passed)."""
    if n < 1 or warmup < 0:
        raise ValueError(f"time_steps: n={n} must be >= 1 and warmup={warmup} >= 0")
    if not (be.measures_time or be.models_time):
        raise ValueError(f"the {be.name} backend neither measures nor models time")
    out = samples if samples is not None else Samples()
    out.device_source, out.host_source = sources(be)
    sync = sync or be.synchronize
    e0, e1 = be.new_event(), be.new_event()
    clock = be.host_clock_us
    with gc_paused():
        for i in range(warmup):
            step(i)
            if progress:
                progress()
        sync()
        if on_warm:
            on_warm()
        for j in range(n):
            be.event_record(stream, e0)
            h0 = clock()
            step(warmup + j)
            h1 = clock()
            be.event_record(stream, e1)
            sync()
            d = be.event_elapsed_ms(e0, e1) * 1e3
            out.device_us.append(d)
            out.host_us.append(h1 - h0)
            if on_sample:
                on_sample(j, d, h1 - h0)
            if progress:
                progress()
    return out


# ----------------------------------------------------------------------------- paired differences
@dataclass(frozen=True)
class Difference:
    """A cost or gain: the median of paired differences (B − A) with its interval, ``median``/``lo``/``hi`` in the
    samples' unit, ``pct`` of the baseline median, ``n`` pairs; not ``measurable`` when the interval includes zero."""

    median: float
    lo: float
    hi: float
    n: int
    baseline: float
    confidence: float

    @property
    def measurable(self) -> bool:
        return self.n > 0 and not (self.lo <= 0.0 <= self.hi) and math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def pct(self) -> float:
        return 100.0 * self.median / self.baseline if self.baseline else math.nan

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0

    @property
    def spread(self) -> bool:
        """Whether the interval is wider than float rounding."""
        return has_spread(self.lo, self.hi)

    def fmt(self, unit: str = "µs", digits: int = 1) -> str:
        """``+12.3 µs (+1.4 %, 95 % CI 10.1–14.0, n=16)``, ``not measurable (±3.2 µs, n=16)``, ``+12.3 µs (+1.4 %,
        the same in every pair, n=6)`` or ``none (0 in every pair, n=6)``."""
        if self.n > 0 and not self.spread and math.isfinite(self.median):
            if self.median == 0:
                return f"none (0 {unit} in every pair, n={self.n})"
            return f"{self.median:+.{digits}f} {unit} ({self.pct:+.1f} %, the same in every pair, n={self.n})"
        need = pairs_needed(self.confidence)
        if 0 < self.n < need:  # the interval is the pairs' range widened to zero: no pair count can show a change
            return (f"too few pairs to tell (n={self.n}, {need} needed for a {100 * self.confidence:g} % interval; "
                    f"median {self.median:+.{digits}f} {unit})")
        if not self.measurable:
            return f"not measurable (±{self.half_width:.{digits}f} {unit}, n={self.n})"
        return (f"{self.median:+.{digits}f} {unit} ({self.pct:+.1f} %, {self.confidence:.0%} CI "
                f"{self.lo:.{digits}f}–{self.hi:.{digits}f}, n={self.n})")

    def as_dict(self) -> dict:
        return {"diff_median": self.median, "diff_lo": self.lo, "diff_hi": self.hi, "diff_n": self.n,
                "diff_pct": self.pct, "baseline": self.baseline, "measurable": self.measurable,
                "confidence": self.confidence}


#: The most values :func:`median_ci` sums the binomial exactly for (``2.0 ** n`` overflows past 1 023).
EXACT_CI_MAX_N = 1000


def pairs_needed(confidence: float = 0.95) -> int:
    """The fewest values whose median's interval (:func:`median_ci`) can exclude zero: n with
    2 · 0.5ⁿ ≤ 1 − confidence (6 at 95 %)."""
    return max(1, math.ceil(math.log2(2.0 / (1.0 - confidence)) - 1e-12))


def median_ci(values, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval for the median (binomial(n, ½) order statistics; Conover, *Practical
    Nonparametric Statistics*, §3.2): with too few values (n < 6 at 95 %) the range widened to zero's side; exact up to
    :data:`EXACT_CI_MAX_N` values, then the normal approximation with continuity correction.

    Raises:
        ValueError: no values, or ``confidence`` outside (0, 1)."""
    from math import comb

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be between 0 and 1")
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.size
    if n == 0:
        raise ValueError("no values for a confidence interval")
    alpha = 1.0 - confidence
    # largest k with P(Bin(n, 1/2) < k) <= alpha/2: the interval is [v[k-1], v[n-k]]
    cdf, k = 0.0, 0
    if n > EXACT_CI_MAX_N:
        from statistics import NormalDist

        z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
        k = max(0, min(n // 2, int(np.floor(n / 2.0 + 0.5 - z * np.sqrt(n) / 2.0))))
    while n <= EXACT_CI_MAX_N and k < n:
        p = comb(n, k) / 2.0 ** n
        if cdf + p > alpha / 2.0:
            break
        cdf += p
        k += 1
    if k == 0:
        return (min(float(v[0]), 0.0), max(float(v[-1]), 0.0))
    return float(v[k - 1]), float(v[n - k])


def paired_difference(baseline, treated, confidence: float = 0.95) -> Difference:
    """The cost of ``treated`` over ``baseline`` from paired samples: median of the differences with
    :func:`median_ci`; pairs with a non-finite member dropped. Raises ValueError when the lengths differ."""
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(treated, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired samples must have the same length ({a.size} vs {b.size})")
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size == 0:
        return Difference(math.nan, math.nan, math.nan, 0, math.nan, confidence)
    d = b - a
    lo, hi = median_ci(d, confidence)
    return Difference(float(np.median(d)), lo, hi, int(d.size), float(np.median(a)), confidence)


def interleaved_pairs(measure_a: Callable[[], float], measure_b: Callable[[], float], rounds: int,
                      progress: Callable[[], None] | None = None) -> tuple[list[float], list[float]]:
    """``rounds`` paired measurements of A and B in ABBA order: ``(a_values, b_values)``; ValueError if ``rounds <
    1``."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    a_vals, b_vals = [], []
    for r in range(rounds):
        if r % 2 == 0:
            a_vals.append(measure_a())
            b_vals.append(measure_b())
        else:
            b_vals.append(measure_b())
            a_vals.append(measure_a())
        if progress:
            progress()
    return a_vals, b_vals
