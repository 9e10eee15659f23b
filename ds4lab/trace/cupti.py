"""The one process-wide CUPTI session (``cupti-python``): activity records converted into the trace model's records as
they arrive (:meth:`CuptiSession.subscribe`), and call callbacks that record Python stacks or launch arguments
(:meth:`CuptiSession.watch_calls`, :meth:`CuptiSession.watch_launches`, :class:`NativeCallbacks`). Without
``cupti-python`` or a driver, :class:`CuptiUnavailable` names what is missing. How it works: docs/trace-readers.md,
"The CUPTI session"."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import records as R
from .records import api_base_name
from .stacks import python_stack

#: Activity kinds (``cupti.ActivityKind`` member names) of the MoE profiler and ``ds4lab bench --per-op``.
KERNEL_KINDS = ("CONCURRENT_KERNEL", "MEMSET")
#: Activity kinds of ``ds4lab trace`` (its timeline and, for the audit, the API level).
TRACE_KINDS = ("CONCURRENT_KERNEL", "MEMSET", "MEMCPY", "RUNTIME", "DRIVER", "SYNCHRONIZATION", "CUDA_EVENT",
               "STREAM")
#: Activity kinds of the audit's in-process recording.
AUDIT_KINDS = ("RUNTIME", "DRIVER", "CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "MARKER",
               "CUDA_EVENT", "STREAM")

class CuptiUnavailable(RuntimeError):
    """CUPTI cannot be used here; the message names what is missing (the package, the driver)."""


def cupti_available() -> tuple[bool, str]:
    """Whether ``cupti-python`` imports; ``(False, reason)`` naming the fix when it does not. Never raises."""
    try:
        import importlib

        importlib.import_module("cupti.cupti")
    except Exception as e:  # ImportError, or a library that fails to load
        return False, (f"cupti-python not importable ({type(e).__name__}: {e}); pip install -e \".[cupti12]\" "
                       "(\".[cupti13]\" for a CUDA 13 driver)")
    return True, "ok"


def cupti_library() -> Path | None:
    """The CUPTI shared library ``cupti-python`` loads, or None; NVTX reaches CUPTI only when a process starts with
    ``NVTX_INJECTION64_PATH`` naming it (CUPTI documentation, "NVTX")."""
    import importlib.util

    loaded = _loaded_cupti()
    if loaded is not None:  # the one cupti-python loaded: the injection must be the same library
        return loaded
    found = []
    for root in sys.path:
        base = Path(root or ".") / "nvidia"
        if base.is_dir():
            found += sorted(base.glob("*/lib/libcupti.so*"))
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            found += sorted(Path(loc).glob("*/lib/libcupti.so*"))
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    for sub in ("extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"):
        found += sorted(Path(home, sub).glob("libcupti.so*"))
    return found[0] if found else None


def _loaded_cupti() -> Path | None:
    """The ``libcupti.so`` this process has mapped (``/proc/self/maps``), or None."""
    try:
        from cupti import cupti  # noqa: F401 - loads the library
        maps = Path("/proc/self/maps").read_text()
    except (ImportError, OSError, RuntimeError):
        return None
    for line in maps.splitlines():
        path = line.split(None, 5)[-1] if len(line.split(None, 5)) == 6 else ""
        if "/libcupti.so" in path and Path(path).is_file():
            return Path(path)
    return None


@dataclass
class Subscription:
    """Records of some activity kinds since the last :meth:`take` (see :class:`CuptiSession`)."""

    session: "CuptiSession"
    kinds: frozenset
    records: list = field(default_factory=list)
    closed: bool = False

    def take(self) -> list:
        """Flush CUPTI's buffers and return the records (:mod:`ds4lab.trace.records`) that arrived since the last take,
        each API call named (:meth:`CuptiSession.callback_name`)."""
        self.session.flush()
        with self.session.lock:
            out, self.records = self.records, []
        return [self.session.named(r) if isinstance(r, R.ApiCall) else r for r in out]

    def close(self) -> None:
        """Flush, stop receiving, and disable the kinds no other open subscription asks for (idempotent)."""
        if not self.closed:
            self.session.flush()
            self.session._close(self)
            self.closed = True


@dataclass
class CallWatch:
    """Python stacks of watched calls, ``{correlation id: stack}`` (see :meth:`CuptiSession.watch_calls`)."""

    session: "CuptiSession"
    stacks: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)
    closed: bool = False

    def close(self) -> None:
        """Stop the callbacks (unsubscribe when no other watch is open; idempotent)."""
        if not self.closed:
            self.session._close_watch(self)
            self.closed = True


class CuptiSession:
    """The process's CUPTI session (create with :meth:`get`). Thread-safe: CUPTI delivers buffers on its own thread;
    :attr:`lock` guards the subscriptions' record lists."""

    _instance: "CuptiSession | None" = None

    def __init__(self, module=None) -> None:
        if module is None:
            try:
                from cupti import cupti as module  # optional dependency, imported only here
            except Exception as e:  # ImportError, or a library that does not load
                raise CuptiUnavailable(f"cupti-python not importable ({type(e).__name__}: {e}); "
                                       "pip install cupti-python (and a CUDA driver)") from None
        self.c = module
        self.lock = threading.RLock()
        self.subs: list[Subscription] = []
        self.enabled: dict[str, int] = {}
        self.refused: dict[str, str] = {}
        self.registered = False
        self.watches: list[CallWatch] = []
        self.subscriber = None
        self.watched: set = set()
        self.launch_watchers: list = []  # ds4lab.audit.arguments: handlers called at launch entry and exit
        self.launch_cbids: set = set()   # (domain, cbid) the launch watchers asked for
        self.stack_cbids: set = set()    # (domain, cbid) whose stacks a CallbackWatch records
        self.dropped = 0
        #: what subscribes and enables callbacks: :class:`NativeCallbacks` where CUPTI's library is reached
        #: (cupti-python's own module otherwise), chosen at the first subscription (:meth:`_callback_api`)
        self.api = None
        self._names: dict = {}
        self._convert = self._converters()

    @classmethod
    def get(cls) -> "CuptiSession":
        """The process's session (created on first use). Raises :class:`CuptiUnavailable`."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def timestamp(self) -> int:
        """CUPTI's clock now (ns; ``cuptiGetTimestamp``), the clock of every record."""
        return int(self.c.get_timestamp())

    # ------------------------------------------------------------------ activity records
    def subscribe(self, kinds) -> Subscription:
        """A new :class:`Subscription` to ``kinds`` (``cupti.ActivityKind`` names); refused kinds are named in
        :attr:`refused`. Raises :class:`CuptiUnavailable` when every kind, or the buffer callbacks, are refused."""
        K = self.c.ActivityKind
        want = []
        for k in kinds:
            if not hasattr(K, k):
                self.refused[k] = f"cupti-python {getattr(self.c, '__version__', '')} has no ActivityKind.{k}".strip()
                continue
            want.append(k)
        with self.lock:
            if not self.registered:
                try:
                    self.c.activity_register_callbacks(self._requested, self._completed)
                except Exception as e:  # noqa: BLE001 - CUPTI's own error, named
                    raise CuptiUnavailable(f"CUPTI refused the activity buffer callbacks ({type(e).__name__}: {e})") \
                        from None
                self.registered = True
            got = []
            for k in want:
                if self.enabled.get(k, 0) == 0:
                    try:
                        self.c.activity_enable(getattr(K, k))
                    except Exception as e:  # noqa: BLE001 - a kind this driver or device cannot record
                        self.refused[k] = f"{type(e).__name__}: {e}"
                        continue
                self.enabled[k] = self.enabled.get(k, 0) + 1
                got.append(k)
            if want and not got:
                raise CuptiUnavailable("CUPTI refused every activity kind asked for: "
                                       + "; ".join(f"{k}: {self.refused[k]}" for k in want))
            sub = Subscription(self, frozenset(got))
            self.subs.append(sub)
        return sub

    def _close(self, sub: Subscription) -> None:
        K = self.c.ActivityKind
        with self.lock:
            if sub in self.subs:
                self.subs.remove(sub)
            for k in sub.kinds:
                self.enabled[k] -= 1
                if self.enabled[k] == 0:
                    del self.enabled[k]
                    self.c.activity_disable(getattr(K, k))

    def flush(self) -> None:
        """Deliver every record CUPTI holds (``cuptiActivityFlushAll`` with the forced flag)."""
        self.c.activity_flush_all(1)

    def _requested(self):
        return 8 << 20, 0  # 8 MiB buffers, no record limit

    def _converters(self) -> dict:
        """``{CUPTI activity kind number: (kind name, converter to the trace model's record)}``."""
        K = self.c.ActivityKind

        def s(v):
            return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))

        def g(a, name, default=0):
            return int(getattr(a, name, default))

        def valid(v):
            return -1 if v == R.INVALID_ID else v

        def device(a):
            return dict(start_ns=int(a.start), end_ns=int(a.end), device=g(a, "device_id", -1),
                        stream=g(a, "stream_id", -1), correlation=g(a, "correlation_id", -1),
                        graph_id=g(a, "graph_id"), graph_node_id=g(a, "graph_node_id"))

        def kernel(a):
            return R.Kernel(name=s(a.name), grid=(g(a, "grid_x"), g(a, "grid_y"), g(a, "grid_z")),
                            block=(g(a, "block_x"), g(a, "block_y"), g(a, "block_z")),
                            shared_bytes=g(a, "static_shared_memory") + g(a, "dynamic_shared_memory"), **device(a))

        def memcpy(a):
            return R.Copy(copy_kind=R.MEMCPY_KINDS.get(g(a, "copy_kind"), ""),
                          src_memory=R.MEMORY_KINDS.get(g(a, "src_kind"), "Unknown"),
                          dst_memory=R.MEMORY_KINDS.get(g(a, "dst_kind"), "Unknown"), bytes=g(a, "bytes", -1),
                          **device(a))

        def memset(a):
            return R.Memset(memory=R.MEMORY_KINDS.get(g(a, "memory_kind"), "Unknown"), bytes=g(a, "bytes", -1),
                            **device(a))

        def api(domain):
            def conv(a):
                return R.ApiCall(name="", domain=domain, start_ns=int(a.start), end_ns=int(a.end),
                                 pid=g(a, "process_id", -1), tid=g(a, "thread_id", -1),
                                 correlation=g(a, "correlation_id", -1), cbid=g(a, "cbid", -1),
                                 return_value=g(a, "return_value"))
            return conv

        def sync(a):
            return R.Sync(sync_kind=R.SYNC_TYPES.get(g(a, "type"), ""), start_ns=int(a.start), end_ns=int(a.end),
                          context=g(a, "context_id", -1), stream=valid(g(a, "stream_id", -1)),
                          correlation=g(a, "correlation_id", -1), event=valid(g(a, "cuda_event_id", -1)))

        def cuda_event(a):
            return R.EventRecord(event=g(a, "event_id", -1), device=g(a, "device_id", -1),
                                 stream=g(a, "stream_id", -1), correlation=g(a, "correlation_id", -1))

        def stream(a):
            return R.StreamMade(stream=g(a, "stream_id", -1), stream_type=R.STREAM_FLAGS.get(g(a, "flag"), ""),
                                context=g(a, "context_id", -1), correlation=g(a, "correlation_id", -1))

        def marker(a):
            pid = tid = -1
            oid = getattr(a, "object_id", None)
            pt = getattr(oid, "pt", None)
            if pt is not None:
                pid, tid = int(pt.process_id), int(pt.thread_id)
            return R.Marker(phase=R.marker_phase(g(a, "flags_", g(a, "flags", 0))), timestamp_ns=int(a.timestamp),
                            id=g(a, "id", -1), name=s(getattr(a, "name", "")), domain=s(getattr(a, "domain", "")),
                            pid=pid, tid=tid)

        def graph(a):
            return R.GraphExec(**{**device(a), "graph_node_id": -1})  # a whole graph: no node

        def memory(a):  # audit arguments (ds4lab.audit.arguments): allocations and frees with their ranges
            return R.MemoryOp(operation=g(a, "memory_operation_type"), address=g(a, "address"), bytes=g(a, "bytes"),
                              timestamp_ns=int(a.timestamp), device=g(a, "device_id", -1),
                              stream=g(a, "stream_id", -1), correlation=g(a, "correlation_id", -1),
                              memory_kind=g(a, "memory_kind"))

        table = {}
        for name, conv in (("CONCURRENT_KERNEL", kernel), ("KERNEL", kernel), ("MEMCPY", memcpy),
                           ("MEMSET", memset), ("RUNTIME", api("runtime")), ("DRIVER", api("driver")),
                           ("SYNCHRONIZATION", sync), ("CUDA_EVENT", cuda_event), ("STREAM", stream),
                           ("MARKER", marker), ("GRAPH_TRACE", graph), ("MEMORY2", memory)):
            if hasattr(K, name):
                table[int(getattr(K, name))] = (name, conv)
        return table

    def _completed(self, activities) -> None:
        """CUPTI's buffer-completed callback: convert each record, hand it to the subscriptions."""
        with self.lock:
            subs = list(self.subs)
            for a in activities:
                hit = self._convert.get(int(a.kind))
                if hit is None:
                    continue
                kind, conv = hit
                takers = [s for s in subs if kind in s.kinds]
                if not takers:
                    self.dropped += 1
                    continue
                rec = conv(a)
                for s in takers:
                    s.records.append(rec)

    def callback_name(self, domain: str, cbid: int) -> str:
        """The API function a runtime or driver callback id names (``cuptiGetCallbackName``), without CUPTI's version
        suffix (``cudaMemcpyAsync_v3020`` → ``cudaMemcpyAsync``)."""
        key = (domain, int(cbid))
        name = self._names.get(key)
        if name is None:
            D = self.c.CallbackDomain
            try:
                raw = self.c.get_callback_name(D.RUNTIME_API if domain == "runtime" else D.DRIVER_API, int(cbid))
                name = api_base_name(raw.decode() if isinstance(raw, bytes) else str(raw))
            except Exception:  # noqa: BLE001 - an id this CUPTI does not name
                name = f"{domain} call {cbid}"
            self._names[key] = name
        return name

    def named(self, call: "R.ApiCall") -> "R.ApiCall":
        """``call`` with its name (:meth:`callback_name` of its callback id) where it has none."""
        if call.name:
            return call
        return dataclasses.replace(call, name=self.callback_name(call.domain, call.cbid))

    def stream_types_now(self) -> dict:
        """``{stream id: type}`` of the context's legacy and per-thread default streams; {} without a context."""
        ctx = current_context()
        if not ctx:
            return {}
        out = {int(self.c.get_stream_id_ex(ctx, 0, 0)): "legacy"}
        out.setdefault(int(self.c.get_stream_id_ex(ctx, 0, 1)), "per_thread")
        return out

    # ------------------------------------------------------------------ call callbacks
    def watch_calls(self, runtime=(), driver=(), *, skip_files: tuple = ()) -> CallWatch:
        """A :class:`CallWatch` recording the Python stack at the entry of each call named in ``runtime`` /
        ``driver`` (every version and ``_ptsz``/``_ptds`` form). Raises :class:`CuptiUnavailable` when CUPTI refuses
        the subscriber (another CUPTI client holds it)."""
        watch = CallWatch(self)
        with self.lock:
            self._subscriber()
            self._skip = tuple(skip_files) + (__file__,)
            D = self.c.CallbackDomain
            for domain, enum, names in ((D.RUNTIME_API, getattr(self.c, "runtime_api_trace_cbid", None), runtime),
                                        (D.DRIVER_API, getattr(self.c, "driver_api_trace_cbid", None), driver)):
                if enum is None:
                    continue
                for member, cbid in enum.__members__.items():
                    if api_base_name(member) in names and (int(domain), int(cbid)) not in self.stack_cbids:
                        if (int(domain), int(cbid)) not in self.watched:
                            self.api.enable_callback(1, self.subscriber, domain, cbid)
                            self.watched.add((int(domain), int(cbid)))
                        self.stack_cbids.add((int(domain), int(cbid)))
            self.watches.append(watch)
        return watch

    def _callback_api(self):
        """:class:`NativeCallbacks` where cupti-python's library is mapped (not with
        ``DS4LAB_CUPTI_CALLBACKS=python``), else ``self.c``."""
        if os.environ.get(CALLBACKS_ENV, "").lower() == "python" or not getattr(self.c, "__file__", None):
            return self.c
        try:  # cupti-python loads CUPTI's library at its first call: make one that changes nothing
            self.c.get_timestamp()
        except Exception:  # noqa: BLE001 - no library: cupti-python's own path says why when subscribing
            return self.c
        native = NativeCallbacks.load(_loaded_cupti())
        return native if native is not None else self.c

    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        key = (int(domain), int(cbid))
        if self.launch_watchers and key in self.launch_cbids:
            for h in self.launch_watchers:
                h(key[0], key[1], cbdata)
            if key not in self.stack_cbids:
                return
        if type(cbdata) is int:  # NativeCallbacks: the callback data's address
            cbdata = CallbackView(cbdata, self.c)
        if int(cbdata.callback_site) != int(self.c.ApiCallbackSite.API_ENTER) or not self.watches:
            return
        stack = python_stack(sys._getframe(1), skip_files=self._skip)
        corr = int(cbdata.correlation_id)
        for w in self.watches:
            w.stacks[corr] = stack
            w.names[corr] = str(cbdata.function_name)

    def _close_watch(self, watch: CallWatch) -> None:
        with self.lock:
            if watch in self.watches:
                self.watches.remove(watch)
            if not self.watches:
                self.stack_cbids.clear()
            self._release_subscriber()

    def _subscriber(self):
        """The one callback subscriber (created on first use). Raises :class:`CuptiUnavailable`."""
        if self.subscriber is None:
            if self.api is None:
                self.api = self._callback_api()
            try:
                self.subscriber = self.api.subscribe(self._callback, None)
            except Exception as e:  # noqa: BLE001 - CUPTI's own error, named
                raise CuptiUnavailable(f"CUPTI refused a callback subscriber ({type(e).__name__}: {e}); another "
                                       "CUPTI client (torch.profiler, Nsight Systems) may hold it") from None
        return self.subscriber

    def _release_subscriber(self) -> None:
        """Unsubscribe when neither a stack watch nor a launch watcher is open."""
        if not self.watches and not self.launch_watchers and self.subscriber is not None:
            self.api.unsubscribe(self.subscriber)
            self.subscriber = None
            self.watched.clear()
            self.launch_cbids.clear()

    # ------------------------------------------------------------------ launch callbacks (audit arguments)
    def watch_launches(self, names, handler) -> Callable[[], None]:
        """Call ``handler(domain, cbid, cbdata)`` at the entry and exit of every launch call named in ``names``
        (base names, every version), on the launching thread. Returns the function that stops it; raises as
        :meth:`watch_calls`."""
        with self.lock:
            sub = self._subscriber()
            D = self.c.CallbackDomain
            for domain, enum in ((D.RUNTIME_API, getattr(self.c, "runtime_api_trace_cbid", None)),
                                 (D.DRIVER_API, getattr(self.c, "driver_api_trace_cbid", None))):
                if enum is None:
                    continue
                for member, cbid in enum.__members__.items():
                    key = (int(domain), int(cbid))
                    if api_base_name(member) in names:
                        if key not in self.watched:
                            self.api.enable_callback(1, sub, domain, cbid)
                            self.watched.add(key)
                        self.launch_cbids.add(key)
            self.launch_watchers.append(handler)

        def stop() -> None:
            with self.lock:
                if handler in self.launch_watchers:
                    self.launch_watchers.remove(handler)
                if not self.launch_watchers:
                    for key in self.launch_cbids - self.stack_cbids:
                        if self.subscriber is not None and key in self.watched:
                            self.api.enable_callback(0, self.subscriber, key[0], key[1])
                            self.watched.discard(key)
                    self.launch_cbids.clear()
                self._release_subscriber()
        return stop


#: ``DS4LAB_CUPTI_CALLBACKS=python``: subscribe through cupti-python's wrapper, not :class:`NativeCallbacks`.
CALLBACKS_ENV = "DS4LAB_CUPTI_CALLBACKS"
#: ``CUpti_CallbackData`` (CUPTI's ``cupti_callbacks.h``) on x86-64: its size and the fields ds4lab reads,
#: ``(name, offset, struct code)`` (``cupti.callback_data_dtype`` gives the offsets where present).
CALLBACK_DATA_SIZE = 72
CALLBACK_FIELDS = (("callback_site", 0, "i"), ("function_name", 8, "Q"), ("function_params", 16, "Q"),
                   ("symbol_name", 32, "Q"), ("correlation_id", 64, "I"))


def callback_struct(dtype=None) -> struct.Struct:
    """The :class:`struct.Struct` unpacking ``(callbackSite, functionName, functionParams, symbolName,
    correlationId)`` from a ``CUpti_CallbackData``, at ``dtype``'s offsets, else :data:`CALLBACK_FIELDS`'s."""
    fields = getattr(dtype, "fields", None) or {}
    offs = [int(fields[n][1]) if n in fields else o for n, o, _ in CALLBACK_FIELDS]
    if offs != sorted(offs):  # never seen: a reordered struct is read at the documented offsets
        offs = [o for _, o, _ in CALLBACK_FIELDS]
    fmt, pos = "<", 0
    for (_, _, code), off in zip(CALLBACK_FIELDS, offs):
        fmt += f"{off - pos}x{code}" if off > pos else code
        pos = off + struct.calcsize("<" + code)
    size = int(getattr(dtype, "itemsize", 0) or CALLBACK_DATA_SIZE)
    return struct.Struct(fmt + (f"{size - pos}x" if size > pos else ""))


class CallbackView:
    """The fields of the ``CUpti_CallbackData`` at ``ptr`` under cupti-python's names, read from memory."""

    def __init__(self, ptr: int, module=None) -> None:
        self.ptr = int(ptr)
        site, fname, _, sym, corr = callback_struct(getattr(module, "callback_data_dtype", None)).unpack(
            ctypes.string_at(self.ptr, CALLBACK_DATA_SIZE))
        self.callback_site, self.correlation_id = site, corr
        self.function_name = ctypes.string_at(fname).decode("utf-8", "replace") if fname else ""
        self.symbol_name = ctypes.string_at(sym).decode("utf-8", "replace") if sym else ""


class NativeCallbacks:
    """CUPTI's callback API through ``ctypes``: the subscriber gets the callback data's address (cupti-python
    builds a NumPy record per callback, microseconds a launch). Same signature as cupti-python's
    ``subscribe``/``enable_callback``/``unsubscribe``; a failing status raises RuntimeError naming it."""

    #: ``void CUPTIAPI (*CUpti_CallbackFunc)(void *userdata, CUpti_CallbackDomain, CUpti_CallbackId, const void *)``
    FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)

    def __init__(self, lib) -> None:
        self.lib = lib
        self._keep: dict = {}  # subscriber -> its ctypes callback, alive while subscribed

    @classmethod
    def load(cls, path) -> "NativeCallbacks | None":
        """The callback API of the loaded CUPTI library at ``path``, or None where it lacks the calls."""
        if path is None:
            return None
        try:
            lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_NOLOAD", 4))
        except OSError:
            return None
        if not all(hasattr(lib, n) for n in ("cuptiSubscribe", "cuptiEnableCallback", "cuptiUnsubscribe")):
            return None
        return cls(lib)

    def _check(self, what: str, status: int) -> None:
        if status != 0:
            name = ctypes.c_char_p()
            text = f"CUptiResult {status}"
            get = getattr(self.lib, "cuptiGetResultString", None)
            if get is not None and get(status, ctypes.byref(name)) == 0 and name.value:
                text = name.value.decode()
            raise RuntimeError(f"{what}: {text}")

    def subscribe(self, callback, userdata=None) -> int:
        """Subscribe ``callback(userdata, domain, cbid, cbdata address)``; returns the subscriber handle."""
        fn = self.FUNC(callback)
        handle = ctypes.c_void_p()
        self._check("cuptiSubscribe", self.lib.cuptiSubscribe(ctypes.byref(handle), fn, None))
        self._keep[handle.value] = fn
        return handle.value

    def enable_callback(self, enable, subscriber, domain, cbid) -> None:
        self._check("cuptiEnableCallback", self.lib.cuptiEnableCallback(
            ctypes.c_uint32(int(enable)), ctypes.c_void_p(subscriber), ctypes.c_int(int(domain)),
            ctypes.c_uint32(int(cbid))))

    def unsubscribe(self, subscriber) -> None:
        try:
            self._check("cuptiUnsubscribe", self.lib.cuptiUnsubscribe(ctypes.c_void_p(subscriber)))
        finally:
            self._keep.pop(subscriber, None)


def current_context() -> int:
    """The thread's current CUDA context as an integer (``cuCtxGetCurrent``); 0 without one. Raises without a driver."""
    from cuda.bindings import driver as cu

    err, ctx = cu.cuCtxGetCurrent()
    return int(ctx) if int(err) == 0 else 0
