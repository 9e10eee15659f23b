"""OLMo-2 decode steps: a 2-layer OLMo-2 (post-norm blocks, q/k RMSNorm over all heads) built from a config,
decoded by a plain ``model.forward`` loop. Caches: ``static`` (StaticCache of 96 positions) and ``dynamic``
(DynamicCache). SDPA attention.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import main  # noqa: E402
from _hf_decode import make_hf_step  # noqa: E402

FAMILY = "olmo2"
CACHES = ["static", "dynamic"]
MAX_CACHE_LEN = 96


def make_config():
    from transformers import Olmo2Config

    return Olmo2Config(vocab_size=1536, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048,
                       initializer_range=0.05, bos_token_id=None, eos_token_id=1, pad_token_id=0)


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    """A olmo2 decode step after a prefill of ``prompt`` tokens (see _hf_decode.HFDecodeStep)."""
    return make_hf_step(FAMILY, make_config(), cache, dtype, caches=CACHES, attn_implementation="sdpa",
                        max_cache_len=MAX_CACHE_LEN, prompt=prompt, seed=seed, device=device)


if __name__ == "__main__":
    sys.exit(main(FAMILY, __file__, CACHES, make_step, "step"))
