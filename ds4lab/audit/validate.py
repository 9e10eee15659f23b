"""The audit held to what ``torch.cuda.graph`` actually does (``ds4lab audit validate``), on the user's path.

Each family is a script of the steps folder (:mod:`ds4lab.audit.steps`: ``ds4lab/data/steps/``, every
``*.py`` not starting with ``_``), run in each cache and dtype its ``--list`` gives: recorded exactly as
``ds4lab audit run`` records a user's script (its own NVTX range per step, its own prefill; the timed pass,
the capture-path pass, the argument pass), held to the script's own ``--truth`` (capture one step with
``torch.cuda.graph``, replay it at the next six positions against an eager twin) and to
:func:`~ds4lab.audit.replay_check.check_replay` on its ``make_step``. The recording is audited as a user's
is (:func:`ds4lab.audit.analysis.analyze` with no token range: the tokens are the step's own NVTX range;
its argument pass by :func:`ds4lab.audit.frozen.attach`; capture mode ``global``, PyTorch's default
``capture_error_mode``) and set beside the truth:

* **the verdict** (:func:`predicted_outcome`, :func:`ds4lab.audit.frozen.verdict`): ``refused`` when a
  call of a token is refused or invalidates the capture; ``replays wrong`` when a token holds work a graph
  would miss or a launch a graph would freeze (a grid, a launch count, a kernel argument with evidence
  that the step computes it); ``replays right`` only when the tokens were compared argument by argument
  and nothing frozen feeds them; ``captures; replay correctness unknown from this trace`` otherwise (never
  agreeing). It agrees when it names the truth's outcome. Beside it: a step that replays right must get
  no frozen finding at all (``frozen_on_right``), a step that replays wrong must lead with its true cause
  where the truth names one (:func:`cause_first`: the file and line, and the kernel hint), and
  check_replay's outcome must name the truth's (``check_agrees``);
* **the time**: for a step that captured, the ``whole token`` plan's predicted µs per token (MODELED)
  against the truth's measured replay (the script's own decode loop body with the step replaced by the
  replay, a loop that never waits, CUDA events), or check_replay's loop that waits for every replay where
  the recorded tokens block (:func:`measured_replay`); within :data:`TIME_TOLERANCE` it agrees. The plan's
  host is priced at the markers pass's untraced times where the recording has one
  (:func:`ds4lab.audit.plans.attach_untraced`; ``host_times``). Without one its host is traced, which only
  raises it: the untraced plan lies between the plan's device floor (``device_floor_us``: no host time) and
  the traced plan, and the time is held only where that whole range says the same (:func:`held`); where the
  measured replay falls inside it, the time is *not held* (``time_agrees`` None, ``time_note`` says why). A
  step that asks whether the stream captures is modeled on its capture-path pass
  (:mod:`ds4lab.audit.capture_path`; ``plan_path``); the graph's kernel nodes (``graph_kernels``) are set
  beside the modeled token's kernels (:func:`same_work`).

The runs can be audited again without a GPU from the folder a run wrote (``ds4lab audit validate
--runs-from DIR``: :func:`saved_run`), as the shipped fixtures are (runs recorded before the steps
folder, in-process, read the same way). :func:`failures` says which rows fail.
"""

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
    """The audit's verdict on capturing one whole token of ``report`` in ``mode``
    (:func:`ds4lab.audit.frozen.verdict`: ``refused``, ``replays wrong``, ``replays right`` only with the
    kernel arguments compared, else ``captures; replay correctness unknown from this trace``), and what
    decides it (the finding, or what is missing and the command that records it)."""
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
    """The measured replay µs per step to hold the whole-token plan to, and which loop it is: the
    loop that waits for every replay (``replay_sync_us``: check_replay's) when the tokens wait (``waits``),
    else the truth's that never waits (``replay_us``: the script's own loop body with the replay, where the
    truth says ``loop_body``; else advance + replay alone, :data:`BARE_LOOP`); a run timed before the two
    were told apart has only ``replay_us``, said so."""
    if waits and torch_run.get("replay_sync_us"):
        return torch_run["replay_sync_us"], "waits per step"
    body = torch_run.get("loop_body") or (torch_run.get("truth") or {}).get("loop_body")
    if body:
        return torch_run.get("replay_us"), "never waits; the script's loop body"
    if torch_run.get("replay_sync_us") is None and torch_run.get("replay_us"):
        return torch_run["replay_us"], "one timing (a run before the loops were told apart)"
    return torch_run.get("replay_us"), BARE_LOOP


def held(predicted: float, floor: float | None, replay: float, untraced: bool) -> tuple[bool | None, str]:
    """Whether the whole-token plan ``predicted`` (µs) meets the measured ``replay`` within
    :data:`TIME_TOLERANCE`, and why not where it cannot be told: with ``untraced`` host times the plan is
    held as it is; with traced ones the untraced plan lies somewhere between ``floor`` (the plan's device
    floor) and ``predicted``: held (True) when both meet the replay, failed (False) when neither range end
    can (both above, or both below), not held (None) when the replay falls between (only the untraced host
    times can say)."""
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
    """The audit of one recording set beside what ``torch.cuda.graph`` did with the same step
    (``torch_run``: the run's fields, as ``engine.json`` or a bundled recording's outcome holds them). Returns ``torch_outcome``, ``torch_detail``, ``audit_verdict`` and
    ``audit_why`` (:func:`predicted_outcome`, capture mode global), ``verdict_agrees`` (the verdict names
    torch's outcome), ``predicted_us`` (the whole-token plan, µs per token, MODELED; None without that
    plan), ``replay_us`` (torch's replay, µs per step, measured with CUDA events; None when it did not
    capture, in the loop the plan models: :func:`measured_replay`; ``measured_loop`` says which), ``replay_sync_us``
    and ``replay_device_us`` beside it, ``predicted_over_measured`` and ``time_agrees`` (within
    :data:`TIME_TOLERANCE`; :func:`held`), None where either time is missing or where it is not held
    (``time_note`` says why); ``host_times`` (what the plan's host is priced at: ``traced``, or the markers
    pass), ``device_floor_us`` (the plan with no host time) and ``untraced_eager_us`` (the markers pass's
    untraced eager token, median; None without the pass)."""
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
    """The kernels per token of the tokens the whole-token plan is modeled on (the capture-path pass
    where one is attached, else the recorded tokens; the median), or None without tokens
    (:func:`ds4lab.audit.capture_path.modeled_kernels`)."""
    return modeled_kernels(report)


def same_work(graph_kernels, token_kernels, counts=()) -> bool | None:
    """Whether the captured graph holds a modeled token's kernels: as many kernel nodes as the modeled
    tokens launch (``token_kernels``, their median, or any of ``counts``, the distinct counts of those
    tokens: the graph was captured at one position, and a launch list can change with the position);
    None where a count is missing. Evidence beside the time, not a reason to leave it
    unheld: a step whose Python takes another path while the stream captures (transformers'
    ``is_tracing``) captures other work than it launches eagerly, which the capture-path pass records
    (:mod:`ds4lab.trace.capture_path`); a graph that still differs from the modeled token is other work
    the recording did not see (a question asked of CUDA from C/C++, say)."""
    if graph_kernels is None or token_kernels is None or graph_kernels != graph_kernels:
        return None
    return int(graph_kernels) == int(token_kernels) or int(graph_kernels) in {int(c) for c in counts}


def _inside(path: str, out: Path) -> str:
    """``path`` as a name inside the result folder ``out`` when it lies there (``out`` may be a staging
    folder that is renamed when the run finishes: its absolute path would not survive), else as given."""
    if not path:
        return ""
    try:
        return str(Path(path).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return str(path)


def saved_run(folder: Path) -> dict:
    """A run as :func:`ds4lab.audit.steps.run_step` returned it, read back from the folder it wrote
    (``<family>-<cache>-<dtype>/``: ``engine.json``, ``recording.csv.gz`` and the argument pass beside it),
    its files named where they are now. Raises :class:`~ds4lab.errors.BadInput` naming a
    folder without ``engine.json``."""
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
    """A run's fields with check_replay's loops beside the truth's (``replay_sync_us``: the loop that waits for
    every replay; ``replay_device_us``: the graph's device time; the truth times one loop), where the run has a
    check and does not say them itself. Returns ``r``."""
    chk = r.get("check") or {}
    if chk:
        r.setdefault("replay_sync_us", chk.get("replay_sync_us"))
        r.setdefault("replay_device_us", chk.get("replay_device_us"))
    return r


def runs(engines=(), caches=(), dtypes=(), *, steps=None, runs_from: Path | None = None):
    """The runs asked for, as ``(family, cache, dtype, saved, script)``: with ``runs_from``, the saved runs
    of that folder (any ``*/engine.json``) whose family, cache and dtype match the filters (``saved()`` reads
    one back: :func:`saved_run`; ``script`` its folder); else every family script of the steps folder
    (:func:`ds4lab.audit.steps.discover`, its ``--list``: only the scripts a filter name names, where it names
    any and every name is found in them) in each of its caches and dtypes that match
    (``saved`` None; ``script`` to run with :func:`ds4lab.audit.steps.run_step`). A filter name may be a family or a cache (``engines``
    and ``caches`` are both searched: the command line cannot tell them apart before ``--list``).

    Raises:
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
    """Whether the finding a verdict leads with is the step's true cause, as its truth file states it
    (``{"file", "line", "kernel_hint"}``): the finding's place names ``file:line`` (or, with the script's
    folder ``sources`` given, a line of the same statement: a call written over several lines reaches the
    kernel from its first line, where the truth may name the line holding the host value), and its kernel
    holds the hint where one is given. None where the truth names no cause."""
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
    """``(first, last)`` line of the innermost simple statement of the Python file ``path`` holding ``line``
    (None where the file does not parse or no statement holds it)."""
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
    """Run, audit and compare every family of the steps folder (:func:`runs`: its scripts, their caches
    and dtypes matching ``engines``, ``caches`` and ``dtypes``) on the user's path (module docstring);
    writes each audit report under ``out/<family>-<cache>-<dtype>/audit/`` and returns the table
    (``validate.csv``'s rows: family, cache, dtype, torch's outcome, the audit's verdict and why, the finding
    it leads with and whether it is the true cause, the frozen findings, whether a step torch replays right
    got any, check_replay's outcome and whether it agrees, predicted and measured replay µs, the argument
    capture's cost per launch with its interval). ``on_row(rows)`` is called with the rows so far after each
    run (to write them as they come), ``on_report(report, "<family>-<cache>-<dtype>/audit")`` with each audit
    report (to write it there; without it, it is written there by :func:`ds4lab.audit.report.write`).
    ``runs_from``: audit the runs saved in that folder (:func:`saved_run`; no GPU) instead of running them;
    ``steps``: the steps folder (None: ``ds4lab/data/steps``); ``capture_cost``: measure the argument capture's
    cost per launch in each run (:func:`ds4lab.audit.steps.run_step`)."""
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
                    attach(rep, store)
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
        say(f"{engine}/{cache}/{dtype}: torch {row['torch_outcome'] or row['torch_detail'][:80]} · audit "
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
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    return pd.DataFrame(rows)


def failures(df) -> "pd.DataFrame":  # noqa: F821
    """The rows that fail validation: a verdict that does not name torch's outcome, a replay time outside
    :data:`TIME_TOLERANCE`, a step torch replays right that got "replays wrong" or a frozen finding, a
    "replays wrong" that does not lead with the true cause its truth names, a check_replay that disagrees."""
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
