"""``ds4lab context``: the stage table across context length, on the long-context token (compressed
and indexed attention, whose launches change with the position): :func:`ds4lab.jobs.ladder.execute_table`
at several contexts, one round each.

At each context: exactness of every stage against stage 0 over ``span`` tokens from ``context - 4``
(with a context that is a multiple of 128 the span holds position ``context - 1``, where both
compressors emit, and ``context + 3``, where n_comp of a ratio-4 layer crosses ``m * top_k`` when the
context is ``4 * m * top_k``: a top-k regime boundary), then µs per token (median, IQR) over
``tokens`` tokens from the context, kernel and graph launches per token, and the graph cache's counts
so far (graphs captured, recaptures, retirements, invalidations).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput
from ..experiments.ladder import Table
from ..experiments.stages import CONTEXT_DEFAULT, parse_stages
from .common import check_out_option, default_preset
from .ladder import check_counts, execute_table, model_config
from .result import JobResult

#: What the context job writes in its folder.
CONTEXT_OUTPUTS = ("context.csv", "context.png", "context.svg", "context.pdf")


@dataclass
class ContextConfig:
    """Arguments of ``ds4lab context`` (the command line reads its defaults from here): stages,
    contexts (start positions, ascending), ``span`` (tokens compared bit for bit at each context),
    ``tokens`` timed per stage and context after ``warmup``, capture ``mode``, result folder (None:
    ``results/context-<preset>-<backend>``)."""

    stages: str = CONTEXT_DEFAULT
    preset: str | None = None
    contexts: list[int] | str = field(default_factory=lambda: [1024, 4096, 16384, 65536])
    span: int = 8
    tokens: int = 64
    warmup: int = 4
    mode: str = "thread_local"
    out: Path | str | None = None


def parse_contexts(text) -> list[int]:
    """``"1024,4096"`` (or a list of ints) → ``[1024, 4096]``.

    Raises:
        BadInput: an empty element or list, a value that is not an integer or is below 4 (the
            exactness span starts at context - 4), a repeated value, or values not in ascending order
            (a figure of µs against context is drawn in the order given).
    """
    items = [str(t).strip() for t in (text if isinstance(text, (list, tuple)) else str(text).split(","))]
    if not items or items == [""]:
        raise BadInput(f"--contexts {text!r}: no context given")
    out = []
    for t in items:
        if not t:
            raise BadInput(f"--contexts {text!r}: an empty element (two commas, or a trailing comma)")
        try:
            v = int(t)
        except ValueError:
            raise BadInput(f"--contexts: {t!r} is not an integer") from None
        if v < 4:
            raise BadInput(f"--contexts: {v} must be at least 4 (the exactness span starts at context - 4)")
        if v in out:
            raise BadInput(f"--contexts: {v} given more than once in {text!r}")
        out.append(v)
    if out != sorted(out):
        raise BadInput(f"--contexts {','.join(map(str, out))}: give the contexts in ascending order "
                       f"({','.join(map(str, sorted(out)))})")
    return out


def check_config(cfg: ContextConfig) -> None:
    """Checks that need no backend. Raises :class:`BadInput` naming the bad value."""
    parse_stages(cfg.stages, long_context=True)
    parse_contexts(cfg.contexts)
    check_counts(span=cfg.span, tokens=cfg.tokens, warmup=cfg.warmup)
    check_out_option(cfg.out)


def table_of(cfg: ContextConfig) -> Table:
    """The context ladder's :class:`Table`: each context's exactness span from ``context - 4``,
    timing from the context itself, one round, the floors at each context."""
    return Table(stages=tuple(parse_stages(cfg.stages, long_context=True)), contexts=tuple(parse_contexts(cfg.contexts)),
                 exact_tokens=cfg.span, exact_lead=4, tokens=cfg.tokens, warmup=cfg.warmup, rounds=1,
                 timing_after_exact=False, floor=True)


def run(cfg: ContextConfig, be, console) -> JobResult:
    """The stage table at each context on ``be``: one row per stage and context, written to
    ``context.csv`` after each context (the one being measured to ``context.partial.csv`` as it goes:
    :func:`ds4lab.jobs.ladder.execute_table`), with ``meta.json`` and the figure. Returns the
    :class:`~ds4lab.jobs.result.JobResult` (table and figure ``context``).

    Raises:
        BadInput: bad input (nothing ran; exit 2).
        ds4lab.jobs.ladder.NotExact: a stage not bit-identical to stage 0 at some context, after
            writing everything.
    """
    check_config(cfg)
    table = table_of(cfg)
    preset = cfg.preset or default_preset("context", be)
    mcfg = model_config(preset, table, True, f"--contexts {max(table.contexts)} with --tokens {cfg.tokens} and "
                                             f"--warmup {cfg.warmup}")
    out = Path(cfg.out or f"results/context-{preset}-{be.name}")
    return execute_table("context", be, console, mcfg, preset, table, out, {"span": cfg.span}, CONTEXT_OUTPUTS,
                         mode=cfg.mode)


__all__ = ["CONTEXT_OUTPUTS", "ContextConfig", "check_config", "parse_contexts", "run", "table_of"]
