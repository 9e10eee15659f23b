"""Result files written as they are measured, so an interrupted run keeps what it finished."""

from __future__ import annotations

import contextlib
import csv
import os
import traceback
from pathlib import Path

from .errors import BadInput


class OutputError(BadInput):
    """A result folder that cannot be created or written; the message names the path and why."""




class ResultsCSV:
    """An append-only tidy CSV (``metric, value, unit, token, source``), flushed after every row.

    ``source`` says where the number came from (``cuda-events``, ``host-clock``, ``analytic``,
    ``numpy-reference``; on the simulated runtime every row reads ``modeled (sim, calibration
    <name>)``), so no figure appears without its origin.
    """

    COLUMNS = ("metric", "value", "unit", "token", "source")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(self.COLUMNS)
        self._f.flush()

    def add(self, metric: str, value, unit: str, source: str, token: int | str = "") -> None:
        self._w.writerow((metric, value, unit, token, source))
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ResultsCSV":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def _probe_write(folder: Path) -> None:
    """Create, write and remove a probe file in ``folder`` (raises the OSError of the step that fails)."""
    probe = folder / f".ds4lab-write-probe-{os.getpid()}"
    fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"probe\n")
    finally:
        os.close(fd)
    os.unlink(probe)


def check_out(out: Path, result_files=()) -> None:
    """Create the result folder ``out`` (with its parents) and prove it writable: create and remove
    a probe file, and make sure none of ``result_files`` (names in ``out``) is a folder or a
    read-only file. Every job calls it before any work, so a bad ``--out`` costs nothing.

    Raises:
        OutputError: ``cannot write results to <out>: <reason>``; folders this call created are
            removed again.
    """
    def fail(reason: str):
        raise OutputError(f"cannot write results to {out}: {reason}")

    made: list[Path] = []
    try:
        if out.exists() and not out.is_dir():
            fail("it is an existing file, not a folder" if out.is_file() else "it exists and is not a folder")
        anc = out
        while not anc.is_dir():
            if anc.exists() or anc.is_symlink():
                fail(f"{anc} is a file, not a folder" if anc.is_file() else f"{anc} is not a folder")
            made.append(anc)
            if anc.parent == anc:
                break
            anc = anc.parent
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fail(_why(e))
        try:
            _probe_write(out)
        except OSError as e:
            fail(_why(e))
        for name in result_files:
            p = out / name
            if p.is_dir():
                fail(f"{p} is a folder, not a file")
            if p.exists() and name != "meta.json" and not os.access(p, os.W_OK):
                fail(f"{p} is not writable")
    except OutputError:
        for d in made:  # deepest first; only the (empty) folders this call created
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                break
        raise
    except OSError as e:
        raise OutputError(f"cannot write results to {out}: {_why(e)}") from None


@contextlib.contextmanager
def job_folder(out: Path, meta: dict, outputs=(), on_stop=None):
    """The life of one job's result folder, around the job's work.

    Before: :func:`check_out`; the files matching ``outputs`` (glob patterns, this job's own file
    names) left by an earlier run are removed, so a partial run never sits beside an older run's
    summary or figures; ``meta.json`` is written with ``status: running``. After: ``status`` is
    ``complete``, ``interrupted`` (Ctrl-C; the exception goes on) or ``failed: <error>`` (the
    exception goes on; ``meta["traceback"]`` holds where it came from), and ``meta.json`` is written again with whatever the job put in ``meta``.
    Readers (``ds4lab compare``) flag a folder whose status is not ``complete``. ``on_stop(status)``,
    when given, is called on an interrupt or failure before ``meta.json`` is written (a job records
    how far it got); an error inside it is recorded in ``meta["on_stop_error"]``, never raised.
    """
    from .provenance import write_json

    out = Path(out)
    check_out(out, ("meta.json",))
    for pattern in outputs:
        for p in out.glob(pattern):
            if p.is_file():
                p.unlink()
    meta["status"] = "running"
    write_json(out / "meta.json", meta)
    try:
        yield out
    except KeyboardInterrupt:
        meta["status"] = "interrupted"
        _stopped(on_stop, meta)
        raise
    except BaseException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        meta["status"] = f"failed: {type(e).__name__}: {first}" if first else f"failed: {type(e).__name__}"
        meta["traceback"] = traceback.format_exc()
        _stopped(on_stop, meta)
        raise
    else:
        meta["status"] = "complete"
    finally:
        write_json(out / "meta.json", meta)


def _stopped(on_stop, meta: dict) -> None:
    if on_stop is None:
        return
    try:
        on_stop(meta["status"])
    except Exception as e:  # noqa: BLE001 - keep the original error; say what else went wrong
        meta["on_stop_error"] = f"{type(e).__name__}: {e}"
