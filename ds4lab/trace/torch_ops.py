"""What PyTorch's dispatcher saw during an argument pass: every operator call, its host arguments, and
which kernel launches it made.

A kernel's by-value parameters hold what its launcher put there and, in a struct passed by value, what
it left there: PyTorch's TensorIterator kernels take offset calculators of ``MAX_DIMS`` slots of which
only the tensor's rank are set (aten/src/ATen/cuda/detail/OffsetCalculator.cuh), the rest being what the
host stack held. Those words differ at every token without being values. The launcher of a PyTorch
kernel is an operator, and an operator's kernels are a function of its host arguments (the sizes,
strides, dtypes and storage offsets of its tensors, its scalars, the values of the CPU tensors it reads
on the host) and of device memory. So the op log keeps, per operator call, a key of those host
arguments (data pointers left out: addresses are placed by the allocations), the storage ranges of its
CUDA tensors, and a short text; :class:`~ds4lab.trace.arguments.ArgumentCapture` tags each launch with
the innermost operator call around it. The audit (:mod:`ds4lab.audit.frozen`) then tells a word an
operator set from host arguments that changed (a frozen value, named with the operator and the
argument) from one no host argument of the operator explains (set by nobody, read by nobody).

It also keeps every copy between a CPU tensor that is not pinned and a CUDA tensor
(:data:`COPY_OPS`): PyTorch refuses those while a stream captures ("Cannot copy between CPU and CUDA
tensors during CUDA graph capture unless the CPU tensor is pinned": aten/src/ATen/native/cuda/Copy.cu,
``copy_kernel_cuda``), a 0-dim source included, where CUDA itself would capture the copy as a memcpy
node. (``torch.tensor(data, device="cuda")`` copies below the dispatcher, where no mode sees it: the
audit finds that one by its CUDA copy, :func:`ds4lab.audit.frozen.compare`.)

The log is a ``TorchDispatchMode`` (``torch.utils._python_dispatch``), entered on the thread that
enters the argument pass, so it sees the operators that thread runs below autograd. It costs Python at
every operator call: it runs in the argument pass only, never in timed tokens.
"""

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
    """Names and positions of the arguments an operator only writes (an ``out=`` argument, the ``self``
    of :data:`WRITE_ONLY_SELF`): their prior values are no input, and stay out of the key."""
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


def describe(torch, args, kwargs, out=None, written=frozenset()):
    """``(key, text, spans, cpu, opaque)`` of one operator call, read before it runs (``out`` None) or
    of its results (``out``: spans and CPU tensors only, their values not read): ``key`` a digest of its host arguments (no data pointers),
    ``text`` a short rendering, ``spans`` ``[[start, nbytes]]`` of the storages of its CUDA tensors, ``cpu``
    ``[[dim, numel, pinned]]`` of its CPU tensors, ``opaque`` whether a CPU tensor too large to key was
    among them."""
    h = hashlib.blake2b(digest_size=8)
    spans, cpu, parts = [], [], []
    opaque = False

    def walk(x, show: bool, values: bool = True):
        nonlocal opaque
        if isinstance(x, torch.Tensor):
            dev = x.device.type
            meta = f"{dev} {str(x.dtype).replace('torch.', '')}{list(x.shape)}"
            h.update(f"T{meta}{tuple(x.stride())}{x.storage_offset()}".encode())
            if dev == "cpu":
                pinned = bool(x.is_pinned()) if x.numel() else False
                cpu.append([x.dim(), int(x.numel()), pinned])
                if not values:
                    meta += " (written)"  # (or a result: its values are no input either)
                elif x.numel() <= CPU_VALUES_MAX:
                    v = x.detach().reshape(-1).tolist()
                    h.update(repr(v).encode())
                    meta += f"={v[0] if x.dim() == 0 else ('…' if len(v) > 4 else v)}"
                else:
                    opaque = True
                meta += " pinned" if pinned else ""
            else:
                try:
                    st = x.untyped_storage()
                    spans.append([int(st.data_ptr()), int(st.nbytes())])
                except Exception:  # noqa: BLE001 - a tensor without storage (a view of a subclass): no span
                    pass
            if show:
                parts.append(meta)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y, show, values)
        elif isinstance(x, dict):
            for k, y in x.items():
                h.update(str(k).encode())
                walk(y, show, k not in written)
        else:
            r = repr(x)
            h.update(r.encode())
            if show:
                parts.append(r[:40])

    if out is not None:
        walk(out, False, False)
        return "", "", spans, cpu, False
    for k, a in enumerate(args):
        walk(a, True, k not in written)
    walk(kwargs or {}, True)
    return h.hexdigest(), ", ".join(parts)[:240], spans, cpu, opaque


class OpLog:
    """The op log of one argument pass (module docstring). ``start()`` enters the dispatch mode on this
    thread, ``stop()`` leaves it; :meth:`current` is the innermost operator call open on the calling
    thread (an index into :attr:`ops`, or None). :attr:`ops`: per call ``{"name", "key", "text", "spans",
    "cpu", "opaque", "t_ns", "copy"}`` (``copy``: ``{"dim", "numel", "direction"}`` for a copy between a
    CPU tensor that is not pinned and a CUDA tensor, with ``"stack"``, the Python stack at it). ``clock``:
    the records' clock (``cuptiGetTimestamp``), for placing a copy in a token."""

    def __init__(self, torch_module, clock) -> None:
        self.torch = torch_module
        self.clock = clock
        self.ops: list[dict] = []
        self.local = threading.local()
        self.notes: list[str] = []
        self._mode = None

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

    def _call(self, func, args, kwargs):
        st = self.local.__dict__.setdefault("open", [])
        i = len(self.ops)
        entry = {"name": _name(func), "t_ns": int(self.clock())}
        try:  # the host arguments as the operator gets them (before an in-place one changes them)
            key, text, spans, cpu, opaque = describe(self.torch, args, kwargs, written=_written(func))
        except Exception as e:  # noqa: BLE001 - never break the user's operator: this call is opaque
            key, text, spans, cpu, opaque = f"?{i}", f"unreadable ({type(e).__name__})", [], [], True
        entry.update(key=key, text=text, spans=spans, cpu=cpu, opaque=opaque)
        self.ops.append(entry)
        st.append(i)
        try:
            out = func(*args, **kwargs)
        finally:
            st.pop()
        out_cpu = []
        try:
            _, _, out_spans, out_cpu, _ = describe(self.torch, (), {}, out)
            spans += out_spans
        except Exception:  # noqa: BLE001 - results without storage: no span
            pass
        base = entry["name"].split(".", 1)[0]
        if base in COPY_OPS and spans:  # a result on the host (x.cpu(), x.to("cpu")) is the copy's CPU side
            cpu = cpu + out_cpu
        if base in COPY_OPS and any(not p for _, _, p in cpu) and spans:
            from .stacks import python_stack

            d, n, _ = next(c for c in cpu if not c[2])
            entry["copy"] = {"dim": d, "numel": n, "direction": "h2d" if _cpu_is_source(self.torch, base, args) else "d2h",
                             "stack": python_stack(sys._getframe(1), skip_files=(__file__,))}
        return out


def _cpu_is_source(torch, base: str, args) -> bool:
    """Whether the CPU tensor is the copy's source: ``copy_(self, src)``'s ``src``, ``_to_copy(self)``'s
    ``self``, ``_copy_from(self, dst)``'s ``self``."""
    t = args[1] if base == "aten::copy_" and len(args) > 1 else (args[0] if args else None)
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def random_op(name: str) -> bool:
    """Whether an operator reads a random generator's state (never called unset: :data:`RANDOM_OPS`)."""
    base = name.split("::", 1)[-1]
    return any(r in base for r in RANDOM_OPS)


__all__ = ["COPY_OPS", "CPU_VALUES_MAX", "OpLog", "RANDOM_OPS", "describe", "random_op"]
