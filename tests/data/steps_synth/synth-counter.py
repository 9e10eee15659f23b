"""A tiny decode step to the contract of ``ds4lab audit validate`` (docs/audit-arguments.md, "Validation on
the user's path"), for the tests: a KV cache written at a position kept on the host (``host-counter``:
replays wrong, its cause at the write) or on the device (``device-counter``: replays right). ``--list``
needs nothing but Python; the loop, ``--truth`` and ``make_step`` need torch and a GPU."""

import argparse
import json
import sys

CACHES = ("host-counter", "device-counter")
CAPACITY = 64


class Step:
    def __init__(self, cache, dtype, prompt=16, seed=0):
        import torch

        g = torch.Generator(device="cuda").manual_seed(seed)
        self.dt = getattr(torch, dtype)
        self.w = torch.randn(32, 32, generator=g, device="cuda").to(self.dt)
        self.kv = torch.zeros(CAPACITY, 32, dtype=self.dt, device="cuda")
        self.x = torch.zeros(1, 32, dtype=self.dt, device="cuda")
        self.cache, self.hpos = cache, 0
        self.dpos = torch.zeros(1, dtype=torch.long, device="cuda")
        for p in range(prompt):
            self.advance(p)
            self.step()
        self.state, self.start, self.capacity = [self], prompt, CAPACITY

    def advance(self, p):
        self.x.fill_((p % 7) / 7.0)

    def step(self):
        import torch

        h = torch.tanh(self.x @ self.w)
        if self.cache == "host-counter":
            self.kv[self.hpos] = h[0]  # CAUSE: the write index is the host's position
            self.hpos += 1
        else:
            self.kv.index_copy_(0, self.dpos, h)
            self.dpos += 1
        return (self.kv.sum(0, keepdim=True) @ self.w).float()


def make_step(cache, dtype, *, prompt=16, seed=0, device="cuda"):
    return Step(cache, dtype, prompt, seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--cache", default=CACHES[0], choices=CACHES)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--truth", default=None)
    a, _ = ap.parse_known_args()
    if a.list:
        print(json.dumps({"family": "synth-counter", "caches": list(CACHES), "dtypes": ["float32"]}))
        return 0
    import torch

    s = make_step(a.cache, a.dtype)
    if a.truth:  # the smallest truth: capture, replay once at the next position, compare with eager
        snap = (s.kv.clone(), s.dpos.clone(), s.hpos)
        s.advance(s.start)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = s.step()
        s.kv.copy_(snap[0]), s.dpos.copy_(snap[1])
        s.hpos = snap[2]
        s.advance(s.start)
        s.step()
        snap = (s.kv.clone(), s.dpos.clone(), s.hpos)
        s.advance(s.start + 1)
        ref = s.step().clone()
        s.kv.copy_(snap[0]), s.dpos.copy_(snap[1])
        g.replay()
        torch.cuda.synchronize()
        err = float((out - ref).norm() / ref.norm())
        line = next(i for i, t in enumerate(open(__file__).read().splitlines(), 1) if "# CAUSE" in t)
        wrong = err > 1e-3
        json.dump({"family": "synth-counter", "cache": a.cache, "dtype": a.dtype,
                   "outcome": "replays wrong" if wrong else "replays right", "error": None,
                   "positions": [s.start + 1], "rel_err": [err], "first_wrong_position": s.start + 1 if wrong else None,
                   "cause": {"file": "synth-counter.py", "line": line, "what": "the write index is the host's",
                             "kernel_hint": None} if wrong else None}, open(a.truth, "w"))
        return 0
    for i in range(a.steps):
        s.advance(s.start + i)
        torch.cuda.nvtx.range_push("step")
        s.step()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
