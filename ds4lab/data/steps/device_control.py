"""device-control: the cupy-kv-row / triton-pos decoder with every position kept in device memory.

Same decoder as those two families (see _interop_decoder.py), with both of their kernels, but the kernels
read the position through a device pointer to the loop's position buffer ``pos_t`` instead of taking a
Python int: the CuPy RawKernel ``write_kv_row_at`` writes the K/V row ``*pos``, the Triton kernel
``add_position_embedding_at`` loads ``pos`` before indexing the embedding table. The mask reads ``pos_t``
too, and nothing in the step depends on a host value: a CUDA graph of one step replays right at every
position.
"""

import os
import sys

import numpy
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402
from _interop_decoder import DIM, MAX_LEN, InteropDecoder  # noqa: E402

FAMILY = "device_control"
CACHES = ["default"]
THREADS = 256

WRITE_KV_ROW_AT = r"""
extern "C" __global__ void write_kv_row_at(const short* k_new, const short* v_new,
                                           short* k_cache, short* v_cache,
                                           const long long* pos, int row_words) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < row_words) {
        long long at = pos[0] * row_words + i;
        k_cache[at] = k_new[i];
        v_cache[at] = v_new[i];
    }
}
"""


@triton.jit
def add_position_embedding_at(x_ptr, table_ptr, pos_ptr, n, BLOCK: tl.constexpr):
    pos = tl.load(pos_ptr)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    e = tl.load(table_ptr + pos * n + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x + e).to(x_ptr.dtype.element_ty), mask=mask)


class DevicePositionDecoder(InteropDecoder):
    """The interop decoder with a CuPy K/V write and a Triton embedding add, both reading ``pos_t``."""

    def __init__(self, dtype, prompt, seed, device):
        import cupy

        self.write_kv_row_at = cupy.RawKernel(WRITE_KV_ROW_AT, "write_kv_row_at")
        self._cupy_args = None
        super().__init__(dtype, prompt, seed, device)

    def write_kv(self):
        import cupy

        if self._cupy_args is None:  # fixed buffers, wrapped once (16-bit words serve both dtypes)
            words = [cupy.asarray(t.view(torch.int16)) for t in (self.k_new, self.v_new, self.cache.k, self.cache.v)]
            self.row_words = words[0].size
            self._cupy_args = (*words, cupy.asarray(self.pos_t), numpy.int32(self.row_words))
        blocks = (self.row_words + THREADS - 1) // THREADS
        with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):
            self.write_kv_row_at((blocks,), (THREADS,), self._cupy_args)

    def add_position(self, x):
        add_position_embedding_at[(1,)](x, self.wpe, self.pos_t, DIM, BLOCK=triton.next_power_of_2(DIM))


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A device-control decode step after a prefill of ``prompt`` tokens (needs CUDA, CuPy and Triton)."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN, device, needs_cuda=True)
    return DevicePositionDecoder(DTYPES[dtype], prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "device_pos_step",
                  intents={"default": "replay right (positions in device memory)"}))
