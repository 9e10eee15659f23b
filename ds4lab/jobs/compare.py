"""``ds4lab compare``: ds4lab results and ingested profiles from several folders, side by side (PNG, SVG, PDF); what it
draws and from which tables: :mod:`ds4lab.report.compare_tables`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..report.compare_tables import CompareError, collect, figures
from .common import default_folder, out_folder
from .result import JobResult, result_folder

#: What ``compare`` writes in its folder.
COMPARE_OUTPUTS = ("compare_*.png", "compare_*.svg", "compare_*.pdf")


@dataclass
class CompareConfig:
    """What ``ds4lab compare`` draws: the result ``dirs`` (at least one), into the result folder ``out``."""

    dirs: tuple = ()
    out: Path | str | None = None


def check_config(cfg: CompareConfig) -> None:
    """Checks before anything is read: a folder to draw, and an ``out`` that can be a folder and is neither a source
    nor holds one. Raises CompareError (exit 2)."""
    from ..trace.sources import SourceError
    from ..trace.sources.common import check_out_dir

    if not cfg.dirs:
        raise CompareError("no folder to compare")
    out = Path(cfg.out) if cfg.out is not None else default_folder("compare")
    try:
        check_out_dir(out)
    except SourceError as e:
        raise CompareError(str(e)) from None
    o = out.resolve()
    for d in map(Path, cfg.dirs):
        if d.resolve() == o or o in d.resolve().parents:
            raise CompareError(f"--out {out}: it {'is' if d.resolve() == o else 'holds'} the source {d}: the "
                               "figures would replace what they are drawn from; choose another --out")


def run(cfg: CompareConfig, backend=None, console=None) -> JobResult:
    """Compare ``cfg.dirs`` into ``cfg.out`` (:func:`compare`; None: ``results/compare``, an earlier comparison of
    other folders there kept beside); ``backend`` is unused (none needed)."""
    import os

    out, ran = out_folder(cfg.out, "compare", (), {"sources": sorted(os.path.abspath(d) for d in cfg.dirs)})
    return compare(cfg.dirs, out, ran=ran)


def compare(dirs, out: Path, warn=None, ran: dict | None = None) -> JobResult:
    """The figures of ``ds4lab compare`` (``docs/compare.md``: what each kind draws, one bar or marker series per
    source, the labels) into the result folder ``out``. ``warn`` (default: stderr) hears of incomplete runs; ``ran``:
    what sets this comparison apart, for the default folder. Returns the :class:`~ds4lab.jobs.result.JobResult`:
    figures, their files, the tables drawn (:class:`ds4lab.report.compare_tables.Table`) as ``value``.

    Raises:
        CompareError: nothing written: a folder given twice, one without a drawable table, an unreadable table or meta,
            an ``out`` that cannot be a folder or is or holds a source.
        ds4lab.report.results.WriteFailed: after the work began (exit 1)."""
    import matplotlib.pyplot as plt

    from ..report import results

    check_config(CompareConfig(tuple(dirs), out))
    out = Path(out)
    tables = collect(dirs, warn)
    figs = figures(tables)
    meta = {"job": "compare", "sources": [{"folder": str(Path(d)), "tables": sorted({
        str(t.path.name) for t in tables if t.path.parent == Path(d)})} for d in dirs],
            "labels": [t.label for t in tables], "modeled": any(t.modeled for t in tables)}
    try:
        with result_folder("compare", out, meta, COMPARE_OUTPUTS, ran=ran) as o:
            for fig, stem in figs:
                o.figure(stem, fig)
    except results.OutputError as e:
        raise CompareError(str(e)) from None
    finally:
        for fig, _ in figs:
            plt.close(fig)
    return o.done(tables)
