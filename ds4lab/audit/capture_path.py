"""The graph plans of a step that takes another path under capture, modeled on its capture-path pass.

A step that asks whether its stream captures (a ``capture path`` finding: transformers' ``is_tracing``)
captures other work than its eager tokens run: under capture transformers builds the attention mask
the eager step leaves to SDPA. The recorder then records the loop once more with PyTorch answering
yes (:mod:`ds4lab.trace.capture_path`: ``capture-path.csv.gz`` beside the recording); :func:`attach`
audits that pass with the same token range and calibration and models the plans that capture the
whole token on it:

* ``whole token`` and ``one graph per token shape``: the capture-path pass's tokens through the same
  cost model (:class:`ds4lab.audit.plans.Model`), their saving paired by position with the recorded
  tokens' measured eager µs (the step the user runs today); ``path`` names the pass;
* the same two plans of the recorded tokens stay, as ``whole token (recorded path)`` and ``one graph
  per token shape (recorded path)``, so the difference the capture path makes is in the table;
* ``spans today`` stay on the recorded path (a span captures part of a token; which of its questions
  fall inside a capture the pass cannot say), and the verdicts and frozen findings stay the recorded
  tokens': the pass is never an argument pass and adds no finding.

The kernels per token of both passes are kept (:class:`CapturePath`): ``audit validate`` holds them to
the kernel nodes of the graph ``torch.cuda.graph`` captured (``same_work``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .plans import RECORDED_PATH, plan_row

#: The plans modeled on the capture-path pass where one is attached (the rest stay on the recorded path).
GRAPH_PLANS = ("whole token", "one graph per token shape")
#: What a plan modeled on the recorded tokens is renamed to beside the capture path's.
RECORDED_SUFFIX = " (recorded path)"


@dataclass
class CapturePath:
    """A capture-path pass attached to a report: ``source`` (its file), ``tokens`` (how many it holds),
    ``kernels_per_token`` (median over its tokens) against the recorded tokens'
    ``recorded_kernels_per_token``, and ``gpu_busy_us`` against ``recorded_gpu_busy_us`` (median µs of
    device work per token, measured)."""

    source: str
    tokens: int
    kernels_per_token: int
    recorded_kernels_per_token: int
    gpu_busy_us: float
    recorded_gpu_busy_us: float
    #: the distinct kernel counts of its tokens (a launch list that changes with the position: the mask
    #: padded to an aligned length at some positions only)
    kernel_counts: tuple = ()

    @property
    def label(self) -> str:
        """The pass as the plans' ``path`` names it: ``capture path (<file name>)``."""
        return f"capture path ({Path(self.source).name})"


def _median_int(table: pd.DataFrame, col: str) -> int:
    return int(round(float(table[col].median()))) if table is not None and len(table) and col in table else 0


def attach(report, table, *, token_range: str | None = None, calibration=None) -> CapturePath:
    """Model ``report``'s graph plans on the capture-path pass ``table`` (an event table; module
    docstring). Changes ``report.plans`` (a ``path`` column on every row), ``report.capture_path`` and
    ``report.notes``; returns the :class:`CapturePath`.

    Args:
        report: the recorded tokens' :class:`~ds4lab.audit.analysis.AuditReport`.
        table: the capture-path pass, read (:func:`ds4lab.trace.sources.read_events`).
        token_range, calibration: as the report was analyzed with (:func:`ds4lab.audit.analysis.analyze`).

    Raises:
        ValueError: a pass with no token, or a report without plans (naming the pass's file).
    """
    from .analysis import analyze
    from .tokens import NoTokens

    if report.plans is None or report.plans.empty or report.model is None:
        raise ValueError(f"{table.source}: the recorded tokens have no plans to set the capture path beside")
    try:
        passes = analyze([table], token_range=token_range, calibration=calibration, modes=report.modes)
    except NoTokens as e:
        raise ValueError(f"{table.source}: no token in the capture-path pass ({e})") from None
    cp = max(passes, key=lambda r: int(r.token_table["kernels"].sum()) if len(r.token_table) else 0)
    if cp.model is None or not cp.model.tokens:
        raise ValueError(f"{table.source}: no token in the capture-path pass")
    info = CapturePath(str(table.source), cp.tokens.n, _median_int(cp.token_table, "kernels"),
                       _median_int(report.token_table, "kernels"),
                       float(cp.token_table["gpu_busy_us"].median()),
                       float(report.token_table["gpu_busy_us"].median()),
                       tuple(sorted({int(k) for k in cp.token_table["kernels"]})))
    measured = list(report.measured_us)
    label = report.plans["calibration"].iloc[0]
    new = {"whole token": cp.model.whole(cp.scalars), "one graph per token shape": cp.model.whole(cp.scalars, cp.shapes)}
    plans = report.plans.copy()
    if "path" not in plans:
        plans["path"] = RECORDED_PATH
    rows = []
    for r in plans.to_dict("records"):
        if r["plan"] in GRAPH_PLANS and r["path"] == RECORDED_PATH:
            per = new[r["plan"]]
            n = min(len(per), len(measured))  # paired by position with the recorded tokens
            rows.append(plan_row(r["plan"], r["mode"], per[:n], measured[:n], r["graphs_per_token"],
                                 r["eager_launches_per_token"], label, info.label))
            r = {**r, "plan": r["plan"] + RECORDED_SUFFIX}
        rows.append(r)
    report.plans = pd.DataFrame(rows)
    report.capture_path = info
    report.notes.append(
        f"capture path: the step asks whether the stream captures; a pass with PyTorch answering yes "
        f"({Path(info.source).name}, {info.tokens} tokens) launches {info.kernels_per_token} kernels per token "
        f"({info.gpu_busy_us:.0f} µs of device work) against the recorded tokens' {info.recorded_kernels_per_token} "
        f"({info.recorded_gpu_busy_us:.0f} µs): the graph plans ({', '.join(GRAPH_PLANS)}) are modeled on it, "
        f"the recorded path's beside them{RECORDED_SUFFIX}")
    return info


def attach_beside(report, recording, *, token_range: str | None = None, calibration=None) -> CapturePath | None:
    """:func:`attach` the capture-path pass saved beside ``recording``
    (:func:`ds4lab.trace.capture_path.capture_path_beside`), where there is one; a pass that cannot be
    read or has no token is said in ``report.notes`` and leaves the plans as they are. Returns the
    :class:`CapturePath`, or None."""
    from ..trace.capture_path import capture_path_beside
    from ..trace.sources import SourceError, read_events

    path = capture_path_beside(recording)
    if path is None:
        return None
    try:
        table = read_events(path)
        table.source = str(path)
        return attach(report, table, token_range=token_range, calibration=calibration)
    except (SourceError, ValueError) as e:
        report.notes.append(f"capture-path pass not used: {e}")
        return None


def modeled_kernel_counts(report) -> tuple:
    """The distinct kernels per token among the tokens the whole-token plan is modeled on (the
    capture-path pass's where one is attached, else the recorded tokens'); () without tokens."""
    if report.capture_path is not None:
        return tuple(report.capture_path.kernel_counts)
    t = getattr(report, "token_table", None)
    if t is None or not len(t) or "kernels" not in t:
        return ()
    return tuple(sorted({int(k) for k in t["kernels"]}))


def modeled_kernels(report) -> int | None:
    """The kernels per token of the tokens the whole-token plan is modeled on: the capture-path pass's
    where one is attached, else the recorded tokens' (median); None without tokens."""
    if report.capture_path is not None:
        return int(report.capture_path.kernels_per_token)
    t = getattr(report, "token_table", None)
    if t is None or not len(t) or "kernels" not in t:
        return None
    return int(round(float(np.median(t["kernels"]))))


__all__ = ["CapturePath", "GRAPH_PLANS", "RECORDED_SUFFIX", "attach", "attach_beside", "modeled_kernel_counts",
           "modeled_kernels"]
