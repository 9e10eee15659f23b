"""rotary-host-index: a one-layer RoPE decoder that reads its rotary row at a host index.

The cos/sin tables are precomputed for every position, and the step picks the row of the current position
with ``self.cos[pos]``, ``pos`` being the Python int of the user's loop. That row is a view at a host-chosen
offset: the kernels that rotate q and k get its address as an argument, so a CUDA graph keeps rotating by
the angle of the capture position. The K/V write and the attention mask read the position from a device
tensor; attention is ``F.scaled_dot_product_attention`` over the whole static cache with a boolean mask.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402

FAMILY = "rotary_host_index"
CACHES = ["default"]
VOCAB, DIM, HEADS, MAX_LEN, ROPE_BASE = 2048, 384, 6, 96, 10000.0
HEAD_DIM = DIM // HEADS

CAUSES = {"default": {
    "code": "cos, sin = self.cos[pos], self.sin[pos]",
    "what": "the rotary cos/sin rows are views at the host position pos, so the kernels that rotate q and k "
            "keep reading the capture position's row",
    "kernel_hint": "MulFunctor",
}}


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryDecoder(nn.Module):
    """One pre-norm layer (RoPE attention, SwiGLU MLP) with a static KV cache of MAX_LEN positions."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norm1 = nn.RMSNorm(DIM)
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.norm2 = nn.RMSNorm(DIM)
        self.gate = nn.Linear(DIM, 2 * DIM, bias=False)
        self.up = nn.Linear(DIM, 2 * DIM, bias=False)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)
        self.norm_out = nn.RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
        angles = torch.outer(torch.arange(MAX_LEN).float(), inv_freq)
        self.register_buffer("cos", torch.cat((angles, angles), dim=-1).cos())
        self.register_buffer("sin", torch.cat((angles, angles), dim=-1).sin())
        self.register_buffer("k_cache", torch.zeros(1, HEADS, MAX_LEN, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, HEADS, MAX_LEN, HEAD_DIM))
        self.register_buffer("slots", torch.arange(MAX_LEN))

    def forward(self, ids, pos_t, pos):
        """Logits (1, 1, VOCAB) of ``ids`` (1, 1) at position ``pos_t`` (1,) (device) = ``pos`` (host)."""
        x = self.embed(ids)
        h = self.norm1(x)
        q = self.wq(h).view(1, 1, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.wk(h).view(1, 1, HEADS, HEAD_DIM).transpose(1, 2)
        v = self.wv(h).view(1, 1, HEADS, HEAD_DIM).transpose(1, 2)
        cos, sin = self.cos[pos], self.sin[pos]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.k_cache.index_copy_(2, pos_t, k)
        self.v_cache.index_copy_(2, pos_t, v)
        visible = (self.slots <= pos_t).unsqueeze(0)
        attn = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=visible)
        x = x + self.wo(attn.transpose(1, 2).reshape(1, 1, DIM))
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.lm_head(self.norm_out(x))


class Step:
    """The user's loop: ids and position in device buffers, the position also kept as a Python int."""

    def __init__(self, dtype, prompt, seed, device):
        torch.manual_seed(seed)
        self.model = RotaryDecoder()
        with torch.no_grad():  # sharper attention and a smaller embedding than the default init
            self.model.wq.weight.mul_(3.0)
            self.model.wk.weight.mul_(3.0)
            self.model.embed.weight.mul_(0.3)
        self.model = self.model.to(device=device, dtype=DTYPES[dtype]).eval().requires_grad_(False)
        gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(0, VOCAB, (MAX_LEN,), generator=gen).to(device)
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.pos_t = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = 0
        self.state = [self.model]
        self.capacity = MAX_LEN
        for p in range(prompt):  # token-by-token prefill, outside the decode steps
            self.advance(p)
            self.step()
        self.start = prompt

    def advance(self, p):
        self.ids.copy_(self.tokens[p : p + 1].view(1, 1))
        self.pos_t.fill_(p)
        self.pos = p

    def step(self):
        return self.model(self.ids, self.pos_t, self.pos)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A rotary-host-index decode step after a prefill of ``prompt`` tokens."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN)
    return Step(dtype, prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "rope_step", causes=CAUSES,
                  intents={"default": "replay wrong (rotary row at a host index)"}))
