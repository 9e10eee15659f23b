"""module-counter: an ``nn.Module`` decoder that keeps its own position counter.

The user's loop only feeds token ids; the module knows where it is. Two ways users write that counter:

- ``device-buffer``: a registered long buffer ``position``, read as a device index (position embedding,
  K/V row, mask) and advanced with ``self.position += 1`` in place. A CUDA graph captures that increment,
  so each replay moves the counter on: replays right.
- ``python-int``: a plain attribute ``self.position = 0``, used as a Python index (position-embedding
  row, K/V row, the slice of the cache attended to) and advanced on the host. A graph keeps the capture
  position everywhere and nothing advances the counter on replay: replays wrong.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402

FAMILY = "module_counter"
CACHES = ["device-buffer", "python-int"]
VOCAB, DIM, HEADS, MAX_LEN = 1280, 256, 8, 64
HEAD_DIM = DIM // HEADS

CAUSES = {"python-int": {
    "code": "x = self.tok_emb(ids) + self.pos_emb.weight[t]",
    "what": "the module's Python int counter self.position picks the position-embedding row, the K/V row "
            "written and the length of the cache slice attended to, so replays keep the capture position",
    "kernel_hint": "CUDAFunctor_add",
}}


class CountingDecoder(nn.Module):
    """One post-norm layer with a fused QKV projection, learned positions and a K/V cache of MAX_LEN rows."""

    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, DIM)
        self.pos_emb = nn.Embedding(MAX_LEN, DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln_attn = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 3 * DIM), nn.GELU(), nn.Linear(3 * DIM, DIM))
        self.ln_mlp = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("k_cache", torch.zeros(MAX_LEN, HEADS, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(MAX_LEN, HEADS, HEAD_DIM))

    def attend(self, q, keys, values, mask=None):
        scores = torch.einsum("hd,thd->ht", q, keys) / math.sqrt(HEAD_DIM)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values).reshape(1, DIM)

    def finish(self, x, attn):
        x = self.ln_attn(x + self.proj(attn))
        x = self.ln_mlp(x + self.mlp(x))
        return self.lm_head(x)


class DeviceCounterDecoder(CountingDecoder):
    def __init__(self):
        super().__init__()
        self.register_buffer("position", torch.zeros((), dtype=torch.long))
        self.register_buffer("slots", torch.arange(MAX_LEN))

    def forward(self, ids):
        pos = self.position.view(1)
        x = self.tok_emb(ids) + self.pos_emb(pos)
        q, k, v = self.qkv(x).view(3, 1, HEADS, HEAD_DIM)
        self.k_cache.index_copy_(0, pos, k)
        self.v_cache.index_copy_(0, pos, v)
        attn = self.attend(q[0], self.k_cache, self.v_cache, mask=self.slots <= pos)
        self.position += 1
        return self.finish(x, attn)


class PythonCounterDecoder(CountingDecoder):
    def __init__(self):
        super().__init__()
        self.position = 0

    def forward(self, ids):
        t = self.position
        x = self.tok_emb(ids) + self.pos_emb.weight[t]
        q, k, v = self.qkv(x).view(3, HEADS, HEAD_DIM)
        self.k_cache[t] = k
        self.v_cache[t] = v
        attn = self.attend(q, self.k_cache[: t + 1], self.v_cache[: t + 1])
        self.position += 1
        return self.finish(x, attn)


class Step:
    """The user's loop: only the token id is an input; the module counts positions itself."""

    def __init__(self, cache, dtype, prompt, seed, device):
        torch.manual_seed(seed)
        model = DeviceCounterDecoder() if cache == "device-buffer" else PythonCounterDecoder()
        with torch.no_grad():  # sharper attention than the default init
            model.qkv.weight[: 2 * DIM].mul_(3.0)
        self.model = model.to(device=device, dtype=DTYPES[dtype]).eval()
        gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(0, VOCAB, (MAX_LEN,), generator=gen).to(device)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.state = [self.model]
        self.capacity = MAX_LEN
        for p in range(prompt):  # prefill token by token: the module counts these positions too
            self.advance(p)
            self.step()
        self.start = prompt

    def advance(self, p):
        self.ids.copy_(self.tokens[p : p + 1])

    @torch.no_grad()
    def step(self):
        return self.model(self.ids)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A module-counter decode step after a prefill of ``prompt`` tokens."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN)
    return Step(cache, dtype, prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "counter_step", causes=CAUSES,
                  intents={"device-buffer": "replay right (device counter advanced in place)",
                           "python-int": "replay wrong (host counter in the module)"}))
