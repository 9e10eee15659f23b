"""The audit held to what ``torch.cuda.graph`` actually does (``ds4lab audit validate``).

For each engine and cache of :mod:`ds4lab.audit.engines` (each in its own process: records eager
decode steps, captures one step, replays it against the eager step), the recording is audited
(:func:`ds4lab.audit.analysis.analyze`, ``--token-range decode_step``, capture mode ``global``:
PyTorch's default ``capture_error_mode``) and the audit's prediction is set beside the outcome:

* **the verdict** (:func:`predicted_outcome`): ``refused`` when a call of a token is refused or
  invalidates the capture (PyTorch raises at the first refused call, so the capture fails);
  ``replays wrong`` when a token holds work a graph would miss (``not in graph``) or a launch a graph
  would freeze (``frozen``: a grid, a launch count or a by-value argument that changes between tokens);
  ``replays right`` otherwise. It agrees when it names torch's outcome (``refused``; ``captured,
  replays wrong``; ``captured, replays right``);
* **the time**: for a step that captured, the ``whole token`` plan's predicted µs per token (MODELED)
  against the replay's measured µs per step (CUDA events); within :data:`TIME_TOLERANCE` it agrees.

Both checks are the issue's contract for the audit; :func:`validate` returns one row per engine and
cache and says which failed.
"""

from __future__ import annotations

from pathlib import Path

#: A predicted replay time agrees within this fraction of the measured one.
TIME_TOLERANCE = 0.20
#: torch.cuda.graph's outcome → the audit's verdict it corresponds to.
OUTCOMES = {"refused": "refused", "captured, replays wrong": "replays wrong",
            "captured, replays right": "replays right"}


def predicted_outcome(report, mode: str = "global") -> tuple[str, str]:
    """The audit's verdict on capturing one whole token of ``report`` in ``mode`` (module docstring),
    and the finding that decides it (``"<kind> <name> (<class>) at <where>"``; "" when none does)."""
    f = report.findings
    if f is None or f.empty:
        return "replays right", ""
    col = f"verdict_{mode}"

    def first(mask):
        r = f[mask].iloc[0]
        return f"{r['kind']} {r['name'][:80]} ({r['call_class']}) at {r['where']}"

    for verdicts, outcome in ((("invalidates", "refused"), "refused"), (("not in graph", "frozen"), "replays wrong")):
        mask = f[col].isin(verdicts)
        if mask.any():
            return outcome, first(mask)
    return "replays right", ""


def validate(engines, caches, out: Path, *, say=print, on_row=None, on_report=None) -> "pd.DataFrame":  # noqa: F821
    """Run, audit and compare every engine × cache (module docstring) in folder ``out`` (each run's
    recording under ``out/<engine>-<cache>/``) and return the table (``validate.csv``'s rows).
    ``on_row(rows)`` is called with the rows so far after each engine and cache (to write them as
    they come), ``on_report(report, "<engine>-<cache>/audit")`` with each audit report (to write it
    there)."""
    import pandas as pd

    from .analysis import analyze
    from .engines import TOKEN_RANGE, run_isolated
    from ..trace.sources import read_events

    rows = []
    for engine in engines:
        for cache in caches:
            r = run_isolated(engine, cache, out)
            row = {"engine": engine, "cache": cache, "torch_outcome": r.get("outcome", ""),
                   "torch_detail": r.get("detail", "") or r.get("error", ""), "eager_us": r.get("eager_us"),
                   "replay_us": r.get("replay_us"), "audit_outcome": "", "audit_why": "", "predicted_us": None,
                   "predicted_over_measured": None, "verdict_agrees": False, "time_agrees": None,
                   "recording": r.get("recording", "")}
            if r.get("recording"):
                table = read_events(Path(r["recording"]))
                # named inside the result folder: ``out`` may be a staging copy that is renamed when done
                table.source = f"{engine}-{cache}/recording.csv.gz"
                rep = analyze([table], token_range=TOKEN_RANGE)[0]
                if on_report is not None:
                    on_report(rep, f"{engine}-{cache}/audit")
                row["audit_outcome"], row["audit_why"] = predicted_outcome(rep)
                plans = rep.plans.set_index("plan") if not rep.plans.empty else None
                if plans is not None and "whole token" in plans.index:
                    row["predicted_us"] = float(plans.loc["whole token", "predicted_us"])
            row["verdict_agrees"] = OUTCOMES.get(row["torch_outcome"]) == row["audit_outcome"] != ""
            if row["replay_us"] and row["predicted_us"]:
                ratio = row["predicted_us"] / row["replay_us"]
                row["predicted_over_measured"] = ratio
                row["time_agrees"] = abs(ratio - 1) <= TIME_TOLERANCE
            say(f"{engine}/{cache}: torch {row['torch_outcome'] or row['torch_detail'][:80]} · audit "
                f"{row['audit_outcome']} ({'agrees' if row['verdict_agrees'] else 'DISAGREES'})"
                + (f" · replay {row['replay_us']:.0f} µs measured, {row['predicted_us']:.0f} predicted "
                   f"(×{row['predicted_over_measured']:.2f})" if row["predicted_over_measured"] else ""))
            rows.append(row)
            if on_row is not None:
                on_row(rows)
    return pd.DataFrame(rows)


__all__ = ["OUTCOMES", "TIME_TOLERANCE", "predicted_outcome", "validate"]
