"""Figures say what the console says: a timing-only MoE figure says every routing is priced as
uniform; the audit's kernel labels stay inside its axes, below its title; an audit of ds4lab's own
sim trace names device 0 (``device ?`` and ``audit-p1-d-1.png`` before). compare's label for an
ingested folder with a meta.json is in ``tests/test_compare.py``."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ds4lab.report import plots  # noqa: E402


def _summary():
    rows = []
    for routing in ("uniform", "zipf", "hash", "worst"):
        for tokens in (1, 16):
            for stage, ms in (("xq", 0.004), ("sort", 0.001), ("gateup", 0.02), ("midq", 0.003), ("down", 0.01),
                              ("sum", 0.002), ("total", 0.04)):
                rows.append({"mode": "deferred", "routing": routing, "tokens": tokens, "stage": stage,
                             "median_ms": ms, "fallback_calls": 0, "calls": 4})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("timing_only", [True, False])
def test_a_timing_only_moe_figure_says_every_routing_is_priced_as_uniform(timing_only):
    meta = {"modeled": True, "backend": "sim", "preset": {"name": "tiny"}, "sim_timing_only": timing_only,
            "calibration": {"name": "NVIDIA H200 (2026-12-01)", "shipped": True}}
    fig = plots.moe_stage_bars_figure(_summary(), meta)
    try:
        title = fig._suptitle.get_text()
        panels = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert ("every routing is priced as uniform routing" in title) == timing_only
        assert sum("(priced as uniform)" in p for p in panels) == (3 if timing_only else 0)
        assert not any("(priced as uniform)" in p for p in panels if "· uniform" in p)
    finally:
        plt.close(fig)


def test_the_audit_figures_labels_stay_below_its_title(monkeypatch):
    from audit_synth import TraceBuilder, decode_step
    from ds4lab.audit import analyze
    from ds4lab.audit import figure as F

    monkeypatch.setattr(F, "short_name", lambda k, width=40: "vectorized_elementwise_kernel_with_a_long")
    rng = np.random.default_rng(7)
    b = TraceBuilder()
    for p in range(6):
        decode_step(b, rng, layers=3, pos=10 + p, emit=(p % 3 == 2))
    (r,) = analyze([b.table("decode.json")])
    fig = F.timeline_figure(r)
    try:
        fig.canvas.draw()
        rend = fig.canvas.get_renderer()
        ax = fig.axes[0]
        title = ax.title.get_window_extent(rend)
        labels = [t for t in ax.texts if "vectorized" in t.get_text()]
        assert labels
        for t in labels:
            e = t.get_window_extent(rend)
            assert not e.overlaps(title), "a kernel label over the title"
            assert e.y1 <= ax.bbox.y1 + 1, "a kernel label above the axes"
    finally:
        plt.close(fig)


def test_units_without_a_device_or_process_are_named_so():
    from ds4lab.audit.units import unit_label, unit_stem

    assert unit_stem(1, -1) == "audit-p1" and unit_stem(-1, 0) == "audit-d0" and unit_stem(3, 1) == "audit-p3-d1"
    assert unit_label(1, -1) == "process 1, device not recorded"
    assert unit_label(-1, 2) == "process not recorded, device 2"


def test_the_sim_trace_names_its_device(tmp_path):
    import json

    from ds4lab.backends import make_backend
    from ds4lab.jobs.trace import TraceConfig
    from ds4lab.jobs.trace import run as run_trace

    run_trace(TraceConfig(preset="tiny", tokens=1, warmup=1, out=tmp_path / "t"), make_backend("sim", timing_only=True))
    events = json.loads((tmp_path / "t" / "trace.json").read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and {e["args"].get("device") for e in kernels} == {0}
    assert set(pd.read_csv(tmp_path / "t" / "trace_kernels.csv")["device"]) == {0}


def test_the_ladders_labels_stay_clear_of_its_legend_and_stages_keep_their_own_colours():
    """The default ladder (0,0s,i,i+,1,2,3,3u): every stage its own colour (0 and 3u once shared one),
    no bar's annotation overlapping the legend (3u's ran into it), each inside the axes."""
    import pandas as pd

    from ds4lab.report import plots

    stages = ["0", "0s", "i", "i+", "1", "2", "3", "3u"]
    us = [15600.0, 15500, 8100, 9300, 14000, 12000, 7100, 7300]
    df = pd.DataFrame({"stage": stages, "short": ["eager"] * 8, "us_median": us, "us_p25": [u - 50 for u in us],
                       "us_p75": [u + 60 for u in us], "floor_us": 6500.0, "launch_floor_us": 4000.0,
                       "speedup": [us[0] / u for u in us], "exact": True, "kernel_launches": 1078.0,
                       "graph_launches": 1.0})
    fig = plots.ladder_figure(df, {"backend": "cupy", "gpu": "NVIDIA H200"})
    try:
        ax = fig.axes[0]
        colours = [p.get_facecolor()[:3] for p in ax.patches]
        assert len(set(colours)) == len(stages), colours
        assert plots.stage_color("0") != plots.stage_color("3u")
        fig.canvas.draw()
        rend = fig.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(rend)
        notes = [t.get_window_extent(rend) for t in ax.texts]
        assert len(notes) == len(stages)
        for e in notes:
            assert not e.overlaps(legend), "a bar's label runs into the legend"
            assert e.y1 <= ax.bbox.y1 + 1, "a bar's label above the axes"
    finally:
        plt.close(fig)
