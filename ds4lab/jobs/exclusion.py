"""``ds4lab exclusion``: the routed-MoE profiling × capture matrix (:mod:`ds4lab.moeprof.exclusion`), computed by
running every combination, on the GPU and on the simulated runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..report import provenance
from ..token.config import get_preset
from ..moeprof.exclusion import COLUMNS, MATRIX_COLUMNS, ROWS, TOLERANCE, agreement, pivot, run_matrix
from .common import BadInput, default_preset, modeled_banner, out_folder
from .result import JobResult, result_folder

#: What the exclusion job writes in its folder.
EXCLUSION_OUTPUTS = ("exclusion.csv", "exclusion-sim.csv", "exclusion-agreement.csv", "exclusion.png",
                     "exclusion.svg", "exclusion.pdf")


@dataclass
class ExclusionConfig:
    """Arguments of ``ds4lab exclusion``: tokens per MoE call (2: MTP verification), MoE calls per overhead
    measurement (None: 100 on a GPU, 4 on the sim), ``out`` (None: the default folder)."""

    preset: str | None = None
    tokens: int = 2
    overhead_calls: int | None = None
    out: Path | str | None = None


def run(cfg: ExclusionConfig, be, console) -> JobResult:
    """The matrix on ``be`` (on a GPU also on a timing-only sim, with the agreement): its CSVs, ``meta.json``, the
    heatmap; table and figure ``exclusion``. Raises BadInput for numpy or tokens < 1."""
    import pandas as pd

    from ..report import plots
    from ..backends import can_capture, make_backend
    from ..progress import JobProgress

    if not can_capture(be):
        raise BadInput(f"the exclusion matrix needs stream capture: use cupy or sim, not {be.name}")
    if cfg.tokens < 1:
        raise BadInput(f"--tokens {cfg.tokens}: need at least 1 token per MoE call")
    preset = cfg.preset or default_preset("exclusion", be)
    mcfg = get_preset(preset)
    if cfg.tokens > mcfg.max_tokens:
        raise BadInput(f"--tokens {cfg.tokens}: the {preset} preset takes at most {mcfg.max_tokens} tokens per "
                       "MoE call (its max_tokens; `ds4lab presets`)")
    out, ran = out_folder(cfg.out, "exclusion", (preset, be.name),
                          {"preset": preset, "backend": be.name, "tokens": cfg.tokens})
    # outcomes need no numbers on the sim; its stamps come from the modeled timeline
    backends = [be] + ([make_backend("sim", timing_only=True)] if be.is_gpu else [])
    found, metas = {}, {}
    meta = provenance.base_meta(be)
    meta["job"] = "exclusion"
    with result_folder("exclusion", out, meta, EXCLUSION_OUTPUTS, say=console.print, ran=ran) as o:
        for b in backends:
            m = provenance.base_meta(b)
            m.update(job="exclusion", preset=mcfg.summary(), tokens=cfg.tokens, modeled=b.models_time,
                     rows=list(ROWS), columns=list(COLUMNS), tolerance=TOLERANCE)
            banner = modeled_banner(b)
            if banner:
                m["calibration"] = b.calibration_name
                console.print(banner)
            metas[b.name] = m
            name = "exclusion" if b is be else f"exclusion-{b.name}"
            cells: list[dict] = []

            def on_cell(c, name=name, cells=cells):  # row by row as the cells finish
                cells.append(c)
                o.table(name, pd.DataFrame(cells, columns=list(MATRIX_COLUMNS)))

            with JobProgress(console, f"{b.name}: cells", len(ROWS) * len(COLUMNS), eta=True) as prog:
                df = run_matrix(b, mcfg, tokens=cfg.tokens, overhead_calls=cfg.overhead_calls,
                                progress=prog.advance, on_cell=on_cell)
            found[b.name] = df
            console.print(f"[bold]{b.name}[/] ({preset}, {cfg.tokens} tokens):")
            console.print(pivot(df).to_string())
        meta.update({**metas[be.name], "backends": metas})
        if len(found) > 1:
            ag = agreement(found["cupy"], found["sim"])
            o.table("exclusion-agreement", ag)
            bad = ag[~ag.agree]
            meta["agreement"] = {"cells": len(ag), "agree": int(ag.agree.sum()), "disagree": len(bad)}
            console.print(f"cupy vs sim: {int(ag.agree.sum())}/{len(ag)} cells agree")
            if len(bad):
                console.print(bad[["mode", "column", "outcome_cupy", "outcome_sim"]].to_string(index=False))
        main = found[be.name]
        paths = o.figure("exclusion", plots.exclusion_figure(main, meta))
    console.print(f"wrote {o.where('exclusion.csv')}, {o.where('meta.json')}, "
                  + ", ".join(str(o.where(p.name)) for p in paths))
    return o.done()
