"""What capture would save: three plans, each a predicted µs per token, MODELED from the trace's own
measured costs and ds4lab's calibrated graph costs (:class:`ds4lab.sim.costmodel.Calibration`, the
shipped H200 calibration unless another is given).

**The model.** The tokens are replayed in order through one host clock and one device queue, as the
sim's cost model runs them (:mod:`ds4lab.sim.costmodel`):

* **host** — each call costs what the trace measured: the gap before it (the program's own work
  between calls: Python, dispatch) plus its duration; a blocking call (synchronize, synchronous or
  pageable device-to-host copy) costs the calibration's ``host_api_us`` and then waits until the
  device has finished what was issued; after its last call a token's host keeps its measured *tail*
  (sampling, the loop: the time to the next token's first call). A graph launch costs
  ``host_graph_launch_us`` and replaces every call of its graph, gaps included (the code that made
  them no longer runs), except the gap before the graph's first call (the work that leads to it).
  Where the tokens are NVTX ranges and a markers pass gives the loop's untraced times (below), a whole
  token's graph also replaces the step's own code after its last call (the tail up to the range's end).
* **device** — one queue: eager work starts when its call has returned and the previous work is
  done, and lasts what the trace measured. A graph's nodes are paced by the device: node *i* starts
  no earlier than ``graph_node_us`` after node *i−1* began (the sim's replay pacing) and no earlier
  than ``graph_node_gap_us`` after node *i−1*'s end (the device idle between two dependent kernels of a
  replayed graph, which a trace's kernel durations leave out; 0 for a trace whose durations are the
  sim's own per-launch times, which include it), each lasting its measured eager duration.
* **the loop's device work** — what the loop issues between two NVTX-range tokens (the next step's
  inputs, sampling: :func:`ds4lab.audit.tokens.outside_device`) runs on the same queue after the token's
  work, as measured, in every plan: a user who captures the step keeps the loop.
* **overlap** — host and device run side by side; a token costs the advance of whichever of the
  two is further along (the host's clock, or the device's when its queue is behind), so a host-bound
  token costs its host time and a GPU-bound one its device time, with or without a synchronize. A
  trace without API calls has no host side: each launch is modeled at the calibration's
  ``host_launch_us`` (said).

**The plans** (``plan`` column):

* ``eager (model check)`` — the trace as it is, through the model: compare it with the measured
  eager µs per token to see how far to trust the others;
* ``whole token`` — every hazard fixed: the token's device work is one graph launched once per
  token; its blocking calls become one synchronize after the launch; by-value scalars that change
  across tokens are written to the device before each launch (one small host-to-device copy);
* ``spans today`` (one per capture mode) — the capturable spans (:mod:`ds4lab.audit.spans`) each a
  graph, everything else eager as measured;
* ``one graph per token shape`` — as ``whole token``, but the host keeps its launch-list decisions:
  one graph per token shape, each captured the first time its shape is seen (that token's calls are
  issued once more, into the capture, before its first replay; graph instantiation is not modeled).

The eager µs per token is measured: the host time from a token's first call to the next token's
first call, or the device time from its first device work to the next token's when that is longer
(:func:`measured_eager`). The saving is the paired difference per token (measured eager minus predicted), its
median with a 95 % interval (:func:`ds4lab.timing.paired_difference`): "not measurable" when the
interval includes zero.

**Untraced host times** (:class:`Untraced`, :func:`attach_untraced`). A recording's host times carry its
tracer's cost: CUPTI activity on every API call makes a small step's loop several times slower than it
runs. ``ds4lab audit run`` therefore runs the program once more with only its NVTX ranges recorded (the
markers pass, :mod:`ds4lab.trace.recording`), which gives per token its untraced host time inside the
range and outside it (to the next range). Where that pass is attached, the plans price the host at it
(``host_times`` names the pass): the work outside the token (the loop a user keeps) at its untraced time,
and the calls that stay eager (``spans today``, a shape's first capture) at their traced cost scaled by the
token's untraced over traced range time (MODELED: tracing's cost is taken as spread over the token's host
work in proportion). A loop that never waits may run its host ahead of the device; the model takes each
token as the later of the host and the device timelines, so a device-bound plan stays device-bound. The
``eager (model check)`` row stays the traced trace through the model. The untraced eager token is then the
markers pass's host period (range start to the next range's start), or the token's measured device work
(inside and after it) where that is longer (a loop that never waits runs at the device's pace), and the
savings against it are paired per token (95 % interval). Without a markers pass (a Kineto or Nsight trace,
a recording made before the pass existed) the host stays traced (``host_times`` ``traced``), as said.

**Against which eager step.** The trace's eager step carries its tracer's cost (a CUPTI recording, the
PyTorch profiler, Nsight Systems: each launch is slower traced), the plans' graphs mostly do not (their
host calls are gone). Where the eager step was also timed untraced (the torch.cuda.graph outcome beside a
recording: ``check_replay``'s CUDA-event timing), :func:`against_untraced` adds the saving against it
(``baseline`` ``untraced``); the markers pass's untraced tokens come first where both exist (they are the
user's own loop, paired by position); elsewhere the saving is against the traced step (``baseline``
``traced``) and the report says what tracing cost per launch where it was measured (:data:`TRACER_COST`).
"""

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

#: What ds4lab's CUPTI recording cost per launch where it was measured beside an untraced step: µs per
#: launch of (traced eager − untraced eager) over the runs of the record (:func:`tracer_cost`; held to
#: the record by tests/test_doc_numbers.py). The spread is the runs' (host-bound eager steps vary from
#: run to run), so one trace's cost is not known from it: said, never subtracted.
TRACER_COST = {"record": "docs/measurements/h200-2026-12-03/audit-validate", "runs": 22, "median_us": 9.4,
               "min_us": -40.6, "max_us": 282.4, "device": "NVIDIA H200"}


@dataclass
class Untraced:
    """A markers pass attached to a report (module docstring, "Untraced host times"): ``source`` (its file)
    and ``sha256``, ``range_name`` (the NVTX range of the tokens), per token ``inside_us`` (its range) and
    ``outside_us`` (to the next range; the last token the median of the others), ``waits_outside`` (the
    recording's work between the ranges holds a blocking call: the untraced gap then holds a wait for the
    eager step's device work, which a graph changes), ``notes``."""

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
    """The cost model of the module docstring over one unit's tokens.

    ``outside_dev``: per token the device µs the loop issues after it (:func:`ds4lab.audit.tokens.outside_device`);
    ``step_tails``: per token the part of its tail inside its range (after its last call, µs); ``ranges_us``:
    per token its traced range (µs): the last two for pricing at untraced times (:meth:`untraced`)."""

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
        """This model with the host priced at the markers pass ``u`` (module docstring): each token's calls
        scaled by its untraced over traced range time, its tail the step tail so scaled plus the untraced
        time outside the range; tokens paired by position. Raises ValueError when ``u`` holds another
        number of tokens or this model has no range times (tokens not found from an NVTX range)."""
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
        """Per token, its measured device µs and the loop's after it (the device-bound floor of an eager token)."""
        return [sum(du for it in self.items[t] for du in it.dev_us) + sum(self.outside_dev.get(t, ()))
                for t in self.tokens]

    def without_host(self) -> "Model":
        """This model with a host that takes no time but its graph launches and blocking calls (every gap,
        call and tail 0): its whole-token plan is the device's floor, which no host time can lower."""
        items = {t: [dataclasses.replace(it, gap_us=0.0, dur_us=0.0) for it in its] for t, its in self.items.items()}
        m = Model(self.cal, items, {t: 0.0 for t in self.tokens}, self.pseudo, self.node_gap_us,
                  outside_dev=self.outside_dev, ranges_us=self.ranges_us)
        m.host_untraced = self.host_untraced
        return m

    def host_sets_whole(self, scalars: bool) -> bool:
        """Whether the host's times set the whole-token plan (its median above the device's floor,
        :meth:`without_host`): where they do not, a host priced too high (traced) does not change it."""
        return float(np.median(self.whole(scalars))) > float(np.median(self.without_host().whole(scalars)))

    # ------------------------------------------------------------------ pieces
    def replay(self, submit: float, free: float, durs: list) -> float:
        """Device end of a graph of nodes lasting ``durs`` (µs) launched at host time ``submit`` with the
        device free at ``free`` (node pacing of the module docstring)."""
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
        """Per token µs of ``step`` through the model; ``graph``: the whole token is one graph (with
        untraced host times, the step's own code after its last call does not run)."""
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
    """Measured µs per token: the larger of its host period (first call to the next token's first
    call) and its device period (first device work to the next token's first device work: a device
    that falls behind the host sets the pace); the last token, which has no next: its calls' host
    time plus the median tail of the others, or the median of the others' periods when larger."""
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
    """Per token the host time after its last call to the next token's first call (µs); the last
    token gets the median of the others (the trace does not show its next token)."""
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
    """One ``plans.csv`` row (:func:`plan_table`'s columns): ``per`` the predicted µs of each token, paired
    by position with ``measured`` (the eager µs of the same tokens) for the saving; ``path``: the
    recording the prediction is modeled on (:data:`RECORDED_PATH`, or the capture-path pass:
    :mod:`ds4lab.audit.capture_path`); ``host_times``: what the host is priced at (:data:`TRACED`, or a
    markers pass's :attr:`Untraced.label`); ``untraced``: the untraced eager µs of the same tokens, paired
    by position (:func:`untraced_eager`; ``untraced_source`` says where it comes from): the saving against
    it (``baseline`` :data:`UNTRACED`, as :func:`against_untraced` names its columns, with a 95 % interval);
    ``floor``: the same plan with a host that takes no time (:meth:`Model.without_host`), per token:
    ``device_floor_us``, its median (NaN without it)."""
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
    """The untraced eager µs of each token (module docstring): the markers pass's host period, or the
    token's measured device work with the loop's after it (``model``: the recording's) where that is longer."""
    return [max(a, b) for a, b in zip(u.period_us, model.device_work_us())]


def plan_table(model: Model, measured: list[float], shapes: list[int], scalars: bool, modes,
               launches_per_token: float, cal_label: str, *, check_model: Model | None = None,
               untraced: list | None = None, untraced_source: str = "", host_times: str = TRACED) -> pd.DataFrame:
    """``plans.csv``-style rows: ``plan``, ``mode``, ``graphs_per_token``, ``eager_launches_per_token``,
    ``predicted_us`` (median) with ``predicted_p25``/``p75``, ``eager_measured_us`` (median),
    ``saving_us`` (median of the paired per-token differences, measured − predicted) with
    ``saving_lo``/``saving_hi`` (95 %), ``measurable``, ``saving_pct``, ``calibration`` (``cal_label``:
    the calibration as titles name it, :func:`ds4lab.report.provenance.calibration_label`: its name
    when shipped, else name, path and short SHA-256), ``modeled`` (always True: the predictions and
    savings are modeled; ``eager_measured_us`` is the trace's own, which the audit's ``plans.csv``
    says in ``eager_modeled``), ``path`` (:data:`RECORDED_PATH`: the recorded tokens the plans are modeled on),
    ``host_times`` (``host_times``: what ``model``'s host is priced at), ``device_floor_us`` (the plan with a
    host that takes no time: no host time can bring it lower, :meth:`Model.without_host`).

    ``check_model``: the model of the ``eager (model check)`` row (the trace as it is; None: ``model``);
    ``untraced`` (per token) and ``untraced_source``: the untraced eager step the savings are also set
    against (:func:`plan_row`)."""
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
    """:data:`TRACER_COST` computed from an ``audit validate`` record ``folder``: per run (a folder with
    ``engine.json`` and ``plans.csv``), the recorded path's ``eager (model check)`` row's measured eager µs
    (the traced step) minus ``engine.json``'s ``eager_us`` (the step timed untraced), over its eager
    launches per token. Returns ``runs``, ``median_us``, ``min_us``, ``max_us`` (µs per launch)."""
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


def against_untraced(plans: pd.DataFrame, untraced_us: float, source: str) -> pd.DataFrame:
    """``plans`` (:func:`plan_table`'s) with the saving of each graph plan against an eager step timed
    untraced, ``untraced_us`` (µs; ``source`` says where it was measured): ``baseline`` (:data:`UNTRACED`),
    ``eager_untraced_us``, ``untraced_source``, ``saving_untraced_us`` (``untraced_us`` − the predicted
    median) with ``saving_untraced_lo``/``_hi`` (``untraced_us`` − the predicted 75th/25th percentile: the
    prediction's spread over the tokens; the untraced step was timed apart, so nothing pairs them and
    there is no confidence interval), ``saving_untraced_pct``. The ``eager (model check)`` row keeps the
    traced step only (the model models the trace). The traced saving's columns stay as they were.

    Raises:
        ValueError: ``untraced_us`` not a positive number.
    """
    u = float(untraced_us)
    if not np.isfinite(u) or u <= 0:
        raise ValueError(f"untraced eager step {untraced_us!r} µs: must be a positive number")
    out = plans.copy()
    check = out["plan"].str.startswith("eager")
    out["baseline"] = UNTRACED
    out["eager_untraced_us"] = u
    out["untraced_source"] = source
    out["saving_untraced_us"] = (u - out["predicted_us"]).where(~check)
    out["saving_untraced_lo"] = (u - out["predicted_p75"]).where(~check)
    out["saving_untraced_hi"] = (u - out["predicted_p25"]).where(~check)
    out["saving_untraced_pct"] = (100.0 * out["saving_untraced_us"] / u).where(~check)
    return out


def baseline(plans) -> str:
    """Which eager step ``plans``' savings are against: :data:`UNTRACED` where :func:`against_untraced`
    added one, else :data:`TRACED`."""
    if plans is None or plans.empty or "baseline" not in plans:
        return TRACED
    return str(plans["baseline"].iloc[0])


# ----------------------------------------------------------------------------- untraced host times
def range_times(tokens, ends_ns: dict) -> tuple[dict, dict]:
    """Per token of NVTX-range ``tokens`` (:class:`ds4lab.audit.tokens.Tokens`), its step tail (µs from its
    last call, ``ends_ns[t]``, to its range's end) and its range (µs); ({}, {}) for tokens not found from a
    range."""
    if tokens.range_name is None:
        return {}, {}
    steps = {t: max(tokens.end_ns[t] - e, 0) / 1e3 for t, e in ends_ns.items() if t < len(tokens.end_ns)}
    ranges = {t: max(tokens.end_ns[t] - tokens.start_ns[t], 0) / 1e3 for t in ends_ns if t < len(tokens.end_ns)}
    return steps, ranges


#: How a report's note begins where a markers pass beside its recording was refused.
MARKERS_NOT_USED = "markers pass not used:"


def _check_same_program(table, recorded) -> None:
    """Refuse a markers pass that cannot be a run of the recording's program (ValueError naming why)."""
    from ..trace.recording import MARKERS_PASS, STEP_KEYS

    theirs, ours = getattr(table, "header", None) or {}, getattr(recorded, "header", None) or {}
    if theirs.get("pass") != MARKERS_PASS:
        raise ValueError(f"{table.source}: not a markers pass (its header says pass {theirs.get('pass')!r})")
    differ = [k for k in STEP_KEYS if k in theirs and k in ours and theirs[k] != ours[k]]
    if differ:
        raise ValueError(f"{table.source}: recorded from another program than the recording ("
                         + "; ".join(f"{k} {theirs[k]!r} against {ours[k]!r}" for k in differ) + ")")
    if theirs.get("exit_status") not in (None, 0) and ours.get("exit_status") in (None, 0):
        raise ValueError(f"{table.source}: the program exited with status {theirs['exit_status']} in this pass and "
                         "ran to its end in the recording")


def _waits_between(report) -> bool:
    """Whether the recording's work between two NVTX-range tokens holds a wait for the device (a
    synchronization, a device-to-host copy)."""
    f, tk = report.unit.frame, report.tokens
    out = (tk.token < 0) & (((f["kind"] == "sync")) | ((f["kind"] == "memcpy")
                                                       & f["copy_kind"].astype(str).str.contains("DtoH")))
    if not out.any() or tk.n < 2:
        return False
    from .tokens import host_time

    t = host_time(f)[out].to_numpy()
    return bool(any(((t >= tk.end_ns[i]) & (t < tk.start_ns[i + 1])).any() for i in range(tk.n - 1)))


def attach_untraced(report, table, *, recorded=None) -> Untraced:
    """Price ``report``'s plans at the untraced host times of the markers pass ``table`` (an event table of
    the same program's NVTX ranges: :mod:`ds4lab.trace.recording`; module docstring "Untraced host times").
    Changes ``report.plans`` (every graph plan and span modeled again; ``host_times`` names the pass; the
    savings also against the untraced eager tokens, paired by position), ``report.untraced`` and
    ``report.notes``; returns the :class:`Untraced`. Attach it before a capture-path pass
    (:func:`ds4lab.audit.capture_path.attach`), whose graph plans then take the same untraced times.

    Args:
        report: the recorded tokens' :class:`~ds4lab.audit.analysis.AuditReport`.
        table: the markers pass, read (:func:`ds4lab.trace.sources.read_events`).
        recorded: the recording's event table, where its header can name the program.

    Raises:
        ValueError: a report without plans, or with a capture-path pass attached already; a table that is
            no markers pass, or one of another program (its header's argv, engine, cache, dtype), or one whose
            program failed where the recording's did not; tokens not found from an NVTX range, or a pass
            whose ranges are not as many as the tokens (:func:`ds4lab.audit.tokens.untraced_ranges`).
    """
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
    """:func:`attach_untraced` the markers pass saved beside ``recording``
    (:func:`ds4lab.trace.recording.markers_beside`), where there is one; a pass that cannot be read or is
    refused (:func:`attach_untraced`'s reasons) is said in ``report.notes`` (a line starting
    :data:`MARKERS_NOT_USED`) and leaves the plans as they are. Where there is none, a note says the host is
    priced at the recording's traced times. Returns the :class:`Untraced`, or None."""
    from ..trace.recording import markers_beside
    from ..trace.sources import SourceError, read_events

    path = markers_beside(recording) if recording is not None else None
    if path is None:
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
