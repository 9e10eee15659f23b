"""The file-system pieces of ds4lab's result folders: the errors, the lock, atomic writes, stop signals, the renames
that swap a folder in, one result file written aside (:func:`output_file`). :mod:`ds4lab.report.results` builds the
folder's life cycle on them."""

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
    """A result folder that cannot be created or written, or is in use; the message names the path and why (exit 2)."""


class WriteFailed(RuntimeError):
    """Writing results failed after the work began (a full disk, a quota, an I/O error), naming the file and the
    reason; partial results kept (exit 1). ``errno``: the OS error number."""

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
    """An exclusive ``fcntl.flock`` on ``path`` (released when the process dies), holding the holder's ``{"pid",
    "host"}``; a lock file removed by its holder meanwhile is detected and taken again.

    Raises:
        OutputError: from :meth:`acquire`: ``<what> is in use by another ds4lab run (PID <pid> on <host>)``.
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
    """The lock inside a result folder (``<folder>/.ds4lab.lock``) older ds4lab versions held."""

    def __init__(self, folder: Path) -> None:
        super().__init__(Path(folder) / LOCK_NAME, Path(folder))


def _read_lock(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def lock_holder(path: Path) -> dict | None:
    """The ``{"pid", "host"}`` holding the lock file ``path`` (``{}`` when unreadable), or None when nobody holds it."""
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
    """Whether a process holds ``folder``'s lock (beside it, or the older one inside); None where it cannot be told."""
    paths = [p for p in (lock_path(folder), Path(folder) / LOCK_NAME) if p.exists()]
    if not paths:
        return None
    return any(lock_holder(p) is not None for p in paths)


def os_reason(e: OSError) -> str:
    """An OSError's reason with its errno name: ``No space left on device (ENOSPC)``."""
    name = _errno.errorcode.get(e.errno or 0)
    return (e.strerror or str(e)) + (f" ({name})" if name else "")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``path.tmp`` and an atomic rename (the temporary removed on error). Raises
    :class:`WriteFailed` naming ``path`` and the reason."""
    try:
        with whole_file(path) as tmp:
            tmp.write_text(text)
    except OSError as e:
        raise WriteFailed(f"cannot write {path}: {os_reason(e)}", e.errno) from e


@contextlib.contextmanager
def whole_file(path: Path):
    """Yield ``path.tmp`` to write one whole file to, renamed to ``path`` at the end; on an error or interrupt it is
    removed and the exception goes on (:func:`remove_tmp_files` clears a killed run's)."""
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
    """Around an append to ``path``: a failed or interrupted append is cut back to the old size (a created file
    removed), so the file holds whole rows only."""
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
    """Refuse an ``--out`` that names no folder (None, blanks) or ``.`` (click's ``--out ""``)."""
    if out is None or not str(out).strip():
        raise OutputError(f"--out {'' if out is None else str(out)!r} names no folder: name a result folder, "
                          "for example results/<job>")
    if Path(out) == Path("."):
        raise OutputError(f"--out {str(out)!r} names the current directory, not a result folder: name a "
                          "folder, for example results/<job>")


def make_parents(out: Path, fail) -> list[Path]:
    """Create the missing folders above ``out``, returned deepest first; ``fail(reason)`` for a file ancestor."""
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
    """SIGTERM and SIGHUP raise :class:`ds4lab.errors.Terminated` (a ``KeyboardInterrupt``) for the block, main
    thread and default handlers only; the previous handlers come back after."""
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
    """From now on SIGTERM and SIGHUP raise :class:`ds4lab.errors.Terminated` (main thread, default handlers only)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for s in _STOP_SIGNALS:
            if signal.getsignal(s) is signal.SIG_DFL:
                signal.signal(s, _raise_terminated)


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP held pending while the block runs (a swap is not cut in half)."""
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
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
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
    """Whether the folder ``path`` is a mount point (another device than its parent, or in ``/proc/self/mountinfo``):
    it cannot be renamed (``EBUSY``)."""
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
    """One result file written aside and moved into place only on success (``calibrate --out``): yields
    ``.<name>.<pid>.tmp`` beside ``path``, replaces ``path`` atomically on success, removes it otherwise;
    ``.<name>.ds4lab.lock`` keeps a second run out.

    Args:
        what: what the file is, for messages (``calibration``).
        accept: ``accept(existing_path) -> str | None``: None when ds4lab may replace the file there, else why not.
        refuse: ``refuse(path)``: raises for a path ds4lab must never write (a shipped file).

    Raises:
        OutputError: ``path`` is a folder, its folder cannot be made or written, ``accept`` refuses, or another run
            holds the lock.
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
