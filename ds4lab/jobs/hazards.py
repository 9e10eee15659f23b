"""``ds4lab ladder --hazard``: run hazard demonstrations (:mod:`ds4lab.hazards`), print them and
write ``hazards.csv`` and ``meta.json`` as each finishes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import provenance, results
from ..config import get_preset
from ..hazards import HAZARDS, demonstrate
from .common import BadInput, default_preset

#: What the hazards job writes in its folder.
HAZARD_OUTPUTS = ("hazards.csv",)


@dataclass
class HazardsConfig:
    """Arguments of ``ds4lab ladder --hazard NAME|all``: which hazard (a name of
    :data:`ds4lab.hazards.HAZARDS` or ``all``), the preset (None: the job's default), the capture
    mode and the result folder (None: ``results/hazards-<preset>-<backend>``)."""

    hazard: str = "all"
    preset: str | None = None
    mode: str = "thread_local"
    out: Path | str | None = None


def run(cfg: HazardsConfig, be, console) -> list[dict]:
    """Demonstrate ``cfg.hazard`` (or all) on ``be`` (which must compute: not timing-only).
    Returns one dict per hazard (:func:`ds4lab.hazards.demonstrate`).

    Raises:
        BadInput: unknown hazard, or a timing-only backend (nothing to compare).
    """
    import pandas as pd

    if cfg.hazard != "all" and cfg.hazard not in HAZARDS:
        raise BadInput(f"unknown hazard {cfg.hazard!r}; choose one of: {', '.join(HAZARDS)} (or all)")
    if be.timing_only:
        raise BadInput("hazard demonstrations compare tensors: they need a backend that computes "
                       "(not the sim's timing-only mode)")
    mcfg = get_preset(cfg.preset or default_preset("hazards", be))
    out = Path(cfg.out or f"results/hazards-{mcfg.name}-{be.name}")
    names = list(HAZARDS) if cfg.hazard == "all" else [cfg.hazard]
    meta = provenance.base_meta(be)
    meta.update(job="hazards", preset=mcfg.summary(), capture_mode=cfg.mode, hazards=names)
    rows = []
    with results.job_folder(out, meta, HAZARD_OUTPUTS):
        for n in names:
            r = demonstrate(n, be, mcfg, mode=cfg.mode)
            rows.append(r)
            pd.DataFrame(rows).to_csv(out / "hazards.csv", index=False)
            console.print(f"[bold]{n}[/]: {r['outcome']} · errors {r['errors']} · exact {r['exact']}"
                          + (f" · first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
            console.print(f"   expected: {r['expected']}")
    console.print(f"wrote {out / 'hazards.csv'}")
    return rows
