"""``ds4lab ladder --hazard``: run hazard demonstrations (:mod:`ds4lab.experiments.hazards`), print them and write
``hazards.csv`` and ``meta.json`` as each finishes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..capture import stream as S
from ..experiments.hazards import HAZARD_SETS, HAZARDS, demonstrate, hazard_names
from ..report import provenance
from ..token.config import get_preset
from ..tp import hazards as _tp_hazards  # noqa: F401  (registers the two-rank hazards, the set all-tp)
from .common import BadInput, check_out_option, default_preset, out_folder
from .result import JobResult, result_folder

#: Every name ``--hazard`` takes: each hazard, and the sets ``all`` (the decode token's),
#: ``all-longctx`` (the long-context token's) and ``all-tp`` (two ranks).
ALL_HAZARDS = (*HAZARDS, *HAZARD_SETS)

#: What the hazards job writes in its folder.
HAZARD_OUTPUTS = ("hazards.csv",)


@dataclass
class HazardsConfig:
    """Arguments of ``ds4lab ladder --hazard NAME|all|all-longctx``; ``out`` None: ``results/hazards-<hazard>-...``."""

    hazard: str = "all"
    preset: str | None = None
    mode: str = "thread_local"
    out: Path | str | None = None


def check_config(cfg: HazardsConfig) -> None:
    """Checks that need no backend. Raises :class:`BadInput` naming the bad value."""
    try:
        hazard_names(cfg.hazard)
    except ValueError as e:
        raise BadInput(str(e)) from None
    check_out_option(cfg.out)


def run(cfg: HazardsConfig, be, console) -> JobResult:
    """Demonstrate ``cfg.hazard`` (or a set) on ``be``, which must compute: table ``hazards``, its rows as dicts in
    ``value``. Raises BadInput for an unknown hazard or a timing-only backend."""
    import pandas as pd

    check_config(cfg)
    if be.timing_only:
        raise BadInput("hazard demonstrations compare tensors: they need a backend that computes "
                       "(not the sim's timing-only mode)")
    mcfg = get_preset(cfg.preset or default_preset("hazards", be))
    out, ran = out_folder(cfg.out, "hazards", (cfg.hazard, mcfg.name, be.name),
                          {"hazard": cfg.hazard, "preset": mcfg.name, "backend": be.name, "mode": cfg.mode})
    names = hazard_names(cfg.hazard)
    rows = []
    with S.graphs_enabled():
        meta = provenance.base_meta(be)
        meta.update(job="hazards", preset=mcfg.summary(), capture_mode=cfg.mode, hazards=names)
        with result_folder("hazards", out, meta, HAZARD_OUTPUTS, say=console.print, ran=ran) as o:
            console.print(f"[bold]ds4lab hazards[/] · {mcfg.name} · " + (
                "on the simulated runtime: what CUDA does is the sim's capture rules (each checked on the H200 "
                "by ds4lab conformance), not a GPU run" if be.name == "sim" else provenance.label(meta)))
            for n in names:
                r = demonstrate(n, be, mcfg, mode=cfg.mode)
                rows.append(r)
                o.table("hazards", pd.DataFrame(rows))
                console.print(f"[bold]{n}[/] ({r['capture_mode']} capture, stage {r['stage']}): {r['outcome']} · "
                              f"errors {r['errors']} · exact {r['exact']}"
                              + (f" · first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
                console.print(f"   expected: {r['expected']}")
    console.print(f"wrote {o.where('hazards.csv')}")
    return o.done(rows)
