"""Llama decode steps: a 2-layer Llama built from a config, driven by the user's own loop over
``model.forward`` with a ``StaticCache`` the user sized.

Caches: ``static`` (StaticCache of 256 positions) and ``static-128`` (128 positions: with the default prompt
of 16, anything that decodes past 112 steps runs out of cache). SDPA attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "llama"
CACHES = ["static", "static-128"]
MAX_CACHE_LEN = {"static": 256, "static-128": 128}


def make_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=3000, hidden_size=320, intermediate_size=864, num_hidden_layers=2,
                       num_attention_heads=5, num_key_value_heads=5, max_position_embeddings=2048,
                       initializer_range=0.05, bos_token_id=1, eos_token_id=2, pad_token_id=None)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A Llama decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(), cache, dtype, caches=CACHES, attn_implementation="sdpa",
                        max_cache_len=MAX_CACHE_LEN.get(cache), prompt=prompt, seed=seed, device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "llama_decode"))
