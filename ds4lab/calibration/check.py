"""The check of a calibration against a record: the sim models the record's own ladder or context table
(:mod:`.modeled`), joined with the measured one on stage and context; a ratio within ``1 ± tolerance`` agrees
(:mod:`.record`). ``calibrate --from-ladder`` prints it; the tests hold the shipped calibration to the H200 record
this way."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .modeled import sim_context, sim_ladder
from .record import TOLERANCE, preset_changes, read_record


def modeled_vs_measured(folder, calibration=None, *, tokens: int = 16,
                        tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Model ``folder``'s measured ladder or context run on the sim and compare, stage by stage.

    Args:
        folder: a ``ds4lab ladder`` or ``ds4lab context`` result folder measured on a GPU.
        calibration: the sim's calibration (path, dict, or None: the default file).
        tokens: tokens the sim times per stage (and context).
        tolerance: the relative difference within which a stage agrees.

    Returns:
        One row per measured (context, stage): ``folder``, ``preset``, ``context``, ``stage``, ``measured_us``,
        ``modeled_us`` (median µs per token), ``ratio``, ``agrees``; ``attrs["preset_changes"]``: :func:`preset_changes`
        of the record.

    Raises:
        ValueError: not a measured ladder or context folder, or no single preset (names it).
        ds4lab.errors.CalibrationError: an invalid calibration."""
    folder = Path(folder)
    job, meta, measured = read_record(folder)
    if "preset" not in measured.columns or measured["preset"].nunique() != 1:
        raise ValueError(f"{folder / (job + '.csv')}: one preset column with one value expected")
    preset = str(measured["preset"].iloc[0])
    stages = ",".join(dict.fromkeys(measured["stage"]))
    mode = meta.get("capture_mode", "thread_local")
    if job == "ladder":
        modeled = sim_ladder(calibration, preset, stages, int(meta.get("start_pos", 1000)), tokens, mode=mode,
                             long_context=bool(meta.get("long_context", False)))
    else:
        modeled = sim_context(calibration, preset, stages, sorted({int(c) for c in measured["context"]}), tokens,
                              mode=mode)
    key = ["context", "stage"]
    both = measured[key + ["us_median"]].merge(modeled[key + ["us_median"]], on=key, suffixes=("_measured", "_modeled"))
    both = both.rename(columns={"us_median_measured": "measured_us", "us_median_modeled": "modeled_us"})
    both.insert(0, "preset", preset)
    both.insert(0, "folder", str(folder))
    both["ratio"] = both["modeled_us"] / both["measured_us"]
    both["agrees"] = (both["ratio"] - 1).abs() <= tolerance
    both.attrs["preset_changes"] = preset_changes(meta)
    return both
