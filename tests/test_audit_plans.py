"""Capturable spans and the plans' cost model (:mod:`ds4lab.audit.spans`, :mod:`ds4lab.audit.plans`)
on synthetic traces: the node pacing by hand, the model against the measured eager token, spans broken
at hazards and frozen launches, and the saving reported with its interval."""

from __future__ import annotations

import numpy as np
import pytest

from audit_synth import TraceBuilder, decode_step
from ds4lab.audit import analyze
from ds4lab.audit.plans import Model
from ds4lab.sim.costmodel import Calibration


def _cal(**kw):
    base = Calibration.load(None)
    d = {k: getattr(base, k) for k in ("name", "device", "source", "measured", "host_launch_us",
                                        "host_graph_launch_us", "host_api_us", "kernel_fixed_us", "graph_node_us",
                                        "bandwidth_GBps", "memset_us")}
    d.update(kw)
    return Calibration.load(d)


def test_graph_replay_paces_nodes_as_the_sim_does():
    m = Model(_cal(graph_node_us=1.0, host_graph_launch_us=2.0), {}, {}, pseudo=False)
    # node i starts no earlier than i × 1 µs after the first and no earlier than node i-1's end
    assert m.replay(10.0, 0.0, [0.5, 3.0, 0.2]) == pytest.approx(14.2)
    assert m.replay(10.0, 20.0, [0.5, 3.0, 0.2]) == pytest.approx(24.2)
    assert m.replay(0.0, 0.0, [0.1] * 5) == pytest.approx(4.1)  # short nodes: paced at 1 µs
    assert m.replay_us([0.5, 3.0, 0.2]) == pytest.approx(2.0 + 4.2)


def _host_bound(rng, tokens=12, extra=None):
    b = TraceBuilder()
    for p in range(tokens):
        decode_step(b, rng, layers=4, pos=50, extra=extra)
    return b


def test_the_model_reproduces_the_measured_eager_token(rng):
    (r,) = analyze([_host_bound(rng).table()])
    p = r.plans.set_index(["plan", "mode"])
    check = p.loc[("eager (model check)", "-")]
    assert check["predicted_us"] == pytest.approx(check["eager_measured_us"], rel=0.05)
    assert bool(p["modeled"].all()) and set(p["calibration"]) == {r.calibration["name"]}


def test_a_gpu_bound_token_replays_in_about_its_busy_time(rng):
    b = TraceBuilder()
    for _ in range(10):
        for k in range(30):
            b.launch(f"k{k}", float(rng.uniform(40, 60)), call_ns=2000, gap_ns=500)
        b.call("cudaStreamSynchronize", stream=b.stream, waits=True)
        b.pause(5_000)
    (r,) = analyze([b.table()])
    p = r.plans.set_index(["plan", "mode"])
    busy = float(r.token_table["gpu_busy_us"].median())
    whole = p.loc[("whole token", "any")]
    assert whole["predicted_us"] == pytest.approx(busy + 5 + 2.3 + 1.4, rel=0.03)  # + tail, launch, sync
    eager = p.loc[("eager (model check)", "-")]
    assert eager["predicted_us"] == pytest.approx(eager["eager_measured_us"], rel=0.05)
    # GPU-bound already: the saving is small against the spread, never claimed as a cost
    assert whole["saving_us"] < 0.05 * whole["eager_measured_us"]


def test_a_host_bound_token_saves_and_says_by_how_much(rng):
    (r,) = analyze([_host_bound(rng, tokens=16).table()])
    p = r.plans.set_index(["plan", "mode"])
    whole = p.loc[("whole token", "any")]
    assert whole["predicted_us"] < whole["eager_measured_us"]
    assert bool(whole["measurable"]) and whole["saving_lo"] > 0
    assert whole["saving_pct"] == pytest.approx(100 * whole["saving_us"] / whole["eager_measured_us"])


def test_spans_break_at_hazards_and_frozen_launches_per_mode(rng):
    def add(b, layer):
        if layer == 2:
            b.call("cudaMalloc", stack="serve.py:9 loop;engine.py:41 grow")

    b = TraceBuilder()
    for p in range(6):
        decode_step(b, rng, layers=4, pos=50 + p, extra=add)  # rope's position and attention's grid change
    (r,) = analyze([b.table()])
    s = r.spans
    assert set(s["mode"]) == {"global", "thread_local", "relaxed"}
    g = s[s["mode"] == "global"]
    assert list(g["rank"]) == list(range(1, len(g) + 1))
    assert list(g["launches"]) == sorted(g["launches"], reverse=True)  # largest first
    breakers = " ".join(g["broken_before"]) + " " + " ".join(g["broken_after"])
    assert "cudaMalloc (invalidates) at engine.py:41 grow" in breakers
    assert "rope (frozen launch)" in breakers and "cudaStreamSynchronize (invalidates)" in breakers
    relaxed = " ".join(s.loc[s["mode"] == "relaxed", "broken_before"]) + " ".join(
        s.loc[s["mode"] == "relaxed", "broken_after"])
    assert "cudaMalloc" not in relaxed  # relaxed mode allows cudaMalloc: it breaks no span
    assert (s["tokens_with_it"] >= 1).all() and (s["replay_us"] > 0).all() and (s["gpu_us"] > 0).all()
    plans = r.plans.set_index(["plan", "mode"])
    assert plans.loc[("spans today", "global"), "graphs_per_token"] == len(g)


def test_one_graph_per_shape_pays_a_capture_per_new_shape(rng):
    b = TraceBuilder()
    for p in range(12):
        decode_step(b, rng, layers=3, pos=8, emit=(p % 4 == 3))
    (r,) = analyze([b.table()])
    assert r.n_shapes == 2
    p = r.plans.set_index(["plan", "mode"])
    per_shape = p.loc[("one graph per token shape", "any"), "predicted_us"]
    whole = p.loc[("whole token", "any"), "predicted_us"]
    # the median token replays as in the whole-token plan, captures cost more (equal up to summation order)
    assert per_shape >= whole * (1 - 1e-12)


def test_kernel_only_traces_model_the_host_and_say_so(rng):
    b = _host_bound(rng, tokens=6)
    from ds4lab.trace.events import EventTable, make_frame

    rows = [x for x in b.rows if x["kind"] != "api"]
    (r,) = analyze([EventTable(make_frame(rows), "k.json", "synthetic")])
    assert any("MODELED at the calibration's host_launch_us" in n for n in r.notes)
    check = r.plans.set_index(["plan", "mode"]).loc[("eager (model check)", "-")]
    n_launch = np.mean([sum(1 for it in r.items[t] if it.work) for t in r.items])
    cal = Calibration.load(None)
    assert check["predicted_us"] >= n_launch * cal.host_launch_us  # the modeled host cost of every launch


def test_a_calibration_file_changes_the_plans_and_is_named(rng, tmp_path):
    import json

    from ds4lab.sim.calibration import default_calibration_path

    d = json.loads(default_calibration_path().read_text())
    d["name"] = "slow graphs"
    d["host_graph_launch_us"] = 500.0
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(d))
    trace = _host_bound(rng, tokens=8).table()
    (base,) = analyze([trace])
    (slow,) = analyze([trace], calibration=path)
    assert slow.calibration["name"] == "slow graphs" and slow.calibration["path"] == str(path.resolve())
    w0 = base.plans.set_index(["plan", "mode"]).loc[("whole token", "any"), "predicted_us"]
    w1 = slow.plans.set_index(["plan", "mode"]).loc[("whole token", "any"), "predicted_us"]
    assert w1 - w0 == pytest.approx(500.0 - Calibration.load(None).host_graph_launch_us, rel=0.05)


def test_the_tracer_cost_said_is_its_records():
    """The tracer's cost per launch the audit says where no untraced step is known
    (plans.TRACER_COST) is what its record gives: traced against untraced eager steps of every run."""
    from pathlib import Path

    from ds4lab.audit.plans import TRACER_COST, tracer_cost

    got = tracer_cost(Path(__file__).resolve().parents[1] / TRACER_COST["record"])
    assert got["runs"] == TRACER_COST["runs"]
    for k in ("median_us", "min_us", "max_us"):
        assert round(got[k], 1) == TRACER_COST[k], (k, got[k])


def test_against_untraced_refuses_a_bad_step():
    import pandas as pd

    from ds4lab.audit.plans import against_untraced

    plans = pd.DataFrame([{"plan": "whole token", "predicted_us": 1.0, "predicted_p25": 1.0, "predicted_p75": 1.0}])
    for bad in (0, -3.0, float("nan")):
        with pytest.raises(ValueError, match="untraced eager step"):
            against_untraced(plans, bad, "x")


def test_a_step_timed_twice_beside_its_recording_gets_a_saving_range_over_both(tmp_path):
    """The bundled llama-static outcome holds two untraced eager timings of its step (torch.cuda.graph's eager twin,
    12 209 µs, and the argument cost's plain step, 7 890 µs): the audit, run as a user runs it, says they disagree
    and its saving range spans both; with the second timing taken out, the range is the prediction's alone."""
    import json
    import shutil
    import subprocess
    import sys

    import pandas as pd

    from ds4lab.audit.engines import recorded

    rec = recorded("llama", "static")
    for name in (rec.name, "torch-llama-static.json"):
        shutil.copy(rec.parent / name, tmp_path / name)

    def audit(out):
        run = subprocess.run([sys.executable, "-m", "ds4lab.cli", "audit", str(tmp_path / rec.name), "--out", str(out)],
                             capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "400"})
        assert run.returncode == 0, run.stderr
        return run.stdout, pd.read_csv(out / "plans.csv").set_index("plan").loc["whole token"]

    said, whole = audit(tmp_path / "a")
    outcome = json.loads((tmp_path / "torch-llama-static.json").read_text())
    eager, base = outcome["eager_us"], outcome["overhead"]["baseline_us"]
    assert "the two disagree" in said and f"×{eager / base:.2f} apart" in said
    assert whole["eager_untraced_n"] == 2
    # the eager twin's 12 209 µs is above the traced step's median: no untraced run of the loop; the plain step's is
    assert eager > whole["eager_measured_us"] > base and "the plain step's is the point" in said
    assert whole["eager_untraced_us"] == pytest.approx(base)
    assert whole["saving_untraced_lo"] == pytest.approx(base - whole["predicted_p75"])
    assert whole["saving_untraced_hi"] == pytest.approx(eager - whole["predicted_p25"])

    del outcome["overhead"]
    (tmp_path / "torch-llama-static.json").write_text(json.dumps(outcome))
    said, whole = audit(tmp_path / "b")
    assert "disagree" not in said and whole["eager_untraced_n"] == 1
    assert whole["saving_untraced_lo"] == pytest.approx(eager - whole["predicted_p75"])
