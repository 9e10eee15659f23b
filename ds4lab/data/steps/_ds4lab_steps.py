"""ds4lab's own decode steps, written as a user writes a decode loop (the scripts ``ds4lab-*.py`` beside
this file), to the contract of ``ds4lab audit validate`` (README.md): ``--list``, a decode loop whose
every step is inside an NVTX range ``decode_step`` (a prefill and two warm steps outside it), ``--truth
OUT.json`` (what ``torch.cuda.graph`` does with one step), and ``make_step``. Nothing here imports ds4lab:
the audit meets these steps as it meets a user's.

Families: transformers Llama, DeepSeek-V3, Qwen2-MoE, Mistral (``sliding_window`` 8), Gemma2 (sliding
and global layers, window 8), Qwen2 (``use_sliding_window``, window 8), each with a ``dynamic``
(``DynamicCache``) and a ``static`` cache (``StaticCache`` of :data:`MAX_CACHE` positions); and a
decoder in plain torch whose cache keeps its write index and mask bound on the host (``host-counter``),
on the device (``device-counter``), or on the device and read back each step (``host-read``: ``.item()``).
The windows are shorter than the prompt (16), so sliding layers are full from the first decode step.
Random weights from the seed, no download.
"""

from __future__ import annotations

import argparse
import json
import sys

TOKEN_RANGE = "decode_step"
PROMPT = 16
WINDOW = 8
#: Positions a transformers static cache holds.
MAX_CACHE = 128
HAND_MAX = 128
HAND_CACHES = ("host-counter", "device-counter", "host-read")
TRANSFORMERS_CACHES = ("dynamic", "static")
DTYPES = ("float32", "bfloat16")


# ----------------------------------------------------------------------------- the models
def build_transformers(family: str, dtype: str, seed: int):
    """A small transformers causal LM of ``family`` in ``dtype`` on the GPU, random weights from ``seed``."""
    import torch
    import transformers as T

    torch.manual_seed(seed)
    small = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=16000, max_position_embeddings=512)
    if family == "llama":
        cfg, cls = T.LlamaConfig(**{**small, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                                    "num_attention_heads": 16, "vocab_size": 32000}), T.LlamaForCausalLM
    elif family == "deepseek-v3":
        cfg = T.DeepseekV3Config(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, num_hidden_layers=4,
                                 num_attention_heads=8, num_key_value_heads=8, n_routed_experts=16,
                                 num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
                                 topk_group=2, q_lora_rank=256, kv_lora_rank=128, qk_rope_head_dim=32,
                                 qk_nope_head_dim=32, v_head_dim=64, vocab_size=16000, max_position_embeddings=512)
        cls = T.DeepseekV3ForCausalLM
    elif family == "qwen2-moe":
        cfg = T.Qwen2MoeConfig(**{**small, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512,
                                  "num_experts": 16, "num_experts_per_tok": 4})
        cls = T.Qwen2MoeForCausalLM
    elif family == "mistral":
        cfg, cls = T.MistralConfig(**small, sliding_window=WINDOW), T.MistralForCausalLM
    elif family == "gemma2":
        cfg, cls = T.Gemma2Config(**small, head_dim=64, sliding_window=WINDOW), T.Gemma2ForCausalLM
    elif family == "qwen2":
        cfg, cls = (T.Qwen2Config(**small, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
                    T.Qwen2ForCausalLM)
    else:
        raise SystemExit(f"unknown family {family!r}")
    return cls(cfg).to(device="cuda", dtype=getattr(torch, dtype)).eval()


class TransformersStep:
    """One decode step of a transformers model on static input buffers (token id, position), the cache
    prefilled with ``prompt`` tokens."""

    def __init__(self, family: str, cache: str, dtype: str, prompt: int, seed: int) -> None:
        import torch
        import transformers as T

        self.model = build_transformers(family, dtype, seed)
        self.vocab = self.model.config.vocab_size
        if cache == "dynamic":
            self.cache, self.capacity = T.DynamicCache(config=self.model.config), None
        elif cache == "static":
            self.cache = T.StaticCache(config=self.model.config, max_cache_len=MAX_CACHE)
            self.capacity = MAX_CACHE
        else:
            raise SystemExit(f"unknown cache {cache!r}; this family has {', '.join(TRANSFORMERS_CACHES)}")
        self.ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        self.pos = torch.zeros((1,), dtype=torch.long, device="cuda")
        ids = torch.arange(prompt, device="cuda").view(1, -1) % self.vocab
        with torch.no_grad():
            self.model(input_ids=ids, past_key_values=self.cache, cache_position=torch.arange(prompt, device="cuda"),
                       use_cache=True)
        torch.cuda.synchronize()
        self.state = [self.cache]
        self.start = prompt

    def advance(self, p: int) -> None:
        self.ids.fill_((p * 7919 + 13) % self.vocab)
        self.pos.fill_(p)

    def step(self):
        import torch

        with torch.no_grad():
            return self.model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.pos,
                              position_ids=self.pos.view(1, 1), use_cache=True).logits


class HandStep:
    """A small decoder in plain torch (module docstring): ``mode`` one of :data:`HAND_CACHES`; its KV
    cache and counters are its own attributes (the state is the decoder itself)."""

    def __init__(self, mode: str, dtype: str, prompt: int, seed: int, layers: int = 2, d: int = 256,
                 heads: int = 4, vocab: int = 4096) -> None:
        import torch

        if mode not in HAND_CACHES:
            raise SystemExit(f"unknown cache {mode!r}; this family has {', '.join(HAND_CACHES)}")
        g = torch.Generator(device="cuda").manual_seed(seed)
        dt = getattr(torch, dtype)

        def r(*s):
            return (torch.randn(*s, generator=g, device="cuda") * 0.05).to(dt)

        self.mode, self.layers, self.d, self.heads, self.hd, self.vocab = mode, layers, d, heads, d // heads, vocab
        self.emb = r(vocab, d)
        self.w = [(r(d, 3 * d), r(d, d), r(d, 4 * d), r(4 * d, d)) for _ in range(layers)]
        self.k = torch.zeros(layers, heads, HAND_MAX, self.hd, dtype=dt, device="cuda")
        self.v = torch.zeros_like(self.k)
        self.arange = torch.arange(HAND_MAX, device="cuda")
        self.ids = torch.zeros((1,), dtype=torch.long, device="cuda")
        self.hpos = 0                                                   # host-counter: on the host
        self.dpos = torch.zeros((1,), dtype=torch.long, device="cuda")  # the others: on the device
        with torch.no_grad():
            for p in range(prompt):  # the prefill: one position at a time, the step's own kernels
                self.advance(p)
                self.step()
        torch.cuda.synchronize()
        self.state = [self]
        self.start = prompt
        self.capacity = HAND_MAX

    def advance(self, p: int) -> None:
        self.ids.fill_((p * 7919 + 13) % self.vocab)

    def step(self):
        import torch

        x = self.emb[self.ids]
        for i, (wqkv, wo, w1, w2) in enumerate(self.w):
            q, k, v = (x @ wqkv).view(3, self.heads, self.hd)
            if self.mode == "host-counter":
                self.k[i, :, self.hpos] = k   # the slot's address is computed on the host
                self.v[i, :, self.hpos] = v
                mask = self.arange <= self.hpos  # the mask bound by value
            else:
                self.k[i].index_copy_(1, self.dpos, k.unsqueeze(1))
                self.v[i].index_copy_(1, self.dpos, v.unsqueeze(1))
                mask = self.arange <= self.dpos
            att = (q.unsqueeze(1) @ self.k[i].transpose(1, 2)).squeeze(1) / self.hd ** 0.5
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            o = (att.unsqueeze(1) @ self.v[i]).reshape(1, self.d)
            x = x + o @ wo
            x = x + torch.nn.functional.gelu(x @ w1) @ w2
        logits = x @ self.emb.T
        if self.mode == "host-counter":
            self.hpos += 1
        else:
            self.dpos += 1
        if self.mode == "host-read" and int(self.dpos.item()) >= HAND_MAX:  # a device value read on the host
            raise RuntimeError("cache full")
        return logits


def make(family: str, cache: str, dtype: str, *, prompt: int = PROMPT, seed: int = 0):
    """The step object of the contract (``step``, ``advance``, ``state``, ``start``, ``capacity``)."""
    if family == "handwritten":
        return HandStep(cache, dtype, prompt, seed)
    return TransformersStep(family, cache, dtype, prompt, seed)


def family(name: str, model: str, caches, cause=None):
    """``(make_step, main)`` of one of ds4lab's step scripts: ``model`` built by :func:`make` in ``caches``;
    ``cause(cache)`` the truth's cause where a variant is built to replay wrong."""

    def make_step(cache: str, dtype: str, *, prompt: int = PROMPT, seed: int = 0, device: str = "cuda"):
        """The step of the contract (README.md): prefilled, on static inputs."""
        return make(model, cache, dtype, prompt=prompt, seed=seed)

    return make_step, lambda argv=None: main(name, caches, make_step, cause_of=cause, argv=argv)


# ----------------------------------------------------------------------------- the command line
def decode_loop(s, p: int, run):
    """One iteration of these scripts' decode loop (the loop below, and the ground truth's eager and replay
    timings: ``_graph_truth.measure_truth``'s ``loop``): the inputs of position ``p`` written before the step
    (as a graph replay needs them), then ``run()`` (the eager step, or the replay) inside the NVTX range
    :data:`TOKEN_RANGE`; nothing read back. Returns ``run()``'s output."""
    import torch

    s.advance(p)
    torch.cuda.nvtx.range_push(TOKEN_RANGE)
    out = run()
    torch.cuda.nvtx.range_pop()
    return out


def main(family: str, caches, make_step, cause_of=None, argv=None) -> int:
    """The script's command line (the contract, module docstring): ``--list``, the decode loop, ``--truth``.
    ``cause_of(cache)``: the truth file's ``cause`` for a variant built to replay wrong (None otherwise)."""
    ap = argparse.ArgumentParser(description=f"ds4lab's {family} decode step")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--cache", default=caches[0], choices=caches)
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--prompt", type=int, default=PROMPT)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truth", default=None)
    a = ap.parse_args(argv)
    if a.list:
        print(json.dumps({"family": family, "caches": list(caches), "dtypes": list(DTYPES)}))
        return 0
    if a.truth:
        # The ground truth is the independently written harness every family shares (_graph_truth.py), so
        # these steps are held to the same torch.cuda.graph experiment as the others.
        import _graph_truth

        res = _graph_truth.measure_truth(family, __file__, a.cache, a.dtype, make_step, a, None, loop=decode_loop)
        if cause_of is not None and res["outcome"] == "replays wrong":
            res["cause"] = cause_of(a.cache)
        _graph_truth.write_truth(res, a.truth)
        return 0
    import torch

    s = make_step(a.cache, a.dtype, prompt=a.prompt, seed=a.seed)
    with torch.no_grad():
        p = s.start
        for _ in range(2):  # warm steps, outside the ranges
            s.advance(p)
            s.step()
            p += 1
        torch.cuda.synchronize()
        for _ in range(a.steps):
            logits = decode_loop(s, p, s.step)
            p += 1
        torch.cuda.synchronize()
    print(f"{family}/{a.cache}/{a.dtype}: {a.steps} decode steps to position {p}, last argmax "
          f"{int(logits.reshape(-1, logits.shape[-1])[-1].argmax())}")
    return 0


if __name__ == "__main__":
    sys.exit("run one of the ds4lab-*.py scripts beside this file")
