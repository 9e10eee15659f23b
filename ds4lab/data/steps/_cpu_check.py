"""CPU self-check of the torch and transformers families (no GPU needed): python _cpu_check.py [FAMILY ...]

For every cache and dtype of each family it builds the step on the CPU and checks what the ground truth
relies on, without a graph:

- a step repeated after ``Snapshot.restore()`` gives bit-identical logits;
- continuing from a restored post-step snapshot, after the state was disturbed by further steps, gives the
  same logits as an untouched twin stepped straight through.

Prints one line per family x cache x dtype and exits 1 if any check fails. The CuPy and Triton families
need CUDA and are not covered.
"""

import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _graph_truth import DTYPES, Snapshot  # noqa: E402

CPU_FAMILIES = ["phi3", "qwen3", "olmo2", "granite", "starcoder2", "gpt_neox", "llama", "host_scale",
                "rotary_host_index", "module_counter", "host_sync", "pinned_position"]


def check(module, cache, dtype):
    """True when restore-and-repeat and continue-from-snapshot both match an untouched twin bit for bit."""
    step = module.make_step(cache, dtype, device="cpu")
    twin = module.make_step(cache, dtype, device="cpu")
    p = step.start
    for s in (step, twin):
        s.advance(p)
        s.step()
    before = Snapshot(step.state)
    step.advance(p + 1)
    first = step.step().clone()
    after = Snapshot(step.state)
    before.restore()
    step.advance(p + 1)
    repeated = step.step().clone()
    for q in range(p + 2, p + 5):  # disturb the state
        step.advance(q)
        step.step()
    after.restore()
    step.advance(p + 2)
    continued = step.step().clone()
    twin.advance(p + 1)
    twin_first = twin.step()
    twin.advance(p + 2)
    twin_second = twin.step()
    return torch.equal(first, repeated) and torch.equal(first, twin_first) and torch.equal(continued, twin_second)


def main(families):
    failures = 0
    for family in families:
        module = importlib.import_module(family)
        for cache in module.CACHES:
            for dtype in DTYPES:
                ok = check(module, cache, dtype)
                failures += not ok
                print(f"{family} {cache} {dtype}: {'ok' if ok else 'MISMATCH'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or CPU_FAMILIES))
