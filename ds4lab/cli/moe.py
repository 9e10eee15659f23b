"""The ``ds4lab moe`` (routed-MoE profiler) and ``ds4lab exclusion`` (profiling × capture matrix) commands: options
parsed here, the work in :mod:`ds4lab.jobs.moe` and :mod:`ds4lab.jobs.exclusion`. :func:`register` adds both to the
``ds4lab`` click group."""

from __future__ import annotations

from pathlib import Path

import click

from .support import backend_option, default, invoke, preset_option
from ..capture.stream import CAPTURE_MODES
from ..jobs.exclusion import ExclusionConfig
from ..jobs.moe import MoeConfig

def _csv_list(text: str, kind=str, allowed=None) -> list:
    """``"a,b"`` → items (``all`` → every allowed value); the job checks unknown and repeated ones."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if allowed is not None and items == ["all"]:
        return list(allowed)
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated numbers expected") from None


@click.command("moe")
@backend_option("auto: cupy when a GPU is usable, else the simulated runtime (every figure MODELED).")
@preset_option("Model dimensions. Default: ds4-flash on a GPU, small on the sim.")
@click.option("--mode", "modes", default="all", show_default=True,
              help="Comma-separated profiling modes: host-timed, deferred, graph-boundary, in-graph, cupti, nvtx.")
@click.option("--tokens-per-step", "tokens", default=None,
              help="Comma-separated token counts per step: 1 decode, 2-3 MTP verification, 16..512 batches. "
                   "Default: 1,2,3,16,64,256,512, less those above the preset's max_tokens.")
@click.option("--routing", "routings", default="all", show_default=True,
              help="Comma-separated routing patterns: uniform, zipf, hash, worst.")
@click.option("--steps", type=click.IntRange(min=1), default=default(MoeConfig, "steps"), show_default=True,
              help="Reported steps per (mode, tokens, routing); a step runs every layer once.")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Unreported steps first. Default: 1 eager, 2 replayed (warm-up and capture).")
@click.option("--regime", type=click.Choice(["auto", "eager", "replayed"]), default=default(MoeConfig, "regime"),
              show_default=True,
              help="auto: graph-boundary and in-graph replayed from graphs, the others eager.")
@click.option("--capture-mode", type=click.Choice(CAPTURE_MODES), default=default(MoeConfig, "capture_mode"),
              show_default=True)
@click.option("--n-layers", type=click.IntRange(min=1), default=None, help="Build only the first N layers.")
@click.option("--fallback", is_flag=True, help="host-timed: under capture, time in-graph instead of refusing.")
@click.option("--share-tokens", type=click.IntRange(min=0), default=default(MoeConfig, "share_tokens"),
              show_default=True,
              help="Whole eager decode tokens for the MoE-share figure (0: skip).")
@click.option("--overhead/--no-overhead", default=default(MoeConfig, "overhead"), show_default=True,
              help="µs per whole token with each mode, eager and replayed (overhead.csv).")
@click.option("--sim-compute", is_flag=True,
              help="sim: compute the numbers too (slow for big batches; default: timing only).")
@click.option("--print-ds4", is_flag=True, help="Also print ds4's stderr profile lines.")
@click.option("--seed", type=int, default=default(MoeConfig, "seed"), show_default=True, help="Routing and input seed.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/moe-<preset>-<backend>.")
def moe_cmd(backend, modes, tokens, routings, **options) -> None:
    """Routed-MoE stage timing (ds4's xq/sort/gateup/midq/down/sum/total) in capture-compatible modes."""
    from ..moeprof import MODES, ROUTINGS

    cfg = MoeConfig(modes=_csv_list(modes, allowed=MODES),
                    tokens_per_step=None if tokens is None else _csv_list(tokens, kind=int),
                    routings=_csv_list(routings, allowed=ROUTINGS), **options)
    invoke("moe", cfg, backend)


@click.command("exclusion")
@backend_option("cupy: the matrix on the GPU and on the sim, compared cell by cell. sim: the sim alone.")
@preset_option("Default: ds4-flash on a GPU (its first top-k layer), small on the sim.")
@click.option("--tokens", type=click.IntRange(min=1), default=default(ExclusionConfig, "tokens"), show_default=True,
              help="Tokens per MoE call (2: the sorted-pairs path of MTP verification).")
@click.option("--overhead-calls", type=click.IntRange(min=1), default=None,
              help="MoE calls per overhead measurement (default: 100 on a GPU, 4 on the sim).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/exclusion-<preset>-<backend>.")
def exclusion_cmd(backend, preset, tokens, overhead_calls, out) -> None:
    """The MoE profiling × capture exclusion matrix, computed by running every combination."""
    invoke("exclusion", ExclusionConfig(preset=preset, tokens=tokens, overhead_calls=overhead_calls, out=out), backend)


def register(main) -> None:
    """Add ``moe`` and ``exclusion`` to the ``ds4lab`` click group ``main``."""
    main.add_command(moe_cmd, "moe")
    main.add_command(exclusion_cmd, "exclusion")
