"""A measured ladder or context record, as the sim is held to it: the one reader of such a record (:func:`read_record`,
for the host fit and the check), what its preset was against today's (:func:`preset_changes`), and the tolerance
within which a modeled stage agrees (:data:`TOLERANCE`). The check itself models the record's table on the sim:
:func:`ds4lab.calibration.check.modeled_vs_measured`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..report import results

#: The aim a recalibrated sim is held to: modeled within ±10 % of measured, per stage.
TOLERANCE = 0.10


def read_record(folder) -> tuple[str, dict, pd.DataFrame]:
    """``(job, meta, table)`` of a ladder or context folder measured on a GPU: its ``meta.json`` and ``ladder.csv`` or
    ``context.csv`` (``stage`` read as text; a table from before the ``context`` column gets the run's start
    position there).

    Raises:
        ValueError: not a ladder or context result folder, or one modeled on the sim (names it)."""
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
    """What differs between the preset a record's ``meta.json`` describes (``preset``: the summary its run wrote) and
    today's preset of that name: ``{field: (recorded, today)}`` (empty when the same token, or when the record names
    no preset summary). A preset's meaning can change (a record from before ds4's expert formats timed another
    ``ds4-flash``), so a comparison with today's sim is only a check of the model where this is empty."""
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
