"""``ds4lab trace``: the command line over the ``trace`` job (:mod:`ds4lab.jobs.trace`, where the logic lives)."""

from __future__ import annotations

from pathlib import Path

import click

from ..jobs.trace import TraceConfig
from .support import backend_option, default, preset_option


def _token_hazards():
    """The token hazards of ``ds4lab ladder --hazard`` (what ``--hazard`` takes)."""
    from ..experiments.hazards import HAZARDS

    return {n: h for n, h in HAZARDS.items() if h.steps != "tp"}  # two-rank hazards trace no single token


def register(main: click.Group) -> None:
    """Add ``trace`` to the ``ds4lab`` group."""
    main.add_command(trace_cmd)


@click.command("trace")
@backend_option("cupy: CUPTI kernel records (needs cupti-python); sim: the modeled schedule (MODELED).")
@preset_option()
@click.option("--stages", default=None,
              help="Comma-separated stages, one trace process each. Default: 0,3; with --hazard: 0s (stage 0 with "
                   "the accessor's stream set, so that work bypassing it shows on the legacy stream).")
@click.option("--tokens", type=click.IntRange(min=1), default=default(TraceConfig, "tokens"), show_default=True,
              help="Tokens traced per stage (after warm-up).")
@click.option("--warmup", type=click.IntRange(min=1), default=default(TraceConfig, "warmup"), show_default=True,
              help="Untraced tokens per stage first (the captured stages capture their graphs there).")
@click.option("--hazard", type=click.Choice(list(_token_hazards())), default=None,
              help="Trace a ds4-today path of `ds4lab ladder --hazard` (its token options applied), for "
                   "`ds4lab audit` to find: the routed-MoE hazards trace the hazard's own 2-token MoE step.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/trace-<preset>-<backend>[-<hazard>].")
def trace_cmd(backend, **options) -> None:
    """One decode token's timeline per stage as a Chrome/Perfetto trace (trace.json).

    Kernels come from CUPTI activity records on a GPU (with graph and node ids) or from the sim's modeled schedule
    (labelled MODELED); ds4lab's NVTX ranges (token, layer, cluster, op) from its own record of push and pop times.
    Open trace.json in ui.perfetto.dev or chrome://tracing; also written: trace_kernels.csv, trace_nvtx.csv,
    trace_api.csv (each row with backend, preset and modeled), meta.json and trace.png/.svg/.pdf (the first layers of
    each stage's token, launch gaps visible).

    \b
    Exit status:
      0  trace written
      2  bad request (unknown stage), no kernel source here (no cupti-python
         on a GPU), no GPU for --backend cupy, or an --out that cannot be
         written; nothing traced
      1  a stage's traced tokens gave no kernel record (meta.json: failed)"""
    from .support import invoke
    from ..report.results import final_path

    res = invoke("trace", TraceConfig(**options), backend)
    for p in res.files:
        click.echo(f"wrote {final_path(p)}")
    if res.meta.get("modeled"):
        click.echo("every event in this trace is MODELED (the sim's cost model), not measured")
