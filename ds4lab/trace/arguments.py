"""Kernel arguments in the recording: the parameter bytes of every kernel launch, read at the launch entry points
through the CUPTI callback API, with the allocations their addresses point into (the comparison and the verdict:
:mod:`ds4lab.audit.frozen`).

:class:`ArgumentCapture` reads each launch's parameters (:class:`CudaQueries`); :func:`prune` keeps the bytes only
where tokens differ; :class:`MemoryTracker` holds the allocations; :func:`measure_overhead` measures the pass's cost
per launch; :class:`ArgumentStore` is the file. How each piece works: docs/audit-arguments.md, "Recording the
arguments"."""

from __future__ import annotations

import ctypes
import gzip
import hashlib
import json
import os
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: The kernel launch calls whose parameter struct the pass reads (of
#: :data:`ds4lab.trace.records.KERNEL_LAUNCH_CALLS`), base name → (API domain, offset of the function in
#: its params struct, offset of the argument array, offset of ``extra`` or None). From ``cudaLaunchKernel_v7000_params`` {func, dim3
#: gridDim, dim3 blockDim, args, sharedMem, stream}, ``cudaLaunchKernelExC_v11060_params`` {config, func,
#: args}, ``cuLaunchKernel_params`` {f, 7 unsigned ints, hStream, kernelParams, extra},
#: ``cuLaunchCooperativeKernel_params`` (no extra), ``cuLaunchKernelEx_params`` {config, f, kernelParams,
#: extra}; the ``_ptsz`` forms have the same structs.
LAUNCH_LAYOUTS = {
    "cudaLaunchKernel": ("runtime", 0, 32, None),
    "cudaLaunchCooperativeKernel": ("runtime", 0, 32, None),
    "cudaLaunchKernelExC": ("runtime", 8, 16, None),
    "cuLaunchKernel": ("driver", 0, 48, 56),
    "cuLaunchCooperativeKernel": ("driver", 0, 48, None),
    "cuLaunchKernelEx": ("driver", 8, 16, 24),
}
#: ``CU_LAUNCH_PARAM_END``, ``CU_LAUNCH_PARAM_BUFFER_POINTER``, ``CU_LAUNCH_PARAM_BUFFER_SIZE`` (cuda.h).
PARAM_END, PARAM_BUFFER_POINTER, PARAM_BUFFER_SIZE = 0, 1, 2
#: ``CUDA_ERROR_INVALID_VALUE``: cuFuncGetParamInfo past the last parameter.
CUDA_ERROR_INVALID_VALUE = 1
#: ``CUDA_ERROR_INVALID_HANDLE``: what cuFuncGetParamInfo answers for a ``CUkernel`` (not a ``CUfunction``).
CUDA_ERROR_INVALID_HANDLE = 400
#: The CUDA calls the capture itself makes (left out of the event table where they fall in its windows).
OWN_CALLS = frozenset({"cuFuncGetParamInfo", "cuFuncGetParamCount", "cudaGetFuncBySymbol", "cuMemGetAddressRange",
                       "cuFuncGetName", "cudaPeekAtLastError", "cudaGetLastError", "cuKernelGetFunction"})
STORE_SUFFIX = ".arguments.json.gz"
STORE_NAME = "arguments.json.gz"
#: Files whose frames a launch's stack leaves out (besides this module and the CUPTI session's).
SKIP_FILES: tuple = ()
#: At most this many distinct varying values are resolved with cuMemGetAddressRange at the end of a pass.
MAX_RANGE_QUERIES = 20_000


_U64 = ctypes.c_uint64.from_address


def _u64(addr: int) -> int:
    return _U64(addr).value


def digest(data: bytes) -> str:
    """The digest a launch's parameter bytes are stored under (BLAKE2b, 8 bytes, hex)."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# ----------------------------------------------------------------------------- the CUDA queries
class CudaQueries:
    """The CUDA calls the capture makes, through ``ctypes`` (``cuFuncGetParamInfo`` and friends of
    ``libcuda.so.1``, ``cudaGetFuncBySymbol`` of every loaded runtime). A call that fails says why, never a guess."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.runtimes = _loaded_runtimes()
        self._count = getattr(self.cuda, "cuFuncGetParamCount", None)
        self._info = getattr(self.cuda, "cuFuncGetParamInfo", None)

    def error_name(self, status: int) -> str:
        name = ctypes.c_char_p()
        try:
            if self.cuda.cuGetErrorName(int(status), ctypes.byref(name)) == 0 and name.value:
                return name.value.decode()
        except Exception:  # noqa: BLE001 - naming only
            pass
        return f"CUresult {status}"

    def runtime_function(self, host_fn: int) -> tuple[int, str]:
        """The ``CUfunction`` of a runtime function (its host stub's address), and "" or why not."""
        why = []
        for path, lib in self.runtimes:
            f = getattr(lib, "cudaGetFuncBySymbol", None)
            peek, clear = getattr(lib, "cudaPeekAtLastError", None), getattr(lib, "cudaGetLastError", None)
            if f is None or peek is None or clear is None:
                continue
            # A failed runtime call becomes that runtime's "last error", which the application reads
            # after its next launch (cudaGetLastError) as if its own launch had failed: so a runtime with
            # an error of the application's pending is not asked (asking would replace it), and a
            # failure of ours is read back at once.
            pending = peek()
            if pending != 0:
                why.append(f"{Path(path).name}: not asked (cudaError {pending} of the application's pending)")
                continue
            out = ctypes.c_void_p()
            st = f(ctypes.byref(out), ctypes.c_void_p(host_fn))
            if st == 0 and out.value:
                return int(out.value), ""
            if st != 0:
                clear()
            # CUDA 12's and 13's runtimes keep their kernels as CUkernels: ask for the stub's CUkernel
            # (cudaGetKernel) and map it to the current context's CUfunction
            g, kst = getattr(lib, "cudaGetKernel", None), None
            if g is not None:
                k = ctypes.c_void_p()
                kst = g(ctypes.byref(k), ctypes.c_void_p(host_fn))
                if kst == 0 and k.value:
                    fn = self.kernel_function(int(k.value))
                    if fn:
                        return fn, ""
                    kst = "no CUfunction (cuKernelGetFunction)"
                elif kst != 0:
                    clear()
            why.append(f"{Path(path).name}: cudaError {st}" + (f", cudaGetKernel: {kst if isinstance(kst, str) else 'cudaError ' + str(kst)}"
                                                             if kst is not None else ""))
        return 0, ("cudaGetFuncBySymbol: " + "; ".join(why)) if why else "no CUDA runtime with cudaGetFuncBySymbol loaded"

    def param_layout(self, cufunc: int) -> tuple[list | None, str]:
        """``[(offset, size), ...]`` of ``cufunc``'s parameters, and "" or why not. A ``CUkernel`` (CUDA 12+
        runtimes launch by it), which ``cuFuncGetParamInfo`` refuses, is mapped to its ``CUfunction`` first."""
        layout, why = self._layout(cufunc)
        if layout is None and why.endswith("CUDA_ERROR_INVALID_HANDLE"):
            fn = self.kernel_function(cufunc)
            if fn:
                layout, why2 = self._layout(fn)
                why = why2 if layout is None else ""
            else:
                why += " (and cuKernelGetFunction: not a CUkernel either)"
        return layout, why

    def kernel_function(self, kernel: int) -> int:
        """The ``CUfunction`` of ``kernel`` (a ``CUkernel``) in the current context, or 0 where ``kernel`` is none
        (``cuKernelGetFunction``'s status checked) or the driver lacks the call."""
        get = getattr(self.cuda, "cuKernelGetFunction", None)
        if get is None:
            return 0
        out = ctypes.c_void_p()
        st = get(ctypes.byref(out), ctypes.c_void_p(kernel))
        return int(out.value) if st == 0 and out.value else 0

    def _layout(self, cufunc: int) -> tuple[list | None, str]:
        if self._info is None:
            return None, "the driver has no cuFuncGetParamInfo (CUDA 12.4 or later needed)"
        f = ctypes.c_void_p(cufunc)
        n = None
        if self._count is not None:
            c = ctypes.c_size_t()
            st = self._count(f, ctypes.byref(c))
            if st != 0:
                return None, f"cuFuncGetParamCount: {self.error_name(st)}"
            n = int(c.value)
        out, i = [], 0
        while n is None or i < n:
            off, size = ctypes.c_size_t(), ctypes.c_size_t()
            st = self._info(f, ctypes.c_size_t(i), ctypes.byref(off), ctypes.byref(size))
            if st == CUDA_ERROR_INVALID_VALUE and n is None:
                break  # past the last parameter
            if st != 0:
                return None, f"cuFuncGetParamInfo({i}): {self.error_name(st)}"
            out.append((int(off.value), int(size.value)))
            i += 1
        return out, ""

    def function_name(self, cufunc: int) -> str:
        """The mangled name of ``cufunc`` (a ``CUfunction``, or a ``CUkernel`` mapped to one), or ""."""
        name = ctypes.c_char_p()
        for f in (cufunc, None):
            if f is None:
                f = self.kernel_function(cufunc)
                if not f:
                    break
            try:
                if self.cuda.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(f)) == 0 and name.value:
                    return name.value.decode()
            except Exception:  # noqa: BLE001 - a driver without it
                break
        return ""

    def address_range(self, ptr: int) -> tuple[int, int] | None:
        """``(base, size)`` of the device allocation containing ``ptr`` now, or None (not device memory)."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        fn = getattr(self.cuda, "cuMemGetAddressRange_v2", None) or self.cuda.cuMemGetAddressRange
        st = fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        return (int(base.value), int(size.value)) if st == 0 else None


def host_maps() -> list:
    """``[start, end, name]`` of this process's host mappings (``/proc/self/maps``; [] where unreadable)."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                a, b = parts[0].split("-")
                out.append([int(a, 16), int(b, 16), parts[5] if len(parts) > 5 else ""])
    except (OSError, ValueError, IndexError):
        return []
    return out


def _loaded_runtimes() -> list:
    """``[(path, CDLL)]`` of the CUDA runtimes (``libcudart.so*``) already loaded in this process
    (``/proc/self/maps``), opened without loading anything new (``RTLD_NOLOAD``)."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.rsplit(None, 1)[-1] if "/" in line else ""
                if "libcudart" in Path(p).name and p not in paths:
                    paths.append(p)
    except OSError:
        return []
    out = []
    for p in paths:
        try:
            out.append((p, ctypes.CDLL(p, mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_GLOBAL)))
        except OSError:
            continue
    return out


# ----------------------------------------------------------------------------- the capture
@dataclass
class FunctionInfo:
    """One kernel function as the capture saw it: ``name``, ``params`` ``[(offset, size)]`` (None: unread) and
    ``why``; ``fid`` its store key; ``sizes``/``argv`` what the hot path reads it with; ``seen`` the stacked bytes."""

    name: str
    params: list | None
    why: str = ""
    #: looked up a second time (at a launch's exit): a function still unread after it stays unread
    retried: bool = False
    fid: str = ""
    sizes: tuple = ()
    argv: struct.Struct | None = None
    seen: set = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.params is not None:
            self.sizes = tuple(int(s) for _, s in self.params)
            self.argv = struct.Struct(f"<{len(self.sizes)}Q")


class ArgumentCapture:
    """The launch handler. ``session``: a :class:`~ds4lab.trace.cupti.CuptiSession`; ``queries``: the CUDA side;
    ``stacks``: take the Python stack at each launch whose bytes are new for its function, or unread; ``shared``:
    an earlier capture whose lookups, sites and stacked bytes this one reuses. The hot path (:meth:`on_launch`) reads
    the callback data in one read, copies the parameter bytes, keeps one object per distinct value and digests after
    the pass (:meth:`digests`); stacks are cached per launch site (:meth:`_stack`)."""

    def __init__(self, session, queries=None, *, stacks: bool = True, shared: "ArgumentCapture | None" = None) -> None:
        self.session = session
        self.queries = queries
        self.want_stacks = stacks
        self.functions: dict[str, FunctionInfo] = shared.functions if shared is not None else {}
        self._by_fn: dict = shared._by_fn if shared is not None else {"runtime": {}, "driver": {}}
        #: launch sites: frames' instructions -> [(their code objects, stack)]
        self._sites: dict = shared._sites if shared is not None else {}
        self.records: dict[int, list] = {}   # corr -> [function id, parameter bytes | None (unread)]
        self._values: dict = {}               # parameter bytes -> the one object kept for them
        self.stacks: dict[int, str] = {}
        self.own: list[tuple] = []            # (thread id, t0, t1) of the capture's own CUDA calls
        self.why_unread: dict[int, str] = {}  # corr -> why its launch is unread (gone once read)
        #: the innermost framework operator open at a launch (:class:`ds4lab.trace.torch_ops.OpLog`), or None
        self.current_op = None
        self.op_of: dict[int, int] = {}       # corr -> index of that operator call
        self.local = threading.local()
        self.notes: list[str] = []
        self._stop = None
        self._forms: dict = {}
        self._skip = (__file__, _cupti_file(), *SKIP_FILES)
        from .cupti import callback_struct

        self._fields = callback_struct(getattr(session.c, "callback_data_dtype", None))
        self._raw = None  # how the callback data's bytes are read (chosen at the first callback)
        self._anchor = None  # the frame stack walks stop at (:meth:`start`)
        self._forms_from(session)

    def _forms_from(self, session) -> None:
        from .records import api_base_name

        D = session.c.CallbackDomain
        for domain, enum in ((D.RUNTIME_API, getattr(session.c, "runtime_api_trace_cbid", None)),
                             (D.DRIVER_API, getattr(session.c, "driver_api_trace_cbid", None))):
            for member, cbid in (enum.__members__.items() if enum is not None else ()):
                base = api_base_name(member)
                if base in LAUNCH_LAYOUTS:
                    self._forms[(int(domain), int(cbid))] = LAUNCH_LAYOUTS[base]

    def start(self) -> None:
        """Start handling launches; the first frame outside ds4lab and ``contextlib`` is the stack walks' anchor."""
        if self.queries is None:
            self.queries = CudaQueries()
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename.endswith(_ANCHOR_SKIP):
            f = f.f_back
        self._anchor = f
        self._stop = self.session.watch_launches(frozenset(LAUNCH_LAYOUTS), self.on_launch)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None
        self._anchor = None

    # ------------------------------------------------------------------ the hot path
    def on_launch(self, domain: int, cbid: int, cbdata) -> None:
        """CUPTI's callback at a launch's entry and exit; a launch unread at its entry is tried again at its exit
        (a lazily loaded module is loaded by the launch itself)."""
        key = (domain, cbid)
        form = self._forms.get(key)
        if form is None:
            return
        raw = self._raw
        if raw is None:
            raw = self._raw = self._callback_reader(cbdata)
        site, _, fp, sym, corr = self._fields.unpack(raw(cbdata))
        try:
            open_ = self.local.open
        except AttributeError:
            open_ = self.local.open = []
        if site:  # API exit
            if open_:
                ent = open_.pop()
                if not ent[1] and ent[2] == key and not (ent[3] is not None and ent[3][1]):
                    self._try(ent, form, fp, sym, again=True)
            return
        outer = open_[-1] if form[0] == "driver" and open_ else None
        if outer is not None:
            corr = outer[0]  # the runtime launch around it: one launch, one record
        ent = [corr, False, key, outer]  # corr, read, the call, the launch around it
        open_.append(ent)
        if outer is None and self.current_op is not None:
            op = self.current_op()
            if op is not None:
                self.op_of[corr] = op
        if outer is not None and outer[1]:
            return
        got = self._try(ent, form, fp, sym)
        if self.want_stacks and outer is None:
            # a stack only where the launch's bytes are new for its function (or unread): a launch that
            # differs between tokens has new bytes, one that repeats has its stack from the first time
            if got is not None:
                info, data = got
                if data in info.seen:
                    return
                info.seen.add(data)
            self.stacks[corr] = self._stack(sys._getframe(1))

    def _callback_reader(self, cbdata):
        """How a ``CUpti_CallbackData``'s bytes are read (an address, a ``CallbackData``'s ``_data``, or ``ptr``)."""
        size = self._fields.size
        string_at = ctypes.string_at
        if type(cbdata) is int:  # the address itself (:class:`~ds4lab.trace.cupti.NativeCallbacks`)
            return lambda cb: string_at(cb, size)
        data = getattr(cbdata, "_data", None)
        if data is not None and getattr(data, "nbytes", None) == size and callable(getattr(data, "tobytes", None)):
            return lambda cb: cb._data.tobytes()
        return lambda cb: string_at(int(cb.ptr), size)

    def _stack(self, frame) -> str:
        """The Python stack at ``frame``, made once per launch site, the walk stopping at :attr:`_anchor`."""
        codes, spots = [], []
        code, spot = codes.append, spots.append
        f, anchor = frame, self._anchor
        while f is not None:
            code(f.f_code)
            spot(f.f_lasti)
            if f is anchor:
                break
            f = f.f_back
        known = self._sites.get(spots := tuple(spots))
        if known is not None:
            for c, stack in known:
                if c == codes:  # list equality: identity first, so identical code objects compare at once
                    return stack
        from .stacks import python_stack

        stack = python_stack(frame, skip_files=self._skip)
        self._sites.setdefault(spots, []).append((codes, stack))
        return stack

    @property
    def unread(self) -> Counter:
        """Why launches are unread: reason → launches."""
        return Counter(self.why_unread.values())

    def _try(self, ent: list, form, fp: int, sym: int, again: bool = False):
        """Read the launch ``ent`` (:meth:`_read`); ``(function, bytes)`` or None (unread)."""
        try:
            got = self._read(form, ent[0], fp, sym, again)
        except Exception as e:  # noqa: BLE001 - never break the user's launch: say it and go on
            self.why_unread[ent[0]] = f"{type(e).__name__}: {e}"
            self.records.setdefault(ent[0], ["", None])
            return None
        if got is not None:
            ent[1] = True
            if ent[3] is not None:
                ent[3][1] = True
        return got

    def _read(self, form, corr: int, fp: int, sym: int, again: bool = False):
        """Read one launch's parameter bytes into :attr:`records` or mark it unread (the reason counted)."""
        domain, f_off, a_off, x_off = form
        u64 = _U64
        fn = u64(fp + f_off).value
        info = self._by_fn[domain].get(fn)
        if info is None or (again and info.params is None and not info.retried):
            info = self._resolve(domain, fn, sym, retried=again)
        if info.params is None:
            return self._unread(corr, info.fid, info.why)
        argv = u64(fp + a_off).value
        string_at = ctypes.string_at
        if argv:
            sizes = info.sizes
            if len(sizes) == 1:
                data = string_at(u64(argv).value, sizes[0])
            else:
                data = b"".join(map(string_at, info.argv.unpack(string_at(argv, info.argv.size)), sizes))
        elif x_off is not None and u64(fp + x_off).value:
            buf = _extra_buffer(u64(fp + x_off).value)
            if buf is None:
                return self._unread(corr, info.fid, "extra without CU_LAUNCH_PARAM_BUFFER_POINTER")
            data = b"".join([string_at(buf + off, size) for off, size in info.params])
        elif not info.params:
            data = b""
        else:
            return self._unread(corr, info.fid, "no argument array")
        data = self._values.setdefault(data, data)
        self.records[corr] = [info.fid, data]
        if self.why_unread:
            self.why_unread.pop(corr, None)
        return info, data

    def _unread(self, corr: int, fid: str, why: str) -> None:
        """Mark a launch unread, keeping every distinct reason its tries met. Returns None."""
        self.records[corr] = [fid, None]
        before = self.why_unread.get(corr)
        self.why_unread[corr] = why if not before or why in before else f"{before}; then {why}"
        return None

    def _resolve(self, domain: str, fn: int, sym: int, retried: bool = False) -> FunctionInfo:
        t0 = self.session.timestamp()
        fid = f"{domain[0]}{fn:x}"
        symbol = ""
        try:
            if sym:
                symbol = ctypes.string_at(sym).decode("utf-8", "replace")
            cufunc, why = (fn, "") if domain == "driver" else self.queries.runtime_function(fn)
            if not cufunc:
                info = FunctionInfo(symbol, None, why)
            else:
                layout, why = self.queries.param_layout(cufunc)
                info = FunctionInfo(symbol or self.queries.function_name(cufunc), layout, why)
        except Exception as e:  # noqa: BLE001 - a query that raised: this function is unread, said why
            info = FunctionInfo(symbol, None, f"{type(e).__name__}: {e}")
        info.retried, info.fid = retried, fid
        old = self._by_fn[domain].get(fn)
        if old is not None:
            info.seen = old.seen
        self.own.append((threading.get_native_id(), t0, self.session.timestamp()))
        self.functions[fid] = info
        self._by_fn[domain][fn] = info
        return info

    # ------------------------------------------------------------------ after the pass
    def digests(self) -> tuple[dict, dict]:
        """``({correlation id: [function id, digest | None]}, {digest: bytes})``: the launches as the store keeps them
        (:class:`ArgumentStore`), each distinct value digested once (:func:`digest`)."""
        names: dict = {}
        launches, blobs = {}, {}
        for corr, (fid, data) in self.records.items():
            if data is None:
                launches[corr] = [fid, None]
                continue
            d = names.get(data)
            if d is None:
                d = names[data] = digest(data)
                blobs[d] = data
            launches[corr] = [fid, d]
        return launches, blobs

    def resolve_ranges(self, values) -> dict:
        """``{value: (base, size)}`` for the values (varying words) that lie in device memory now."""
        out = {}
        if self.queries is None:
            return out
        t0 = self.session.timestamp()
        for v in list(values)[:MAX_RANGE_QUERIES]:
            try:
                r = self.queries.address_range(int(v))
            except Exception:  # noqa: BLE001 - a value the driver cannot place: no range
                r = None
            if r is not None:
                out[int(v)] = r
        self.own.append((threading.get_native_id(), t0, self.session.timestamp()))
        return out


#: Files of the frames between a pass's ``with`` block and :meth:`ArgumentCapture.start` (never its anchor).
_ANCHOR_SKIP = ("ds4lab/trace/arguments.py", "ds4lab/trace/recording.py", "ds4lab/audit/arguments.py",
                "contextlib.py")


def _cupti_file() -> str:
    from . import cupti

    return cupti.__file__


def _extra_buffer(extra: int) -> int | None:
    """The packed parameter buffer of a ``cuLaunchKernel`` ``extra`` array, or None."""
    i = 0
    while i < 64:
        key = _u64(extra + 8 * i)
        if key == PARAM_END:
            return None
        if key == PARAM_BUFFER_POINTER:
            return _u64(extra + 8 * (i + 1))
        i += 2
    return None


# ----------------------------------------------------------------------------- allocations
class MemoryTracker:
    """What the addresses point into (module docstring): torch's caching allocator where torch is loaded
    (``torch_module``: the module, or None to look in ``sys.modules``), on CUPTI's clock (``clock()``)."""

    def __init__(self, clock, torch_module=None) -> None:
        self.clock = clock
        self.torch = torch_module if torch_module is not None else _torch_if_loaded()
        self.pairs: list[tuple[int, int]] = []
        self.start_blocks: list = []
        self.segments: list = []
        self.events: list = []
        self.notes: list[str] = []
        self._history = False
        #: the pass's operator log where torch is loaded (:class:`ds4lab.trace.torch_ops.OpLog`)
        self.ops = None

    def _pair(self) -> None:
        self.pairs.append((time.time_ns(), int(self.clock())))

    def start(self) -> None:
        self._pair()
        if self.torch is None:
            return
        try:
            mem = self.torch.cuda.memory
            snap = mem.memory_snapshot()
            self.start_blocks = [(int(b["address"]), int(b["size"])) for s in snap for b in s.get("blocks", ())
                                 if b.get("state") == "active_allocated"]
            self.segments = [(int(s["address"]), int(s["total_size"])) for s in snap]
            mem._record_memory_history(enabled="all", context=None, max_entries=2_000_000)
            self._history = True
        except Exception as e:  # noqa: BLE001 - a torch without it: the tokens' temporaries stay unplaced
            self.notes.append(f"torch's caching allocator not followed ({type(e).__name__}: {e}): addresses inside "
                              "its segments are of unknown lifetime")

    def stop(self) -> None:
        self._pair()
        if not self._history:
            return
        mem = self.torch.cuda.memory
        try:
            snap = mem._snapshot()
            for dev in snap.get("device_traces", ()):
                for e in dev:
                    if e.get("action") in ("alloc", "free_requested", "free_completed") and "time_us" in e:
                        self.events.append((e["action"], int(e["addr"]), int(e["size"]), int(e["time_us"])))
            for s in snap.get("segments", ()):
                seg = (int(s["address"]), int(s["total_size"]))
                if seg not in self.segments:
                    self.segments.append(seg)
            if not self.events:
                self.notes.append("torch's allocator history has no timed events (time_us): temporaries unplaced")
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"torch's allocator history unreadable ({type(e).__name__}: {e})")
        finally:
            try:
                mem._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass

    def to_clock(self, unix_ns: int) -> int:
        """A wall-clock time in CUPTI's clock (the line through the start and end pairs)."""
        (u0, c0), (u1, c1) = self.pairs[0], self.pairs[-1]
        slope = (c1 - c0) / (u1 - u0) if u1 != u0 else 1.0
        return int(c0 + (unix_ns - u0) * slope)

    def allocations(self) -> list:
        """``[base, size, alloc_ns, free_ns, source]`` of torch's blocks (``-1``: before the pass / alive at its end).
        """
        out = [[a, s, -1, -1, "torch block"] for a, s in self.start_blocks]
        live = {a: i for i, (a, _, _, _, _) in enumerate(out)}
        for action, addr, size, t_us in sorted(self.events, key=lambda e: e[3]):
            t = self.to_clock(t_us * 1000)
            if action == "alloc":
                live[addr] = len(out)
                out.append([addr, size, t, -1, "torch block"])
            elif addr in live:
                i = live.pop(addr)
                out[i][3] = t
        return out


def _torch_if_loaded():
    t = sys.modules.get("torch")
    try:
        return t if t is not None and t.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


def cupti_allocations(records) -> list:
    """``[base, size, alloc_ns, free_ns, source]`` from CUPTI ``memory`` records (allocation and release by address)."""
    out, live = [], {}
    for r in sorted((r for r in records if getattr(r, "kind", None) == "memory"), key=lambda r: r.timestamp_ns):
        op, addr, size, ts = r.operation, r.address, r.bytes, r.timestamp_ns
        if op == 1:
            live[addr] = len(out)
            out.append([addr, size, ts, -1, "cudaMalloc"])
        elif op == 2:
            if addr in live:
                out[live.pop(addr)][3] = ts
            else:  # freed during the pass, allocated before it
                out.append([addr, size, -1, ts, "cudaMalloc"])
    return out


# ----------------------------------------------------------------------------- the file
@dataclass
class ArgumentStore:
    """What an argument pass recorded (:func:`save` / :func:`load`): ``functions`` (id → ``{"name", "params",
    "why"}``), ``launches`` (correlation → ``[function id, digest | None]``), ``blobs`` (digest → bytes, only where
    tokens differ), ``stacks`` (correlation → stack), ``allocations`` (``[base, size, alloc_ns, free_ns, source]``,
    ``-1``: before the pass / alive at its end), ``ranges`` (value → ``[base, size]`` driver range), ``segments``
    (torch's caching-allocator segments; None: not followed), ``host_maps`` (``[start, end, name]`` of
    ``/proc/self/maps``), ``ops`` (index → operator call; None: no op log), ``op_of`` (correlation → op index),
    ``token_range``, ``table`` (the pass's event table file), ``cost`` (:func:`measure_overhead`), ``notes``."""

    functions: dict = field(default_factory=dict)
    launches: dict = field(default_factory=dict)
    blobs: dict = field(default_factory=dict)
    stacks: dict = field(default_factory=dict)
    allocations: list = field(default_factory=list)
    ranges: dict = field(default_factory=dict)
    segments: list | None = None
    host_maps: list = field(default_factory=list)
    ops: dict | None = None
    op_of: dict = field(default_factory=dict)
    token_range: str | None = None
    table: str = ""
    cost: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    pruned: bool = False

    def params(self, corr: int):
        """``(function name, [(offset, size)] | None, bytes | None)`` of a launch."""
        fid, d = self.launches.get(int(corr), ("", None))
        f = self.functions.get(fid, {})
        return f.get("name", ""), f.get("params"), self.blobs.get(d) if d else None


def save(store: ArgumentStore, path) -> Path:
    """Write ``store`` as gzip JSON (via ``path.tmp``, moved into place). Returns the path."""
    path = Path(path)
    d = {"format": "ds4lab audit arguments v1", "functions": store.functions,
         "launches": {str(k): v for k, v in store.launches.items()},
         "blobs": {k: v.hex() for k, v in store.blobs.items()}, "stacks": {str(k): v for k, v in store.stacks.items()},
         "allocations": store.allocations, "ranges": {str(k): list(v) for k, v in store.ranges.items()},
         "segments": store.segments, "host_maps": store.host_maps,
         "ops": None if store.ops is None else {str(k): v for k, v in store.ops.items()},
         "op_of": {str(k): v for k, v in store.op_of.items()}, "token_range": store.token_range, "table": store.table, "cost": store.cost,
         "notes": store.notes, "pruned": store.pruned}
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(d, f)
    tmp.replace(path)
    return path


def load(path) -> ArgumentStore:
    """Read a store written by :func:`save`. Raises ValueError for a file that is not one."""
    try:
        with gzip.open(Path(path), "rt", encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a ds4lab arguments file ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or d.get("format") != "ds4lab audit arguments v1":
        raise ValueError(f"{path}: not a ds4lab arguments file")
    return ArgumentStore(
        functions=d["functions"], launches={int(k): v for k, v in d["launches"].items()},
        blobs={k: bytes.fromhex(v) for k, v in d["blobs"].items()}, stacks={int(k): v for k, v in d["stacks"].items()},
        allocations=d["allocations"], ranges={int(k): tuple(v) for k, v in d["ranges"].items()},
        segments=d.get("segments"), host_maps=d.get("host_maps", []),
        ops=None if d.get("ops") is None else {int(k): v for k, v in d["ops"].items()},
        op_of={int(k): int(v) for k, v in d.get("op_of", {}).items()}, token_range=d.get("token_range"), table=d.get("table", ""),
        cost=d.get("cost", {}), notes=d.get("notes", []), pruned=bool(d.get("pruned")))


def store_beside(table_path) -> Path | None:
    """The arguments file that goes with a recording: ``<stem>.arguments.json.gz`` beside it (recorded in the same
    pass), else ``arguments.json.gz`` beside it (``ds4lab audit run``'s second pass), or None."""
    p = Path(table_path)
    stem = p.name.split(".", 1)[0]
    for name in (stem + STORE_SUFFIX, STORE_NAME):
        q = p.with_name(name)
        if q.is_file():
            return q
    return None


# ----------------------------------------------------------------------------- tokens of a pass
@dataclass
class TokenLaunches:
    """The launches of a pass's tokens: ``tokens`` (per token ``(correlation id, kernel name, api start_ns)`` in
    launch order), ``shapes`` (shape id per token), ``start_ns``/``end_ns`` (host windows), ``how``, ``notes``."""

    tokens: list
    shapes: list
    start_ns: list
    end_ns: list
    how: str
    notes: list = field(default_factory=list)
    unit: str = ""

    def groups(self) -> list[list[int]]:
        """Tokens with identical launch lists, two or more per group, largest first."""
        by: dict = {}
        for t, s in enumerate(self.shapes):
            by.setdefault(s, []).append(t)
        return sorted((g for g in by.values() if len(g) >= 2), key=len, reverse=True)


def prune(store: ArgumentStore, tl: TokenLaunches | None) -> None:
    """Keep the bytes and stacks of the launches whose digest differs between tokens with identical launch lists,
    only digests elsewhere; with ``tl`` None keep every distinct value, said."""
    if tl is None:
        store.notes.append("no tokens found at the end of the pass: every distinct argument value is kept")
        return
    keep_d, keep_c = set(), set()
    for g in tl.groups():
        for i in range(len(tl.tokens[g[0]])):
            corrs = [tl.tokens[t][i][0] for t in g]
            ds = [store.launches.get(c, ["", None])[1] for c in corrs]
            if len(set(ds)) > 1:
                keep_d.update(d for d in ds if d)
                keep_c.update(corrs)
    store.blobs = {d: b for d, b in store.blobs.items() if d in keep_d}
    store.stacks = {c: s for c, s in store.stacks.items() if c in keep_c}
    store.op_of = {c: o for c, o in store.op_of.items() if c in keep_c}
    if store.ops is not None:
        keep_o = set(store.op_of.values())
        store.ops = {i: o for i, o in store.ops.items() if i in keep_o or "copy" in o}
    store.pruned = True


def split(params, blob: bytes) -> list[bytes]:
    """A launch's parameter bytes, one chunk per parameter (the store keeps them in parameter order)."""
    out, pos = [], 0
    for _, size in params:
        out.append(blob[pos:pos + size])
        pos += size
    return out


def words(chunk: bytes) -> list[tuple[int, bytes]]:
    """The comparable pieces of one parameter: itself when it is 8 bytes or less, else its 8-byte words (4-byte where
    its size is not a multiple of 8), as ``(offset in the parameter, bytes)``."""
    if len(chunk) <= 8:
        return [(0, chunk)]
    w = 8 if len(chunk) % 8 == 0 else 4
    return [(j, chunk[j:j + w]) for j in range(0, len(chunk) - w + 1, w)]


def varying_words(store: ArgumentStore, tl: TokenLaunches) -> set:
    """The 8-byte pieces (as unsigned values) that differ between tokens at one launch and parameter offset: the values
    whose allocation the driver is asked for."""
    out = set()
    for g in tl.groups():
        for i in range(len(tl.tokens[g[0]])):
            vals = [store.params(tl.tokens[t][i][0]) for t in g]
            if any(b is None or p is None for _, p, b in vals) or len({b for _, _, b in vals}) < 2:
                continue
            chunks = [split(vals[0][1], b) for _, _, b in vals]
            for j in range(len(chunks[0])):
                pieces = [words(c[j]) for c in chunks]
                for w in range(len(pieces[0])):
                    got = {int.from_bytes(p[w][1], "little") for p in pieces if len(p[w][1]) == 8}
                    if len(got) > 1:
                        out |= got
    return out


# ----------------------------------------------------------------------------- the cost
#: What an argument pass runs beside the step (:func:`measure_overhead`'s ``parts``): the launch handler
#: (:class:`ArgumentCapture`), the operator log (:class:`ds4lab.trace.torch_ops.OpLog`) and the caching
#: allocator's history (:class:`MemoryTracker`), the last two where torch is loaded.
PASS_PARTS = ("launches", "ops", "memory")
PART_NAMES = {"launches": "launch handler", "ops": "operator log", "memory": "allocator history"}


def measure_overhead(step, launches_per_step: float | None = None, *, session=None, rounds: int = 8,
                     steps: int = 3, sync=None, clock=time.perf_counter, queries=None,
                     parts=("launches",), torch_module=None) -> dict:
    """What argument capture costs: ``rounds`` interleaved pairs of ``steps`` calls of ``step``, plain against
    the pass's ``parts`` on (:data:`PASS_PARTS`; ``"ops"`` and ``"memory"`` where torch is loaded), each the mean µs
    per step after ``sync()``, in the steady state (a warm block first). ``launches_per_step``: to divide by (None:
    counted). Returns ``{"per_step_us", "lo", "hi", "n", "measurable", "per_launch_us", "per_launch_lo",
    "per_launch_hi", "launches_per_step", "baseline_us", "parts", "text"}``; ValueError for an unknown part."""
    from .cupti import CuptiSession
    from ..timing import interleaved_pairs, paired_difference

    bad = [p for p in parts if p not in PASS_PARTS]
    if bad:
        raise ValueError(f"unknown part(s) {', '.join(map(repr, bad))} of the argument pass; choose from: "
                         f"{', '.join(PASS_PARTS)}")
    session = session or CuptiSession.get()
    sync = sync or (lambda: None)
    torch = torch_module if torch_module is not None else (_torch_if_loaded() if set(parts) - {"launches"} else None)
    on = ["launches"] + [p for p in ("ops", "memory") if p in parts and torch is not None]

    def block() -> float:
        sync()
        t0 = clock()
        for _ in range(steps):
            step()
        sync()
        return (clock() - t0) * 1e6 / steps

    def started(cap):
        """``cap`` started with the other parts; returns the function that stops them all."""
        stops = []
        if "memory" in on:
            mem = MemoryTracker(session.timestamp, torch)
            mem.start()
            stops.append(mem.stop)
        if "ops" in on:
            from .torch_ops import OpLog

            log = OpLog(torch, session.timestamp)
            log.start()
            cap.current_op = log.current
            stops.append(log.stop)
        cap.start()
        stops.append(cap.stop)

        def stop():
            for s in reversed(stops):
                s()
        return stop

    block()  # warm: every function's layout asked once outside the pairs, and kept for them
    warm = ArgumentCapture(session, queries)
    stop = started(warm)
    try:
        block()
    finally:
        stop()
    counted = len(warm.records) / steps

    def with_capture() -> float:
        stop = started(ArgumentCapture(session, warm.queries, stacks=True, shared=warm))
        try:
            return block()
        finally:
            stop()

    a, b = interleaved_pairs(block, with_capture, rounds)
    d = paired_difference(a, b)
    per_step = float(launches_per_step) if launches_per_step is not None else counted
    n = max(per_step, 1.0)
    what = ", ".join(PART_NAMES[p] for p in on)
    out = {"per_step_us": d.median, "lo": d.lo, "hi": d.hi, "n": d.n, "measurable": d.measurable,
           "baseline_us": d.baseline, "launches_per_step": per_step, "launches_counted": counted,
           "per_launch_us": d.median / n, "per_launch_lo": d.lo / n, "per_launch_hi": d.hi / n, "parts": on}
    out["text"] = (f"{out['per_launch_us']:.2f} µs per launch (95 % CI {out['per_launch_lo']:.2f}–"
                   f"{out['per_launch_hi']:.2f}; {d.fmt()} per step of {n:g} launches; {what})" if d.measurable
                   else f"{d.fmt()} per step of {n:g} launches ({what})")
    return out


__all__ = ["ArgumentCapture", "ArgumentStore", "CudaQueries", "FunctionInfo", "LAUNCH_LAYOUTS",
           "MemoryTracker", "OWN_CALLS", "PASS_PARTS", "STORE_NAME", "STORE_SUFFIX", "TokenLaunches", "cupti_allocations", "digest",
           "load", "measure_overhead", "prune", "save", "split", "store_beside", "varying_words",
           "words"]
