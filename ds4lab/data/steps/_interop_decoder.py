"""A GPT-2-style one-layer decoder for the families that bring their own CUDA kernels (CuPy, Triton).

Learned absolute position embeddings, pre-LayerNorm attention over a static KV cache, GELU MLP, untied LM
head; weights are plain tensors drawn from the seed. Two operations are methods so that a family script can
replace them by its own kernel:

- ``write_kv()``: store ``k_new`` / ``v_new`` (fixed buffers, (DIM,)) into row ``pos_t`` of the cache;
- ``add_position(x)``: add the position embedding of ``pos_t`` to ``x`` (1, DIM) in place.

The defaults here are plain torch ops that read the position from the device tensor ``pos_t``. The
decoder also keeps the position as a Python int ``pos``, as the user's loop has it; the defaults never use
it. Everything runs on torch's current stream.
"""

import math

import torch
import torch.nn.functional as F

VOCAB, DIM, HEADS, MAX_LEN = 1536, 256, 4, 128
HEAD_DIM = DIM // HEADS


class KVCache:
    """Keys and values of every position, (MAX_LEN, HEADS, HEAD_DIM) each, contiguous."""

    def __init__(self, dtype, device):
        self.k = torch.zeros(MAX_LEN, HEADS, HEAD_DIM, dtype=dtype, device=device)
        self.v = torch.zeros(MAX_LEN, HEADS, HEAD_DIM, dtype=dtype, device=device)


class InteropDecoder:
    """The decoder and its decode loop: ``advance(p)`` sets the inputs, ``step()`` returns logits (1, VOCAB)."""

    def __init__(self, dtype, prompt, seed, device):
        gen = torch.Generator().manual_seed(seed)

        def weight(*shape, std):
            return (torch.randn(*shape, generator=gen) * std).to(device=device, dtype=dtype)

        self.wte = weight(VOCAB, DIM, std=0.4)
        self.wpe = weight(MAX_LEN, DIM, std=0.4)
        self.ln1_w, self.ln1_b = 1.0 + weight(DIM, std=0.1), weight(DIM, std=0.02)
        self.wq = weight(DIM, DIM, std=2.0 * DIM ** -0.5)
        self.wk = weight(DIM, DIM, std=2.0 * DIM ** -0.5)
        self.wv = weight(DIM, DIM, std=DIM ** -0.5)
        self.wo = weight(DIM, DIM, std=DIM ** -0.5)
        self.ln2_w, self.ln2_b = 1.0 + weight(DIM, std=0.1), weight(DIM, std=0.02)
        self.w_fc = weight(DIM, 4 * DIM, std=DIM ** -0.5)
        self.w_proj = weight(4 * DIM, DIM, std=(4 * DIM) ** -0.5)
        self.lnf_w, self.lnf_b = 1.0 + weight(DIM, std=0.1), weight(DIM, std=0.02)
        self.lm_head = weight(DIM, VOCAB, std=DIM ** -0.5)
        self.cache = KVCache(dtype, device)
        self.k_new = torch.zeros(1, DIM, dtype=dtype, device=device)
        self.v_new = torch.zeros(1, DIM, dtype=dtype, device=device)
        self.slots = torch.arange(MAX_LEN, device=device)

        tokens_gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(0, VOCAB, (MAX_LEN,), generator=tokens_gen).to(device)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.pos_t = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = 0
        self.state = [self.cache]
        self.capacity = MAX_LEN
        for p in range(prompt):  # token-by-token prefill with the same kernels as the decode steps
            self.advance(p)
            self.step()
        self.start = prompt

    def advance(self, p):
        """Inputs of position ``p``: its token id and the position, on the device and on the host."""
        self.ids.copy_(self.tokens[p : p + 1])
        self.pos_t.fill_(p)
        self.pos = p

    def write_kv(self):
        self.cache.k.index_copy_(0, self.pos_t, self.k_new.view(1, HEADS, HEAD_DIM))
        self.cache.v.index_copy_(0, self.pos_t, self.v_new.view(1, HEADS, HEAD_DIM))

    def add_position(self, x):
        x.add_(F.embedding(self.pos_t, self.wpe))

    @torch.no_grad()
    def step(self):
        x = F.embedding(self.ids, self.wte)
        self.add_position(x)
        h = F.layer_norm(x, (DIM,), self.ln1_w, self.ln1_b)
        q = (h @ self.wq).view(HEADS, HEAD_DIM)
        torch.matmul(h, self.wk, out=self.k_new)
        torch.matmul(h, self.wv, out=self.v_new)
        self.write_kv()
        scores = torch.einsum("hd,thd->ht", q, self.cache.k) / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(self.slots > self.pos_t, float("-inf"))
        attn = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), self.cache.v).reshape(1, DIM)
        x = x + attn @ self.wo
        h = F.layer_norm(x, (DIM,), self.ln2_w, self.ln2_b)
        x = x + F.gelu(h @ self.w_fc, approximate="tanh") @ self.w_proj
        return F.layer_norm(x, (DIM,), self.lnf_w, self.lnf_b) @ self.lm_head
