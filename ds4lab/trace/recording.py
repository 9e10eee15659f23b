"""In-process recording of a decode loop for the audit, through ds4lab's one CUPTI session.

:func:`recording` records a block (a :class:`Recording`: :meth:`~Recording.table`, :meth:`~Recording.save`);
:func:`run_script` runs a script under ``python -m ds4lab.trace.recording`` (:func:`main`) with its passes
beside it: the timed recording, the capture-path pass, the markers pass (the NVTX ranges alone: the loop's
untraced host times) and the argument pass. What is recorded, the command line and the passes:
docs/trace-readers.md ("Recording in process")."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import subprocess
import sys
import time
from pathlib import Path

from . import records as R
from .cupti import AUDIT_KINDS, CuptiSession, CuptiUnavailable, cupti_available, cupti_library
from .sources.common import SourceError
from .stacks import trim_runner

#: Runtime API calls whose Python stack is recorded (CUDA Runtime API names; every version and
#: ``_ptsz``/``_ptds`` variant).
HAZARD_RUNTIME = frozenset({
    "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc", "cudaHostRegister",
    "cudaHostUnregister", "cudaMallocManaged", "cudaMallocPitch", "cudaMalloc3D", "cudaMallocAsync", "cudaFreeAsync",
    "cudaMallocFromPoolAsync", "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol",
    "cudaMemcpyFromSymbol", "cudaMemcpyPeer", "cudaMemset", "cudaMemset2D", "cudaMemset3D", "cudaMemcpyAsync",
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaThreadSynchronize", "cudaEventSynchronize",
    "cudaStreamQuery", "cudaEventQuery", "cudaGraphLaunch", "cudaStreamWaitEvent",
    # a step that asks whether the stream captures may take another path under capture: name its line
    "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo"})
#: Driver API calls whose Python stack is recorded.
HAZARD_DRIVER = frozenset({
    "cuMemAlloc", "cuMemFree", "cuMemAllocHost", "cuMemFreeHost", "cuMemHostAlloc", "cuMemHostRegister",
    "cuMemAllocManaged", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemcpy", "cuMemcpyHtoD", "cuMemcpyDtoH",
    "cuMemcpyDtoD", "cuMemsetD8", "cuMemsetD16", "cuMemsetD32", "cuStreamSynchronize", "cuCtxSynchronize",
    "cuEventSynchronize", "cuStreamQuery", "cuEventQuery", "cuGraphLaunch"})
SAVED_NAME = "recording.csv.gz"
#: Activity kinds of the markers pass: the NVTX ranges alone.
MARKER_KINDS = ("MARKER",)
#: The markers pass's file beside ``<stem>.csv.gz``, and its header's ``pass``.
MARKERS_SUFFIX, MARKERS_PASS = ".markers.csv.gz", "markers"
#: Header keys of a saved recording that name the step it recorded (``audit validate``'s runs, ``audit run``'s
#: script): a pass beside a recording whose keys differ from the recording's belongs to another step.
STEP_KEYS = ("engine", "cache", "dtype", "argv")


class Recording:
    """What :func:`recording` recorded: the trace model's records, the Python stacks of the watched calls, and
    the session's notes. :meth:`table` and :meth:`save` may be called once the block has ended."""

    def __init__(self, session: CuptiSession, stacks: bool) -> None:
        self.session = session
        self.want_stacks = stacks
        self.records: list = []
        self.stacks: dict[int, str] = {}
        self.notes: list[str] = []
        self.legacy: dict[int, str] = {}
        self.pid = os.getpid()
        self.done = False
        self.trim = False
        self._table = None
        self.arguments = None      # ds4lab.trace.arguments.ArgumentStore of an argument pass
        self.own_calls: list = []  # (thread, t0, t1): the argument capture's own CUDA calls, left out
        self.host_ranges: list = []  # (name, t0, t1) on CUPTI's clock: see :meth:`host_range`

    @contextlib.contextmanager
    def host_range(self, name: str):
        """Mark the block as a range ``name`` on CUPTI's own clock (this thread). Where the recording holds no
        NVTX range of ``name`` at its end (NVTX reaches CUPTI only with ``NVTX_INJECTION64_PATH`` set), these ranges
        are tabled in its place (domain :data:`HOST_RANGE_DOMAIN`, with a note)."""
        t0 = self.session.timestamp()
        try:
            yield
        finally:
            self.host_ranges.append((name, t0, self.session.timestamp(), threading.get_native_id()))

    def table(self):
        """The recording as an :class:`~ds4lab.trace.events.EventTable` (``source`` ``"<recording>"``, ``tool``
        ``"cupti"``). Raises RuntimeError inside the block."""
        if not self.done:
            raise RuntimeError("the recording is still running: call table() after the with block")
        if self._table is None:
            self._table = _to_table(self)
        return self._table

    def save(self, path, **extra) -> Path:
        """Write :meth:`table` to ``path`` (a folder: ``path/recording.csv.gz``) as a saved event table, ``extra``
        in its header (an argument pass's store beside it). Returns the file."""
        from .sources.saved import write_table

        p = Path(path)
        if p.is_dir() or not p.suffix:
            p.mkdir(parents=True, exist_ok=True)
            p = p / SAVED_NAME
        out = write_table(self.table(), p, **extra)
        if self.arguments is not None:  # the argument pass's store beside its table
            from . import arguments as A

            self.arguments.table = p.name
            A.save(self.arguments, store_path(p))
        return out


def store_path(table_path: Path) -> Path:
    """A recording's argument store: ``arguments.json.gz`` beside ``arguments.csv.gz``, else
    ``<stem>.arguments.json.gz``."""
    from .arguments import STORE_NAME, STORE_SUFFIX

    p = Path(table_path)
    stem = p.name.split(".", 1)[0]
    return p.with_name(STORE_NAME if stem == "arguments" else stem + STORE_SUFFIX)


def markers_name(recording) -> Path:
    """Where the markers pass of ``recording`` goes: ``<stem>.markers.csv.gz`` beside it (the whole stem)."""
    from .capture_path import trace_stem

    recording = Path(recording)
    return recording.with_name(trace_stem(recording) + MARKERS_SUFFIX)


def is_markers(path) -> bool:
    """Whether ``path`` names a markers pass (``*.markers.csv.gz``)."""
    return Path(str(path)).name.endswith(MARKERS_SUFFIX)


def markers_beside(recording) -> Path | None:
    """The markers pass saved beside ``recording``, or None (also for a markers or capture-path pass itself)."""
    from .capture_path import is_capture_path

    if recording is None or is_markers(recording) or is_capture_path(recording):
        return None
    p = markers_name(recording)
    return p if p.is_file() else None


@contextlib.contextmanager
def recording(*, stacks: bool = True, arguments: bool = False, token_range: str | None = None, tokens=None,
              markers_only: bool = False):
    """Record the block's CUDA activity; yields a :class:`Recording`.

    ``stacks``: the Python stacks of the hazard-class calls; ``markers_only``: the NVTX ranges alone (the
    markers pass); ``arguments``: also every launch's parameter bytes and the allocations (an argument pass:
    do not time it), ``token_range`` the NVTX range of a token (None: found by itself) and ``tokens(table,
    token_range)`` how the pass's tokens are found (a :class:`~ds4lab.trace.arguments.TokenLaunches`, raising
    :class:`~ds4lab.errors.BadInput` when there are none; without it every distinct value is kept, said).
    Raises SourceError: ``cupti-python`` missing, or CUPTI refusing to start (naming what is missing)."""
    ok, why = cupti_available()
    if not ok:
        raise SourceError(f"cannot record: {why}")
    try:
        session = CuptiSession.get()
        _system_thread_ids(session)
        kinds = MARKER_KINDS if markers_only else AUDIT_KINDS + (("MEMORY2",) if arguments else ())
        sub = session.subscribe(kinds)
    except CuptiUnavailable as e:
        raise SourceError(f"cannot record: {e}") from None
    if markers_only:
        stacks = arguments = False
    rec = Recording(session, stacks)
    for k, why in session.refused.items():
        if k in kinds:
            rec.notes.append(f"CUPTI refused activity kind {k} ({why}): its rows are missing")
    watch = None
    if stacks:
        try:
            watch = session.watch_calls(HAZARD_RUNTIME, HAZARD_DRIVER)
        except CuptiUnavailable as e:
            rec.notes.append(f"no Python stacks: {e}")
    capture = mem = None
    if arguments:
        capture, mem = _start_arguments(session, rec, stacks)
    try:
        yield rec
    finally:
        try:
            rec.legacy = _legacy_streams(session, rec.notes)
            if capture is not None:
                capture.stop()
                if getattr(mem, "ops", None) is not None:
                    mem.ops.stop()
                mem.stop()
            rec.records = sub.take()
            _host_ranges_as_markers(rec)
        finally:
            sub.close()
            if watch is not None:
                rec.stacks = dict(watch.stacks)
                watch.close()
            rec.done = True
        if capture is not None:
            _finish_arguments(rec, capture, mem, token_range, tokens)


#: The domain of a range :meth:`Recording.host_range` tabled in place of a missing NVTX range.
HOST_RANGE_DOMAIN = "ds4lab-host-clock"


def _host_ranges_as_markers(rec: Recording) -> None:
    """Append ``rec.host_ranges`` as marker start/end pairs for each name no NVTX range carries."""
    if not rec.host_ranges:
        return
    have = {r.name for r in rec.records if isinstance(r, R.Marker) and r.phase == "start"}
    missing = sorted({n for n, *_ in rec.host_ranges} - have)
    if not missing:
        return
    ids = [r.id for r in rec.records if isinstance(r, R.Marker)]
    next_id = max(ids, default=0) + 1
    n = 0
    for name, t0, t1, tid in rec.host_ranges:
        if name in missing:
            rec.records.append(R.Marker(phase="start", timestamp_ns=t0, id=next_id, name=name,
                                        domain=HOST_RANGE_DOMAIN, pid=rec.pid, tid=tid))
            rec.records.append(R.Marker(phase="end", timestamp_ns=t1, id=next_id, pid=rec.pid, tid=tid))
            next_id += 1
            n += 1
    rec.notes.append(f"no NVTX range {', '.join(missing)} reached CUPTI (NVTX_INJECTION64_PATH="
                     f"{os.environ.get('NVTX_INJECTION64_PATH') or 'unset'}): {n} ranges tabled from CUPTI "
                     f"timestamps taken on the host around each (domain {HOST_RANGE_DOMAIN})")


def _start_arguments(session, rec, stacks: bool):
    """An argument pass's capture and allocation tracker, started (or None, None with a note saying why not)."""
    from .arguments import ArgumentCapture, MemoryTracker

    capture = ArgumentCapture(session, stacks=stacks)
    try:
        capture.start()
    except (CuptiUnavailable, OSError) as e:
        rec.notes.append(f"no kernel arguments: {e}")
        return None, None
    mem = MemoryTracker(session.timestamp)
    mem.start()
    if mem.torch is not None:  # the framework's operators, for telling set words from unset ones
        from .torch_ops import OpLog

        mem.ops = OpLog(mem.torch, session.timestamp)
        try:
            mem.ops.start()
            capture.current_op = mem.ops.current
        except Exception as e:  # noqa: BLE001 - a torch without dispatch modes: no op log, said
            rec.notes.append(f"no operator log ({type(e).__name__}: {e}): unset words are not told from values")
            mem.ops = None
    return capture, mem


def _finish_arguments(rec, capture, mem, token_range, tokens=None) -> None:
    """The pass's :class:`~ds4lab.trace.arguments.ArgumentStore`, pruned to the bytes where tokens differ."""
    from ..errors import BadInput
    from . import arguments as A

    rec.own_calls = list(capture.own)
    launches, blobs = capture.digests()  # digested here, once per distinct value, never in the hot path
    store = A.ArgumentStore(functions={k: {"name": v.name, "params": v.params, "why": v.why}
                                       for k, v in capture.functions.items()},
                            launches=launches, blobs=blobs, stacks=dict(capture.stacks),
                            token_range=token_range, notes=[*capture.notes, *mem.notes])
    store.allocations = A.cupti_allocations(rec.records) + mem.allocations()
    store.segments = [list(s) for s in mem.segments] if mem.torch is not None else None
    store.host_maps = A.host_maps()
    log = getattr(mem, "ops", None)
    if log is not None:
        store.ops = dict(enumerate(log.ops))
        store.op_of = dict(capture.op_of)
        store.notes.extend(log.notes)
    for why, n in capture.unread.most_common():
        store.notes.append(f"{n:,} launch(es) unread: {why}")
    rec.arguments = store
    if tokens is None:
        store.notes.append("tokens not looked for in the argument pass (no token finder given)")
        tl = None
    else:
        try:
            tl = tokens(rec.table(), token_range)
        except BadInput as e:  # ds4lab.audit.tokens.NoTokens
            store.notes.append(f"tokens not found in the argument pass ({e})")
            tl = None
    A.prune(store, tl)
    if tl is not None:
        store.ranges = capture.resolve_ranges(A.varying_words(store, tl))


def _own_call(rec, domain, cbid, tid, t0) -> bool:
    """Whether an API record is one of the argument capture's own queries."""
    from .arguments import OWN_CALLS

    if rec.session.callback_name(domain, cbid) not in OWN_CALLS:
        return False
    return any(t == tid and a <= t0 <= b for t, a, b in rec.own_calls)


def _system_thread_ids(session) -> None:
    """Thread ids as the OS numbers them, to match ``threading.get_native_id()`` (CUPTI's default: ``pthread_self``)."""
    T = getattr(session.c, "ActivityThreadIdType", None)
    if T is not None and hasattr(T, "SYSTEM"):
        with contextlib.suppress(Exception):
            session.c.set_thread_id_type(T.SYSTEM)


def _legacy_streams(session, notes) -> dict:
    """:meth:`~ds4lab.trace.cupti.CuptiSession.stream_types_now`, or {} with a note saying why not."""
    try:
        return session.stream_types_now()
    except Exception as e:  # noqa: BLE001 - no driver, or a binding without the call
        notes.append(f"the legacy stream's id was not asked of CUPTI ({type(e).__name__}: {e}): streams created "
                     "before the recording are of unknown type")
        return {}


def demangle(names) -> dict:
    """``{mangled: demangled}`` for the C++ names among ``names``, through ``c++filt`` when on PATH; {} otherwise."""
    mangled = sorted({n for n in names if n.startswith("_Z")})
    exe = shutil.which("c++filt")
    if not mangled or exe is None:
        return {}
    try:
        r = subprocess.run([exe], input="\n".join(mangled), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = r.stdout.splitlines()
    return dict(zip(mangled, out)) if r.returncode == 0 and len(out) == len(mangled) else {}


def _to_table(rec: Recording):
    from .events import EventTable
    from .table import Rows, finish

    s = rec.session
    rows = Rows()
    notes = list(rec.notes)
    events, made = R.api_context(rec.records)
    types = {**made, **rec.legacy}  # the context's own streams first: CUPTI names only streams made while recording
    dem = demangle({r.name: None for r in rec.records if isinstance(r, R.Kernel)})
    open_markers: dict[int, R.Marker] = {}
    marks = own = 0
    for r in rec.records:
        if isinstance(r, R.ApiCall):
            if rec.own_calls and _own_call(rec, r.domain, r.cbid, r.tid, r.start_ns):
                own += 1
                continue
            stream, ev = events.get(r.correlation, (None, None))
            stack = rec.stacks.get(r.correlation)
            if stack and rec.trim:
                stack = trim_runner(stack)
            rows.add(kind="api", name=r.name or s.callback_name(r.domain, r.cbid), domain=r.domain, pid=r.pid,
                     tid=r.tid, start_ns=r.start_ns, end_ns=r.end_ns, correlation=r.correlation, stack=stack,
                     stream=stream, event=ev)
        elif isinstance(r, R.Kernel):
            rows.add(**{**r.cells(), "name": dem.get(r.name, r.name)}, pid=rec.pid)
        elif isinstance(r, (R.Copy, R.Memset, R.GraphExec)):
            rows.add(**r.cells(), pid=rec.pid)
        elif isinstance(r, R.Sync):
            rows.add(kind="sync", name=r.name, sync_kind=r.sync_kind, start_ns=r.start_ns, end_ns=r.end_ns,
                     correlation=r.correlation, pid=rec.pid, stream=None if r.stream < 0 else r.stream,
                     event=None if r.event < 0 else r.event)
        elif isinstance(r, R.Marker):
            if r.phase == "start":
                open_markers[r.id] = r
            elif r.phase == "end" and r.id in open_markers:
                m0 = open_markers.pop(r.id)
                rows.add(kind="nvtx", name=m0.name, domain=m0.domain, pid=m0.pid if m0.pid >= 0 else rec.pid,
                         tid=m0.tid, start_ns=m0.timestamp_ns, end_ns=r.timestamp_ns)
            else:
                marks += 1
    if own:
        notes.append(f"{own:,} CUDA calls ds4lab made to read kernel parameters (cuFuncGetParamInfo, "
                     "cudaGetFuncBySymbol) left out")
    if rec.arguments is not None:
        n = len(rec.arguments.launches)
        unread = sum(1 for _, d in rec.arguments.launches.values() if d is None)
        notes.append(f"kernel arguments recorded at {n:,} launches ({unread:,} unread): an argument pass, "
                     "its times carry the capture's cost")
    if open_markers:
        notes.append(f"{len(open_markers)} NVTX ranges still open when the recording ended: not tabled")
    if marks:
        notes.append(f"{marks} NVTX marks (instantaneous) not tabled")
    if rec.want_stacks and rec.stacks:
        notes.append(f"Python stacks recorded at {len(rec.stacks):,} hazard-class CUDA calls (CUPTI callbacks)")
    if s.dropped:
        notes.append(f"{s.dropped:,} CUPTI records of kinds no subscription asked for were dropped")
    df = rows.frame()
    df = finish(df, {(-1, sid): t for sid, t in types.items()})
    if not len(df):
        notes.append("nothing was recorded: no CUDA activity ran inside the recording")
    ver = getattr(s.c, "__version__", "") or _dist_version("cupti-python")
    tool = (f"cupti (cupti-python {ver})" if ver else "cupti") + _gpu_label()
    return EventTable(df, "<recording>", tool, notes)


def _gpu_label() -> str:
    """`` on <GPU>, driver <version>`` from ``nvidia-smi`` (the first GPU); "" where it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
        name, driver = (x.strip() for x in out[0].split(",", 1))
        return f" on {name}, driver {driver}"
    except Exception:  # noqa: BLE001 - provenance only: no nvidia-smi, no GPU
        return ""


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


# ----------------------------------------------------------------------------- running a script
def _strip_python(argv: list[str]) -> list[str]:
    argv = list(argv)
    if argv and (Path(argv[0]).name.startswith("python") or argv[0] == sys.executable):
        argv = argv[1:]
    return argv


def run_script(argv: list[str], out: Path, console=None, *, arguments: bool = False,
               token_range: str | None = None, capture_path: bool = True, markers: bool = True,
               seconds: dict | None = None) -> Path:
    """Run ``python argv...`` (a subprocess, ``python -m ds4lab.trace.recording``) recorded and return the saved
    table (``out/recording.csv.gz``, or ``out`` when it ends in ``.gz``). A leading ``python`` is dropped; ``-m
    module`` runs a module; ``NVTX_INJECTION64_PATH`` is set to the CUPTI library unless set. The script's exit
    status is in the saved header and notes. Beside it (docs/trace-readers.md): ``capture_path``, the
    capture-path pass where the script asks from Python whether the stream captures; ``markers``, the markers
    pass; ``arguments``, the argument pass. ``seconds``: filled with each pass's wall-clock seconds.
    Raises SourceError: no script given; ``cupti-python`` missing; the recording could not start; nothing saved."""
    argv = _strip_python(argv)
    if not argv:
        raise SourceError("ds4lab audit run: no script given (… run -- python my_decode.py ARGS)")
    ok, why = cupti_available()
    if not ok:
        raise SourceError(f"cannot record: {why}")
    out = Path(out)
    target = out if out.name.endswith(".gz") else out / SAVED_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    err = target.with_name(target.name + ".error.txt")
    from .capture_path import asks_capture_status, capture_path_name

    third = capture_path_name(target)
    marks = markers_name(target)
    for p in (target, err, third, third.with_name(third.name + ".error.txt"), marks,
              marks.with_name(marks.name + ".error.txt"),
              *((target.with_name("arguments.csv.gz"), target.with_name("arguments.json.gz"),
                 target.with_name("arguments.csv.gz.error.txt")) if arguments else ())):
        if p.exists():
            p.unlink()
    env = dict(os.environ)
    lib = cupti_library()
    if lib is not None and not env.get("NVTX_INJECTION64_PATH"):
        env["NVTX_INJECTION64_PATH"] = str(lib)
    say = console.print if console is not None else (lambda *a, **k: None)
    say(f"recording: {' '.join(argv)}")
    took = seconds if seconds is not None else {}
    clock = time.monotonic()
    rc = _run_pass([sys.executable, "-m", "ds4lab.trace.recording", "--out", str(target), "--", *argv], env, say)
    took["timed"] = round(time.monotonic() - clock, 1)
    if err.is_file():
        raise SourceError(err.read_text().strip())
    if not target.is_file():
        raise SourceError(f"ds4lab audit run: {' '.join(argv)} exited with status {rc} and saved no recording "
                          f"({target})")
    say(f"recorded to {target}" + (f" (the script exited with status {rc})" if rc else ""))
    if capture_path:
        from .sources import read_events

        frame = read_events(target).frame
        asked = asks_capture_status(frame)
        if asked and not _python_may_ask(frame):
            say(f"the script asked {asked} times whether the stream captures, every time from C/C++ (no recorded "
                "stack passes through torch.cuda.is_current_stream_capturing): no capture-path pass, it would run "
                "the recorded path again")
        elif asked:
            say(f"the script asked {asked} times whether the stream captures: recording its capture path (a pass "
                f"with torch.cuda.is_current_stream_capturing() answering yes): {' '.join(argv)}")
            took["capture_path"] = _optional_pass(["--as-if-capturing", "--", *argv], third, env, say,
                                                  "no capture-path pass", f"capture path recorded to {third}")
    if markers:
        say(f"recording the NVTX ranges alone (the markers pass: untraced host times): {' '.join(argv)}")
        took["markers"] = _optional_pass(["--markers", "--", *argv], marks, env, say,
                                         "no markers pass (the plans price the loop at its traced cost)",
                                         f"NVTX ranges of an untraced run recorded to {marks}")
    if arguments:
        second = target.with_name("arguments.csv.gz")
        say(f"recording kernel arguments (a second pass, untimed): {' '.join(argv)}")
        extra = ["--token-range", token_range] if token_range else []
        # the audit's runner: the recording runner with the audit's token finder (ds4lab.audit.arguments)
        took["arguments"] = _optional_pass(["--arguments", *extra, "--", *argv], second, env, say,
                                           "no kernel arguments", f"kernel arguments recorded to {store_path(second)}",
                                           module="ds4lab.audit.arguments")
    return target


def _python_may_ask(frame) -> bool:
    """Whether any call of ``frame`` asking whether the stream captures may have come through PyTorch's Python."""
    from .capture_path import CAPTURE_STATUS_CALLS

    api = frame[frame["kind"] == "api"]
    ask = api[api["name"].astype(str).map(lambda n: R.api_base_name(n) in CAPTURE_STATUS_CALLS).astype(bool)]
    stacks = ask["stack"].fillna("").astype(str) if "stack" in ask else None
    if stacks is None or (stacks == "").any():
        return True
    return bool(stacks.str.contains("is_current_stream_capturing", regex=False).any())


def _optional_pass(args: list, out: Path, env: dict, say, missing: str, done: str,
                   module: str = "ds4lab.trace.recording") -> float:
    """Run ``python -m module --out out args...`` beside the timed recording; ``done`` is said where it saved
    ``out``, ``missing`` where it failed. Returns its wall-clock seconds."""
    clock = time.monotonic()
    rc = _run_pass([sys.executable, "-m", module, "--out", str(out), *args], env, say)
    err = out.with_name(out.name + ".error.txt")
    if err.is_file() or not out.is_file():
        say(f"{missing}: the pass exited with status {rc}" + (f": {err.read_text().strip()}" if err.is_file() else ""))
    else:
        say(done)
    return round(time.monotonic() - clock, 1)


def _run_pass(cmd: list, env: dict, say) -> int:
    """Run one recording pass (a subprocess); Ctrl-C waits for it to save what it recorded."""
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        say("interrupted: waiting for the script to save what it recorded")
        try:
            return proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def _load_torch() -> str:
    """Import torch and initialize CUDA before an argument pass's script (the op log and the caching allocator's
    blocks are followed only from then on). Returns the note saying so ("" without torch or CUDA)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return ""
    try:
        import torch

        if not torch.cuda.is_available():
            return ""
        torch.cuda.init()
    except Exception as e:  # noqa: BLE001 - the pass goes on without the op log: said
        return f"torch could not be started before the script ({type(e).__name__}: {e}): no operator log"
    return ("torch imported and its CUDA side initialized before the script (an argument pass: PyTorch's operators "
            "and the caching allocator's blocks are followed from the start)")


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def main(argv=None, tokens=None) -> int:
    """The runner: ``python -m ds4lab.trace.recording``. Returns the script's exit status (130 after Ctrl-C).
    ``tokens``: an argument pass's token finder (:func:`recording`)."""
    import runpy
    import traceback

    import click

    @click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
                  help="The saved table (gzip CSV).")
    @click.option("--no-stacks", is_flag=True, help="Record no Python stacks (no CUPTI callbacks).")
    @click.option("--arguments", is_flag=True, help="An argument pass: every launch's parameters (untimed).")
    @click.option("--token-range", default=None, help="The NVTX range marking a token (argument pass).")
    @click.option("--as-if-capturing", is_flag=True,
                  help="The capture-path pass: torch.cuda.is_current_stream_capturing() answers yes "
                       "(ds4lab.trace.capture_path).")
    @click.option("--markers", is_flag=True,
                  help="The markers pass: the NVTX ranges alone (CUPTI MARKER activity), the loop untraced.")
    @click.argument("script", nargs=-1, type=click.UNPROCESSED, required=True)
    def cli(out, no_stacks, arguments, token_range, as_if_capturing, markers, script):
        script = _strip_python(list(script))
        status = 0
        err = out.with_name(out.name + ".error.txt")
        path = contextlib.ExitStack()
        try:
            if as_if_capturing:
                from .capture_path import as_if_capturing as _as_if

                asked = path.enter_context(_as_if())
            loaded = _load_torch() if arguments else ""
            ctx = recording(stacks=not no_stacks, arguments=arguments, token_range=token_range, tokens=tokens,
                            markers_only=markers)
            rec = ctx.__enter__()
            rec.trim = True
            if loaded:
                rec.notes.append(loaded)
        except (SourceError, ImportError) as e:
            path.close()
            err.write_text(str(e) + "\n")
            raise SystemExit(2) from None
        argv0, path0 = list(sys.argv), list(sys.path)
        try:
            sys.argv = list(script if script[0] != "-m" else script[1:])
            try:
                if script[0] == "-m":
                    runpy.run_module(script[1], run_name="__main__", alter_sys=True)
                else:
                    sys.path.insert(0, str(Path(script[0]).resolve().parent))
                    runpy.run_path(script[0], run_name="__main__")
            except SystemExit as e:
                status = _exit_code(e)
            except KeyboardInterrupt:
                traceback.print_exc()
                status = 130
            except BaseException:  # noqa: BLE001 - the script's own error: shown, its recording kept
                traceback.print_exc()
                status = 1
        finally:
            sys.argv, sys.path[:] = argv0, path0
            ctx.__exit__(None, None, None)
            path.close()
            if as_if_capturing and not asked.count:  # the recorded path again: nothing to keep
                from .capture_path import NOT_ASKED

                err.write_text(NOT_ASKED + "\n")
            else:
                extra = ({"capture_path_asked": asked.count} if as_if_capturing else
                         {"pass": MARKERS_PASS} if markers else {})
                rec.save(out, exit_status=status, argv=list(script), source=" ".join(script), **extra)
        raise SystemExit(status)

    try:
        cli.main(args=argv, prog_name="python -m ds4lab.trace.recording", standalone_mode=False)
    except SystemExit as e:
        return _exit_code(e)
    except click.ClickException as e:
        e.show()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
