"""``ds4lab notebooks``: execute the workbench notebooks headlessly, with parameters."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import CheckFailed
from .support import fail, result_folder


def register(main: click.Group) -> None:
    """Add the command to the ``ds4lab`` group."""
    main.add_command(notebooks_cmd)


@click.command("notebooks")
@click.argument("names", nargs=-1)
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Set a parameter in every notebook that has it (repeatable); VALUE is a Python "
                   "literal or plain text, e.g. --set PRESET=small --set TOKENS=50.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/notebooks"), show_default=True,
              callback=result_folder,
              help="Executed notebooks go here as NAME.ipynb; each notebook's OUT becomes OUT/NAME.")
@click.option("--dir", "folder", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the notebooks are (default: ./notebooks, else the one beside the source).")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True,
              help="Seconds one cell may run.")
@click.option("--list", "list_only", is_flag=True, help="List the notebooks and their parameters, and exit.")
def notebooks_cmd(names, assignments, out, folder, timeout, list_only) -> None:
    """Run notebooks top to bottom in a fresh Jupyter kernel each (nbclient), in order.

    NAMES are notebook names or unique prefixes (``00``, ``01_moe_timing``); none means all. A
    failing notebook keeps its outputs up to the failing cell, the others still run, and the
    exit status is 1; a cell that runs past --timeout is named (notebook, cell) and fails its
    notebook. ``OUT/runs.json`` records what ran, with which parameters, how long, and the
    figures each wrote; each kernel's own stderr goes to ``OUT/NAME.kernel.log``.

    OUT is a ds4lab result folder: locked before any kernel starts (a second run into it is
    refused up front, naming the first), written aside and swapped in when the notebooks have run
    (an earlier run's notebooks stay until then); Ctrl-C, SIGTERM and SIGHUP keep what ran
    (exit 130, 143, 129).
    """
    from ..report.notebook_runner import (NotebookError, check_value, coerce, default_folder, find_notebooks,
                                          parameter_defaults, parse_assignments, read_notebook)
    from ..report.results import OutputError, job_folder

    try:
        paths = find_notebooks(names, folder or default_folder())
        values = parse_assignments(assignments)
        params = {}
        for p in paths:
            try:
                params[p] = parameter_defaults(read_notebook(p))
            except NotebookError as e:
                raise NotebookError(e if str(e).startswith(str(p)) else f"{p}: {e}") from None
    except NotebookError as e:
        fail(str(e))
    if list_only:
        for p, defaults in params.items():
            click.echo(f"{p.stem}: " + ", ".join(f"{n}={v!r}" for n, v in defaults.items()))
        return
    if "OUT" in values:
        fail("OUT is set by --out (each notebook writes under --out/NAME); drop --set OUT=…")
    stems = [p.stem for p in paths]
    if len(set(stems)) < len(stems):
        fail(f"two notebooks named {sorted({s for s in stems if stems.count(s) > 1})[0]}: their executed "
             "copies and results would overwrite each other; run them with different --out folders")
    known = {n for names_ in params.values() for n in names_}
    stray = sorted(set(values) - known)
    if stray:
        click.echo(f"ds4lab: error: no notebook has a parameter named {', '.join(stray)} "
                   f"(they have: {', '.join(sorted(known))})", err=True)
        sys.exit(2)
    try:  # type and check every value against each notebook's default before anything runs
        typed = {p: {n: coerce(n, v, params[p][n]) for n, v in values.items() if n in params[p]}
                 for p in paths}
        for per in typed.values():
            for n, v in per.items():
                check_value(n, v)
    except NotebookError as e:
        fail(str(e))
    meta = {"job": "notebooks", "notebooks": [p.name for p in paths],
            "parameters": {p.stem: {n: repr(v) for n, v in typed[p].items()} for p in paths}, "timeout_s": timeout}
    outputs = ("*.ipynb", "runs.json", "*.kernel.log", *(p.stem for p in paths))
    try:
        # locked before any kernel starts: a second run into the same folder is refused up front
        with job_folder(out, meta, outputs, say=lambda m: click.echo(f"ds4lab: {m}", err=True)) as folder:
            runs = _run_all(paths, typed, folder, out, timeout, meta)
            failed = [r["notebook"] for r in runs if not r["ok"]]
            if failed:
                raise NotebooksFailed(f"failed: {', '.join(failed)}")
    except (OutputError, NotebookError) as e:
        fail(str(e))
    except NotebooksFailed as e:
        click.echo(f"executed notebooks in {out}/; {e}")
        sys.exit(1)
    click.echo(f"executed notebooks in {out}/")


class NotebooksFailed(CheckFailed):
    """A notebook failed (every notebook ran; the failures are in ``runs.json``): exit status 1."""


def _run_all(paths, typed, folder: Path, out: Path, timeout: int, meta: dict) -> list[dict]:
    """Run each notebook into ``folder`` (the staging folder that becomes ``out``), ``runs.json``
    after each (paths as they are once ``folder`` is ``out``, as the notebooks' own outputs name
    them: ``final_dir``); an interruption stops the run (as :class:`KeyboardInterrupt`, or
    :class:`ds4lab.errors.Terminated` for SIGTERM/SIGHUP) with what ran kept."""
    from ..errors import Terminated
    from ..report.notebook_runner import run_notebook
    from ..report.results import write_meta

    runs = []
    for k, p in enumerate(paths, 1):
        mine = typed[p]
        shown = ", ".join(f"{n}={v!r}" for n, v in mine.items()) or "defaults"
        click.echo(f"[{k}/{len(paths)}] {p.name} ({shown})")
        r = run_notebook(p, mine, folder / p.name, out_dir=folder / p.stem, final_dir=Path(out).resolve() / p.stem,
                         timeout=timeout, on_cell=lambda i, n: click.echo(f"    cell {i}/{n}"))
        s = r.summary()
        s["executed"] = str(out / p.name)
        runs.append(s)
        meta["runs"] = runs
        write_meta(folder / "runs.json", {"runs": runs})  # after each notebook: an interruption keeps it
        if r.interrupted:
            msg = (f"interrupted in {p.name} at code cell {r.failed_cell or '?'}: the notebooks after it did not run "
                   "(runs.json says so)")
            raise Terminated(r.signum, msg) if r.signum else KeyboardInterrupt(msg)
        if r.ok:
            click.echo(f"    ok in {r.seconds:.0f} s; {len(r.figures)} figures")
        else:
            click.echo(f"    FAILED at code cell {r.failed_cell if r.failed_cell else '?'} of {r.cells} in {p.name}: "
                       f"{r.error} (the outputs before it are in the executed copy, {out / p.name})", err=True)
    return runs
