"""The workbench in one object, for notebooks: ``lab = ds4lab.Lab(backend="sim")``, then one method per job
(``lab.ladder()``, ``lab.trace()``, ``lab.audit()``, ...) running it as ``ds4lab <command>`` does and returning its
:class:`~ds4lab.jobs.result.JobResult`. A method's keywords are its job config's fields and defaults; the lab's
preset and folder fill those not given. Next: ``docs/notebooks.md``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from pathlib import Path

from .backends import BACKENDS
from .errors import BadInput
from .jobs import execute
from .jobs.audit import AuditConfig
from .jobs.bench import BenchConfig
from .jobs.common import config_default
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
from .jobs.trace import TraceConfig, TraceError
from .jobs.result import JobResult
from .token.config import get_preset


def _check_type(method: str, name: str, value, default) -> None:
    """Refuse ``value`` for option ``name`` where the option's default is a number or a string and ``value`` is not
    one (``tokens="abc"``); None and other kinds of default pass to the job's own checks. Raises TypeError."""
    if value is None or default is None:
        return
    if isinstance(default, bool):
        want, ok = "True or False", isinstance(value, bool)
    elif isinstance(default, int):
        want, ok = "an integer", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        want, ok = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        want, ok = "a string", isinstance(value, (str, Path))
    else:
        return
    if not ok:
        raise TypeError(f"Lab.{method}: {name}={value!r} must be {want} (its default: {default!r})")


def _as_keywords(message: str, fields: set, method: str) -> str:
    """``message`` with each command-line flag of a ``Lab.<method>`` option written as its keyword: ``--tokens -5``
    → ``tokens=-5``, ``--runs-from`` → ``runs_from``; flags of no option are left as they are."""
    def keyword(m):
        name = m.group(1).replace("-", "_")
        name = name if name in fields else name + "s"  # a flag given once per value: --mode for modes
        if name not in fields:
            return m.group(0)
        return name + ("=" if m.group(2) else "")

    out = re.sub(r"--([a-z][a-z0-9-]*)(\s+(?=[-+\d'\"\[(A-Z]))?", keyword, message)
    return out if out == message else f"Lab.{method}: {out}"


def _runs(job: str, config):
    """Make a :class:`Lab` method run ``job`` with ``config``'s fields (and defaults) as its keywords; the method's
    body may fill options first (it returns them)."""

    def wrap(method):
        fields = {f.name for f in dataclasses.fields(config)}

        @functools.wraps(method)
        def run(self, *args, **options) -> JobResult:
            if "backend" in options:  # the Lab's own (Lab("cupy")): a second one here would be ignored
                raise TypeError(f"Lab.{method.__name__}: backend={options['backend']!r} is the Lab's; make one with "
                                f"it: Lab({options['backend']!r})")
            options = method(self, *args, **options) or options
            unknown = sorted(set(options) - fields)
            if unknown:
                raise TypeError(f"Lab.{method.__name__}: no option {', '.join(unknown)}; "
                                f"its options: {', '.join(sorted(fields))}")
            for name, value in options.items():
                default = config_default(config, name)
                if isinstance(default, (tuple, list)) and isinstance(value, (str, Path)):
                    options[name] = value = (value,)  # one path or name where a list is taken: a list of one
                _check_type(method.__name__, name, value, default)
            try:
                return self._execute(job, config, options)
            except BadInput as e:  # the jobs' checks speak the command line's flags; a Lab user typed keywords
                e.args = (_as_keywords(str(e), fields, method.__name__),) + e.args[1:]
                raise

        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        own = inspect.signature(method).parameters
        params += [p for n, p in own.items() if n != "self" and p.kind is not p.VAR_KEYWORD]
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=config_default(config, f.name))
                   for f in dataclasses.fields(config) if f.name not in own and f.name != "backend"]
        run.__signature__ = inspect.Signature(params, return_annotation=JobResult)
        run.config = config
        return run

    return wrap


class Lab:
    """The workbench for notebooks.

    Args:
        backend: ``auto`` (the GPU where usable, else the sim), ``cupy``, ``sim`` (MODELED) or ``numpy`` where a job
            takes it.
        preset: every job's preset when not given (None: :data:`ds4lab.jobs.common.DEFAULT_PRESETS`).
        out: each job writes into ``out/<job>`` (None: its default folder).
        seed: the weight seed.
        console: a rich console for the jobs' lines (None: :func:`ds4lab.progress.make_console`)."""

    #: What :meth:`trace` raises where no kernel timeline can be recorded (a GPU without CUPTI).
    TraceError = TraceError

    def __init__(self, backend: str = "auto", *, preset: str | None = None, out: str | Path | None = None,
                 seed: int = 1234, console=None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"Lab: unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)} "
                             "(cupy: the GPU)")
        if preset is not None:
            get_preset(preset)  # an unknown preset named now, not at the first job
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"Lab: seed={seed!r} must be a whole number >= 0")
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
        """The capture stages at one position: exactness against stage 0, µs per token in interleaved rounds,
        launches, graph-cache counts, floors (``ds4lab ladder``). Table and figure ``ladder``."""

    @_runs("context", ContextConfig)
    def context(self, **options):
        """The capture stages across context length on the long-context token (``ds4lab context``); ``context``."""

    @_runs("hazards", HazardsConfig)
    def hazards(self, **options):
        """A ds4-today path (or ``all``, ``all-longctx``, ``all-tp``) inside the stage it breaks, against it eager
        (``ds4lab hazards``). Table ``hazards``; rows as dicts in ``value``."""

    @_runs("trace", TraceConfig)
    def trace(self, **options):
        """One decode token per stage as a Chrome/Perfetto trace (``ds4lab trace``). Tables ``trace_kernels``,
        ``trace_nvtx``, ``trace_api``; figure ``trace``; ``trace.json`` among its files."""

    @_runs("run", RunConfig)
    def run(self, **options):
        """Eager decode tokens: reference check, µs per token, census, memory, floor (``ds4lab run``)."""
        options.setdefault("backend", self.backend)
        return options

    # ------------------------------------------------------------------------- the routed MoE
    @_runs("moe", MoeConfig)
    def moe(self, **options):
        """The routed-MoE profiler (``ds4lab moe``). Tables ``moe`` and ``summary``; figures ``moe-stages`` and more.
        ``tokens_per_step``, ``routings`` and ``modes`` may be text (:func:`ds4lab.jobs.moe.text_options`)."""
        if any(isinstance(options.get(k), str) for k in ("tokens_per_step", "routings", "modes")):
            from .jobs.moe import text_options

            got, note = text_options(self.backend, options.pop("preset", None) or self.preset,
                                     *(options.pop(k, None) for k in ("tokens_per_step", "routings", "modes")))
            options.update(got)
            if note:
                self._say(note)
        return options

    @_runs("exclusion", ExclusionConfig)
    def exclusion(self, **options):
        """The profiling × capture matrix: every profiling mode in every regime of the call it profiles, computed by
        running each (``ds4lab exclusion``). Table and figure ``exclusion``."""

    # ------------------------------------------------------------------------- any engine, ds4 itself
    @_runs("audit", AuditConfig)
    def audit(self, engine: str | None = None, cache: str = "dynamic", **options):
        """What capture would refuse, break or miss in a traced decode step (``ds4lab audit``): ``files`` (any
        engine's trace) or else ``engine`` (default ``llama``) with ``cache``
        (:func:`ds4lab.audit.engines.audit_source`). Reports in ``value``; tables and figures per source."""
        if not options.get("files") and not options.get("program"):
            options["files"] = (str(self.engine(engine or "llama", cache).trace),)
        return options

    @_runs("ds4", Ds4JobConfig)
    def ds4(self, **options):
        """ds4 itself: built from ``source`` (a checkout), its decode token run on a Flash-shaped synthetic model per
        configuration and context, recorded with CUPTI where asked (``ds4lab ds4``; a GPU)."""

    @_runs("calibrate", CalibrateConfig)
    def calibrate(self, **options):
        """A calibration of the sim, measured on this GPU or fitted from a measured folder (``from_ladder``,
        ``from_ds4``, ``from_context``, ``moe_profile``); the calibration in ``value``."""

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
        """Tensor parallelism on two devices: ``command`` ``token``, ``ladder`` or ``trace`` (``ds4lab tp``); the sim's
        two devices unless the lab's backend is the GPU."""
        if "backend" not in options:
            options["backend"] = "cupy" if self.on_gpu else "sim"
        return options

    # ------------------------------------------------------------------------- beside the jobs
    @property
    def on_gpu(self) -> bool:
        """Whether the lab's backend is the GPU (``cupy``, or ``auto`` with a usable GPU)."""
        from .backends import resolve

        return self.backend in ("auto", "cupy") and resolve(self.backend) == "cupy"

    def preset_for(self, job: str) -> str:
        """The preset ``job`` runs with from this lab: the lab's, else the job's default on the lab's backend
        (:data:`ds4lab.jobs.common.DEFAULT_PRESETS`), decided without opening the backend."""
        from .jobs.common import DEFAULT_PRESETS

        gpu, cpu = DEFAULT_PRESETS[job]
        return self.preset or (gpu if self.on_gpu or cpu is None else cpu)

    def token(self, position: int = 1000, preset: str | None = None):
        """One timing-only decode token of ``preset`` (default: the ladder's): its launch census and
        ``ranges(layer)`` (:class:`ds4lab.experiments.launch_list.OneToken`)."""
        from .experiments.launch_list import one_token
        from .jobs.common import open_backend
        from .report import provenance

        be = open_backend(self.backend, timing_only=True, seed=self.seed)
        preset = preset or self.preset_for("ladder")
        return one_token(be, preset, position, f"backend {be.name} · preset {preset} · "
                         f"{provenance.label(provenance.base_meta(be))}")

    @staticmethod
    def timeline(trace: JobResult, first_layers: int = 2):
        """A ``trace`` result's first ``first_layers`` layers on one timeline
        (:func:`ds4lab.report.plots.trace_figure`), a dropdown in JupyterLab. Raises ValueError for a layer count the
        preset does not have."""
        from .report import plots, widgets

        draw = functools.partial(plots.trace_figure, trace.table("trace_kernels"), trace.table("trace_nvtx"),
                                 trace.meta)
        layers = range(1, trace.meta["preset"]["n_layers"] + 1)
        return widgets.choose(draw, first_layers=widgets.Choice(first_layers, layers))

    @staticmethod
    def moe_stages(moe: JobResult):
        """Median µs per routed-MoE call by stage, token count and routing of a ``moe`` result."""
        from .report.views import moe_stage_table

        return moe_stage_table(moe.out)

    @staticmethod
    def moe_distribution(moe: JobResult, routing: str | None = None):
        """Each stage's µs per call for one ``routing`` of a ``moe`` result (default the first;
        :func:`ds4lab.report.plots.moe_stage_distribution_figure`), a dropdown in JupyterLab."""
        from .report import plots, widgets

        routings = list(dict.fromkeys(moe.table("moe")["routing"]))
        draw = functools.partial(plots.moe_stage_distribution_figure, moe.table("moe"), moe.meta)
        return widgets.choose(draw, routing=widgets.Choice(routing or routings[0], routings))

    @staticmethod
    def whatif(layers=(4, 8, 16, 43), launch_us=(2.0, 5.0, 9.4, 15.0), tokens_per_step=(1, 2, 3, 16, 64, 512)):
        """The modeled what-if sweeps on the timing-only sim (:mod:`ds4lab.experiments.whatif`), every number
        MODELED. A result without a folder: tables ``layers``, ``launch``, ``tokens``; figure ``whatif``."""
        from .experiments import whatif
        from .jobs.result import no_folder
        from .report import plots

        o = no_folder("whatif", {"job": "whatif", "modeled": True})
        tables = {"layers": whatif.sweep_layers(list(layers)), "launch": whatif.sweep_launch_cost(list(launch_us)),
                  "tokens": whatif.sweep_moe_tokens(list(tokens_per_step))}
        for name, t in tables.items():
            o.table(name, t)
        o.result.figures["whatif"] = plots.detach(plots.whatif_figure(*tables.values()))
        return o.done()

    def launch_scan(self, preset: str | None = None):
        """Where the long-context token's launch list changes with the position, counted on a timing-only sim
        (:func:`ds4lab.experiments.launch_list.scan`; default preset: the context ladder's)."""
        from .experiments.launch_list import scan

        return scan(preset or self.preset_for("context"))

    @staticmethod
    def launches_figure(scan):
        """Kernel launches per token by position of a :meth:`launch_scan`."""
        from .report import plots

        return plots.detach(plots.launches_figure(scan))

    @staticmethod
    def regime_change(scan, change: int | None = None):
        """What stage 3 keys its graphs on either side of a launch-shape change of a :meth:`launch_scan` (``change``:
        the n_comp before it; default the first), a dropdown in JupyterLab; a sentence where there is none."""
        from .report import widgets

        changes = scan.visible_changes()
        if not changes:
            return "no launch-shape change below max_context"
        options = [(f"n_comp {n} → {n + 1} (positions {4 * n - 1}, {4 * n + 3})", n) for n in changes]
        return widgets.choose(scan.decisions_table, change=widgets.Choice(change or changes[0], options))

    @staticmethod
    def context_graphs(context: JobResult):
        """Graphs each stage of a ``context`` result captured per context
        (:func:`ds4lab.report.views.context_graphs`)."""
        from .report.views import context_graphs

        return context_graphs(context.out)

    @staticmethod
    def capture_stages(folder: str | Path | None = "record"):
        """``(table, label)`` of a ``ds4lab context`` folder, each stage over stage 3
        (:func:`ds4lab.report.views.capture_stages`); ``"record"``: the H200 record in this checkout; ``(None, why)``
        where there is no folder."""
        from .report.results import read_meta
        from .report.provenance import label
        from .report.views import capture_stages

        if folder == "record":
            folder = Path(__file__).resolve().parents[1] / "docs/measurements/h200-2026-12-02b/capture-stages"
            if not folder.is_dir():
                return None, "the H200 record is not in this installation: name a ds4lab context folder"
        if folder is None:
            return None, "no folder"
        return capture_stages(Path(folder)), f"{label(read_meta(Path(folder)))} ({folder})"

    def engine(self, engine: str = "llama", cache: str = "dynamic", trace=None):
        """The trace an audit of ``engine`` reads (:func:`ds4lab.audit.engines.audit_source`): ``trace``, else
        recorded live on a GPU torch sees (into ``<out>/engine``), else the bundled recording; its ``note`` says
        which."""
        from .audit.engines import audit_source

        return audit_source(self.backend, engine, cache, trace, record_into=(self.out or Path("results")) / "engine")

    @staticmethod
    def audit_figure(report):
        """An audit report's tokens, spans and findings on a timeline (:func:`ds4lab.audit.figure.timeline_figure`)."""
        from .audit.figure import timeline_figure
        from .report.plots import detach

        return detach(timeline_figure(report))

    @staticmethod
    def against_torch(report, source):
        """An audit report beside what ``torch.cuda.graph`` did with the same step
        (:func:`ds4lab.audit.validate.against_torch`) as a Series; a sentence for a trace of your own."""
        import pandas as pd

        from .audit.validate import against_torch

        if source.torch_run is None:
            return ("your own trace: no torch.cuda.graph outcome to compare with (`ds4lab audit validate` checks "
                    "the audit against torch on the engines ds4lab builds)")
        return pd.Series(against_torch(report, source.torch_run))

    @staticmethod
    def beside_ds4(folder=None):
        """ds4 itself beside ds4lab's rebuild (:class:`ds4lab.ds4.vs_rebuild.Beside`) from a ``ds4lab ds4`` folder
        (None: the rebuild alone). Raises ValueError for a folder that is not one."""
        from .ds4.vs_rebuild import Beside, read_ds4

        return Beside(read_ds4(folder) if folder is not None else None)

    @staticmethod
    def contexts(text, preset: str, name: str = "contexts") -> tuple:
        """``"1024,4096"`` → ``(1024, 4096)``, each within ``preset``'s longest context (long context on). Raises
        BadInput naming ``name`` and the value."""
        from .jobs.context import parse_contexts
        from .token.config import get_preset

        try:
            got = tuple(parse_contexts(text))
        except BadInput as e:
            raise BadInput(f"{name}={text!r}: {str(e).replace('--contexts', name)}") from None
        longest = get_preset(preset, long_context=True).max_context
        if max(got) > longest:
            raise BadInput(f"{name}={text!r}: {max(got)} is past {preset}'s longest context, {longest}")
        return got

    @staticmethod
    def host_whatif(contexts=(1024,), host_us=3.2, preset: str = "ds4-flash", stages: str = "0,i,3,3c",
                    tokens: int = 8):
        """``preset``'s token on the timing-only sim, eager launches priced at the shipped host cost and at
        ``host_us`` per launch, MODELED (:func:`ds4lab.calibration.from_ds4.host_whatif`). A result without a folder:
        table ``host_whatif``, figure ``host-whatif``. Raises BadInput for a cost outside (0, 1000) µs."""
        from .calibration.from_ds4 import host_whatif, host_whatif_figure
        from .jobs.result import no_folder
        from .report import plots

        if isinstance(host_us, bool) or not isinstance(host_us, (int, float)) or not 0 < host_us < 1000:
            raise BadInput(f"host cost {host_us!r}: µs per launch from C, a number above 0 (3.0–3.3 on the H200)")
        o = no_folder("host-whatif", {"job": "host-whatif", "modeled": True, "preset": preset})
        t = host_whatif(contexts, (host_us,), preset=preset, stages=stages, tokens=tokens)
        o.table("host_whatif", t)
        o.result.figures["host-whatif"] = plots.detach(host_whatif_figure(t, preset))
        return o.done()

    @staticmethod
    def save(figure, stem, formats=("png", "svg", "pdf")):
        """Write ``figure`` as ``stem.png`` (and ``formats``; :func:`ds4lab.report.plots.save`: whole files, the figure
        closed in pyplot) and return it, so a cell shows it once; None passes through."""
        from .report import plots

        if figure is not None:
            Path(stem).parent.mkdir(parents=True, exist_ok=True)
            plots.save(figure, Path(stem), formats=formats)
        return figure

    def _say(self, line: str) -> None:
        from .progress import make_console

        (self.console or make_console()).print(line)

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
