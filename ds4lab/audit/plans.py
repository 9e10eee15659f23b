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
* **device** — one queue: eager work starts when its call has returned and the previous work is
  done, and lasts what the trace measured. A graph's nodes are paced by the device: node *i* starts
  no earlier than ``graph_node_us`` after node *i−1* began (the sim's replay pacing) and no earlier
  than ``graph_node_gap_us`` after node *i−1*'s end (the device idle between two dependent kernels of a
  replayed graph, which a trace's kernel durations leave out; 0 for a trace whose durations are the
  sim's own per-launch times, which include it), each lasting its measured eager duration.
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

**Against which eager step.** The trace's eager step carries its tracer's cost (a CUPTI recording, the
PyTorch profiler, Nsight Systems: each launch is slower traced), the plans' graphs mostly do not (their
host calls are gone). Where the eager step was also timed untraced (the torch.cuda.graph outcome beside a
recording: ``check_replay``'s CUDA-event timing), :func:`against_untraced` adds the saving against it
(``baseline`` ``untraced``); elsewhere the saving is against the traced step (``baseline`` ``traced``)
and the report says what tracing cost per launch where it was measured (:data:`TRACER_COST`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..timing import Stats, paired_difference
from .spans import Item, spans_of


#: ``plans.csv``'s ``path`` of a plan modeled on the recorded tokens themselves.
RECORDED_PATH = "recorded"

#: ``plans.csv``'s ``baseline``: the saving against the trace's own eager step, or against an untraced one.
TRACED, UNTRACED = "traced", "untraced"

#: What ds4lab's CUPTI recording cost per launch where it was measured beside an untraced step: µs per
#: launch of (traced eager − untraced eager) over the runs of the record (:func:`tracer_cost`; held to
#: the record by tests/test_doc_numbers.py). The spread is the runs' (host-bound eager steps vary from
#: run to run), so one trace's cost is not known from it: said, never subtracted.
TRACER_COST = {"record": "docs/measurements/h200-2026-12-03/audit-validate", "runs": 22, "median_us": 9.4,
               "min_us": -40.6, "max_us": 282.4, "device": "NVIDIA H200"}


class Model:
    """The cost model of the module docstring over one unit's tokens."""

    def __init__(self, cal, items_by_token: dict, tails_us: dict, pseudo: bool, node_gap_us: float | None = None) -> None:
        self.cal = cal
        self.items = items_by_token
        self.tails = tails_us
        self.pseudo = pseudo
        self.tokens = sorted(items_by_token)
        #: idle between two dependent graph nodes (µs): the calibration's unless told (0: modeled durations)
        self.node_gap_us = cal.graph_node_gap_us if node_gap_us is None else node_gap_us

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
        return self._run(step)

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

    def _run(self, step) -> list[float]:
        h = d = 0.0
        out = []
        for t in self.tokens:
            f0 = max(h, d)
            h, d = step(t, self.items[t], h, d)
            h += self.tails.get(t, 0.0)
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
             cal_label: str, path: str = RECORDED_PATH) -> dict:
    """One ``plans.csv`` row (:func:`plan_table`'s columns): ``per`` the predicted µs of each token, paired
    by position with ``measured`` (the eager µs of the same tokens) for the saving; ``path``: the
    recording the prediction is modeled on (:data:`RECORDED_PATH`, or the capture-path pass:
    :mod:`ds4lab.audit.capture_path`)."""
    st = Stats.of(per)
    diff = paired_difference(per, measured)  # measured − predicted, per token: the saving
    base = float(np.median(measured))
    return {"plan": plan, "mode": mode, "graphs_per_token": graphs, "eager_launches_per_token": eager_launches,
            "predicted_us": st.median, "predicted_p25": st.p25, "predicted_p75": st.p75,
            "eager_measured_us": base, "saving_us": diff.median, "saving_lo": diff.lo, "saving_hi": diff.hi,
            "measurable": diff.measurable, "saving_pct": 100.0 * diff.median / base if base else float("nan"),
            "path": path, "baseline": TRACED, "calibration": cal_label, "modeled": True}


def plan_table(model: Model, measured: list[float], shapes: list[int], scalars: bool, modes,
               launches_per_token: float, cal_label: str) -> pd.DataFrame:
    """``plans.csv``-style rows: ``plan``, ``mode``, ``graphs_per_token``, ``eager_launches_per_token``,
    ``predicted_us`` (median) with ``predicted_p25``/``p75``, ``eager_measured_us`` (median),
    ``saving_us`` (median of the paired per-token differences, measured − predicted) with
    ``saving_lo``/``saving_hi`` (95 %), ``measurable``, ``saving_pct``, ``calibration`` (``cal_label``:
    the calibration as titles name it, :func:`ds4lab.report.provenance.calibration_label`: its name
    when shipped, else name, path and short SHA-256), ``modeled`` (always True: the predictions and
    savings are modeled; ``eager_measured_us`` is the trace's own, which the audit's ``plans.csv``
    says in ``eager_modeled``), ``path`` (:data:`RECORDED_PATH`: the recorded tokens the plans are modeled on)."""
    rows = []

    def add(plan, mode, per, graphs, eager_launches):
        rows.append(plan_row(plan, mode, per, measured, graphs, eager_launches, cal_label))

    add("eager (model check)", "-", model.eager(), 0.0, launches_per_token)
    add("whole token", "any", model.whole(scalars), 1.0, 0.0)
    for m in modes:
        per, graphs = model.spans(m)
        left = float(np.mean([sum(1 for it in model.items[t] if it.work) - sum(
            sum(1 for it in model.items[t][a:b + 1] if it.work) for a, b in spans_of(model.items[t], m))
            for t in model.tokens]))
        add("spans today", m, per, graphs, left)
    add("one graph per token shape", "any", model.whole(scalars, shapes), 1.0, 0.0)
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
