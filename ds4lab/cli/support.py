"""What every ``ds4lab`` command shares: the console, the error line and the one place where a job's exceptions become
exit codes (:func:`ds4lab.jobs.common.exit_code`)."""

from __future__ import annotations

import sys

import click

from ..jobs.common import config_default as default  # the one place a job's defaults live, shown by --help


def console():
    """The rich console every command prints through (:func:`ds4lab.progress.make_console`)."""
    from ..progress import make_console

    return make_console()


def fail(msg: str, code: int = 2) -> None:
    """Print ``ds4lab: error: <msg>`` to stderr and exit with ``code``, the status kept when stderr is a closed pipe."""
    try:
        click.echo(f"ds4lab: error: {msg}", err=True)
        sys.stderr.flush()
    except OSError:  # BrokenPipeError included: nobody reads stderr any more
        _silence_std_streams()
    sys.exit(code)


def _silence_std_streams() -> None:
    """Point stdout and stderr at /dev/null, so the exit's last flush cannot fail on a closed pipe."""
    import os

    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(null, stream.fileno())
        except (OSError, ValueError):
            pass


def closed_pipe() -> None:
    """The output was closed under a command: exit 141 as SIGPIPE would, silently."""
    import signal

    _silence_std_streams()
    sys.exit(128 + signal.SIGPIPE)


def interrupted(e: KeyboardInterrupt) -> None:
    """Report an interruption and exit with its status (130, 143, 129: :func:`ds4lab.jobs.common.exit_code`)."""
    from ..errors import interrupt_status
    from ..jobs import exit_code

    status = interrupt_status(e)
    text = str(e).strip()
    kept = getattr(e, "kept_in", None)
    if not text or text.startswith("stopped by "):
        # a job's result folder attaches where it kept the partial results (kept_in): without it the
        # run stopped before it had a folder, so nothing was written and nothing earlier was touched
        text = (f"{status}: results so far are kept in {kept}/ (meta.json status: {status})" if kept else
                f"{status} before any result was written (earlier results untouched)")
    else:
        if status != "interrupted" and status not in text:
            text = f"{status}: {text}"
        if kept and kept not in text:
            text += f"; results so far in {kept}/ (meta.json status: {status})"
    fail(text, exit_code(e))


def invoke(job: str, cfg, backend: str = "auto", seed: int = 1234):
    """Run ``job`` through :func:`ds4lab.jobs.execute`; an exception becomes one message and its exit status."""
    from ..errors import BadInput, CheckFailed, PartFailed
    from ..jobs import execute, exit_code
    from ..report.results import WriteFailed

    try:
        return execute(job, cfg, backend=backend, console=console(), seed=seed)
    except KeyboardInterrupt as e:
        interrupted(e)
    except Exception as e:  # noqa: BLE001 - the one place exceptions become exit codes
        code = exit_code(e)
        text = str(e).strip() or type(e).__name__
        if not isinstance(e, (BadInput, CheckFailed, PartFailed, WriteFailed)) and code == 1:  # not ours: say what it was
            text = f"{type(e).__name__}: {text}"
        kept = getattr(e, "kept_in", None)
        if kept and kept not in text:
            text += f" (results so far in {kept}/)"
        fail(text, code)


def given(ctx, *names: str) -> list[str]:
    """The options among ``names`` (parameter names) that the command line gave explicitly."""
    from click.core import ParameterSource

    return [n for n in names if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]


def result_folder(ctx, param, value):
    """click callback for ``--out``: refuses the current directory (click's ``--out ""``)."""
    from pathlib import Path

    if value is not None and Path(value) == Path("."):
        raise click.BadParameter(f"{str(value)!r} names the current directory, not a result folder: name a "
                                 "folder, for example results/<command>")
    return value


def backend_option(help: str = "auto: cupy when a GPU is usable, else the simulated runtime (figures MODELED).",
                   choices=("auto", "cupy", "sim"), default: str = "auto"):
    """The ``--backend`` option of a command (its choices, its default shown)."""
    return click.option("--backend", type=click.Choice(list(choices)), default=default, show_default=True, help=help)


def preset_option(help: str = "Default: ds4-flash on a GPU, small on the sim.", default=None):
    """The ``--preset`` option of a command: one of ds4lab's presets."""
    from ..token.config import PRESETS

    return click.option("--preset", type=click.Choice(list(PRESETS)), default=default, help=help)

