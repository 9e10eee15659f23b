"""Whole decode tokens with a profiler attached: the MoE's share of a token, each mode's overhead, and the in-graph
clock's resolution. Timing: :func:`ds4lab.timing.time_steps`; costs: :func:`ds4lab.timing.paired_difference`."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..capture.cache import CapturePolicy, GraphCache
from .modes import MODES, runs_last
from .profiler import MoeProfiler
from .rows import REGIMES, is_modeled
from ..timing import gc_paused, interleaved_pairs, paired_difference, time_steps
from .workbench import MoeWorkbench


def time_tokens(wb: MoeWorkbench, mode: str | None = None, regime: str = "eager", tokens: int = 8,
                warmup: int = 2, start: int = 1000, capture_mode: str = "thread_local",
                fallback: bool | str = False) -> dict:
    """Decode ``tokens`` whole tokens (after ``warmup``) with ``mode`` attached (None: no profiling), each ended by a
    device synchronize (as ds4 does). ``regime`` ``replayed``: the shared-expert and routed-MoE clusters captured and
    replayed (stage 2). Returns ``{"token_us": [...], "moe_us": [...] (NaN where untimed), "rows": [...], "cache":
    GraphCache or None, "profiler": MoeProfiler or None}`` (µs per timed token)."""
    from ..token.config import token_id_at

    be, m = wb.be, wb.model
    cache = None
    if regime == "replayed":
        cache = GraphCache(be, CapturePolicy(("shared", "moe"), mode=capture_mode, warmup=1))
    prof = MoeProfiler(m, mode, routing="model", fallback=fallback) if mode else None
    per_token: list[list[dict]] = []

    def step(i: int) -> None:
        if prof:
            prof.begin_step(i - warmup)
        m.token(start + i, token_id_at(start + i, m.cfg.vocab))

    def after_token() -> None:  # the profiler's read, after the token's closing event and synchronize
        per_token.append(prof.end_step() if prof else [])

    with wb.session(cache), (prof.attached() if prof else contextlib.nullcontext()):
        be.synchronize()
        smp = time_steps(be, step, tokens, stream=wb.stream, warmup=warmup, progress=after_token)
    moe_us, rows = [], []
    for r in per_token[warmup:]:
        tot = [x["ms"] for x in r if x["stage"] == "total" and np.isfinite(x["ms"])]
        moe_us.append(sum(tot) * 1e3 if tot else math.nan)
        rows.extend(r)
    return {"token_us": smp.device_us, "moe_us": moe_us, "rows": rows, "cache": cache, "profiler": prof}


def token_share(wb: MoeWorkbench, tokens: int = 8, warmup: int = 2, mode: str = "deferred"):
    """The routed MoE's share of a whole decode token, eager (``deferred``): a DataFrame, one row per timed token,
    ``token_us``, ``moe_us``, ``rest_us`` (µs), ``share``, ``mode``, ``backend``, ``modeled``, ``layers``."""
    import pandas as pd

    r = time_tokens(wb, mode, "eager", tokens, warmup)
    df = pd.DataFrame({"token": range(len(r["token_us"])), "token_us": r["token_us"], "moe_us": r["moe_us"]})
    df["rest_us"] = df["token_us"] - df["moe_us"]
    df["share"] = df["moe_us"] / df["token_us"]
    df["mode"], df["backend"], df["modeled"] = mode, wb.be.name, is_modeled(wb.be)
    df["layers"] = wb.model.n_layers
    return df


#: Columns of :func:`overhead_table`.
#: The ``overhead`` of a mode whose cost the sim does not price in that regime (a sim run).
NOT_MODELED = "not modeled"
OVERHEAD_COLUMNS = ("mode", "regime", "us_per_token", "baseline_us", "overhead_us", "overhead_lo_us", "overhead_hi_us",
                    "overhead_pct", "measurable", "pairs", "overhead", "note", "backend", "modeled")


def overhead_table(wb: MoeWorkbench, modes=MODES, tokens: int = 4, warmup: int = 2,
                   regimes=REGIMES, capture_mode: str = "thread_local", rounds: int | None = None):
    """Each mode's cost on a whole decode token, eager and replayed (stage 2), as a paired, interleaved difference
    with its 95 % interval (:func:`ds4lab.timing.paired_difference`): per round the median µs of ``tokens`` tokens
    without and with the mode, the order alternating. ``rounds``: default 12 on a GPU, 6 on the sim. An interval
    that includes zero is "not measurable (±x µs)" (``measurable`` False, ``overhead_us`` NaN). ``host-timed`` under
    replay runs guarded (the MoE cluster eagerly; the ``note`` says so). On the sim a regime outside the mode's
    ``sim_prices`` is "not modeled" (``sim_leaves_out``), NaN times.

    Returns a DataFrame with :data:`OVERHEAD_COLUMNS` (µs; ``overhead_pct`` of the baseline median)."""
    import pandas as pd

    rounds = rounds or (6 if is_modeled(wb.be) else 12)
    rows = []
    # CUPTI stays loaded in the process once started (and may then take NVTX calls too): last.
    modes = sorted(modes, key=runs_last)
    mk = lambda **kw: {"backend": wb.be.name, "modeled": is_modeled(wb.be), **kw}  # noqa: E731
    nan = math.nan
    for regime in regimes:
        bases, out = [], []
        for mode in modes:
            probe = MoeProfiler(wb.model, mode)
            untimed = ("unavailable", probe.unavailable_reason) if not probe.available else (
                (NOT_MODELED, f"the sim does not price {probe.impl.sim_leaves_out}")
                if is_modeled(wb.be) and regime not in probe.impl.sim_prices else None)
            if untimed:
                out.append(mk(mode=mode, regime=regime, us_per_token=nan, baseline_us=nan, overhead_us=nan,
                              overhead_lo_us=nan, overhead_hi_us=nan, overhead_pct=nan, measurable=False, pairs=0,
                              overhead=untimed[0], note=untimed[1]))
                continue
            notes = set()

            def block(with_mode: bool, mode=mode, notes=notes) -> float:
                r = time_tokens(wb, mode if with_mode else None, regime, tokens, warmup, capture_mode=capture_mode)
                c = r["cache"]
                if with_mode and c is not None and c.stats.failures:
                    notes.add("capture refused → eager fallback: " +
                              ";".join(f"{k}={v}" for k, v in c.stats.failures.items()))
                return float(np.median(r["token_us"]))

            with gc_paused():
                bs, us = interleaved_pairs(lambda: block(False), lambda: block(True), rounds)
            bases += bs
            d = paired_difference(bs, us)
            out.append(mk(mode=mode, regime=regime, us_per_token=float(np.median(us)), baseline_us=d.baseline,
                          overhead_us=d.median if d.measurable else nan, overhead_lo_us=d.lo, overhead_hi_us=d.hi,
                          overhead_pct=d.pct if d.measurable else nan, measurable=d.measurable, pairs=d.n,
                          overhead=d.fmt(), note="; ".join(sorted(notes))))
        b = float(np.median(bases)) if bases else nan
        rows.append(mk(mode="none", regime=regime, us_per_token=b, baseline_us=b, overhead_us=0.0, overhead_lo_us=0.0,
                       overhead_hi_us=0.0, overhead_pct=0.0, measurable=True, pairs=0, overhead="baseline",
                       note=f"median of {len(bases)} baseline blocks of {tokens} tokens"))
        rows += out
    return pd.DataFrame(rows, columns=list(OVERHEAD_COLUMNS))


# ----------------------------------------------------------------------------- clock resolution
def globaltimer_resolution(be, n: int = 64) -> dict | None:
    """The update step of ``%globaltimer`` on this GPU (ns), from ``kernels/timestamp.cu:globaltimer_probe``:
    ``{"min_ns", "median_ns", "n"}``. None off a GPU (the sim's modeled clock is exact)."""
    from ..executor.base import DeviceClock

    raw = be.globaltimer_steps(n) if isinstance(be, DeviceClock) else None
    if raw is None:
        return None
    steps = raw.astype(np.float64)
    steps = steps[steps > 0]
    if steps.size == 0:
        return {"min_ns": math.nan, "median_ns": math.nan, "n": 0}
    return {"min_ns": float(steps.min()), "median_ns": float(np.median(steps)), "n": int(steps.size)}
