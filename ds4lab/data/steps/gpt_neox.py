"""GPT-NeoX decode steps: a 2-layer GPT-NeoX (parallel residual, partial rotary on a quarter of each head)
built from a config, decoded by a plain ``model.forward`` loop. Caches: ``static`` (StaticCache of 40
positions) and ``dynamic`` (DynamicCache). Eager attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "gpt_neox"
CACHES = ["static", "dynamic"]
MAX_CACHE_LEN = 40


def make_config():
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=2048, use_parallel_residual=True,
                       initializer_range=0.05, bos_token_id=0, eos_token_id=0, pad_token_id=None)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A gpt_neox decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(), cache, dtype, caches=CACHES, attn_implementation="eager",
                        max_cache_len=MAX_CACHE_LEN, prompt=prompt, seed=seed, device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "neox_step"))
