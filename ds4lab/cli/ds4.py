"""The ``ds4lab ds4`` command: ds4 itself, built from a checkout and run on a synthetic Flash-shaped model. Options
parsed here; the work in :mod:`ds4lab.jobs.ds4`. :func:`register` adds it to the ``ds4lab`` click group."""

from __future__ import annotations

import click

from ..ds4.configs import DEFAULT_CONFIGS, VARIANTS
from ..jobs.ds4 import DEFAULT_CONTEXTS, Ds4JobConfig
from .support import invoke


def _ints(text: str, option: str) -> tuple:
    items = [t.strip() for t in str(text).split(",")] if str(text).strip() else []
    if any(not t for t in items):
        raise click.BadParameter(f"{text!r}: an empty element (two commas, or a trailing comma)", param_hint=option)
    try:
        return tuple(int(t) for t in items)
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated integers expected", param_hint=option) from None


@click.command("ds4")
@click.option("--source", type=click.Path(), required=True,
              help="A ds4 checkout: a folder or a .tar.gz (e.g. ../shared/ds4/ds4-b0309611.tar.gz). Copied into "
                   "the build cache, never written to.")
@click.option("--model", type=click.Path(), default=None,
              help="A GGUF for ds4 to run. Default: ds4lab's synthetic Flash-shaped model, written once into the "
                   "cache (docs/model.md, 'The synthetic model ds4 opens').")
@click.option("--configs", default=None,
              help=f"Comma-separated configurations: {', '.join(VARIANTS)}. Default: {','.join(DEFAULT_CONFIGS)}, "
                   "or with --stages none beyond them.")
@click.option("--stages", default=None,
              help="Rungs of ds4's own capture ladder, run on ds4 rewritten by ds4lab (stage 0 in ds4) beside ds4 as "
                   "it ships: 0 (accessor unset), i (ds4's islands), 3u (the whole token captured, its graph updated "
                   "per token), 3 (a dry pass of ds4's token, the graph of its signature replayed, the changing "
                   "arguments read from device memory; a build of its own). Every stage's logits are compared with "
                   "ds4 as it ships (exact.csv, ladder.csv).")
@click.option("--host-march", default="native", show_default=True,
              help="-march of ds4's host code (ds4's own: native; x86-64-v3 for a build carried to another machine).")
@click.option("--no-build", is_flag=True, default=False,
              help="Never run ds4's make: use the builds in --cache (carried from another machine) or stop, naming them.")
@click.option("--audit/--no-audit", default=True, show_default=True,
              help="ds4lab audit of each recording in the job (--no-audit: later, with ds4lab audit, on any machine).")
@click.option("--keep-logits", is_flag=True, default=False,
              help="Keep every timed token's logits (worker-*/logits-*.npy, 0.5 MB a token) after exact.csv.")
@click.option("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)), show_default=True,
              help="Positions of the timed decode tokens, ascending.")
@click.option("--tokens", type=click.IntRange(min=2), default=32, show_default=True,
              help="Decode tokens timed per configuration and context (CUDA events on the legacy stream).")
@click.option("--warmup", type=click.IntRange(min=0), default=4, show_default=True,
              help="Untimed decode tokens first at each context (ds4's islands capture at their second sight).")
@click.option("--trace-contexts", default="1024", show_default=True,
              help="Contexts at which tokens are recorded with CUPTI (islands off and on); '' for none.")
@click.option("--trace-tokens", type=click.IntRange(min=0), default=4, show_default=True,
              help="Tokens recorded at each trace context.")
@click.option("--arch", default=None, help="CUDA architecture to build for (default: the GPU's, e.g. sm_90).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="make -j for ds4's build (default: CPU count).")
@click.option("--copy-model/--no-copy-model", default=True, show_default=True,
              help="DS4_CUDA_COPY_MODEL=1: ds4 copies the model into GPU memory at load.")
@click.option("--random-expert-layers", default="21", show_default=True,
              help="Layers of the synthetic model whose routed experts hold random blocks instead of holes "
                   "(about 1.8 GB each; '' for none): expert-data.csv says whether ds4's kernels run faster on zeros.")
@click.option("--cache", type=click.Path(), default=None,
              help="Build and model cache (default: $DS4LAB_CACHE or ~/.cache/ds4lab).")
@click.option("--seed", type=int, default=0, show_default=True, help="Synthetic weights and the prompt's tokens.")
@click.option("--out", type=click.Path(), default=None, help="Result folder. Default: results/ds4-<commit> (e.g. results/ds4-b0309611).")
def ds4(trace_contexts, random_expert_layers, **options) -> None:
    """ds4 itself on this GPU: build it from --source, run its decode token on a synthetic Flash-shaped model at each
    context with its decode islands off and on (and with its MoE profile), and write ds4lab's tables (µs per token,
    host µs, launches, kernels, island captures)."""
    cfg = Ds4JobConfig(trace_contexts=_ints(trace_contexts, "--trace-contexts"),
                       random_expert_layers=_ints(random_expert_layers, "--random-expert-layers"), **options)
    invoke("ds4", cfg, "auto")


def register(main) -> None:
    """Add ``ds4`` to the ``ds4lab`` group."""
    main.add_command(ds4)
