"""The empirical check for PyTorch engines (:func:`check_replay`; GPU and torch needed): capture the user's step with
``torch.cuda.graph``, replay it at the next positions against an eager twin restored from a snapshot of ``state``,
and say what the graph did (**refused**, **replays right**: every output within ``rtol`` and the same argmax,
**replays wrong**: the first position and output that differ), then time the replays with CUDA events
(``replay_us``, ``replay_sync_us``, ``replay_device_us``). Usage, ``state``, ``capacity`` and
:class:`StateError`: docs/audit-arguments.md, "The empirical check"."""

from __future__ import annotations

import contextlib
import copy
import statistics
from dataclasses import dataclass, field

import numpy as np

from ..errors import BadInput

RTOL = {"float32": 1e-3, "float64": 1e-6, "bfloat16": 2e-2, "float16": 2e-2}
#: Cycles of the spinning kernel a device-time replay is queued behind (about 0.5 ms at the H200's
#: 1.98 GHz: longer than the host takes to queue the events and the graph launch behind it).
SPIN_CYCLES = 1_000_000
#: Steps per timed block of replays (the block's events divided by them).
TIMED_STEPS = 10
REFUSED, RIGHT, WRONG = "refused", "captured, replays right", "captured, replays wrong"


@dataclass
class ReplayCheck:
    """What :func:`check_replay` found: ``outcome`` (:data:`REFUSED`, :data:`RIGHT`, :data:`WRONG`), ``verdict``
    (the audit's words), ``first_position``/``first_output`` (None: none differs), ``captured_at``, ``errors`` (per
    position ``{position, output, rel_err, same_argmax}``), ``replay_us`` (µs per step of a loop of ``advance`` and
    replay that never waits, median of blocks) with ``replay_spread`` (p25, p75), ``replay_sync_us`` (waiting for
    each replay), ``replay_device_us`` (the graph's device time), ``graph_kernels``, ``detail``, ``error``."""

    outcome: str
    detail: str = ""
    first_position: int | None = None
    first_output: str | None = None
    captured_at: int | None = None
    errors: list = field(default_factory=list)
    replay_us: float | None = None
    replay_spread: tuple | None = None
    replay_sync_us: float | None = None
    replay_device_us: float | None = None
    #: kernel nodes of the captured graph (None where torch cannot keep the graph to count them): a step
    #: whose Python takes another path under capture holds other work than its eager token
    graph_kernels: int | None = None
    error: str = ""
    #: the positions the state holds (None: unbounded), and how many positions were compared and timed
    capacity: int | None = None
    positions_compared: int = 0
    steps_timed: int = 0

    @property
    def verdict(self) -> str:
        return {REFUSED: "refused", RIGHT: "replays right", WRONG: "replays wrong"}[self.outcome]


# ----------------------------------------------------------------------------- the state
def _walk(obj, tensor_type, memo, depth=0):
    """``[(holder, key, value)]`` of every tensor and plain Python value reachable from ``obj`` through attributes,
    lists, tuples and dicts (``key``: attribute name or index)."""
    out = []
    if depth > 6 or id(obj) in memo:
        return out
    memo.add(id(obj))
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = list(enumerate(obj))
    elif isinstance(obj, tuple):
        return [x for v in obj for x in _walk(v, tensor_type, memo, depth + 1)]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).items())
    else:
        return out
    for k, v in items:
        if isinstance(v, tensor_type):
            out.append((obj, k, v))
        elif isinstance(v, (int, float, bool, str)) or v is None:
            out.append((obj, k, v))
        elif isinstance(v, (list, dict)) and all(isinstance(x, (int, float, bool, str)) for x in
                                                 (v.values() if isinstance(v, dict) else v)):
            out.append((obj, k, v))
        elif isinstance(v, (dict, list, tuple)) or hasattr(v, "__dict__"):
            if not callable(v) or hasattr(v, "__dict__"):
                out.extend(_walk(v, tensor_type, memo, depth + 1))
    return out


def _get(holder, key):
    return holder[key] if isinstance(holder, (dict, list)) else getattr(holder, key)


def _set(holder, key, value):
    if isinstance(holder, (dict, list)):
        holder[key] = value
    else:
        setattr(holder, key, value)


def snapshot(state, ops) -> list:
    """Everything of ``state`` that a step may change: ``[(holder, key, the object, its copy)]``; tensors ``ops.keep``
    refuses (a module's parameters) are left out. Raises what a copy raises, naming the holder and the key."""
    out = []
    keep = getattr(ops, "keep", None)
    for holder, key, v in _walk(state, ops.tensor_type, set()):
        if keep is not None and isinstance(v, ops.tensor_type) and not keep(v):
            continue
        try:
            out.append((holder, key, v, ops.clone(v) if isinstance(v, ops.tensor_type) else copy.deepcopy(v)))
        except Exception as e:  # noqa: BLE001 - name what could not be copied
            raise type(e)(f"{type(holder).__name__}.{key} ({type(v).__name__}): {e}") from None
    return out


def restore(snap, ops) -> None:
    """Put ``snap`` back: tensors in place where the holder still has the same tensor of the same shape (a graph holds
    their memory), else the copy set back; plain values set back."""
    for holder, key, obj, saved in snap:
        if isinstance(obj, ops.tensor_type):
            now = _get(holder, key)
            if now is obj and ops.same_shape(obj, saved):
                ops.copy_into(obj, saved)
            elif ops.same_shape(obj, saved):
                ops.copy_into(obj, saved)
                _set(holder, key, obj)
            else:
                _set(holder, key, ops.clone(saved))
        else:
            _set(holder, key, copy.deepcopy(saved))


def _outputs(out, ops) -> list:
    """``[(name, tensor)]`` of a step's output(s): a tensor, a tuple/list, a dict, or an object with ``logits``."""
    if isinstance(out, ops.tensor_type):
        return [("output", out)]
    if isinstance(out, dict):
        return [(str(k), v) for k, v in out.items() if isinstance(v, ops.tensor_type)]
    if isinstance(out, (list, tuple)):
        return [(f"output[{i}]", v) for i, v in enumerate(out) if isinstance(v, ops.tensor_type)]
    if hasattr(out, "logits"):
        return [("logits", out.logits)]
    raise TypeError(f"check_replay: the step returned {type(out).__name__}; return its output tensor(s)")


# ----------------------------------------------------------------------------- torch
class TorchOps:
    """What :func:`check_replay` asks of PyTorch (one place; a stand-in in the tests)."""

    def __init__(self, torch) -> None:
        self.t = torch
        self.tensor_type = torch.Tensor

    def warm(self, fn, n: int) -> None:
        t = self.t
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for _ in range(n):
                fn()
        t.cuda.current_stream().wait_stream(s)
        t.cuda.synchronize()

    def capture(self, fn):
        try:  # keep the cudaGraph_t so that its nodes can be counted (torch 2.6 and later)
            g = self.t.cuda.CUDAGraph(keep_graph=True)
        except TypeError:
            g = self.t.cuda.CUDAGraph()
        with self.t.cuda.graph(g):
            out = fn()
        return g, out

    def graph_kernels(self, g) -> int | None:
        """The kernel nodes of a kept captured graph (``cuGraphGetNodes``); None where not kept or a call failed."""
        import ctypes

        try:
            raw = int(g.raw_cuda_graph())
        except Exception:  # noqa: BLE001 - a torch that does not keep the graph: not counted
            return None
        cu = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_size_t(0)
        if cu.cuGraphGetNodes(ctypes.c_void_p(raw), None, ctypes.byref(n)) != 0:
            return None
        nodes = (ctypes.c_void_p * n.value)()
        if cu.cuGraphGetNodes(ctypes.c_void_p(raw), nodes, ctypes.byref(n)) != 0:
            return None
        kind, count = ctypes.c_int(0), 0
        for node in nodes[:n.value]:
            if cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) != 0:
                return None
            count += kind.value == 0  # CU_GRAPH_NODE_TYPE_KERNEL
        return count

    def replay(self, g) -> None:
        g.replay()
        self.t.cuda.synchronize()

    def launch(self, g) -> None:
        g.replay()  # queued; the host goes on

    def sync(self) -> None:
        self.t.cuda.synchronize()

    def clone(self, x):
        return x.detach().clone()

    def copy_into(self, dst, src) -> None:
        with self.t.no_grad():  # a leaf that requires grad (a module's tensor) is put back without autograd
            dst.copy_(src)

    def no_grad(self):
        """The check runs without autograd (a user's step may not turn it off itself)."""
        return self.t.no_grad()

    def keep(self, x) -> bool:
        """Whether a tensor of the state is snapshotted: not a module's parameter (``nn.Parameter``)."""
        return not isinstance(x, self.t.nn.Parameter)

    def same_shape(self, a, b) -> bool:
        return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype

    def dtype(self, x) -> str:
        return str(x.dtype).replace("torch.", "")

    def rel_err(self, got, ref) -> float:
        t = self.t
        g, r = got.detach().float(), ref.detach().float()
        if tuple(g.shape) != tuple(r.shape):
            return float("inf")
        den = float(t.linalg.vector_norm(r))
        num = float(t.linalg.vector_norm(g - r))
        return num / den if den else (0.0 if num == 0 else float("inf"))

    def same_argmax(self, got, ref) -> bool:
        if not got.is_floating_point() or got.numel() <= 1 or tuple(got.shape) != tuple(ref.shape):
            return bool((got == ref).all()) if tuple(got.shape) == tuple(ref.shape) else False
        return bool((got.argmax(-1) == ref.argmax(-1)).all())

    def time_blocks(self, fn, steps: int, rounds: int) -> list[float]:
        """µs per call of ``fn``: ``rounds`` blocks of ``steps`` calls back to back between two CUDA events, one
        synchronize after each block (the host never waits inside it)."""
        t = self.t
        out = []
        for _ in range(rounds):
            t.cuda.synchronize()
            e0, e1 = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(steps):
                fn()
            e1.record()
            t.cuda.synchronize()
            out.append(e0.elapsed_time(e1) * 1e3 / steps)
        return out

    def time_device(self, g, n: int) -> list[float]:
        """µs of the graph's device time per replay: ``n`` replays, each queued behind a spinning kernel."""
        t = self.t
        out = []
        for _ in range(n):
            t.cuda.synchronize()
            e0, e1 = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            t.cuda._sleep(SPIN_CYCLES)
            e0.record()
            self.launch(g)
            e1.record()
            t.cuda.synchronize()
            out.append(e0.elapsed_time(e1) * 1e3)
        return out


class StateError(BadInput):
    """The state cannot be snapshotted or put back (naming the object, its type and why)."""


def check_replay(step, state, *, advance=None, start: int = 0, positions: int = 6, warmup: int = 2,
                 rtol: float | None = None, time_replays: int = 10, capacity: int | None = None,
                 ops=None) -> ReplayCheck:
    """Capture ``step`` (one decode step on static inputs) and hold its replays to an eager twin.

    ``state``: what the step reads and changes between positions (its ``nn.Parameter`` left out of the snapshot);
    ``advance(position)``: writes a position's inputs (None: none); ``start``: the warm-up's first position;
    ``positions``: replays compared; ``rtol``: the relative L2 error a right replay stays within (None:
    :data:`RTOL` by dtype); ``time_replays``: replays timed (0: none); ``capacity``: the positions the state holds
    (None: unbounded; no step runs at or past it, ``positions_compared`` and ``steps_timed`` say how many did);
    ``ops``: the PyTorch side (None: torch). A capture that raises is ``refused``. Raises StateError: the state
    cannot be snapshotted or put back (naming the object and why), or ``capacity`` leaves no position to compare."""
    if ops is None:
        import torch

        ops = TorchOps(torch)
    with (ops.no_grad() if hasattr(ops, "no_grad") else contextlib.nullcontext()):
        return _check(step, state, advance, start, positions, warmup, rtol, time_replays, capacity, ops)


def _check(step, state, advance, start, positions, warmup, rtol, time_replays, capacity, ops) -> ReplayCheck:
    adv = advance or (lambda p: None)
    p = start
    room = None if capacity is None else capacity - (start + warmup + 1)  # positions left after the capture's
    if room is not None:
        if room < 2:  # the capture's own position is run again eagerly: one, then at least one compared
            raise StateError(f"check_replay: capacity {capacity} leaves {max(room - 1, 0)} position(s) to compare "
                             f"after starting at {start} with {warmup} warm-up step(s) and the capture")
        positions = min(positions, room - 1)

    def warm_step():
        nonlocal p
        adv(p)
        step()
        p += 1

    ops.warm(warm_step, warmup)
    captured_at = p
    adv(p)
    before = _snapshot(state, ops)
    try:
        graph, gout = ops.capture(step)
    except Exception as e:  # noqa: BLE001 - what torch.cuda.graph refused is the result
        text = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        try:
            ops.sync()
        except Exception:  # noqa: BLE001 - a context the refusal left broken: the refusal is what counts
            pass
        return ReplayCheck(REFUSED, f"torch.cuda.graph refused the capture at position {captured_at}: {text}",
                           captured_at=captured_at, error=text)
    try:  # the count is evidence beside the outcome, never a reason to lose it
        nodes = ops.graph_kernels(graph) if hasattr(ops, "graph_kernels") else None
    except Exception:  # noqa: BLE001
        nodes = None
    _restore(before, ops)  # the capture ran the step's Python once; run its position for real
    adv(p)
    step()
    ops.sync()
    p += 1
    outs = _outputs(gout, ops)
    res = ReplayCheck(RIGHT, captured_at=captured_at, graph_kernels=nodes, capacity=capacity)
    for _ in range(positions):
        adv(p)
        before = _snapshot(state, ops)
        ref = [(n, ops.clone(t)) for n, t in _outputs(step(), ops)]
        ops.sync()
        after = _snapshot(state, ops)
        _restore(before, ops)
        adv(p)
        ops.replay(graph)
        for (name, got), (_, want) in zip(outs, ref):
            tol = rtol if rtol is not None else RTOL.get(ops.dtype(want), 1e-3)
            err = ops.rel_err(got, want)
            same = ops.same_argmax(got, want)
            res.errors.append({"position": p, "output": name, "rel_err": err, "same_argmax": same})
            if res.first_position is None and (err > tol or not same):
                res.first_position, res.first_output = p, name
        _restore(after, ops)
        p += 1
    res.positions_compared = positions
    worst = max((e["rel_err"] for e in res.errors), default=0.0)
    held = f" (capacity {capacity})" if capacity is not None else ""
    if res.first_position is None:
        res.detail = (f"captured at {captured_at}; {positions} replays match the eager twin{held} (max relative "
                      f"error {worst:.1e})")
    else:
        e = next(x for x in res.errors if x["position"] == res.first_position and x["output"] == res.first_output)
        res.outcome = WRONG
        res.detail = (f"captured at {captured_at}; from position {res.first_position} the replay's {res.first_output} "
                      f"differs from the eager twin's (relative error {e['rel_err']:.2e}, same argmax: "
                      f"{e['same_argmax']}; {positions} positions compared{held})")
    if time_replays:
        _time(res, graph, adv, p, state, ops, time_replays, capacity)
    return res


def _time(res: ReplayCheck, graph, adv, p0: int, state, ops, rounds: int, capacity) -> None:
    """Time the replays three ways from ``p0``, blocks restarting from its state where ``capacity`` is short."""
    p = p0
    fits = capacity is None or capacity - p0 >= 1 + TIMED_STEPS * rounds + 2 * rounds

    def loop():  # what a decode loop that does not wait on the host per token runs
        nonlocal p
        adv(p)
        ops.launch(graph)
        p += 1

    def waiting():  # ... and one that waits for every token (reads it on the host)
        loop()
        ops.sync()

    if fits:
        loop()
        ops.sync()  # one untimed replay after the comparison's restores
        blocks = ops.time_blocks(loop, TIMED_STEPS, rounds)
        sync_blocks = ops.time_blocks(waiting, 1, rounds * 2)
        device = ops.time_device(graph, rounds)
        res.steps_timed = 1 + TIMED_STEPS * rounds + 2 * rounds
    else:
        steps = max(1, min(TIMED_STEPS, capacity - p0))  # positions p0 … capacity - 1
        at = _snapshot(state, ops)
        blocks, sync_blocks, device = [], [], []

        def again():
            nonlocal p
            _restore(at, ops)
            ops.sync()
            p = p0

        for _ in range(rounds):
            again()
            blocks += ops.time_blocks(loop, steps, 1)
        for _ in range(rounds * 2):
            again()
            sync_blocks += ops.time_blocks(waiting, 1, 1)
        for _ in range(rounds):
            again()  # the graph may advance a device counter of the state: never past the capacity
            device += ops.time_device(graph, 1)
        again()
        res.steps_timed = steps
    res.replay_us = float(statistics.median(blocks))
    res.replay_spread = (float(np.percentile(blocks, 25)), float(np.percentile(blocks, 75)))
    res.replay_sync_us = float(statistics.median(sync_blocks))
    res.replay_device_us = float(statistics.median(device))
    if capacity is not None:
        res.detail += (f"; timed over {res.steps_timed} position(s) from {p0}"
                       + ("" if fits else f", each block from the same state (capacity {capacity})"))


def _snapshot(state, ops) -> list:
    """:func:`snapshot`, its failure one line (:class:`StateError`)."""
    try:
        return snapshot(state, ops)
    except Exception as e:  # noqa: BLE001 - anything the state holds that cannot be copied: said in one line
        raise StateError(f"check_replay: the state cannot be snapshotted ({_what(e)}); hand it the caches and the "
                         "objects holding counters, not objects holding handles, streams or files") from None


def _restore(snap, ops) -> None:
    """:func:`restore`, its failure one line (:class:`StateError`)."""
    try:
        restore(snap, ops)
    except Exception as e:  # noqa: BLE001
        raise StateError(f"check_replay: the state cannot be put back ({_what(e)})") from None


def _what(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


__all__ = ["REFUSED", "RIGHT", "RTOL", "ReplayCheck", "StateError", "TorchOps", "WRONG", "check_replay", "restore",
           "snapshot"]
