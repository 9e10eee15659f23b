"""``ds4lab audit``: what CUDA-graph capture would refuse, break or silently get wrong in a decode step, and what it
would save, from traces (Kineto JSON, Nsight Systems SQLite, a CUPTI recording, ds4lab's ``trace.json``) or a program it
records. Needs no backend: verdicts from the sim's rules, plans from a calibration.

Next: :func:`ds4lab.audit.analysis.analyze`, :mod:`ds4lab.audit.report`, ``docs/audit.md``."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from ..capture.stream import CAPTURE_MODES
from ..errors import BadInput
from .common import out_folder
from .result import JobResult, result_folder


@dataclass
class AuditConfig:
    """What ``ds4lab audit`` does; every default lives here.

    Attributes:
        files: traces to audit (one report per source, process and device).
        program: a Python program and its arguments to record and audit instead (``["my_decode.py", "--tokens", "8"]``).
        token_range: NVTX range name (or pattern) marking one decode token; None: found by itself.
        modes: capture modes to audit (global, thread_local, relaxed).
        calibration: the plans' calibration file; None: ``$DS4LAB_CALIBRATION`` or the shipped one.
        out: result folder; None: ``results/audit-<first file's stem>`` or ``results/audit-run``.
        max_rows: rows per table in the terminal summary (the files hold all).
        arguments: with ``program``, record kernel arguments in a second, untimed pass
            (:mod:`ds4lab.audit.arguments`)."""

    files: tuple = ()
    program: tuple = ()
    token_range: str | None = None
    modes: tuple = CAPTURE_MODES
    calibration: Path | str | None = None
    out: Path | str | None = None
    max_rows: int = 12
    arguments: bool = True


def check_config(cfg: AuditConfig) -> None:
    """Check ``cfg`` before any work.

    Raises:
        BadInput: no file and no program, both, a program without a script, a missing file or a folder, an unknown mode,
            an empty ``out``, ``max_rows`` below 1.
        ds4lab.errors.CalibrationError: a calibration file that does not follow the schema."""
    if bool(cfg.files) == bool(cfg.program):
        raise BadInput("give trace files to audit, or `run -- python PROGRAM ARGS` to record one, not both"
                       if cfg.files else "nothing to audit: give trace files, or `run -- python PROGRAM ARGS`")
    if cfg.program:
        program_argv(cfg.program)
    for f in cfg.files:
        p = Path(f)
        if not p.exists():
            raise BadInput(f"{p}: no such file")
        if p.is_dir():
            from ..trace.sources import EVENT_SUFFIXES

            names = {f.name for f in Path(p).iterdir() if f.is_file()}
            # a recording's outcome (X.json beside X.csv.gz) is no trace
            inside = sorted(n for n in names if n.endswith(EVENT_SUFFIXES)
                            and not (n.endswith(".json") and n[:-5] + ".csv.gz" in names))
            e_g = (f"it holds {', '.join(inside[:4])}" + (f" and {len(inside) - 4} more" if len(inside) > 4 else "")
                   if inside else "it holds no trace file")
            raise BadInput(f"{p}: a folder, not a trace file (give a trace inside it: {e_g})")
    if len(set(map(str, cfg.files))) != len(cfg.files):
        raise BadInput("the same trace file is given twice: its units would be audited twice")
    bad = [m for m in cfg.modes if m not in CAPTURE_MODES]
    if bad or not cfg.modes:
        raise BadInput(f"--mode {', '.join(bad) or '(none)'}: choose from {', '.join(CAPTURE_MODES)}")
    if cfg.out is not None and not str(cfg.out).strip():
        raise BadInput("--out '': an empty path would silently mean the current folder; name a folder")
    if cfg.max_rows < 1:
        raise BadInput(f"max_rows={cfg.max_rows}: must be at least 1")
    if cfg.calibration is not None:
        from ..sim.calibration import calibration_info

        calibration_info(cfg.calibration)  # CalibrationError naming the file and every bad key


def program_argv(argv) -> list[str]:
    """The program's argv without a leading Python interpreter."""
    argv = list(argv)
    if argv and (Path(argv[0]).name.startswith("python") or argv[0] == sys.executable):
        argv = argv[1:]
    if not argv:
        raise BadInput("`ds4lab audit run -- python PROGRAM ARGS`: no program given after the interpreter")
    return argv


def _meta(cfg: AuditConfig) -> dict:
    from ..version import __version__
    from ..report.provenance import git_revision, source_digest

    return {"job": "audit", "ds4lab": __version__, "git_revision": git_revision(), "source_digest": source_digest(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "python": platform.python_version(),
            "inputs": [str(f) for f in cfg.files] or None, "program": list(cfg.program) or None,
            "token_range": cfg.token_range, "audited_modes": list(cfg.modes),
            "calibration_file": str(cfg.calibration) if cfg.calibration else None}


def run(cfg: AuditConfig, backend=None, console=None) -> JobResult:
    """Audit ``cfg`` (``backend`` unused). Returns the :class:`~ds4lab.jobs.result.JobResult`: tables ``audit``,
    ``tokens``, ``spans``, ``plans``, the timeline figure(s), the :class:`~ds4lab.audit.analysis.AuditReport` list as
    ``value``.

    Raises:
        BadInput: :func:`check_config`'s, a source the readers refuse (naming the file), no token found, a trace without
            kernels.
        ds4lab.report.results.OutputError: an ``out`` that cannot be written."""
    from ..audit import report as audit_report
    from ..audit.analysis import analyze

    check_config(cfg)
    first = Path(cfg.files[0]).name.split(".")[0] if cfg.files else "run"
    out, ran = out_folder(cfg.out, "audit", (first,),
                          {"files": [os.path.abspath(f) for f in cfg.files], "program": list(cfg.program),
                           "token_range": cfg.token_range, "modes": list(cfg.modes),
                           "calibration": str(cfg.calibration) if cfg.calibration else None})
    meta = _meta(cfg)
    say = console.print if console is not None else (lambda *a, **k: None)
    # a trace the readers refuse, or one without tokens, is bad input: no result folder is left
    with result_folder("audit", out, meta, audit_report.OUTPUTS, say=say if console is not None else None,
                       discard_on=(BadInput,), ran=ran) as o:
        tables = _sources(cfg, o.folder, out, console, meta)
        reports = analyze(tables, token_range=cfg.token_range, calibration=cfg.calibration, modes=cfg.modes)
        _attach_arguments(reports, tables)
        _attach_untraced(reports, tables)
        _attach_capture_paths(reports, tables, cfg)
        _against_untraced(reports, tables)
        meta.update(audit_report.audit_meta(reports))
        names = write_audit(o, reports)
        recorded = _recorded_outcomes(cfg)
        if recorded:
            meta["recorded_outcomes"] = recorded
        if console is not None:
            audit_report.summary(reports, console, cfg.max_rows)
            for f, rec in recorded.items():  # the verdict beside what the GPU did, as the recording's outcome says
                dev = rec.get("device") or {}
                console.print(f"{Path(f).name}: torch.cuda.graph on {dev.get('device', 'a GPU')} (driver "
                              f"{dev.get('driver', '?')}), as recorded beside it: {rec['outcome']}"
                              + (f" ({rec['detail']})" if rec.get("detail") else ""))
        say(f"wrote {', '.join(names)} in {o.where()}")
    return o.done(reports)


def write_audit(o, reports, under: str = "", meta: dict | None = None, *, meta_file: bool = False) -> list[str]:
    """Write the audit's tables and figures through ``o`` (in its folder or sub-folder ``under``), with a
    ``meta.json`` of their own in a sub-folder or with ``meta_file``. Returns the file names written, in order."""
    from ..audit import report as audit_report

    at = f"{under}/" if under else ""
    names = [o.table(f"{at}{name}", df).name for name, df in audit_report.tables(reports).items()]
    if under or meta_file:
        o.meta(f"{at}meta.json", {**(meta or {}), **audit_report.audit_meta(reports)})
    names.append("meta.json")
    for stem, fig in audit_report.figures(reports).items():
        names += [p.name for p in o.figure(f"{at}{stem}", fig)]
    return names


def write_report(reports, folder, meta: dict | None = None) -> list[Path]:
    """Write an audit's files into ``folder`` as it is (no result-folder life cycle); returns them."""
    from .result import Output

    folder = Path(folder)
    o = Output("audit", meta or {}, folder, folder)
    write_audit(o, reports, meta=meta, meta_file=True)
    return o.result.files


def _attach_arguments(reports, tables) -> None:
    """Compare the argument pass beside each trace, where there is one (:func:`ds4lab.audit.frozen.attach`)."""
    from ..audit.arguments import store_beside
    from ..audit.frozen import attach
    from ..trace.capture_path import is_capture_path

    for r in reports:
        for t in tables:
            if t.source != r.source:
                continue
            path = getattr(t, "path", None)
            if path is not None and is_capture_path(path):  # its recording's argument pass is not of these tokens
                r.notes.append(f"{Path(path).name} is a capture-path pass (PyTorch answered yes to 'is the stream "
                               "capturing?' while it ran): its tokens are not the step as it runs eagerly; audit "
                               "the recording beside it, whose graph plans are modeled on this pass")
                continue
            store = store_beside(path) if path is not None else None
            if store is not None:
                try:
                    attach(r, store, t, path)
                except ValueError as e:
                    r.notes.append(f"kernel arguments not compared: {e}")


def _attach_untraced(reports, tables) -> None:
    """Price plans at the untraced host times of the markers pass beside a trace, where recorded."""
    from ..audit.plans import attach_untraced_beside

    for r in reports:
        for t in tables:
            path = getattr(t, "path", None)
            if t.source == r.source and path is not None and r.plans is not None and not r.plans.empty:
                attach_untraced_beside(r, path, recorded=t)


def _attach_capture_paths(reports, tables, cfg: AuditConfig) -> None:
    """Model graph plans on the capture-path pass beside a trace (:func:`ds4lab.audit.capture_path.attach_beside`)."""
    from ..audit.capture_path import attach_beside

    for r in reports:
        for t in tables:
            path = getattr(t, "path", None)
            if t.source == r.source and path is not None and r.plans is not None and not r.plans.empty:
                attach_beside(r, path, token_range=cfg.token_range, calibration=cfg.calibration, recorded=t)


def _against_untraced(reports, tables) -> None:
    """Plans' savings against the untraced eager step where the torch.cuda.graph outcome beside a trace gives one and
    no markers pass did (:func:`ds4lab.audit.plans.against_untraced`)."""
    from ..audit.engines import outcome_beside
    from ..audit.plans import against_untraced

    for r in reports:
        for t in tables:
            path = getattr(t, "path", None)
            if t.source != r.source or path is None or r.plans is None or r.plans.empty:
                continue
            if getattr(r, "untraced", None) is not None:
                break
            rec = outcome_beside(Path(path)) or {}
            us = rec.get("eager_us")
            if isinstance(us, (int, float)) and us > 0:
                dev = rec.get("device") or {}
                where = f"on {dev['device']}" if dev.get("device") else "on the GPU it was recorded on"
                traced = float(r.plans["eager_measured_us"].median()) if "eager_measured_us" in r.plans else None
                figures, said = _untraced_figures(us, rec, traced)
                r.plans = against_untraced(r.plans, figures, f"the eager step timed with CUDA events {where}, "
                                                             f"untraced, in the outcome beside {Path(path).name}{said}")
            break


def _untraced_figures(eager_us: float, outcome: dict, traced_us: float | None = None) -> tuple[list, str]:
    """The untraced eager step's timings in a torch.cuda.graph outcome: its eager twin's and, where the argument
    cost was measured beside it, that pass's plain step, the point first; and what to say where they differ by more
    than 10 %. A timing above ``traced_us`` (the traced step's median, µs) cannot be the same loop untraced (tracing
    only adds): the other one is the point then, said."""
    base = (outcome.get("overhead") or {}).get("baseline_us")
    if not isinstance(base, (int, float)) or not base > 0:
        return [float(eager_us)], ""
    figures = [float(eager_us), float(base)]
    ratio = max(eager_us, base) / min(eager_us, base)
    if ratio <= 1.10:
        return figures, ""
    said = (f"; it was timed twice there and the two disagree: {eager_us:,.1f} µs (torch.cuda.graph's eager twin) and "
            f"{base:,.1f} µs (the argument cost's plain step), ×{ratio:.2f} apart: the saving's range spans both")
    if traced_us is not None and eager_us > traced_us >= base:
        figures.reverse()
        said += (f"; the eager twin's is above the traced step's {traced_us:,.1f} µs, which an untraced run of the "
                 "same loop cannot be: the plain step's is the point")
    return figures, said


def _recorded_outcomes(cfg: AuditConfig) -> dict[str, dict]:
    """``{input file: outcome}`` for inputs with a torch.cuda.graph outcome beside them."""
    from ..audit.engines import outcome_beside

    got = {str(f): outcome_beside(Path(f)) for f in cfg.files}
    return {f: o for f, o in got.items() if o is not None}


def _sources(cfg: AuditConfig, folder: Path, out: Path, console, meta: dict) -> list:
    """The event tables: each file read, or the program recorded into ``folder`` and read back."""
    from ..trace import sources
    from ..report import results

    if cfg.program:
        from ..trace import recording

        argv = program_argv(cfg.program)  # checked already: without its interpreter
        saved = recording.run_script(argv, folder, console, arguments=cfg.arguments, token_range=cfg.token_range)
        # named where it will be once the staging folder is swapped in for out
        meta["recording"] = str(results.final_path(Path(out) / Path(saved).relative_to(folder)))
        pairs = [(sources.read_events(saved, progress=console), Path(saved))]
    else:
        pairs = [(sources.read_events(Path(f), progress=console), Path(f)) for f in cfg.files]
    for t, p in pairs:
        t.path = p  # where its argument pass is looked for (ds4lab.audit.arguments.store_beside)
    return [t for t, _ in pairs]

