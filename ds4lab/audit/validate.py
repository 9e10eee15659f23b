"""The audit held to what ``torch.cuda.graph`` actually does (``ds4lab audit validate``).

For each family, cache and dtype of :mod:`ds4lab.audit.families` (each in its own process: a timed
pass, a capture-path pass where the step asks whether the stream captures, an argument pass, the
argument capture's cost, :func:`ds4lab.audit.replay_check.check_replay`),
the recording is audited with its argument pass (:func:`ds4lab.audit.frozen.attach`)
(:func:`ds4lab.audit.analysis.analyze`, ``--token-range decode_step``, capture mode ``global``:
PyTorch's default ``capture_error_mode``) and the audit's prediction is set beside the outcome:

* **the verdict** (:func:`predicted_outcome`, :func:`ds4lab.audit.frozen.verdict`): ``refused`` when a
  call of a token is refused or invalidates the capture (PyTorch raises at the first refused call, so
  the capture fails); ``replays wrong`` when a token holds work a graph would miss (``not in graph``) or
  a launch a graph would freeze (a grid, a launch count, a kernel argument: a frozen value or address);
  ``replays right`` only when the tokens were compared argument by argument and nothing frozen feeds
  them; ``captures; replay correctness unknown from this trace`` otherwise (never agreeing). It agrees
  when it names torch's outcome (``refused``; ``captured, replays wrong``; ``captured, replays right``);
* **the time**: for a step that captured, the ``whole token`` plan's predicted µs per token (MODELED)
  against the replay's measured µs per step (CUDA events) in the loop the plan models: a loop of
  ``advance`` and replay that never waits for the device where the recorded tokens have no blocking
  call (the plan then overlaps the host and the device), one that waits for every replay where they
  have (the plan's one synchronize per token) (:func:`measured_replay`); within
  :data:`TIME_TOLERANCE` it agrees. The graph's device time alone (``replay_device_us``) is shown
  beside it. A step that asks whether the stream captures is modeled on its capture-path pass (the work
  the graph holds: :mod:`ds4lab.audit.capture_path`; ``plan_path``); the time is held for every step
  that captured. The graph's kernel nodes (``graph_kernels``, counted by
  :func:`~ds4lab.audit.replay_check.check_replay`) are set beside the modeled token's kernels
  (:func:`same_work`): evidence of what the recording saw.

The runs can be audited again without a GPU from the folder a run wrote (``ds4lab audit validate
--runs-from DIR``: :func:`saved_run`), as the shipped fixtures are.

Both checks are the issue's contract for the audit; :func:`validate` returns one row per engine and
cache and says which failed.
"""

from __future__ import annotations

from pathlib import Path

from .capture_path import modeled_kernel_counts, modeled_kernels

#: A predicted replay time agrees within this fraction of the measured one.
TIME_TOLERANCE = 0.10
#: torch.cuda.graph's outcome → the audit's verdict it corresponds to.
OUTCOMES = {"refused": "refused", "captured, replays wrong": "replays wrong",
            "captured, replays right": "replays right"}


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


def measured_replay(torch_run: dict, waits: bool) -> tuple[float | None, str]:
    """The measured replay µs per step to hold the whole-token plan to, and which loop it is: the
    loop that waits for every replay (``replay_sync_us``) when the tokens wait (``waits``), else the
    one that never waits (``replay_us``); a run timed before the two were told apart has only
    ``replay_us``, said so."""
    if waits and torch_run.get("replay_sync_us"):
        return torch_run["replay_sync_us"], "waits per step"
    if torch_run.get("replay_sync_us") is None and torch_run.get("replay_us"):
        return torch_run["replay_us"], "one timing (a run before the loops were told apart)"
    return torch_run.get("replay_us"), "never waits"


def against_torch(report, torch_run: dict) -> dict:
    """The audit of one recording set beside what ``torch.cuda.graph`` did with the same step
    (``torch_run``: :class:`~ds4lab.audit.engines.EngineRun`'s fields, as ``engine.json`` or a bundled
    recording's outcome holds them). Returns ``torch_outcome``, ``torch_detail``, ``audit_verdict`` and
    ``audit_why`` (:func:`predicted_outcome`, capture mode global), ``verdict_agrees`` (the verdict names
    torch's outcome), ``predicted_us`` (the whole-token plan, µs per token, MODELED; None without that
    plan), ``replay_us`` (torch's replay, µs per step, measured with CUDA events; None when it did not
    capture, in the loop the plan models: :func:`measured_replay`; ``measured_loop`` says which), ``replay_sync_us``
    and ``replay_device_us`` beside it, ``predicted_over_measured`` and ``time_agrees`` (within
    :data:`TIME_TOLERANCE`), None where either time is missing."""
    verdict, why = predicted_outcome(report)
    plans = report.plans.set_index("plan") if report.plans is not None and not report.plans.empty else None
    predicted = (float(plans.loc["whole token", "predicted_us"]) if plans is not None and "whole token" in plans.index
                 else None)
    replay, loop = measured_replay(torch_run, waits_per_token(report))
    out = {"torch_outcome": torch_run.get("outcome", ""), "torch_detail": torch_run.get("detail", "")
           or torch_run.get("error", ""), "audit_verdict": verdict, "audit_why": why, "predicted_us": predicted,
           "replay_us": replay, "measured_loop": loop if replay else "",
           "replay_sync_us": torch_run.get("replay_sync_us"), "replay_device_us": torch_run.get("replay_device_us"),
           "predicted_over_measured": None, "time_agrees": None}
    out["verdict_agrees"] = OUTCOMES.get(out["torch_outcome"]) == verdict != ""
    out["graph_kernels"], out["token_kernels"] = torch_run.get("graph_kernels"), token_kernels(report)
    out["same_work"] = same_work(out["graph_kernels"], out["token_kernels"], modeled_kernel_counts(report))
    cp = getattr(report, "capture_path", None)
    out["plan_path"] = cp.label if cp is not None else "recorded"
    if replay and predicted:  # held for every step that captured: a graph of other work is the plan's miss
        out["predicted_over_measured"] = predicted / replay
        out["time_agrees"] = abs(predicted / replay - 1) <= TIME_TOLERANCE
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
    """A run as :func:`ds4lab.audit.engines.run_isolated` returned it, read back from the folder it
    wrote (``<engine>-<cache>-<dtype>/``: ``engine.json``, ``recording.csv.gz`` and the argument pass
    beside it), its files named where they are now. Raises :class:`~ds4lab.errors.BadInput` naming a
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
    for key, name in (("recording", "recording.csv.gz"), ("arguments", "arguments.json.gz")):
        r[key] = str(folder / name) if (folder / name).is_file() else ""
    return r


def validate(engines, caches, out: Path, *, dtypes=("float32",), say=print, on_row=None,
             on_report=None, runs_from: Path | None = None) -> "pd.DataFrame":  # noqa: F821
    """Run, audit and compare every family (:func:`ds4lab.audit.families.pairs` of ``engines`` and
    ``caches``) in every dtype (module docstring); writes each audit report under
    ``out/<engine>-<cache>-<dtype>/audit/`` and returns the table (``validate.csv``'s rows: family, cache,
    dtype, torch's outcome, the audit's verdict and why, the frozen findings, predicted and measured replay
    µs, the argument capture's cost per launch with its interval, agreement). ``on_row(rows)`` is called
    with the rows so far after each run (to write them as they come), ``on_report(report,
    "<engine>-<cache>-<dtype>/audit")`` with each audit report (to write it there; without it, it is
    written there by :func:`ds4lab.audit.report.write`). ``runs_from``: audit the runs saved in that
    folder (:func:`saved_run`; those of the families asked that it holds, no GPU) instead of running them."""
    import pandas as pd

    from . import report as audit_report
    from .analysis import analyze
    from .arguments import store_beside
    from .capture_path import attach_beside, not_used
    from .engines import TOKEN_RANGE, run_isolated
    from .families import pairs
    from .frozen import attach
    from ..trace.sources import read_events as read

    rows = []
    for engine, cache in pairs(engines, caches):
        for dtype in dtypes:
            name = f"{engine}-{cache}-{dtype}"
            if runs_from is not None:
                if not (Path(runs_from) / name / "engine.json").is_file():
                    continue
                r = saved_run(Path(runs_from) / name)
            else:
                r = run_isolated(engine, cache, out, dtype=dtype)
            cost = r.get("overhead") or {}
            row = {"family": engine, "cache": cache, "dtype": dtype, "torch_outcome": r.get("outcome", ""),
                   "torch_detail": r.get("detail", "") or r.get("error", ""),
                   "first_position": r.get("first_position"), "eager_us": r.get("eager_us"),
                   "replay_us": r.get("replay_us"), "measured_loop": "", "replay_sync_us": r.get("replay_sync_us"),
                   "replay_device_us": r.get("replay_device_us"), "audit_verdict": "", "audit_why": "",
                   "frozen_findings": 0,
                   "frozen": "", "predicted_us": None, "predicted_over_measured": None,
                   "capture_us_per_launch": cost.get("per_launch_us"), "capture_lo": cost.get("per_launch_lo"),
                   "capture_hi": cost.get("per_launch_hi"), "capture_cost": cost.get("text", ""),
                   "verdict_agrees": False, "time_agrees": None, "graph_kernels": r.get("graph_kernels"),
                   "token_kernels": None, "same_work": None, "plan_path": "",
                   "recording": _inside(r.get("recording", ""), out),
                   "arguments": _inside(r.get("arguments", ""), out), "error": r.get("error", "")}
            if r.get("recording"):
                path = Path(r["recording"])
                table = read(path)
                table.source = f"{name}/recording.csv.gz"  # named inside the result folder (out may be staged)
                rep = analyze([table], token_range=TOKEN_RANGE)[0]
                attach_beside(rep, path, token_range=TOKEN_RANGE, recorded=table)  # the capture-path pass
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
                refused_pass = not_used(rep)  # a pass beside the recording that the plans could not use
                row["error"] = "; ".join(x for x in (row["error"], args_error, refused_pass) if x)
            say(f"{engine}/{cache}/{dtype}: torch {row['torch_outcome'] or row['torch_detail'][:80]} · audit "
                f"{row['audit_verdict'] or '-'} ({'agrees' if row['verdict_agrees'] else 'DISAGREES'})"
                + (f" · replay {row['replay_us']:.0f} µs measured ({row['measured_loop']}), {row['predicted_us']:.0f} "
                   f"predicted (×{row['predicted_over_measured']:.2f})" if row["predicted_over_measured"] else "")
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


_TEXT_COLUMNS = ("frozen", "torch_outcome", "torch_detail", "audit_verdict", "capture_cost", "plan_path")
_NUMBER_COLUMNS = ("predicted_us", "replay_us", "graph_kernels", "token_kernels")


def markdown(df) -> str:
    """``validate.md``: the table a person reads (family, cache, dtype, torch, audit, frozen findings,
    predicted vs measured replay µs, the argument capture's cost per launch)."""
    head = ("| family | cache | dtype | torch.cuda.graph | audit verdict | agrees | frozen findings | "
            "replay µs predicted / measured (×) | graph device µs | argument capture µs/launch (95 % CI) |")
    lines = [head, "|" + "---|" * 10]

    def num(v, fmt="{:.0f}"):
        return fmt.format(v) if v is not None and v == v else "—"

    for r in df.to_dict("records"):
        # a table read back from validate.csv has NaN where a run wrote nothing: "" for text, None for numbers
        r = {k: (("" if k in _TEXT_COLUMNS else None) if isinstance(v, float) and v != v and
                 k in _TEXT_COLUMNS + _NUMBER_COLUMNS else v) for k, v in r.items()}
        other = r.get("same_work") is False or str(r.get("same_work")) == "False"
        path = str(r.get("plan_path") or "recorded")
        pm = (f"{r['predicted_us']:.0f} / {r['replay_us']:.0f} (×{r['predicted_over_measured']:.2f}"
              + ('' if r.get('time_agrees') else ', outside')
              + ("; capture path" if path.startswith("capture path") else "")
              + (f"; graph {r['graph_kernels']:.0f} kernels, modeled token {r['token_kernels']:.0f}" if other else "")
              + ")" if r.get("predicted_us") and r.get("replay_us") else "—")
        cost = (f"{r['capture_us_per_launch']:.2f} ({r['capture_lo']:.2f}–{r['capture_hi']:.2f})"
                if r.get("capture_us_per_launch") is not None and r.get("capture_lo") is not None else
                (r.get("capture_cost") or "—"))
        lines.append(f"| {r['family']} | {r['cache']} | {r['dtype']} | {r['torch_outcome'] or r['torch_detail'][:60]} "
                     f"| {r['audit_verdict'] or '—'} | {'yes' if r['verdict_agrees'] else 'NO'} | "
                     f"{r['frozen_findings']}{': ' + r['frozen'] if r['frozen'] else ''} | {pm} | "
                     f"{num(r.get('replay_device_us'))} | {cost} |")
    return "\n".join(lines) + "\n"


__all__ = ["OUTCOMES", "TIME_TOLERANCE", "against_torch", "markdown", "measured_replay", "predicted_outcome",
           "same_work", "saved_run", "token_kernels", "validate", "waits_per_token"]
