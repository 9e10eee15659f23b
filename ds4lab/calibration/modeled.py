"""The sim's ladder and context tables for a calibration (file or dict), timing only: one
:func:`ds4lab.experiments.ladder.run_table` on a timing-only sim, for the GPU-less fits, the check against a record
and the what-ifs."""

from __future__ import annotations


def sim_context(cal, preset: str, stages: str, contexts, tokens: int, *, mode: str = "thread_local"):
    """The sim's ``context.csv`` rows for calibration ``cal`` (dict, path, or None: the default file), timing only:
    ``tokens`` timed per stage and context after 2 warm-up tokens, one round.

    Raises:
        ds4lab.errors.BadInput: a context past the preset's ``max_context``.
        ds4lab.errors.CalibrationError: an invalid calibration."""
    from ..experiments.ladder import context_table, model_config

    table = context_table(stages, sorted(int(c) for c in contexts), span=0, tokens=tokens, warmup=2, rounds=1)
    return _run(cal, model_config(preset, table, True, f"contexts up to {max(table.contexts)}"), table, mode)


def sim_ladder(cal, preset: str, stages: str, start_pos: int, tokens: int, *, mode: str = "thread_local",
               long_context: bool = False, rounds: int = 2):
    """The sim's ``ds4lab ladder`` table for calibration ``cal`` (as :func:`sim_context`): ``stages`` at ``start_pos``,
    ``tokens`` timed per stage in ``rounds`` interleaved rounds after 2 warm-up tokens."""
    from ..experiments.ladder import ladder_table, model_config

    table = ladder_table(stages, start_pos, exact_tokens=0, tokens=tokens, warmup=2, rounds=rounds,
                         long_context=long_context)
    return _run(cal, model_config(preset, table, long_context, f"--start-pos {start_pos}"), table, mode)


def _run(cal, mcfg, table, mode: str):
    from ..experiments.ladder import run_table
    from ..sim.backend import SimBackend

    be = SimBackend(timing_only=True, calibration=cal)
    return run_table(be, mcfg, table, mode=mode, check=False)
