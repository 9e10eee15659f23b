"""What every job shares: the error hierarchy and its exit codes (:func:`exit_code`; the table is in
``docs/commands.md``, "Exit status"), the default-preset rule, the backend a job runs on, the result folder's name,
and the sim banner."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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
    """The preset ``job`` uses on ``be`` when none is given (:data:`DEFAULT_PRESETS`); KeyError for another job."""
    gpu, cpu = DEFAULT_PRESETS[job]
    return gpu if be.is_gpu or cpu is None else cpu


def open_backend(name: str, *, allowed=("auto", "cupy", "sim"), timing_only: bool = False, seed: int = 1234,
                 gpu_only_job: str | None = None):
    """The backend a job runs on (:func:`ds4lab.backends.make_backend`, kernels compiled on a GPU); ``gpu_only_job``:
    the job's name when it has no CPU mode.

    Raises:
        BadInput: ``name`` not in ``allowed``.
        BackendUnavailable: a GPU was asked for and none is usable."""
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


def config_default(config_cls, field: str):
    """The default of ``field`` in a job's config dataclass (``config_default(LadderConfig, "tokens")``)."""
    f = config_cls.__dataclass_fields__[field]
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def check_out_option(out) -> None:
    """The one check of ``--out`` before any work: None passes; an empty path or the working directory itself (click
    turns ``""`` into ``"."``) raises :class:`~ds4lab.report.results.OutputError` naming the value."""
    from ..report.results import OutputError

    if out is None:
        return
    if not str(out).strip() or Path(out) == Path("."):
        raise OutputError(f"--out {str(out)!r} names no result folder (an empty path or the current directory "
                          "would mix this run's files with others): name a folder, for example results/<job>")


def default_folder(job: str, *parts) -> Path:
    """``results/<job>-<part>-...`` (empty parts left out)."""
    return Path("results") / "-".join(str(p) for p in (job, *parts) if p not in (None, ""))


def out_folder(out, job: str, parts=(), ran: dict | None = None) -> tuple:
    """``(folder, ran)`` for ``--out``: as given (``ran`` None: a rerun replaces the same command's results), or for
    None :func:`default_folder` with ``ran`` (results of another run are kept beside)."""
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
    """The exit status for ``exc`` (``docs/commands.md``, "Exit status")."""
    if isinstance(exc, KeyboardInterrupt):
        signum = getattr(exc, "signum", None)  # SIGTERM 143, SIGHUP 129, as a shell reports them
        return 128 + signum if signum else 130
    if isinstance(exc, CheckFailed):
        return 1
    if isinstance(exc, (BadInput, ConfigError, BackendUnavailable, MemoryError)):
        return 2
    return 1
