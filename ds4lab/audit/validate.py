"""The audit held to what ``torch.cuda.graph`` actually does (``ds4lab audit validate``), on the user's path.

Each family is a script of the steps folder (:mod:`ds4lab.audit.steps`), recorded as ``ds4lab audit run``
records a user's script, held to the script's own ``--truth`` and to
:func:`~ds4lab.audit.replay_check.check_replay`. :func:`against_torch` sets one audit beside the truth (the
verdict, the lead finding, the whole-token plan's time: :func:`held`); :func:`validate` runs them all;
:func:`saved_run` reads a run back (``--runs-from``); :func:`failures` says which rows fail.
What is compared and why: docs/audit-arguments.md ("``ds4lab audit validate --out DIR``")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..errors import BadInput
from .capture_path import modeled_kernel_counts, modeled_kernels

#: A predicted replay time agrees within this fraction of the measured one.
TIME_TOLERANCE = 0.10
#: torch.cuda.graph's outcome → the audit's verdict it corresponds to.
OUTCOMES = {"refused": "refused", "captured, replays wrong": "replays wrong",
            "captured, replays right": "replays right",
            # the truth file of a step script (ds4lab.audit.steps) says it in the audit's words
            "replays wrong": "replays wrong", "replays right": "replays right"}


def predicted_outcome(report, mode: str = "global") -> tuple[str, str]:
    """The audit's verdict on capturing one whole token of ``report`` in ``mode``, and what decides it."""
    from .frozen import RIGHT, verdict

    v = verdict(report, mode)
    if v.verdict == RIGHT:
        return v.verdict, v.evidence
    return v.verdict, v.why + (f"; record it with {v.command}" if v.command else "")


def _frozen_summary(rep) -> tuple[int, str]:
    """How many frozen argument findings, and the first few as ``kernel (class, param p byte b)``."""
    aa = getattr(rep, "arguments", None)
    if aa is None:
        return 0, ""
    fr = aa.frozen
    return len(fr), "; ".join(f"{str(r['name'])[:60]} ({r['call_class']}, param {r['param']} byte {r['byte_offset']})"
                              for _, r in fr.head(3).iterrows())


def waits_per_token(report) -> bool:
    """Whether the recorded tokens hold a blocking call (a synchronize, a synchronous or pageable copy
    to the host): the whole-token plan then waits for the device once per token."""
    items = getattr(report, "items", None) or {}
    return any(getattr(it, "blocking", False) for t in items.values() for it in t)


#: How :func:`measured_replay` names the truth's loop that never waits when it is (advance + replay) alone.
BARE_LOOP = "never waits; advance + replay alone, not the script's loop body"


def measured_replay(torch_run: dict, waits: bool) -> tuple[float | None, str]:
    """The measured replay µs per step to hold the whole-token plan to, and which loop: check_replay's loop
    that waits (``replay_sync_us``) when the tokens wait, else the truth's that never waits (``replay_us``: the
    script's loop body, or :data:`BARE_LOOP`); a run with only ``replay_us`` says so."""
    if waits and torch_run.get("replay_sync_us"):
        return torch_run["replay_sync_us"], "waits per step"
    body = torch_run.get("loop_body") or (torch_run.get("truth") or {}).get("loop_body")
    if body:
        return torch_run.get("replay_us"), "never waits; the script's loop body"
    if torch_run.get("replay_sync_us") is None and torch_run.get("replay_us"):
        return torch_run["replay_us"], "one timing (a run before the loops were told apart)"
    return torch_run.get("replay_us"), BARE_LOOP


def held(predicted: float, floor: float | None, replay: float, untraced: bool) -> tuple[bool | None, str]:
    """Whether the whole-token plan ``predicted`` (µs) meets ``replay`` within :data:`TIME_TOLERANCE`, and why
    not: with ``untraced`` host times as it is; with traced ones True when both ``floor`` (the device floor) and
    ``predicted`` meet it, False when neither can, None (not held) when the replay falls between."""
    ok = abs(predicted / replay - 1) <= TIME_TOLERANCE
    if untraced or floor is None or floor != floor:
        return ok, ""
    lo_ok = abs(floor / replay - 1) <= TIME_TOLERANCE
    if ok and lo_ok:
        return True, ""
    if floor > replay * (1 + TIME_TOLERANCE) or predicted < replay * (1 - TIME_TOLERANCE):
        return False, ""
    where = ("is met by the floor, not by the traced plan" if lo_ok else "lies between them")
    return None, (f"not held: no untraced (markers) pass beside the recording, and its traced host sets the "
                  f"whole-token plan: {predicted:.0f} µs with the loop's work outside the token at its traced cost "
                  f"(CUPTI on every call), {floor:.0f} µs with no host time (its device floor); the measured "
                  f"{replay:.0f} µs {where}, and only the loop's untraced times can place the plan between the two "
                  "(ds4lab audit run and audit validate record them: the markers pass)")


def against_torch(report, torch_run: dict) -> dict:
    """The audit of one recording set beside what ``torch.cuda.graph`` did with the same step (``torch_run``:
    ``engine.json``'s fields). Returns ``torch_outcome``, ``torch_detail``, ``audit_verdict``, ``audit_why``,
    ``verdict_agrees``, ``predicted_us`` (whole-token plan, µs, MODELED), ``replay_us`` (measured, CUDA events;
    ``measured_loop`` says which loop), ``replay_sync_us``, ``replay_device_us``, ``predicted_over_measured``,
    ``time_agrees`` and ``time_note`` (:func:`held`), ``host_times``, ``device_floor_us``, ``untraced_eager_us``;
    None where a figure is missing."""
    from .plans import TRACED

    verdict, why = predicted_outcome(report)
    plans = report.plans.set_index("plan") if report.plans is not None and not report.plans.empty else None
    whole = plans.loc["whole token"] if plans is not None and "whole token" in plans.index else None
    predicted = float(whole["predicted_us"]) if whole is not None else None
    floor = float(whole["device_floor_us"]) if whole is not None and "device_floor_us" in whole else None
    host = str(whole["host_times"]) if whole is not None and "host_times" in whole else TRACED
    replay, loop = measured_replay(torch_run, waits_per_token(report))
    u = getattr(report, "untraced", None)
    out = {"torch_outcome": torch_run.get("outcome", ""), "torch_detail": torch_run.get("detail", "")
           or torch_run.get("error", ""), "audit_verdict": verdict, "audit_why": why, "predicted_us": predicted,
           "device_floor_us": floor, "host_times": host if predicted is not None else "",
           "replay_us": replay, "measured_loop": loop if replay else "",
           "replay_sync_us": torch_run.get("replay_sync_us"), "replay_device_us": torch_run.get("replay_device_us"),
           "untraced_eager_us": float(np.median(u.eager_us)) if u is not None and u.eager_us else None,
           "predicted_over_measured": None, "time_agrees": None, "time_note": ""}
    out["verdict_agrees"] = OUTCOMES.get(out["torch_outcome"]) == verdict != ""
    out["graph_kernels"], out["token_kernels"] = torch_run.get("graph_kernels"), token_kernels(report)
    out["same_work"] = same_work(out["graph_kernels"], out["token_kernels"], modeled_kernel_counts(report))
    cp = getattr(report, "capture_path", None)
    out["plan_path"] = cp.label if cp is not None else "recorded"
    if replay and predicted:  # held for every step that captured: a graph of other work is the plan's miss
        out["predicted_over_measured"] = predicted / replay
        out["time_agrees"], out["time_note"] = held(predicted, floor, replay, untraced=host != TRACED)
        if out["time_note"] and loop == BARE_LOOP:
            out["time_note"] += "; and the truth timed advance + replay, not the script's loop body"
    return out


def token_kernels(report) -> int | None:
    """Kernels per token (median) of the tokens the whole-token plan is modeled on, or None without tokens."""
    return modeled_kernels(report)


def same_work(graph_kernels, token_kernels, counts=()) -> bool | None:
    """Whether the captured graph holds as many kernel nodes as a modeled token launches (``token_kernels``, or
    any of ``counts``: a launch list can change with the position); None where a count is missing. Evidence
    beside the time, not a reason to leave it unheld."""
    if graph_kernels is None or token_kernels is None or graph_kernels != graph_kernels:
        return None
    return int(graph_kernels) == int(token_kernels) or int(graph_kernels) in {int(c) for c in counts}


def _inside(path: str, out: Path) -> str:
    """``path`` named inside ``out`` where it lies there (``out`` may be a staging folder renamed later)."""
    if not path:
        return ""
    try:
        return str(Path(path).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return str(path)


def saved_run(folder: Path) -> dict:
    """A run as :func:`ds4lab.audit.steps.run_step` returned it, read back from its folder, its files named where
    they are now. Raises :class:`~ds4lab.errors.BadInput` naming a folder without ``engine.json``."""
    import json

    from ..errors import BadInput

    folder = Path(folder)
    f = folder / "engine.json"
    if not f.is_file():
        raise BadInput(f"{folder}: no engine.json: not a run of ds4lab audit validate")
    try:
        r = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{f}: not a run's engine.json ({type(e).__name__}: {e})") from None
    if not isinstance(r, dict):
        raise BadInput(f"{f}: not a run's engine.json (a {type(r).__name__}, not an object)")
    for key, name in (("recording", "recording.csv.gz"), ("arguments", "arguments.json.gz"),
                      ("markers", "recording.markers.csv.gz")):
        r[key] = str(folder / name) if (folder / name).is_file() else ""
    return with_check(r)


def with_check(r: dict) -> dict:
    """``r`` with check_replay's ``replay_sync_us`` and ``replay_device_us`` where it has a check and lacks them."""
    chk = r.get("check") or {}
    if chk:
        r.setdefault("replay_sync_us", chk.get("replay_sync_us"))
        r.setdefault("replay_device_us", chk.get("replay_device_us"))
    return r


def runs(engines=(), caches=(), dtypes=(), *, steps=None, runs_from: Path | None = None):
    """The runs asked for, as ``(family, cache, dtype, saved, script)``: with ``runs_from`` the saved runs there
    matching the filters (``saved()`` reads one back); else every family script of the steps folder in each of
    its caches and dtypes that match (``saved`` None). A filter name may be a family or a cache. Raises
    BadInput: a filter name no family or cache has (naming those there are)."""
    names = set(engines) | set(caches)
    found = []
    if runs_from is not None:
        for f in sorted(Path(runs_from).glob("*/engine.json")):
            try:
                r = json.loads(f.read_text())
            except (OSError, ValueError):
                r = {}
            fam = str(r.get("family") or r.get("engine") or "")
            found.append((fam, str(r.get("cache", "")), str(r.get("dtype", "float32")),
                          lambda folder=f.parent: saved_run(folder), f.parent))
    else:
        from .steps import discover, listing

        def listed(scripts):
            out = []
            for script in scripts:
                ls = listing(script)
                out += [(str(ls["family"]), str(c), str(d), None, script) for c in ls["caches"] for d in ls["dtypes"]]
            return out

        chosen = discover(steps, names)  # only the scripts named, where a name is a script's
        found = listed(chosen)
        if any(n not in {x[0] for x in found} | {x[1] for x in found} for n in names) and chosen != discover(steps):
            found = listed(discover(steps))  # a name that is none of theirs: ask every script
    fams, cas = {x[0] for x in found}, {x[1] for x in found}
    unknown = sorted(n for n in names if n not in fams and n not in cas)
    if unknown and runs_from is None:
        raise BadInput(f"audit validate: unknown {', '.join(unknown)}; families: {', '.join(sorted(fams))}; caches: "
                       f"{', '.join(sorted(cas))}")
    want_f = {n for n in names if n in fams}
    want_c = {n for n in names if n in cas}
    if names and not (want_f or want_c):  # (saved runs) none of the names asked for is there
        return []
    return [x for x in found if (not want_f or x[0] in want_f) and (not want_c or x[1] in want_c)
            and (not dtypes or x[2] in dtypes)]


def cause_first(lead: dict, cause, sources: Path | None = None) -> bool | None:
    """Whether the finding a verdict leads with is the truth's cause (``{"file", "line", "kernel_hint"}``): its
    place names ``file:line`` (or, with ``sources``, a line of the same statement) and its kernel holds the hint.
    None where the truth names no cause."""
    if not isinstance(cause, dict) or not cause.get("file") or cause.get("line") is None:
        return None
    name, line = Path(str(cause["file"])).name, int(cause["line"])
    places = [int(n) for f, n in re.findall(r"([^/\\\s;]+\.py):(\d+)", str((lead or {}).get("where", "")))
              if f == name]
    span = _statement_of(Path(sources) / name, line) if sources is not None else None
    if not any(n == line or (span is not None and span[0] <= n <= span[1]) for n in places):
        return False
    hint = cause.get("kernel_hint")
    return not hint or str(hint).lower() in str((lead or {}).get("name", "")).lower()


def _statement_of(path: Path, line: int) -> tuple[int, int] | None:
    """``(first, last)`` line of the innermost simple statement of ``path`` holding ``line``, or None."""
    import ast

    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.lineno <= line <= (node.end_lineno or 0):
            if best is None or node.end_lineno - node.lineno < best[1] - best[0]:
                best = (node.lineno, node.end_lineno)
    return best


def validate(engines, caches, out: Path, *, dtypes=("float32",), say=print, on_row=None,
             on_report=None, runs_from: Path | None = None, steps=None,
             capture_cost: bool = True) -> "pd.DataFrame":  # noqa: F821
    """Run, audit and compare every family of the steps folder (:func:`runs`) on the user's path; writes each
    report under ``out/<family>-<cache>-<dtype>/audit/`` and returns ``validate.csv``'s rows. ``on_row(rows)``
    after each run; ``on_report(report, "<run>/audit")`` writes each report (default
    :func:`ds4lab.audit.report.write`); ``runs_from``: audit saved runs instead (no GPU); ``steps``: the steps
    folder; ``capture_cost``: measure the argument capture's cost per launch."""
    import pandas as pd

    from . import report as audit_report
    from .analysis import analyze
    from .arguments import store_beside
    from .capture_path import attach_beside, not_used
    from .frozen import WRONG, attach, verdict
    from .plans import attach_untraced_beside, markers_not_used
    from .steps import run_step, steps_folder
    from ..trace.sources import read_events as read

    rows = []
    for engine, cache, dtype, saved, script in runs(engines, caches, dtypes, steps=steps, runs_from=runs_from):
        name = f"{engine}-{cache}-{dtype}"
        r = saved() if saved is not None else run_step(script, engine, cache, dtype, out, say=say,
                                                       capture_cost=capture_cost)
        r.setdefault("outcome", "")
        chk = with_check(r).get("check") or {}
        cost = r.get("overhead") or {}
        cause = r.get("cause")
        row = {"family": engine, "cache": cache, "dtype": dtype, "torch_outcome": r.get("outcome", ""),
               "torch_detail": r.get("detail", "") or r.get("error", ""),
               "first_position": r.get("first_position"), "eager_us": r.get("eager_us"),
               "replay_us": r.get("replay_us"), "measured_loop": "", "replay_sync_us": r.get("replay_sync_us"),
               "replay_device_us": r.get("replay_device_us"), "audit_verdict": "", "audit_why": "",
               "lead": "", "cause": (f"{cause.get('file')}:{cause.get('line')}"
                                     + (f" ({cause['kernel_hint']})" if cause.get("kernel_hint") else "")
                                     if isinstance(cause, dict) else ""),
               "cause_first": None, "frozen_findings": 0, "frozen": "", "frozen_on_right": False,
               "check_outcome": chk.get("verdict", "") if chk else "", "check_detail": chk.get("detail", "")
               or chk.get("error", ""), "check_agrees": None, "predicted_us": None, "predicted_over_measured": None,
               "capture_us_per_launch": cost.get("per_launch_us"), "capture_lo": cost.get("per_launch_lo"),
               "capture_hi": cost.get("per_launch_hi"), "capture_cost": cost.get("text", ""),
               "verdict_agrees": False, "time_agrees": None, "time_note": "", "device_floor_us": None,
               "host_times": "", "untraced_eager_us": None, "graph_kernels": r.get("graph_kernels"),
               "token_kernels": None, "same_work": None, "plan_path": "",
               "recording": _inside(r.get("recording", ""), out),
               "arguments": _inside(r.get("arguments", ""), out), "error": r.get("error", "")}
        if chk:
            row["check_agrees"] = OUTCOMES.get(row["torch_outcome"]) == chk.get("verdict")
        if r.get("recording"):
            path = Path(r["recording"])
            table = read(path)
            table.source = f"{name}/recording.csv.gz"  # named inside the result folder (out may be staged)
            rep = analyze([table])[0]  # the tokens as a user's: found by themselves (the step's own NVTX range)
            attach_untraced_beside(rep, path, recorded=table)  # the markers pass: the loop's untraced times
            attach_beside(rep, path, recorded=table)  # the capture-path pass
            store = store_beside(path)
            args_error = ""
            if store is not None:
                try:
                    attach(rep, store, recorded=table)
                except ValueError as e:
                    args_error = f"kernel arguments not compared: {e}"
                    rep.notes.append(args_error)
            if on_report is not None:
                on_report(rep, f"{name}/audit")
            else:
                audit_report.write([rep], Path(out) / name / "audit")
            row.update(against_torch(rep, r))
            row["frozen_findings"], row["frozen"] = _frozen_summary(rep)
            v = verdict(rep)
            row["lead"] = (f"{str(v.lead.get('name', ''))[:60]} at {v.lead.get('where') or '—'}" if v.lead else "")
            script = r.get("script")
            # the script's folder, where the run's script is still there (a saved run names it as it ran), else
            # the steps folder (a run copied elsewhere, as the fixtures are)
            sources = Path(script).parent if script and Path(script).is_file() else steps_folder(steps)
            row["cause_first"] = (cause_first(v.lead, cause, sources)
                                  if v.verdict == WRONG else (None if cause is None else False))
            row["frozen_on_right"] = bool(OUTCOMES.get(row["torch_outcome"]) == "replays right"
                                          and (row["frozen_findings"] > 0 or row["audit_verdict"] == WRONG))
            refused = (not_used(rep), markers_not_used(rep))  # passes beside the recording the plans could not use
            row["error"] = "; ".join(x for x in (row["error"], args_error, *refused) if x)
        say(_progress_line(row, engine, cache, dtype, chk))
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    return pd.DataFrame(rows)



def _progress_line(row: dict, engine: str, cache: str, dtype: str, chk: dict) -> str:
    """One run's row as :func:`validate` says it."""
    return (f"{engine}/{cache}/{dtype}: torch {row['torch_outcome'] or row['torch_detail'][:80]} · audit "
            f"{row['audit_verdict'] or '-'} ({'agrees' if row['verdict_agrees'] else 'DISAGREES'})"
            + (f" · leads with {row['lead']}" + ("" if row["cause_first"] is None else
                                                 " (the true cause)" if row["cause_first"] else
                                                 f" (NOT the true cause, {row['cause']})") if row["lead"] else "")
            + (f" · check_replay {row['check_outcome'] or row['check_detail'][:80]}"
               + ("" if row["check_agrees"] is None else " (agrees)" if row["check_agrees"] else " (DISAGREES)")
               if chk else "")
            + (f" · replay {row['replay_us']:.0f} µs measured ({row['measured_loop']}), {row['predicted_us']:.0f} "
               f"predicted (×{row['predicted_over_measured']:.2f}; host {row['host_times']})"
               if row["predicted_over_measured"] else "")
            + (f" · time {row['time_note']}" if row["time_note"] else "")
            + (f" · plan modeled on the {row['plan_path']}" if str(row["plan_path"]).startswith("capture path")
               else "")
            + (f" · the graph holds {row['graph_kernels']} kernels, the modeled token {row['token_kernels']}: "
               "other work than the recording saw" if row["same_work"] is False else "")
            + (f" · argument capture {row['capture_cost']}" if row["capture_cost"] else "")
            + (f" · {row['error']}" if row["error"] else ""))


def failures(df) -> "pd.DataFrame":  # noqa: F821
    """The rows that fail validation: a verdict not naming torch's outcome, a time outside :data:`TIME_TOLERANCE`,
    a step that replays right called wrong or with a frozen finding, a wrong replay not led by its cause, a
    check_replay that disagrees."""
    bad = (~df.verdict_agrees.astype(bool)) | (df.time_agrees == False)  # noqa: E712
    for col in ("frozen_on_right",):
        if col in df:
            bad |= df[col] == True  # noqa: E712
    for col in ("cause_first", "check_agrees"):
        if col in df:
            bad |= df[col] == False  # noqa: E712
    return df[bad]


def _flag(v):
    """A yes/no column as validate.csv reads back (True, False, "True", NaN): True, False or None."""
    if v is None or (isinstance(v, float) and v != v) or v == "":
        return None
    return str(v) in ("True", "1", "1.0")


_TEXT_COLUMNS = ("frozen", "torch_outcome", "torch_detail", "audit_verdict", "capture_cost", "plan_path", "lead", "cause",
                 "check_outcome", "time_note", "host_times")
_NUMBER_COLUMNS = ("predicted_us", "replay_us", "graph_kernels", "token_kernels", "device_floor_us")


def markdown(df) -> str:
    """``validate.md``: the table a person reads (family, cache, dtype, torch, audit, frozen findings,
    predicted vs measured replay µs, the argument capture's cost per launch)."""
    head = ("| family | cache | dtype | torch.cuda.graph | audit verdict | agrees | leads with (true cause?) | "
            "frozen findings | check_replay | replay µs predicted / measured (×) | graph device µs | "
            "argument capture µs/launch (95 % CI) |")
    lines = [head, "|" + "---|" * 12]

    def num(v, fmt="{:.0f}"):
        return fmt.format(v) if v is not None and v == v else "—"

    for r in df.to_dict("records"):
        # a table read back from validate.csv has NaN where a run wrote nothing: "" for text, None for numbers
        r = {k: (("" if k in _TEXT_COLUMNS else None) if isinstance(v, float) and v != v and
                 k in _TEXT_COLUMNS + _NUMBER_COLUMNS else v) for k, v in r.items()}
        other = r.get("same_work") is False or str(r.get("same_work")) == "False"
        path = str(r.get("plan_path") or "recorded")
        agreed = _flag(r.get("time_agrees"))
        pm = (f"{r['predicted_us']:.0f} / {r['replay_us']:.0f} (×{r['predicted_over_measured']:.2f}"
              + ("" if agreed else ", outside" if agreed is False else
                 f", not held: traced host, device floor {num(r.get('device_floor_us'))}")
              + ("; host untraced" if str(r.get("host_times") or "").startswith("untraced") else "")
              + ("; capture path" if path.startswith("capture path") else "")
              + (f"; graph {r['graph_kernels']:.0f} kernels, modeled token {r['token_kernels']:.0f}" if other else "")
              + ")" if r.get("predicted_us") and r.get("replay_us") else "—")
        cost = (f"{r['capture_us_per_launch']:.2f} ({r['capture_lo']:.2f}–{r['capture_hi']:.2f})"
                if r.get("capture_us_per_launch") is not None and r.get("capture_lo") is not None else
                (r.get("capture_cost") or "—"))
        first = _flag(r.get("cause_first"))
        lead = (str(r.get("lead") or "—") + ("" if first is None else " (yes)" if first else
                                              f" (NO: {r.get('cause') or '?'})"))
        chk = str(r.get("check_outcome") or "—")
        agrees = _flag(r.get("check_agrees"))
        chk += "" if agrees is None else " (agrees)" if agrees else " (DISAGREES)"
        right = " (a step that replays right)" if _flag(r.get("frozen_on_right")) else ""
        lines.append(f"| {r['family']} | {r['cache']} | {r['dtype']} | {r['torch_outcome'] or r['torch_detail'][:60]} "
                     f"| {r['audit_verdict'] or '—'} | {'yes' if r['verdict_agrees'] else 'NO'} | {lead} | "
                     f"{r['frozen_findings']}{right}{': ' + r['frozen'] if r['frozen'] else ''} | {chk} | {pm} | "
                     f"{num(r.get('replay_device_us'))} | {cost} |")
    return "\n".join(lines) + "\n"


__all__ = ["OUTCOMES", "TIME_TOLERANCE", "against_torch", "cause_first", "failures", "markdown", "measured_replay",
           "predicted_outcome", "runs", "same_work", "saved_run", "token_kernels", "validate", "waits_per_token"]
