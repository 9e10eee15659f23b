"""Command line and CUDA-graph ground truth shared by the decode-step family scripts.

Every family script calls :func:`main` with its ``make_step`` factory. Without ``--truth`` the script runs a
user's decode loop (one NVTX range per decode step). With ``--truth OUT.json`` it measures what
``torch.cuda.graph`` does with one decode step of that family:

1. build the step (``make_step`` does the prefill), snapshot its state at the first decode position ``p0``;
2. time the untraced eager loop (blocks of 10 iterations of the decode loop body between two CUDA events,
   state restored between blocks);
3. warm up on a side stream as the PyTorch CUDA-graph documentation does, restore, capture one step at ``p0``
   (a capture that raises is "refused", its exception text kept whole);
4. run the true eager step at ``p0``, then for each of the next six positions: snapshot, eager step (the
   reference), restore the snapshot, replay, compare, and continue from the eager state;
5. time the script's own decode loop with the step replaced by the replay, in the same blocks; and
   (advance inputs + replay) alone.

The eager loop, its timing and the replay's timing run one loop body (:class:`DecodeLoop`: advance, the
step inside the NVTX range, the argmax kept on the device), so the eager and replay times are those of the
loop the user runs, with the step eager or replayed.

A "step" object (see the steps README) has ``step()``, ``advance(p)``, ``state``, ``start`` and ``capacity``.

Snapshots keep object identity: the attributes, list items and dict values reachable from ``state`` are put
back to the very objects they held (a dynamic cache's grown tensors are dropped again), and every tensor
reached is copied back in place. That way the captured graph, which reads fixed addresses, sees the state a
user's program would have at that position.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import traceback
import types

import torch

COMPARED_POSITIONS = 6
BLOCK_STEPS = 10
TIMED_BLOCKS = 20
WARMUP_BLOCKS = 2
SIDE_STREAM_WARMUP = 3
TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

_STEPS_DIR = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------------------
# argument checks shared by the families' make_step


def check_make_step(family, cache, caches, prompt, capacity=None, device="cuda", needs_cuda=False):
    """Raise ValueError naming the bad value: unknown cache, prompt outside 1..capacity-1, CPU for a GPU-only family."""
    if cache not in caches:
        raise ValueError(f"{family}: cache must be one of {list(caches)}, got {cache!r}")
    if prompt < 1 or (capacity is not None and prompt >= capacity):
        raise ValueError(f"{family}: prompt must be in 1..{capacity - 1 if capacity else 'inf'}, got {prompt}")
    if needs_cuda and device != "cuda":
        raise ValueError(f"{family} launches its own CUDA kernels: device must be 'cuda', got {device!r}")


# ---------------------------------------------------------------------------------------------------------
# snapshot / restore


def _walks_into(obj):
    """Objects whose attributes are state: modules, transformers caches and classes of the step scripts."""
    if isinstance(obj, torch.nn.Module):
        return True
    module_name = type(obj).__module__ or ""
    if module_name.startswith("transformers.cache_utils"):
        return True
    module = sys.modules.get(module_name)
    module_file = getattr(module, "__file__", None) or ""
    return os.path.dirname(os.path.abspath(module_file)) == _STEPS_DIR if module_file else False


def _settle():
    """Wait for the device: host tensors in a state (a pinned staging buffer) may still be read by queued copies."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Snapshot:
    """The values of everything reachable from ``roots`` (tensors copied, containers shallow-copied)."""

    def __init__(self, roots):
        _settle()
        self.tensors = []  # (tensor object, detached copy of its values)
        self.dicts = []  # (dict object, shallow copy)
        self.lists = []  # (list object, shallow copy)
        self._seen = set()
        for root in roots:
            self._walk(root)
        del self._seen

    def _walk(self, obj):
        if isinstance(obj, (str, bytes, int, float, bool, complex, type(None), type, types.ModuleType,
                            types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
            return
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            self.tensors.append((obj, obj.detach().clone()))
        elif isinstance(obj, list):
            self.lists.append((obj, list(obj)))
            for item in obj:
                self._walk(item)
        elif isinstance(obj, dict):
            self.dicts.append((obj, dict(obj)))
            for value in list(obj.values()):
                self._walk(value)
        elif isinstance(obj, tuple):
            for item in obj:
                self._walk(item)
        elif hasattr(obj, "__dict__") and _walks_into(obj):
            self._walk(vars(obj))

    def restore(self):
        """Put every container back to the objects it held, then copy the saved values into the tensors."""
        _settle()
        for obj, saved in self.dicts:
            for key in [k for k in obj if k not in saved]:
                del obj[key]
            obj.update(saved)
        for obj, saved in self.lists:
            obj[:] = saved
        with torch.no_grad():
            for tensor, saved in self.tensors:
                if tensor.shape != saved.shape:
                    raise RuntimeError(f"a state tensor changed shape in place: {tuple(saved.shape)} -> "
                                       f"{tuple(tensor.shape)}")
                tensor.copy_(saved)


# ---------------------------------------------------------------------------------------------------------
# helpers


def _first_tensor(out):
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def _compare(ref, got, dtype):
    ref64 = ref.detach().double().flatten()
    got64 = got.detach().double().flatten()
    norm = torch.linalg.vector_norm(ref64).item()
    diff = torch.linalg.vector_norm(got64 - ref64).item()
    rel = diff / norm if norm > 0 else diff
    if not math.isfinite(rel):  # NaN or inf in the replay's output: written as Infinity
        rel = float("inf")
    same_argmax = bool(torch.equal(ref.float().reshape(-1, ref.shape[-1]).argmax(-1),
                                   got.float().reshape(-1, got.shape[-1]).argmax(-1)))
    max_abs = (got64 - ref64).abs().max().item()
    if not math.isfinite(max_abs):
        max_abs = float("inf")
    wrong = rel > TOLERANCE[dtype] or not same_argmax
    return rel, same_argmax, max_abs, wrong


def _timed_blocks(run_block, restore, warmup=WARMUP_BLOCKS, blocks=TIMED_BLOCKS):
    """µs per step of ``run_block`` (BLOCK_STEPS steps), from CUDA events; state restored before each block."""
    events = []
    for b in range(warmup + blocks):
        restore()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run_block()
        end.record()
        if b >= warmup:
            events.append((start, end))
    torch.cuda.synchronize()
    per_step = sorted(s.elapsed_time(e) * 1000.0 / BLOCK_STEPS for s, e in events)
    q = torch.tensor(per_step, dtype=torch.float64)
    median, p25, p75 = (torch.quantile(q, x).item() for x in (0.5, 0.25, 0.75))
    return round(median, 2), [round(p25, 2), round(p75, 2)]


def _graph_nodes(graph):
    """Node counts by type of the captured (not yet instantiated) graph, or None if cuda-python is absent."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python layout
        except ImportError:
            return None
    handle = graph.raw_cuda_graph()
    err, _, count = cudart.cudaGraphGetNodes(handle, 0)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaGraphGetNodes: {err}")
    err, nodes, count = cudart.cudaGraphGetNodes(handle, count)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaGraphGetNodes: {err}")
    counts = {}
    for node in nodes[:count]:
        err, kind = cudart.cudaGraphNodeGetType(node)
        if err != cudart.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaGraphNodeGetType: {err}")
        name = kind.name.replace("cudaGraphNodeType", "").lower()
        counts[name] = counts.get(name, 0) + 1
    return counts


def _driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _exception_text(exc):
    """The whole text of an exception and the ones chained to it, as Python prints them (no stack frames)."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return "\n".join("".join(traceback.format_exception_only(type(e), e)).rstrip()
                     for e in reversed(chain))


def _cause_line(family_file, code):
    lines = open(family_file, encoding="utf-8").read().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.strip().startswith(code)]
    if len(hits) != 1:
        raise RuntimeError(f"cause code {code!r} is on {len(hits)} lines of {family_file}, expected one")
    return hits[0]


# ---------------------------------------------------------------------------------------------------------
# the decode loop body


class DecodeLoop:
    """One iteration of the family scripts' decode loop, the same wherever it runs: the loop without
    ``--truth``, and the eager and replay timings of ``--truth``.

    ``loop(step, p, run)``: ``step.advance(p)`` (the inputs, written before the step as a replay needs them),
    ``run()`` inside the NVTX range ``nvtx_name`` (``step.step`` eagerly; the graph's replay returning its
    static output under ``--truth``), then the argmax of the output's last row, kept on the device in
    ``picks`` (the loop reads them once, after its last step: no iteration waits). Returns ``run()``'s output.
    """

    def __init__(self, nvtx_name=None):
        self.nvtx_name = nvtx_name
        self.picks = []

    def __call__(self, step, p, run):
        step.advance(p)
        if self.nvtx_name:
            torch.cuda.nvtx.range_push(self.nvtx_name)
        out = run()
        if self.nvtx_name:
            torch.cuda.nvtx.range_pop()
        first = _first_tensor(out)
        self.picks.append(first.reshape(-1, first.shape[-1])[-1].argmax())
        return out


def _replayed(graph, static_out):
    """``run`` of a loop body with the step replaced by ``graph``'s replay: returns the captured output."""
    def run():
        graph.replay()
        return static_out
    return run


# ---------------------------------------------------------------------------------------------------------
# the ground truth


def measure_truth(family, family_file, cache, dtype, make_step, args, intended, loop=None):
    """Capture one decode step, compare six replays with eager, time both; returns the result dict.

    ``loop(step, p, run)``: one iteration of the script's own decode loop (:class:`DecodeLoop`, or the
    script's own with the same signature); the eager time is blocks of it with ``run`` the eager step, the
    replay time (``replay_us``) blocks of it with ``run`` the replay; ``replay_bare_us`` times
    ``advance(p)`` and the replay alone. None: ``DecodeLoop()`` (no NVTX range)."""
    loop = DecodeLoop() if loop is None else loop
    if not torch.cuda.is_available():
        raise SystemExit("--truth needs a CUDA device")
    step = make_step(cache, dtype, prompt=args.prompt, seed=args.seed, device="cuda")
    p0 = step.start
    needed = p0 + max(COMPARED_POSITIONS + 1, BLOCK_STEPS)
    if step.capacity is not None and step.capacity < needed:
        raise SystemExit(f"capacity {step.capacity} is below the {needed} positions the truth needs "
                         f"(prompt {args.prompt})")
    torch.cuda.synchronize()
    at_start = Snapshot(step.state)

    def eager_block():
        for p in range(p0, p0 + BLOCK_STEPS):
            loop(step, p, step.step)

    eager_us, eager_spread = _timed_blocks(eager_block, at_start.restore)

    # capture at p0, after warm-up on a side stream
    at_start.restore()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(SIDE_STREAM_WARMUP):
            at_start.restore()
            step.advance(p0)
            step.step()
    torch.cuda.current_stream().wait_stream(side)
    at_start.restore()
    step.advance(p0)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    error = None
    static_out = None
    try:
        # the outer context puts the current stream back even when capture_end raises
        with torch.cuda.stream(torch.cuda.current_stream()):
            with torch.cuda.graph(graph):
                static_out = step.step()
    except Exception as exc:  # any refusal is an outcome, kept whole
        error = _exception_text(exc)

    result = {
        "family": family, "cache": cache, "dtype": dtype,
        "torch": torch.__version__,
        "transformers": sys.modules["transformers"].__version__ if "transformers" in sys.modules else None,
        "gpu": torch.cuda.get_device_name(), "driver": _driver_version(),
        "outcome": None, "error": error,
        "positions": [], "rel_err": [], "same_argmax": [], "first_wrong_position": None,
        "eager_us": eager_us, "eager_spread": eager_spread, "replay_us": None, "replay_spread": None,
        "replay_bare_us": None, "replay_bare_spread": None, "loop_body": True,
        "graph_kernels": None, "cause": None,
        # beyond the contract, for people reading the file
        "capture_position": p0, "capacity": step.capacity, "prompt": args.prompt, "seed": args.seed,
        "tolerance": TOLERANCE[dtype], "max_abs_err": [], "graph_nodes": None, "intended": intended,
    }
    if error is not None:
        result["outcome"] = "refused"
        return result

    try:
        nodes = _graph_nodes(graph)
    except Exception as exc:  # counting is optional; the verdict is not
        nodes = None
        result["graph_nodes_error"] = _exception_text(exc)
    if nodes is not None:
        result["graph_nodes"] = nodes
        result["graph_kernels"] = nodes.get("kernel", 0)
    graph.instantiate()
    static_ref = _first_tensor(static_out)

    # the true eager step at p0, then six positions compared from the true state
    at_start.restore()
    step.advance(p0)
    step.step()
    for p in range(p0 + 1, p0 + 1 + COMPARED_POSITIONS):
        before = Snapshot(step.state)
        step.advance(p)
        ref = _first_tensor(step.step()).detach().clone()
        after = Snapshot(step.state)
        before.restore()
        step.advance(p)
        try:
            graph.replay()
            got = static_ref.detach().clone()
            torch.cuda.synchronize()
        except Exception as exc:  # e.g. a device-side assert: the replay faulted at this position
            result["replay_error"] = _exception_text(exc)
            result["replay_faulted_at"] = p
            result["first_wrong_position"] = result["first_wrong_position"] or p
            result["outcome"] = "replays wrong"
            return result  # the CUDA context may be unusable now: nothing more is measured
        after.restore()
        rel, same, max_abs, wrong = _compare(ref, got, dtype)
        result["positions"].append(p)
        result["rel_err"].append(rel)
        result["same_argmax"].append(same)
        result["max_abs_err"].append(max_abs)
        if wrong and result["first_wrong_position"] is None:
            result["first_wrong_position"] = p
    torch.cuda.synchronize()
    result["outcome"] = "replays right" if result["first_wrong_position"] is None else "replays wrong"

    replay = _replayed(graph, static_out)

    def replay_block():  # the script's loop, the step replaced by the replay
        for p in range(p0, p0 + BLOCK_STEPS):
            loop(step, p, replay)

    def bare_block():  # advance and replay, nothing else of the loop
        for p in range(p0, p0 + BLOCK_STEPS):
            step.advance(p)
            graph.replay()

    try:
        result["replay_us"], result["replay_spread"] = _timed_blocks(replay_block, at_start.restore)
        result["replay_bare_us"], result["replay_bare_spread"] = _timed_blocks(bare_block, at_start.restore)
    except Exception as exc:  # a wrong replay may fault past the compared positions
        result["replay_error"] = _exception_text(exc)
    return result


# ---------------------------------------------------------------------------------------------------------
# command line


def write_truth(result, path):
    """Write the truth file whole (a .part file renamed), print its line; after a faulted replay, exit at once."""
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    print(f"{result['family']} {result['cache']} {result['dtype']}: {result['outcome']}", flush=True)
    if "replay_error" in result:
        # a faulted replay leaves the CUDA context broken; its teardown at exit may fail or hang
        sys.stderr.write(result["replay_error"] + "\n")
        sys.stderr.flush()
        os._exit(0)


def main(family, family_file, caches, make_step, nvtx_name, causes=None, intents=None):
    """Run a family script's command line (see the steps README for the contract).

    ``causes`` maps a cache name to {"code", "what", "kernel_hint"} for steps built to replay wrong:
    ``code`` is the start of the one line of ``family_file`` (indentation aside) where the host value enters
    the launch.
    ``intents`` maps a cache name to a short phrase of what the step is built to do.
    """
    parser = argparse.ArgumentParser(description=f"decode steps of the {family} family")
    parser.add_argument("--list", action="store_true", help="print the family, caches and dtypes as JSON")
    parser.add_argument("--cache", default=caches[0], choices=caches)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens prefilled (default 16)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps of the loop (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu runs the loop only (no NVTX, no --truth); for checks without a GPU")
    parser.add_argument("--truth", metavar="OUT.json", help="measure the CUDA-graph ground truth into OUT.json")
    args = parser.parse_args()
    causes = causes or {}
    intents = intents or {}

    if args.list:
        print(json.dumps({"family": family, "caches": list(caches), "dtypes": list(DTYPES)}))
        return 0
    if args.prompt < 1 or args.steps < 1:
        parser.error(f"--prompt and --steps must be positive (got {args.prompt}, {args.steps})")

    if args.truth:
        if args.device != "cuda":
            parser.error("--truth needs --device cuda")
        result = measure_truth(family, family_file, args.cache, args.dtype, make_step, args,
                               intents.get(args.cache), loop=DecodeLoop(nvtx_name))
        cause = causes.get(args.cache)
        if cause is not None and result["outcome"] == "replays wrong":
            result["cause"] = {"file": os.path.basename(family_file),
                               "line": _cause_line(family_file, cause["code"]),
                               "what": cause["what"], "kernel_hint": cause.get("kernel_hint")}
        write_truth(result, args.truth)
        return 0

    step = make_step(args.cache, args.dtype, prompt=args.prompt, seed=args.seed, device=args.device)
    if step.capacity is not None and step.start + args.steps > step.capacity:
        parser.error(f"--prompt {args.prompt} + --steps {args.steps} passes the cache capacity {step.capacity}")
    loop = DecodeLoop(nvtx_name if args.device == "cuda" else None)
    for p in range(step.start, step.start + args.steps):
        loop(step, p, step.step)
    tokens = torch.stack(loop.picks).tolist()  # one read after the loop: the steps themselves never wait here
    print(f"{family} {args.cache} {args.dtype} {args.device}: positions {step.start}..{step.start + args.steps - 1}"
          f", argmax {tokens}")
    return 0
