"""ds4lab's hand-written decoder (plain torch: a KV cache tensor, masked attention over it), as a user's
script: see _ds4lab_steps.py and README.md. ``python ds4lab-handwritten.py [--cache host-counter|
device-counter|host-read] [--dtype D] [--truth OUT.json]``."""

import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ds4lab_steps as S  # noqa: E402


def cause(cache: str):
    """The host-counter cache keeps its mask bound on the host: the graph compares with the captured one."""
    if cache != "host-counter":
        return None
    src, first = inspect.getsourcelines(S.HandStep.step)
    line = first + next(i for i, text in enumerate(src) if "self.arange <= self.hpos" in text)
    return {"file": "_ds4lab_steps.py", "line": line,
            "what": "the mask bound is the host's position, passed by value to the comparison kernel",
            "kernel_hint": None}


make_step, main = S.family("ds4lab-handwritten", "handwritten", S.HAND_CACHES, cause)

if __name__ == "__main__":
    sys.exit(main())
