"""What every job shares: the error hierarchy and its exit codes, the default-preset rule, the backend a job runs on,
and the sim banner.

Exit codes (the CLI maps exceptions to them in one place, :func:`exit_code`):

======  =====================================================================================
2       bad input: a bad option, an unknown preset, an unwritable ``--out``, no GPU for a
        GPU-only job (:class:`BadInput`, :class:`~ds4lab.token.config.ConfigError`,
        :class:`~ds4lab.report.results.OutputError` (a BadInput), :class:`~ds4lab.backends.BackendUnavailable`,
        :class:`MemoryError` before any work) — nothing was run
1       a failed check or a failed run: a stage not bit-identical, a reference check that fails,
        conformance disagreements (:class:`CheckFailed`), or any other error after work began
130     interrupted (Ctrl-C): results so far are on disk and ``meta.json`` says ``interrupted``
143     stopped by SIGTERM (129: SIGHUP; 141: the console's output pipe closed, ``| head``):
        handled like Ctrl-C, ``meta.json`` says ``interrupted (SIGTERM)``
        (:class:`ds4lab.errors.Terminated`)
======  ====================================================================================="""

from __future__ import annotations

from ..backends import BackendUnavailable, make_backend, resolve
from ..token.config import ConfigError
from ..errors import BadInput, CheckFailed


#: Default model dimensions per job, on a GPU and off it (the sim or the NumPy executor). One
#: table, so "which preset did I get" has one answer: on a GPU the jobs measure ds4-flash (``run``
#: uses ``small`` so its reference check on the CPU stays short); on the CPU every job models
#: ``small`` (``run`` on the sim then models time only by default: computing ``small``'s numbers on
#: the CPU takes minutes).
DEFAULT_PRESETS = {
    #  job           GPU           CPU
    "run":         ("small",     "small"),
    "ladder":      ("ds4-flash", "small"),
    "hazards":     ("ds4-flash", "small"),
    "moe":         ("ds4-flash", "small"),
    "exclusion":   ("ds4-flash", "small"),
    "calibrate":   ("small",     None),
    "bench":       ("ds4-flash", None),
    "trace":       ("ds4-flash", "small"),
    "context":     ("ds4-flash", "small"),
    "tp":          ("small",     "small"),
}


def default_preset(job: str, be) -> str:
    """The preset ``job`` uses when none is given, on backend ``be`` (see :data:`DEFAULT_PRESETS`).

    Raises:
        KeyError: ``job`` is not in the table (a programming error: every job has a row)."""
    gpu, cpu = DEFAULT_PRESETS[job]
    return gpu if be.is_gpu or cpu is None else cpu


def open_backend(name: str, *, allowed=("auto", "cupy", "sim"), timing_only: bool = False, seed: int = 1234,
                 gpu_only_job: str | None = None):
    """The backend a job runs on (:func:`ds4lab.backends.make_backend`, kernels compiled on a GPU).

    Args:
        gpu_only_job: the job's name when it measures a GPU and has no CPU mode.

    Raises:
        BadInput: ``name`` not in ``allowed``.
        BackendUnavailable: a GPU was asked for (``cupy``, or a GPU-only job) and none is usable."""
    if name not in allowed:
        raise BadInput(f"--backend {name}: choose one of {', '.join(allowed)}")
    if gpu_only_job and resolve(name) != "cupy":
        if name == "auto":
            name = "cupy"  # raises BackendUnavailable with the reason
        else:
            raise BackendUnavailable(f"ds4lab {gpu_only_job} measures a GPU and has no CPU mode")
    try:
        be = make_backend(name, seed=seed, timing_only=timing_only, compile_kernels=True)
    except BackendUnavailable as e:
        if gpu_only_job:
            raise BackendUnavailable(f"{e}; ds4lab {gpu_only_job} measures a GPU and has no CPU mode") from None
        raise
    return be


def check_out_option(out) -> None:
    """The one check of an ``--out`` option before any work: None (the job's default folder) passes; an empty or blank
    path, or the current directory itself, is refused (click turns ``--out ""`` into ``"."``, and a job's folder is
    never the working directory: its earlier outputs are matched by name there).

    Raises:
        ds4lab.report.results.OutputError: naming the value (a :class:`BadInput`, exit 2)."""
    from pathlib import Path

    from ..report.results import OutputError

    if out is None:
        return
    if not str(out).strip() or Path(out) == Path("."):
        raise OutputError(f"--out {str(out)!r} names no result folder (an empty path or the current directory "
                          "would mix this run's files with others): name a folder, for example results/<job>")


def default_folder(job: str, *parts) -> "Path":
    """A job's default result folder: ``results/<job>-<part>-...`` (the parts that set one run apart from another by
    name: the hazard set, the preset, the backend; empty parts left out)."""
    from pathlib import Path

    return Path("results") / "-".join(str(p) for p in (job, *parts) if p not in (None, ""))


def out_folder(out, job: str, parts=(), ran: dict | None = None) -> tuple:
    """``(folder, ran)`` for a job's ``--out``: the folder as given (``ran`` None: a rerun into it replaces what the
    same command wrote there), or, for None, :func:`default_folder` with ``parts`` and ``ran``, what the run ran
    (:func:`ds4lab.report.results.job_folder`: earlier results there that ran something else are kept beside as
    ``.replaced-<time>``, never replaced)."""
    from pathlib import Path

    if out is not None:
        return Path(out), None
    return default_folder(job, *parts), dict(ran or {}, job=job)


def modeled_banner(be) -> str | None:
    """The line every job prints first on a backend whose time is modeled (None on a GPU)."""
    if not be.models_time:
        return None
    from ..sim.calibration import backend_calibration
    from ..report.provenance import calibration_label

    name = calibration_label({"calibration": backend_calibration(be)})  # path and hash when not shipped
    return f"[bold yellow]sim backend: every figure below is MODELED (calibration {name}), not measured.[/]"


def exit_code(exc: BaseException) -> int:
    """The exit status for ``exc`` (module docstring's table)."""
    if isinstance(exc, KeyboardInterrupt):
        signum = getattr(exc, "signum", None)  # SIGTERM 143, SIGHUP 129, as a shell reports them
        return 128 + signum if signum else 130
    if isinstance(exc, CheckFailed):
        return 1
    if isinstance(exc, (BadInput, ConfigError, BackendUnavailable, MemoryError)):
        return 2
    return 1
