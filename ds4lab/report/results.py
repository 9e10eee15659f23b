"""Result files written as they are measured, so an interrupted run keeps what it finished.

Every job's folder goes through :func:`job_folder`: the folder is checked (:func:`check_out`),
locked against a second run (:class:`FolderLock`: the holder's PID and host in the refusal),
and ``meta.json`` is written strict JSON (:func:`write_meta`: ``NaN``/``Infinity`` become
``null``) with the run's PID, host, status and the calibration's path and SHA-256. Readers
(``ds4lab compare``, ``ds4lab ingest``) call :func:`read_meta`, which reports a folder left
``running`` by a process that no longer exists as ``died``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import socket
import traceback
from pathlib import Path

from ..errors import BadInput

class OutputError(BadInput):
    """A result folder that cannot be created or written, or is in use by another run; the message
    names the path and why (exit status 2)."""


#: The lock file a running job holds in its result folder.
LOCK_NAME = ".ds4lab.lock"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (``kill(pid, 0)``; a permission error means it does)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, ValueError, OverflowError):
        return False
    return True


class FolderLock:
    """An exclusive lock on a result folder: ``<folder>/.ds4lab.lock``, held with ``fcntl.flock``
    (released by the kernel when the process dies, so a killed run never leaves it stale) and
    holding ``{"pid", "host"}`` of the holder.

    Raises:
        OutputError: from :meth:`acquire` when another process holds it: ``<folder> is in use by
            another ds4lab run (PID <pid> on <host>)``.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "FolderLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_lock(self.path)
            os.close(fd)
            raise OutputError(f"cannot write results to {self.path.parent}: it is in use by another ds4lab run "
                              f"(PID {holder.get('pid', '?')} on {holder.get('host', '?')}); wait for it or "
                              "choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _read_lock(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def held_by_live_process(folder: Path) -> bool | None:
    """Whether a process holds ``folder``'s lock now: True / False, None where it cannot be told
    (no lock file, or ``fcntl`` missing)."""
    path = Path(folder) / LOCK_NAME
    if not path.exists():
        return None
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops a lock taken just now
    return False


def strict_json(obj):
    """``obj`` with every non-finite float (NaN, ±Infinity) replaced by None, recursively (dicts,
    lists, tuples; other values as they are), so it serializes as strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    try:
        import numpy as np

        if isinstance(obj, np.floating):
            return float(obj) if np.isfinite(obj) else None
        if isinstance(obj, np.integer):
            return int(obj)
    except ImportError:
        pass
    return obj


def write_meta(path: Path, meta: dict) -> None:
    """Write ``meta`` as strict JSON (RFC 8259: no ``NaN``; non-finite numbers become ``null``),
    indented, atomically (a partial file never replaces a good one). Values JSON cannot hold are
    written as ``str(value)``."""
    text = json.dumps(strict_json(meta), indent=2, default=str, allow_nan=False)
    tmp = Path(path).with_suffix(Path(path).suffix + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def read_meta(folder: Path) -> dict | None:
    """A result folder's ``meta.json`` as a dict (None when there is none), with a dead run told apart.

    A meta whose ``status`` is ``running`` is reported with ``status: "died"`` (and
    ``status_recorded: "running"``) when the run is gone: its folder lock is free, or (no lock file)
    its recorded ``pid`` no longer exists on this host. A run recorded on another host is left as
    ``running`` with ``status_note`` saying it cannot be checked from here.

    Raises:
        ValueError: ``meta.json`` exists but is not a JSON object (the message names the file).
    """
    path = Path(folder) / "meta.json"
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: a JSON object expected, not {type(meta).__name__}")
    if meta.get("status") != "running":
        return meta
    run = meta.get("run") if isinstance(meta.get("run"), dict) else {}
    pid, host = run.get("pid"), run.get("host")
    if host and host != socket.gethostname():
        meta["status_note"] = f"running on {host}: cannot be checked from {socket.gethostname()}"
        return meta
    held = held_by_live_process(folder)
    if held is False or (held is None and pid is not None and not _alive(pid)):
        meta["status_recorded"], meta["status"] = "running", "died"
    return meta


def _calibration_identity(meta: dict) -> None:
    """Add ``sha256`` and ``shipped`` (:func:`ds4lab.sim.calibration.calibration_info`) to every
    ``calibration`` dict in ``meta`` that names a file ``path``, in place."""
    from ..sim.calibration import calibration_info
    from ..errors import CalibrationError

    def visit(d):
        if not isinstance(d, dict):
            return
        cal = d.get("calibration")
        if isinstance(cal, dict) and cal.get("path") and "sha256" not in cal:
            try:
                info = calibration_info(cal["path"])
            except CalibrationError as e:  # edited since it was loaded: say so rather than hash it
                cal["sha256"], cal["shipped"] = None, False
                cal["problem"] = str(e)
            else:
                cal["sha256"], cal["shipped"] = info["sha256"], info["shipped"]
        for v in d.values():
            visit(v)

    visit(meta)



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
        OutputError: ``--out '' names no folder`` (None, an empty string or blanks);
            ``cannot write results to <out>: <reason>``; folders this call created are removed again.
    """
    def fail(reason: str):
        raise OutputError(f"cannot write results to {out}: {reason}")

    if out is None or not str(out).strip():
        raise OutputError(f"--out {'' if out is None else str(out)!r} names no folder: name a result folder, "
                          "for example results/<job>")
    out = Path(out)
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

    Before: :func:`check_out`; the folder's :class:`FolderLock` is taken (a second run into the
    same folder is refused with the holder's PID and host, before anything is removed); the
    files matching ``outputs`` (glob patterns, this job's own file names) left by an earlier run
    are removed, so a partial run never sits beside an older run's summary or figures;
    ``meta["run"]`` records ``{"pid", "host"}``, every ``calibration`` entry of ``meta`` gets its
    ``sha256`` and ``shipped``, and ``meta.json`` is written (:func:`write_meta`, strict JSON) with
    ``status: running``. After: ``status`` is ``complete``, ``interrupted`` (Ctrl-C; the exception
    goes on) or ``failed: <error>`` (the exception goes on; ``meta["traceback"]`` holds where it
    came from), ``meta.json`` is written again with whatever the job put in ``meta``, and the lock
    is released. A run killed outright keeps ``running`` in its file; :func:`read_meta` reports it
    as ``died``. ``on_stop(status)``, when given, is called on an interrupt or failure before
    ``meta.json`` is written (a job records how far it got); an error inside it is recorded in
    ``meta["on_stop_error"]``, never raised.

    Raises:
        OutputError: a bad or unwritable ``out`` (empty, ``.``: the command line's ``--out ""``), or a
            folder in use by another run.
    """
    if out is not None and str(out).strip() and Path(out) == Path("."):
        # click turns --out "" into "."; a job's folder is never the current directory itself (its
        # earlier outputs, matched by glob, would be removed from there)
        raise OutputError(f"--out {str(out)!r} names the current directory, not a result folder: name a "
                          "folder, for example results/<job>")
    check_out(out, ("meta.json",))
    out = Path(out)
    lock = FolderLock(out)
    try:
        lock.acquire()
    except ImportError:  # no fcntl (not POSIX): run unlocked
        lock = None
    try:
        _same_job(out, meta)  # after the lock: a folder in use is reported as in use
    except OutputError:
        if lock is not None:
            lock.release()
        raise
    try:
        for pattern in outputs:
            for p in out.glob(pattern):
                if p.is_file():
                    p.unlink()
        meta["status"] = "running"
        meta["run"] = {"pid": os.getpid(), "host": socket.gethostname()}
        _calibration_identity(meta)
        write_meta(out / "meta.json", meta)
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
            _calibration_identity(meta)
            write_meta(out / "meta.json", meta)
    finally:
        if lock is not None:
            lock.release()


def _stopped(on_stop, meta: dict) -> None:
    if on_stop is None:
        return
    try:
        on_stop(meta["status"])
    except Exception as e:  # noqa: BLE001 - keep the original error; say what else went wrong
        meta["on_stop_error"] = f"{type(e).__name__}: {e}"


def _same_job(out: Path, meta: dict) -> None:
    """Refuse a folder that holds another job's results (its ``meta.json`` names another ``job``):
    its files would sit beside this run's under one ``meta.json`` that describes only one of them.

    Raises:
        OutputError: naming the folder, the job it holds and the fix.
    """
    job = meta.get("job")
    path = out / "meta.json"
    if not job or not path.is_file():
        return
    try:
        prev = json.loads(path.read_text())
    except ValueError:
        return  # a broken meta.json is this run's to replace
    other = prev.get("job") if isinstance(prev, dict) else None
    if other and other != job:
        raise OutputError(f"cannot write {job} results to {out}: it holds the results of ds4lab {other} "
                          f"(meta.json job={other!r}); choose another --out, or empty the folder")

