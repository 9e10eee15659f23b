"""Measurement helpers: CUDA-event timing, summary statistics, and the bytes-moved floor.

Rules (see METHODS in the README): device time comes from CUDA events recorded on the stream
the work runs on, after warm-up, over many repeats, reported as a median with its
interquartile range; a host clock is only used for host-side work (the time to *enqueue*
launches), and is labelled so.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from . import weights as W


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as the samples)."""

    n: int
    median: float
    p25: float
    p75: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    @classmethod
    def of(cls, samples) -> "Stats":
        """Stats of a non-empty sequence. Raises ValueError on an empty one."""
        a = np.asarray(samples, dtype=np.float64)
        if a.size == 0:
            raise ValueError("no samples to summarize")
        p25, med, p75 = np.percentile(a, [25, 50, 75])
        return cls(int(a.size), float(med), float(p25), float(p75), float(a.min()), float(a.max()))

    def fmt(self, unit: str = "µs", digits: int = 1) -> str:
        return (f"{self.median:.{digits}f} {unit} (IQR {self.p25:.{digits}f}–{self.p75:.{digits}f}, "
                f"n={self.n})")


def event_ms(start, end) -> float:
    """Milliseconds between two recorded CUDA events (synchronizes on ``end``)."""
    import cupy

    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end))


def copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 20) -> Stats:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), CUDA events, median.

    The ceiling the bytes-moved floor is measured against (METHOD: measure the ceilings).
    """
    import cupy

    src = cupy.empty(nbytes // 4, dtype=np.float32)
    src.fill(1.5)
    dst = cupy.empty_like(src)
    s = cupy.cuda.Stream(non_blocking=True)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    with s:
        for _ in range(3):
            dst[...] = src
    out = []
    for _ in range(repeats):
        e0.record(s)
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, s.ptr)
        e1.record(s)
        out.append(2 * src.nbytes / (event_ms(e0, e1) * 1e-3) / 1e9)
    del src, dst
    return Stats.of(out)


def token_bytes(cfg: ModelConfig, vocab: bool, n_layers: int | None = None) -> dict[str, int]:
    """Fewest bytes one decode token must read from device memory, by part.

    Every weight of the layers run, the ``n_used`` selected experts' 4-bit matrices per layer,
    each layer's KV window (fp32), and the vocabulary projection when on. Activations (a few
    hundred KB) are left out. This is the numerator of the bytes-moved floor.
    """
    L = cfg.n_layers if n_layers is None else n_layers
    layer = sum(W.spec_bytes(s) for s in W.layer_specs(cfg, 0).values())
    bank = W.bank_specs(cfg, 0)
    per_expert = sum(W.spec_bytes(s) // s.subs for s in bank.values())
    out = {
        "layer_weights": L * layer,
        "routed_experts": L * cfg.n_used * per_expert,
        "kv_window": L * cfg.window * cfg.head_dim * 4,
    }
    if vocab:
        out["vocab"] = W.spec_bytes(W.global_specs(cfg)["vocab"])
    return out


@contextlib.contextmanager
def profiler_range(be):
    """``cudaProfilerStart``/``cudaProfilerStop`` around a measured region on a GPU, so that
    ``nsys profile --capture-range=cudaProfilerApi`` records only the measured tokens (CUDA
    Runtime API, "Profiler Control"). Nothing on other backends."""
    if not getattr(be, "is_gpu", False):
        yield
        return
    rt = be.cp.cuda.runtime
    rt.profilerStart()
    try:
        yield
    finally:
        rt.profilerStop()
