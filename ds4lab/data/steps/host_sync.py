"""host-sync: a GRU decoder whose step makes the host wait for the device, in two ways users write it.

- ``tensor-from-int``: the step builds its position tensor from the loop's Python int,
  ``torch.tensor([self.pos], device=...)``, a copy from pageable host memory, for the position embedding.
- ``eos-item``: the step checks for the end-of-sequence token with ``.item()`` on the argmax, a
  device-to-host read that waits for the step's kernels.

Both are ordinary eager code and both are built to be refused by stream capture.
"""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, check_make_step, main  # noqa: E402

FAMILY = "host_sync"
CACHES = ["tensor-from-int", "eos-item"]
VOCAB, DIM, MAX_POS, EOS = 1000, 512, 4096, 2


class GRUDecoder(nn.Module):
    """Token and position embeddings, one GRU cell whose hidden state is the decoder state, an LM head."""

    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, DIM)
        self.pos_emb = nn.Embedding(MAX_POS, DIM)
        self.cell = nn.GRUCell(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB)
        self.register_buffer("hidden", torch.zeros(1, DIM))

    def forward(self, ids, positions):
        x = self.tok_emb(ids) + self.pos_emb(positions)
        self.hidden.copy_(self.cell(x, self.hidden))
        return self.lm_head(self.norm(self.hidden))


class Step:
    def __init__(self, cache, dtype, prompt, seed, device):
        torch.manual_seed(seed)
        self.cache = cache
        self.device = device
        self.model = GRUDecoder().to(device=device, dtype=DTYPES[dtype]).eval()
        gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(3, VOCAB, (MAX_POS,), generator=gen).to(device)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.pos_t = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = 0
        self.finished = False
        self.state = [self.model, self]
        self.capacity = None
        for p in range(prompt):
            self.advance(p)
            self.step()
        self.start = prompt

    def advance(self, p):
        self.ids.copy_(self.tokens[p % MAX_POS : p % MAX_POS + 1])
        self.pos_t.fill_(p % MAX_POS)
        self.pos = p

    @torch.no_grad()
    def step(self):
        if self.cache == "tensor-from-int":
            positions = torch.tensor([self.pos % MAX_POS], device=self.device)
        else:
            positions = self.pos_t
        logits = self.model(self.ids, positions)
        if self.cache == "eos-item" and logits.argmax().item() == EOS:
            self.finished = True
        return logits


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A host-sync decode step after a prefill of ``prompt`` tokens."""
    check_make_step(FAMILY, cache, CACHES, prompt)
    return Step(cache, dtype, prompt, seed, device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "gru_step",
                  intents={c: "refused (the step waits for the device)" for c in CACHES}))
