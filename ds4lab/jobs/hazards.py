"""``ds4lab ladder --hazard``: run hazard demonstrations (:mod:`ds4lab.experiments.hazards`), print them and
write ``hazards.csv`` and ``meta.json`` as each finishes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..report import provenance, results
from ..token.config import get_preset
from ..experiments.hazards import HAZARDS, demonstrate
from ..experiments.longctx_hazards import LONGCTX_HAZARDS, demonstrate_longctx
from .common import BadInput, default_preset

#: Every hazard the job demonstrates: the decode token's (H200 record in docs/measurements) and the
#: long-context token's (compressed and indexed attention). ``all`` runs the first set,
#: ``all-longctx`` the second.
ALL_HAZARDS = (*HAZARDS, *LONGCTX_HAZARDS)

#: What the hazards job writes in its folder.
HAZARD_OUTPUTS = ("hazards.csv",)


@dataclass
class HazardsConfig:
    """Arguments of ``ds4lab ladder --hazard NAME|all``: which hazard (a name of
    :data:`ds4lab.experiments.hazards.HAZARDS` or ``all``), the preset (None: the job's default), the capture
    mode and the result folder (None: ``results/hazards-<preset>-<backend>``)."""

    hazard: str = "all"
    preset: str | None = None
    mode: str = "thread_local"
    out: Path | str | None = None


def run(cfg: HazardsConfig, be, console) -> list[dict]:
    """Demonstrate ``cfg.hazard`` (or all) on ``be`` (which must compute: not timing-only).
    Returns one dict per hazard (:func:`ds4lab.experiments.hazards.demonstrate`).

    Raises:
        BadInput: unknown hazard, or a timing-only backend (nothing to compare).
    """
    import pandas as pd

    if cfg.hazard not in ("all", "all-longctx") and cfg.hazard not in ALL_HAZARDS:
        raise BadInput(f"unknown hazard {cfg.hazard!r}; choose one of: {', '.join(ALL_HAZARDS)} "
                       "(or all, all-longctx)")
    if be.timing_only:
        raise BadInput("hazard demonstrations compare tensors: they need a backend that computes "
                       "(not the sim's timing-only mode)")
    mcfg = get_preset(cfg.preset or default_preset("hazards", be))
    out = Path(cfg.out or f"results/hazards-{mcfg.name}-{be.name}")
    names = {"all": list(HAZARDS), "all-longctx": list(LONGCTX_HAZARDS)}.get(cfg.hazard, [cfg.hazard])
    meta = provenance.base_meta(be)
    meta.update(job="hazards", preset=mcfg.summary(), capture_mode=cfg.mode, hazards=names)
    rows = []
    with results.job_folder(out, meta, HAZARD_OUTPUTS, say=console.print) as folder:
        for n in names:
            r = (demonstrate_longctx(n, be, mcfg, mode=cfg.mode) if n in LONGCTX_HAZARDS else
                 demonstrate(n, be, mcfg, mode=cfg.mode))
            rows.append(r)
            pd.DataFrame(rows).to_csv(folder / "hazards.csv", index=False)
            console.print(f"[bold]{n}[/]: {r['outcome']} · errors {r['errors']} · exact {r['exact']}"
                          + (f" · first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
            console.print(f"   expected: {r['expected']}")
    console.print(f"wrote {out / 'hazards.csv'}")
    return rows
