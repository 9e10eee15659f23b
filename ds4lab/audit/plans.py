"""What capture would save: three plans, each a predicted µs per token, MODELED from the trace's own
measured costs and ds4lab's calibrated graph costs (:class:`ds4lab.sim.costmodel.Calibration`).

:class:`Model` replays the tokens through one host clock and one device queue (the sim's cost model);
:func:`plan_table` makes ``plans.csv``'s rows; :func:`attach_untraced` prices the host at a markers pass's
untraced times; :func:`against_untraced` sets the savings against an eager step timed untraced.
The model, the plans and the baselines: docs/audit.md ("The plans' cost model", "Untraced host times")."""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..timing import Stats, paired_difference
from ..trace.sources.common import content_sha256
from .spans import Item, spans_of


#: ``plans.csv``'s ``path`` of a plan modeled on the recorded tokens themselves.
RECORDED_PATH = "recorded"

#: ``plans.csv``'s ``baseline``: the saving against the trace's own eager step, or against an untraced one;
#: also ``host_times`` where the host is priced at the trace's own times.
TRACED, UNTRACED = "traced", "untraced"
#: ``host_times`` of plans over a trace that holds no host call: each launch's host cost is the calibration's.
MODELED_HOST = "modeled (host_launch_us: the trace holds no host calls)"

#: What ds4lab's CUPTI recording cost per launch where it was measured beside an untraced step: µs per
#: launch of (traced eager − untraced eager) over the runs of the record (:func:`tracer_cost`; held to
#: the record by tests/test_doc_numbers.py). The spread is the runs' (host-bound eager steps vary from
#: run to run), so one trace's cost is not known from it: said, never subtracted.
TRACER_COST = {"record": "docs/measurements/h200-2026-12-03/audit-validate", "runs": 22, "median_us": 9.4,
               "min_us": -40.6, "max_us": 282.4, "device": "NVIDIA H200"}


@dataclass
class Untraced:
    """A markers pass attached to a report: ``source`` and ``sha256`` of its file, ``range_name``, per token
    ``inside_us`` (its range) and ``outside_us`` (to the next range; the last token the median of the others),
    ``waits_outside`` (a blocking call between the ranges), ``notes``, ``eager_us`` (:func:`untraced_eager`)."""

    source: str
    range_name: str
    inside_us: list
    outside_us: list
    sha256: str = ""
    waits_outside: bool = False
    notes: list = field(default_factory=list)
    #: per token the untraced eager µs the savings are set against (:func:`untraced_eager`)
    eager_us: list = field(default_factory=list)

    @property
    def label(self) -> str:
        """``plans.csv``'s ``host_times`` of plans priced at it: ``untraced (<file name>)``."""
        return f"untraced ({Path(self.source).name})"

    @property
    def period_us(self) -> list:
        """The untraced host period of each token (its range and what follows it), µs."""
        return [a + b for a, b in zip(self.inside_us, self.outside_us)]


class Model:
    """The cost model (docs/audit.md) over one unit's tokens. ``outside_dev``: per token the loop's device µs
    after it; ``step_tails``: per token the tail inside its range; ``ranges_us``: per token its traced range (µs)."""

    def __init__(self, cal, items_by_token: dict, tails_us: dict, pseudo: bool, node_gap_us: float | None = None,
                 *, outside_dev: dict | None = None, step_tails: dict | None = None,
                 ranges_us: dict | None = None) -> None:
        self.cal = cal
        self.items = items_by_token
        self.tails = tails_us
        self.pseudo = pseudo
        self.tokens = sorted(items_by_token)
        #: idle between two dependent graph nodes (µs): the calibration's unless told (0: modeled durations)
        self.node_gap_us = cal.graph_node_gap_us if node_gap_us is None else node_gap_us
        self.outside_dev = outside_dev or {}
        self.step_tails = step_tails or {}
        self.ranges_us = ranges_us or {}
        #: whether the host's times are untraced (:meth:`untraced`): a whole token's graph then drops the step tail
        self.host_untraced = False

    def untraced(self, u: Untraced) -> "Model":
        """This model with the host priced at the markers pass ``u``: each token's calls scaled by its untraced
        over traced range time, tokens paired by position. Raises ValueError when ``u`` holds another number of tokens
        or this model has no range times."""
        if len(u.inside_us) != len(self.tokens) or not self.ranges_us:
            raise ValueError(f"{u.source}: {len(u.inside_us)} untraced token(s) for {len(self.tokens)} traced "
                             + ("" if self.ranges_us else "(not found from an NVTX range)"))
        items, tails, steps = {}, {}, {}
        for i, t in enumerate(self.tokens):
            traced = self.ranges_us.get(t, 0.0)
            k = u.inside_us[i] / traced if traced > 0 else 1.0
            items[t] = [dataclasses.replace(it, gap_us=it.gap_us * k, dur_us=it.dur_us * k) for it in self.items[t]]
            steps[t] = self.step_tails.get(t, 0.0) * k
            tails[t] = steps[t] + u.outside_us[i]
        m = Model(self.cal, items, tails, self.pseudo, self.node_gap_us, outside_dev=self.outside_dev,
                  step_tails=steps, ranges_us={t: u.inside_us[i] for i, t in enumerate(self.tokens)})
        m.host_untraced = True
        return m

    def device_work_us(self) -> list:
        """Per token, its measured device µs and the loop's after it."""
        return [sum(du for it in self.items[t] for du in it.dev_us) + sum(self.outside_dev.get(t, ()))
                for t in self.tokens]

    def without_host(self) -> "Model":
        """This model with a host that takes no time but its graph launches and blocking calls: the device's floor."""
        items = {t: [dataclasses.replace(it, gap_us=0.0, dur_us=0.0) for it in its] for t, its in self.items.items()}
        m = Model(self.cal, items, {t: 0.0 for t in self.tokens}, self.pseudo, self.node_gap_us,
                  outside_dev=self.outside_dev, ranges_us=self.ranges_us)
        m.host_untraced = self.host_untraced
        return m

    def host_sets_whole(self, scalars: bool) -> bool:
        """Whether the host's times set the whole-token plan (its median above the device's floor)."""
        return float(np.median(self.whole(scalars))) > float(np.median(self.without_host().whole(scalars)))

    # ------------------------------------------------------------------ pieces
    def replay(self, submit: float, free: float, durs: list) -> float:
        """Device end of a graph of nodes lasting ``durs`` (µs) launched at ``submit``, the device free at ``free``."""
        end = max(submit, free)
        first = end
        for i, d in enumerate(durs):
            start = max(first + i * self.cal.graph_node_us, end + (self.node_gap_us if i else 0.0))
            end = start + d
        return end

    def replay_us(self, durs: list) -> float:
        """A graph on its own: its launch plus its paced nodes, from an idle device (µs, MODELED)."""
        g = self.cal.host_graph_launch_us
        return self.replay(g, 0.0, durs)

    def _host_cost(self, it: Item) -> float:
        if self.pseudo:
            return self.cal.host_launch_us
        return it.gap_us + (self.cal.host_api_us if it.blocking else it.dur_us)

    def _eager(self, it: Item, h: float, d: float) -> tuple[float, float]:
        h += self._host_cost(it)
        for du in it.dev_us:
            d = max(h, d) + du
        if it.blocking:
            h = max(h, d)
        return h, d

    # ------------------------------------------------------------------ plans
    def eager(self) -> list[float]:
        """µs per token of the trace as it is (the model check)."""
        def step(t, items, h, d):
            for it in items:
                h, d = self._eager(it, h, d)
            return h, d
        return self._run(step)

    def whole(self, scalars: bool, shapes: list | None = None) -> list[float]:
        """µs per token with one graph per token (``shapes``: one per shape, captured on first sight)."""
        seen: set = set()

        def step(t, items, h, d):
            if shapes is not None and shapes[t] not in seen:
                seen.add(shapes[t])
                h += sum(self._host_cost(it) for it in items if not it.blocking)  # issued into the capture
            if scalars:
                h += self.cal.host_api_us
                d = max(h, d) + self.cal.h2d_gpu_us(64)
            durs = [du for it in items for du in it.dev_us]
            h += (items[0].gap_us if items and not self.pseudo else 0.0) + self.cal.host_graph_launch_us
            d = self.replay(h, d, durs)
            if any(it.blocking for it in items):
                h = max(h + self.cal.host_api_us, d)
            return h, d
        return self._run(step, graph=True)

    def spans(self, mode: str) -> tuple[list[float], float]:
        """µs per token with the spans of ``mode`` captured, and graph launches per token (mean)."""
        graphs = []

        def step(t, items, h, d):
            sp = dict(spans_of(items, mode))
            graphs.append(len(sp))
            i = 0
            while i < len(items):
                if i in sp:
                    b = sp[i]
                    h += (items[i].gap_us if not self.pseudo else 0.0) + self.cal.host_graph_launch_us
                    d = self.replay(h, d, [du for it in items[i:b + 1] for du in it.dev_us])
                    i = b + 1
                    continue
                h, d = self._eager(items[i], h, d)
                i += 1
            return h, d
        per = self._run(step)
        return per, float(np.mean(graphs)) if graphs else 0.0

    def _run(self, step, graph: bool = False) -> list[float]:
        """Per token µs of ``step``; ``graph``: the whole token is one graph."""
        h = d = 0.0
        out = []
        for t in self.tokens:
            f0 = max(h, d)
            h, d = step(t, self.items[t], h, d)
            h += self.tails.get(t, 0.0) - (self.step_tails.get(t, 0.0) if graph and self.host_untraced else 0.0)
            for du in self.outside_dev.get(t, ()):  # the loop's own device work, issued as it goes on
                d = max(h, d) + du
            out.append(max(h, d) - f0)  # the frontier: the host, or the device when it is behind
        return out


def measured_eager(starts_ns: list, dev_starts_ns: list, tails_us: dict, items_by_token: dict) -> list[float]:
    """Measured µs per token: the larger of its host period and its device period (to the next token's
    first call, first device work); the last token: its calls' host time plus its tail, or the others' median
    period when larger."""
    out = []
    for t in sorted(items_by_token):
        if t + 1 < len(starts_ns):
            host = (starts_ns[t + 1] - starts_ns[t]) / 1e3
            dev = (dev_starts_ns[t + 1] - dev_starts_ns[t]) / 1e3 if t + 1 < len(dev_starts_ns) else 0.0
            out.append(max(host, dev))
    for t in sorted(items_by_token):
        if t + 1 >= len(starts_ns):
            items = items_by_token[t]
            own = sum(it.gap_us + it.dur_us for it in items) + tails_us.get(t, 0.0)
            out.append(max(own, float(np.median(out))) if out else own)
    return out


def tails(starts_ns: list, items_by_token: dict, ends_ns: dict) -> dict:
    """Per token the host µs after its last call to the next token's first call; the last token the others' median."""
    out = {}
    for t in sorted(items_by_token):
        if t + 1 < len(starts_ns) and t in ends_ns:
            out[t] = max(starts_ns[t + 1] - ends_ns[t], 0) / 1e3
    med = float(np.median(list(out.values()))) if out else 0.0
    for t in items_by_token:
        out.setdefault(t, med)
    return out


def plan_row(plan: str, mode: str, per: list[float], measured: list[float], graphs: float, eager_launches: float,
             cal_label: str, path: str = RECORDED_PATH, *, untraced: list | None = None, untraced_source: str = "",
             host_times: str = TRACED, floor: list | None = None) -> dict:
    """One ``plans.csv`` row (:func:`plan_table`'s columns): ``per`` the predicted µs of each token, paired by
    position with ``measured``; ``path``: the recording it is modeled on; ``host_times``: what the host is priced at;
    ``untraced``: the untraced eager µs of the same tokens (the saving against it, ``baseline`` :data:`UNTRACED`);
    ``floor``: the same plan without host time (``device_floor_us``, NaN without it)."""
    st = Stats.of(per)
    diff = paired_difference(per, measured)  # measured − predicted, per token: the saving
    base = float(np.median(measured))
    row = {"plan": plan, "mode": mode, "graphs_per_token": graphs, "eager_launches_per_token": eager_launches,
           "predicted_us": st.median, "predicted_p25": st.p25, "predicted_p75": st.p75,
           "eager_measured_us": base, "saving_us": diff.median, "saving_lo": diff.lo, "saving_hi": diff.hi,
           "measurable": diff.measurable, "saving_pct": 100.0 * diff.median / base if base else float("nan"),
           "path": path, "baseline": TRACED, "host_times": host_times,
           "device_floor_us": float(np.median(floor)) if floor else float("nan"), "calibration": cal_label,
           "modeled": True}
    if untraced is not None:
        n = min(len(per), len(untraced))
        u = float(np.median(untraced))
        d = paired_difference(per[:n], untraced[:n]) if not plan.startswith("eager") else None
        nan = float("nan")
        row.update(baseline=UNTRACED, eager_untraced_us=u, untraced_source=untraced_source,
                   saving_untraced_us=d.median if d else nan, saving_untraced_lo=d.lo if d else nan,
                   saving_untraced_hi=d.hi if d else nan,
                   saving_untraced_pct=100.0 * d.median / u if d and u else nan)
    return row


def untraced_eager(u: Untraced, model: Model) -> list[float]:
    """The untraced eager µs of each token: the markers pass's host period, or the token's device work where longer."""
    return [max(a, b) for a, b in zip(u.period_us, model.device_work_us())]


def plan_table(model: Model, measured: list[float], shapes: list[int], scalars: bool, modes,
               launches_per_token: float, cal_label: str, *, check_model: Model | None = None,
               untraced: list | None = None, untraced_source: str = "", host_times: str = TRACED) -> pd.DataFrame:
    """``plans.csv``-style rows: ``plan``, ``mode``, ``graphs_per_token``, ``eager_launches_per_token``,
    ``predicted_us`` (median) with ``predicted_p25``/``p75``, ``eager_measured_us``, ``saving_us`` (median paired
    difference, measured − predicted) with ``saving_lo``/``saving_hi`` (95 %), ``measurable``, ``saving_pct``,
    ``calibration`` (``cal_label``), ``modeled``, ``path``, ``host_times``, ``device_floor_us``.
    ``check_model``: the model of the ``eager (model check)`` row (None: ``model``); ``untraced`` and
    ``untraced_source``: an untraced eager step the savings are also set against (:func:`plan_row`)."""
    rows = []
    bare = model.without_host()

    def add(plan, mode, per, graphs, eager_launches, floor):
        rows.append(plan_row(plan, mode, per, measured, graphs, eager_launches, cal_label, untraced=untraced,
                             untraced_source=untraced_source,
                             host_times=TRACED if plan.startswith("eager") else host_times, floor=floor))

    check = check_model or model
    add("eager (model check)", "-", check.eager(), 0.0, launches_per_token, check.without_host().eager())
    add("whole token", "any", model.whole(scalars), 1.0, 0.0, bare.whole(scalars))
    for m in modes:
        per, graphs = model.spans(m)
        left = float(np.mean([sum(1 for it in model.items[t] if it.work) - sum(
            sum(1 for it in model.items[t][a:b + 1] if it.work) for a, b in spans_of(model.items[t], m))
            for t in model.tokens]))
        add("spans today", m, per, graphs, left, bare.spans(m)[0])
    add("one graph per token shape", "any", model.whole(scalars, shapes), 1.0, 0.0, bare.whole(scalars, shapes))
    return pd.DataFrame(rows)


def tracer_cost(folder) -> dict:
    """:data:`TRACER_COST` from an ``audit validate`` record ``folder``: per run, the recorded ``eager (model
    check)`` row's measured eager µs minus ``engine.json``'s ``eager_us``, over its eager launches per token.
    Returns ``runs``, ``median_us``, ``min_us``, ``max_us``; ValueError for a folder without such a run."""
    per = []
    for run in sorted(Path(folder).iterdir()):
        if not (run / "engine.json").is_file() or not (run / "plans.csv").is_file():
            continue
        untraced = json.loads((run / "engine.json").read_text()).get("eager_us")
        with open(run / "plans.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["plan"].startswith("eager")
                    and r.get("path", RECORDED_PATH) == RECORDED_PATH]
        if untraced and rows and float(rows[0]["eager_launches_per_token"]) > 0:
            per.append((float(rows[0]["eager_measured_us"]) - float(untraced)) / float(rows[0]["eager_launches_per_token"]))
    if not per:
        raise ValueError(f"{folder}: no run with both a traced and an untraced eager step")
    return {"runs": len(per), "median_us": float(np.median(per)), "min_us": float(min(per)), "max_us": float(max(per))}


def tracer_cost_text() -> str:
    """:data:`TRACER_COST` as the report says it."""
    c = TRACER_COST
    return (f"ds4lab's CUPTI recording on the {c['device']} added a median {c['median_us']:.0f} µs per launch "
            f"({c['min_us']:.0f}…{c['max_us']:.0f} over {c['runs']} runs of record {Path(c['record']).parent.name}, "
            "traced against untraced eager steps: the runs' own spread dominates)")


def against_untraced(plans: pd.DataFrame, untraced_us, source: str) -> pd.DataFrame:
    """``plans`` with the saving of each graph plan against an eager step timed untraced, ``untraced_us`` (µs, or
    several timings of the same step, the first the point; ``source`` says where): ``baseline``,
    ``eager_untraced_us`` (``_n``: how many timings), ``untraced_source``, ``saving_untraced_us`` with ``_lo``/``_hi`` (against the predicted
    75th/25th percentile and, where the step was timed more than once, its every timing: no pairing, no interval),
    ``saving_untraced_pct``; the model-check row keeps the traced step. Raises ValueError: a timing that is not a
    positive number."""
    us = [float(x) for x in (untraced_us if isinstance(untraced_us, (list, tuple)) else [untraced_us])]
    for x in us:
        if not np.isfinite(x) or x <= 0:
            raise ValueError(f"untraced eager step {x!r} µs: must be a positive number")
    u = us[0]
    out = plans.copy()
    check = out["plan"].str.startswith("eager")
    out["baseline"] = UNTRACED
    out["eager_untraced_us"] = u
    out["eager_untraced_n"] = len(us)
    out["untraced_source"] = source
    out["saving_untraced_us"] = (u - out["predicted_us"]).where(~check)
    out["saving_untraced_lo"] = (min(us) - out["predicted_p75"]).where(~check)
    out["saving_untraced_hi"] = (max(us) - out["predicted_p25"]).where(~check)
    out["saving_untraced_pct"] = (100.0 * out["saving_untraced_us"] / u).where(~check)
    return out


def baseline(plans) -> str:
    """Which eager step ``plans``' savings are against: :data:`UNTRACED` or :data:`TRACED`."""
    if plans is None or plans.empty or "baseline" not in plans:
        return TRACED
    return str(plans["baseline"].iloc[0])


# ----------------------------------------------------------------------------- untraced host times
def range_times(tokens, ends_ns: dict) -> tuple[dict, dict]:
    """Per NVTX-range token, its step tail (µs from its last call, ``ends_ns[t]``, to its range's end) and its
    range (µs); ({}, {}) for tokens not found from a range."""
    if tokens.range_name is None:
        return {}, {}
    steps = {t: max(tokens.end_ns[t] - e, 0) / 1e3 for t, e in ends_ns.items() if t < len(tokens.end_ns)}
    ranges = {t: max(tokens.end_ns[t] - tokens.start_ns[t], 0) / 1e3 for t in ends_ns if t < len(tokens.end_ns)}
    return steps, ranges


#: How a report's note begins where a markers pass beside its recording was refused.
MARKERS_NOT_USED = "markers pass not used:"


def _check_same_program(table, recorded) -> None:
    """Refuse a markers pass that cannot be a run of the recording's program (ValueError naming why)."""
    from ..trace.recording import MARKERS_PASS
    from .pairing import check_same_program, header

    theirs, ours = header(table), header(recorded)
    if theirs.get("pass") != MARKERS_PASS:
        raise ValueError(f"{table.source}: not a markers pass (its header says pass {theirs.get('pass')!r})")
    check_same_program(table, recorded)
    if theirs.get("exit_status") not in (None, 0) and ours.get("exit_status") in (None, 0):
        raise ValueError(f"{table.source}: the program exited with status {theirs['exit_status']} in this pass and "
                         "ran to its end in the recording")


def _waits_between(report) -> bool:
    """Whether the recording's work between two NVTX-range tokens waits for the device."""
    f, tk = report.unit.frame, report.tokens
    out = (tk.token < 0) & (((f["kind"] == "sync")) | ((f["kind"] == "memcpy")
                                                       & f["copy_kind"].astype(str).str.contains("DtoH")))
    if not out.any() or tk.n < 2:
        return False
    from .tokens import host_time

    t = host_time(f)[out].to_numpy()
    return bool(any(((t >= tk.end_ns[i]) & (t < tk.start_ns[i + 1])).any() for i in range(tk.n - 1)))


def attach_untraced(report, table, *, recorded=None) -> Untraced:
    """Price ``report``'s plans at the untraced host times of the markers pass ``table`` (the same program's
    NVTX ranges, read). Changes ``report.plans``, ``report.untraced`` and ``report.notes``; returns the
    :class:`Untraced`. Attach it before a capture-path pass. ``recorded``: the recording's table, whose header
    names the program. Raises ValueError: a report without plans or with a capture-path pass attached; a table
    that is no markers pass, of another program, or whose program failed where the recording's did not; tokens
    not found from an NVTX range, or ranges not as many as the tokens."""
    from .tokens import untraced_ranges

    if report.plans is None or report.plans.empty or report.model is None:
        raise ValueError(f"{table.source}: the recorded tokens have no plans to price")
    if getattr(report, "capture_path", None) is not None:
        raise ValueError(f"{table.source}: attach the markers pass before the capture-path pass")
    _check_same_program(table, recorded)
    inside, outside = untraced_ranges(table, report.tokens)
    path = getattr(table, "path", None)
    u = Untraced(str(table.source), report.tokens.range_name, inside, outside,
                 sha256=content_sha256(path) if path is not None and Path(path).is_file() else "",
                 waits_outside=_waits_between(report))
    model = report.model.untraced(u)
    eager = untraced_eager(u, report.model)
    u.eager_us = eager
    old = report.plans
    launches = float(old["eager_launches_per_token"].iloc[0]) if len(old) else 0.0
    report.plans = plan_table(model, list(report.measured_us), report.shapes, report.scalars, report.modes, launches,
                              str(old["calibration"].iloc[0]), check_model=report.model, untraced=eager,
                              untraced_source=untraced_source(u), host_times=u.label)
    report.untraced = u
    traced_out = [report.model.tails.get(t, 0.0) - report.model.step_tails.get(t, 0.0) for t in report.model.tokens]
    report.notes.append(
        f"untraced host times: a markers pass ({Path(u.source).name}: the program again, only its NVTX ranges "
        f"recorded) gives each token {np.median(inside):.0f} µs inside its range and {np.median(outside):.0f} µs "
        f"after it (median), against the recording's {np.median(list(report.model.ranges_us.values())):.0f} and "
        f"{np.median(traced_out):.0f} µs traced: the plans price the host at them (host_times '{u.label}')"
        + ("; the loop waits for the device between the tokens, so the untraced time after each holds a wait for "
           "the eager step's device work, which a graph changes: the plans' host is then an upper bound"
           if u.waits_outside else ""))
    return u


def untraced_source(u: Untraced) -> str:
    """``plans.csv``'s ``untraced_source`` of the eager tokens :func:`untraced_eager` takes from ``u``."""
    return (f"the markers pass {Path(u.source).name}: each token's untraced host period (its NVTX range and what "
            "follows it), or its measured device work where longer; paired by position")


def attach_untraced_beside(report, recording, *, recorded=None) -> Untraced | None:
    """:func:`attach_untraced` the markers pass beside ``recording``, where there is one; one that cannot be
    read or is refused is said in ``report.notes`` (:data:`MARKERS_NOT_USED`), none at all in a note too.
    Returns the :class:`Untraced`, or None."""
    from ..trace.recording import markers_beside
    from ..trace.sources import SourceError, read_events

    path = markers_beside(recording) if recording is not None else None
    if path is None:
        if getattr(report, "host_blind", False):
            return None  # the plans' host is the calibration's, said once (no host calls to price)
        if report.plans is not None and not report.plans.empty:
            report.notes.append("plans priced at the trace's own (traced) host times: no markers pass beside it "
                                "(ds4lab audit run records one)")
        return None
    try:
        table = read_events(path)
        table.source, table.path = str(path), path
        return attach_untraced(report, table, recorded=recorded)
    except SourceError as e:
        report.notes.append(f"{MARKERS_NOT_USED} {path.name} cannot be read ({str(e).split(';')[0]})")
    except ValueError as e:
        report.notes.append(f"{MARKERS_NOT_USED} {e}")
    return None


def markers_not_used(report) -> str:
    """The note saying why a markers pass beside the report's recording was not used, or ""."""
    return next((n for n in report.notes if n.startswith(MARKERS_NOT_USED)), "")
