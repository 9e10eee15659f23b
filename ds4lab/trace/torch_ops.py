"""What PyTorch's dispatcher saw during an argument pass (a ``TorchDispatchMode`` on the pass's thread): every operator
call, a key of its host arguments (no data pointers), its CUDA tensors' storage ranges, the numbers its host
arguments hold, the launches it made, and every copy between an unpinned CPU tensor and a CUDA tensor
(:data:`COPY_OPS`: refused under capture, ``aten/src/ATen/native/cuda/Copy.cu``). :mod:`ds4lab.audit.frozen`
uses it to tell a word an operator set from one nothing explains. Why and what it costs:
docs/audit-arguments.md, "The operator log"."""

from __future__ import annotations

import hashlib
import sys
import threading

#: Operators that copy between devices (the ones ``copy_kernel_cuda`` is reached from).
COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize"})
#: Operators whose kernels read host state that is not an argument (a generator's offset): their words
#: are never called unset.
RANDOM_OPS = ("bernoulli", "dropout", "rand", "normal", "uniform", "multinomial", "exponential", "geometric",
              "cauchy", "log_normal", "random_", "poisson")
#: A CPU tensor of at most this many elements is keyed by its values; a larger one by its size alone, and
#: the call is marked ``opaque`` (its host content was not compared).
CPU_VALUES_MAX = 4096


def _name(func) -> str:
    n = getattr(func, "_schema", None)
    if n is not None:
        return str(n.name) + (f".{n.overload_name}" if n.overload_name else "")
    return str(func)


#: In-place operators whose ``self`` is only written (its values are no input).
WRITE_ONLY_SELF = frozenset({"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_",
                             "aten::random_", "aten::bernoulli_", "aten::exponential_"})


def _written(func) -> set:
    """Names and positions of the arguments an operator only writes (an ``out=`` argument, the ``self`` of
    :data:`WRITE_ONLY_SELF`): their prior values are no input, and stay out of the key."""
    sch = getattr(func, "_schema", None)
    if sch is None:
        return set()
    out = set()
    whole = str(sch.name) in WRITE_ONLY_SELF
    for k, a in enumerate(sch.arguments):
        ai = a.alias_info
        if ai is not None and ai.is_write and (a.kwarg_only or whole or "out" in sch.overload_name):
            out |= {k, a.name}
    return out


def _read(torch, x, written: bool):
    """One argument as the hot path keeps it: a tensor as a ``TENSOR`` tuple (a CPU tensor's values read now, up to
    :data:`CPU_VALUES_MAX`, else ``OPAQUE``), lists and dicts item by item, anything else as it is."""
    if isinstance(x, torch.Tensor):
        dev = x.device.type
        try:
            st = x.untyped_storage()
            start, nbytes = int(st.data_ptr()), int(st.nbytes())
        except Exception:  # noqa: BLE001 - a tensor without storage (a view of a subclass): no span
            start, nbytes = None, 0
        vals, pinned = None, False
        if dev == "cpu":
            n = x.numel()
            pinned = bool(x.is_pinned()) if n else False
            if not written:
                vals = x.detach().reshape(-1).tolist() if n <= CPU_VALUES_MAX else OPAQUE
        return (TENSOR, dev, x.dtype, tuple(x.shape), tuple(x.stride()), int(x.storage_offset()), start, nbytes,
                vals, pinned)
    if isinstance(x, (list, tuple)):
        return tuple(_read(torch, y, written) for y in x)
    if isinstance(x, dict):
        return (DICT, tuple((k, _read(torch, y, written)) for k, y in x.items()))
    return x


#: Markers of :func:`_read`'s records (objects no argument can be).
TENSOR, DICT, OPAQUE = object(), object(), object()
#: A CPU tensor of at most this many elements gives its values to :func:`describe`'s ``vals`` one by one.
TRACKED_VALUES_MAX = 16


def describe(raw, names=()):
    """``{"key", "text", "spans", "cpu", "opaque", "vals"}`` of one operator call from ``raw`` (``[(position or
    keyword, record, written)]``; ``names``: the schema's argument names): the host-argument digest, a short text,
    its CUDA storages ``[[start, nbytes]]``, its CPU tensors ``[[dim, numel, pinned]]``, whether one was too large to
    key, and ``[[label, number]]`` of the numbers the host gives it (scalars, small CPU tensors' values, sizes,
    strides, numel, offset), labelled by argument name."""
    h = hashlib.blake2b(digest_size=8)
    spans, cpu, parts, vals = [], [], [], []
    opaque = False

    def walk(x, label: str, written: bool, show: bool):
        nonlocal opaque
        if x is OPAQUE_CALL:
            opaque = True
        elif isinstance(x, tuple) and x and x[0] is TENSOR:
            _, dev, dtype, shape, stride, off, start, nbytes, v, pinned = x
            meta = f"{dev} {str(dtype).replace('torch.', '')}{list(shape)}"
            if not show:  # a result: its storage is a span of the call, nothing of it is a host argument
                if dev == "cpu":
                    cpu.append([len(shape), _numel(shape), pinned])
                elif start is not None:
                    spans.append([start, nbytes])
                return
            h.update(f"T{meta}{stride}{off}".encode())
            vals.extend([[f"{label}.size{d}", n] for d, n in enumerate(shape)])
            vals.extend([[f"{label}.stride{d}", n] for d, n in enumerate(stride)])
            vals.extend([[f"{label}.numel", _numel(shape)], [f"{label}.offset", off]])
            if dev == "cpu":
                cpu.append([len(shape), _numel(shape), pinned])
                if written or v is None:
                    meta += " (written)"  # (or a result: its values are no input either)
                elif v is OPAQUE:
                    opaque = True
                else:
                    h.update(repr(v).encode())
                    meta += f"={v[0] if not shape else ('…' if len(v) > 4 else v)}"
                    if len(v) <= TRACKED_VALUES_MAX:
                        vals.extend([[label if not shape else f"{label}[{i}]", _number(e)] for i, e in enumerate(v)
                                     if _number(e) is not None])
                meta += " pinned" if pinned else ""
            elif start is not None:
                spans.append([start, nbytes])
            if show:
                parts.append(meta)
        elif isinstance(x, tuple) and len(x) == 2 and x[0] is DICT:
            for k, y in x[1]:
                h.update(str(k).encode())
                walk(y, str(k), written, show)
        elif isinstance(x, tuple):
            for i, y in enumerate(x):
                walk(y, f"{label}.{i}", written, show)
        elif show:
            r = repr(x)
            h.update(r.encode())
            n = _number(x)
            if n is not None:
                vals.append([label, n])
            parts.append(r[:40])

    for k, x, written in raw:
        label = names[k] if isinstance(k, int) and k < len(names) else str(k)
        walk(x, label, written, k != "out")
    return {"key": h.hexdigest(), "text": ", ".join(parts)[:240], "spans": spans, "cpu": cpu, "opaque": opaque,
            "vals": vals}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _number(x):
    """``x`` as an int or float where it is a number (a bool as 0/1), else None."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, (int, float)):
        return x
    return None


class OpLog:
    """The op log of one argument pass: ``start()``/``stop()`` enter and leave the dispatch mode on this thread;
    :meth:`current` is the innermost open call (an index into :attr:`ops`, or None). :attr:`ops`, made after the
    pass, holds per call ``{"name", "key", "text", "spans", "cpu", "opaque", "vals", "t_ns", "copy"}``
    (:func:`describe`; ``copy`` for an unpinned CPU ↔ CUDA copy, with its stack). ``clock``: the records' clock."""

    def __init__(self, torch_module, clock) -> None:
        self.torch = torch_module
        self.clock = clock
        self.raw: list = []
        self.local = threading.local()
        self.notes: list[str] = []
        self._mode = None
        self._ops: list | None = None
        self._funcs: dict = {}

    def current(self):
        """The index into :attr:`ops` of the innermost operator call open on this thread, or None."""
        st = getattr(self.local, "open", None)
        return st[-1] if st else None

    def start(self) -> None:
        """Enter the dispatch mode on this thread (``torch.utils._python_dispatch.TorchDispatchMode``)."""
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return log._call(func, args, kwargs or {})

        self._mode = _Mode()
        self._mode.__enter__()

    def stop(self) -> None:
        """Leave the dispatch mode (a second call does nothing)."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    @property
    def ops(self) -> list:
        """Every operator call, described (class docstring); made from the raw records at the first read."""
        if self._ops is None or len(self._ops) != len(self.raw):
            done = self._ops or []
            self._ops = done + [self._describe(r) for r in self.raw[len(done):]]
        return self._ops

    def _describe(self, r) -> dict:
        func, t_ns, raw, copy = r
        name, names, _ = self._func(func)
        try:
            d = describe(raw, names)
        except Exception as e:  # noqa: BLE001 - a call that cannot be described is opaque
            d = {"key": f"?{id(r)}", "text": f"unreadable ({type(e).__name__})", "spans": [], "cpu": [],
                 "opaque": True, "vals": []}
        entry = {"name": name, "t_ns": t_ns, **d}
        if copy is not None:
            entry["copy"] = copy
        return entry

    def _func(self, func):
        """``(name, argument names, written positions and names)`` of an operator, asked once."""
        got = self._funcs.get(func)
        if got is None:
            sch = getattr(func, "_schema", None)
            names = tuple(a.name for a in sch.arguments) if sch is not None else ()
            got = self._funcs[func] = (_name(func), names, _written(func))
        return got

    def _call(self, func, args, kwargs):
        st = self.local.__dict__.setdefault("open", [])
        i = len(self.raw)
        name, _, written = self._func(func)
        t = self.torch
        try:  # the host arguments as the operator gets them (before an in-place one changes them), read raw
            raw = [(k, _read(t, a, k in written), k in written) for k, a in enumerate(args)]
            raw += [(k, _read(t, a, k in written), k in written) for k, a in kwargs.items()]
        except Exception:  # noqa: BLE001 - never break the user's operator: this call is opaque
            raw = [("?", OPAQUE_CALL, False)]
        rec = [func, int(self.clock()), raw, None]
        self.raw.append(rec)
        st.append(i)
        try:
            out = func(*args, **kwargs)
        finally:
            st.pop()
        try:  # the results' storages are the call's spans too (their values are no input)
            raw.append(("out", _read(t, out, True), True))
        except Exception:  # noqa: BLE001 - results without storage: no span
            pass
        base = name.split(".", 1)[0]
        if base in COPY_OPS:
            self._copy(rec, base, args, raw)
        return out

    def _copy(self, rec, base: str, args, raw) -> None:
        """Mark an unpinned CPU ↔ CUDA copy (:data:`COPY_OPS`) with the Python stack at it (rare: taken now)."""
        tensors = [x for x in _flat(raw) if x[1] in ("cpu", "cuda")]
        if not any(x[1] == "cuda" for x in tensors):
            return
        pageable = next((x for x in tensors if x[1] == "cpu" and not x[9]), None)
        if pageable is None:
            return
        from .stacks import python_stack

        rec[3] = {"dim": len(pageable[3]), "numel": _numel(pageable[3]),
                  "direction": "h2d" if _cpu_is_source(self.torch, base, args) else "d2h",
                  "stack": python_stack(sys._getframe(2), skip_files=(__file__,))}


#: The record of a call whose arguments could not be read (its key is its own: never the same as another's).
OPAQUE_CALL = object()


def _flat(raw):
    """The tensor records among a call's raw arguments."""
    out = []

    def walk(x):
        if isinstance(x, tuple) and x and x[0] is TENSOR:
            out.append(x)
        elif isinstance(x, tuple) and len(x) == 2 and x[0] is DICT:
            for _, y in x[1]:
                walk(y)
        elif isinstance(x, tuple):
            for y in x:
                walk(y)

    for _, x, _ in raw:
        walk(x)
    return out


def _cpu_is_source(torch, base: str, args) -> bool:
    """Whether the CPU tensor is the copy's source (``copy_``'s ``src``, else ``self``)."""
    t = args[1] if base == "aten::copy_" and len(args) > 1 else (args[0] if args else None)
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def random_op(name: str) -> bool:
    """Whether an operator reads a random generator's state (never called unset: :data:`RANDOM_OPS`)."""
    base = name.split("::", 1)[-1]
    return any(r in base for r in RANDOM_OPS)


__all__ = ["COPY_OPS", "CPU_VALUES_MAX", "OpLog", "RANDOM_OPS", "TRACKED_VALUES_MAX", "describe", "random_op"]
