"""The jobs: one module per measuring ``ds4lab`` command (:data:`JOBS`: config, run function, backends), each with a
config dataclass and ``run(config, backend, console)`` writing through :func:`ds4lab.jobs.result.result_folder`. The
CLI and :class:`ds4lab.Lab` both go through :func:`execute`. Next: ``docs/commands.md``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from .common import BadInput, CheckFailed, default_preset, exit_code, open_backend
from .result import JobResult


@dataclass(frozen=True)
class BackendRequest:
    """Which backends a job runs on: ``allowed`` names, whether the sim it gets models time only (``timing_only``, a
    value or a function of the config), and whether it measures a GPU only."""

    allowed: tuple = ("auto", "cupy", "sim")
    timing_only: bool | Callable[[Any], bool] = False
    gpu_only: bool | Callable[[Any], bool] = False
    #: False where the config says the job needs no backend at all (calibrate --moe-profile).
    needed: bool | Callable[[Any], bool] = True

    def resolve(self, cfg) -> tuple[bool, bool, bool]:
        """``(timing_only, gpu_only, needed)`` for ``cfg``."""
        return tuple(bool(v(cfg) if callable(v) else v) for v in (self.timing_only, self.gpu_only, self.needed))


#: job name → (module, BackendRequest)
JOBS = {
    "run": ("run", BackendRequest(allowed=("auto", "cupy", "numpy", "sim"),
                                  timing_only=lambda c: importlib.import_module(".run", __name__).timing_only_for(c))),
    "ladder": ("ladder", BackendRequest(timing_only=True)),
    "context": ("context", BackendRequest(timing_only=True)),
    "hazards": ("hazards", BackendRequest()),
    "moe": ("moe", BackendRequest(timing_only=lambda c: not c.sim_compute)),
    "exclusion": ("exclusion", BackendRequest(timing_only=True)),
    "conformance": ("conformance", BackendRequest()),
    "calibrate": ("calibrate", BackendRequest(allowed=("auto", "cupy"), gpu_only=True,
                                              needed=lambda c: c.moe_profile is None and not c.from_ladder
                                              and c.from_ds4 is None and c.from_context is None)),
    "bench": ("bench", BackendRequest(allowed=("auto", "cupy"), gpu_only=True)),
    "trace": ("trace", BackendRequest(timing_only=True)),
    "audit": ("audit", BackendRequest(needed=False)),
    "audit-validate": ("audit_validate", BackendRequest(needed=False)),
    "ds4": ("ds4", BackendRequest(needed=False)),
    "notebooks": ("notebooks", BackendRequest(needed=False)),
    "ingest": ("ingest", BackendRequest(needed=False)),
    "compare": ("compare", BackendRequest(needed=False)),
    "tp": ("tp", BackendRequest(needed=False)),  # the job makes its node of two devices itself
}


def module(job: str):
    """The module of ``job`` (e.g. :mod:`ds4lab.jobs.ladder`). Raises KeyError naming the jobs."""
    try:
        name, _ = JOBS[job]
    except KeyError:
        raise KeyError(f"unknown job {job!r}; jobs: {', '.join(JOBS)}") from None
    return importlib.import_module(f".{name}", __name__)


def _check_capture_modes(cfg) -> None:
    """Refuse a stream-capture mode no CUDA runtime has, in any config field that names one (``mode``,
    ``capture_mode``): the command line's choice lists do it there, this for a config made in Python. Raises
    BadInput naming the option and the value."""
    import dataclasses

    from ..capture.stream import CAPTURE_MODES

    if not dataclasses.is_dataclass(cfg):
        return
    for name in ("mode", "capture_mode"):
        if hasattr(cfg, name):
            v = getattr(cfg, name)
            if v not in CAPTURE_MODES:
                raise BadInput(f"--{name.replace('_', '-')} {v!r}: not a stream-capture mode; choose from "
                               f"{', '.join(CAPTURE_MODES)}")


def execute(job: str, cfg, *, backend: str = "auto", console=None, seed: int = 1234):
    """Open ``job``'s backend and run it with ``cfg``; returns its :class:`~ds4lab.jobs.result.JobResult`. Raises
    what the job raises (:class:`BadInput` before work, :class:`CheckFailed` after writing)."""
    from ..progress import make_console

    _, req = JOBS[job]
    timing_only, gpu_only, needed = req.resolve(cfg)
    mod = module(job)
    _check_capture_modes(cfg)
    check = getattr(mod, "check_config", None)
    if check is not None:  # checks that need no backend run before one is built
        check(cfg)
    be = None
    if needed:
        be = open_backend(backend, allowed=req.allowed, timing_only=timing_only, seed=seed,
                          gpu_only_job=job if gpu_only else None)
    return mod.run(cfg, be, console or make_console())


__all__ = ["BackendRequest", "BadInput", "CheckFailed", "JOBS", "JobResult", "default_preset", "execute", "exit_code",
           "module", "open_backend"]
