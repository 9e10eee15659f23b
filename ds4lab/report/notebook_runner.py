"""Run the workbench notebooks headlessly with other parameters, through nbclient.

Each notebook has one code cell tagged ``parameters`` holding plain assignments (``NAME = value``).
:func:`set_parameters` rewrites the named assignments in that cell; :func:`run_notebook` executes
the notebook top to bottom in a fresh Jupyter kernel and writes the executed copy (with its
outputs) beside the results. The committed notebooks stay without outputs; executed copies go to
the output folder, never back into ``notebooks/``.
"""

from __future__ import annotations

import ast
import datetime as _dt
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

PARAMETERS_TAG = "parameters"


class NotebookError(ValueError):
    """A notebook, a parameter name or a parameter value that cannot be used (the message names it)."""


def parse_assignments(items) -> dict:
    """``["PRESET=small", "TOKENS=8"]`` → ``{"PRESET": "small", "TOKENS": "8"}`` (text, typed later
    by :func:`coerce` against each notebook's own default).

    Raises :class:`NotebookError` naming an item without ``=`` or with a name that is not an
    identifier.
    """
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise NotebookError(f"parameter {item!r} is not NAME=VALUE")
        out[name] = value.strip()
    return out


_NOT_A_LITERAL = object()


def coerce(name: str, text: str, default):
    """The command line's ``text`` for parameter ``name``, typed like the notebook's default.

    A string default takes the text as it is (``STAGES=0,1,3`` stays ``"0,1,3"``); a ``None``
    default takes a literal if the text is one (``None``, ``8``), else the text; a bool takes
    true/false/1/0; numbers and lists take a Python literal of a matching type.
    Raises :class:`NotebookError` naming the parameter, the text and the type expected.
    """
    def literal():
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return _NOT_A_LITERAL

    if isinstance(default, str):
        v = literal()
        return v if isinstance(v, str) else text
    if default is None or default is _NOT_A_LITERAL:
        v = literal()
        return text if v is _NOT_A_LITERAL else v
    if isinstance(default, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise NotebookError(f"parameter {name}={text!r}: true or false expected")
    v = literal()
    kinds = {int: (int,), float: (int, float), list: (list, tuple), tuple: (list, tuple), dict: (dict,)}
    want = kinds.get(type(default), (type(default),))
    if v is _NOT_A_LITERAL or isinstance(v, bool) or not isinstance(v, want):
        raise NotebookError(f"parameter {name}={text!r}: {_article(type(default).__name__)} {type(default).__name__} expected "
                            f"(its default is {default!r})")
    return type(default)(v) if isinstance(default, (float, list)) else v


def parameters_cell(nb):
    """The notebook's one code cell tagged ``parameters``.

    Raises :class:`NotebookError` when there is none or more than one."""
    cells = [c for c in nb.cells
             if c.cell_type == "code" and PARAMETERS_TAG in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise NotebookError(f"expected one code cell tagged {PARAMETERS_TAG!r}, found {len(cells)}")
    return cells[0]


def parameter_defaults(nb) -> dict:
    """Name → value of each top-level assignment in the parameters cell, in order (a value that is
    not a plain literal maps to an opaque marker)."""
    try:
        tree = ast.parse(parameters_cell(nb).source)
    except SyntaxError as e:
        raise NotebookError(f"the parameters cell does not parse: {e}") from None
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = _NOT_A_LITERAL
    return out


def parameter_names(nb) -> list[str]:
    """Names assigned at top level in the parameters cell, in order."""
    return list(parameter_defaults(nb))


def set_parameters(nb, values: dict) -> dict:
    """Rewrite the parameters cell's assignments for the names in ``values`` (in place).

    Only names the cell already assigns are replaced; the others are returned (name → value) so
    that a caller running several notebooks can tell a misspelt name from one that belongs to
    another notebook. Each value is written as its ``repr`` (it must round-trip as a literal).
    Comments on untouched lines are kept.
    """
    cell = parameters_cell(nb)
    tree = ast.parse(cell.source)
    lines = cell.source.splitlines()
    unused = dict(values)
    # Replace from the bottom so earlier line numbers stay valid.
    for node in sorted(tree.body, key=lambda n: n.lineno, reverse=True):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or target.id not in values:
            continue
        value = values[target.id]
        literal = repr(value)
        try:
            if ast.literal_eval(literal) != value:
                raise ValueError
        except (ValueError, SyntaxError):
            raise NotebookError(f"parameter {target.id}={value!r} is not a plain Python literal") from None
        lines[node.lineno - 1:node.end_lineno] = [f"{target.id} = {literal}  # set by ds4lab notebooks"]
        unused.pop(target.id, None)
    cell.source = "\n".join(lines)
    return unused


@dataclass
class NotebookRun:
    """The outcome of one notebook: ``ok``, the executed copy, wall seconds (host clock, the
    kernel's start included), and for a failure the cell that failed and its error."""

    name: str
    executed: Path
    ok: bool
    seconds: float
    cells: int
    parameters: dict = field(default_factory=dict)
    failed_cell: int | None = None
    error: str | None = None
    figures: list[str] = field(default_factory=list)
    interrupted: bool = False
    #: the signal that stopped it (SIGTERM, SIGHUP: :class:`ds4lab.errors.Terminated`), None for Ctrl-C
    signum: int | None = None
    #: the cell that ran past ``timeout`` (1-based among the code cells), None otherwise
    timed_out_cell: int | None = None

    def summary(self) -> dict:
        """The run as one JSON-ready record of ``runs.json``."""
        return {"notebook": self.name, "ok": self.ok, "seconds": round(self.seconds, 1),
                "cells": self.cells, "parameters": self.parameters, "executed": str(self.executed),
                "failed_cell": self.failed_cell, "error": self.error, "figures": self.figures,
                "interrupted": self.interrupted, "timed_out_cell": self.timed_out_cell}


def _client_modules():
    try:
        import nbclient
        import nbformat
    except ImportError as e:
        raise NotebookError(f"running notebooks needs nbclient and ipykernel ({e.name} is missing): "
                            "pip install 'ds4lab[notebooks]'") from None
    return nbclient, nbformat


def run_notebook(path: Path, values: dict, executed: Path, *, out_dir: Path | None = None,
                 final_dir: Path | None = None, timeout: int = 1800, kernel_name: str = "python3",
                 on_cell: Callable[[int, int], None] | None = None) -> NotebookRun:
    """Execute one notebook top to bottom with ``values`` set in its parameters cell.

    ``out_dir``, when given, becomes the notebook's ``OUT`` parameter (as an absolute path).
    ``final_dir``: where ``out_dir`` will be once the folder holding it is swapped in (``ds4lab
    notebooks`` runs every notebook inside its staging folder); the kernel gets it in its
    environment (:func:`ds4lab.report.results.staged_env`), so the jobs' lines that say where their
    results are name it, not ``out_dir``, and the executed copy's ``OUT`` is set to it afterwards.
    The executed notebook, outputs included, is written to ``executed`` whether it succeeds or
    not (a failure keeps every output computed before it). ``timeout`` is seconds per cell.
    ``on_cell(index, count)`` is called before each code cell runs (progress). A cell that runs
    past ``timeout`` is reported as that cell (``failed_cell`` and ``timed_out_cell``, ``error``:
    "timed out after T s"), the kernel shut down, the cells before it kept. The kernel's own stderr
    (its start-up warnings, what it prints when it is shut down mid-cell) goes to
    ``<executed>.kernel.log`` beside the executed copy, never to the console.

    Raises :class:`NotebookError` for a notebook without one parameters cell, a parameter it does
    not have, or missing nbclient/ipykernel; a failing cell is reported in the result, not raised.
    """
    nbclient, nbformat = _client_modules()
    path = Path(path)
    nb = read_notebook(path)
    values = dict(values)
    env = dict(os.environ)  # the kernel's
    if out_dir is not None:
        if "OUT" not in parameter_names(nb):
            raise NotebookError(f"{path.name}: its parameters cell has no OUT")
        values["OUT"] = str(Path(out_dir).resolve())
        if final_dir is not None:
            from .results import staged_env

            env.update(staged_env(Path(values["OUT"]), Path(final_dir).resolve()))
    unused = set_parameters(nb, values)
    if unused:
        raise NotebookError(f"{path.name}: no parameter named {', '.join(sorted(unused))} "
                            f"(it has {', '.join(parameter_names(nb))})")
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.metadata.setdefault("ds4lab", {})["executed"] = {
        "parameters": values, "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    current = [None]  # the code cell running now (1-based), for a timeout's message

    def cell_start(cell, cell_index, **_):
        if cell_index in code_cells:
            current[0] = code_cells.index(cell_index) + 1
            if on_cell is not None:
                on_cell(current[0], len(code_cells))

    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(Path.cwd())}},
                                     on_cell_start=cell_start)
    executed = Path(executed)
    executed.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()  # host clock around host work: kernel start and cells, end to end
    started = time.time()  # wall clock: which figures this run wrote (file modification times)
    failed, error, timed_out = None, None, None
    # Ctrl-C reaches the kernel and nbclient's sockets too, and may surface as any exception:
    # remember that it came, and report the run as interrupted whatever was raised.
    interrupted = []

    def on_sigint(signum, frame):
        interrupted.append(None)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    log_path = executed.with_name(executed.stem + ".kernel.log")
    try:
        with open(log_path, "wb") as kernel_log:
            client.execute(stderr=kernel_log, env=env)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP as ds4lab.errors.Terminated
        interrupted.append(getattr(e, "signum", None))
    except nbclient.exceptions.CellExecutionError as e:
        failed = next((code_cells.index(i) + 1 for i, c in enumerate(nb.cells) if c.cell_type == "code"
                       and any(o.get("output_type") == "error" for o in c.get("outputs", []))), None)
        error = f"{e.ename}: {e.evalue}"
    except nbclient.exceptions.CellTimeoutError:
        failed = timed_out = current[0]
        error = f"timed out after {timeout} s (the time one cell may run); the kernel was shut down"
    except Exception as e:  # a kernel that does not start or dies: keep what ran, report it
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        failed = current[0]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if log_path.exists() and log_path.stat().st_size == 0:
            log_path.unlink()
    # While a notebook runs, nbclient takes SIGINT/SIGTERM itself: it shuts the kernel down (the
    # running cell then fails with whatever the closed sockets raise) and leaves this future set.
    if getattr(client, "_async_cleanup_kernel_future", None) is not None and timed_out is None:
        interrupted.append(None)
    signum = next((s for s in interrupted if s), None)
    if interrupted:
        error = f"interrupted ({signal.Signals(signum).name})" if signum else "interrupted (Ctrl-C)"
    seconds = time.perf_counter() - t0
    if final_dir is not None and out_dir is not None:  # the copy names where its results will be
        values["OUT"] = str(Path(final_dir).resolve())
        set_parameters(nb, {"OUT": values["OUT"]})
        nb.metadata["ds4lab"]["executed"]["parameters"]["OUT"] = values["OUT"]
    nbformat.write(nb, executed)
    figures = []
    if out_dir is not None and Path(out_dir).exists():
        figures = sorted(str(p.relative_to(out_dir)) for p in Path(out_dir).rglob("*.png")
                         if p.stat().st_mtime >= started - 1)  # this run's, not an earlier run's
    return NotebookRun(path.name, executed, error is None, seconds, len(code_cells),
                       parameters=values, failed_cell=failed, error=error, figures=figures,
                       interrupted=bool(interrupted), signum=signum, timed_out_cell=timed_out)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def read_notebook(path: Path):
    """The notebook at ``path`` (nbformat, version 4). Raises :class:`NotebookError` naming the file
    when it is missing or not a notebook."""
    _, nbformat = _client_modules()
    try:
        return nbformat.read(Path(path), as_version=4)
    except Exception as e:  # nbformat raises several kinds for a file that is not a notebook
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise NotebookError(f"{path}: not a readable notebook ({why})") from None


def find_notebooks(names, folder: Path) -> list[Path]:
    """Notebooks by name (``00_quickstart``, ``00_quickstart.ipynb``, a path, or a unique prefix
    such as ``01``); all of ``folder``'s notebooks when ``names`` is empty.

    Raises :class:`NotebookError` naming a notebook that is not there or a prefix that matches
    several.
    """
    folder = Path(folder)
    available = sorted(folder.glob("*.ipynb"))
    if not names:
        if not available:
            raise NotebookError(f"no notebooks in {folder}")
        return available
    found = []
    for name in names:
        p = Path(name)
        if p.suffix == ".ipynb" and p.exists():
            found.append(p)
            continue
        matches = [a for a in available if a.stem == name or a.name == name] or \
                  [a for a in available if a.name.startswith(name)]
        if len(matches) != 1:
            what = "matches several" if matches else "is not"
            raise NotebookError(f"notebook {name!r} {what} in {folder} "
                                f"(have: {', '.join(a.stem for a in available)})")
        found.append(matches[0])
    return found


def default_folder() -> Path:
    """``notebooks/`` in the working directory, else the one beside the ds4lab source tree."""
    here = Path("notebooks")
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "notebooks"


def check_value(name: str, value) -> None:
    """Refuse, before any kernel starts, a parameter value the notebooks' code would refuse later
    (the names are the workbench notebooks' own). Raises :class:`NotebookError` naming the value."""
    from ..token.config import PRESETS

    def bad(why: str):
        raise NotebookError(f"parameter {name}={value!r}: {why}")

    if name in ("PRESET", "HAZARD_PRESET"):
        if value is not None and value not in PRESETS:
            bad(f"choose None or one of {', '.join(PRESETS)}")
    elif name == "BACKEND":
        if value not in ("auto", "cupy", "sim"):
            bad("choose auto, cupy or sim")
        if value == "cupy":
            from ..backends.cupy_backend import gpu_usable

            ok, why = gpu_usable()
            if not ok:
                bad(f"no GPU is usable here ({why})")
    elif name == "STAGES":  # the ladder's stages, or the context ladder's (04 takes 3c)
        from ..experiments.stages import STAGES

        names = [t.strip() for t in str(value).split(",") if t.strip()]
        known = list(STAGES)
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            bad(f"unknown stage(s) {', '.join(unknown) or repr(value)}; choose from: {', '.join(known)}")
    elif name in ("TOKENS", "STEPS"):
        if not isinstance(value, int) or value < 1:
            bad("a whole number ≥ 1")
    elif name == "TOKENS_PER_STEP":
        parts = str(value).split(",")
        if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            bad("comma-separated whole numbers ≥ 1, e.g. \"1,2,64\"")
    elif name in ("ROUTINGS", "MODES"):
        from ..moeprof import MODES, ROUTINGS

        known = ROUTINGS if name == "ROUTINGS" else MODES
        parts = [p.strip() for p in str(value).split(",")]
        if parts != ["all"] and not all(p in known for p in parts):
            bad(f"comma-separated names from {', '.join(known)}, or all")
    elif name.startswith("SWEEP_"):
        whole = name in ("SWEEP_LAYERS", "SWEEP_TOKENS")
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                and (not whole or float(v).is_integer()) for v in value):
            bad("a non-empty list of " + ("whole numbers" if whole else "numbers") + " > 0")


def _article(word: str) -> str:
    """``a`` or ``an`` before ``word`` (by its first letter: "an int", "a str")."""
    return "an" if word[:1].lower() in "aeiou" else "a"

