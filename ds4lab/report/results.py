"""Result folders: written aside, swapped in only on success, locked, and never left ``running``.

Commands that write a folder go through :func:`job_folder`; ``calibrate`` (one file) through :func:`output_file`.
Next: ``docs/results.md``, "How a result folder lives"; the file-level primitives are in :mod:`.folder_io`."""

from __future__ import annotations

import contextlib
import csv
import fnmatch
import hashlib
import json
import math
import os
import shutil
import socket
import stat
import sys
import time
import traceback
from pathlib import Path

from ..errors import interrupt_status
from .folder_io import (LOCK_NAME, LOCK_SUFFIX, OLD_SUFFIX, STAGING_SUFFIX, FolderLock, Lock,
                        OutputError, WriteFailed, exchange_paths, free_name, held_by_live_process,
                        install_stop_signals, is_empty_dir, is_mount_point, load_json_or_none, lock_holder,
                        lock_path, make_parents, os_reason, output_file, pid_alive, probe_write,
                        refuse_no_folder, remove_made, remove_tmp_files, signals_held, stop_signals,
                        write_text_atomic, appending, whole_file, write_csv)

__all__ = ["LOCK_NAME", "LOCK_SUFFIX", "STAGED_AS_ENV", "FolderLock", "Lock", "OutputError", "ResultsCSV",
           "WriteFailed", "check_out", "final_path", "held_by_live_process", "install_stop_signals", "job_folder",
           "lock_holder", "lock_path", "output_file", "read_meta", "staged_env", "stop_signals", "strict_json",
           "write_meta", "write_text_atomic", "appending", "whole_file", "write_csv"]

#: Files of ds4lab's own in a result folder, whatever the job.
_OWN_FILES = ("meta.json", "meta.json.tmp", LOCK_NAME)

#: Set (by :func:`staged_env`) for a process whose result folders lie inside another run's staging
#: folder: JSON ``[staging, final]``, the absolute paths of that staging folder and of the folder it
#: becomes. ``ds4lab notebooks`` sets it for each notebook's kernel.
STAGED_AS_ENV = "DS4LAB_STAGED_AS"


def staged_env(staging: Path, final: Path) -> dict:
    """The environment of a child writing inside ``staging`` (later ``final``): its :func:`final_path` names
    ``final``."""
    return {STAGED_AS_ENV: json.dumps([os.path.abspath(staging), os.path.abspath(final)])}


def final_path(path) -> Path:
    """``path`` as it will be once the results are in place: inside the folder the :data:`STAGED_AS_ENV` staging folder
    becomes, else ``path`` itself."""
    path = Path(path)
    try:
        staging, final = json.loads(os.environ.get(STAGED_AS_ENV) or "null")
        inside = Path(os.path.abspath(path)).relative_to(staging)
    except (TypeError, ValueError):  # not set, not a pair, or path not inside the staging folder
        return path
    return Path(final) / inside


def strict_json(obj):
    """``obj`` with every non-finite float replaced by None, recursively, so it serializes as strict JSON."""
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
    """Write ``meta`` atomically as indented strict JSON (non-finite numbers → ``null``, other values ``str``). Raises
    :class:`WriteFailed` naming the file."""
    write_text_atomic(path, json.dumps(strict_json(meta), indent=2, default=str, allow_nan=False) + "\n")


def _overwrite_status(path: Path, meta: dict) -> bool:
    """Overwrite ``meta.json`` in place with its status alone (a full disk); returns whether it worked."""
    keep = {k: meta.get(k) for k in ("ds4lab", "job", "status", "run", "status_note") if k in meta}
    keep["status_note"] = "meta.json cut down to its status: the full record could not be written"
    text = json.dumps(strict_json(keep), default=str).encode() + b"\n"
    try:
        with open(path, "r+b") as f:
            f.write(text)
            f.truncate(len(text))
        return True
    except OSError:
        return False


def read_meta(folder: Path) -> dict | None:
    """A result folder's ``meta.json`` as a dict (None when there is none); a ``running`` run that is gone (its lock
    free or
    another's, or its ``pid`` dead on this host) reads ``status: "died"``, ``status_recorded: "running"``.

    Raises:
        ValueError: ``meta.json`` is not a JSON object (the message names the file)."""
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
    if run.get("lock"):
        holder = lock_holder(Path(run["lock"]))
        dead = holder is None or (holder.get("pid") is not None and pid is not None and holder["pid"] != pid)
    else:
        held = held_by_live_process(folder)
        dead = held is False or (held is None and pid is not None and not pid_alive(pid))
    if dead:
        meta["status_recorded"], meta["status"] = "running", "died"
    return meta


def _calibration_identity(meta: dict) -> None:
    """Add ``sha256`` and ``shipped`` to every ``calibration`` dict in ``meta`` that names a ``path``, in place."""
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
    """An append-only tidy CSV (``metric, value, unit, token, source``), flushed after every row; ``source`` says where
    each
    number came from (``modeled (sim, calibration <name>)`` on the sim)."""

    COLUMNS = ("metric", "value", "unit", "token", "source")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(self.COLUMNS)
        self._f.flush()

    def add(self, metric: str, value, unit: str, source: str, token: int | str = "") -> None:
        """Append one row and flush it; a row cut by a full disk is truncated away and the error goes on."""
        at = self._f.tell()
        try:
            self._w.writerow((metric, value, unit, token, source))
            self._f.flush()
        except OSError:
            with contextlib.suppress(OSError, ValueError):
                self._f.truncate(at)
            raise

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ResultsCSV":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_out(out: Path, result_files=()) -> None:
    """Create ``out`` (with parents) and prove it writable; none of ``result_files`` may be a folder or read-only.

    Raises:
        OutputError: ``--out '' names no folder`` or ``cannot write results to <out>: <reason>`` (folders made here are
            removed again)."""
    def fail(reason: str):
        raise OutputError(f"cannot write results to {out}: {reason}")

    if out is None or not str(out).strip():
        refuse_no_folder(out)
    out = Path(out)
    made: list[Path] = []
    try:
        if out.exists() and not out.is_dir():
            fail("it is an existing file, not a folder" if out.is_file() else "it exists and is not a folder")
        made = make_parents(out, fail)
        if not out.is_dir():
            made.insert(0, out)
        try:
            out.mkdir(exist_ok=True)
        except OSError as e:
            fail(os_reason(e))
        try:
            probe_write(out)
        except OSError as e:
            fail(os_reason(e))
        for name in result_files:
            p = out / name
            if p.is_dir():
                fail(f"{p} is a folder, not a file")
            if p.exists() and name != "meta.json" and not os.access(p, os.W_OK):
                fail(f"{p} is not writable")
    except OutputError:
        remove_made(made)
        raise
    except OSError as e:
        raise OutputError(f"cannot write results to {out}: {os_reason(e)}") from None


# ----------------------------------------------------------------------------- one result folder
class _Target:
    """What :func:`job_folder` does, step by step, for one ``out``."""

    def __init__(self, out, job: str | None, outputs, say, ran=None) -> None:
        refuse_no_folder(out)
        self.ran = _plain(ran) if ran is not None else None
        self.ran_before = None  # what the earlier results ran, when it differs from ``ran`` (they stay whole)
        self.shown = final_path(out)  # as the user named it (where it will be: final_path), for messages
        self.job = job
        self.outputs = tuple(outputs)
        self.say = say
        real = Path(os.path.abspath(out))  # where it is written (not shown: that is where it will be)
        if real.is_symlink():  # write where the link points; the link itself stays
            real = Path(os.path.realpath(real))
        if not real.name:
            raise OutputError(f"--out {self.shown}: a file system root is not a result folder")
        here = Path.cwd().resolve()
        if real.exists() and (here == real.resolve() or real.resolve() in here.parents):
            raise OutputError(f"--out {self.shown} holds the current directory: the results would replace the "
                              "folder you are in; name a folder below it, for example results/<job>")
        self.out = real
        self.lock = Lock(lock_path(real), self.shown)
        self.staging = real.parent / f".{real.name}{STAGING_SUFFIX}"
        self.old = real.parent / f".{real.name}{OLD_SUFFIX}"
        self.made: list[Path] = []
        self.prev_files: set[str] | None = None  # what the earlier run in out wrote (None: no earlier run)
        self.prev_sha256: dict[str, str] = {}  # their SHA-256 as its meta.json recorded them (older folders: none)
        self.edited: set[str] = set()  # those changed since: the user's now (:meth:`_drop_edited`)
        self.unverified: set[str] = set()  # those meta.json holds no SHA-256 for: kept like the user's
        self.had_results = False

    # -- before
    def open(self) -> Path:
        def fail(reason):
            raise OutputError(f"cannot write results to {self.shown}: {reason}")

        out = self.out
        if out.exists() and not out.is_dir():
            fail("it is an existing file, not a folder" if out.is_file() else "it exists and is not a folder")
        if is_mount_point(out):  # the finished folder is swapped in by a rename, which a mount point refuses
            fail("it is a mount point (a disk or a volume of its own), and ds4lab puts a finished run in "
                 "place by renaming a folder, which a mount point cannot take (EBUSY); name a folder inside "
                 f"it, for example {self.shown / (self.job or 'results')}")
        self.made = make_parents(out, fail)
        try:
            try:
                self.lock.acquire()
            except ImportError:  # no fcntl (not POSIX): run unlocked
                self.lock = None
            try:
                self._recover()
                self._check_contents()
                self.staging.mkdir()
                probe_write(self.staging)
            except BaseException:
                self._release()
                raise
        except OutputError:
            remove_made(self.made)
            raise
        except OSError as e:
            remove_made(self.made)
            raise OutputError(f"cannot write results to {self.shown}: {os_reason(e)} ({e.filename or self.staging})") \
                from None
        return self.staging

    def _recover(self) -> None:
        """What a run killed outright left beside ``out`` (this run holds the lock: nobody else uses it)."""
        out = self.out
        if self.old.exists():  # a swap cut between its two renames (no renameat2): finish or undo it
            if not out.exists():
                os.rename(self.old, out)
                self._note(f"{self.shown}: put back the earlier results a run stopped while replacing them")
            else:
                shutil.rmtree(self.old, ignore_errors=True)
        if self.staging.exists():
            m = load_json_or_none(self.staging / "meta.json")
            m = m if isinstance(m, dict) else {}
            status = str(m.get("status", "no status"))
            if status == "running":
                m.update(status="died", status_recorded="running",
                         status_note="its process ended without finishing (killed outright)")
                with contextlib.suppress(WriteFailed):
                    write_meta(self.staging / "meta.json", m)
                status = "died"
            tag = "died" if status == "died" else "recovered"
            dest = self._place(self.staging, tag, beside=True)  # never where this run would replace it
            self._note(f"a run of ds4lab {m.get('job', '?')} into {self.shown} was killed (PID "
                       f"{(m.get('run') or {}).get('pid', '?')}); its results (status {status}) are in {dest}")

    def _check_contents(self) -> None:
        """Refuse what this run must not replace (``docs/results.md``, "How a result folder lives")."""
        out = self.out
        if not out.is_dir():
            return
        entries = sorted(p.name for p in out.iterdir())
        if not entries:
            return
        meta_p = out / "meta.json"
        meta = load_json_or_none(meta_p) if meta_p.is_file() else None
        if meta_p.exists() and not (isinstance(meta, dict) and ("ds4lab" in meta or "job" in meta)):
            raise OutputError(f"cannot write results to {self.shown}: its meta.json was not written by ds4lab "
                              "(no \"ds4lab\" or \"job\" key); ds4lab never replaces files it did not write: move "
                              "it, or choose another --out")
        if meta is None:
            mine = [n for n in entries if any(fnmatch.fnmatch(n, pat) for pat in self.outputs)]
            what = (f"files ds4lab would write ({', '.join(mine[:8])}) that it did not write" if mine else
                    f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} ({', '.join(entries[:6])}"
                    f"{', ...' if len(entries) > 6 else ''})")
            raise OutputError(f"cannot write results to {self.shown}: it holds {what} and no ds4lab meta.json, so "
                              "it is not a ds4lab result folder; ds4lab never replaces files it did not write: "
                              "name a new or empty folder, or one ds4lab wrote")
        holder = lock_holder(out / LOCK_NAME)
        if holder is not None:  # an older ds4lab, which locked inside the folder, is writing it
            raise OutputError(f"cannot write results to {self.shown}: it is in use by another ds4lab run (PID "
                              f"{holder.get('pid', '?')} on {holder.get('host', '?')}); wait for it or choose "
                              "another --out")
        other = meta.get("job")
        if self.job and other and other != self.job:
            raise OutputError(f"cannot write {self.job} results to {self.shown}: it holds the results of ds4lab "
                              f"{other} (meta.json job={other!r}); choose another --out, or empty the folder")
        files = meta.get("files")
        self.prev_files = set(files) if isinstance(files, list) else {
            n for n in entries if any(fnmatch.fnmatch(n, pat) for pat in self.outputs)}
        sums = meta.get("file_sha256")
        if isinstance(sums, dict):
            self.prev_sha256 = {n: h for n, h in sums.items() if n in self.prev_files and isinstance(h, str)}
        self.had_results = True
        if self.ran is not None and meta.get("ran") != self.ran:  # another experiment: not a rerun of this one
            self.ran_before = meta.get("ran") if isinstance(meta.get("ran"), dict) else {}

    # -- after
    def finish(self, meta: dict, ok: bool) -> Path:
        """Success: swap staging in; otherwise keep it where the console says. Returns where the results are."""
        if ok:
            return self._commit()
        remove_tmp_files(self.staging)
        tag = "interrupted" if str(meta.get("status", "")).startswith("interrupted") else "failed"
        return self._place(self.staging, tag)

    def _place(self, folder: Path, tag: str, beside: bool = False) -> Path:
        """Put ``folder`` where it destroys nothing: ``out`` if missing or empty (unless ``beside``), else beside."""
        out = self.out
        if not beside and (not out.exists() or is_empty_dir(out)):
            os.rename(folder, out)
            return self.shown
        dest = self._beside(tag)
        os.rename(folder, dest)
        return self.shown.with_name(dest.name)

    def _commit(self) -> Path:
        out, new = self.out, self.staging
        carried = []
        if out.exists():
            self._drop_edited()
        with signals_held():  # the swap is never cut in half (removing the old copy, after it, may be)
            if not out.exists():
                os.rename(new, out)
            else:
                carried = self._swap(out, new)
        if self.old.exists():
            shutil.rmtree(self.old, ignore_errors=True)
        if carried:
            self._note(f"{self.shown}: kept {self._whose(carried)}")
        if self.had_results and self.ran_before is None:
            self._note(f"results in {self.shown}/ (the earlier results there replaced)")
        elif self.say is not None:
            self.say(f"results in {self.shown}/")
        return self.shown

    def _swap(self, out: Path, new: Path) -> list[str]:
        """Swap ``new`` in for ``out``, carrying files ds4lab did not write; returns their names."""
        carried, clash = self._carry(out, new) if self.ran_before is None else ([], [])
        if exchange_paths(new, out):  # new now holds the earlier results
            os.rename(new, self.old)
        else:
            os.rename(out, self.old)
            os.rename(new, out)
        # a user's file named like one this run wrote, or another experiment's results: kept whole, beside
        if clash or self.ran_before is not None:
            dest = self._beside("replaced")
            os.rename(self.old, dest)
            self._note(f"{self.shown}: kept the earlier folder as {dest.name}: it holds {self._whose(clash)}, named "
                       "like files this run wrote" if clash else f"{self.shown}: kept the earlier results as "
                       f"{dest.name}: they ran {_differs(self.ran_before, self.ran)}")
        return carried

    def _beside(self, tag: str) -> Path:
        return free_name(self.out.with_name(f"{self.out.name}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}"))

    def _drop_edited(self) -> None:
        """Files of the earlier run whose SHA-256 no longer matches its ``meta.json``, or that it holds no SHA-256
        for (nothing shows ds4lab wrote them: a hand-written meta.json), become the user's."""
        for name in self.prev_files or ():
            p, digest = self.out / name, self.prev_sha256.get(name)
            if not os.path.lexists(p):
                continue
            if digest is None:
                self.unverified.add(name)
            elif _sha256_of(p) != digest:
                self.edited.add(name)
        if self.prev_files is not None:
            self.prev_files -= self.edited | self.unverified

    def _whose(self, names: list[str]) -> str:
        """``names`` for a message, each said to be not written by ds4lab or changed since it was."""
        user = [n for n in names if n not in self.edited and n not in self.unverified]
        changed = [n for n in names if n in self.edited]
        unproven = [n for n in names if n in self.unverified]
        parts = [f"{', '.join(user)} (not written by ds4lab)"] if user else []
        if unproven:
            parts.append(f"{', '.join(unproven)} (its meta.json holds no SHA-256 showing ds4lab wrote "
                         f"{'it' if len(unproven) == 1 else 'them'})")
        if changed:
            parts.append(f"{', '.join(changed)} (changed since ds4lab wrote {'it' if len(changed) == 1 else 'them'})")
        return " and ".join(parts)

    def _carry(self, old: Path, new: Path) -> tuple[list[str], list[str]]:
        """Move the earlier folder's entries ds4lab did not write into ``new``: ``(moved, left by a name clash)``."""
        own = set(_OWN_FILES) | (self.prev_files or set())
        carried, clash = [], []
        for p in sorted(old.iterdir()):
            if p.name in own or p.name.endswith(".tmp") and p.name[:-4] in own:
                continue
            if (new / p.name).exists():
                clash.append(p.name)
                continue
            os.rename(p, new / p.name)
            carried.append(p.name)
        return carried, clash

    def _note(self, msg: str) -> None:
        if self.say is not None:
            self.say(msg)
        else:
            print(f"ds4lab: {msg}", file=sys.stderr)

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _plain(value):
    """``value`` as it reads back from ``meta.json``, so a recorded ``ran`` compares equal."""
    return json.loads(json.dumps(strict_json(value), default=str))


def _differs(before: dict, now: dict) -> str:
    """The settings that differ, for a message: ``hazards='all' (this run: 'all-longctx')``."""
    if not before:
        return "settings that its meta.json does not record"
    keys = [k for k in dict.fromkeys([*before, *now]) if before.get(k) != now.get(k)]
    return ", ".join(f"{k}={before.get(k)!r} (this run: {now.get(k)!r})" for k in keys) or "other settings"


def _own_files(folder: Path) -> list[str]:
    """The whole top-level entries of ``folder``: ``meta.json`` and unfinished ``*.tmp`` writes left out."""
    return sorted(p.name for p in folder.iterdir() if p.name not in _OWN_FILES and not p.name.endswith(".tmp"))


def _unfinished(folder: Path) -> list[str]:
    """The files whose write had not finished (their ``*.tmp`` temporaries), by their final names."""
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".tmp") and p.name not in _OWN_FILES)


def _sha256_of(path: Path) -> str | None:
    """SHA-256 (hex) of a plain file; None for anything else or an unreadable file."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a link may point at /dev/full or a FIFO
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def _file_sha256(folder: Path, names: list[str]) -> dict[str, str]:
    """``{name: SHA-256}`` of the plain files among ``names``."""
    sums = {n: _sha256_of(folder / n) for n in names}
    return {n: h for n, h in sums.items() if h is not None}


def _failure_status(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"failed: {type(e).__name__}: {first}" if first else f"failed: {type(e).__name__}"


def _as_write_failed(e: OSError, folder: Path) -> WriteFailed:
    """``e`` as a :class:`WriteFailed` naming the file (or the folder)."""
    where = e.filename or f"a file in {folder}"
    return WriteFailed(f"cannot write {where}: {os_reason(e)}", e.errno)


@contextlib.contextmanager
def job_folder(out: Path, meta: dict, outputs=(), on_stop=None, say=None, discard_on=(), ran=None):
    """The life of one result folder around a command's work (``docs/results.md``, "How a result folder lives"): ``with
    job_folder(out, meta, OUTPUTS) as folder:`` and the command writes into ``folder`` (staging), never into ``out``.

    Args:
        out: the result folder (``--out``).
        meta: what ``meta.json`` records; ``job`` names the command. Added here: ``ds4lab``, ``status``, ``run``,
            ``files``, ``files_not_written``, ``file_sha256``, calibration identities, ``traceback``, ``kept_in``.
        outputs: glob patterns of the command's own file names (for older folders without ``files``).
        on_stop: ``on_stop(status)`` on an interrupt or failure; an error in it goes to ``meta["on_stop_error"]``.
        say: prints where results went (default: stderr).
        discard_on: exception types meaning bad input: staging removed, ``out`` untouched.
        ran: what sets this run apart, recorded as ``ran``; earlier results that ran something else are kept as
            ``OUT.replaced-<time>``.

    Status: ``complete``, ``interrupted`` (``(SIGTERM)``, ``(SIGHUP)``) or ``failed: <error>`` (partial results kept,
    the exception goes on; an ``OSError`` as :class:`WriteFailed`). A :class:`ds4lab.errors.CheckFailed` run replaces
    ``out`` with ``status: failed: <check>``.

    Raises:
        OutputError: a bad ``out``, a folder in use, another command's results, or files ds4lab did not write.
        WriteFailed: the results could not be written."""
    from ..errors import CheckFailed

    t = _Target(out, meta.get("job"), outputs, say, ran)
    folder = t.open()
    done = False  # the folder was swapped in or placed: nothing left to do
    try:
        with stop_signals():
            _running(t, meta)
            checked = None
            try:
                write_meta(folder / "meta.json", meta)
                try:
                    yield folder
                finally:
                    _written(folder, meta)
            except CheckFailed as e:  # finished, a check failed: the results stand, with that status
                meta["traceback"] = traceback.format_exc()
                _stopped(on_stop, meta, _failure_status(e), folder)
                checked = e
            except KeyboardInterrupt as e:
                _stopped(on_stop, meta, interrupt_status(e), folder)
                where = _stop(t, meta)
                done = True
                _kept(t, e, where, f"{meta['status']}: partial results in {where}/ (meta.json status {meta['status']!r})")
                raise
            except discard_on:
                shutil.rmtree(folder, ignore_errors=True)
                done = True
                raise
            except BaseException as e:
                # an OSError is a write that failed (a full disk); a closed stdout (`| head`) is not
                err = _as_write_failed(e, folder) if isinstance(e, OSError) and not isinstance(
                    e, BrokenPipeError) else e
                meta["traceback"] = traceback.format_exc()
                _stopped(on_stop, meta, _failure_status(err), folder)
                where = _stop(t, meta)
                done = True
                _kept(t, err, where, f"failed: partial results in {where}/ (meta.json status 'failed')")
                if err is not e:
                    raise err from e
                raise
            else:
                meta["status"] = "complete"
            try:
                _finish(t, folder, meta)
            finally:
                done = True
            if checked is not None:
                raise checked
    finally:
        if not done and folder.exists():  # stopped before its status could be recorded
            if meta.get("status") in (None, "running"):
                meta["status"] = "failed: stopped before the work began"
            with contextlib.suppress(BaseException):
                _stop(t, meta)
        t._release()


def _running(t: _Target, meta: dict) -> None:
    """Mark ``meta`` running: ``ran``, version, ``run`` (pid, host, lock), calibration identities."""
    if t.ran is not None:
        meta["ran"] = t.ran
    meta.setdefault("ds4lab", _version())
    meta["status"] = "running"
    meta["run"] = {"pid": os.getpid(), "host": socket.gethostname(),
                   "lock": str(t.lock.path) if t.lock is not None else None}
    _calibration_identity(meta)


def _written(folder: Path, meta: dict) -> None:
    """Record the whole files (``files``, ``file_sha256``) and the cut ones (``files_not_written``)."""
    meta["files"] = _own_files(folder)
    meta["file_sha256"] = _file_sha256(folder, meta["files"])
    unfinished = sorted({*_unfinished(folder), *getattr(sys.exc_info()[1], "files_not_written", ())})
    if unfinished:
        meta["files_not_written"] = unfinished


def _finish(t: _Target, folder: Path, meta: dict) -> None:
    """Write the finished ``meta.json`` and swap the folder in; :class:`WriteFailed` says where results stay."""
    _calibration_identity(meta)
    try:
        write_meta(folder / "meta.json", meta)
    except WriteFailed as e:
        meta["status"] = _failure_status(e)
        where = _stop(t, meta)
        raise WriteFailed(f"{e}; partial results in {where}/", e.errno) from e
    try:
        t.finish(meta, ok=True)
    except OSError as e:
        raise WriteFailed(f"cannot move the finished results from {folder} to {t.shown}: {os_reason(e)}; they "
                          f"are in {folder} (the next run into {t.shown} moves them beside it)", e.errno) from e


def _kept(t: _Target, e: BaseException, where, line: str) -> None:
    """Say where a stopped run's results are and attach it to the exception going on."""
    t._note(line + _unchanged(t, where))
    _tell(e, where)


def _tell(e: BaseException, where) -> None:
    """Attach where the partial results are (``kept_in``) to ``e``, for the command line's last line."""
    with contextlib.suppress(Exception):
        e.kept_in = str(where)


def _unchanged(t: _Target, where) -> str:
    return f"; the earlier results in {t.shown} are unchanged" if str(where) != str(t.shown) else ""


def _stop(t: _Target, meta: dict) -> Path:
    """Record a stopped run's status, then place its folder; returns where its results are (never raises)."""
    folder = t.staging
    if not folder.exists():
        return t.shown
    with contextlib.suppress(Exception):
        _calibration_identity(meta)
    remove_tmp_files(folder)
    try:
        meta["kept_in"] = str(t.shown)  # corrected below if the results go beside out
        write_meta(folder / "meta.json", meta)
    except WriteFailed:
        _overwrite_status(folder / "meta.json", meta)
    try:
        where = t.finish(meta, ok=False)
    except OSError:
        return folder
    if str(where) != str(t.shown):
        meta["kept_in"] = str(where)
        with contextlib.suppress(WriteFailed):
            write_meta(t.out.with_name(Path(where).name) / "meta.json", meta)
    return where


def _version() -> str:
    from ..version import __version__

    return __version__


def _stopped(on_stop, meta: dict, status: str, folder: Path) -> None:
    """Record ``status``, call ``on_stop`` (its error recorded, not raised), then list the folder's files again."""
    meta["status"] = status
    if on_stop is None:
        return
    try:
        on_stop(meta["status"])
    except Exception as e:  # noqa: BLE001 - keep the original error; say what else went wrong
        meta["on_stop_error"] = f"{type(e).__name__}: {e}"
    with contextlib.suppress(Exception):
        meta["files"] = _own_files(folder)
        meta["file_sha256"] = _file_sha256(folder, meta["files"])
