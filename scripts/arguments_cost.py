#!/usr/bin/env python3
"""What the argument pass costs a user's step on the GPU machine: paired, interleaved, with 95 % intervals.

Two user-like steps, written as a user would (``--steps``):

* ``llama``: a transformers Llama of 2 layers built from a config with random weights, bf16, a
  ``StaticCache`` of 1 024 positions, one token per step (its position written into a fresh CUDA tensor,
  the next token taken on the device); the position wraps inside the cache, so every step does the same work;
* ``ops``: a plain loop of 300 small torch operators (``mul``, ``add``, ``relu`` on a 64 x 64 float32
  tensor), 300 TensorIterator launches a step.

For each step, :func:`ds4lab.trace.arguments.measure_overhead` (``--rounds`` interleaved pairs of blocks of
``--block`` steps, plain against the pass, alternating which goes first; the host wall clock between two
``torch.cuda.synchronize()``; the median of the paired differences with its 95 % interval) of:

* ``handler``: the launch handler alone (what ``audit validate``'s ``capture_us_per_launch`` measures),
  through CUPTI's C API (``native``, the default) and through cupti-python's wrapper (``python``,
  ``DS4LAB_CUPTI_CALLBACKS=python``): their difference is the wrapper's cost;
* ``handler+memory``: the handler with the allocator's history (``native``);
* ``pass``: the whole argument pass, the handler with the operator log and the allocator's history
  (``native``): over ``handler+memory``, the operator log's share.

Where the handler's time goes (``--breakdown``, on by default), each paired against the plain step the same way:

* ``subscribe``: CUPTI calling a Python function that returns at once, at the same launch calls (the
  callback's way into Python, per launch: a runtime and a nested driver call, entry and exit);
* ``handler, no stacks``: the handler reading every launch's bytes, with no Python stack taken;

and, from one block with the whole handler, how many launches per step took a stack walk (bytes new for their
function) and how many launch sites were formatted: ``handler`` less ``handler, no stacks`` is the stacks' share.

Launches per step are counted by the handler. Then one short argument pass per callback path
(``recording(arguments=True)``, 4 steps) says whether every launch was read (``unread`` must be 0).

Writes ``DIR/arguments-cost.csv`` (one row per step, part and path: µs per launch and per step with their
intervals, the plain step's µs, the launches per step) and ``DIR/env.json`` (GPU, driver, CPU, versions);
prints the same. About a minute on an H200.

Usage: ``python3 scripts/arguments_cost.py --out DIR [--steps llama,ops] [--rounds 16] [--block 5]``
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def llama_step():
    """A user's decode loop over a 2-layer transformers Llama (module docstring): ``(step, summary)``."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2, num_attention_heads=16,
                        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    model = T.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    cache = T.StaticCache(config=cfg, max_cache_len=1024)
    prompt = 16
    with torch.no_grad():
        out = model(input_ids=torch.arange(prompt, device="cuda").view(1, -1), past_key_values=cache,
                    cache_position=torch.arange(prompt, device="cuda"), use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    pos = [prompt]

    def step():
        p = pos[0]
        with torch.no_grad():
            out = model(input_ids=tok, past_key_values=cache, cache_position=torch.tensor([p], device="cuda"),
                        use_cache=True)
        tok.copy_(out.logits[:, -1:].argmax(-1))
        pos[0] = prompt + (p + 1 - prompt) % (1000 - prompt)  # wrap inside the cache: the same work each step

    return step, {"model": "LlamaForCausalLM", "layers": 2, "hidden": 1024, "dtype": "bfloat16",
                  "cache": "StaticCache(1024)", "transformers": T.__version__}


def ops_step():
    """A plain loop of 300 small torch operators (module docstring): ``(step, summary)``."""
    import torch

    x = torch.randn(64, 64, device="cuda")

    def step():
        y = x
        for _ in range(100):
            y = torch.relu(y * 1.0001 + 0.5)

    return step, {"operators": 300, "shape": [64, 64], "dtype": "float32"}


STEPS = {"llama": llama_step, "ops": ops_step}


def env() -> dict:
    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()}
    for dist in ("cupti-python", "transformers", "nvidia-cuda-cupti"):
        try:
            from importlib import metadata

            out[dist] = metadata.version(dist)
        except Exception:  # noqa: BLE001 - not installed
            out[dist] = None
    try:
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        out["gpu"] = None
    try:
        model = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        out["cpu"] = f"{model[0]} ({len(model)} logical)" if model else None
    except OSError:
        out["cpu"] = None
    try:
        out["ds4lab_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                              text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - a copy without .git
        out["ds4lab_commit"] = None
    return out


def fresh_session(callbacks: str):
    """The process's CUPTI session, its next callback subscriber through ``callbacks`` (``native`` or
    ``python``): the path is chosen again at the next subscription (none is open between measurements)."""
    from ds4lab.trace import cupti as C

    os.environ[C.CALLBACKS_ENV] = callbacks
    session = C.CuptiSession.get()
    if session.subscriber is not None:
        raise RuntimeError("a CUPTI callback subscriber is still open: the callback path cannot be chosen again")
    session.api = None
    return session


def check_pass(step, callbacks: str) -> dict:
    """A short argument pass (4 steps) through ``callbacks``: launches, unread, the path the session took."""
    import torch

    from ds4lab.trace import cupti as C
    from ds4lab.trace.recording import recording

    fresh_session(callbacks)
    with recording(arguments=True) as rec:
        for _ in range(4):
            step()
        torch.cuda.synchronize()
    st = rec.arguments
    unread = sum(1 for _, d in st.launches.values() if d is None)
    api = C.CuptiSession.get().api
    return {"launches": len(st.launches), "unread": unread, "api": type(api).__name__ if api is not None else None,
            "notes": [n for n in st.notes if "unread" in n][:3]}


def breakdown(step, session, rounds: int, block: int, sync) -> list[dict]:
    """The handler's parts (module docstring): ``[{"part", "per_step": Difference, "launches", "walks",
    "sites"}]`` for ``subscribe`` and ``handler, no stacks``, the last row the whole handler's counts."""
    from ds4lab.timing import interleaved_pairs, paired_difference
    from ds4lab.trace.arguments import LAUNCH_LAYOUTS, ArgumentCapture

    def timed() -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        sync()
        return (time.perf_counter() - t0) * 1e6 / block

    warm = ArgumentCapture(session)
    warm.start()
    try:
        timed()  # function lookups and launch sites made once, shared by the arms below
    finally:
        warm.stop()
    launches = len(warm.records) / block

    def noop(domain, cbid, cbdata) -> None:
        return None

    def subscribed() -> float:
        stop = session.watch_launches(frozenset(LAUNCH_LAYOUTS), noop)
        try:
            return timed()
        finally:
            stop()

    def no_stacks() -> float:
        cap = ArgumentCapture(session, warm.queries, stacks=False, shared=warm)
        cap.start()
        try:
            return timed()
        finally:
            cap.stop()

    rows = []
    for part, arm in (("subscribe", subscribed), ("handler, no stacks", no_stacks)):
        a, b = interleaved_pairs(timed, arm, rounds)
        rows.append({"part": part, "per_step": paired_difference(a, b), "launches": launches})
    full = ArgumentCapture(session, warm.queries, stacks=True, shared=warm)
    sites = sum(len(v) for v in warm._sites.values())
    full.start()
    try:
        timed()
    finally:
        full.stop()
    rows.append({"part": "handler (counts)", "per_step": None, "launches": len(full.records) / block,
                 "walks": len(full.stacks) / block,
                 "sites": sum(len(v) for v in warm._sites.values()) - sites})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for arguments-cost.csv and env.json")
    ap.add_argument("--steps", default="llama,ops", help=f"comma-separated, of: {', '.join(STEPS)}")
    ap.add_argument("--rounds", type=int, default=16, help="interleaved pairs per measurement")
    ap.add_argument("--block", type=int, default=5, help="steps per block")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="skip the handler's parts (subscribe, no stacks, stack walks per step)")
    args = ap.parse_args(argv)
    names = [s for s in args.steps.split(",") if s]
    bad = [s for s in names if s not in STEPS]
    if bad:
        ap.error(f"unknown step(s) {', '.join(bad)}; choose from: {', '.join(STEPS)}")
    import torch

    from ds4lab.trace.arguments import PASS_PARTS, measure_overhead

    args.out.mkdir(parents=True, exist_ok=True)
    info = env()
    (args.out / "env.json").write_text(json.dumps(info, indent=1))
    print("env:", json.dumps(info))
    rows = []
    csv_path = args.out / "arguments-cost.csv"
    fields = ["step", "part", "callbacks", "launches_per_step", "per_launch_us", "per_launch_lo", "per_launch_hi",
              "per_step_us", "per_step_lo", "per_step_hi", "plain_step_us", "pairs", "measurable", "parts", "text"]
    for name in names:
        step, summary = STEPS[name]()
        for _ in range(5):  # warm: kernels loaded, allocator settled
            step()
        torch.cuda.synchronize()
        print(f"{name}: {json.dumps(summary)}", flush=True)
        for part, callbacks, parts in (("handler", "native", ("launches",)), ("handler", "python", ("launches",)),
                                       ("handler+memory", "native", ("launches", "memory")),
                                       ("pass", "native", PASS_PARTS)):
            session = fresh_session(callbacks)
            t0 = time.time()
            c = measure_overhead(step, None, session=session, rounds=args.rounds, steps=args.block,
                                 sync=torch.cuda.synchronize, parts=parts, torch_module=torch)
            api = type(session.api).__name__ if session.api is not None else "none"
            row = {"step": name, "part": part, "callbacks": f"{callbacks} ({api})",
                   "launches_per_step": c["launches_per_step"],
                   "per_launch_us": c["per_launch_us"], "per_launch_lo": c["per_launch_lo"],
                   "per_launch_hi": c["per_launch_hi"], "per_step_us": c["per_step_us"], "per_step_lo": c["lo"],
                   "per_step_hi": c["hi"], "plain_step_us": c["baseline_us"], "pairs": c["n"],
                   "measurable": c["measurable"], "parts": "+".join(c["parts"]), "text": c["text"]}
            rows.append(row)
            print(f"  {part:<15}{callbacks:<7} [{api}] {c['text']}  ({time.time() - t0:.1f} s)", flush=True)
            with csv_path.open("w", newline="") as f:  # written as it goes
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows(rows)
        if args.breakdown:
            session = fresh_session("native")
            for r in breakdown(step, session, args.rounds, args.block, torch.cuda.synchronize):
                d, n = r["per_step"], max(r["launches"], 1.0)
                if d is None:
                    text = (f"{r['walks']:g} stack walks and {r['sites']} new launch sites per step "
                            f"of {r['launches']:g} launches")
                    row = {"step": name, "part": r["part"], "callbacks": "native",
                           "launches_per_step": r["launches"], "text": text}
                else:
                    text = (f"{d.median / n:.2f} µs per launch (95 % CI {d.lo / n:.2f}–{d.hi / n:.2f}; {d.fmt()} "
                            f"per step)" if d.measurable else f"{d.fmt()} per step")
                    row = {"step": name, "part": r["part"], "callbacks": "native", "launches_per_step": r["launches"],
                           "per_launch_us": d.median / n, "per_launch_lo": d.lo / n, "per_launch_hi": d.hi / n,
                           "per_step_us": d.median, "per_step_lo": d.lo, "per_step_hi": d.hi,
                           "plain_step_us": d.baseline, "pairs": d.n, "measurable": d.measurable, "text": text}
                rows.append(row)
                print(f"  {r['part']:<22} {text}", flush=True)
            with csv_path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows(rows)
        for callbacks in ("native", "python"):
            print(f"  check {callbacks}: {json.dumps(check_pass(step, callbacks))}", flush=True)
    print(f"wrote {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
