"""The sim's modeled stages against a measured ladder or context record: per stage and context,
modeled µs per token over measured (``ds4lab calibrate --from-ladder`` prints it; the tests hold
the shipped calibration to the H200 record this way).

The sim reruns the record's own job on its configuration (preset, stages, start position or
contexts, capture mode, long-context token) in timing-only mode, with the calibration given, and
the two tables are joined on stage and context. A ratio inside ``1 ± tolerance`` is said to agree.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pandas as pd

from ..report import results

#: The aim a recalibrated sim is held to: modeled within ±10 % of measured, per stage.
TOLERANCE = 0.10


def read_record(folder) -> tuple[str, dict, pd.DataFrame]:
    """``(job, meta, table)`` of a ladder or context folder measured on a GPU: its ``meta.json`` and
    ``ladder.csv`` or ``context.csv`` (``stage`` read as text; a table from before the ``context``
    column gets the run's start position there).

    Raises:
        ValueError: not a ladder or context result folder, or one modeled on the sim (names it).
    """
    folder = Path(folder)
    meta = results.read_meta(folder) or {}
    job = meta.get("job")
    table = folder / f"{job}.csv"
    if job not in ("ladder", "context") or not table.is_file():
        raise ValueError(f"{folder}: not a ds4lab ladder or context folder (a meta.json of job ladder or context "
                         "beside its ladder.csv or context.csv)")
    if meta.get("modeled") or not meta.get("measured", False):
        raise ValueError(f"{folder}: modeled on the simulated runtime; a GPU record is needed")
    d = pd.read_csv(table, dtype={"stage": str})
    if "context" not in d.columns:  # a ladder from before the column: every stage at its start position
        d["context"] = int(meta.get("start_pos", 1000))
    return job, meta, d


#: Preset fields a run sets for itself (its context length), not what the token is.
_RUN_FIELDS = {"max_context", "start_pos"}


def preset_changes(meta: dict) -> dict[str, tuple]:
    """What differs between the preset a record's ``meta.json`` describes (``preset``: the summary
    its run wrote) and today's preset of that name: ``{field: (recorded, today)}`` (empty when the
    same token, or when the record names no preset summary). A preset's meaning can change (a
    record from before ds4's expert formats timed another ``ds4-flash``), so a comparison with
    today's sim is only a check of the model where this is empty."""
    from ..token.config import get_preset

    rec = meta.get("preset")
    if not isinstance(rec, dict) or "name" not in rec:
        return {}
    try:
        now = get_preset(rec["name"], long_context=bool(rec.get("long_context", False))).summary()
    except (KeyError, ValueError):
        return {"name": (rec["name"], None)}
    return {k: (rec.get(k), now.get(k)) for k in sorted(set(rec) | set(now))
            if k not in _RUN_FIELDS and rec.get(k) != now.get(k)}


def modeled_vs_measured(folder, calibration=None, *, tokens: int = 16,
                        tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Model ``folder``'s measured ladder or context run on the sim and compare, stage by stage.

    Args:
        folder: a ``ds4lab ladder`` or ``ds4lab context`` result folder measured on a GPU.
        calibration: the sim's calibration (path, dict, or None: the default file).
        tokens: tokens the sim times per stage (and context); its model has no noise to average.
        tolerance: the relative difference within which a stage agrees.

    Returns:
        One row per measured (context, stage): ``folder``, ``preset``, ``context``, ``stage``,
        ``measured_us`` and ``modeled_us`` (median µs per token), ``ratio`` (modeled / measured),
        ``agrees`` (``|ratio - 1| <= tolerance``). ``attrs["preset_changes"]``:
        :func:`preset_changes` of the record (non-empty: the sim modeled today's token, not the
        one measured).

    Raises:
        ValueError: not a measured ladder or context folder, or its table names no single preset
            (names it).
        ds4lab.errors.CalibrationError: an invalid calibration.
    """
    from rich.console import Console

    from ..jobs import module
    from ..jobs.context import ContextConfig
    from ..jobs.ladder import LadderConfig
    from ..sim.backend import SimBackend

    folder = Path(folder)
    job, meta, measured = read_record(folder)
    if "preset" not in measured.columns or measured["preset"].nunique() != 1:
        raise ValueError(f"{folder / (job + '.csv')}: one preset column with one value expected")
    preset = str(measured["preset"].iloc[0])
    stages = ",".join(dict.fromkeys(measured["stage"]))
    mode = meta.get("capture_mode", "thread_local")
    be = SimBackend(timing_only=True, calibration=calibration)
    quiet = Console(file=io.StringIO(), width=160)
    with tempfile.TemporaryDirectory(prefix="ds4lab-sim-check-") as tmp:
        out = Path(tmp) / job
        if job == "ladder":
            cfg = LadderConfig(stages=stages, preset=preset, tokens=tokens, warmup=2, exact_tokens=0, rounds=2,
                               mode=mode, out=out, start_pos=int(meta.get("start_pos", 1000)),
                               long_context=bool(meta.get("long_context", False)))
        else:
            contexts = sorted({int(c) for c in measured["context"]})
            cfg = ContextConfig(stages=stages, preset=preset, contexts=contexts, tokens=tokens, warmup=2,
                                mode=mode, out=out)
        import matplotlib.pyplot as plt

        before = set(plt.get_fignums())
        try:
            module(job).run(cfg, be, quiet)
        finally:  # the job's figure is not wanted here: close it, and only it
            for n in set(plt.get_fignums()) - before:
                plt.close(n)
        modeled = pd.read_csv(out / f"{job}.csv", dtype={"stage": str})
    key = ["context", "stage"]
    both = measured[key + ["us_median"]].merge(modeled[key + ["us_median"]], on=key, suffixes=("_measured", "_modeled"))
    both = both.rename(columns={"us_median_measured": "measured_us", "us_median_modeled": "modeled_us"})
    both.insert(0, "preset", preset)
    both.insert(0, "folder", str(folder))
    both["ratio"] = both["modeled_us"] / both["measured_us"]
    both["agrees"] = (both["ratio"] - 1).abs() <= tolerance
    both.attrs["preset_changes"] = preset_changes(meta)
    return both
