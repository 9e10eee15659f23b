"""The one result type every job returns (:class:`JobResult`: tables, meta, figures, files) and the one writer of a
job's result folder (:class:`Output`, opened by :func:`result_folder` over :func:`ds4lab.report.results.job_folder`):
tables as CSV, figures as PNG/SVG/PDF, text and JSON written whole; ``files`` name each as it will be once in place,
so a notebook needs no read-back."""

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
        meta: what ``meta.json`` holds.
        out: the result folder (where it is once swapped in); None for a job that wrote none.
        tables: each table by name (``<name>.csv`` unless written under another file name).
        figures: each figure by name (``<name>.png/.svg/.pdf``), closed in pyplot, still drawable.
        files: every file written, as named once the folder is in place.
        value: the job's own object beyond its tables (audit reports, a calibration, ingested inputs), else None."""

    job: str
    meta: dict
    out: Path | None = None
    tables: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    value: Any = None

    def table(self, name: str | None = None):
        """The table ``name`` (default: the only one, or the job's); KeyError naming the tables there are."""
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
        """Where the numbers come from, as a title says it (:func:`ds4lab.report.provenance.label`)."""
        from ..report.provenance import label

        return label(self.meta)

    def where(self, name: str = "") -> Path:
        """The file ``name`` of the result folder as :func:`ds4lab.report.results.final_path` names it."""
        from ..report.results import final_path

        base = final_path(self.out) if self.out is not None else Path(".")
        return base / name if name else base


class Output:
    """The writer of one job's result folder: ``folder`` where files go now (staging), ``out`` their name once in
    place; ``folder`` None keeps tables and figures in the result only."""

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

    def _write(self, name: str, write) -> Path | None:
        p = self._path(name)
        if p is None:
            return None
        write(p)
        return self._record(name)

    def table(self, name: str, df, *, file: str | None = None, index: bool = False) -> Path | None:
        """Write ``df`` atomically as ``<file or name>.csv``, keep it as table ``name``; the file, or None."""
        from ..report.results import write_text_atomic

        self.result.tables[name] = df
        return self._write(file or f"{name}.csv", lambda p: write_text_atomic(p, df.to_csv(index=index)))

    def figure(self, name: str, fig, *, stem: str | None = None) -> list[Path]:
        """Save ``fig`` as ``<stem or name>.png/.svg/.pdf`` (closed in pyplot), kept as figure ``name``; the files."""
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

        return self._write(name, lambda p: write_text_atomic(p, text))

    def json(self, name: str, obj, **dumps) -> Path | None:
        """Write ``obj`` as JSON to the file ``name`` (``json.dumps(obj, **dumps)`` and a newline)."""
        return self.text(name, json.dumps(obj, **dumps) + "\n")

    def meta(self, name: str, meta: dict) -> Path | None:
        """Write a sub-folder's ``meta.json`` (the folder's own is :func:`ds4lab.report.results.job_folder`'s)."""
        from ..report.results import write_meta

        return self._write(name, lambda p: write_meta(p, meta))

    def file(self, name: str) -> Path | None:
        """Record a file the job streamed into :attr:`folder`; None without a folder or when it is not there."""
        p = self._path(name)
        if p is None or not p.exists():
            return None
        return self._record(name)

    def streamed(self, name: str, df, file: str | None = None) -> Path | None:
        """Keep ``df`` as table ``name`` whose file the job wrote row by row (not written again)."""
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
    """Open ``out`` as ``job``'s result folder (:func:`ds4lab.report.results.job_folder`); yield its :class:`Output`."""
    from ..report import results

    with results.job_folder(out, meta, outputs, **job_folder) as folder:
        yield Output(job, meta, Path(folder) if folder is not None else Path(out), out)


def no_folder(job: str, meta: dict) -> Output:
    """An :class:`Output` that writes nothing (a job run without a result folder)."""
    return Output(job, meta, None, None)
