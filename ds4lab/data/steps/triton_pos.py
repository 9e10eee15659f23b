"""triton-pos: the position embedding is added by a Triton kernel that takes the position as an int argument.

The decoder (see _interop_decoder.py) has learned absolute position embeddings. Its add of the position's
embedding row is a small Triton kernel, ``add_position_embedding(x, wpe, pos, n)``, launched with the
Python int position of the user's loop. Triton passes ``pos`` as a kernel argument, so a CUDA graph keeps
adding the capture position's row. The K/V write and the attention mask read the position from a device
tensor.
"""

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402
from _interop_decoder import DIM, MAX_LEN, InteropDecoder  # noqa: E402

FAMILY = "triton_pos"
CACHES = ["default"]

CAUSES = {"default": {
    "code": "add_position_embedding[(1,)](x, self.wpe, self.pos, DIM",
    "what": "the position is a Python int passed as a runtime argument of the Triton kernel "
            "add_position_embedding, so replays keep adding the capture position's embedding row",
    "kernel_hint": "add_position_embedding",
}}


@triton.jit
def add_position_embedding(x_ptr, table_ptr, pos, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    e = tl.load(table_ptr + pos * n + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x + e).to(x_ptr.dtype.element_ty), mask=mask)


class TritonPosDecoder(InteropDecoder):
    """The interop decoder whose position-embedding add is a Triton kernel taking the host position."""

    def add_position(self, x):
        add_position_embedding[(1,)](x, self.wpe, self.pos, DIM, BLOCK=triton.next_power_of_2(DIM))


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A triton-pos decode step after a prefill of ``prompt`` tokens (needs CUDA and Triton)."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN, device, needs_cuda=True)
    return TritonPosDecoder(DTYPES[dtype], prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "triton_pos_step", causes=CAUSES,
                  intents={"default": "replay wrong (Triton kernel position from the host)"}))
