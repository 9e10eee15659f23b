"""``ds4lab notebooks``: execute the workbench notebooks headlessly, with parameters (the job
:mod:`ds4lab.jobs.notebooks`)."""

from __future__ import annotations

from pathlib import Path

import click

from ..jobs.notebooks import NotebooksConfig
from .support import default, fail, invoke, result_folder


def register(main: click.Group) -> None:
    """Add the command to the ``ds4lab`` group."""
    main.add_command(notebooks_cmd)


@click.command("notebooks")
@click.argument("names", nargs=-1)
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Set a parameter in every notebook that has it (repeatable); VALUE is a Python "
                   "literal or plain text, e.g. --set PRESET=small --set TOKENS=50.")
@click.option("--out", type=click.Path(path_type=Path), default=default(NotebooksConfig, "out"), show_default=True,
              callback=result_folder,
              help="Executed notebooks go here as NAME.ipynb; each notebook's OUT becomes OUT/NAME.")
@click.option("--dir", "folder", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the notebooks are (default: ./notebooks, else the one beside the source).")
@click.option("--timeout", type=click.IntRange(min=1), default=default(NotebooksConfig, "timeout"), show_default=True,
              help="Seconds one cell may run.")
@click.option("--list", "list_only", is_flag=True, help="List the notebooks and their parameters, and exit.")
def notebooks_cmd(names, assignments, out, folder, timeout, list_only) -> None:
    """Run notebooks top to bottom in a fresh Jupyter kernel each (papermill), in order; none named: all of them, each
    on its default backend (BACKEND=auto: the GPU where one is usable, else the sim).

    NAMES are notebook names, their .py sources or unique prefixes (``00``, ``01_moe_timing``). A failing notebook
    keeps its outputs up to the failing cell, the others still run, and the exit status is 1; a cell that runs past
    --timeout is named (notebook, cell) and fails its notebook. ``OUT/runs.json`` records what ran, with which
    parameters, how long, and the figures each wrote; each kernel's own stderr goes to ``OUT/NAME.kernel.log``.

    OUT is a ds4lab result folder: locked before any kernel starts (a second run into it is refused up front, naming
    the first), written aside and swapped in when the notebooks have run (an earlier run's notebooks stay until then);
    Ctrl-C, SIGTERM and SIGHUP stop the running notebook (passed on to its kernel) and keep what ran (exit 130, 143,
    129)."""
    cfg = NotebooksConfig(names=tuple(names), assignments=tuple(assignments), out=out, folder=folder,
                          timeout=timeout)
    if list_only:
        _list(cfg)
        return
    invoke("notebooks", cfg, "auto")


def _list(cfg: NotebooksConfig) -> None:
    """Each notebook and its parameters with their defaults (and the parameters cell's comments)."""
    from ..report.notebook_runner import NotebookError, default_folder, find_notebooks, parameters

    try:
        paths = find_notebooks(cfg.names, Path(cfg.folder) if cfg.folder is not None else default_folder())
        params = {p: parameters(p) for p in paths}
    except NotebookError as e:
        fail(str(e))
    for p, ps in params.items():
        click.echo(f"{p.stem}: " + ", ".join(f"{n}={v['default']!r}" for n, v in ps.items()))
