"""Whole decode tokens with a profiler attached: the MoE's share of a token and each mode's overhead,
and the resolution of the in-graph mode's clock.

Per token: µs between two events on the stream around the token, each token ended by a device
synchronize (as ds4 does), the garbage collector paused (:func:`~ds4lab.moeprof.gc_paused`).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..capture import GraphCache
from .modes import MODES, runs_last
from .profiler import MoeProfiler
from .rows import REGIMES, is_modeled
from .workbench import MoeWorkbench, gc_paused


def time_tokens(wb: MoeWorkbench, mode: str | None = None, regime: str = "eager", tokens: int = 8,
                warmup: int = 2, start: int = 1000, capture_mode: str = "thread_local",
                fallback: bool | str = False) -> dict:
    """Decode ``tokens`` whole tokens (after ``warmup``) with ``mode`` attached (None: no profiling).

    Per token: µs between two events on the stream around the token, each token ended by a device
    synchronize (as ds4 does); the MoE's profiled total within it (sum over layers). The garbage
    collector is paused meanwhile. ``regime``
    ``replayed``: the shared-expert and routed-MoE clusters captured per layer and replayed (stage 2).
    Returns ``{"token_us": [...], "moe_us": [...], "rows": [...], "cache": GraphCache or None,
    "profiler": MoeProfiler or None}`` (µs per timed token; ``moe_us`` NaN where no total was timed).
    """
    from ..ladder import token_id_at

    be, m = wb.be, wb.model
    cache = GraphCache(be, ("shared", "moe"), mode=capture_mode, warmup=1) if regime == "replayed" else None
    prof = MoeProfiler(m, mode, routing="model", fallback=fallback) if mode else None
    e0, e1 = be.new_event(), be.new_event()
    token_us, moe_us, rows = [], [], []
    with wb.session(cache), (prof.attached() if prof else contextlib.nullcontext()), gc_paused():
        be.synchronize()
        for i in range(warmup + tokens):
            pos = start + i
            if prof:
                prof.begin_step(i - warmup)
            be.event_record(wb.stream, e0)
            m.token(pos, token_id_at(pos, m.cfg.vocab))
            be.event_record(wb.stream, e1)
            be.synchronize()
            r = prof.end_step() if prof else []
            if i < warmup:
                continue
            token_us.append(be.event_elapsed_ms(e0, e1) * 1e3)
            tot = [x["ms"] for x in r if x["stage"] == "total" and np.isfinite(x["ms"])]
            moe_us.append(sum(tot) * 1e3 if tot else math.nan)
            rows.extend(r)
    return {"token_us": token_us, "moe_us": moe_us, "rows": rows, "cache": cache, "profiler": prof}


def token_share(wb: MoeWorkbench, tokens: int = 8, warmup: int = 2, mode: str = "deferred"):
    """The routed MoE's share of a whole decode token, eager: per token its µs and the MoE's
    profiled total within it (``deferred``: events read after the token, no mid-token sync).

    Returns a DataFrame, one row per timed token: ``token_us``, ``moe_us``, ``rest_us`` (µs),
    ``share`` (``moe_us / token_us``), ``mode``, ``backend``, ``modeled``, ``layers``."""
    import pandas as pd

    r = time_tokens(wb, mode, "eager", tokens, warmup)
    df = pd.DataFrame({"token": range(len(r["token_us"])), "token_us": r["token_us"], "moe_us": r["moe_us"]})
    df["rest_us"] = df["token_us"] - df["moe_us"]
    df["share"] = df["moe_us"] / df["token_us"]
    df["mode"], df["backend"], df["modeled"] = mode, wb.be.name, is_modeled(wb.be)
    df["layers"] = wb.model.n_layers
    return df


def overhead_table(wb: MoeWorkbench, modes=MODES, tokens: int = 8, warmup: int = 2,
                   regimes=REGIMES, capture_mode: str = "thread_local", pairs: int = 1):
    """µs per whole decode token with each mode attached vs none, eager and replayed (stage 2:
    shared-expert and routed-MoE clusters captured). Each mode is timed right after its own baseline
    run (``pairs`` times, alternating), so slow drifts of the machine cancel; medians over tokens,
    ``overhead_us`` = median over pairs of (mode − its baseline). The ``none`` row: all baselines.

    ``host-timed`` under replay runs with its guard: the capture is refused and the MoE cluster runs
    eagerly (the ``note`` says so); that cost is the overhead of leaving ds4's profile on. On a GPU the
    eager token is launch-bound, so the profiler's own Python per MoE call (its hooks, its markers)
    counts in full there.

    Returns a DataFrame: ``mode``, ``regime``, ``us_per_token``, ``baseline_us``, ``overhead_us`` (µs),
    ``overhead_pct``, ``note``, ``backend``, ``modeled``; NaN and the reason for an unavailable mode.
    """
    import pandas as pd

    rows = []
    # CUPTI stays loaded in the process once started (and may then take NVTX calls too): last.
    modes = sorted(modes, key=runs_last)
    mk = lambda **kw: {"backend": wb.be.name, "modeled": is_modeled(wb.be), **kw}  # noqa: E731
    for regime in regimes:
        bases, out = [], []
        for mode in modes:
            probe = MoeProfiler(wb.model, mode)
            if not probe.available:
                out.append(mk(mode=mode, regime=regime, us_per_token=math.nan, baseline_us=math.nan,
                              overhead_us=math.nan, overhead_pct=math.nan, note=probe.unavailable_reason))
                continue
            diffs, us, bs, note = [], [], [], ""
            for _ in range(pairs):
                b = float(np.median(time_tokens(wb, None, regime, tokens, warmup, capture_mode=capture_mode)["token_us"]))
                r = time_tokens(wb, mode, regime, tokens, warmup, capture_mode=capture_mode)
                u = float(np.median(r["token_us"]))
                bs.append(b), us.append(u), diffs.append(u - b)
                c = r["cache"]
                if c is not None and c.stats.failures:
                    note = "capture refused → eager fallback: " + ";".join(f"{k}={v}" for k, v in c.stats.failures.items())
            bases += bs
            b, d = float(np.median(bs)), float(np.median(diffs))
            out.append(mk(mode=mode, regime=regime, us_per_token=float(np.median(us)), baseline_us=b, overhead_us=d,
                          overhead_pct=100 * d / b if b else math.nan, note=note))
        b = float(np.median(bases)) if bases else math.nan
        rows.append(mk(mode="none", regime=regime, us_per_token=b, baseline_us=b, overhead_us=0.0, overhead_pct=0.0,
                       note=f"median of {len(bases)} baseline runs"))
        rows += out
    return pd.DataFrame(rows, columns=["mode", "regime", "us_per_token", "baseline_us", "overhead_us", "overhead_pct",
                                       "note", "backend", "modeled"])


# ----------------------------------------------------------------------------- clock resolution
def globaltimer_resolution(be, n: int = 64) -> dict | None:
    """The update step of ``%globaltimer`` on this GPU (ns), from ``kernels/timestamp.cu:globaltimer_probe``:
    ``{"min_ns", "median_ns", "n"}``. None off a GPU (the sim's modeled clock is exact)."""
    if not be.is_gpu:
        return None
    cp = be.cp
    buf = cp.zeros((n,), dtype=np.uint64)
    be.function("globaltimer_probe")((1,), (32,), (buf, np.int32(n)), 0, cp.cuda.Stream.null)
    cp.cuda.runtime.deviceSynchronize()
    steps = cp.asnumpy(buf).astype(np.float64)
    steps = steps[steps > 0]
    if steps.size == 0:
        return {"min_ns": math.nan, "median_ns": math.nan, "n": 0}
    return {"min_ns": float(steps.min()), "median_ns": float(np.median(steps)), "n": int(steps.size)}
