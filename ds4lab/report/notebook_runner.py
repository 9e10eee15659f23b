"""Run the workbench notebooks headlessly with other parameters, through papermill: values typed like each notebook's
defaults and checked before a kernel starts, progress per cell, the kernel's stderr kept out of the console, stop
signals passed on to the kernel. Next: ``docs/notebooks.md``, "How a headless run works"."""

from __future__ import annotations

import ast
import datetime as _dt
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import BadInput
from .widgets import HEADLESS_ENV

PARAMETERS_TAG = "parameters"
#: papermill's tag for the cell it adds after the parameters cell
INJECTED_TAG = "injected-parameters"
#: papermill's tag for the markdown cells it adds around a failure
ERROR_TAG = "papermill-error-cell-tag"
#: Seconds a kernel has to stop after a stop signal was passed on to it, before it is killed.
STOP_GRACE_S = 20.0
_STOPS = tuple(s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


class NotebookError(BadInput):
    """A notebook, parameter name or value that cannot be used (the message names it; exit 2, nothing run)."""


def parse_assignments(items) -> dict:
    """``["PRESET=small", "TOKENS=8"]`` → ``{"PRESET": "small", "TOKENS": "8"}`` (text; :func:`coerce` types it).
    Raises :class:`NotebookError` naming an item that is not ``NAME=VALUE``."""
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
    """``text`` for parameter ``name`` typed like the notebook's ``default`` (``docs/notebooks.md``). Raises
    :class:`NotebookError` naming the parameter, the text and the type expected."""
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


def _papermill():
    try:
        import nbformat
        import papermill
    except ImportError as e:
        raise NotebookError(f"running notebooks needs papermill, nbclient and ipykernel ({e.name} is missing): "
                            "pip install 'ds4lab[notebooks]'") from None
    return papermill, nbformat


def read_notebook(path: Path):
    """The notebook at ``path`` (nbformat 4). Raises :class:`NotebookError` naming a missing or unreadable file."""
    _, nbformat = _papermill()
    try:
        return nbformat.read(Path(path), as_version=4)
    except Exception as e:  # nbformat raises several kinds for a file that is not a notebook
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise NotebookError(f"{path}: not a readable notebook ({why})") from None


def parameters(path: Path) -> dict:
    """The notebook's parameters as papermill reads them: name → ``{"default", "help"}``, in order (a default that is
    not a literal: an opaque marker). Raises :class:`NotebookError` naming the file: not a notebook, or not exactly
    one parameters cell."""
    papermill, _ = _papermill()
    nb = read_notebook(path)
    cells = [c for c in nb.cells if c.cell_type == "code" and PARAMETERS_TAG in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise NotebookError(f"{path}: expected one code cell tagged {PARAMETERS_TAG!r}, found {len(cells)}")
    try:
        ast.parse(cells[0].source)
    except SyntaxError as e:
        raise NotebookError(f"{path}: the parameters cell does not parse: {e}") from None
    out = {}
    for name, p in papermill.inspect_notebook(str(path)).items():
        try:
            value = ast.literal_eval(p["default"])
        except (ValueError, SyntaxError):
            value = _NOT_A_LITERAL
        out[name] = {"default": value, "help": p.get("help", "")}
    return out


def parameter_defaults(path: Path) -> dict:
    """Name → default of each parameter of the notebook at ``path`` (:func:`parameters`), in order."""
    return {n: p["default"] for n, p in parameters(path).items()}


@dataclass
class NotebookRun:
    """The outcome of one notebook: ``ok``, the executed copy, wall seconds, and for a failure the cell (its own code
    cells counted from 1) and its error."""

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


def _own_code_cells(nb) -> list:
    """The notebook's own code cells: papermill's injected parameters cell left out."""
    return [c for c in nb.cells if c.cell_type == "code" and INJECTED_TAG not in c.metadata.get("tags", [])]


def _engine():
    """papermill's nbclient engine as ``ds4lab``, taking ``kernel_env``, ``kernel_stderr`` and ``on_client``."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines

    class Engine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                     start_timeout=60, execution_timeout=None, kernel_env=None, kernel_stderr=None,
                                     on_client=None, **kwargs):
            from papermill.engines import logger

            kwargs.pop("input_path", None)
            client = PapermillNotebookClient(nb_man, timeout=execution_timeout, startup_timeout=start_timeout,
                                             kernel_name=kernel_name, log=logger, log_output=log_output,
                                             stdout_file=stdout_file, stderr_file=stderr_file, **kwargs)
            if on_client is not None:
                on_client(client)
            return client.execute(env=kernel_env, stderr=kernel_stderr)

    papermill_engines.register("ds4lab", Engine)
    return "ds4lab"


class _Stops:
    """While a notebook runs in a worker thread: stop signals recorded (first wins) and passed on to the kernel's
    process group; the kernel killed after :data:`STOP_GRACE_S` or a second signal."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.signum: int | None = None
        self.client = None
        self.passed_at: float | None = None
        self.killed = False
        self.count = 0
        self._previous: dict = {}

    def __enter__(self) -> "_Stops":
        if threading.current_thread() is threading.main_thread():
            for s in _STOPS:
                self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)

    def _on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1

    def _kernel_group(self) -> int | None:
        km = getattr(self.client, "km", None)
        prov = getattr(km, "provisioner", None)
        pgid = getattr(prov, "pgid", None)
        if pgid:
            return pgid
        proc = getattr(prov, "process", None)
        return getattr(proc, "pid", None)

    def poll(self) -> None:
        """Pass a recorded signal on to the kernel, or kill it when its grace is over."""
        if self.signum is None or self.killed:
            return
        group = self._kernel_group()
        if group is None:
            return  # not started yet: passed on once it has
        try:
            if self.passed_at is None:
                os.killpg(group, self.signum)
                self.passed_at = time.monotonic()
            elif self.count > 1 or time.monotonic() - self.passed_at > self.grace:
                os.killpg(group, signal.SIGKILL)
                self.killed = True
        except (ProcessLookupError, PermissionError):
            self.killed = True  # gone already


def run_notebook(path: Path, values: dict, executed: Path, *, out_dir: Path | None = None,
                 final_dir: Path | None = None, timeout: int = 1800, kernel_name: str = "python3",
                 on_cell: Callable[[int, int], None] | None = None, stop_grace: float = STOP_GRACE_S) -> NotebookRun:
    """Execute one notebook top to bottom with ``values`` injected after its parameters cell; the executed copy written
    to ``executed`` either way (``docs/notebooks.md``, "How a headless run works").

    ``out_dir``: the notebook's ``OUT``; ``final_dir``: where it will be once swapped in; ``timeout``: seconds per cell
    (a cell past it is ``failed_cell`` and ``timed_out_cell``); ``on_cell(index, count)`` before each code cell; the
    kernel's stderr to ``<executed>.kernel.log``. A stop signal returns ``interrupted`` with ``signum`` (None for
    Ctrl-C), the kernel killed ``stop_grace`` seconds later.

    Raises :class:`NotebookError` for a notebook without one parameters cell, a parameter it does not have, or
    missing papermill/ipykernel; a failing cell is reported in the result."""
    papermill, _ = _papermill()

    path = Path(path)
    values, env = _kernel_values(path, values, out_dir, final_dir)
    cells = len(_own_code_cells(read_notebook(path)))
    executed = Path(executed)
    executed.parent.mkdir(parents=True, exist_ok=True)
    if executed.exists():
        executed.unlink()  # papermill writes it as it goes: what is there after the run is this run's
    log_path = executed.with_name(executed.stem + ".kernel.log")
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    current = [None]  # the code cell running now (1-based), for a timeout's message
    stops = _Stops(stop_grace)

    def cell_start(cell, cell_index, **_):
        own = _own_code_cells(stops.client.nb) if stops.client is not None else []
        for k, c in enumerate(own, 1):
            if c is cell:
                current[0] = k
                if on_cell is not None:
                    on_cell(k, len(own))

    outcome: dict = {}

    def work(kernel_log):
        try:
            papermill.execute_notebook(str(path), str(executed), parameters=values, engine_name=_engine(),
                                       kernel_name=kernel_name, progress_bar=False, log_output=False,
                                       execution_timeout=timeout, on_cell_start=cell_start, kernel_env=env,
                                       kernel_stderr=kernel_log, on_client=lambda c: setattr(stops, "client", c))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = e

    t0 = time.perf_counter()  # host clock around host work: kernel start and cells, end to end
    started = time.time()  # wall clock: which figures this run wrote (file modification times)
    with open(log_path, "wb") as kernel_log, stops:
        worker = threading.Thread(target=work, args=(kernel_log,), name=f"notebook {path.name}", daemon=True)
        worker.start()
        killed_at = None
        while worker.is_alive():
            worker.join(0.1)
            stops.poll()
            if stops.killed:
                killed_at = killed_at or time.monotonic()
                if time.monotonic() - killed_at > 10:
                    break  # the client did not notice its kernel died: stop waiting for it
    if log_path.exists() and log_path.stat().st_size == 0:
        log_path.unlink()
    seconds = time.perf_counter() - t0
    exc = outcome.get("error")
    nb = read_notebook(executed) if executed.exists() else read_notebook(path)
    if stops.signum is None and isinstance(exc, KeyboardInterrupt):  # raised in this process (a closed console)
        stops.signum = getattr(exc, "signum", None) or signal.SIGINT
    failed, error, timed_out = _failure(exc, stops.signum, current[0], nb, timeout)
    _write_copy(nb, executed, values, out_dir, final_dir, kernel_name, started_at)
    figures = []
    if out_dir is not None and Path(out_dir).exists():
        figures = sorted(str(p.relative_to(out_dir)) for p in Path(out_dir).rglob("*.png")
                         if p.stat().st_mtime >= started - 1)  # this run's, not an earlier run's
    sig = stops.signum if stops.signum not in (None, signal.SIGINT) else None
    return NotebookRun(path.name, executed, error is None, seconds, cells, parameters=values, failed_cell=failed,
                       error=error, figures=figures, interrupted=stops.signum is not None, signum=sig,
                       timed_out_cell=timed_out)


def _write_copy(nb, executed: Path, values: dict, out_dir, final_dir, kernel_name: str, started_at: str) -> None:
    """Write the executed copy: the run's parameters, ``OUT`` and its path as named once in place, unpaired."""
    _, nbformat = _papermill()
    from papermill.parameterize import parameterize_notebook

    if final_dir is not None and out_dir is not None:  # the copy names where its results will be
        values["OUT"] = str(Path(final_dir).resolve())
        try:  # and where it will be itself, when it lies beside OUT in the folder that is swapped in
            inside = executed.resolve().relative_to(Path(out_dir).resolve().parent)
            nb.metadata.setdefault("papermill", {})["output_path"] = str(Path(final_dir).resolve().parent / inside)
        except ValueError:
            pass
    if any(INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells):
        nb = parameterize_notebook(nb, values, kernel_name=kernel_name)
    nb.metadata.pop("jupytext", None)  # an executed copy is no longer paired with the notebook's source
    nb.metadata.setdefault("ds4lab", {})["executed"] = {"parameters": values, "started": started_at}
    nbformat.write(nb, executed)


def _kernel_values(path: Path, values: dict, out_dir, final_dir) -> tuple[dict, dict]:
    """``(parameter values, kernel environment)``; :class:`NotebookError` for a value the notebook lacks."""
    names = list(parameters(path))
    values = dict(values)
    env = {**os.environ, HEADLESS_ENV: "1"}  # the kernel's
    if out_dir is not None:
        if "OUT" not in names:
            raise NotebookError(f"{path.name}: its parameters cell has no OUT")
        values["OUT"] = str(Path(out_dir).resolve())
        if final_dir is not None:
            from .results import staged_env

            env.update(staged_env(Path(values["OUT"]), Path(final_dir).resolve()))
    unused = sorted(set(values) - set(names))
    if unused:
        raise NotebookError(f"{path.name}: no parameter named {', '.join(unused)} (it has {', '.join(names)})")
    return values, env


def _failure(exc, signum, current, nb, timeout: int) -> tuple:
    """``(failed cell, error, timed-out cell)`` of a run that ended with ``exc`` or stop signal ``signum``."""
    from nbclient.exceptions import CellTimeoutError
    from papermill.exceptions import PapermillExecutionError

    if signum is not None:
        return current, ("interrupted (Ctrl-C)" if signum == signal.SIGINT
                         else f"interrupted ({signal.Signals(signum).name})"), None
    if isinstance(exc, PapermillExecutionError):
        own = [c for c in _own_code_cells(nb) if ERROR_TAG not in c.metadata.get("tags", [])]
        failed = next((k for k, c in enumerate(own, 1) if any(o.get("output_type") == "error" for o in c.get("outputs", []))
                       or c.metadata.get("papermill", {}).get("exception")), current)
        return failed, f"{exc.ename}: {exc.evalue}", None
    if isinstance(exc, CellTimeoutError):
        return current, f"timed out after {timeout} s (the time one cell may run); the kernel was shut down", current
    if exc is not None:  # a kernel that does not start or dies: keep what ran, report it
        text = str(exc).strip()
        return current, f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": "), None
    return None, None, None


def find_notebooks(names, folder: Path) -> list[Path]:
    """Notebooks by name, ``.ipynb``, ``.py`` source (its paired ``.ipynb``), path or unique prefix; all of
    ``folder``'s when ``names`` is empty. Raises :class:`NotebookError` naming a missing notebook or an ambiguous
    prefix."""
    folder = Path(folder)
    available = sorted(folder.glob("*.ipynb"))
    if not names:
        if not available:
            raise NotebookError(f"no notebooks in {folder}")
        return available
    found = []
    for name in names:
        p = Path(name)
        if p.suffix in (".ipynb", ".py") and p.with_suffix(".ipynb").exists():
            found.append(p.with_suffix(".ipynb"))
            continue
        stem = p.stem if p.suffix == ".py" else name
        matches = [a for a in available if a.stem == stem or a.name == stem] or \
                  [a for a in available if a.name.startswith(stem)]
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
    """Refuse, before any kernel starts, a value the notebooks would refuse later (:class:`NotebookError`)."""
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
    elif name == "C_HOST_US":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1000:
            bad("µs per launch from C, a number above 0 (3.0–3.3 on the H200)")
    elif name.startswith("SWEEP_"):
        whole = name in ("SWEEP_LAYERS", "SWEEP_TOKENS")
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                and (not whole or float(v).is_integer()) for v in value):
            bad("a non-empty list of " + ("whole numbers" if whole else "numbers") + " > 0")


def _article(word: str) -> str:
    """``a`` or ``an`` before ``word`` (by its first letter: "an int", "a str")."""
    return "an" if word[:1].lower() in "aeiou" else "a"
