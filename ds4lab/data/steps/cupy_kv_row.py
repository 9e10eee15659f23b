"""cupy-kv-row: the K/V cache write is a CuPy RawKernel that takes the row as a Python int argument.

The decoder (see _interop_decoder.py) shares its memory with CuPy through ``__cuda_array_interface__``: the
cache and the fixed k/v buffers are wrapped once as CuPy arrays (viewed as 16-bit words, so one kernel serves
float32 and bfloat16), and each step launches ``write_kv_row`` on torch's current stream with the row
``numpy.int32(self.pos)`` from the user's loop. A CUDA graph keeps that row: replays keep overwriting the
capture position's row and leave the current one empty. The position embedding and the attention mask read
the position from a device tensor.
"""

import os
import sys

import numpy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402
from _interop_decoder import MAX_LEN, InteropDecoder  # noqa: E402

FAMILY = "cupy_kv_row"
CACHES = ["default"]
THREADS = 256

CAUSES = {"default": {
    "code": "numpy.int32(self.pos), numpy.int32(self.row_words)",
    "what": "the cache row is a Python int (the host position) passed as a kernel argument of the CuPy "
            "RawKernel write_kv_row, so replays keep writing the capture position's row",
    "kernel_hint": "write_kv_row",
}}

WRITE_KV_ROW = r"""
extern "C" __global__ void write_kv_row(const short* k_new, const short* v_new,
                                        short* k_cache, short* v_cache, int row, int row_words) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < row_words) {
        long long at = (long long)row * row_words + i;
        k_cache[at] = k_new[i];
        v_cache[at] = v_new[i];
    }
}
"""


def as_cupy_words(tensor):
    """A CuPy view of a contiguous torch CUDA tensor as 16-bit words (no copy)."""
    import cupy

    return cupy.asarray(tensor.view(torch.int16))


class CupyKVRowDecoder(InteropDecoder):
    """The interop decoder whose K/V write is a CuPy kernel indexed by the host position."""

    def __init__(self, dtype, prompt, seed, device):
        import cupy

        self.write_kv_row = cupy.RawKernel(WRITE_KV_ROW, "write_kv_row")
        self._cupy_views = None
        super().__init__(dtype, prompt, seed, device)

    def write_kv(self):
        import cupy

        if self._cupy_views is None:  # the buffers never move: wrap them once
            self._cupy_views = [as_cupy_words(t) for t in (self.k_new, self.v_new, self.cache.k, self.cache.v)]
            self.row_words = self._cupy_views[0].size
        blocks = (self.row_words + THREADS - 1) // THREADS
        with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):
            self.write_kv_row((blocks,), (THREADS,), (*self._cupy_views,
                              numpy.int32(self.pos), numpy.int32(self.row_words)))


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A cupy-kv-row decode step after a prefill of ``prompt`` tokens (needs CUDA and CuPy)."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN, device, needs_cuda=True)
    return CupyKVRowDecoder(DTYPES[dtype], prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "kv_row_step", causes=CAUSES,
                  intents={"default": "replay wrong (CuPy kernel row from the host)"}))
