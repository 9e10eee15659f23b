"""The audit of event tables: :func:`analyze` turns each (source, process, device) into one :class:`AuditReport` —
tokens, the capture stream, every call's verdict per capture mode, launch-list variation, capturable spans and the
three plans — never a sum over units.

The steps, each in its own module: units (:mod:`.units`), tokens (:mod:`.tokens`), the capture stream and call verdicts
(:mod:`.verdicts`, rules from the sim through :mod:`.probes`), variation (:mod:`.variation`), spans (:mod:`.spans`),
plans (:mod:`.plans`)."""

from __future__ import annotations

import re

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..capture.stream import CAPTURE_MODES
from ..errors import BadInput
from ..report.provenance import calibration_label
from ..trace.events import check_frame
from .plans import MODELED_HOST, TRACED, Model, measured_eager, plan_table, range_times, tails
from .spans import span_table, token_items
from .tokens import NoTokens, Tokens, find_tokens, launch_order, outside_device
from .units import Unit, legacy_streams, split_units
from .variation import launches, token_shapes, variation
from .verdicts import add_verdicts, capture_stream, findings, token_calls, token_outcomes


class AuditInputError(BadInput):
    """Event tables the audit cannot use (exit 2): no CUDA work, an unknown mode; names the file."""


@dataclass
class AuditReport:
    """The audit of one (source, process, device): ``source``, ``tool``, ``pid``, ``device``; ``tokens``;
    ``capture_stream``/``capture_why``; ``legacy``/``legacy_why``; ``modes``; ``calls`` (every call in a token with its
    class and per-mode verdict, rule, error); ``findings`` (most severe first); ``token_table``, ``spans``, ``plans``
    (MODELED); ``shapes``/``n_shapes``; ``calibration``; ``notes``; ``unit`` and ``items`` (for the figure);
    ``arguments`` (:func:`ds4lab.audit.frozen.attach`; None without a pass); ``model``, ``measured_us``, ``scalars``
    (what the plans came from); ``capture_path``."""

    source: str
    tool: str
    pid: int
    device: int
    tokens: Tokens
    capture_stream: int
    capture_why: str
    legacy: frozenset
    legacy_why: str
    modes: tuple
    calls: pd.DataFrame
    findings: pd.DataFrame
    token_table: pd.DataFrame
    spans: pd.DataFrame
    plans: pd.DataFrame
    shapes: list
    n_shapes: int
    calibration: dict
    notes: list = field(default_factory=list)
    unit: Unit | None = None
    items: dict = field(default_factory=dict)
    arguments: object = None
    #: why the argument pass beside the recording was refused (:func:`ds4lab.audit.frozen.attach`), or ""
    arguments_refused: str = ""
    #: whether the tokens hold no API call (a trace of device work alone): one launch per device row assumed,
    #: its host cost MODELED, and what capture would do with the host's calls unknown
    host_blind: bool = False
    #: the cost model of the plans over these tokens (:class:`~ds4lab.audit.plans.Model`), each token's
    #: measured eager µs (the plans' pairing), and whether a by-value scalar changes across tokens
    model: object = None
    measured_us: list = field(default_factory=list)
    scalars: bool = False
    #: the capture-path pass the graph plans are modeled on (:class:`ds4lab.audit.capture_path.CapturePath`),
    #: set by :func:`ds4lab.audit.capture_path.attach`; None where none was recorded
    capture_path: object = None
    #: the markers pass the plans' host is priced at (:class:`ds4lab.audit.plans.Untraced`), set by
    #: :func:`ds4lab.audit.plans.attach_untraced`; None: the trace's own (traced) host times
    untraced: object = None

    @property
    def label(self) -> str:
        """``<source>, process P, device D``."""
        return f"{self.source}, {self.unit.label if self.unit is not None else ''}"

    @property
    def calibration_label(self) -> str:
        """The plans' calibration as every title names it (:func:`ds4lab.report.provenance.calibration_label`): its
        name when it is ds4lab's shipped file, else name, path and short SHA-256."""
        return calibration_label({"calibration": self.calibration})


def analyze(tables, *, token_range: str | None = None, calibration=None, modes=None) -> list[AuditReport]:
    """One :class:`AuditReport` per (source, process, device) of ``tables``. ``token_range``: an NVTX range name or
    pattern (None: found by itself); ``calibration``: a file or dict (None: the default); ``modes``: default all.
    Raises AuditInputError: a source without kernels, or an unknown mode; NoTokens: no unit has a token (the first's
    message); CalibrationError: a calibration off its schema."""
    from ..sim.calibration import calibration_info
    from ..sim.costmodel import Calibration

    modes = tuple(modes or CAPTURE_MODES)
    bad = [m for m in modes if m not in CAPTURE_MODES]
    if bad:
        raise AuditInputError(f"capture mode(s) {', '.join(bad)}: choose from {', '.join(CAPTURE_MODES)}")
    cal = Calibration.load(calibration)
    cal_info = calibration_info(calibration)
    reports, failures = [], []
    for table in tables:
        check_frame(table.frame)
        units, notes = split_units(table)
        if not units:
            kinds = table.frame["kind"].value_counts().to_dict()
            raise AuditInputError(f"{table.source}: no kernel in this trace ({kinds or 'no rows'}): nothing to audit; "
                                  "was CUDA activity traced?")
        for u in units:
            try:
                tk = find_tokens(u, token_range)
            except NoTokens as e:
                failures.append(e)
                continue
            r = _audit_unit(u, tk, modes, cal, cal_info)
            r.notes = [*_held_to(table.notes, tk.n), *notes, *u.notes, *tk.notes, *r.notes]
            reports.append(r)
    if not reports:
        raise failures[0]
    for r in reports:
        r.notes.extend(f"not audited: {e}" for e in failures)
    return reports


_TRIMMED = re.compile(r"trimmed to the first (\d+) decode steps")


def _held_to(notes: list, found: int) -> list:
    """A table's notes with a header's claim to hold N decode steps (``trimmed to the first N decode steps``)
    kept only where ``found`` tokens are at least N; else said as a claim the file does not bear out."""
    out = []
    for n in notes:
        m = _TRIMMED.search(n)
        if m and found < int(m.group(1)):
            n = (f"its header says {m.group(0)}, but {found} complete token(s) are in the file (cut short or "
                 f"damaged: what was left out is said below); " + n[m.end():].lstrip("; "))
        out.append(n)
    return out


def _audit_unit(u: Unit, tk: Tokens, modes, cal, cal_info) -> AuditReport:
    f = u.frame
    notes: list = []
    cap, cap_why = capture_stream(f, tk.token)
    legacy, legacy_why = legacy_streams(u)
    calls = add_verdicts(token_calls(f, tk.token, cap, legacy, tk.main_tid, notes), modes)
    ko = launch_order(u)
    k = launches(f, ko, tk.token)
    shapes, n_shapes = token_shapes(k, tk.n)
    var, frozen = variation(k, tk.n)
    found = findings(calls, modes)
    if not var.empty:
        for m in modes:
            var[f"verdict_{m}"] = "frozen"
            var[f"rule_{m}"] = ""
            var[f"error_{m}"] = ""
        var["severity"] = len(("invalidates", "refused", "not in graph", "no rule", "allowed"))
        var["rule_source"] = ("CUDA Programming Guide, 'CUDA Graphs': a kernel node keeps the launch parameters and "
                              "by-value arguments it was captured with")
    allf = pd.concat([x for x in (found, var) if not x.empty], ignore_index=True) if not (found.empty and var.empty) \
        else pd.DataFrame()
    items = token_items(f, calls, tk.main_tid, frozen, modes)
    pseudo = bool(len(calls)) and bool(calls["pseudo"].any())
    if pseudo:
        notes.append(f"no host calls in the trace: each launch's host cost is MODELED at the calibration's "
                     f"host_launch_us ({cal.host_launch_us:g} µs)")
    ends = {t: int(calls.loc[calls["token"] == t, "end_ns"].max()) for t in items}
    tail = tails(tk.start_ns, items, ends)
    # a modeled trace's durations are the sim's per-launch times, node gaps included
    steps, ranges = range_times(tk, ends)
    model = Model(cal, items, tail, pseudo, node_gap_us=0.0 if "MODELED" in u.tool else None,
                  outside_dev=outside_device(f, tk), step_tails=steps, ranges_us=ranges)
    measured = measured_eager(tk.start_ns, _device_starts(f, tk), tail, items)
    scalars = (not var.empty) and bool((var["call_class"] == "scalar argument").any())
    launches_per_token = float(np.mean([sum(1 for it in items[t] if it.work) for t in items])) if items else 0.0
    plans = plan_table(model, measured, shapes, scalars, modes, launches_per_token,
                       calibration_label({"calibration": cal_info}),
                       host_times=MODELED_HOST if pseudo else TRACED) if items else pd.DataFrame()
    spans = span_table(items, shapes, modes, model.replay_us)
    table = _token_table(f, tk, calls, shapes, measured, items, modes)
    return AuditReport(u.source, u.tool, u.pid, u.device, tk, cap, cap_why, legacy, legacy_why, modes, calls, allf,
                       table, spans, plans, shapes, n_shapes, cal_info, notes, u, items, model=model,
                       measured_us=list(measured), scalars=scalars, host_blind=pseudo)


def _device_starts(f: pd.DataFrame, tk: Tokens) -> list:
    """Each token's first device work (ns; its host start where it has none)."""
    dev = f[f["kind"].isin(("kernel", "memcpy", "memset")) & (tk.token >= 0)]
    first = dev["start_ns"].groupby(tk.token[dev.index]).min()
    return [int(first.get(t, tk.start_ns[t])) for t in range(tk.n)]


def _token_table(f: pd.DataFrame, tk: Tokens, calls: pd.DataFrame, shapes: list, measured: list, items: dict,
                 modes) -> pd.DataFrame:
    tok = tk.token
    dev = f[f["kind"].isin(("kernel", "memcpy", "memset")) & (tok >= 0)]
    busy = ((dev["end_ns"] - dev["start_ns"]).clip(lower=0) / 1e3).groupby(tok[dev.index]).sum()
    kern = (f["kind"] == "kernel").groupby(tok).sum()
    api = (f["kind"] == "api").groupby(tok).sum()
    out = token_outcomes(calls, tk.n, modes)
    meas = dict(zip(sorted(items), measured))
    out.insert(1, "start_ns", tk.start_ns)
    out.insert(2, "eager_us", [meas.get(t, float("nan")) for t in range(tk.n)])
    out.insert(3, "gpu_busy_us", [float(busy.get(t, 0.0)) for t in range(tk.n)])
    out.insert(4, "kernels", [int(kern.get(t, 0)) for t in range(tk.n)])
    out.insert(5, "api_calls", [int(api.get(t, 0)) for t in range(tk.n)])
    out.insert(6, "shape", shapes)
    return out


def trace_times(report) -> str:
    """How the times of ``report``'s trace are labelled: ``"MODELED"`` for a trace the simulated runtime wrote (its
    tool says MODELED: ds4lab's ``trace.json`` from ``--backend sim``), else ``"measured"``."""
    return "MODELED" if "MODELED" in (report.tool or "") else "measured"
