"""The ``ds4lab`` command line (click). Each command's help gives its options and defaults."""

from __future__ import annotations

from pathlib import Path

import click

from ..backends import BACKENDS
from ..capture.stream import CAPTURE_MODES
from ..experiments.stages import STAGES
from ..jobs.bench import BenchConfig
from ..jobs.calibrate import CalibrateConfig
from ..jobs.context import DEFAULT_CONTEXTS, ContextConfig
from ..jobs.hazards import ALL_HAZARDS, HazardsConfig
from ..jobs.ladder import LadderConfig
from ..jobs.run import RunConfig
from ..token.config import PRESETS
from ..token.model import COUNTS_CLEAR, SCALARS, SCRATCH, TokenOptions
from .support import backend_option, closed_pipe, default, fail, given, invoke, preset_option

#: ``ds4lab run``'s token options by default (its config's).
_RUN_OPTIONS = default(RunConfig, "options")


class _Group(click.Group):
    """The ``ds4lab`` group: SIGTERM and SIGHUP stop every command as Ctrl-C does; an interruption a command does not
    report exits 130, 143 or 129 (not click's 1); a closed output exits 141 silently, as SIGPIPE would."""

    def make_context(self, *args, **kwargs):  # --help and --version print here
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            closed_pipe()

    def invoke(self, ctx):
        from ..report.results import install_stop_signals
        from .support import interrupted

        install_stop_signals()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            interrupted(e)
        except BrokenPipeError:
            closed_pipe()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ds4lab")
def main() -> None:
    """ds4lab: a profiling workbench for CUDA graph capture in ds4-shaped LLM decode paths."""


@main.command()
@backend_option("auto: cupy when a GPU is usable, else sim (the simulated runtime: every time MODELED). "
                "numpy: the CPU reference executor (no timing).", choices=BACKENDS)
@preset_option("Model dimensions. Default: small.")
@click.option("--tokens", type=click.IntRange(min=1), default=default(RunConfig, "tokens"), show_default=True,
              help="Decode tokens to time.")
@click.option("--warmup", type=click.IntRange(min=0), default=default(RunConfig, "warmup"), show_default=True,
              help="Untimed tokens first.")
@click.option("--out", type=click.Path(), default=None,
              help="Result folder, created if needed and checked writable before any work. "
                   "Default: results/run-<preset>-<backend>.")
@click.option("--start-pos", type=click.IntRange(min=0), default=default(RunConfig, "start_pos"), show_default=True,
              help="Position of the first token (the KV window is prefilled). start-pos + warmup + tokens "
                   "must stay within int32 positions.")
@click.option("--nvtx/--no-nvtx", default=default(RunConfig, "nvtx"), show_default=True,
              help="NVTX ranges (domain ds4lab); they only matter to a profiler on a GPU.")
@click.option("--vocab/--no-vocab", default=_RUN_OPTIONS.vocab, show_default=True,
              help="Final norm and vocabulary projection.")
@click.option("--counts-clear", type=click.Choice(COUNTS_CLEAR), default=_RUN_OPTIONS.counts_clear, show_default=True,
              help="Routed-MoE counts clear: sync cudaMemset on the legacy stream (ds4 today) or async. "
                   "Only the batched routed-MoE path (tokens > 1 per step) clears counts; a decode token "
                   "never takes it, so it does not change this command's tokens.")
@click.option("--scalars", type=click.Choice(SCALARS), default=_RUN_OPTIONS.scalars, show_default=True,
              help="Per-token scalars by value (ds4 today) or from a device buffer.")
@click.option("--scratch", type=click.Choice(SCRATCH), default=_RUN_OPTIONS.scratch, show_default=True,
              help="Routed-MoE scratch allocated on demand or up front. Only the batched routed-MoE path "
                   "(tokens > 1 per step) grows it; a decode token never takes it, so it does not change "
                   "this command's tokens (only the setup allocation).")
@click.option("--moe-profile/--no-moe-profile", default=_RUN_OPTIONS.moe_profile, show_default=True,
              help="Record ds4's 7 MoE profiling events (DS4_CUDA_MOE_PROFILE).")
@click.option("--per-layer-experts", is_flag=True, help="One routed-expert bank per layer (if memory allows).")
@click.option("--check/--no-check", default=default(RunConfig, "check"), show_default=True,
              help="Check the first token against the NumPy reference (GPU only: the sim and numpy "
                   "backends compute with the reference ops).")
@click.option("--timing-only/--compute", "timing_only", default=default(RunConfig, "timing_only"),
              help="sim backend only: model the timing without computing any number (seconds even for "
                   "ds4-flash), or compute with the reference ops as well. Default: timing-only, but "
                   "compute for tiny (small's numbers take minutes on the CPU).")
@click.option("--force", is_flag=True,
              help="Run anyway when a CPU backend would compute a model over 1 GiB of weights "
                   "(numpy, or sim --compute, on ds4-flash: tens of minutes, many GB of memory).")
@click.option("--seed", type=int, default=default(RunConfig, "seed"), show_default=True, help="Weight seed.")
def run(backend, seed, vocab, counts_clear, scalars, scratch, moe_profile, **options) -> None:
    """Decode N tokens eagerly: reference check, µs per token, launch census, memory, floor.

    Exit status: 0 done, 1 the run failed (results so far kept), 2 a bad argument or an unwritable --out (nothing run),
    130 interrupted (results so far kept; meta.json says how far it got)."""
    rc = RunConfig(backend=backend, seed=seed, **options,
                   options=TokenOptions(counts_clear=counts_clear, scalars=scalars, scratch=scratch,
                                        vocab=vocab, moe_profile=moe_profile))
    invoke("run", rc, backend, seed)


@main.command()
@preset_option("Model dimensions. Default: ds4-flash.", default=default(BenchConfig, "preset"))
@click.option("--out", type=click.Path(path_type=Path), default=default(BenchConfig, "out"),
              help="Write bench.json into this folder.")
@click.option("--per-op", "per_op", is_flag=True, help="Add the per-launch-site roofline of one token (CSV, figure).")
def bench(preset, out, per_op) -> None:
    """Launch-layer host cost vs bare CuPy, and routed-MoE decode bandwidth (GPU only)."""
    invoke("bench", BenchConfig(preset=preset, out=out, per_op=per_op), "cupy")


@main.command()
@backend_option()
@preset_option()
@click.option("--stages", default=default(LadderConfig, "stages"), show_default=True,
              help=f"Comma-separated stages of {', '.join(STAGES)} (3c, 3cc, 3cp, 3ccp: with --long-context).")
@click.option("--tokens", type=click.IntRange(min=1), default=default(LadderConfig, "tokens"), show_default=True,
              help="Timed tokens per stage (after warm-up).")
@click.option("--warmup", type=click.IntRange(min=0), default=default(LadderConfig, "warmup"), show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=default(LadderConfig, "rounds"), show_default=True,
              help="Rounds: the stages are timed in this many interleaved rounds (the tokens split across "
                   "them), so host noise falls on every stage alike.")
@click.option("--exact-tokens", type=click.IntRange(min=0), default=default(LadderConfig, "exact_tokens"),
              show_default=True, help="Tokens compared bit for bit with stage 0 (0: skip).")
@click.option("--mode", type=click.Choice(CAPTURE_MODES), default=default(LadderConfig, "mode"),
              show_default=True, help="Stream-capture mode (ds4's islands, stages i and i+, always capture in global "
                                      "mode, as ds4 does).")
@click.option("--hazard", type=click.Choice(ALL_HAZARDS), default=None,
              help="Demonstrate one ds4-today path inside a captured stage instead of the ladder (the same as "
                   "`ds4lab hazards NAME`); takes --backend, --preset, --mode and --out only.")
@click.option("--nvtx/--no-nvtx", default=default(LadderConfig, "nvtx"), show_default=True,
              help="NVTX ranges (domain ds4lab) on the timed model, for Nsight Systems.")
@click.option("--start-pos", type=click.IntRange(min=0), default=default(LadderConfig, "start_pos"),
              show_default=True, help="Position of the first decoded token (caches prefilled up to it): any stage "
                                      "at any context. The short token keeps only its attention window, so any "
                                      "int32 position runs; with --long-context the preset's max_context bounds it.")
@click.option("--long-context", is_flag=True,
              help="The long-context token (compressed and indexed attention); adds stage 3c to the choices.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/ladder-<preset>-<backend>[-longctx].")
@click.pass_context
def ladder(ctx, backend, preset, stages, tokens, warmup, repeats, exact_tokens, mode, hazard, nvtx, start_pos,
           long_context, out) -> None:
    """The CUDA-graph stage ladder: µs per token per stage, exactness, cache statistics, plot."""
    if hazard:
        ignored = given(ctx, "stages", "tokens", "warmup", "repeats", "exact_tokens", "nvtx", "start_pos",
                        "long_context")
        if ignored:
            fail(f"--hazard runs a hazard demonstration, which does not take "
                 f"{', '.join('--' + n.replace('_', '-') for n in ignored)}: drop them, or run the ladder without "
                 "--hazard")
        _hazards(hazard, preset, mode, out, backend)
        return
    invoke("ladder", LadderConfig(stages=stages, preset=preset, tokens=tokens, warmup=warmup,
                                  exact_tokens=exact_tokens, rounds=repeats, mode=mode, nvtx=nvtx, out=out,
                                  start_pos=start_pos, long_context=long_context), backend)


@main.command()
@click.argument("hazard", type=click.Choice(ALL_HAZARDS), default=default(HazardsConfig, "hazard"))
@backend_option("auto: cupy when a GPU is usable, else the simulated runtime (it computes: no timing-only).")
@preset_option()
@click.option("--mode", type=click.Choice(CAPTURE_MODES), default=default(HazardsConfig, "mode"),
              show_default=True, help="Stream-capture mode (a hazard under ds4's islands always captures in global "
                                      "mode).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/hazards-<hazard>-<preset>-<backend>.")
def hazards(hazard, backend, preset, mode, out) -> None:
    """One ds4-today path (or all: `all`, `all-longctx`) inside the stage it breaks: a refused capture and its eager
    fallback, or a replay that goes wrong (first differing tensor named)."""
    _hazards(hazard, preset, mode, out, backend)


def _hazards(hazard, preset, mode, out, backend) -> None:
    invoke("hazards", HazardsConfig(hazard=hazard, preset=preset, mode=mode, out=out), backend)


@main.command()
@backend_option("cupy: run on the GPU and on the sim, and compare. sim: the sim alone.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/conformance-<backend>.")
@click.option("--scenario", "names", multiple=True, help="Run only these scenarios (repeatable).")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
def conformance(backend, out, names, list_only) -> None:
    """Capture-rule scenarios on the real GPU and on the simulated runtime; every disagreement."""
    if list_only:
        from ..conformance import SCENARIOS

        for sc in SCENARIOS:
            click.echo(f"{sc.name:48s} {sc.covers}")
        return
    from ..jobs.conformance import ConformanceConfig

    invoke("conformance", ConformanceConfig(names=list(names), out=out), backend)


@main.command()
@preset_option("Model whose eager tokens and kernels are measured. Default: small.")
@click.option("--out", type=click.Path(path_type=Path), default=Path(default(CalibrateConfig, "out")),
              show_default=True)
@click.option("--moe-profile", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="No GPU needed: add fits for the tiled (tokens > 1) MoE kernels from this `ds4lab moe` "
                   "folder (measured, with in-graph uniform rows) to --base and write --out.")
@click.option("--base", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="With --moe-profile, --long-context, --from-ladder, --from-ds4 or --from-context: the calibration to extend (default: the shipped one).")
@click.option("--long-context", is_flag=True,
              help="GPU: refit the long-context token's kernels of --base (default: the shipped one) over "
                   "positions 4095, 16383 and 65535.")
@click.option("--from-ladder", "from_ladder", multiple=True,
              type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="No GPU needed: refit --base's host constants (host µs per eager launch, per kernel-node "
                   "update) from this measured `ds4lab ladder` or `context` folder (repeatable).")
@click.option("--from-ds4", "from_ds4", multiple=True,
              type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="No GPU needed: price ds4lab's launch list at ds4's own host and kernel costs from this "
                   "measured `ds4lab ds4` folder (repeatable: the kernel time factor is fitted at each folder's "
                   "recorded context and interpolated in log2(context) between them), and print the sim's stages "
                   "0 and i against ds4's islands off and on at every measured context, fitted or held out (and "
                   "3, 3cc, 3ccp MODELED); the table also goes to OUT's stem + -check.csv.")
@click.option("--from-context", "from_context", type=click.Path(path_type=Path, exists=True, file_okay=False),
              default=None,
              help="No GPU needed: refit --base's pdl_edge_us and graph_conditional_us from this measured "
                   "`ds4lab context` folder of stages 3, 3p and 3cc (the sim's paired gains of 3p and 3cc over 3 "
                   "matched to the measured ones at each context); the fit table also goes to OUT's stem + "
                   "-fit.csv.")
def calibrate(from_ladder, from_ds4, **options) -> None:
    """Measure the sim's cost-model parameters on this GPU and write a calibration file."""
    invoke("calibrate", CalibrateConfig(from_ladder=tuple(from_ladder), from_ds4=tuple(from_ds4) or None, **options),
           "cupy")


@main.command()
@backend_option()
@preset_option()
@click.option("--stages", default=default(ContextConfig, "stages"), show_default=True,
              help=f"Comma-separated stages of {', '.join(STAGES)}.")
@click.option("--contexts", default=None,
              help="Comma-separated contexts (start positions), ascending. Default: "
                   f"{','.join(map(str, DEFAULT_CONTEXTS))}, those the preset holds (tiny: 512,1024,2048).")
@click.option("--span", type=click.IntRange(min=0), default=default(ContextConfig, "span"), show_default=True,
              help="Tokens compared bit for bit with stage 0 at each context, from context - 4 (0: no exactness "
                   "check, timing only).")
@click.option("--tokens", type=click.IntRange(min=1), default=default(ContextConfig, "tokens"), show_default=True,
              help="Timed tokens per stage and context.")
@click.option("--warmup", type=click.IntRange(min=0), default=default(ContextConfig, "warmup"), show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=default(ContextConfig, "rounds"), show_default=True,
              help="Interleaved timing rounds per context (odd rounds in reverse stage order); the gains are "
                   "paired per token over them.")
@click.option("--mode", type=click.Choice(CAPTURE_MODES), default=default(ContextConfig, "mode"),
              show_default=True, help="Stream-capture mode.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Result folder. Default: results/context-<preset>-<backend>.")
def context(backend, repeats, **options) -> None:
    """The stage ladder across context length, on the long-context token: µs per token per stage and context, launches,
    graphs captured so far, exactness across emit and top-k regime boundaries."""
    invoke("context", ContextConfig(rounds=repeats, **options), backend)


@main.command()
def presets() -> None:
    """List the model presets and their dimensions."""
    import pandas as pd

    df = pd.DataFrame([p.summary() for p in PRESETS.values()]).set_index("name")
    # descriptions would make every line hundreds of characters wide: said below the table instead
    text = [c for c in df.columns if df[c].map(lambda v: isinstance(v, str) and len(v) > 24).any()]
    click.echo(df.drop(columns=text).T.to_string())
    for c in text:
        click.echo(f"\n{c}:")
        for name, v in df[c].items():
            click.echo(f"  {name}: {v}")


def _register_extensions() -> None:
    """Commands defined beside this module (each ``register(main)``)."""
    from . import audit as cli_audit, ingest as cli_ingest, moe as cli_moe, notebooks as cli_notebooks
    from . import ds4 as cli_ds4, tp as cli_tp, trace as cli_trace

    cli_ingest.register(main)
    cli_trace.register(main)
    cli_moe.register(main)
    cli_notebooks.register(main)
    cli_audit.register(main)
    cli_ds4.register(main)
    cli_tp.register(main)


_register_extensions()

if __name__ == "__main__":
    main()
