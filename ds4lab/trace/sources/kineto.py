"""Chrome Trace Event JSON into the event table (yields an event table): PyTorch profiler (Kineto) traces and ds4lab's
own ``trace.json``, streamed with ``ijson`` (one event at a time; plain or gzip). The categories each dialect gives,
what is counted and left out, and what makes an event malformed: ``docs/trace-readers.md``, "Chrome Trace Event
JSON"."""

from __future__ import annotations

import gzip
import io
import math
import re
import zlib
from array import array
from pathlib import Path

from ..records import api_base_name, host_memory, parse_copy_label, sync_kind_of_label
from ..stacks import short_path
from ..table import MAX_NS, Rows, finish
from .common import CountingReader, Progress, SourceError, head_bytes

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"kineto": "a PyTorch profiler / Kineto trace", "ds4lab-trace": "a ds4lab trace.json"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("events",)
TORCH_DOMAIN = "torch.record_function"
_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")
#: JSON's forbidden numbers, as ``json.dumps`` and other writers spell them.
_NOT_JSON = ("NaN", "-Infinity", "Infinity")
#: The categories read (module docstring); every other one is counted and named in the notes.
_READ = ("cuda_runtime", "cuda_driver", "python_function", "user_annotation", "nvtx", "kernel", "gpu_memcpy",
         "gpu_memset", "cuda_sync", "cuda_event")
_ALIAS = {"runtime": "cuda_runtime", "driver": "cuda_driver", "memcpy": "gpu_memcpy", "memset": "gpu_memset",
          "concurrent_kernel": "kernel"}


def looks_like(head: bytes) -> str | None:
    """``"kineto"`` or ``"ds4lab"`` when ``head`` (a file's first decompressed bytes) starts a Chrome trace (an object
    with ``traceEvents``, or an array of events with ``ph``); None otherwise."""
    h = head.lstrip()
    if h[:1] == b"{" and b'"traceEvents"' in head:
        return "ds4lab" if re.search(rb'"otherData"\s*:\s*\{[^{}]*"ds4lab"\s*:', head) else "kineto"
    if h[:1] == b"[" and b'"ph"' in head[:4096]:
        return "kineto"
    return None


def frame_name(raw: str) -> str:
    """A Kineto ``python_function`` name as a stack frame (``short_path:line function``), addresses removed."""
    m = _FRAME.match(raw)
    if m:
        return f"{short_path(m.group(1))}:{m.group(2)} {m.group(3)}"
    return _ADDR.sub("", raw)


def _ns(v) -> int:
    """A time in µs (a JSON number) as integer ns; -1 for none. The caller has checked it (:meth:`_State.time`)."""
    return -1 if v is None else int(round(float(v) * 1000.0))


def _dims(v) -> str:
    if isinstance(v, (list, tuple)) and v:
        return ",".join(str(int(x)) for x in v)
    return ""


def _int(v, default=-1) -> int:
    try:
        return default if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return default


class _Frames:
    """Python frames per host thread, compactly: start, end and a name id each."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ids: dict[str, int] = {}
        self.by_thread: dict[tuple, tuple] = {}

    def add(self, pid, tid, start, end, name) -> None:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(frame_name(name))
        t = self.by_thread.get((pid, tid))
        if t is None:
            t = self.by_thread[(pid, tid)] = (array("q"), array("q"), array("q"))
        t[0].append(start)
        t[1].append(end)
        t[2].append(i)

    def __len__(self) -> int:
        return sum(len(t[0]) for t in self.by_thread.values())

    def stacks(self, calls: dict, rows: Rows) -> int:
        """Set the ``stack`` of each API row in ``calls`` (``{(pid, tid): [(start, row), ...]}``) to the frames
        enclosing it, outermost first; returns how many rows got one."""
        import numpy as np

        done = 0
        stack_col = rows.strs["stack"]
        cache: dict[tuple, str] = {}
        for key, lst in calls.items():
            t = self.by_thread.get(key)
            if t is None or not lst:
                continue
            fs = np.frombuffer(t[0], dtype=np.int64)
            fe = np.frombuffer(t[1], dtype=np.int64)
            fn = np.frombuffer(t[2], dtype=np.int64)
            order = np.lexsort((-fe, fs))
            fs, fe, fn = fs[order], fe[order], fn[order]
            lst.sort()
            st: list = []
            fi, n = 0, len(fs)
            for t0, row in lst:
                while fi < n and fs[fi] <= t0:
                    while st and fe[st[-1]] <= fs[fi]:
                        st.pop()
                    st.append(fi)
                    fi += 1
                while st and fe[st[-1]] <= t0:
                    st.pop()
                if st:
                    k = tuple(int(fn[j]) for j in st)
                    s = cache.get(k)
                    if s is None:
                        s = cache[k] = rows.intern(";".join(self.names[j] for j in k))
                    stack_col[row] = s
                    done += 1
        return done


def _open(path: Path, progress: Progress | None):
    """(CountingReader over the decompressed bytes, the raw file, whether gzip)."""
    raw = open(path, "rb")
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return CountingReader(gzip.GzipFile(fileobj=raw), progress, raw), raw, True
    return CountingReader(raw, progress), raw, False


def _meta(head: bytes) -> dict:
    """The top-level keys before ``traceEvents`` (Kineto's metadata; ds4lab's ``otherData``)."""
    import ijson

    meta = {}
    try:
        for k, v in ijson.kvitems(io.BytesIO(head), "", use_float=True):
            if k == "traceEvents":
                break
            meta[k] = v
    except (ijson.JSONError, ValueError):
        pass
    return meta


def read_chrome(path: Path, dialect: str, progress=None):
    """Read a Chrome trace of ``dialect`` (``"kineto"`` or ``"ds4lab"``) into an
    :class:`~ds4lab.trace.events.EventTable`; ``progress`` over the file's bytes. Raises SourceError: cut (the byte
    offset), invalid JSON (``NaN``/``Infinity`` named, with event and field), an event time not a number, or no CUDA
    activity (naming what it holds)."""
    import ijson

    from ..events import EventTable

    path = Path(path)
    head = head_bytes(path, 1 << 16)
    meta = _meta(head)
    other = meta.get("otherData") or {}
    st = _State(dialect, other, path)
    prefix = "item" if head.lstrip()[:1] == b"[" else "traceEvents.item"
    size = path.stat().st_size
    with Progress(progress, f"reading {path.name}", size) as prog:
        reader, raw, gz = _open(path, prog)
        n = 0
        try:
            for ev in ijson.items(reader, prefix, use_float=True):
                st.event(ev, n)
                n += 1
        except ijson.JSONError as e:  # yajl calls every error incomplete: a premature end is the cut one
            if "premature EOF" in str(e):
                raise SourceError(_cut(path, reader, raw, gz, n, e)) from None
            raise SourceError(_invalid(path, reader, gz, n, prefix, e)) from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise SourceError(f"{path}: the gzip stream is cut or damaged at byte {raw.tell():,} of {size:,} "
                              f"(after {n:,} events: {e}); the file is incomplete") from None
        finally:
            raw.close()
    return st.table(path, meta, EventTable)


def _one_line(e) -> str:
    """A parser's message on one line: ijson's carries a drawing of where it stopped over several lines."""
    return str(e).splitlines()[0].strip() if str(e).strip() else type(e).__name__


def _cut(path, reader, raw, gz, n, e) -> str:
    where = (f"byte {raw.tell():,} of the {path.stat().st_size:,}-byte gzip file ({reader.count:,} bytes of JSON)"
             if gz else f"byte {reader.count:,}")
    return (f"{path}: the JSON is cut at {where}, after {n:,} complete events ({_one_line(e)}); the file is incomplete "
            "(a trace still being written, or a copy cut short): take the trace again")


def _invalid(path, reader, gz, n, prefix, e) -> str:
    """The message for a file that is whole but not JSON: a ``NaN``/``Infinity`` named with its field and event
    (``traceEvents[n]``: ``n`` complete events came before it), else yajl's own words."""
    where = f"near byte {reader.count:,} of the {'decompressed ' if gz else ''}text"
    msg = str(e)
    lines = msg.splitlines()
    token = field = None
    for i, line in enumerate(lines):
        j = line.find("(right here) ------^")
        if j >= 0 and i > 0:
            col = j + len("(right here) ------^") - 1  # yajl's caret: at or just past the bad token's start
            text = lines[i - 1]
            at = None
            for t in _NOT_JSON:  # -Infinity before Infinity: the longer spelling first
                k = text.rfind(t, 0, col + len(t) + 1)
                if k >= 0 and k <= col <= k + len(t):
                    token, at = t, k
                    break
            m = re.search(r'"([^"\\]+)"\s*:\s*$', text[:at if at is not None else col])
            field = m.group(1) if m else None
            break
    event = f"{prefix.split('.')[0] if prefix != 'item' else ''}[{n}]".lstrip(".")
    if token is not None:
        return (f"{path}: {event}: field {field or '?'!r} is {token}, which JSON does not allow (a writer that "
                f"does not check its numbers wrote it), {where}, after {n:,} complete events; the file is not "
                "cut off: fix or drop that value (JSON has no NaN or infinity)")
    first = lines[0].strip() if lines else msg
    excerpt = next((ln.strip() for ln in lines[1:] if ln.strip() and "(right here)" not in ln), "")
    return (f"{path}: not valid JSON {where}, after {n:,} events ({first}"
            + (f": {excerpt[:80]!r}" if excerpt else "") + ")")


class _State:
    """The rows of one Chrome trace as its events stream past."""

    def __init__(self, dialect: str, other: dict, path: Path) -> None:
        self.path = path
        self.ds4 = dialect == "ds4lab"
        self.rows = Rows()
        self.frames = _Frames()
        self.calls: dict[tuple, list] = {}
        self.skipped: dict[str, int] = {}
        self.events: dict[int, tuple] = {}  # correlation → (stream, event) of a cuda_event record
        self.tids: dict[str, int] = {}
        self.offsets = {str(k): int(v) for k, v in (other.get("clock_offset_ns") or {}).items()} if self.ds4 else {}
        self.stage_of: dict[int, str] = {}
        self.other = other
        self.cuda = 0
        self.negative: dict[str, int] = {}  # category → events of negative duration (not kernels), taken as 0
        self.opened: dict[tuple, list] = {}  # (pid, tid) → ranges begun by a 'B' event, not yet ended
        self.unclosed = self.lone_ends = 0  # 'X' ranges with no 'dur'; 'E' events with no 'B'
        self.n = 0

    def _tid(self, v) -> int:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
        s = str(v)
        m = re.search(r"(\d+)\s*$", s)
        if m:
            return int(m.group(1))
        return self.tids.setdefault(s, 1_000_000_000 + len(self.tids))

    def _skip(self, what: str) -> None:
        self.skipped[what] = self.skipped.get(what, 0) + 1

    def time(self, ev: dict, field: str):
        """``ev[field]`` (a time in µs) checked: None when absent, else a number; anything else (text, a boolean, a
        string ``"NaN"``) raises SourceError naming the file, the event and the field."""
        v = ev.get(field)
        if v is None:
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            if abs(v) * 1000.0 > MAX_NS:  # no clock reads it; as ns it would not fit the table's 64-bit integers
                raise SourceError(f"{self.path}: traceEvents[{self.n}] ({ev.get('cat', '?')} "
                                  f"{str(ev.get('name', ''))[:60]!r}): field {field!r} is {v:g} µs, past any trace's "
                                  "clock; the event is malformed")
            return v
        what = "NaN" if (isinstance(v, float) and math.isnan(v)) or str(v).strip().lower() == "nan" else repr(v)
        name = str(ev.get("name", ""))[:60]
        raise SourceError(f"{self.path}: traceEvents[{self.n}] ({ev.get('cat', '?')} {name!r}): field {field!r} is "
                          f"{what}, not a number of µs; the event is malformed")

    def event(self, ev: dict, n: int = 0) -> None:
        self.n = n
        ph = ev.get("ph")
        cat = str(ev.get("cat", "")).lower()
        if ph == "M":
            if self.ds4 and ev.get("name") == "process_name":
                m = re.match(r"stage (\S+):", str((ev.get("args") or {}).get("name", "")))
                if m:
                    self.stage_of[_int(ev.get("pid"))] = m.group(1)
            return
        cat = _ALIAS.get(cat, cat)
        if ph in ("B", "E") and (cat == "user_annotation" or (self.ds4 and cat == "nvtx")):
            self._begin_end(ev, ph)
            return
        if ph != "X":
            self._skip(f"'{cat or ev.get('name', '?')}' events of phase {ph!r}")
            return
        if cat not in _READ or (cat == "nvtx" and not self.ds4):
            self._skip(f"'{cat}' events")
            return
        a = ev.get("args") or {}
        t0 = _ns(self.time(ev, "ts"))
        dur = _ns(self.time(ev, "dur") or 0)
        if dur < 0 and cat != "kernel":  # a kernel's is counted where every source's are (table.kernel_lengths)
            self.negative[cat] = self.negative.get(cat, 0) + 1
            dur = 0
        t1 = t0 + dur
        if self.ds4:
            off = self.offsets.get(self.stage_of.get(_int(ev.get("pid")), ""), 0)
            t0, t1 = t0 + off, t1 + off
        name = str(ev.get("name", ""))
        if cat in ("cuda_runtime", "cuda_driver"):
            self.cuda += 1
            pid, tid = _int(ev.get("pid")), self._tid(ev.get("tid"))
            if self.ds4:
                tid = 1  # ds4lab's trace draws the calls on their own track; they ran on the host thread
            corr = _int(a.get("correlation"))
            stream, event = _int(a.get("stream")), _int(a.get("event"))
            self.calls.setdefault((pid, tid), []).append((t0, self.rows.n))
            self.rows.add(kind="api", name=api_base_name(name), domain=cat[5:], pid=pid, tid=tid, start_ns=t0,
                          end_ns=t1, correlation=corr, stream=stream, event=event, device=_int(a.get("device")),
                          stream_type=a.get("stream_type"), stack=a.get("stack"))
        elif cat == "python_function":
            self.frames.add(_int(ev.get("pid")), self._tid(ev.get("tid")), t0, t1, name)
        elif cat == "user_annotation" or (self.ds4 and cat == "nvtx"):
            if ev.get("dur") is None:  # a range with no end: never closed, not one of no time
                self.unclosed += 1
            self._range(name, ev, t0, t1 if ev.get("dur") is not None else -1)
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"):
            self.cuda += 1
            self._device(cat, name, ev, a, t0, t1)
        elif cat == "cuda_event":
            self.events[_int(a.get("correlation"))] = (_int(a.get("stream")), _int(a.get("event_id")))
        else:
            self._skip(f"'{cat}' events")

    def _range(self, name: str, ev: dict, t0: int, t1: int) -> None:
        """An NVTX or record_function range from ``t0`` to ``t1`` ns (-1: it never closes in the trace)."""
        self.rows.add(kind="nvtx", name=name, domain="ds4lab" if self.ds4 else TORCH_DOMAIN,
                      pid=_int(ev.get("pid")), tid=self._tid(ev.get("tid")), start_ns=t0, end_ns=t1)

    def _begin_end(self, ev: dict, ph: str) -> None:
        """A range given as a Chrome ``B`` event and its ``E`` on the same thread (the innermost open range of the
        thread, of the same name where the ``E`` names one). An ``E`` with no open ``B`` is counted and said."""
        t = _ns(self.time(ev, "ts"))
        if self.ds4:
            t += self.offsets.get(self.stage_of.get(_int(ev.get("pid")), ""), 0)
        key = (_int(ev.get("pid")), self._tid(ev.get("tid")))
        stack = self.opened.setdefault(key, [])
        if ph == "B":
            stack.append((str(ev.get("name", "")), t, ev))
            return
        name = ev.get("name")
        at = next((i for i in range(len(stack) - 1, -1, -1) if not name or stack[i][0] == name), None)
        if at is None:
            self.lone_ends += 1
            return
        nm, t0, begin = stack.pop(at)
        self._range(nm, begin, t0, max(t, t0))

    def _still_open(self) -> list:
        """Rows for the ranges whose ``B`` has no ``E`` (``end_ns`` -1), and the notes saying what was unpaired."""
        notes, n = [], 0
        for stack in self.opened.values():
            for nm, t0, begin in stack:
                self._range(nm, begin, t0, -1)
                n += 1
        n += self.unclosed
        if n:
            notes.append(f"{n:,} range(s) that never close in the trace (a 'B' event with no 'E', or an 'X' event "
                         "with no 'dur'): kept with no end (a last one left out as cut, others dropped)")
        if self.lone_ends:
            notes.append(f"{self.lone_ends:,} range end(s) ('E' events) with no 'B' on their thread: not tabled")
        return notes

    def _device(self, cat, name, ev, a, t0, t1) -> None:
        dev = _int(a.get("device"), _int(ev.get("pid")) if not self.ds4 else -1)
        stream = _int(a.get("stream_id", a.get("stream")), -1 if self.ds4 else _int(ev.get("tid")))
        common = dict(start_ns=t0, end_ns=t1, device=dev, stream=stream,
                      correlation=_int(a.get("correlation")), pid=_int(ev.get("pid")) if self.ds4 else -1,
                      stream_type=a.get("stream_type"))
        gid = _int(a.get("graph_id", a.get("graph id")), -1)
        gnode = _int(a.get("graph_node_id", a.get("graph node id")), -1)
        if cat == "kernel":
            self.rows.add(kind="kernel", name=name, grid=_dims(a.get("grid")), block=_dims(a.get("block")),
                          shared_bytes=_int(a.get("shared memory")), graph_id=gid, graph_node_id=gnode,
                          args=a.get("args"), **common)
        elif cat == "gpu_memcpy":
            m = parse_copy_label(name)
            ck = m[0] if m else str(a.get("copy_kind", ""))
            hm = host_memory(ck, m[1], m[2]) if m else str(a.get("host_memory", ""))
            self.rows.add(kind="memcpy", name=name, copy_kind=ck, host_memory=hm, bytes=_int(a.get("bytes")),
                          graph_id=gid, graph_node_id=gnode, **common)
        elif cat == "gpu_memset":
            self.rows.add(kind="memset", name=name, bytes=_int(a.get("bytes")), graph_id=gid, graph_node_id=gnode,
                          **common)
        else:
            kind = sync_kind_of_label(name) or str(a.get("sync_kind", ""))
            ev_id = _int(a.get("wait_on_cuda_event_id", a.get("event")))
            self.rows.add(kind="sync", name=name, sync_kind=kind, event=ev_id, **common)

    def table(self, path: Path, meta: dict, EventTable):
        notes = []
        if not self.cuda:
            held = ", ".join(f"{n:,} {w}" for w, n in sorted(self.skipped.items(), key=lambda x: -x[1])[:8])
            nf = len(self.frames)
            if nf:
                held = (held + ", " if held else "") + f"{nf:,} 'python_function' events"
            raise SourceError(f"{path}: no CUDA activity at all (no cuda_runtime, cuda_driver, kernel, gpu_memcpy, "
                              f"gpu_memset or cuda_sync event); it holds {held or 'no complete event'}. Profile with "
                              "torch.profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])")
        nf = len(self.frames)
        if nf:
            got = self.frames.stacks(self.calls, self.rows)
            notes.append(f"{nf:,} python_function frames made the Python stack of {got:,} CUDA API calls")
        elif not self.ds4:
            notes.append("no python_function events (profiled without with_stack=True): findings are located by "
                         "their record_function path only")
        for what, n in sorted(self.skipped.items(), key=lambda x: -x[1]):
            notes.append(f"{n:,} {what} not tabled (not CUDA activity the audit reads)")
        notes += self._still_open()
        for cat, n in sorted(self.negative.items()):
            notes.append(f"{n:,} '{cat}' events of negative duration (dur < 0): each taken as taking no time")
        df = self.rows.frame()
        if self.events:  # cudaEventRecord: stream and event from its cuda_event record
            api = df.index[(df.kind == "api") & df.correlation.isin(list(self.events)) & (df.stream < 0)]
            got = [self.events[c] for c in df.loc[api, "correlation"]]
            df.loc[api, "stream"] = [g[0] for g in got]
            df.loc[api, "event"] = [g[1] for g in got]
        _shift_negative(df, notes)
        df = finish(df, source=path, notes=notes)
        if self.ds4:
            tool = f"ds4lab-trace ({self.other.get('ds4lab', '?')}"
            tool += ", MODELED)" if self.other.get("modeled") else ")"
        else:
            ver = meta.get("schemaVersion")
            tool = "pytorch-profiler" + (f" (Kineto schema {ver})" if ver is not None else "")
        return EventTable(df, str(path), tool, notes)


def _shift_negative(df, notes: list) -> None:
    """A Chrome trace's ``ts`` may be negative (relative to a base the writer chose); the event table's times are
    ≥ 0 (-1 marks an end never recorded), so every time is shifted, in place, by the same amount and said in
    ``notes``: durations and order are unchanged."""
    low = int(df["start_ns"].min()) if len(df) else 0
    if low >= 0:
        return
    df["start_ns"] -= low
    df["end_ns"] -= low
    notes.append(f"the trace's times start at {low / 1e3:,.3f} µs (negative ts): every time shifted by "
                 f"{-low / 1e3:+,.3f} µs; durations and order unchanged")
