"""``ds4lab calibrate --from-context``: the sim's ``pdl_edge_us`` (stage 3p) and ``graph_conditional_us`` (stage 3cc)
fitted, no GPU needed, from a measured ``ds4lab context`` folder of stages 3, 3p and 3cc: at each measurable context,
the value at which the sim's paired gain over stage 3 equals the measured one (:func:`fit_capture_stages`). Next:
``docs/calibration.md`` (the fit, its linearity check, the median and the clamp)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .record import preset_changes, read_record

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
    """The measured gains of a ``ds4lab context`` folder (GPU-measured: ``meta.json``, ``context.csv``) that the fit
    reads.

    Returns:
        ``(meta, rows)``: one row per (stage, context) of stages 3p and 3cc, contexts ascending: ``stage``, ``context``,
        ``gain_us``, ``gain_lo``, ``gain_hi`` (µs per token, the paired gain over stage 3 and its 95 % interval),
        ``gain_measurable``, ``preset``.

    Raises:
        ValueError: not a finished GPU-measured context folder, a missing column, stage 3, 3p or 3cc missing at a
            context, gains paired against another stage, or a gain that is not a number (each named, with the file)."""
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
    """Whether a gain fits anything: ``flag`` set, its 95 % interval excluding zero and holding it."""
    return bool(flag) and (lo > 0 or hi < 0) and lo <= gain_us <= hi


def solve(points, target: float) -> tuple[float, float]:
    """The ``x`` at which the piecewise-linear line through ``points`` reaches ``target``.

    Args:
        points: ``[(x, gain)]`` (µs, µs) of one context, ``x`` ascending and distinct, at least two, gain monotone.
        target: the gain (µs) to reach.

    Returns:
        ``(x, slope)``: from the first segment bracketing ``target``, else the first or last segment extended; ``slope``
        in µs of gain per µs.

    Raises:
        ValueError: fewer than two points, or the segment used is flat."""
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
    """Whether every point of ``pts`` lies within ``tol`` µs of the chord through the first and last."""
    (x0, g0), (x1, g1) = pts[0], pts[-1]
    return all(abs(g - (g0 + (g1 - g0) * (x - x0) / (x1 - x0))) <= tol for x, g in pts[1:-1])


def _checked(pts, x: float, target: float, tol: float) -> bool | None:
    """Whether ``x`` is known to give ``target``: a sampled point there, or its segment collinear with a sampled
    neighbour on each side (True); not collinear (False); no third point yet (None)."""
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
    """``max(0, median)`` of per-context values (µs) rounded to the nanosecond; None for none."""
    values = [float(v) for v in values]
    if not values:
        return None
    return round(max(0.0, _median(values)), 3)


def fit_capture_stages(base: dict, folder, *, preset: str | None = None, tokens: int | None = None,
                       probe: dict | None = None, tolerance_us: float = TOLERANCE_US, max_runs: int = MAX_RUNS,
                       say=None) -> tuple[dict, pd.DataFrame]:
    """``base`` with ``pdl_edge_us`` and ``graph_conditional_us`` fitted from a measured context folder
    (``docs/calibration.md``).

    Args:
        base: the calibration to extend (a parsed, valid calibration dict).
        folder: a ``ds4lab context`` folder measured on a GPU (:func:`read_context_gains`).
        preset: the preset the sim models; None: the folder's (another is refused).
        tokens: tokens the sim times per stage and context; None: the folder's ``meta.json`` ``tokens``.
        probe: the second value (µs) of each constant the sim is run at (default :data:`PROBE`).
        tolerance_us: µs within which two sim gains agree (the linearity check).
        max_runs: the most sim runs (each at every context), two at least.
        say: a callable given one line per sim run, or None.

    Returns:
        ``(calibration, table)``: ``base`` with the measured constants replaced, ``name``, ``source`` (the folder, its
        GPU, driver, source digest, git revision) and ``notes`` marking them ``MEASURED``; one table row per constant
        and context (columns: ``docs/calibration.md``).

    Raises:
        ValueError: a bad folder, a preset other than the folder's, bad ``tokens``, ``probe`` or ``max_runs``, or a sim
            gain that does not move with its constant (each named).
        ds4lab.errors.CalibrationError: ``base`` with a probed value is not a valid calibration.
        RuntimeError: a sim gain that moved with the other constant."""
    folder = Path(folder)
    meta, rows = read_context_gains(folder)
    preset, tokens, probe = _checked_inputs(folder, meta, rows, preset, tokens, probe, max_runs)
    fit = _StageFit(base, rows, preset, tokens, tolerance_us, say)
    fit.run_at({f: 0.0 for f in FITTED})
    fit.run_at({f: float(probe[f]) for f in FITTED})
    while True:
        sol = fit.solve_all()
        cal_x = {f: calibration_value([v["gain"][0] for v in sol[f].values()]) for f in FITTED}
        want = fit.next_values(sol, cal_x)
        if not want or len(fit.runs) >= max_runs:
            break
        fit.run_at({f: want.get(f, cal_x[f] if cal_x[f] is not None else float(probe[f])) for f in FITTED})
    table = pd.DataFrame(fit.table(sol, cal_x, max_runs))
    table.attrs["preset_changes"] = preset_changes(meta)
    return _calibration(base, folder, meta, preset, fit.contexts, sol, cal_x), table


def _checked_inputs(folder: Path, meta: dict, rows, preset, tokens, probe, max_runs: int):
    """``(preset, tokens, probe)`` of a fit after checking them (:func:`fit_capture_stages`'s Raises)."""
    presets = sorted({str(p) for p in rows["preset"].dropna()})
    if len(presets) != 1:
        raise ValueError(f"{folder / 'context.csv'}: one preset expected in its preset column, found "
                         f"{presets or 'none'}")
    if preset is not None and preset != presets[0]:
        raise ValueError(f"--preset {preset}: {folder} measured {presets[0]}; the sim must model the token measured")
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
    return presets[0], tokens, probe


class _StageFit:
    """The sim's paired gains of 3p and 3cc over 3 at sampled values of the two constants, per context."""

    def __init__(self, base: dict, rows, preset: str, tokens: int, tolerance_us: float, say) -> None:
        self.base, self.preset, self.tokens, self.tol, self.say = base, preset, tokens, tolerance_us, say
        self.contexts = sorted(int(c) for c in set(rows["context"]))
        self.target = {(r.stage, r.context): r for r in rows.itertuples()}
        self.samples: dict = {f: {c: {} for c in self.contexts} for f in FITTED}
        self.runs: list[dict] = []

    def run_at(self, point: dict) -> None:
        """One sim run with the constants at ``point`` (rounded to :data:`STEP_US`): every context's gains."""
        from .modeled import sim_context

        point = {f: round(float(x), 6) for f, x in point.items()}
        t = sim_context({**self.base, **point}, self.preset, ",".join((BASELINE, *FITTED.values())), self.contexts,
                        self.tokens)
        t = t.assign(context=t["context"].astype(int)).set_index(["stage", "context"])
        for f, stage in FITTED.items():
            for c in self.contexts:
                g, x = float(t.loc[(stage, c), "gain_us"]), point[f]
                was = self.samples[f][c].get(x)
                if was is not None and abs(was - g) > self.tol:  # one run serves both constants only so
                    raise RuntimeError(f"the sim's gain of {stage} over {BASELINE} at context {c} moved from {was:.3f} "
                                       f"to {g:.3f} µs with {f} {x:g} µs kept: it depends on the other constant too")
                self.samples[f][c][x] = g
        self.runs.append(dict(point))
        if self.say is not None:
            self.say(f"sim run {len(self.runs)}: " + ", ".join(f"{k} {v:g} µs" for k, v in point.items()))

    def fitted(self, f: str, c: int) -> bool:
        """Whether the measured gain of ``f``'s stage at context ``c`` fits anything (:func:`measurable`)."""
        r = self.target[(FITTED[f], c)]
        return measurable(r.gain_us, r.gain_lo, r.gain_hi, r.gain_measurable)

    def solve_all(self) -> dict:
        """``{figure: {context: {which: (x, slope, checked)}}}`` for the measurable contexts."""
        out = {}
        for f in FITTED:
            out[f] = {}
            for c in [c for c in self.contexts if self.fitted(f, c)]:
                r = self.target[(FITTED[f], c)]
                pts = list(self.samples[f][c].items())
                got = {}
                for which, g in {"gain": r.gain_us, "lo": r.gain_lo, "hi": r.gain_hi}.items():
                    try:
                        x, s = solve(pts, g)
                    except ValueError as e:
                        raise ValueError(f"the sim's gain of {FITTED[f]} over {BASELINE} at context {c} "
                                         f"({self.preset}): {e} ({f}): nothing to fit") from None
                    got[which] = (x, s, _checked(pts, x, g, self.tol))
                out[f][c] = got
        return out

    def next_values(self, sol: dict, cal_x: dict) -> dict:
        """The values to run the sim at next: past the largest sampled, the calibration's, or one not shown linear."""
        want = {}
        for f in FITTED:
            sampled = set().union(*(set(self.samples[f][c]) for c in self.contexts))
            need = [x for v in sol[f].values() for x, _, _ in v.values()]
            top = max(need, default=0.0)
            if top > max(sampled) + STEP_US:
                want[f] = top
            elif cal_x[f] is not None and cal_x[f] not in sampled:
                want[f] = cal_x[f]
            else:
                pending = [x for which in ("gain", "lo", "hi") for v in sol[f].values()
                           for x, _, ok in [v[which]] if not ok and x >= 0 and round(x, 6) not in sampled]
                if pending:
                    want[f] = pending[0]
        return want

    def table(self, sol: dict, cal_x: dict, max_runs: int) -> list[dict]:
        """The fit's rows, one per constant and context (:func:`fit_capture_stages`'s Returns)."""
        table = []
        for f, stage in FITTED.items():
            for c in self.contexts:
                r = self.target[(stage, c)]
                pts = sorted(self.samples[f][c].items())
                row = {"figure": f, "stage": stage, "context": c, "measured_gain_us": r.gain_us,
                       "measured_gain_lo_us": r.gain_lo, "measured_gain_hi_us": r.gain_hi,
                       "measurable": self.fitted(f, c), "sim_gain_at_zero_us": self.samples[f][c][0.0],
                       "slope_us_per_us": _slope(pts, r.gain_us),
                       "value": math.nan, "value_lo": math.nan, "value_hi": math.nan, "linear": None,
                       "status": "not measurable", "calibration_value": cal_x[f],
                       "sim_gain_at_calibration_us": (self.samples[f][c].get(cal_x[f], math.nan)
                                                      if cal_x[f] is not None else math.nan),
                       "sim_runs": len(self.runs)}
                if c in sol[f]:
                    got = sol[f][c]
                    ends = sorted((got["lo"][0], got["hi"][0]))
                    linear = all(ok is True for _, _, ok in got.values())
                    row.update(value=got["gain"][0], value_lo=ends[0], value_hi=ends[1],
                               slope_us_per_us=got["gain"][1], linear=linear,
                               status=("fitted, negative" if got["gain"][0] < 0 else "fitted") if linear else
                               f"not verified: the sim's gain is not linear around the fitted values and {max_runs} "
                               "sim runs did not settle them")
                table.append(row)
        return table


def _calibration(base: dict, folder: Path, meta: dict, preset: str, contexts, sol: dict, cal_x: dict) -> dict:
    """``base`` with each fitted constant replaced and marked MEASURED, ``name`` and ``source`` naming the folder."""
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
    return out
