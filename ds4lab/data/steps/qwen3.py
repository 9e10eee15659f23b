"""Qwen3 decode steps: a 2-layer Qwen3 (grouped-query attention, q/k RMSNorm) built from a config,
decoded by a plain ``model.forward`` loop. Caches: ``static`` (StaticCache of 48 positions) and ``dynamic``
(DynamicCache). SDPA attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "qwen3"
CACHES = ["static", "dynamic"]
MAX_CACHE_LEN = 48


def make_config():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=3072, hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                       initializer_range=0.05, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                       tie_word_embeddings=True)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A qwen3 decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(), cache, dtype, caches=CACHES, attn_implementation="sdpa",
                        max_cache_len=MAX_CACHE_LEN, prompt=prompt, seed=seed, device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "qwen3_token"))
