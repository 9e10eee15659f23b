"""ds4lab's qwen2 decode step (transformers, random weights), as a user's script: see _ds4lab_steps.py and
README.md. ``python ds4lab-qwen2.py [--cache dynamic|static] [--dtype D] [--truth OUT.json]``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ds4lab_steps as S  # noqa: E402

FAMILY = "ds4lab-qwen2"


def make_step(cache: str, dtype: str, *, prompt: int = S.PROMPT, seed: int = 0, device: str = "cuda"):
    """The step of the contract (README.md): prefilled, on static inputs."""
    return S.make("qwen2", cache, dtype, prompt=prompt, seed=seed)


if __name__ == "__main__":
    sys.exit(S.main(FAMILY, S.TRANSFORMERS_CACHES, make_step))
