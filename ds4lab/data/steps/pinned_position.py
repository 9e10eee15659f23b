"""pinned-position: an ALiBi decoder that gets its position through a pinned host buffer.

The position lives in a pinned (page-locked) host tensor and each step copies it to the device with
``pos_t.copy_(pos_host, non_blocking=True)``; everything after that (the K/V row, the ALiBi distances, the
mask) reads ``pos_t``. A captured copy from pinned memory reads the host buffer when the graph runs, so it
matters who writes the buffer:

- ``staged``: the user's loop writes the buffer before each step (``advance``), as a graph-replay loop
  must: replays right.
- ``step-writes``: the step writes its own Python int position into the buffer and then copies it. The
  host write runs only while capturing; a replay copies whatever the buffer holds: replays wrong.

Like many such loops this one never waits, so a host write could overtake a copy still queued from the
step before; in this launch-bound decoder the device keeps up, and the ground truth synchronises around
every compared step.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402

FAMILY = "pinned_position"
CACHES = ["staged", "step-writes"]
VOCAB, DIM, HEADS, MAX_LEN = 2500, 320, 5, 80
HEAD_DIM = DIM // HEADS

CAUSES = {"step-writes": {
    "code": "self.pos_host[0] = self.pos",
    "what": "the step writes its Python int position into the pinned buffer on the host; the captured "
            "host-to-device copy replays reading whatever the buffer holds, not the current position",
    "kernel_hint": None,
}}


class AlibiDecoder(nn.Module):
    """One layer with ALiBi attention (no position embedding), LayerNorm and a GELU MLP, K/V cache of MAX_LEN."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)
        self.ln2 = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 4 * DIM)
        self.fc2 = nn.Linear(4 * DIM, DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)])
        self.register_buffer("slopes", slopes.view(HEADS, 1) * 8.0)
        self.register_buffer("slots", torch.arange(MAX_LEN))
        self.register_buffer("k_cache", torch.zeros(MAX_LEN, HEADS, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(MAX_LEN, HEADS, HEAD_DIM))

    def forward(self, ids, pos_t):
        x = self.embed(ids)
        q, k, v = self.qkv(self.ln1(x)).view(3, 1, HEADS, HEAD_DIM)
        self.k_cache.index_copy_(0, pos_t, k)
        self.v_cache.index_copy_(0, pos_t, v)
        distance = (pos_t - self.slots).to(self.slopes.dtype)
        scores = torch.einsum("hd,thd->ht", q[0], self.k_cache) / math.sqrt(HEAD_DIM)
        scores = (scores - self.slopes * distance).masked_fill(distance < 0, float("-inf"))
        attn = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), self.v_cache).reshape(1, DIM)
        x = x + self.out(attn)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.lm_head(x)


class Step:
    def __init__(self, cache, dtype, prompt, seed, device):
        torch.manual_seed(seed)
        model = AlibiDecoder()
        with torch.no_grad():  # sharper attention than the default init
            model.qkv.weight[: 2 * DIM].mul_(3.0)
        self.model = model.to(device=device, dtype=DTYPES[dtype]).eval()
        self.writes_in_step = cache == "step-writes"
        gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(0, VOCAB, (MAX_LEN,), generator=gen).to(device)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.pos_host = torch.zeros(1, dtype=torch.long, pin_memory=device == "cuda")
        self.pos_t = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = 0
        # with step-writes the pinned buffer changes inside the step: it is state then
        self.state = [self.model, self] if self.writes_in_step else [self.model]
        self.capacity = MAX_LEN
        for p in range(prompt):
            self.advance(p)
            self.step()
        self.start = prompt

    def advance(self, p):
        self.ids.copy_(self.tokens[p : p + 1])
        self.pos = p
        if not self.writes_in_step:
            self.pos_host[0] = p

    @torch.no_grad()
    def step(self):
        if self.writes_in_step:
            self.pos_host[0] = self.pos
        self.pos_t.copy_(self.pos_host, non_blocking=True)
        return self.model(self.ids, self.pos_t)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A pinned-position decode step after a prefill of ``prompt`` tokens."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN)
    return Step(cache, dtype, prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "alibi_step", causes=CAUSES,
                  intents={"staged": "replay right (the loop writes the pinned buffer before each replay)",
                           "step-writes": "replay wrong (the step writes the pinned buffer on the host)"}))
