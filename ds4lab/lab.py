"""The workbench in one object, for notebooks: ``lab = ds4lab.Lab(backend="sim")``, then one method per
experiment (``lab.ladder()``, ``lab.context()``, ``lab.moe()``, ``lab.exclusion()``, ``lab.hazards()``,
``lab.trace()``, ``lab.audit()``, ``lab.ds4()``, ...), each running its job as ``ds4lab <command>``
does (:func:`ds4lab.jobs.execute`) and returning its :class:`~ds4lab.jobs.result.JobResult`: its
tables (``result.table()``), its figure (``result.figure()``, a matplotlib figure a cell shows), its
``meta`` and the files it wrote. A method's keywords are its job config's fields, with that config's
defaults (shown by ``help(lab.ladder)`` and tab completion); the lab's own preset and result folder fill
the ones not given.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from pathlib import Path

from .jobs import execute
from .jobs.audit import AuditConfig
from .jobs.bench import BenchConfig
from .jobs.calibrate import CalibrateConfig
from .jobs.compare import CompareConfig
from .jobs.conformance import ConformanceConfig
from .jobs.context import ContextConfig
from .jobs.ds4 import Ds4JobConfig
from .jobs.exclusion import ExclusionConfig
from .jobs.hazards import HazardsConfig
from .jobs.ladder import LadderConfig
from .jobs.moe import MoeConfig
from .jobs.run import RunConfig
from .jobs.tp import TPConfig
from .jobs.trace import TraceConfig
from .jobs.result import JobResult


def _runs(job: str, config):
    """Make a :class:`Lab` method run ``job`` with ``config``'s fields as its keywords (its signature is
    the config's, defaults included: one source of defaults); the method's own body may fill or check
    options before (it returns them) and its docstring says what the job does."""

    def wrap(method):
        fields = {f.name for f in dataclasses.fields(config)}

        @functools.wraps(method)
        def run(self, *args, **options) -> JobResult:
            options = method(self, *args, **options) or options
            unknown = sorted(set(options) - fields)
            if unknown:
                raise TypeError(f"Lab.{method.__name__}: no option {', '.join(unknown)}; "
                                f"its options: {', '.join(sorted(fields))}")
            return self._execute(job, config, options)

        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        own = inspect.signature(method).parameters
        params += [p for n, p in own.items() if n != "self" and p.kind is not p.VAR_KEYWORD]
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f))
                   for f in dataclasses.fields(config) if f.name not in own]
        run.__signature__ = inspect.Signature(params, return_annotation=JobResult)
        run.config = config
        return run

    return wrap


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


class Lab:
    """The workbench for notebooks (module docstring).

    Args:
        backend: ``auto`` (the GPU where one is usable, else the sim), ``cupy``, ``sim`` (every figure
            MODELED) or ``numpy`` where a job takes it.
        preset: the model of every method that takes one and is not given one (None: each job's
            default, :data:`ds4lab.jobs.common.DEFAULT_PRESETS`).
        out: the folder each method writes into, as ``out/<job>`` (None: each job's default folder,
            ``results/<job>-<what it ran>``).
        seed: the weight seed.
        console: a rich console for the jobs' lines (None: :func:`ds4lab.progress.make_console`).
    """

    def __init__(self, backend: str = "auto", *, preset: str | None = None, out: str | Path | None = None,
                 seed: int = 1234, console=None) -> None:
        self.backend, self.preset, self.seed, self.console = backend, preset, seed, console
        self.out = Path(out) if out is not None else None

    def __repr__(self) -> str:
        return f"Lab(backend={self.backend!r}, preset={self.preset!r}, out={str(self.out) if self.out else None!r})"

    def _execute(self, job: str, config, options: dict) -> JobResult:
        fields = {f.name for f in dataclasses.fields(config)}
        if "preset" in fields and options.get("preset") is None and self.preset is not None:
            options["preset"] = self.preset
        if "out" in fields and options.get("out") is None and self.out is not None:
            options["out"] = self.out / job
        return execute(job, config(**options), backend=self.backend, console=self.console, seed=self.seed)

    # ------------------------------------------------------------------------- the capture stages
    @_runs("ladder", LadderConfig)
    def ladder(self, **options):
        """The capture stages at one position: every stage bit for bit against stage 0, then µs per token
        in interleaved rounds, with launches, graph-cache counts and the floors (``ds4lab ladder``).
        Table and figure ``ladder``."""

    @_runs("context", ContextConfig)
    def context(self, **options):
        """The capture stages across context length on the long-context token (``ds4lab context``).
        Table and figure ``context``."""

    @_runs("hazards", HazardsConfig)
    def hazards(self, **options):
        """A ds4-today path (or a set: ``all``, ``all-longctx``, ``all-tp``) inside the stage it breaks:
        what capture does with it, against the same path eager (``ds4lab hazards``). Table ``hazards``;
        the rows as dicts in ``value``."""

    @_runs("trace", TraceConfig)
    def trace(self, **options):
        """One decode token per stage as a Chrome/Perfetto trace, CUPTI's records or the sim's modeled
        schedule (``ds4lab trace``). Tables ``trace_kernels``, ``trace_nvtx``, ``trace_api``; figure
        ``trace``; ``trace.json`` among its files (``lab.audit(files=...)`` reads it)."""

    @_runs("run", RunConfig)
    def run(self, **options):
        """Eager decode tokens: the reference check, µs per token, the launch census, memory, the bytes
        floor (``ds4lab run``). Tables ``census`` and ``results``."""
        options.setdefault("backend", self.backend)
        return options

    # ------------------------------------------------------------------------- the routed MoE
    @_runs("moe", MoeConfig)
    def moe(self, **options):
        """The routed-MoE profiler: ds4's seven stages timed in the modes capture allows, per token count
        and routing (``ds4lab moe``). Tables ``moe`` and ``summary``; figures ``moe-stages`` and more."""

    @_runs("exclusion", ExclusionConfig)
    def exclusion(self, **options):
        """The profiling × capture matrix: every profiling mode in every regime of the call it profiles,
        computed by running each (``ds4lab exclusion``). Table and figure ``exclusion``."""

    # ------------------------------------------------------------------------- any engine, ds4 itself
    @_runs("audit", AuditConfig)
    def audit(self, engine: str | None = None, cache: str = "dynamic", **options):
        """What capture would refuse, break or miss in a traced decode step (``ds4lab audit``): ``files``
        (a trace of any engine: Nsight Systems, Kineto, ds4lab's own) or, without them, ``engine``
        (``llama`` by default) with ``cache`` recorded live on a GPU, else its recording bundled with
        ds4lab (:func:`ds4lab.audit.engines.audit_source`). The reports in ``value``; tables and figures
        per source."""
        if not options.get("files") and not options.get("program"):
            from .audit.engines import audit_source

            where = (self.out or Path("results")) / "audit-engine"
            options["files"] = (str(audit_source(self.backend, engine or "llama", cache, record_into=where).trace),)
        return options

    @_runs("ds4", Ds4JobConfig)
    def ds4(self, **options):
        """ds4 itself: built from ``source`` (a checkout), its decode token run on a Flash-shaped synthetic
        model per configuration and context, recorded with CUPTI where asked (``ds4lab ds4``; a GPU)."""

    @_runs("calibrate", CalibrateConfig)
    def calibrate(self, **options):
        """A calibration of the sim: measured on this GPU, or fitted with no GPU from a measured folder
        (``from_ladder``, ``from_ds4``, ``from_context``, ``moe_profile``); the calibration in ``value``
        (:mod:`ds4lab.calibration`)."""

    # ------------------------------------------------------------------------- the rest
    @_runs("compare", CompareConfig)
    def compare(self, **options):
        """Results of several folders side by side (``dirs``; ``ds4lab compare``): one figure per kind."""

    @_runs("conformance", ConformanceConfig)
    def conformance(self, **options):
        """The capture-rule scenarios on the GPU and the sim, every disagreement (``ds4lab conformance``)."""

    @_runs("bench", BenchConfig)
    def bench(self, **options):
        """The launch layer's host cost, the routed MoE's bandwidth, graph replay cost (``ds4lab bench``; a GPU)."""

    @_runs("tp", TPConfig)
    def tp(self, **options):
        """Tensor parallelism on two devices: ``command`` ``token``, ``ladder`` or ``trace``
        (``ds4lab tp``); the sim's two devices unless the lab's backend is the GPU."""
        if "backend" not in options:
            from .backends import resolve

            options["backend"] = "cupy" if self.backend in ("auto", "cupy") and resolve(self.backend) == "cupy" \
                else "sim"
        return options

    # ------------------------------------------------------------------------- what there is
    @staticmethod
    def presets():
        """The model presets and their dimensions (a table, one row per preset)."""
        import pandas as pd

        from .token.config import PRESETS

        return pd.DataFrame([p.summary() for p in PRESETS.values()]).set_index("name")

    @staticmethod
    def stages():
        """The capture stages and the fixes each needs (a table: :func:`ds4lab.experiments.stages.fixes_table`)."""
        from .experiments.stages import STAGES, fixes_table

        return fixes_table(list(STAGES.values()))

    @staticmethod
    def hazard_table():
        """Every hazard ``lab.hazards(hazard=...)`` runs: its steps, stage and what CUDA does with it."""
        import pandas as pd

        from .jobs.hazards import HAZARDS  # the hazards job registers the two-rank ones

        return pd.DataFrame([{"hazard": n, "steps": h.steps, "stage": h.stage, "what": h.what,
                              "expected": h.expected("thread_local")} for n, h in HAZARDS.items()]).set_index("hazard")


__all__ = ["Lab"]
