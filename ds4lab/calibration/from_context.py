"""``ds4lab calibrate --from-context``: the sim's two device-graph constants fitted from a measured
``ds4lab context`` folder of stages 3, 3p and 3cc, no GPU needed.

The sim prices (:mod:`ds4lab.sim.costmodel`, ``docs/capture-stages.md`` "The sim"):

* ``pdl_edge_us``: a kernel node reached by a programmatic edge is priced that much less than its
  fit, never below half of it (:meth:`~ds4lab.sim.costmodel.Calibration.programmatic_us`). Stage 3p
  is stage 3 with a programmatic edge between consecutive kernels, so the sim's paired gain of 3p
  over 3 moves with ``pdl_edge_us`` alone;
* ``graph_conditional_us``: the device time of each conditional node a replay evaluates
  (``ds4lab/sim/graphs.py``: ``GraphCalls.launch``). Stage 3cc runs ds4's launches at each position
  plus one setter kernel per compressed layer through IF and SWITCH nodes, so the sim's paired gain
  of 3cc over 3 moves with ``graph_conditional_us`` alone (3 and 3cc have no programmatic edge, 3 and
  3p no conditional node: one sim run at a pair of values gives both gains).

**The fit.** At every context of the folder the sim runs its own context job (timing only, the
folder's contexts all in one run, so the model's ``max_context`` and with it the SWITCH bodies are the
measured run's; :func:`ds4lab.jobs.sim_runs.sim_context`) at two or more values of each constant,
and the value is solved at which the sim's paired gain equals the measured one (``gain_us`` of
``context.csv``), by linear interpolation between the sampled values; the 95 % interval of the
measured gain (``gain_lo``, ``gain_hi``) gives the interval of the value the same way.

**Linearity.** The sim's gain is piecewise linear in each constant. In ``graph_conditional_us`` it is
linear: each evaluated conditional node adds the constant to a device-bound chain (the slope is minus
the conditional nodes evaluated per token). In ``pdl_edge_us`` it is linear, slope the programmatic
edges per token, until the constant passes half of the shortest kernel fit on a programmatic edge:
from there on that kernel is held at half its fit (the floor of ``programmatic_us``) and the slope
drops by its count; so the gain is concave and piecewise linear, with a kink at half of every
distinct kernel fit. The fit checks this rather than assuming it: every fitted value must lie in a
stretch where three or more sampled values of that context are collinear (within
:data:`TOLERANCE_US`), or be a sampled value itself whose gain matches; where neither holds the sim
is run again at the fitted values (up to :data:`MAX_RUNS` runs in all), so a fit past a kink lands on
the right segment. The table's ``linear`` column says which case each row is.

**The calibration value** of each constant is the median of the per-context values over the
contexts whose measured gain is measurable (its 95 % interval excludes zero: ``gain_measurable``); a
context whose interval includes zero fits nothing and is reported "not measurable". A fitted value
below 0 (the measured gain beyond what the sim gives at no cost at all, extrapolated from the sim's
first segment) is reported as it is in the table; the calibration stores ``max(0, median)`` (the
schema's costs are never negative). A constant no context measured keeps ``base``'s value, and stays
GUESS (:func:`ds4lab.sim.costmodel.guessed`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..measure.sim_check import preset_changes, read_record

#: The fitted constants and the stage whose paired gain over :data:`BASELINE` prices each.
FITTED = {"pdl_edge_us": "3p", "graph_conditional_us": "3cc"}
#: The stage the gains are paired against.
BASELINE = "3"
#: The second value of each constant the sim is run at (the first is 0): the shipped defaults, both
#: inside the linear stretch of the ds4 presets (``pdl_edge_us`` is linear to half of the shortest
#: kernel fit on a programmatic edge).
PROBE = {"pdl_edge_us": 0.5, "graph_conditional_us": 1.0}
#: µs: two sim gains this close are the same (the sim is deterministic; its medians move in steps of
#: its kernel fits' rounding).
TOLERANCE_US = 0.05
#: The most sim runs one fit makes (each runs every context of the folder once).
MAX_RUNS = 8
#: µs: the sim is run at values of a constant rounded to this (1 ps); two values closer are one.
STEP_US = 1e-6
#: The columns the fit reads from ``context.csv``.
GAIN_COLUMNS = ("stage", "context", "gain_us", "gain_lo", "gain_hi", "gain_measurable", "speedup_vs")


def read_context_gains(folder) -> tuple[dict, pd.DataFrame]:
    """The measured gains of a ``ds4lab context`` folder that the fit reads.

    Args:
        folder: a ``ds4lab context`` result folder measured on a GPU (``meta.json``, ``context.csv``).

    Returns:
        ``(meta, rows)``: the folder's ``meta.json`` and one row per (stage, context) of stages 3p
        and 3cc (``stage``, ``context``, ``gain_us``, ``gain_lo``, ``gain_hi`` in µs per token, the
        stage's paired gain over stage 3 and its 95 % interval; ``gain_measurable``, bool;
        ``preset``), contexts ascending.

    Raises:
        ValueError: not a ds4lab context folder (a ladder, no meta.json), one modeled on the sim, a
            run that did not finish, a table lacking a column the fit reads, without stage 3, 3p or
            3cc at some context, with gains paired against another stage than 3, or a gain that is
            not a number (each named, with the folder or file).
    """
    folder = Path(folder)
    job, meta, d = read_record(folder)
    table = folder / f"{job}.csv"
    if job != "context":
        raise ValueError(f"{folder}: not a ds4lab context folder (its meta.json names job {job!r}); the fit "
                         "reads ds4lab context --stages 3,3p,3cc")
    status = str(meta.get("status", "complete"))
    if status != "complete":
        raise ValueError(f"{folder}: the context run did not finish (meta.json status {status[:200]!r}): "
                         "nothing to fit")
    lacks = [c for c in GAIN_COLUMNS if c not in d.columns]
    if lacks:
        raise ValueError(f"{table}: lacks {', '.join(lacks)}, the paired gains the fit reads (a context table "
                         "from an older ds4lab)")
    d = d.assign(context=d["context"].astype(int))
    contexts = sorted(set(d["context"]))
    for stage in (BASELINE, *FITTED.values()):
        missing = [c for c in contexts if not ((d["stage"] == stage) & (d["context"] == c)).any()]
        if missing:
            raise ValueError(f"{table}: no stage {stage} at context {', '.join(map(str, missing))}: the fit pairs "
                             f"3p and 3cc with stage 3 at every context (ds4lab context --stages 3,3p,3cc)")
    rows = d[d["stage"].isin(FITTED.values())].copy()
    other = sorted({str(v) for v in rows["speedup_vs"]} - {BASELINE})
    if other:
        raise ValueError(f"{table}: gains paired against stage {', '.join(other)}, not stage {BASELINE}: the fit "
                         f"needs 3p and 3cc paired with 3 (ds4lab context --stages 3,3p,3cc, stage 3 first and "
                         "no stage 0)")
    for col in ("gain_us", "gain_lo", "gain_hi"):
        vals = pd.to_numeric(rows[col], errors="coerce")
        bad = rows[~np.isfinite(vals.astype(float))]
        if len(bad):
            r = bad.iloc[0]
            raise ValueError(f"{table}: {col} of stage {r['stage']} at context {r['context']} is {r[col]!r}, "
                             "not a number")
        rows[col] = vals.astype(float)
    rows["gain_measurable"] = rows["gain_measurable"].map(
        lambda v: v if isinstance(v, (bool, np.bool_)) else str(v).strip().lower() == "true").astype(bool)
    if "preset" not in rows.columns:
        name = (meta.get("preset") or {}).get("name") if isinstance(meta.get("preset"), dict) else meta.get("preset")
        rows["preset"] = name
    return meta, rows.sort_values(["stage", "context"]).reset_index(drop=True)


def measurable(gain_us: float, lo: float, hi: float, flag: bool = True) -> bool:
    """Whether a measured gain fits anything: its table says measurable (``flag``) and its 95 %
    interval ``[lo, hi]`` (µs) excludes zero (:attr:`ds4lab.timing.Difference.measurable`). A gain
    outside its own interval (a hand-made table) is not measurable either."""
    return bool(flag) and (lo > 0 or hi < 0) and lo <= gain_us <= hi


def solve(points, target: float) -> tuple[float, float]:
    """The value ``x`` at which the piecewise-linear line through ``points`` reaches ``target``.

    Args:
        points: ``[(x, gain)]`` of one context, ``x`` ascending and distinct (µs of the constant, µs
            of gain), at least two, gain monotone in ``x``.
        target: the gain (µs) to reach.

    Returns:
        ``(x, slope)``: ``x`` from the segment whose gains bracket ``target`` (the first such), else
        from the first (``target`` beyond the gain at the smallest ``x``: a value below it, negative
        when that is 0) or the last segment, extended; ``slope`` that segment's µs of gain per µs.

    Raises:
        ValueError: fewer than two points, or the segment used is flat (the gain does not move with
            the constant there: nothing to solve).
    """
    pts = sorted((float(x), float(g)) for x, g in points)
    if len(pts) < 2:
        raise ValueError("two sampled values at least are needed to solve for a constant")
    seg = None
    for a, b in zip(pts, pts[1:]):
        if min(a[1], b[1]) <= target <= max(a[1], b[1]) and a[1] != b[1]:
            seg = (a, b)
            break
    if seg is None:
        rising = pts[-1][1] >= pts[0][1]
        below = target < pts[0][1] if rising else target > pts[0][1]
        seg = (pts[0], pts[1]) if below else (pts[-2], pts[-1])
    (x0, g0), (x1, g1) = seg
    slope = (g1 - g0) / (x1 - x0)
    if slope == 0:
        raise ValueError(f"the gain is {g0:.3f} µs at both {x0:g} and {x1:g}: it does not move with the constant")
    return x0 + (target - g0) / slope, slope


def _collinear(pts, tol: float) -> bool:
    """Whether every point of ``pts`` (``[(x, g)]``, ascending, three or more) lies within ``tol`` µs of the
    chord through the first and the last."""
    (x0, g0), (x1, g1) = pts[0], pts[-1]
    return all(abs(g - (g0 + (g1 - g0) * (x - x0) / (x1 - x0))) <= tol for x, g in pts[1:-1])


def _checked(pts, x: float, target: float, tol: float) -> bool | None:
    """Whether ``x`` (solved through ``pts``) is known to give ``target``: a sampled value there whose gain
    is ``target`` (True), or the segment it was solved on collinear with a sampled neighbour on each side
    that exists, three points at least (True); False where those points are not collinear; None where
    no third point tells yet."""
    pts = sorted(pts)
    xs = [p[0] for p in pts]
    for px, pg in pts:
        if abs(px - x) <= STEP_US:
            return abs(pg - target) <= tol
    if x > xs[-1]:
        return None  # beyond the largest sampled value: sample there first
    i = max(0, min(len(pts) - 2, int(np.searchsorted(xs, x)) - 1))
    near = pts[max(0, i - 1): i + 3]
    if len(near) < 3:
        return None
    return _collinear(near, tol)


def _slope(pts, target: float) -> float:
    """µs of gain per µs of the constant on the segment :func:`solve` would use for ``target`` (0 where flat)."""
    try:
        return solve(pts, target)[1]
    except ValueError:
        return 0.0


def _median(values) -> float:
    return float(np.median(list(values))) if len(values) else math.nan


def calibration_value(values) -> float | None:
    """The value a calibration stores from per-context fitted values (µs): ``max(0, median)``, rounded to
    the nanosecond; None for no values (nothing measurable: the constant keeps its earlier value)."""
    values = [float(v) for v in values]
    if not values:
        return None
    return round(max(0.0, _median(values)), 3)


def fit_capture_stages(base: dict, folder, *, preset: str | None = None, tokens: int | None = None,
                       probe: dict | None = None, tolerance_us: float = TOLERANCE_US, max_runs: int = MAX_RUNS,
                       say=None) -> tuple[dict, pd.DataFrame]:
    """``base`` with ``pdl_edge_us`` and ``graph_conditional_us`` fitted from a measured context folder
    of stages 3, 3p and 3cc (module docstring: the fit, its linearity, the median and the clamp).

    Args:
        base: the calibration to extend (a parsed, valid calibration dict).
        folder: a ``ds4lab context`` folder measured on a GPU (:func:`read_context_gains`).
        preset: the preset the sim models; None: the folder's (a different one is refused).
        tokens: tokens the sim times per stage and context; None: the folder's ``meta.json`` ``tokens``
            (the sim's median token then has the measured run's mix of captures and replays).
        probe: the second value (µs) of each constant the sim is run at (default :data:`PROBE`).
        tolerance_us: µs within which two sim gains agree (the linearity check).
        max_runs: the most sim runs (each at every context of the folder), two at least.
        say: a callable given one line per sim run (progress), or None.

    Returns:
        ``(calibration, table)``. The calibration: ``base`` with the two constants replaced (where a
        context measured them), ``name``, ``source`` naming the folder and its ``meta.json``'s GPU,
        driver, source digest and git revision, and ``notes`` marking each fitted constant
        ``MEASURED`` (:func:`ds4lab.sim.costmodel.guessed` then no longer lists it). The table, one row
        per constant and context: ``figure``, ``stage``, ``context``; ``measured_gain_us``,
        ``measured_gain_lo_us``, ``measured_gain_hi_us`` (the measured paired gain over stage 3 and its
        95 % interval, µs per token) and ``measurable``; ``sim_gain_at_zero_us`` (the sim's gain with
        the constant 0), ``slope_us_per_us`` (µs of the sim's gain per µs of the constant on the
        segment the value was solved on: for 3p the programmatic edges per token, for 3cc minus the
        conditional nodes evaluated per token); ``value``, ``value_lo``, ``value_hi`` (µs; empty where
        not measurable); ``linear`` (the check above passed for every target of the row); ``status``
        (``fitted``, ``fitted, negative``, ``not measurable``, or ``not verified`` with why);
        ``calibration_value`` (what the calibration stores) and ``sim_gain_at_calibration_us`` (the
        sim's gain at that value: the check against ``measured_gain_us``); ``sim_runs``.

    Raises:
        ValueError: a bad folder (:func:`read_context_gains`), a preset other than the folder's, a
            table naming no single preset, bad ``tokens``, ``probe`` or ``max_runs``, or a sim gain
            that does not move with its constant (each named).
        ds4lab.errors.CalibrationError: ``base`` with a probed value is not a valid calibration.
        RuntimeError: a sim gain that moved with the other constant (the two would then need one run
            each: the sim's model changed).
    """
    from .sim_runs import sim_context

    folder = Path(folder)
    meta, rows = read_context_gains(folder)
    presets = sorted({str(p) for p in rows["preset"].dropna()})
    if len(presets) != 1:
        raise ValueError(f"{folder / 'context.csv'}: one preset expected in its preset column, found "
                         f"{presets or 'none'}")
    if preset is not None and preset != presets[0]:
        raise ValueError(f"--preset {preset}: {folder} measured {presets[0]}; the sim must model the token measured")
    preset = presets[0]
    if tokens is None:
        tokens = meta.get("tokens", 32)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens {tokens!r}: a positive number of timed tokens per stage")
    probe = {**PROBE, **(probe or {})}
    for k, v in probe.items():
        if k not in FITTED or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"probe {k}={v!r}: a positive value of {' or '.join(FITTED)}")
    if max_runs < 2:
        raise ValueError(f"max_runs {max_runs}: the fit runs the sim twice at least")
    contexts = sorted(int(c) for c in set(rows["context"]))
    target = {(r.stage, r.context): r for r in rows.itertuples()}
    samples: dict = {f: {c: {} for c in contexts} for f in FITTED}
    runs: list[dict] = []

    def run_at(point: dict) -> None:
        point = {f: round(float(x), 6) for f, x in point.items()}  # on the STEP_US grid
        t = sim_context({**base, **point}, preset, ",".join((BASELINE, *FITTED.values())), contexts, tokens)
        t = t.assign(context=t["context"].astype(int)).set_index(["stage", "context"])
        for f, stage in FITTED.items():
            for c in contexts:
                g, x = float(t.loc[(stage, c), "gain_us"]), point[f]
                was = samples[f][c].get(x)
                if was is not None and abs(was - g) > tolerance_us:  # one run serves both constants only so
                    raise RuntimeError(f"the sim's gain of {stage} over {BASELINE} at context {c} moved from {was:.3f} "
                                       f"to {g:.3f} µs with {f} {x:g} µs kept: it depends on the other constant too")
                samples[f][c][x] = g
        runs.append(dict(point))
        if say is not None:
            say(f"sim run {len(runs)}: " + ", ".join(f"{k} {v:g} µs" for k, v in point.items()))

    def targets(f: str, c: int):
        r = target[(FITTED[f], c)]
        return {"gain": r.gain_us, "lo": r.gain_lo, "hi": r.gain_hi}

    def fitted(f: str, c: int) -> bool:
        r = target[(FITTED[f], c)]
        return measurable(r.gain_us, r.gain_lo, r.gain_hi, r.gain_measurable)

    def solve_all() -> dict:
        """{figure: {context: {which: (x, slope, checked)}}} for the measurable contexts."""
        out = {}
        for f in FITTED:
            out[f] = {}
            for c in contexts:
                if not fitted(f, c):
                    continue
                pts = list(samples[f][c].items())
                got = {}
                for which, g in targets(f, c).items():
                    try:
                        x, s = solve(pts, g)
                    except ValueError as e:
                        raise ValueError(f"the sim's gain of {FITTED[f]} over {BASELINE} at context {c} ({preset}): "
                                         f"{e} ({f}): nothing to fit") from None
                    got[which] = (x, s, _checked(pts, x, g, tolerance_us))
                out[f][c] = got
        return out

    run_at({f: 0.0 for f in FITTED})
    run_at({f: float(probe[f]) for f in FITTED})
    while True:
        sol = solve_all()
        cal_x = {f: calibration_value([v["gain"][0] for v in sol[f].values()]) for f in FITTED}
        want = {}
        for f in FITTED:
            sampled = set().union(*(set(samples[f][c]) for c in contexts))
            need = [x for v in sol[f].values() for x, _, _ in v.values()]
            top = max(need, default=0.0)
            if top > max(sampled) + STEP_US:
                want[f] = top  # no value solved beyond the largest sampled one
            elif cal_x[f] is not None and cal_x[f] not in sampled:
                want[f] = cal_x[f]  # the calibration's own value, the check
            else:
                pending = [x for which in ("gain", "lo", "hi") for v in sol[f].values()
                           for x, _, ok in [v[which]] if not ok and x >= 0 and round(x, 6) not in sampled]
                if pending:
                    want[f] = pending[0]
        if not want or len(runs) >= max_runs:
            break
        run_at({f: want.get(f, cal_x[f] if cal_x[f] is not None else float(probe[f])) for f in FITTED})

    table = []
    for f, stage in FITTED.items():
        for c in contexts:
            r = target[(stage, c)]
            pts = sorted(samples[f][c].items())
            row = {"figure": f, "stage": stage, "context": c, "measured_gain_us": r.gain_us,
                   "measured_gain_lo_us": r.gain_lo, "measured_gain_hi_us": r.gain_hi,
                   "measurable": fitted(f, c), "sim_gain_at_zero_us": samples[f][c][0.0],
                   "slope_us_per_us": _slope(pts, r.gain_us),
                   "value": math.nan, "value_lo": math.nan, "value_hi": math.nan, "linear": None,
                   "status": "not measurable", "calibration_value": cal_x[f],
                   "sim_gain_at_calibration_us": (samples[f][c].get(cal_x[f], math.nan) if cal_x[f] is not None
                                                  else math.nan),
                   "sim_runs": len(runs)}
            if c in sol[f]:
                got = sol[f][c]
                ends = sorted((got["lo"][0], got["hi"][0]))
                checks = [ok for _, _, ok in got.values()]
                row.update(value=got["gain"][0], value_lo=ends[0], value_hi=ends[1], slope_us_per_us=got["gain"][1],
                           linear=all(ok is True for ok in checks))
                if not row["linear"]:
                    row["status"] = (f"not verified: the sim's gain is not linear around the fitted values and "
                                     f"{max_runs} sim runs did not settle them")
                else:
                    row["status"] = "fitted, negative" if got["gain"][0] < 0 else "fitted"
            table.append(row)
    table = pd.DataFrame(table)
    table.attrs["preset_changes"] = preset_changes(meta)

    out = dict(base)
    notes = base.get("notes")
    notes = dict(notes) if isinstance(notes, dict) else ({"notes": notes} if notes else {})
    where = (f"{meta.get('device', '?')}, driver {meta.get('driver', '?')}, ds4lab source "
             f"{meta.get('source_digest', '?')} (git {meta.get('git_revision', '?')}), {preset}")
    done = []
    for f, stage in FITTED.items():
        if cal_x[f] is None:
            continue
        used = [c for c in contexts if c in sol[f]]
        out[f] = cal_x[f]
        notes[f] = (f"MEASURED: max(0, median) over contexts {', '.join(map(str, used))} of the value at which the "
                    f"sim's paired gain of {stage} over {BASELINE} equals the one measured in {folder} ({where}); "
                    "ds4lab calibrate --from-context")
        done.append(f)
    if done:
        out["notes"] = notes
        out["name"] = f"{base.get('name', 'calibration')} with {' and '.join(done)} from {folder.name}"
        out["source"] = (f"{base.get('source', '')}; {' and '.join(done)} fitted by ds4lab calibrate --from-context "
                         f"{folder} (the paired gains of {' and '.join(FITTED[f] for f in done)} over stage "
                         f"{BASELINE} at contexts {', '.join(map(str, contexts))}; {where})")
    return out, table


def print_fit(table: pd.DataFrame, base: dict, cal: dict, console) -> None:
    """Print :func:`fit_capture_stages`'s table (per constant and context: the measured gain, the fitted
    value and its interval, the sim's gain at the calibration's value) and each constant's change, with
    whether it is still GUESS (:func:`ds4lab.sim.costmodel.guessed`) or MEASURED."""
    from rich.table import Table

    from ..sim.costmodel import OPTIONAL, guessed

    changed = table.attrs.get("preset_changes") or {}
    if changed:
        what = "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in changed.items())
        console.print(f"[yellow]the folder's preset is not today's ({what}): the sim models today's token[/]")
    t = Table(title="pdl_edge_us and graph_conditional_us fitted to the measured paired gains over stage 3",
              caption="value: where the sim's gain equals the measured one; interval: from the measured gain's 95 % "
                      "interval; calibration: max(0, median) over the measurable contexts")
    for c in ("constant", "stage", "context", "measured gain µs (95 % CI)", "sim µs/µs", "value µs",
              "interval µs", "linear", "status", "sim gain at calibration µs"):
        t.add_column(c, justify="left" if c in ("constant", "stage", "status", "linear") else "right")
    for r in table.to_dict("records"):
        fit = r["value"] == r["value"]
        t.add_row(r["figure"], r["stage"], str(r["context"]),
                  f"{r['measured_gain_us']:+.1f} ({r['measured_gain_lo_us']:+.1f}…{r['measured_gain_hi_us']:+.1f})",
                  f"{r['slope_us_per_us']:.1f}", f"{r['value']:.3f}" if fit else "—",
                  f"{r['value_lo']:.3f}…{r['value_hi']:.3f}" if fit else "—",
                  "" if r["linear"] is None else "yes" if r["linear"] else "NO", r["status"],
                  f"{r['sim_gain_at_calibration_us']:+.1f}" if r["sim_gain_at_calibration_us"] == r[
                      "sim_gain_at_calibration_us"] else "—")
    console.print(t)
    before, after = guessed(base), guessed(cal)
    for f in FITTED:
        old = base.get(f, OPTIONAL[f])
        was = "GUESS" if f in before else "MEASURED"
        now = "GUESS" if f in after else "MEASURED"
        n = int(table[(table.figure == f) & table.value.notna()].shape[0])
        console.print(f"{f}: {old} ({was}) → {cal.get(f, old)} ({now}"
                      + (f", median of {n} measurable context{'s' if n != 1 else ''})" if n
                         else ": no context measurable, kept)"))
