"""``ds4lab audit``: the command line over :mod:`ds4lab.jobs.audit` (the work lives there)."""

from __future__ import annotations

from pathlib import Path

import click

from ..capture.stream import CAPTURE_MODES
from .support import result_folder


def register(main: click.Group) -> None:
    """Add ``audit`` to the ``ds4lab`` group."""
    main.add_command(audit_cmd)


@click.command("audit", context_settings={"ignore_unknown_options": True})
@click.argument("files", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--token-range", default=None, metavar="NAME",
              help="NVTX range (or a pattern with * and ?) that marks one decode token, e.g. decode_step for "
                   "torch.profiler.record_function('decode_step'). Default: an outermost NVTX range that repeats "
                   "and holds most launches, else the period of the kernel sequence.")
@click.option("--mode", "modes", multiple=True, type=click.Choice(CAPTURE_MODES),
              help="Capture mode(s) to audit (repeatable). Default: all three.")
@click.option("--calibration", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Calibration file for the plans' graph costs. Default: $DS4LAB_CALIBRATION or the shipped "
                   "H200 calibration.")
@click.option("--out", type=click.Path(path_type=Path), default=None, callback=result_folder,
              help="Result folder. Default: results/audit-<first file's name> (results/audit-run when recording).")
@click.option("--max-rows", type=click.IntRange(min=1), default=12, show_default=True,
              help="Rows per table in the terminal summary (the CSV files hold every finding).")
@click.option("--no-arguments", is_flag=True,
              help="`audit run`: do not record kernel arguments in a second pass (the replay verdict is then "
                   "'unknown from this trace').")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(("float32", "bfloat16")),
              help="`audit validate`: the dtypes to run (repeatable). Default: both.")
@click.option("--runs-from", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="`audit validate`: audit the runs a finished `audit validate` saved in DIR again, without a "
                   "GPU (the families and dtypes asked that DIR holds).")
@click.option("--steps", "steps", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="`audit validate`: the folder of step scripts to run (default: ds4lab/data/steps).")
@click.option("--no-capture-cost", is_flag=True,
              help="`audit validate`: do not measure the argument capture's cost per launch in each run.")
def audit_cmd(files, token_range, modes, calibration, out, max_rows, no_arguments, dtypes, runs_from, steps,
              no_capture_cost) -> None:
    """What CUDA-graph capture of a decode step would refuse, break or silently get wrong, and what it
    would save, from traces you already take; or `ds4lab audit run [OPTIONS] -- python PROGRAM ARGS`
    to record a program (needs a GPU and cupti-python) and audit what it recorded; or `ds4lab audit
    validate [FAMILY|CACHE...] [--dtype D] [--steps DIR] [--no-capture-cost]` to hold the audit to what torch.cuda.graph does
    with decode steps run as a user runs them (GPU, torch, cupti-python: every script of the steps folder,
    ds4lab/data/steps by default, recorded through `audit run`, its own --truth, check_replay on its
    make_step; float32 and bfloat16). `audit run` records the kernel arguments in a second, untimed pass
    (--no-arguments: not).

    \b
    FILES: PyTorch profiler / Kineto trace JSON (.json, .json.gz; with_stack=True gives file:line),
    Nsight Systems SQLite export (nsys export --type sqlite), a ds4lab recording, ds4lab's trace.json.

    \b
    Writes audit.csv (one row per finding, verdict per capture mode, rule and its source, where),
    tokens.csv, spans.csv, plans.csv (MODELED: measured trace costs + the calibration), meta.json and
    audit.png/.svg/.pdf (one token's timeline, findings marked, capturable spans shaded).

    \b
    Exit status:
      0  audited
      2  bad input: no such file, a trace the readers cannot read (the error
         names the file), no kernel in it, no repeating unit (give
         --token-range), an unknown mode, an --out that cannot be written;
         for `audit validate --runs-from`, a run folder that cannot be
         audited (names the file)
      1  the audit failed after it began, or `audit validate` found a
         verdict or a replay time that disagrees with torch.cuda.graph
         (meta.json says which)
    """
    from ..jobs.audit import AuditConfig
    from .support import invoke

    files = list(files)
    program: list = []
    if files and files[0] == "validate":  # ds4lab audit validate [FAMILY|CACHE...] [--out DIR]
        from ..jobs.audit_validate import ValidateConfig

        # a name is a family or a cache: the scripts' --list tells which (ds4lab.audit.validate.runs)
        invoke("audit-validate", ValidateConfig(engines=tuple(files[1:]), out=out, dtypes=tuple(dtypes),
                                                runs_from=runs_from, steps=steps, capture_cost=not no_capture_cost))
        return
    for opt, v in (("--runs-from", runs_from), ("--steps", steps)):
        if v is not None:
            raise click.UsageError(f"{opt} {v}: only for `ds4lab audit validate`")
    if no_capture_cost:
        raise click.UsageError("--no-capture-cost: only for `ds4lab audit validate`")
    if files and files[0] == "run":  # ds4lab audit run [OPTIONS] -- python PROGRAM ARGS
        program, files = files[1:], []
    cfg = AuditConfig(files=tuple(Path(f) for f in files), program=tuple(program), token_range=token_range,
                      modes=tuple(modes) or CAPTURE_MODES, calibration=calibration, out=out, max_rows=max_rows,
                      arguments=not no_arguments)
    invoke("audit", cfg)
