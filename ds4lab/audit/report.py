"""The audit's outputs: its tables (:func:`tables`), figures (:func:`figures`), ``meta.json`` keys
(:func:`audit_meta`), which the ``audit`` job writes, and the terminal summary (:func:`summary`). Every row carries
its ``source``, ``pid``, ``device`` and where its times come from, so a copied file still says it. The files'
columns: docs/audit.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from ..version import __version__
from .analysis import trace_times
from ..trace.events import COLUMNS
from .probes import INVALIDATES, NO_RULE, NOT_IN_GRAPH, REFUSED
from .names import short_names, short_text
from .units import unit_label, unit_stem

#: Files :func:`write` makes (glob patterns, for ``job_folder``).
OUTPUTS = ("audit.csv", "tokens.csv", "spans.csv", "plans.csv", "audit*.png", "audit*.svg", "audit*.pdf",
           "arguments.csv")


def _with_unit(df: pd.DataFrame, r) -> pd.DataFrame:
    if df is None or df.empty:
        return pd.DataFrame()
    out = df.copy()
    for i, (k, v) in enumerate((("source", r.source), ("pid", r.pid), ("device", r.device))):
        out.insert(i, k, v)
    return out


def audit_meta(reports) -> dict:
    """What ``meta.json`` says about the audit (module docstring)."""
    units = []
    for r in reports:
        units.append({"source": r.source, "tool": r.tool, "pid": r.pid, "device": r.device,
                      "tokens": {"n": r.tokens.n, "how": r.tokens.how, "shapes": r.n_shapes,
                                 "main_thread": r.tokens.main_tid},
                      "capture_stream": {"stream": r.capture_stream, "why": r.capture_why},
                      "legacy_stream": {"streams": sorted(r.legacy), "why": r.legacy_why},
                      "modes": list(r.modes), "notes": list(r.notes), "replay": _replay_meta(r),
                      "capture_path": dataclasses.asdict(r.capture_path) if r.capture_path is not None else None,
                      "untraced": dataclasses.asdict(r.untraced) if getattr(r, "untraced", None) is not None else None})
    cal = reports[0].calibration if reports else None
    label = reports[0].calibration_label if reports else "?"
    return {"job": "audit", "ds4lab": __version__, "event_table_columns": list(COLUMNS),
            "sources": sorted({r.source for r in reports}), "units": units, "calibration": cal,
            "modeled": f"plans.csv and spans.csv replay_us are MODELED (calibration {label}); every other "
                       "time is the trace's: "
                       + "; ".join(f"{r.source} process {r.pid}: {trace_times(r)}" for r in reports)
                       + "".join(f"; the graph plans of {r.source} process {r.pid} (path '{r.capture_path.label}') are "
                                 f"modeled on the times of {r.capture_path.source} (sha256 "
                                 f"{r.capture_path.sha256[:16] or '?'})" for r in reports
                                 if getattr(r, "capture_path", None) is not None)}


def _replay_meta(r) -> dict:
    from .frozen import meta

    return meta(r)


def _tokens_csv(r) -> pd.DataFrame:
    df = _with_unit(r.token_table, r)
    if not df.empty:
        df["tool"], df["modeled"] = r.tool, trace_times(r) == "MODELED"
    return df


def _spans_csv(r) -> pd.DataFrame:
    df = _with_unit(r.spans, r)
    if not df.empty:
        df["tool"], df["modeled"] = r.tool, trace_times(r) == "MODELED"
        df["replay_modeled"], df["calibration"] = True, r.calibration_label
    return df


def _plans_csv(r) -> pd.DataFrame:
    df = _with_unit(r.plans, r)
    if not df.empty:
        df["tool"], df["eager_modeled"] = r.tool, trace_times(r) == "MODELED"
    return df


def tables(reports) -> dict:
    """``{"audit", "tokens", "spans", "plans"}`` → DataFrame for all ``reports`` (each ``<name>.csv``), and
    ``"arguments"`` where a report holds its kernel arguments compared."""
    parts = {"audit": [_with_unit(r.findings, r) for r in reports], "tokens": [_tokens_csv(r) for r in reports],
             "spans": [_spans_csv(r) for r in reports], "plans": [_plans_csv(r) for r in reports]}
    out = {}
    for name, ps in parts.items():
        ps = [p for p in ps if not p.empty]
        df = pd.concat(ps, ignore_index=True) if ps else pd.DataFrame()
        if name == "audit" and "first_row" in df:
            df = df.drop(columns=["first_row"])
        out[name] = df
    if any(getattr(r, "arguments", None) is not None for r in reports):
        from .frozen import table as argument_table

        out["arguments"] = argument_table(reports)  # the kernel arguments compared (ds4lab.audit.frozen)
    return out


def figures(reports) -> dict:
    """One token's timeline per report that has calls (:func:`ds4lab.audit.figure.timeline_figure`): ``{"audit":
    fig}``, or ``{"audit-p<pid>-d<device>": fig, ...}`` when there are several units."""
    from .figure import timeline_figure

    return {("audit" if len(reports) == 1 else f"audit-p{r.pid}-d{r.device}"): timeline_figure(r)
            for r in reports if r.items}


# ----------------------------------------------------------------------------- terminal
def summary(reports, console, max_rows: int = 12) -> None:
    """Print what matters first: invalidating and refused calls, work missing from the graph, calls no rule covers;
    then frozen decisions and host data; then the plans (MODELED); then what was left out or assumed."""
    from rich.table import Table

    for r in reports:
        who = unit_label(r.pid, r.device)
        console.print(f"\n[bold]ds4lab audit[/] of {r.source} ({who}; {r.tool})")
        console.print(f"  tokens: {r.tokens.n}, found by {r.tokens.how}; {r.n_shapes} token shape(s)"
                      + (" (identical launch lists)" if r.n_shapes == 1 else ""))
        console.print(f"  captured stream (modeled as torch.cuda.graph / ds4's accessor capture): {r.capture_why}; "
                      f"legacy stream: {', '.join(map(str, sorted(r.legacy)))} ({r.legacy_why})")
        f = r.findings
        if getattr(r, "host_blind", False):
            console.print("  [yellow]capture verdict unknown from this trace: it holds no API calls for these tokens "
                          "(device work alone), so no call capture would refuse can be seen; record the host calls: "
                          "torch.profiler with ProfilerActivity.CPU, nsys profile -t cuda, or ds4lab audit run[/]")
        if f.empty and not getattr(r, "host_blind", False):
            console.print("  [green]no finding: every call inside the tokens is allowed in every audited mode, and "
                          "the launch list is the same in every token[/]")
        if not f.empty:
            calls = f[f["kind"].isin(("call", "no rule"))]
            if len(calls):
                t = Table(title="calls (verdict per capture mode; rules from ds4lab's sim, checked on the H200)",
                          title_justify="left", show_lines=False)
                for c in ("call", "class", *[m for m in r.modes], "where", "tokens", "count", "rule"):
                    t.add_column(c, overflow="fold")
                for row in calls.head(max_rows).itertuples():
                    rules = ", ".join(sorted({getattr(row, f"rule_{m}") for m in r.modes} - {""})) or "—"
                    t.add_row(row.name, row.call_class, *[_v(getattr(row, f"verdict_{m}")) for m in r.modes],
                              row.where or "—", row.token_range, str(row.count),
                              rules + (" *" if getattr(row, "rule_guess", False) is True else ""))
                console.print(t)
                if len(calls) > max_rows:
                    console.print(f"  … {len(calls) - max_rows} more in audit.csv")
                if (calls.get("rule_guess", pd.Series(dtype=bool)) == True).any():  # noqa: E712 - NaN rows
                    console.print("  [dim]* the rule's source marks (part of) it GUESS: not yet checked on the H200 "
                                  "(ds4lab conformance --backend cupy decides it)[/]")
            var = f[f["kind"] == "variation"]
            if len(var):
                t = Table(title="frozen decisions (a graph captured from one token replays these wrong at others)",
                          title_justify="left")
                for c in ("kernel", "what changes", "tokens", "where", "detail"):
                    t.add_column(c, overflow="fold")
                short = short_names(var["name"].head(max_rows))
                for row in var.head(max_rows).itertuples():
                    t.add_row(short[str(row.name)], row.call_class, row.token_range, row.where or "—",
                              short_text(str(row.what)))
                console.print(t)
            host = f[f["kind"].isin(("host data", "capture path"))]
            for row in host.head(4).itertuples():
                console.print(f"  {row.kind}: {row.name} ({row.call_class}) × {row.count} at {row.where or '—'}: "
                              f"{row.fix}")
        _replay(r, console, max_rows)
        console.print(f"  token shapes: a per-shape graph cache would hold {r.n_shapes} graph(s)")
        _spans(r, console)
        _plans(r, console)
        for n in r.notes:
            console.print(f"  [dim]note: {n}[/]")


def _replay(r, console, max_rows: int) -> None:
    """The replay verdict, what it rests on, and the kernel arguments that differ between tokens."""
    from rich.markup import escape
    from rich.table import Table

    from .frozen import BLIND, RIGHT, UNKNOWN, WRONG, verdict

    v = verdict(r)
    color = {RIGHT: "green", WRONG: "bold red", UNKNOWN: "yellow", BLIND: "yellow"}.get(v.verdict, "bold dark_orange")
    console.print(f"  replay (one graph per token, global mode): [{color}]{v.verdict}[/] — {escape(short_text(v.why))}")
    if v.evidence:
        console.print(f"    evidence: {escape(v.evidence)}")
    if v.command:
        console.print(f"    to know: {escape(v.command)}")
    aa = getattr(r, "arguments", None)
    if aa is None or aa.findings.empty:
        return
    from .frozen import NOT_VALUES

    apart = aa.findings["call_class"].isin(NOT_VALUES)
    t = Table(title="kernel arguments that differ between tokens (arguments.csv)", title_justify="left")
    for c in ("kernel", "class", "launch", "param (byte)", "values", "where", "detail"):
        t.add_column(c, overflow="fold")
    shown = aa.findings[~apart].head(max_rows)
    short = short_names(shown["name"])
    for row in shown.itertuples():
        t.add_row(escape(short[str(row.name)]), row.call_class, str(row.launches), f"{row.param} ({row.byte_offset})",
                  escape(str(row.values)), escape(row.where or "—"), escape(row.what))
    if (~apart).any():
        console.print(t)
    if apart.any():  # bytes with no evidence that the step computes them: listed apart, never a verdict's
        by = aa.findings.loc[apart, "call_class"].value_counts()
        console.print(f"    not read / not a value of the step: {', '.join(f'{n} {c}' for c, n in by.items())} "
                      "(arguments.csv; they decide no verdict)")
    if aa.cost.get("text"):
        console.print(f"    argument capture cost: {aa.cost['text']}")


def _v(v: str) -> str:
    color = {INVALIDATES: "red", REFUSED: "dark_orange", NOT_IN_GRAPH: "magenta", NO_RULE: "bold",
             "frozen": "yellow"}.get(v)
    return f"[{color}]{v}[/]" if color else v


def _spans(r, console, top: int = 3) -> None:
    """The largest capturable spans of the first audited mode (all of them are in spans.csv)."""
    sp = r.spans
    if sp is None or sp.empty:
        return
    m = r.modes[0]
    sp = sp[sp["mode"] == m]
    console.print(f"  capturable spans ({m} mode, token {int(sp['token'].iloc[0]) if len(sp) else '?'}; "
                  f"{len(sp)} in all, spans.csv):")
    sp = sp.head(top)
    short = short_names(pd.concat([sp["first_kernel"], sp["last_kernel"]]))
    for row in sp.itertuples():
        console.print(f"    {row.launches} launches, {short[str(row.first_kernel)]} … {short[str(row.last_kernel)]}: "
                      f"GPU {row.gpu_us:,.1f} µs ({trace_times(r)}), replay {row.replay_us:,.1f} µs (MODELED); from "
                      f"{short_text(str(row.broken_before))} to {short_text(str(row.broken_after))}")


def _plans(r, console) -> None:
    from rich.table import Table

    from .plans import UNTRACED, baseline, tracer_cost_text

    p = r.plans
    if p is None or p.empty:
        return
    times = trace_times(r)
    untraced = baseline(p) == UNTRACED
    against = "the untraced eager step" if untraced else "the traced eager step"
    t = Table(title=f"plans: µs per token, MODELED ({times} trace costs + calibration {r.calibration_label}); "
                    f"saving against {against}", title_justify="left")
    cols = ["plan", "mode", "graphs/token", "predicted µs (IQR)", f"traced eager µs ({times})"]
    host = str(p["host_times"].iloc[-1]) if "host_times" in p else "traced"
    rng = "95 % CI, paired by position" if host.startswith("untraced") else "range: the prediction's IQR"
    if untraced and not host.startswith("untraced") and p.get("eager_untraced_n", pd.Series([1])).iloc[0] > 1:
        rng += " and the step's timings"
    for c in cols + (["untraced eager µs", f"saving (against untraced; {rng})"] if untraced
                     else ["saving (against traced)"]):
        t.add_column(c)
    for row in p.itertuples():
        if row.plan.startswith("eager"):
            # the paired per-token difference, as plans.csv's saving columns hold it (measured - model)
            saving = (f"model check: model − traced {-row.saving_us:+,.1f} µs per token (paired, 95 % CI "
                      f"{-row.saving_hi:+,.1f}–{-row.saving_lo:+,.1f})")
        elif untraced:
            saving = (f"{row.saving_untraced_us:,.1f} µs ({row.saving_untraced_pct:.0f} %, "
                      f"{row.saving_untraced_lo:,.1f}–{row.saving_untraced_hi:,.1f})")
        elif row.measurable and row.saving_hi > row.saving_lo:
            saving = f"{row.saving_us:,.1f} µs ({row.saving_pct:.0f} %, 95 % CI {row.saving_lo:,.1f}–{row.saving_hi:,.1f})"
        elif row.measurable:  # every token's the same (a modeled trace): no interval to show
            saving = f"{row.saving_us:,.1f} µs ({row.saving_pct:.0f} %, the same on every token)"
        else:
            saving = f"not measurable (±{(row.saving_hi - row.saving_lo) / 2:,.1f} µs)"
        path = str(getattr(row, "path", "recorded"))
        cells = [row.plan + (f" — modeled on the {path}" if path.startswith("capture path") else ""), row.mode,
                 f"{row.graphs_per_token:.1f}",
                 f"{row.predicted_us:,.1f} ({row.predicted_p25:,.1f}–{row.predicted_p75:,.1f})",
                 f"{row.eager_measured_us:,.1f}"]
        if untraced:
            cells.append("" if row.plan.startswith("eager") else f"{row.eager_untraced_us:,.1f}")
        t.add_row(*cells, saving)
    console.print(t)
    if untraced and host.startswith("untraced"):
        console.print(f"  host priced at the loop's untraced times ({host}); savings against the untraced eager "
                      f"tokens: {p['eager_untraced_us'].iloc[0]:,.1f} µs ({p['untraced_source'].iloc[0]}; 95 % CI); "
                      "the traced step's savings stay in plans.csv")
    elif untraced:
        console.print(f"  savings against the eager step timed untraced: {p['eager_untraced_us'].iloc[0]:,.1f} µs "
                      f"({p['untraced_source'].iloc[0]}); the traced step's savings (paired, 95 % CI) stay in "
                      "plans.csv. The plans that keep eager calls (spans today, one graph per token shape) price "
                      "them at the trace's cost, tracing included: against the untraced step their saving is "
                      "understated")
    else:
        console.print(f"  savings against the traced eager step, its tracer's cost included (no untraced step is "
                      f"known for this trace): {tracer_cost_text()}")


def write(reports, folder, meta: dict | None = None) -> list:
    """Write the audit's tables, ``meta.json`` and figures into ``folder`` outside any job (``audit validate``'s
    per-run reports); returns the files. A job writes them through :func:`ds4lab.jobs.audit.write_audit` instead."""
    import matplotlib.pyplot as plt

    from ..report.plots import save
    from ..report.results import write_csv, write_meta

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, df in tables(reports).items():
        write_csv(df, folder / f"{name}.csv")
        out.append(folder / f"{name}.csv")
    write_meta(folder / "meta.json", {**(meta or {}), **audit_meta(reports)})
    out.append(folder / "meta.json")
    for stem, fig in figures(reports).items():
        try:
            out += save(fig, folder / stem)
        finally:
            plt.close(fig)
    return out
