"""``ds4lab notebooks``: execute the workbench notebooks headlessly, with parameters."""

from __future__ import annotations

import sys
from pathlib import Path

import click

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
    exit status is 1. ``OUT/runs.json`` records what ran, with which parameters, how long, and
    the figures each wrote.
    """
    from ..report.notebook_runner import (NotebookError, check_value, coerce, default_folder, find_notebooks,
                                          parameter_defaults, parse_assignments, read_notebook, run_notebook)
    from ..report.results import write_meta as write_json
    from ..report.results import OutputError, check_out

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
        check_out(out, ("runs.json",))
    except (NotebookError, OutputError) as e:
        fail(str(e))
    runs = []
    for k, p in enumerate(paths, 1):
        mine = typed[p]
        shown = ", ".join(f"{n}={v!r}" for n, v in mine.items()) or "defaults"
        click.echo(f"[{k}/{len(paths)}] {p.name} ({shown})")
        try:
            r = run_notebook(p, mine, out / p.name, out_dir=out / p.stem, timeout=timeout,
                             on_cell=lambda i, n: click.echo(f"    cell {i}/{n}"))
        except NotebookError as e:
            click.echo(f"ds4lab: error: {e}", err=True)
            sys.exit(2)
        runs.append(r.summary())
        write_json(out / "runs.json", {"runs": runs})  # after each notebook: an interruption keeps it
        if r.interrupted:
            fail(f"interrupted in {p.name}: its outputs so far are in {r.executed}; the notebooks after "
                 "it did not run (runs.json says so)", code=130)
        if r.ok:
            click.echo(f"    ok in {r.seconds:.0f} s; {len(r.figures)} figures under {out / p.stem}")
        else:
            click.echo(f"    FAILED at code cell {r.failed_cell}: {r.error} (outputs so far in {r.executed})",
                       err=True)
    failed = [r["notebook"] for r in runs if not r["ok"]]
    click.echo(f"executed notebooks in {out}/" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed:
        sys.exit(1)
