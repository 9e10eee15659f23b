"""``ds4lab notebooks``: the workbench notebooks run headlessly, each in a fresh kernel
(:func:`ds4lab.report.notebook_runner.run_notebook`), parameters typed like each notebook's defaults, into one result
folder: executed copies, each ``OUT``, ``runs.json``, kernel logs. A failing notebook does not stop the others
(:class:`NotebooksFailed`, exit 1); a stop signal stops the run. Next: ``docs/notebooks.md``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import PartFailed
from ..progress import counted


@dataclass
class NotebooksConfig:
    """What ``ds4lab notebooks`` runs; every default lives here.

    Attributes:
        names: notebook names, sources (``.py``) or unique prefixes; empty: all.
        assignments: ``NAME=VALUE`` texts, each set in every notebook with the parameter
            (:func:`ds4lab.report.notebook_runner.coerce`).
        out: the result folder.
        folder: where the notebooks are; None: ``./notebooks``, else the one beside the source tree.
        timeout: seconds one cell may run."""

    names: tuple = ()
    assignments: tuple = ()
    out: Path | str = Path("results/notebooks")
    folder: Path | str | None = None
    timeout: int = 1800


@dataclass
class Plan:
    """The notebooks to run, in order, each with its typed parameters (what :func:`check_config` found)."""

    paths: list
    values: dict  # path -> {name: value}


class NotebooksFailed(PartFailed):
    """A notebook failed (all ran; ``runs.json`` says which): exit 1, the folder kept as ``NAME.failed-<time>``."""


def plan(cfg: NotebooksConfig) -> Plan:
    """The notebooks ``cfg`` names and their parameters, typed and checked; nothing runs.

    Raises:
        ds4lab.report.notebook_runner.NotebookError: (exit 2) a missing or unreadable notebook, an ambiguous prefix,
            two notebooks of one name, ``OUT`` assigned, an unknown parameter, a bad value, a timeout below 1 s."""
    from ..report.notebook_runner import (NotebookError, check_value, coerce, default_folder, find_notebooks,
                                          parameter_defaults, parse_assignments)

    if int(cfg.timeout) < 1:
        raise NotebookError(f"--timeout {cfg.timeout}: at least 1 s")
    paths = find_notebooks(cfg.names, Path(cfg.folder) if cfg.folder is not None else default_folder())
    values = parse_assignments(cfg.assignments)
    if "OUT" in values:
        raise NotebookError("OUT is set by --out (each notebook writes under --out/NAME); drop --set OUT=…")
    stems = [p.stem for p in paths]
    if len(set(stems)) < len(stems):
        raise NotebookError(f"two notebooks named {sorted({s for s in stems if stems.count(s) > 1})[0]}: their "
                            "executed copies and results would overwrite each other; run them with different "
                            "--out folders")
    defaults = {}
    for p in paths:
        try:
            defaults[p] = parameter_defaults(p)
        except NotebookError as e:
            raise NotebookError(e if str(e).startswith(str(p)) else f"{p}: {e}") from None
    known = {n for d in defaults.values() for n in d}
    stray = sorted(set(values) - known)
    if stray:
        raise NotebookError(f"no notebook has a parameter named {', '.join(stray)} (they have: {', '.join(sorted(known))})")
    typed = {p: {n: coerce(n, v, defaults[p][n]) for n, v in values.items() if n in defaults[p]} for p in paths}
    for per in typed.values():
        for n, v in per.items():
            check_value(n, v)
    return Plan(paths, typed)


def check_config(cfg: NotebooksConfig) -> None:
    """:func:`plan`'s checks, before any work (raises what it raises)."""
    from .common import check_out_option

    check_out_option(cfg.out)
    plan(cfg)


def run(cfg: NotebooksConfig, backend=None, console=None) -> JobResult:
    """Run the notebooks of ``cfg`` (``backend`` unused). Returns the :class:`~ds4lab.jobs.result.JobResult`
    (``runs.json``'s records as ``value``).

    Raises:
        NotebooksFailed: a notebook failed (exit 1; every notebook ran).
        KeyboardInterrupt: Ctrl-C (130), or :class:`ds4lab.errors.Terminated` for SIGTERM/SIGHUP (143, 129).
        ds4lab.report.notebook_runner.NotebookError, ds4lab.report.results.OutputError: bad input (exit 2)."""
    from ..report.results import job_folder

    p = plan(cfg)
    out = Path(cfg.out)
    say = _printer(console)
    meta = {"job": "notebooks", "notebooks": [x.name for x in p.paths],
            "parameters": {x.stem: {n: repr(v) for n, v in p.values[x].items()} for x in p.paths},
            "timeout_s": int(cfg.timeout)}
    outputs = ("*.ipynb", "runs.json", "*.kernel.log", *(x.stem for x in p.paths))
    # locked before any kernel starts: a second run into the same folder is refused up front
    with job_folder(out, meta, outputs, say=lambda m: say(f"ds4lab: {m}", err=True)) as folder:
        runs = _run_all(p, folder, out, int(cfg.timeout), meta, say)
        failed = [r["notebook"] for r in runs if not r["ok"]]
        if failed:
            raise NotebooksFailed(f"failed: {', '.join(failed)} (executed copies in {out}/)")
    say(f"executed notebooks in {out}/")
    from .result import JobResult

    return JobResult("notebooks", meta, out=out, files=[out / "runs.json"], value=runs)


def _printer(console):
    """Plain lines (no markup, no wrapping): to ``console`` when given, else to stdout/stderr."""
    import click

    def say(msg: str, err: bool = False) -> None:
        if console is None or err:
            click.echo(msg, err=err)
        else:
            console.print(msg, markup=False, highlight=False, soft_wrap=True)

    return say


def _run_all(p: Plan, folder: Path, out: Path, timeout: int, meta: dict, say) -> list[dict]:
    """Run each notebook into ``folder``, ``runs.json`` after each; a stop signal ends the run, what ran kept."""
    from ..errors import Terminated
    from ..report.notebook_runner import run_notebook
    from ..report.results import write_meta

    runs = []
    for k, path in enumerate(p.paths, 1):
        mine = p.values[path]
        shown = ", ".join(f"{n}={v!r}" for n, v in mine.items()) or "defaults"
        say(f"[{k}/{len(p.paths)}] {path.name} ({shown})")
        r = run_notebook(path, mine, folder / path.name, out_dir=folder / path.stem,
                         final_dir=Path(out).resolve() / path.stem, timeout=timeout,
                         on_cell=lambda i, n: say(f"    cell {i}/{n}"))
        s = r.summary()
        s["executed"] = str(out / path.name)
        runs.append(s)
        meta["runs"] = runs
        write_meta(folder / "runs.json", {"runs": runs})  # after each notebook: an interruption keeps it
        if r.interrupted:
            msg = (f"interrupted in {path.name} at code cell {r.failed_cell or '?'}: the notebooks after it did not "
                   "run (runs.json says so)")
            raise Terminated(r.signum, msg) if r.signum else KeyboardInterrupt(msg)
        if r.ok:
            say(f"    ok in {r.seconds:.0f} s; {counted(len(r.figures), 'figure')}")
        else:
            say(f"    FAILED at code cell {r.failed_cell if r.failed_cell else '?'} of {r.cells} in {path.name}: "
                f"{r.error} (the outputs before it are in the executed copy, {out / path.name})", err=True)
    return runs


__all__ = ["NotebooksConfig", "NotebooksFailed", "Plan", "check_config", "plan", "run"]
