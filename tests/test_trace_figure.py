"""plots.trace_figure: each stage's GPU lane carries its label ("N kernels · busy X µs of Y µs (Z %)")
to the right of the lane's last bar, inside the axes, whatever the lane's span and offset."""

from __future__ import annotations

import pandas as pd
import pytest

from ds4lab.report import plots


def _tables():
    """Two stages shaped like the H200 trace (docs/measurements/h200-2026-11-30b/nsight): an eager
    stage whose kernels are spread over 5 ms, and a replayed stage whose host graph launch starts
    1.7 ms before its kernels, which then run back to back for 0.3 ms (a short lane, far from 0)."""
    kern, nvtx = [], []
    for st, first, gap in (("0", 4500.0, 100.0), ("3", 1750.0, 0.0)):
        t = first
        for i in range(6):
            kern.append({"stage": st, "kind": "kernel", "start_us": t, "end_us": t + 50.0, "cluster": "query",
                         "layer": 0, "token": 1})
            t += 50.0 + gap
        nvtx.append({"stage": st, "name": "q_a" if st == "0" else "graph", "cluster": "query", "depth": 2,
                     "start_us": 0.0 if st == "3" else first - 50.0, "end_us": 3500.0 if st == "3" else t})
    return pd.DataFrame(kern), pd.DataFrame(nvtx)


def _mid_y(bars):
    ys = [v for p in bars.get_paths() for v in p.vertices[:, 1]]
    return (min(ys) + max(ys)) / 2


@pytest.fixture
def figure():
    kern, nvtx = _tables()
    fig = plots.trace_figure(kern, nvtx, {"stages": ["0", "3"], "modeled": True, "preset": "tiny"})
    yield fig
    plots.plt.close(fig)


def test_each_lane_has_its_label(figure):
    ax = figure.axes[0]
    labels = {t.get_gid(): t.get_text() for t in ax.texts}
    assert labels["trace-label-0"] == "6 kernels · busy 300 µs of 800 µs (38 %)"
    assert labels["trace-label-3"] == "6 kernels · busy 300 µs of 300 µs (100 %)"


def test_labels_sit_right_of_their_lane_and_inside_the_axes(figure):
    ax = figure.axes[0]
    r = figure.canvas.get_renderer()
    box = ax.get_window_extent(r)
    for st, y in (("0", 1.0), ("3", 3.0)):
        text = next(t for t in ax.texts if t.get_gid() == f"trace-label-{st}")
        tb = text.get_window_extent(r)
        bars = [c for c in ax.collections if c.get_paths() and abs(_mid_y(c) - y) < 0.01]
        assert bars, f"stage {st}: no GPU bars found"
        right = max(ax.transData.transform(v)[:, 0].max() for c in bars for v in (p.vertices for p in c.get_paths()))
        assert len(bars) == 6 and box.x0 < right < box.x1
        assert tb.x0 >= right, f"stage {st}: the label starts at {tb.x0:.0f} px, over bars ending at {right:.0f} px"
        assert tb.x1 <= box.x1, f"stage {st}: the label runs past the axes"
