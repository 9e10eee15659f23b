"""``ds4lab ingest``: real profiles into ds4lab's tidy tables, one reader per format detected from the content
(:mod:`ds4lab.trace.sources`): ds4's stderr, ``nsys stats`` CSV, Nsight Systems SQLite, Nsight Compute CSV
(``ncu_sites``: :func:`site_table`), ds4lab result folders. Large inputs are streamed; every table has ``file`` and
``source``; bad input is a :class:`~ds4lab.trace.sources.SourceError` naming file and line.

Next: ``docs/commands.md`` (``ds4lab ingest``), ``docs/trace-readers.md``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..trace.sources import SourceError, read_tables
from ..trace.sources import ncu as _ncu
from ..trace.sources.common import Ingested, RowBlock, check_out_dir, distinct_inputs, input_size
from .result import JobResult, result_folder

#: every table name ingest writes (``<name>.csv`` under ``--out``), and the problems file
OUTPUT_GLOBS = ("ds4_moe.csv", "ds4_events.csv", "nsys_*.csv", "kernels.csv", "graphs.csv", "nvtx.csv", "ncu_*.csv", "ds4lab_*.csv",
                "ingest_problems.csv", "ingest_warnings.csv")


@dataclass
class IngestConfig:
    """What ``ds4lab ingest`` reads: ``files`` into ``out``; ``lenient``: keep good rows, report bad lines;
    ``sites``: a preset whose launch sites ncu kernels join (:func:`site_table`)."""

    files: tuple = ()
    out: Path | str | None = None
    lenient: bool = False
    sites: str | None = None


def check_config(cfg: IngestConfig) -> None:
    """Checks before any input is read: an input given, a ``sites`` preset that exists. Raises SourceError."""
    if not cfg.files:
        raise SourceError("no input to ingest")
    if cfg.sites is not None:
        from ..token.config import PRESETS

        if cfg.sites not in PRESETS:
            raise SourceError(f"--sites {cfg.sites!r}: not a preset; known presets: {', '.join(PRESETS)}")


def run(cfg: IngestConfig, backend=None, console=None) -> JobResult:
    """Ingest ``cfg`` (:func:`ingest_all`) with a progress bar for large inputs; ``backend`` unused."""
    import os

    from .common import out_folder

    check_config(cfg)
    out, ran = out_folder(cfg.out, "ingested", (),
                          {"inputs": sorted(os.path.abspath(f) for f in cfg.files), "sites": cfg.sites})
    with _progress(cfg.files) as progress:
        return ingest_all(cfg.files, Path(out), cfg.lenient, cfg.sites, progress=progress, ran=ran)


#: inputs larger than this (bytes, all together) get a progress bar on stderr while they are read
PROGRESS_BYTES = 16 << 20


@contextlib.contextmanager
def _progress(files):
    """A progress bar on stderr (MB read) for large inputs; None for small ones."""
    total = 0
    for f in map(Path, files):
        with contextlib.suppress(OSError):
            total += input_size(f)
    if total < PROGRESS_BYTES:
        yield None
        return
    from rich.console import Console

    from ..progress import JobProgress

    with JobProgress(Console(stderr=True), "reading inputs (MB)", max(1, total >> 20), eta=True) as bar:
        shown = [0]

        def progress(done: int, _total: int) -> None:
            mb = done >> 20
            if mb > shown[0]:
                bar.advance(mb - shown[0])
                shown[0] = mb

        yield progress


def ingest(path: Path, lenient: bool = False, sites: str | None = None, *, sink=None, progress=None) -> Ingested:
    """Read one input (:func:`ds4lab.trace.sources.read_tables`); ``sites`` joins ncu kernels to that preset's launch
    sites (else ``ncu_sites`` groups by NVTX cluster and op). ``sink(table, rows)`` takes a streamed input's chunks;
    ``progress(n)`` each ``n`` bytes read. Raises SourceError (file and line, an unknown preset) unless ``lenient``."""
    from ..report.compare_tables import load_result_meta

    res = read_tables(Path(path), lenient, sink=sink, progress=progress, read_meta=load_result_meta)
    k = res.tables.get("ncu_kernels")
    if k is not None and not k.empty:
        if sites:
            from ..token.config import ConfigError

            try:
                st = site_table(sites)
            except (ConfigError, KeyError) as e:
                raise SourceError(f"--sites {sites}: {e.args[0] if e.args else 'unknown preset'}") from None
            k = _ncu.join_sites(k, st)
            res.tables["ncu_kernels"] = k
            unknown = sorted({f"{c}/{o}" for c, o, ok in zip(k["cluster"], k["op"], k["site_known"])
                              if not ok and isinstance(o, str)})
            if unknown:
                res.warnings.append(f"{path}: {len(unknown)} NVTX cluster/op pair(s) that ds4lab's {sites} token "
                                    f"does not launch: {', '.join(unknown[:6])}")
        elif k["op"].isna().all():
            res.warnings.append(f"{path}: no kernel carries ds4lab's NVTX stack (profile with ncu --nvtx and "
                                "ds4lab --nvtx): sites cannot be told apart")
        res.tables["ncu_sites"] = _ncu.per_site(k)
    return res


def check_inputs(paths, out: Path) -> list[dict]:
    """Check before anything is read or written: every input once by path and content, ``out`` neither an input nor
    holding one. Returns ``[{"path", "sha256"}]`` in order.

    Raises:
        SourceError: naming the input given twice (and both names), or the input ``out`` would replace."""
    found = distinct_inputs(paths, SourceError, "its rows would be counted twice; give each input once")
    o = Path(out).resolve()
    for p, _ in found:
        key = p.resolve()
        if key == o or o in key.parents:
            raise SourceError(f"--out {out}: it {'is' if key == o else 'holds'} the input {p}: the tables would "
                              "replace what they are read from; choose another --out")
    return [{"path": str(p), "sha256": digest} for p, digest in found]


class _TableFiles:
    """One ingest's tables written to CSV as rows come; other columns go to a part file, merged by :meth:`close`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.parts: dict[str, list[tuple[list[str], Path]]] = {}
        self.rows: dict[str, int] = {}

    def add(self, table: str, df) -> None:
        """Append ``df`` (a DataFrame or :class:`ds4lab.trace.sources.common.RowBlock`) to ``table``.

        Raises:
            ds4lab.report.results.WriteFailed: the rows could not be written, naming the file (whole rows kept); not
                an OSError, so a streaming reader does not blame its input."""
        from ..report.folder_io import WriteFailed, os_reason

        try:
            self._add(table, df)
        except OSError as e:
            err = WriteFailed(f"cannot write {e.filename or self.folder / (table + '.csv')}: {os_reason(e)}", e.errno)
            err.files_not_written = getattr(e, "files_not_written", ())
            raise err from e

    def _add(self, table: str, df) -> None:
        if len(df) == 0:
            return
        cols = [str(c) for c in df.columns]
        parts = self.parts.setdefault(table, [])
        part = next((p for c, p in parts if c == cols), None)
        new = part is None
        if new:
            part = self.folder / (f"{table}.csv" if not parts else f".{table}.part{len(parts)}.csv")
            parts.append((cols, part))
        from ..report.folder_io import appending

        with appending(part):  # a write cut part way (a full disk) is cut back: whole rows only
            if isinstance(df, RowBlock):
                import csv

                with open(part, "a" if not new else "w", newline="") as f:
                    w = csv.writer(f, lineterminator="\n")
                    if new:
                        w.writerow(cols)
                    w.writerows(df.rows)
            else:
                df.to_csv(part, mode="w" if new else "a", header=new, index=False)
        self.rows[table] = self.rows.get(table, 0) + len(df)

    def close(self) -> None:
        import csv

        for table, parts in self.parts.items():
            if len(parts) == 1:
                continue
            union = list(dict.fromkeys(c for cols, _ in parts for c in cols))
            merged = self.folder / f".{table}.merged.csv"
            with open(merged, "w", newline="") as out:
                w = csv.writer(out)
                w.writerow(union)
                for cols, part in parts:
                    with open(part, newline="") as f:
                        rd = csv.reader(f)
                        next(rd, None)
                        at = [cols.index(c) if c in cols else None for c in union]
                        for row in rd:
                            w.writerow(["" if i is None else row[i] for i in at])
            for _, part in parts:
                part.unlink()
            merged.replace(self.folder / f"{table}.csv")


def ingest_all(paths, out: Path, lenient: bool = False, sites: str | None = None, progress=None,
               ran: dict | None = None) -> JobResult:
    """Ingest every path into the result folder ``out``: ``<table>.csv`` per table, ``ingest_problems.csv``,
    ``ingest_warnings.csv``, ``meta.json`` (inputs with format, SHA-256, rows). Swapped in only when every input was
    read; ``progress(done_bytes, total_bytes)``; ``ran``: what sets it apart for the default folder. Returns the
    :class:`~ds4lab.jobs.result.JobResult` (each input's :class:`~ds4lab.trace.sources.common.Ingested` as ``value``).

    Raises:
        SourceError: the first bad input unless ``lenient`` (an unreadable file, a broken ``meta.json``, a repeated
            input and an ``out`` that holds an input always); ``out`` left as it was.
        ds4lab.report.results.WriteFailed: a write failed (exit 1); the whole tables so far kept."""
    from ..report import results

    out = Path(out)
    check_out_dir(out)
    inputs = check_inputs(paths, out)
    total = sum(input_size(Path(i["path"])) for i in inputs) or 1
    done = [0]

    def read(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(min(done[0], total), total)

    meta = {"job": "ingest", "inputs": inputs, "lenient": lenient, "sites": sites}
    found: list[Ingested] = []
    try:
        with result_folder("ingest", out, meta, OUTPUT_GLOBS, discard_on=(SourceError,), ran=ran) as o:
            files = _TableFiles(o.folder)
            for spec in inputs:
                r = ingest(Path(spec["path"]), lenient, sites, sink=files.add, progress=read)
                for name, df in r.tables.items():
                    files.add(name, df)
                found.append(r)
                spec.update(kind=r.kind, rows=r.counts(), problems=len(r.problems), warnings=len(r.warnings))
            files.close()
            for table in files.parts:
                o.file(f"{table}.csv")
            problems = [p for r in found for p in r.problems]
            if problems:
                o.table("ingest_problems", pd.DataFrame(problems))
            warned = [{"file": str(r.path), "warning": w} for r in found for w in r.warnings]
            if warned:
                o.table("ingest_warnings", pd.DataFrame(warned))
            meta.update(tables=files.rows, problems=len(problems), warnings=len(warned))
    except results.OutputError as e:
        raise SourceError(str(e)) from None
    return o.done(found)


def site_table(preset: str = "ds4-flash") -> pd.DataFrame:
    """ds4lab's launch sites at ``preset``: one row per launch of one eager token (cluster, layer, op, kernel, grid,
    block, nbytes), from the timing-only sim. Raises ConfigError for an unknown preset."""
    from ..backends import make_backend
    from ..experiments.stages import START_POS
    from ..token.config import token_id_at
    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions

    cfg = get_preset(preset)
    m = DecodeModel(cfg, make_backend("sim", timing_only=True), TokenOptions(vocab=True))  # the ladder's token
    with m.L.recording() as launched:
        m.token(START_POS, token_id_at(START_POS, cfg.vocab))
    rows = [{"cluster": r.cluster, "layer": r.layer, "op": r.site, "kernel": r.kernel, "grid": str(tuple(r.grid)),
             "block": str(tuple(r.block)), "nbytes": r.nbytes} for r in launched]
    return pd.DataFrame(rows)
