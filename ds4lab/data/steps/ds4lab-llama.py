"""ds4lab's llama decode step (transformers, random weights), as a user's script (README.md):
``python ds4lab-llama.py [--list] [--cache dynamic|static] [--dtype D] [--truth OUT.json]``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ds4lab_steps import TRANSFORMERS_CACHES, family  # noqa: E402

make_step, main = family("ds4lab-llama", "llama", TRANSFORMERS_CACHES)

if __name__ == "__main__":
    sys.exit(main())
