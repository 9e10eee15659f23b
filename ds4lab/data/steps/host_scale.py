"""host-scale: a one-layer decoder with a scale computed on the host from the current length.

The user's loop keeps the current position as a Python int next to its device copy. One scale per step is a
Python float computed from that int and handed to a torch op, so a CUDA graph keeps the scale of the
position it was captured at. Everything else (the K/V write, the causal mask) reads the position from a
device tensor. Two variants, one host scale each:

- ``logit-temperature``: the step returns ``logits / temperature`` with a temperature annealed by 5 % per
  generated token (argmax unchanged, the values not);
- ``attention-log-length``: the attention logits are scaled by ``log(length) / sqrt(head_dim)`` (log-length
  scaling, which keeps attention sharp as the context grows); its effect per position is a few percent.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402

FAMILY = "host_scale"
CACHES = ["logit-temperature", "attention-log-length"]
TEMPERATURE_DECAY = 0.95
VOCAB, DIM, HEADS, MAX_LEN = 1024, 256, 4, 128
HEAD_DIM = DIM // HEADS

CAUSES = {
    "logit-temperature": {
        "code": "logits = logits / temperature",
        "what": "the sampling temperature 0.95**generated is a Python float computed from the host position "
                "and passed to torch.div (a multiply by its reciprocal on CUDA), so the graph keeps the capture "
                "position's temperature",
        "kernel_hint": "MulFunctor",
    },
    "attention-log-length": {
        "code": "scores = scores * scale",
        "what": "the attention scale log(length)/sqrt(head_dim) is a Python float computed from the host "
                "position and passed to torch.mul, so the graph keeps the capture position's scale",
        "kernel_hint": "MulFunctor",
    },
}


# weight name -> (shape, standard deviation of its random init), drawn in this order from the seed
WEIGHTS = {
    "embed": ((VOCAB, DIM), 0.5),
    "norm1": ((DIM,), 0.1),
    "wqkv": ((DIM, 3 * DIM), 1.5 * DIM ** -0.5),
    "wo": ((DIM, DIM), DIM ** -0.5),
    "norm2": ((DIM,), 0.1),
    "w_up": ((DIM, 4 * DIM), DIM ** -0.5),
    "w_down": ((4 * DIM, DIM), (4 * DIM) ** -0.5),
    "head": ((DIM, VOCAB), DIM ** -0.5),
}


class Decoder:
    """One pre-norm transformer layer over a static KV cache; optionally log-length attention scaling.

    ``kv`` holds keys and values of every position, (2, MAX_LEN, HEADS, HEAD_DIM).
    """

    def __init__(self, dtype, seed, device, log_length_attention):
        self.log_length_attention = log_length_attention
        gen = torch.Generator().manual_seed(seed)
        w = {name: torch.randn(shape, generator=gen) * std for name, (shape, std) in WEIGHTS.items()}
        w["norm1"] += 1.0
        w["norm2"] += 1.0
        self.w = {name: t.to(device=device, dtype=dtype) for name, t in w.items()}
        self.kv = torch.zeros(2, MAX_LEN, HEADS, HEAD_DIM, dtype=dtype, device=device)
        self.slots = torch.arange(MAX_LEN, device=device)

    def forward(self, ids, pos_t, pos):
        """Logits (1, VOCAB) of token ``ids`` (1,) at position ``pos_t`` (1,) on the device, ``pos`` on the host."""
        w = self.w
        x = w["embed"][ids]
        h = F.rms_norm(x, (DIM,), w["norm1"])
        q, k, v = (h @ w["wqkv"]).view(3, HEADS, HEAD_DIM)
        self.kv.index_copy_(1, pos_t, torch.stack((k, v)).unsqueeze(1))
        if self.log_length_attention:
            scale = math.log(pos + 1) / math.sqrt(HEAD_DIM)
        else:
            scale = 1.0 / math.sqrt(HEAD_DIM)
        keys, values = self.kv
        scores = torch.einsum("hd,thd->ht", q, keys)
        scores = scores * scale
        scores = scores.masked_fill(self.slots > pos_t, float("-inf"))
        attn = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values)
        x = x + attn.reshape(1, DIM) @ w["wo"]
        h = F.rms_norm(x, (DIM,), w["norm2"])
        x = x + F.gelu(h @ w["w_up"]) @ w["w_down"]
        return x @ w["head"]


class Step:
    """The user's loop: token ids and the position as device buffers, and the position as a Python int."""

    def __init__(self, variant, dtype, prompt, seed, device):
        self.variant = variant
        self.prompt = prompt
        self.model = Decoder(DTYPES[dtype], seed, device, variant == "attention-log-length")
        gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(0, VOCAB, (MAX_LEN,), generator=gen).to(device)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.pos_t = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = 0
        self.state = [self.model.kv]
        self.capacity = MAX_LEN
        with torch.no_grad():
            for p in range(prompt):  # the prefill runs the decode step token by token
                self.advance(p)
                self.step()
        self.start = prompt

    def advance(self, p):
        self.ids.copy_(self.tokens[p : p + 1])
        self.pos_t.fill_(p)
        self.pos = p

    def step(self):
        logits = self.model.forward(self.ids, self.pos_t, self.pos)
        if self.variant == "logit-temperature":
            temperature = max(0.2, TEMPERATURE_DECAY ** (self.pos - self.prompt))
            logits = logits / temperature
        return logits


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A host-scale decode step after a prefill of ``prompt`` tokens."""
    check_make_step(FAMILY, cache, CACHES, prompt, MAX_LEN)
    return Step(cache, dtype, prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "host_scale_step", causes=CAUSES,
                  intents={c: "replay wrong (host float scale)" for c in CACHES}))
