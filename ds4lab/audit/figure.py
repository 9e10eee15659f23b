"""The audit's figure: one token's timeline. A host lane of the main thread's calls coloured by their worst verdict, a
device lane of its work, every call not allowed (and every frozen launch) marked, one mode's capturable spans
shaded; times the trace's own from the token's first call; the title names the file, the unit and the plans'
calibration (:func:`ds4lab.report.provenance.calibration_label`). Style: :data:`ds4lab.report.plots.STYLE`."""

from __future__ import annotations

import numpy as np

from .probes import ALLOWED, INVALIDATES, NO_RULE, NOT_IN_GRAPH, REFUSED, VERDICTS
from .analysis import trace_times
from .names import label as short_name
from .spans import representative, spans_of
from .units import unit_label

#: Verdict → colour of its calls on the host lane.
VERDICT_COLORS = {INVALIDATES: "#C44E52", REFUSED: "#DD8452", NOT_IN_GRAPH: "#8172B2", NO_RULE: "#7f7f7f",
                  ALLOWED: "#9ecae1", "frozen": "#CCB974"}
MAX_LABELS = 12


def timeline_figure(report, mode: str | None = None):
    """The figure of the module docstring for ``report`` (an :class:`~ds4lab.audit.analysis.AuditReport`); spans shaded
    for ``mode`` (default: the first audited mode). Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..report.plots import STYLE

    mode = mode or report.modes[0]
    t = representative(report.shapes, report.items)
    items = report.items[t]
    f = report.unit.frame
    tok = report.tokens.token
    calls = report.calls[report.calls["token"] == t].set_index("row")
    dev = f[(tok == t) & f["kind"].isin(("kernel", "memcpy", "memset"))]
    rows = f.loc[[it.row for it in items]]
    t0 = float(min(rows["start_ns"].min(), dev["start_ns"].min() if len(dev) else np.inf))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(12, 4.0))
        marks = []
        for it, (_, r) in zip(items, rows.iterrows()):
            vs = [calls.loc[it.row, f"verdict_{m}"] for m in report.modes] if it.row in calls.index else [ALLOWED]
            worst = min(vs, key=VERDICTS.index)
            color = VERDICT_COLORS["frozen"] if it.frozen and worst == ALLOWED else VERDICT_COLORS[worst]
            x, w = (r.start_ns - t0) / 1e3, max((r.end_ns - r.start_ns) / 1e3, 0.05)
            ax.broken_barh([(x, w)], (0.6, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
            if worst != ALLOWED or it.frozen:
                label = (short_name(it.kernels[0]) if it.frozen and it.kernels and worst == ALLOWED else it.api)
                marks.append((x, label))
        for r in dev.itertuples():
            ax.broken_barh([((r.start_ns - t0) / 1e3, max((r.end_ns - r.start_ns) / 1e3, 0.05))], (1.8, 0.8),
                           facecolors="#4C72B0" if r.kind == "kernel" else "#55A868", edgecolor="white",
                           linewidth=0.3)
        for a, b in spans_of(items, mode):
            xa = (f.loc[items[a].row, "start_ns"] - t0) / 1e3
            xb = (f.loc[items[b].row, "end_ns"] - t0) / 1e3
            ax.axvspan(xa, xb, color="#55A868", alpha=0.12, linewidth=0)
        shown = marks if len(marks) <= MAX_LABELS else marks[:: int(np.ceil(len(marks) / MAX_LABELS))]
        labels = [ax.annotate(label, (x, 0.45), xytext=(1, 2), textcoords="offset points", rotation=40, ha="left",
                              va="bottom", fontsize=7) for x, label in shown]
        for x, _ in marks:
            ax.plot([x], [0.45], marker="v", color="black", markersize=4)
        ax.set_yticks([1.0, 2.2], ["host: API calls", "device"])
        ax.set_ylim(3.0, -1.6)
        times = trace_times(report)
        ax.set_xlabel(f"µs from the token's first call ({times}, as traced)")
        ax.grid(axis="y", visible=False)
        handles = [Patch(color=VERDICT_COLORS[v], label=v) for v in (*VERDICTS, "frozen")]
        handles.append(Patch(color="#55A868", alpha=0.25, label=f"capturable span ({mode})"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
        who = unit_label(report.pid, report.device)
        src = report.source if len(report.source) <= 70 else "…" + report.source[-69:]
        ax.set_title(f"token {t} of {report.tokens.n} — {src} ({who}; "
                     f"{report.tool})\ntimes {times} in the trace; spans proposed by the audit\n"
                     f"its plans MODELED (calibration {report.calibration_label})", fontsize=9)
        fig.tight_layout()
        _room_for(ax, labels)
    return fig


def _room_for(ax, labels, anchor: float = 0.45, bottom: float = 3.0, top: float = -1.6) -> None:
    """Raise the top of ``ax``'s inverted y range until every rotated label above the host lane fits."""
    if not labels:
        return
    fig = ax.figure
    for _ in range(3):  # tight_layout moves the axes a little each time: settle
        fig.canvas.draw()
        rend = fig.canvas.get_renderer()
        need = max(t.get_window_extent(rend).y1 for t in labels) - ax.transData.transform((0, anchor))[1]
        height = ax.bbox.height
        share = min(need / height + 0.03, 0.85)  # of the axes height, above the anchor
        # (anchor - L) / (bottom - L) = share  →  L = (anchor - share * bottom) / (1 - share)
        ax.set_ylim(bottom, min(top, (anchor - share * bottom) / (1 - share)))
        fig.tight_layout()
