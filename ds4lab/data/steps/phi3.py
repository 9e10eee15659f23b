"""Phi-3 decode steps: a 2-layer Phi-3 built from a config, decoded by a plain ``model.forward`` loop.

Caches: ``static`` (StaticCache of 64 positions), ``dynamic`` (DynamicCache) and ``static-longrope`` (the
static cache with the LongRoPE scaling of the 128k-context Phi-3 checkpoints). Eager attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "phi3"
CACHES = ["static", "dynamic", "static-longrope"]
MAX_CACHE_LEN = 64
HEAD_DIM = 64


def make_config(longrope):
    from transformers import Phi3Config

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    max_positions = 4096
    if longrope:
        # LongRoPE as in the 128k checkpoints: short factors below the original length, long ones above it
        half = HEAD_DIM // 2
        rope = {"rope_type": "longrope", "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.02 * i for i in range(half)],
                "long_factor": [1.0 + 0.5 * i for i in range(half)],
                "original_max_position_embeddings": 1024}
        max_positions = 32768
    return Phi3Config(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_positions,
                      original_max_position_embeddings=1024 if longrope else max_positions,
                      rope_parameters=rope, initializer_range=0.06, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, tie_word_embeddings=False)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A Phi-3 decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(longrope=cache == "static-longrope"), cache, dtype, caches=CACHES,
                        attn_implementation="eager", max_cache_len=MAX_CACHE_LEN, prompt=prompt, seed=seed,
                        device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "decode_step"))
