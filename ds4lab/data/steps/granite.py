"""Granite decode steps: a 2-layer Granite (Llama-like with embedding, attention, residual and logits
multipliers as in the IBM Granite 3 configs) built from a config, decoded by a plain ``model.forward`` loop.
Caches: ``static`` (StaticCache of 64 positions) and ``dynamic`` (DynamicCache). Eager attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "granite"
CACHES = ["static", "dynamic"]
MAX_CACHE_LEN = 64


def make_config():
    from transformers import GraniteConfig

    return GraniteConfig(vocab_size=4000, hidden_size=512, intermediate_size=1280, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                       embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
                       logits_scaling=8.0, initializer_range=0.05, bos_token_id=0, eos_token_id=0,
                       pad_token_id=0, tie_word_embeddings=True)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A granite decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(), cache, dtype, caches=CACHES, attn_implementation="eager",
                        max_cache_len=MAX_CACHE_LEN, prompt=prompt, seed=seed, device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "gen_token"))
