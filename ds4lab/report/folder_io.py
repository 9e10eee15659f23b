"""The file-system pieces of ds4lab's result folders: the errors, the lock, atomic writes, signals that stop a command
like Ctrl-C, the renames that swap a folder in, and one result file written aside (:func:`output_file`).
:mod:`ds4lab.report.results` builds the folder's life cycle on them."""

from __future__ import annotations

import contextlib
import errno as _errno
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

from ..errors import BadInput, Terminated


class OutputError(BadInput):
    """A result folder that cannot be created or written, or is in use by another run; the message names the path and
    why (exit status 2)."""


class WriteFailed(RuntimeError):
    """Writing results failed after the work began (a full disk, a quota, an I/O error): the message names the file (or
    the folder, where the operating system named none) and the reason; the partial results are kept (exit status 1).
    ``errno`` is the operating system's error number."""

    def __init__(self, msg: str, errno: int | None = None) -> None:
        super().__init__(msg)
        self.errno = errno


#: The lock file of a result folder written by ds4lab before result folders were staged (inside the
#: folder); still honoured by :func:`read_meta` and :func:`held_by_live_process`.
LOCK_NAME = ".ds4lab.lock"
#: Suffixes of the lock and the staging folder beside a result folder ``OUT`` (``.OUT<suffix>``).
LOCK_SUFFIX = ".ds4lab.lock"
STAGING_SUFFIX = ".ds4lab-staging"
OLD_SUFFIX = ".ds4lab-old"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (``kill(pid, 0)``; a permission error means it does)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, ValueError, OverflowError, TypeError):
        return False
    return True


def lock_path(target: Path) -> Path:
    """The lock file of result folder (or file) ``target``: ``.<name>.ds4lab.lock`` beside it."""
    target = Path(target)
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


class Lock:
    """An exclusive lock held on the file ``path`` with ``fcntl.flock`` (released by the kernel when the process dies,
    so a killed run never leaves it stale), holding ``{"pid", "host"}`` of the holder. A lock file removed by its
    holder while another process waited on it is detected (its inode no longer at ``path``) and the lock taken again
    on the new file.

    Raises:
        OutputError: from :meth:`acquire` when another process holds it: ``<what> is in use by another ds4lab run (PID
            <pid> on <host>)``.
        ImportError: no ``fcntl`` (not POSIX)."""

    def __init__(self, path: Path, what: Path | None = None) -> None:
        self.path = Path(path)
        self.what = Path(what) if what is not None else self.path.parent
        self._fd: int | None = None

    def acquire(self) -> "Lock":
        import fcntl

        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_lock(self.path)
                os.close(fd)
                raise OutputError(f"cannot write results to {self.what}: it is in use by another ds4lab run "
                                  f"(PID {holder.get('pid', '?')} on {holder.get('host', '?')}); wait for it or "
                                  "choose another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its holder removed it between our open and our flock: lock the new file
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
            os.fsync(fd)
            self._fd = fd
            return self
        raise OutputError(f"cannot lock {self.path}: it keeps being replaced by another process")

    def release(self) -> None:
        """Remove the lock file and drop the lock (removal first, so a waiter re-checks the inode)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None


class FolderLock(Lock):
    """The lock inside a result folder (``<folder>/.ds4lab.lock``), as ds4lab held it before result folders were
    staged; :func:`job_folder` now locks ``.<name>.ds4lab.lock`` beside the folder."""

    def __init__(self, folder: Path) -> None:
        super().__init__(Path(folder) / LOCK_NAME, Path(folder))


def _read_lock(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def lock_holder(path: Path) -> dict | None:
    """Who holds the lock file ``path`` now: its ``{"pid", "host"}`` (``{}`` when unreadable), or None when no process
    holds it (or there is no such file). Raises nothing."""
    path = Path(path)
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
        return _read_lock(path)
    except OSError:
        return None
    finally:
        os.close(fd)  # also drops a lock taken just now
    return None


def held_by_live_process(folder: Path) -> bool | None:
    """Whether a process holds the lock of result folder ``folder`` now (the lock beside it, or the one inside it that
    older ds4lab versions held): True / False, None where it cannot be told (no lock file, or ``fcntl`` missing).
    """
    paths = [p for p in (lock_path(folder), Path(folder) / LOCK_NAME) if p.exists()]
    if not paths:
        return None
    return any(lock_holder(p) is not None for p in paths)


def os_reason(e: OSError) -> str:
    """An OSError's reason with its errno name: ``No space left on device (ENOSPC)``."""
    name = _errno.errorcode.get(e.errno or 0)
    return (e.strerror or str(e)) + (f" ({name})" if name else "")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``path.tmp`` and an atomic rename (a partial file never replaces a good one).
    On any error the temporary file is removed.

    Raises:
        WriteFailed: naming ``path`` and the reason (``No space left on device (ENOSPC)``)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteFailed(f"cannot write {path}: {os_reason(e)}", e.errno) from e


@contextlib.contextmanager
def whole_file(path: Path):
    """Write one result file whole or not at all: yields ``path.tmp`` beside ``path`` to write the whole file to,
    renamed to ``path`` when the block ends; on any error (a full disk) or an interrupt the temporary file is
    removed and the exception goes on. A file under its final name is therefore always complete;
    :func:`remove_tmp_files` clears what a killed run left."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        _not_written(e, path)
        raise


def write_csv(df, path: Path, **kwargs) -> None:
    """``df.to_csv(path, **kwargs)`` through :func:`whole_file` (``index=False`` unless given)."""
    kwargs.setdefault("index", False)
    with whole_file(path) as tmp:
        df.to_csv(tmp, **kwargs)


@contextlib.contextmanager
def appending(path: Path):
    """Around an append to a file that grows as a run goes (rows as they come): an append that fails part way (a full
    disk) or is interrupted is cut back to the size the file had before it, and a file it created is removed, so the
    file holds whole rows only. Yields ``path``."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    try:
        yield path
    except BaseException as e:
        with contextlib.suppress(OSError):
            if size is None:
                path.unlink()
            else:
                os.truncate(path, size)
        if size is None:
            _not_written(e, path)
        raise


def _not_written(e: BaseException, path: Path) -> None:
    """Note on ``e`` (``files_not_written``) the file whose write it cut, for ``meta.json``."""
    with contextlib.suppress(Exception):
        e.files_not_written = [*getattr(e, "files_not_written", ()), Path(path).name]


def probe_write(folder: Path) -> None:
    """Create, write and remove a probe file in ``folder`` (raises the OSError of the step that fails)."""
    probe = folder / f".ds4lab-write-probe-{os.getpid()}"
    fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"probe\n")
    finally:
        os.close(fd)
    os.unlink(probe)


def refuse_no_folder(out) -> None:
    """Refuse an ``--out`` that names no folder (None, blanks) or the current directory (click turns ``--out ""`` into
    ``.``)."""
    if out is None or not str(out).strip():
        raise OutputError(f"--out {'' if out is None else str(out)!r} names no folder: name a result folder, "
                          "for example results/<job>")
    if Path(out) == Path("."):
        raise OutputError(f"--out {str(out)!r} names the current directory, not a result folder: name a "
                          "folder, for example results/<job>")


def make_parents(out: Path, fail) -> list[Path]:
    """Create the folders above ``out`` that are missing; returns them, deepest first (for :func:`remove_made`).
    ``fail(reason)`` raises for an ancestor that is a file."""
    made: list[Path] = []
    anc = out.parent
    while not anc.is_dir():
        if anc.exists() or anc.is_symlink():
            fail(f"{anc} is a file, not a folder" if anc.is_file() else f"{anc} is not a folder")
        made.append(anc)
        if anc.parent == anc:
            break
        anc = anc.parent
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(os_reason(e))
    return made


def remove_made(made: list[Path]) -> None:
    """Remove the folders :func:`make_parents` created (deepest first), as long as they are empty."""
    for d in made:  # deepest first; only the (empty) folders this run created
        try:
            d.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break


# ----------------------------------------------------------------------------- signals
_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def stop_signals():
    """SIGTERM and SIGHUP raise :class:`ds4lab.errors.Terminated` (a ``KeyboardInterrupt``) for the duration, as Ctrl-C
    raises ``KeyboardInterrupt``; the previous handlers come back after. Only in the main thread (Python delivers
    signals there), and only where the handler is still the default one (a host that handles them itself, a Jupyter
    kernel, keeps its own)."""
    import threading

    installed = {}
    if threading.current_thread() is threading.main_thread():
        for s in _STOP_SIGNALS:
            if signal.getsignal(s) is signal.SIG_DFL:
                installed[s] = signal.signal(s, _raise_terminated)
    try:
        yield
    finally:
        for s, prev in installed.items():
            signal.signal(s, prev)


def install_stop_signals() -> None:
    """For a command-line process: SIGTERM and SIGHUP raise :class:`ds4lab.errors.Terminated` from now on (main thread,
    default handlers only), so every command stops as on Ctrl-C."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for s in _STOP_SIGNALS:
            if signal.getsignal(s) is signal.SIG_DFL:
                signal.signal(s, _raise_terminated)


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP held pending while the block runs (a swap is not cut in half); they are delivered
    after it."""
    sigs = {signal.SIGINT, *_STOP_SIGNALS}
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    old = mask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


# ----------------------------------------------------------------------------- renames
def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the call is missing or the file
    system does not support it (the caller falls back to two renames)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (_errno.ENOSYS, _errno.EINVAL, _errno.ENOTSUP if hasattr(_errno, "ENOTSUP") else -1):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _mountinfo_points() -> set[str]:
    """The mount points /proc/self/mountinfo lists (empty where there is no such file)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return set()
    points = set()
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:  # the fifth field, with spaces and the like escaped as octal (\\040)
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def is_mount_point(path: Path) -> bool:
    """Whether the folder ``path`` is a mount point (a disk, a container volume, a bind mount): the system's own test
    (another device than its parent) or a line of ``/proc/self/mountinfo`` (a bind mount of a folder of the same
    file system). Such a folder cannot be renamed or replaced (``EBUSY``)."""
    path = Path(path)
    try:
        if not path.is_dir():
            return False
        if os.path.ismount(path):
            return True
    except OSError:
        return False
    return os.path.realpath(path) in _mountinfo_points()


def free_name(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... whichever does not exist yet."""
    p, k = base, 2
    while p.exists() or p.is_symlink():
        p = base.with_name(f"{base.name}-{k}")
        k += 1
    return p


def is_empty_dir(p: Path) -> bool:
    """Whether ``p`` is a folder with nothing in it (False for anything unreadable)."""
    try:
        return p.is_dir() and not any(p.iterdir())
    except OSError:
        return False


def remove_tmp_files(folder: Path) -> None:
    """Remove the temporaries of atomic writes (``*.tmp``) a stopped run left in ``folder``."""
    for f in folder.rglob("*.tmp"):
        with contextlib.suppress(OSError):
            if f.is_file():
                f.unlink()


def load_json_or_none(path: Path):
    """The JSON value in ``path``, or None when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


@contextlib.contextmanager
def output_file(path: Path, what: str, accept=None, refuse=None):
    """One result file written aside and moved into place only on success (``calibrate --out``).

    Yields a temporary path beside ``path`` (``.<name>.<pid>.tmp``); the command writes the whole file there. On
    success it replaces ``path`` atomically (``os.replace``); on an interrupt or a failure it is removed and ``path``
    stays as it was. ``.<name>.ds4lab.lock`` beside it keeps a second run out; SIGTERM and SIGHUP stop the command as
    Ctrl-C does.

    Args:
        what: what the file is, for messages (``calibration``).
        accept: ``accept(existing_path) -> str | None``: for a file already at ``path``, None when ds4lab may replace
            it, else why not (it is refused before any work).
        refuse: ``refuse(path)``: raises for a path ds4lab must never write (a shipped file).

    Raises:
        OutputError: ``path`` is a folder, its folder cannot be made or written, ``accept`` refuses the existing file,
            or another run holds the lock.
        WriteFailed: the file could not be written (names the path)."""
    path = Path(path)
    if not str(path).strip() or path.name in ("", ".", ".."):
        raise OutputError(f"--out {str(path)!r} names no file: name the {what} file to write")
    if refuse is not None:
        refuse(path)

    def fail(reason):
        raise OutputError(f"cannot write the {what} to {path}: {reason}")

    if path.is_dir():
        fail("it is a folder: name the file to write")
    made = make_parents(path, fail)
    lock = Lock(lock_path(path), path)
    try:
        lock.acquire()
    except ImportError:
        lock = None
    except OutputError:
        remove_made(made)
        raise
    except OSError as e:  # a folder that takes no files (/proc, a read-only mount)
        remove_made(made)
        fail(os_reason(e))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.exists() and accept is not None:
            why = accept(path)
            if why:
                fail(f"{why}; ds4lab never replaces files it did not write: move it, or choose another --out")
        try:
            probe_write(path.parent)
        except OSError as e:
            fail(os_reason(e))
        with stop_signals():
            try:
                yield tmp
                os.replace(tmp, path)
            except OSError as e:
                raise WriteFailed(f"cannot write {e.filename or path}: {os_reason(e)}", e.errno) from e
    except OutputError:
        remove_made(made)
        raise
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if lock is not None:
            lock.release()
