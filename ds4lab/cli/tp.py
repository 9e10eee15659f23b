"""``ds4lab tp token|ladder|trace``: the command line over the tensor-parallel job (:mod:`ds4lab.jobs.tp`)."""

from __future__ import annotations

from pathlib import Path

import click

from ..jobs.tp import COMMANDS, TPConfig
from ..token.config import PRESETS
from .support import default, invoke


def register(main: click.Group) -> None:
    """Add the ``tp`` group to the ``ds4lab`` group."""
    main.add_command(tp)


@click.group("tp")
def tp() -> None:
    """Tensor parallelism (TP=2) on two simulated devices or this host's two GPUs."""


def _common(fn):
    """The options every tensor-parallel command takes."""
    for opt in reversed((
        click.option("--backend", type=click.Choice(["sim", "cupy"]), default=default(TPConfig, "backend"),
                     show_default=True, help="sim: two simulated devices (every time MODELED); cupy: two GPUs."),
        click.option("--preset", type=click.Choice(list(PRESETS)), default=default(TPConfig, "preset"),
                     help="Model dimensions. Default: small."),
        click.option("--reduce", type=click.Choice(["nccl", "peer"]), default=default(TPConfig, "reduce"),
                     show_default=True, help="NCCL all-reduce, or ds4's peer copies."),
        click.option("--start-pos", type=click.IntRange(min=0), default=default(TPConfig, "start_pos"),
                     show_default=True, help="Position of the first decoded token."),
        click.option("--long-context", is_flag=True, help="The long-context token (adds stages 3c:in, 3c:out)."),
        click.option("--out", type=click.Path(path_type=Path), default=default(TPConfig, "out"),
                     help="Result folder. Default: results/tp-<command>-<preset>-<backend>-<reduce>."),
    )):
        fn = opt(fn)
    return fn


@tp.command("token")
@_common
@click.option("--tokens", type=click.IntRange(min=1), default=COMMANDS["token"], show_default=True,
              help="Tokens compared.")
def tp_token(**kw) -> None:
    """The TP=2 token against the single-GPU token (on the sim the reduction bound is checked at every reduction; on
    GPUs the first and the largest difference, NCCL against ds4's peer copies)."""
    invoke("tp", TPConfig(command="token", **kw))


@tp.command("ladder")
@_common
@click.option("--stages", default=default(TPConfig, "stages"), help="Comma-separated TP stages. Default: "
              "0,i:in,i:out,3:in,3:out (and 3c:in,3c:out with --long-context).")
@click.option("--exact-tokens", type=click.IntRange(min=0), default=default(TPConfig, "exact_tokens"),
              show_default=True, help="Tokens compared bit for bit with TP stage 0.")
@click.option("--tokens", type=click.IntRange(min=1), default=COMMANDS["ladder"], show_default=True,
              help="Timed tokens per stage.")
@click.option("--rounds", type=click.IntRange(min=1), default=default(TPConfig, "rounds"), show_default=True,
              help="Interleaved timing rounds.")
def tp_ladder(**kw) -> None:
    """The tensor-parallel stages per rank: exactness, µs per token, the collective inside a graph or between."""
    invoke("tp", TPConfig(command="ladder", **kw))


@tp.command("trace")
@_common
@click.option("--stage", default=default(TPConfig, "stage"), show_default=True, help="The TP stage recorded.")
@click.option("--tokens", type=click.IntRange(min=1), default=COMMANDS["trace"], show_default=True,
              help="Tokens recorded.")
def tp_trace(**kw) -> None:
    """The TP token recorded per device as one trace for ``ds4lab audit``, its collectives paired by rank and the
    per-rank capture plan."""
    invoke("tp", TPConfig(command="trace", **kw))
