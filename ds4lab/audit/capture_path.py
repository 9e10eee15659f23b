"""The graph plans of a step that takes another path under capture, modeled on its capture-path pass.

A step that asks whether its stream captures (transformers' ``is_tracing``) captures other work than its eager
tokens run; the recorder records the loop once more with PyTorch answering yes (:mod:`ds4lab.trace.capture_path`).
:func:`attach` audits that pass with the same token range and calibration and models the plans that capture the
whole token on it (``whole token``, ``one graph per token shape``; ``path`` names the pass), keeping the
recorded path's beside them (``… (recorded path)``); ``spans today``, the verdicts and the findings stay the
recorded tokens'. :class:`CapturePath` keeps both passes' kernels per token for ``audit validate``. More:
docs/audit.md ("**The capture-path pass**")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..trace.capture_path import asks_capture_status
from ..trace.recording import STEP_KEYS  # the header keys that name a recorded step
from .pairing import check_same_program, header
from .plans import RECORDED_PATH, TRACED, plan_row, untraced_source

#: The plans modeled on the capture-path pass where one is attached (the rest stay on the recorded path).
GRAPH_PLANS = ("whole token", "one graph per token shape")
#: What a plan modeled on the recorded tokens is renamed to beside the capture path's.
RECORDED_SUFFIX = " (recorded path)"


@dataclass
class CapturePath:
    """A capture-path pass attached to a report: ``source``, ``sha256``, ``tokens``, ``kernels_per_token`` (median)
    against ``recorded_kernels_per_token``, ``gpu_busy_us`` against ``recorded_gpu_busy_us`` (median µs per token),
    ``kernel_counts`` (distinct), ``asked`` (PyTorch asked during the pass; None: not said), ``cuda_questions`` (asked
    of CUDA from C/C++: CUDA's answer, not the pass's)."""

    source: str
    tokens: int
    kernels_per_token: int
    recorded_kernels_per_token: int
    gpu_busy_us: float
    recorded_gpu_busy_us: float
    #: the distinct kernel counts of its tokens (a launch list that changes with the position: the mask
    #: padded to an aligned length at some positions only)
    kernel_counts: tuple = ()
    asked: int | None = None
    cuda_questions: int = 0
    sha256: str = ""

    @property
    def label(self) -> str:
        """The pass as the plans' ``path`` names it: ``capture path (<file name>)``."""
        return f"capture path ({Path(self.source).name})"


def _median_int(table: pd.DataFrame, col: str) -> int:
    return int(round(float(table[col].median()))) if table is not None and len(table) and col in table else 0


def _check_pairing(report, table, recorded) -> None:
    """Refuse a pass that cannot be the capture path of ``report``'s step (ValueError naming why)."""
    if report.unit is None or not asks_capture_status(report.unit.frame):
        raise ValueError(f"{table.source}: the recorded tokens never ask whether the stream captures, so they have "
                         "no other path under capture: this pass belongs to another step")
    check_same_program(table, recorded, "step")
    if header(table).get("capture_path_asked") == 0:
        raise ValueError(f"{table.source}: PyTorch was never asked during this pass: it ran the recorded path again")


def attach(report, table, *, token_range: str | None = None, calibration=None, recorded=None) -> CapturePath:
    """Model ``report``'s graph plans on the capture-path pass ``table`` (read). Changes ``report.plans`` (a ``path``
    column; an ``eager (model check)`` row of the pass), ``report.capture_path`` and ``report.notes``; returns the
    :class:`CapturePath`. Its tokens are found by the report's NVTX range (or ``token_range``), its unit the one on the
    report's device with the most kernels; a markers pass attached first prices its host too. ``token_range``,
    ``calibration``: as the report was analyzed; ``recorded``: the recording's table (its header names the step).
    Raises ValueError: a report without plans; recorded tokens that never ask; a pass of another step, one in which
    PyTorch was never asked, or one without tokens found as the report's (each naming the pass's file)."""
    from .analysis import analyze
    from .tokens import NoTokens

    if report.plans is None or report.plans.empty or report.model is None:
        raise ValueError(f"{table.source}: the recorded tokens have no plans to set the capture path beside")
    _check_pairing(report, table, recorded)
    by_range = report.tokens.range_name
    try:
        passes = analyze([table], token_range=by_range or token_range, calibration=calibration, modes=report.modes)
    except NoTokens as e:
        raise ValueError(f"{table.source}: no token in the capture-path pass ({e})") from None
    mine = [r for r in passes if r.device == report.device] or passes
    cp = max(mine, key=lambda r: int(r.token_table["kernels"].sum()) if len(r.token_table) else 0)
    if cp.model is None or not cp.model.tokens:
        raise ValueError(f"{table.source}: no token in the capture-path pass")
    if (cp.tokens.range_name is None) != (by_range is None):
        raise ValueError(f"{table.source}: the pass's tokens are found by {cp.tokens.how}, the recording's by "
                         f"{report.tokens.how}: their positions would not pair")
    header = getattr(table, "header", None) or {}
    info = CapturePath(str(table.source), cp.tokens.n, _median_int(cp.token_table, "kernels"),
                       _median_int(report.token_table, "kernels"),
                       float(cp.token_table["gpu_busy_us"].median()),
                       float(report.token_table["gpu_busy_us"].median()),
                       tuple(sorted({int(k) for k in cp.token_table["kernels"]})),
                       header.get("capture_path_asked"), asks_capture_status(cp.unit.frame),
                       _sha256(getattr(table, "path", None)))
    measured = list(report.measured_us)
    label = report.plans["calibration"].iloc[0]
    model, u, host = cp.model, getattr(report, "untraced", None), TRACED
    if u is not None:  # the loop's untraced times, paired by position with the pass's tokens as with the recording's
        try:
            model, host = cp.model.untraced(u), u.label
        except ValueError as e:
            report.notes.append(f"the capture-path plans keep traced host times ({e})")
            u = None
    bare = model.without_host()
    new = {"whole token": model.whole(cp.scalars), "one graph per token shape": model.whole(cp.scalars, cp.shapes)}
    floors = {"whole token": bare.whole(cp.scalars), "one graph per token shape": bare.whole(cp.scalars, cp.shapes)}
    extra = dict(untraced=u.eager_us, untraced_source=untraced_source(u)) if u is not None else {}
    plans = report.plans.copy()
    if "path" not in plans:
        plans["path"] = RECORDED_PATH
    rows = []
    for r in plans.to_dict("records"):
        if r["plan"] in GRAPH_PLANS and r["path"] == RECORDED_PATH:
            per = new[r["plan"]]
            n = min(len(per), len(measured))  # paired by position with the recorded tokens
            rows.append(plan_row(r["plan"], r["mode"], per[:n], measured[:n], r["graphs_per_token"],
                                 r["eager_launches_per_token"], label, info.label, host_times=host,
                                 floor=floors[r["plan"]][:n], **extra))
            r = {**r, "plan": r["plan"] + RECORDED_SUFFIX}
        rows.append(r)
        if r["plan"] == "eager (model check)" and r["path"] == RECORDED_PATH:
            # how far to trust the model on the pass: its own tokens through it, against their measured µs
            rows.append(plan_row("eager (model check)", "-", cp.model.eager(), list(cp.measured_us), 0.0,
                                 r["eager_launches_per_token"], label, info.label,
                                 floor=cp.model.without_host().eager(), **extra))
    report.plans = pd.DataFrame(rows)
    report.capture_path = info
    asked = f"PyTorch asked {info.asked} times, " if info.asked is not None else ""
    report.notes.append(
        f"capture path: the step asks whether the stream captures; a pass with PyTorch answering yes "
        f"({Path(info.source).name}, {info.tokens} tokens; {asked}CUDA itself {info.cuda_questions} times, from "
        f"C/C++, answered no) launches {info.kernels_per_token} kernels per token ({info.gpu_busy_us:.0f} µs of "
        f"device work) against the recorded tokens' {info.recorded_kernels_per_token} "
        f"({info.recorded_gpu_busy_us:.0f} µs): the graph plans ({', '.join(GRAPH_PLANS)}) are modeled on it, "
        f"the recorded path's beside them{RECORDED_SUFFIX}")
    return info


def _sha256(path) -> str:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path is not None else ""
    except OSError:
        return ""


def attach_beside(report, recording, *, token_range: str | None = None, calibration=None,
                  recorded=None) -> CapturePath | None:
    """:func:`attach` the capture-path pass beside ``recording``, where there is one; one that cannot be read or is
    refused is said in ``report.notes`` (``capture-path pass not used:``). Returns the :class:`CapturePath`, or None."""
    from ..trace.capture_path import capture_path_beside
    from ..trace.sources import SourceError, read_events

    path = capture_path_beside(recording)
    if path is None:
        return None
    try:
        table = read_events(path)
        table.source, table.path = str(path), path
        return attach(report, table, token_range=token_range, calibration=calibration, recorded=recorded)
    except SourceError as e:
        report.notes.append(f"{NOT_USED} {path.name} cannot be read ({str(e).split(';')[0]})")
    except ValueError as e:
        report.notes.append(f"{NOT_USED} {e}")
    return None


#: How a report's note begins where a capture-path pass beside its recording was refused.
NOT_USED = "capture-path pass not used:"


def not_used(report) -> str:
    """The note saying why a capture-path pass beside the report's recording was not used, or ""."""
    return next((n for n in report.notes if n.startswith(NOT_USED)), "")


def modeled_kernel_counts(report) -> tuple:
    """The distinct kernels per token among the tokens the whole-token plan is modeled on (the capture-path pass's
    where one is attached, else the recorded tokens'); () without tokens."""
    if getattr(report, "capture_path", None) is not None:
        return tuple(report.capture_path.kernel_counts)
    t = getattr(report, "token_table", None)
    if t is None or not len(t) or "kernels" not in t:
        return ()
    return tuple(sorted({int(k) for k in t["kernels"]}))


def modeled_kernels(report) -> int | None:
    """The kernels per token of the tokens the whole-token plan is modeled on: the capture-path pass's where one is
    attached, else the recorded tokens' (median); None without tokens."""
    if getattr(report, "capture_path", None) is not None:
        return int(report.capture_path.kernels_per_token)
    t = getattr(report, "token_table", None)
    return _median_int(t, "kernels") if t is not None and len(t) and "kernels" in t else None


__all__ = ["CapturePath", "GRAPH_PLANS", "NOT_USED", "RECORDED_SUFFIX", "STEP_KEYS", "attach", "attach_beside",
           "modeled_kernel_counts", "modeled_kernels", "not_used"]
