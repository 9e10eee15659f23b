"""ds4lab's gemma2 decode step (transformers, random weights), as a user's script (README.md):
``python ds4lab-gemma2.py [--list] [--cache dynamic|static] [--dtype D] [--truth OUT.json]``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ds4lab_steps import TRANSFORMERS_CACHES, family  # noqa: E402

make_step, main = family("ds4lab-gemma2", "gemma2", TRANSFORMERS_CACHES)

if __name__ == "__main__":
    sys.exit(main())
