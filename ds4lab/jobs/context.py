"""``ds4lab context``: the stage table across context length on the long-context token (whose launches change with
the position): :func:`ds4lab.jobs.ladder.write_table` at several contexts, one round each. The exactness span starts
at ``context - 4`` so it crosses the compressors' emits and a top-k regime boundary. Next: ``docs/commands.md``,
``docs/figures.md`` ("The context ladder")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import BadInput
from ..experiments.ladder import Table, context_table, model_config
from ..experiments.stages import CONTEXT_DEFAULT, parse_stages
from ..token.config import get_preset
from .common import check_out_option, default_preset, out_folder
from .ladder import check_counts, write_table
from .result import JobResult

#: The contexts ``ds4lab context`` runs when none are given: those the preset holds
#: (:func:`default_contexts`).
DEFAULT_CONTEXTS = (1024, 4096, 16384, 65536)

#: What the context job writes in its folder.
CONTEXT_OUTPUTS = ("context.csv", "context.png", "context.svg", "context.pdf")


@dataclass
class ContextConfig:
    """Arguments of ``ds4lab context`` (its defaults): ``contexts`` ascending (None: :func:`default_contexts`),
    ``span`` compared at each (0: none), ``tokens`` after ``warmup`` in ``rounds`` rounds, ``mode``, ``out``."""

    stages: str = CONTEXT_DEFAULT
    preset: str | None = None
    contexts: list[int] | str | None = None
    span: int = 8
    tokens: int = 64
    warmup: int = 4
    mode: str = "thread_local"
    out: Path | str | None = None
    rounds: int = 1


def parse_contexts(text) -> list[int]:
    """``"1024,4096"`` (or a list of ints) → ``[1024, 4096]``.

    Raises:
        BadInput: an empty element or list, a value not an integer or below 4 (the span starts at context - 4), a
            repeated value, values not ascending."""
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
    if cfg.contexts is not None:
        parse_contexts(cfg.contexts)
    check_counts(span=cfg.span, tokens=cfg.tokens, warmup=cfg.warmup, rounds=cfg.rounds)
    if cfg.rounds > cfg.tokens:
        raise BadInput(f"--repeats {cfg.rounds}: more rounds than --tokens {cfg.tokens} (each round times at "
                       "least one token per stage)")
    check_out_option(cfg.out)


def default_contexts(cfg: ContextConfig, preset: str) -> list[int]:
    """:data:`DEFAULT_CONTEXTS` that ``preset``'s ``max_context`` holds with ``cfg``'s span, warm-up and tokens; with
    fewer than two, an eighth, a quarter and a half of ``max_context``."""
    limit = get_preset(preset, long_context=True).max_context

    def fits(c: int) -> bool:
        return table_of(replace(cfg, contexts=[c])).last_position() < limit

    got = [c for c in DEFAULT_CONTEXTS if fits(c)]
    if len(got) < 2:
        got = [c for c in (limit // 8, limit // 4, limit // 2) if c >= 4 and fits(c)]
    if not got:
        raise BadInput(f"the {preset} preset's max_context {limit} holds no context with --tokens {cfg.tokens}, "
                       f"--warmup {cfg.warmup} and --span {cfg.span}: give fewer tokens, or --contexts")
    return got


def table_of(cfg: ContextConfig) -> Table:
    """The context ladder's :class:`Table`: each context's exactness span from ``context - 4``, timing from the context
    itself in ``rounds`` interleaved rounds, the floors at each context."""
    return context_table(cfg.stages, parse_contexts(cfg.contexts), span=cfg.span, tokens=cfg.tokens,
                         warmup=cfg.warmup, rounds=cfg.rounds)


def run(cfg: ContextConfig, be, console) -> JobResult:
    """The stage table at each context on ``be`` (:func:`ds4lab.jobs.ladder.write_table`): ``context.csv``,
    ``meta.json``, the figure. Returns the :class:`~ds4lab.jobs.result.JobResult` (table and figure ``context``).

    Raises:
        BadInput: bad input (nothing ran; exit 2).
        ds4lab.jobs.ladder.NotExact: a stage not bit-identical to stage 0 at some context, after writing everything."""
    check_config(cfg)
    preset = cfg.preset or default_preset("context", be)
    if cfg.contexts is None:
        cfg = replace(cfg, contexts=default_contexts(cfg, preset))
        if list(cfg.contexts) != list(DEFAULT_CONTEXTS):
            console.print(f"[yellow]note: the {preset} preset holds contexts up to "
                          f"{get_preset(preset, long_context=True).max_context}: running contexts "
                          f"{','.join(map(str, cfg.contexts))}[/]")
    table = table_of(cfg)
    mcfg = model_config(preset, table, True, f"--contexts {max(table.contexts)} with --tokens {cfg.tokens} and "
                                             f"--warmup {cfg.warmup}")
    out, ran = out_folder(cfg.out, "context", (preset, be.name),
                          {"preset": preset, "backend": be.name, "stages": [s.name for s in table.stages],
                           "contexts": list(table.contexts), "mode": cfg.mode})
    return write_table("context", be, console, mcfg, table, out, {"span": cfg.span, "rounds": table.rounds},
                       CONTEXT_OUTPUTS, mode=cfg.mode, ran=ran)


__all__ = ["CONTEXT_OUTPUTS", "ContextConfig", "check_config", "parse_contexts", "run", "table_of"]
