"""A user's decode loop over a transformers causal LM built from a config (random weights, no download).

The loop is the plain one many users write around ``model.forward``::

    out = model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)

with ``ids`` (1, 1) and ``pos`` (1,) kept as fixed device buffers that the loop overwrites before each step,
and a ``StaticCache`` or ``DynamicCache`` made by the user. Token ids follow a fixed random sequence drawn
from the seed (teacher forcing), so every run of a family sees the same inputs.
"""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class HFDecodeStep:
    """One decode step of ``model`` with a user-made cache.

    Args:
        model: a transformers ``*ForCausalLM`` already on ``device`` in its dtype, in eval mode.
        cache: ``"static"`` or ``"dynamic"``.
        prompt: tokens prefilled by the constructor; the first decode position is ``prompt``.
        max_cache_len: length of the static cache (ignored for the dynamic one).
        seed: draws the token sequence.
    """

    def __init__(self, model, cache, *, prompt, max_cache_len, seed, device):
        from transformers import DynamicCache, StaticCache

        self.model = model
        vocab = model.config.vocab_size
        generator = torch.Generator().manual_seed(seed + 1)
        length = max(max_cache_len, prompt + 512)
        self.tokens = torch.randint(0, vocab, (length,), generator=generator).to(device)
        if cache == "static":
            self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
            self.capacity = max_cache_len
        elif cache == "dynamic":
            self.cache = DynamicCache(config=model.config)
            self.capacity = None
        else:
            raise ValueError(f"cache must be 'static' or 'dynamic', got {cache!r}")
        if self.capacity is not None and prompt >= self.capacity:
            raise ValueError(f"prompt {prompt} does not fit a static cache of {self.capacity}")
        self.input_ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.cache_position = torch.zeros((1,), dtype=torch.long, device=device)
        with torch.no_grad():
            self.model(input_ids=self.tokens[:prompt].unsqueeze(0), past_key_values=self.cache,
                       cache_position=torch.arange(prompt, device=device), use_cache=True)
        self.start = prompt
        self.state = [self.cache]

    def advance(self, p):
        """Write the token and cache position of decode position ``p`` into the input buffers."""
        self.input_ids.copy_(self.tokens[p % len(self.tokens)].view(1, 1))
        self.cache_position.fill_(p)

    @torch.no_grad()
    def step(self):
        """One decode step; returns the logits, shape (1, 1, vocab)."""
        out = self.model(input_ids=self.input_ids, past_key_values=self.cache,
                         cache_position=self.cache_position, use_cache=True)
        return out.logits


def build_model(config, dtype, *, seed, device, attn_implementation):
    """A causal LM from ``config`` with random weights from ``seed`` (initialised on the CPU in float32)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.to(device=device, dtype=DTYPES[dtype]).eval()


def make_hf_step(family, config, cache, dtype, *, caches, attn_implementation, max_cache_len, prompt, seed,
                 device):
    """Check the arguments, build the model from ``config`` and prefill: the body of each family's make_step."""
    from _graph_truth import check_make_step

    check_make_step(family, cache, caches, prompt)
    model = build_model(config, dtype, seed=seed, device=device, attn_implementation=attn_implementation)
    kind = "dynamic" if cache == "dynamic" else "static"
    return HFDecodeStep(model, kind, prompt=prompt, max_cache_len=max_cache_len, seed=seed, device=device)
