"""The profiling × capture exclusion matrix, computed by running every combination: rows are the MoE profiling modes
(``host-timed`` three ways: unguarded, guarded, with the guard's fallback), columns the regimes of the routed-MoE
call profiled (``eager-legacy``, ``eager-nonblocking``, ``capture-<mode>``, ``replay``, ``island``:
:data:`COLUMNS`). How every cell runs, its outcomes and what the H200 measured: ``docs/moe-profiler.md``, "The
profiling × capture matrix"."""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from ..capture.cache import CapturePolicy, GraphCache
from . import MoeProfiler, MoeWorkbench, is_modeled
from ..timing import Difference, gc_paused, interleaved_pairs, paired_difference, time_steps

#: row → (profiler mode, profiler options)
ROW_SPEC = {
    "host-timed": ("host-timed", {"guard": False}),
    "host-timed+guard": ("host-timed", {"guard": True}),
    "host-timed+fallback": ("host-timed", {"guard": True, "fallback": "in-graph"}),
    "deferred": ("deferred", {}),
    "graph-boundary": ("graph-boundary", {}),
    "in-graph": ("in-graph", {}),
    "cupti": ("cupti", {}),
    "nvtx": ("nvtx", {}),
}
ROWS = tuple(ROW_SPEC)
#: column → (stream, capture mode or None, judged call)
COLUMN_SPEC = {
    "eager-legacy": ("legacy", None, "eager"),
    "eager-nonblocking": ("non-blocking", None, "eager"),
    "capture-global": ("non-blocking", "global", "capture"),
    "capture-thread_local": ("non-blocking", "thread_local", "capture"),
    "capture-relaxed": ("non-blocking", "relaxed", "capture"),
    "replay": ("non-blocking", "thread_local", "replay"),
    "island": ("legacy", "global", "capture"),
}
COLUMNS = tuple(COLUMN_SPEC)
#: Columns whose graphs capture on a dedicated blocking stream, the eager work on the legacy stream
#: (ds4's decode islands).
BLOCKING_CAPTURE = frozenset({"island"})
OUTCOMES = ("works", "refused", "breaks capture", "silently wrong", "no data", "unavailable")
#: ``(low, high, slack_us)``: a total counts as this call's when low·ref ≤ total ≤ high·ref + slack,
#: ref being the regime's bracketed steady-state call. Eager calls vary with the host (loose); a graph
#: launch is timed on the device alone, so there a total above the replays' bracket means host time got in
#: (the capturing call's boundary events: on the H200, +240 to +390 µs on a ds4-flash MoE call of ~520 µs).
TOLERANCE = {"eager": (0.3, 1.5, 5.0), "graph": (0.3, 1.03, 5.0)}
MATRIX_COLUMNS = ("mode", "column", "outcome", "detail", "overhead_us", "overhead_lo_us", "overhead_hi_us",
                  "overhead_pairs", "overhead", "total_us", "reference_us", "errors", "judged_phase", "tokens",
                  "backend", "modeled")


def _layer(wb: MoeWorkbench) -> int:
    """The first top-k (not hash-routed) layer, else layer 0."""
    c = wb.cfg
    return c.n_hash_layers if c.n_hash_layers < wb.model.n_layers else 0


def _cache(be, column):
    """The column's graph cache (None for an eager column): the routed-MoE cluster captured in the column's mode, on
    the accessor's stream or (ds4's islands) on a dedicated blocking stream."""
    _, cap_mode, _ = COLUMN_SPEC[column]
    if not cap_mode:
        return None
    blocking = be.new_stream(non_blocking=False) if column in BLOCKING_CAPTURE else None
    return GraphCache(be, CapturePolicy(("moe",), mode=cap_mode, warmup=1), capture_stream=blocking)


def _stream(wb, which):
    return wb.legacy if which == "legacy" else wb.stream


def run_cell(wb: MoeWorkbench, row: str, column: str, tokens: int = 2, overhead_calls: int | None = None) -> dict:
    """Run one cell (see module docstring); returns one matrix row as a dict."""
    be = wb.be
    mode, kw = ROW_SPEC[row]
    which, cap_mode, judged = COLUMN_SPEC[column]
    layer = _layer(wb)
    out = {"mode": row, "column": column, "tokens": tokens, "backend": be.name, "modeled": is_modeled(be),
           "overhead_us": math.nan, "overhead_lo_us": math.nan, "overhead_hi_us": math.nan, "overhead_pairs": 0,
           "overhead": "", "total_us": math.nan, "reference_us": math.nan, "errors": "",
           "judged_phase": ""}
    prof = MoeProfiler(wb.model, mode, routing="uniform", raw=True, **kw)
    if not prof.available:
        return {**out, "outcome": "unavailable", "detail": prof.unavailable_reason}
    cache = _cache(be, column)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with wb.session(cache, _stream(wb, which)), prof.attached(calls_per_read=1):
            wb.step(prof, 0, tokens, "uniform", [layer])  # eager warm-up (the GraphCache's too)
            if judged == "replay":
                wb.step(prof, 1, tokens, "uniform", [layer])  # the capturing call
            prof.poison()
            rows = wb.step(prof, 2, tokens, "uniform", [layer]) + prof.read()
            brackets: list = []
            for i in range(3):
                wb.step(prof, 3 + i, tokens, "uniform", [layer], brackets=brackets)
            be.synchronize()
            ref = [be.event_elapsed_ms(a, b) * 1e3 for a, b in brackets]
    out["reference_us"] = float(np.median(ref)) if ref else math.nan
    out["errors"] = ";".join(sorted({f"{e['error']}@{e['where']}({e['status_after']})" for e in prof.errors}))
    out["judged_phase"] = rows[0]["phase"] if rows else ""
    outcome, detail, total = classify(mode, rows, prof.errors, out["reference_us"], cache)
    out.update(outcome=outcome, detail=detail, total_us=total)
    if outcome == "works":
        d = overhead_us(wb, row, column, tokens, overhead_calls)
        out.update(overhead_us=d.median if d.measurable else math.nan, overhead_lo_us=d.lo,
                   overhead_hi_us=d.hi, overhead_pairs=d.n, overhead=d.fmt())
    return out


def classify(mode: str, rows: list[dict], errors: list[dict], ref_us: float, cache=None) -> tuple[str, str, float]:
    """(outcome, detail, the judged call's total in µs) for one cell (see module docstring)."""
    retired = (cache is not None and cache.retired())
    fallback = " → graph retired, eager fallback" if retired else ""
    calls = [e for e in errors if e["where"] in ("call", "guard")]
    bad = [e for e in calls if e["status_after"] == "invalidated"]
    if bad:
        return "breaks capture", f"{bad[0]['error']} (capture invalidated){fallback}", math.nan
    if calls:
        return "refused", f"{calls[0]['error']} (capture intact){fallback}", math.nan
    reads = [e for e in errors if e["where"] == "read"]
    if reads:
        return "refused", f"{reads[0]['error']} when reading the {mode} record", math.nan
    tot = [r for r in rows if r["stage"] == "total"]
    note = tot[0]["note"] if tot else (rows[0]["note"] if rows else "no rows")
    if mode == "nvtx":
        if tot and tot[0]["phase"] == "eager" and "no timing" in note:
            return "works", "NVTX ranges only, no timing", math.nan
        return "no data", _short(note), math.nan
    vals = [float(r["ms"]) * 1e3 for r in tot if np.isfinite(r["ms"])]
    if not vals:
        return "no data", _short(note), math.nan
    v = vals[0]
    if "stale" in note:
        return "silently wrong", f"stale: the events kept their previous record ({v:.2f} µs reported)", v
    lo, hi, slack = TOLERANCE["eager" if tot[0]["phase"] == "eager" else "graph"]
    if np.isfinite(ref_us) and v > hi * ref_us + slack:
        why = " (includes the capture's host time)" if tot[0]["phase"] == "capture+replay" else ""
        return "silently wrong", f"total {v:.1f} µs vs {ref_us:.1f} µs per call{why}", v
    if np.isfinite(ref_us) and v < lo * ref_us:
        return "silently wrong", f"total {v:.1f} µs vs {ref_us:.1f} µs per call (too small)", v
    return "works", f"total {v:.1f} µs (bracketed {ref_us:.1f} µs), {tot[0]['phase']}", v


def _short(note: str, n: int = 90) -> str:
    note = note.split("; ")[-1] if note else ""
    return note if len(note) <= n else note[: n - 1] + "…"


def overhead_us(wb: MoeWorkbench, row: str, column: str, tokens: int = 2, calls: int | None = None,
                rounds: int | None = None) -> Difference:
    """The row's mode's cost per MoE call (µs) in the column's steady state, as a paired, interleaved difference
    (:func:`ds4lab.timing.paired_difference`) over ``rounds`` rounds of ``calls`` calls without and with profiling,
    each call event-bracketed and ended by a device synchronize (as ds4 ends a token) and, with the mode, its read.
    An interval that includes zero is not measurable (``Difference.measurable``)."""
    be = wb.be
    mode, kw = ROW_SPEC[row]
    which, _, _ = COLUMN_SPEC[column]
    layer = _layer(wb)
    modeled = is_modeled(be)
    calls = calls or (4 if modeled else 20)
    rounds = rounds or (6 if modeled else 12)

    def per_call(with_mode: bool) -> float:
        prof = MoeProfiler(wb.model, mode, routing="uniform", **kw) if with_mode else None
        cache = _cache(be, column)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with wb.session(cache, _stream(wb, which)):
                with prof.attached(calls_per_read=1) if prof else contextlib.nullcontext():
                    smp = time_steps(be, lambda i: wb.step(prof, i, tokens, "uniform", [layer]), calls,
                                     stream=_stream(wb, which), warmup=2)
        return float(np.median(smp.device_us))

    with gc_paused():  # one collection for all rounds
        base, treated = interleaved_pairs(lambda: per_call(False), lambda: per_call(True), rounds)
    return paired_difference(base, treated)


def run_matrix(be, cfg, *, tokens: int = 2, rows=ROWS, columns=COLUMNS, overhead_calls: int | None = None,
               progress=None, wb: MoeWorkbench | None = None, on_cell=None):
    """Every row × column (see module docstring). Returns a DataFrame (:data:`MATRIX_COLUMNS`)."""
    import pandas as pd

    wb = wb or MoeWorkbench(be, cfg, max_tokens=max(tokens, 2), n_layers=min(cfg.n_layers, cfg.n_hash_layers + 1))
    out = []
    for r in rows:
        for c in columns:
            cell = run_cell(wb, r, c, tokens, overhead_calls)
            out.append(cell)
            if on_cell:
                on_cell(cell)
            if progress:
                progress()
    return pd.DataFrame(out, columns=list(MATRIX_COLUMNS))


def pivot(df, what: str = "outcome"):
    """The matrix as rows × columns of ``what``."""
    return df.pivot(index="mode", columns="column", values=what).reindex(
        index=[r for r in ROWS if r in set(df["mode"])], columns=[c for c in COLUMNS if c in set(df["column"])])


def agreement(a, b, names=("cupy", "sim")):
    """Cell-by-cell comparison of two matrices' outcomes (as ``ds4lab conformance`` compares records)."""
    m = a[["mode", "column", "outcome", "detail"]].merge(b[["mode", "column", "outcome", "detail"]],
                                                         on=["mode", "column"], suffixes=[f"_{n}" for n in names])
    m["agree"] = m[f"outcome_{names[0]}"] == m[f"outcome_{names[1]}"]
    return m


def expected_sim_host_timed() -> dict:
    """What the H200 conformance record implies for ds4's host-timed profile under capture, in every mode: refused
    with cudaErrorCapturedEvent, the capture invalidated (``event_sync_captured[*]``)."""
    return {c: ("breaks capture", "cudaErrorCapturedEvent") for c in COLUMNS if c.startswith("capture-")}
