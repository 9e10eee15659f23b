"""StarCoder2 decode steps: a 2-layer StarCoder2 with a sliding window of 20 positions, smaller than the
prompt plus the decode steps (16 + 8), built from a config and decoded by a plain ``model.forward`` loop.
Caches: ``static`` (StaticCache of 64 positions; its layers are sliding-window layers of 20 rows) and
``dynamic`` (DynamicCache with sliding-window layers). SDPA attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "starcoder2"
CACHES = ["static", "dynamic"]
MAX_CACHE_LEN = 64
SLIDING_WINDOW = 20


def make_config():
    from transformers import Starcoder2Config

    return Starcoder2Config(vocab_size=2000, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       sliding_window=SLIDING_WINDOW, use_bias=True, initializer_range=0.05,
                       bos_token_id=0, eos_token_id=0, pad_token_id=None)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A starcoder2 decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(), cache, dtype, caches=CACHES, attn_implementation="sdpa",
                        max_cache_len=MAX_CACHE_LEN, prompt=prompt, seed=seed, device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "sc2_decode"))
