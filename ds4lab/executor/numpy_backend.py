"""The ``numpy`` backend: the CPU reference executor. Same launch layer as the GPU, each launch computed by its NumPy
``ref``; no timing, inert streams and events, experts generated lazily (:class:`LazyBank`)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ..token import weights as W
from .base import Executor


class LazyBank:
    """Expert matrices generated on first use (an LRU of ``keep``): ``bank[e]`` is expert ``e``'s
    :class:`~ds4lab.token.weights.QTensor`; ``qs`` and ``d`` are None."""

    qs = None
    d = None

    def __init__(self, spec: W.WeightSpec, seed: int, keep: int = 64) -> None:
        self.spec = spec
        self.rows, self.cols, self.fmt = spec.rows, spec.cols, spec.fmt
        self._key = W.tensor_key(seed, spec.name)
        self._cache: OrderedDict[int, W.QTensor] = OrderedDict()
        self._keep = keep

    def __getitem__(self, e: int) -> W.QTensor:
        e = int(e)
        if not 0 <= e < self.spec.subs:
            raise IndexError(f"expert {e} out of range 0..{self.spec.subs - 1} of {self.spec.name}")
        t = self._cache.get(e)
        if t is None:
            t = W.gen_qtensor(self.fmt, self._key, e, self.rows, self.cols)
            self._cache[e] = t
            if len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(e)
        return t


class HostToken:
    """A stream or event of the CPU backend: a named token with nothing behind it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"<numpy {self.kind}>"


class NumpyBackend(Executor):
    """CPU reference executor (see module docstring). Never measures time."""

    name = "numpy"
    is_gpu = False
    measures_time = False
    xp = np

    def __init__(self, seed: int = 1234) -> None:
        self.seed = seed

    def empty(self, shape, dtype):
        # NaN-poisoned float buffers: a launch that fails to write shows up in the reference.
        a = np.empty(shape, dtype=dtype)
        if a.dtype.kind == "f":
            a.fill(np.nan)
        return a

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def from_host(self, a):
        return np.array(a, copy=True)

    def to_host(self, a):
        return np.asarray(a)

    def make_weight(self, spec: W.WeightSpec):
        key = W.tensor_key(self.seed, spec.name)
        if spec.fmt == "f32":
            return W.gen_f32(key, spec.n_weights, spec.scale, spec.offset)
        if spec.subs > 1:
            return LazyBank(spec, self.seed)
        return W.gen_qtensor(spec.fmt, key, 0, spec.rows, spec.cols)

    def fill_f32(self, out, name, scale, offset, seed):
        out[...] = W.gen_f32(W.tensor_key(seed, name), out.size, scale, offset).reshape(out.shape)

    def malloc(self, shape, dtype):
        return self.empty(shape, dtype)

    def free(self, buf) -> None:
        pass

    def event_synchronize(self, event) -> None:
        pass

    def event_elapsed_ms(self, start, end) -> float:
        raise NotImplementedError("the numpy backend makes no timing claims: event times are not available")

    def launch(self, stream: Any, name: str, grid, block, args, shared, ref: Callable[[], None],
               nbytes: int = 0) -> None:
        ref()

    def memset_async(self, stream, buf, value):
        buf.view(np.uint8)[...] = value

    def memset_sync(self, buf, value):
        buf.view(np.uint8)[...] = value

    def copy_h2d(self, stream, dst, src):
        dst[...] = np.asarray(src).reshape(dst.shape)

    def event_record(self, stream, event):
        pass

    def new_stream(self, non_blocking: bool = True):
        return HostToken("stream")

    def new_event(self):
        return HostToken("event")

    def synchronize(self) -> None:
        """Nothing to wait for: every launch ran when it was made."""

    def info(self) -> dict:
        return {"backend": self.name, "device": "CPU (NumPy reference executor)",
                "numpy": np.__version__}
