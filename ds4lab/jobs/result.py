"""The one result type every job returns (:class:`JobResult`: its tables, its meta, its figures as figure objects, the
files it wrote), and the one place a job's result folder is written (:class:`Output`, opened by
:func:`result_folder`).

A job opens its folder with :func:`result_folder` (a :func:`ds4lab.report.results.job_folder`: staged, locked,
``meta.json`` with the status, swapped in on success) and writes every table, figure and file through the
:class:`Output` it yields: tables as CSV, figures as PNG, SVG and PDF (:func:`ds4lab.report.plots.save`), text and JSON
written whole (atomically); a file a job streams itself (rows appended as they are measured) is recorded with
:meth:`Output.file`. What was written is kept in the result: ``files`` names each as it will be once the folder is in
place (``out/<name>``), ``tables`` and ``figures`` hold the objects, so a notebook shows them without reading the
folder back."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class JobResult:
    """What a job returns.

    Attributes:
        job: the job's name (:data:`ds4lab.jobs.JOBS`).
        meta: what ``meta.json`` holds (provenance, the run's settings, its status once written).
        out: the result folder (as given: where it is once swapped in); None for a job that wrote none.
        tables: each table the job wrote, by name (``<name>.csv`` in ``out``, unless it wrote it under another file
            name).
        figures: each figure, by name (``<name>.png/.svg/.pdf``): matplotlib figures, closed in pyplot once saved,
            still drawable (a notebook cell's last line shows one).
        files: every file written, as it will be named once the folder is in place.
        value: the job's own object where it has one beyond its tables (the audit's reports, the calibration written,
            the inputs an ingest read); None otherwise."""

    job: str
    meta: dict
    out: Path | None = None
    tables: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    value: Any = None

    def table(self, name: str | None = None):
        """The table ``name``; without a name, the job's only table (or the one named after the job). Raises KeyError
        naming the tables there are."""
        if name is None:
            if len(self.tables) == 1:
                return next(iter(self.tables.values()))
            name = self.job
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"{self.job}: no table {name!r}; its tables: {', '.join(self.tables) or 'none'}") from None

    def figure(self, name: str | None = None):
        """The figure ``name``; without a name, the job's only figure (or the one named after the job)."""
        if name is None and len(self.figures) == 1:
            return next(iter(self.figures.values()))
        key = name or self.job
        try:
            return self.figures[key]
        except KeyError:
            raise KeyError(f"{self.job}: no figure {key!r}; its figures: {', '.join(self.figures) or 'none'}") \
                from None

    def label(self) -> str:
        """Where the numbers come from, as a title says it (:func:`ds4lab.report.provenance.label` of the meta: the
        GPU, or MODELED and the calibration)."""
        from ..report.provenance import label

        return label(self.meta)

    def where(self, name: str = "") -> Path:
        """Where the file ``name`` of the result folder is, as the lines that say so name it
        (:func:`ds4lab.report.results.final_path`: the folder a ``ds4lab notebooks`` run ends up in)."""
        from ..report.results import final_path

        base = final_path(self.out) if self.out is not None else Path(".")
        return base / name if name else base


class Output:
    """The writer of one job's result folder (module docstring). ``folder``: where the files go now (the staging folder
    of :func:`ds4lab.report.results.job_folder`); ``out``: the folder they are in once it is swapped in, the name
    every recorded file is given. ``folder`` None: nothing is written, the tables and figures are kept in the result
    only."""

    def __init__(self, job: str, meta: dict, folder: Path | None, out: Path | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.out = Path(out) if out is not None else None
        self.result = JobResult(job, meta, out=self.out)

    def _path(self, name: str) -> Path | None:
        if self.folder is None:
            return None
        p = self.folder / name
        p.parent.mkdir(parents=True, exist_ok=True)  # a name may lie in a sub-folder (``engine-cache/audit.csv``)
        return p

    def _record(self, name: str) -> Path:
        p = (self.out or Path(".")) / name
        if p not in self.result.files:
            self.result.files.append(p)
        return p

    def table(self, name: str, df, *, file: str | None = None, index: bool = False) -> Path | None:
        """Write ``df`` as ``<file or name>.csv`` (whole, atomically: a table rewritten as a run goes on is never seen
        half written) and keep it as the result's table ``name``. Returns the file (as named once in place), or None
        without a folder."""
        from ..report.results import write_text_atomic

        self.result.tables[name] = df
        fname = file or f"{name}.csv"
        p = self._path(fname)
        if p is None:
            return None
        write_text_atomic(p, df.to_csv(index=index))
        return self._record(fname)

    def figure(self, name: str, fig, *, stem: str | None = None) -> list[Path]:
        """Save ``fig`` as ``<stem or name>.png/.svg/.pdf`` (:func:`ds4lab.report.plots.save`, which closes it in
        pyplot) and keep it as the result's figure ``name``. Returns the files (as named once in place)."""
        from ..report import plots

        self.result.figures[name] = fig
        p = self._path(stem or name)
        if p is None:
            import matplotlib.pyplot as plt

            plt.close(fig)
            return []
        return [self._record(f.name) for f in plots.save(fig, p)]

    def text(self, name: str, text: str) -> Path | None:
        """Write ``text`` to the file ``name`` (atomically)."""
        from ..report.results import write_text_atomic

        p = self._path(name)
        if p is None:
            return None
        write_text_atomic(p, text)
        return self._record(name)

    def json(self, name: str, obj, **dumps) -> Path | None:
        """Write ``obj`` as JSON to the file ``name`` (``json.dumps(obj, **dumps)`` and a newline)."""
        return self.text(name, json.dumps(obj, **dumps) + "\n")

    def meta(self, name: str, meta: dict) -> Path | None:
        """Write a ``meta.json`` that is not the folder's own (a sub-folder's: the folder's is written by
        :func:`ds4lab.report.results.job_folder`) with :func:`ds4lab.report.results.write_meta`."""
        from ..report.results import write_meta

        p = self._path(name)
        if p is None:
            return None
        write_meta(p, meta)
        return self._record(name)

    def file(self, name: str) -> Path | None:
        """Record a file the job wrote into :attr:`folder` itself (rows streamed as they come); None without a folder,
        or when it is not there."""
        p = self._path(name)
        if p is None or not p.exists():
            return None
        return self._record(name)

    def streamed(self, name: str, df, file: str | None = None) -> Path | None:
        """Keep ``df`` as the result's table ``name``, whose file (``<file or name>.csv``) the job wrote row by row as
        they came (not written again: it holds those rows as they were written)."""
        self.result.tables[name] = df
        return self.file(file or f"{name}.csv")

    def where(self, name: str = "") -> Path:
        """Where ``name`` is once the results are in place (:meth:`JobResult.where`)."""
        return self.result.where(name)

    def done(self, value=None) -> JobResult:
        """The result, with ``value`` (the job's own object) set."""
        self.result.value = value
        return self.result


@contextlib.contextmanager
def result_folder(job: str, out, meta: dict, outputs=(), **job_folder):
    """Open ``out`` as ``job``'s result folder (:func:`ds4lab.report.results.job_folder`, with its ``outputs`` globs
    and keywords: ``say``, ``on_stop``, ``discard_on``) and yield the :class:`Output` that writes it."""
    from ..report import results

    with results.job_folder(out, meta, outputs, **job_folder) as folder:
        yield Output(job, meta, Path(folder) if folder is not None else Path(out), out)


def no_folder(job: str, meta: dict) -> Output:
    """An :class:`Output` that writes nothing (a job run without a result folder)."""
    return Output(job, meta, None, None)
