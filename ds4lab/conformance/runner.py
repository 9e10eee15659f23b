"""Running the scenarios on a backend (:func:`run_scenarios`, ending any capture a scenario left open) and comparing
records across backends (:func:`compare`)."""

from __future__ import annotations

from ..capture import stream as S
from ..errors import RuntimeApiError
from .framework import SCENARIOS, Recorder, ScenarioSkipped


# ----------------------------------------------------------------------------- runner
def run_scenarios(be, names: list[str] | None = None, progress=None) -> dict[str, dict[str, str]]:
    """Run the scenarios (all, or those named) on ``be``. Returns ``{scenario: {step: outcome}}``.

    A scenario that raises an unexpected Python exception records it under ``"<exception>"`` and the run goes on; any
    capture it left open is ended."""
    out = {}
    with S.graphs_enabled():
        for sc in SCENARIOS:
            if names and sc.name not in names:
                continue
            rec = Recorder(be)
            created: list = []
            make_stream = be.new_stream

            def tracked(*a, **k):
                st = make_stream(*a, **k)
                created.append(st)
                return st

            be.new_stream = tracked  # the scenario's streams, so a capture it leaves open is ended
            try:
                sc.fn(rec)
            except ScenarioSkipped as e:  # cannot run here (fewer GPUs, a hang not asked for): not compared
                rec.obs = {"<skipped>": str(e)}
            except RuntimeApiError as e:
                rec.obs["<unhandled>"] = e.name
            except Exception as e:  # a scenario bug or a backend gap: keep going, report it
                rec.obs["<exception>"] = f"{type(e).__name__}: {e}"
            finally:
                del be.new_stream
                S.capture_set_stream(None)
                _end_left_captures(be, created, rec)
            try:
                be.synchronize()
            except RuntimeApiError:
                pass
            out[sc.name] = rec.obs
            if progress:
                progress(sc.name)
    return out


def _end_left_captures(be, streams, rec: Recorder) -> None:
    """End any capture a scenario left open on its streams; recorded as ``<left capturing>``."""
    left = []
    for st in streams:
        try:
            status = be.capture_status(st)
        except RuntimeApiError:
            continue
        if status != "none":
            left.append(status)
            try:
                be.end_capture(st)
            except RuntimeApiError:
                pass
    if left:
        rec.obs["<left capturing>"] = ",".join(left)


#: ``conformance.csv``'s ``step`` of a scenario that did not run on every backend (one row, no steps).
SKIPPED = "<skipped>"


def compare(results: dict[str, dict[str, dict[str, str]]]):
    """One tidy DataFrame: scenario, step, one column per backend, and ``agree`` (pandas' nullable boolean: empty for a
    scenario skipped on some backend, which was not compared: one row, step :data:`SKIPPED`, each backend's reason
    or ``ran``)."""
    import pandas as pd

    backends = list(results)
    rows = []
    for sc in SCENARIOS:
        if any(SKIPPED in results[b].get(sc.name, {}) for b in backends):
            # skipped on some backend (a two-GPU scenario on one GPU): one row saying so, neither agreeing
            # nor disagreeing: nothing was compared
            row = {"scenario": sc.name, "covers": sc.covers, "step": SKIPPED}
            row.update({b: results[b].get(sc.name, {}).get(SKIPPED, "ran") for b in backends})
            row["agree"] = None
            rows.append(row)
            continue
        for st in dict.fromkeys(st for b in backends for st in results[b].get(sc.name, {})):  # first seen, in order
            row = {"scenario": sc.name, "covers": sc.covers, "step": st}
            vals = [results[b].get(sc.name, {}).get(st, "—") for b in backends]
            row.update(dict(zip(backends, vals)))
            row["agree"] = len(set(vals)) == 1
            rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df["agree"] = df["agree"].astype("boolean")
    return df


def disagreeing(df):
    """The rows of :func:`compare`'s table whose backends differ (a skipped scenario's row is not one)."""
    return df[df["agree"].eq(False).fillna(False).astype(bool)]
