"""A measured ladder or context record as the sim is held to it: its one reader (:func:`read_record`), its preset
against today's (:func:`preset_changes`) and the agreement tolerance (:data:`TOLERANCE`); the check is
:func:`ds4lab.calibration.check.modeled_vs_measured`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..report import results

#: The aim a recalibrated sim is held to: modeled within ±10 % of measured, per stage.
TOLERANCE = 0.10


def read_record(folder) -> tuple[str, dict, pd.DataFrame]:
    """``(job, meta, table)`` of a GPU-measured ladder or context folder (``stage`` as text; an old table gets the
    start position as ``context``). Raises ValueError naming a folder that is not one, or is modeled."""
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
    """``{field: (recorded, today)}`` where the record's preset differs from today's of that name (empty: the same
    token, or no summary recorded); only an empty one makes a comparison with today's sim a check of the model."""
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
