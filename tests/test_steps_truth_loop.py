"""The step scripts' ground truth times the loop the user runs (``ds4lab/data/steps/_graph_truth.py``), on the
CPU with a stand-in ``torch`` (no GPU, no torch needed): the decode loop without ``--truth``, the truth's eager
timing and its replay timing run one loop body, so the replay is timed as the script's own loop with the step
replaced by the replay (advance, the NVTX range, the argmax), and (advance + replay) is kept apart; ds4lab's own
scripts (``_ds4lab_steps.py``) hand their loop body to the same harness."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

STEPS = Path(__file__).resolve().parents[1] / "ds4lab" / "data" / "steps"
LOG: list = []


class T(np.ndarray):
    """A tensor: a NumPy array with the few torch methods the harness calls; ``argmax`` is logged."""

    def detach(self):
        return self

    def clone(self):
        return self.copy()

    def double(self):
        return self.astype(np.float64).view(T)

    def float(self):
        return self.astype(np.float32).view(T)

    def abs(self):
        return np.abs(self).view(T)

    def copy_(self, other):
        self[...] = other
        return self

    def argmax(self, *a, **k):
        if not a and not k:
            LOG.append("argmax")
        return np.ndarray.argmax(self, *a, **k)


def t(values) -> T:
    return np.asarray(values, dtype=np.float32).view(T)


class Event:
    clock = 0.0

    def __init__(self, enable_timing=False):
        self.at = 0.0

    def record(self):
        Event.clock += 1.0
        self.at = Event.clock

    def elapsed_time(self, end):
        return end.at - self.at


class Stream:
    def wait_stream(self, other):
        pass


class Graph:
    capturing = None

    def __init__(self, keep_graph=False):
        self.step = None

    def instantiate(self):
        pass

    def replay(self):
        LOG.append("replay")


@contextlib.contextmanager
def graph_ctx(g):
    Graph.capturing = g
    try:
        yield
    finally:
        Graph.capturing = None


def fake_torch():
    tm = types.ModuleType("torch")
    tm.__version__ = "stand-in"
    tm.Tensor = T
    tm.float32, tm.bfloat16, tm.float64 = "float32", "bfloat16", np.float64
    tm.nn = types.SimpleNamespace(Module=type("Module", (), {}))
    tm.no_grad = contextlib.nullcontext
    tm.tensor = lambda v, dtype=None: np.asarray(v, dtype=np.float64)
    tm.quantile = lambda q, x: np.float64(np.quantile(q, x))
    tm.stack = lambda xs: np.asarray([int(x) for x in xs])
    tm.equal = lambda a, b: bool(np.array_equal(a, b))
    tm.linalg = types.SimpleNamespace(vector_norm=lambda x: np.float64(np.linalg.norm(x)))
    tm.cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, synchronize=lambda: None,
        get_device_name=lambda: "stand-in", Event=Event, Stream=Stream, current_stream=Stream,
        stream=lambda s: contextlib.nullcontext(), CUDAGraph=Graph, graph=graph_ctx,
        nvtx=types.SimpleNamespace(range_push=lambda name: LOG.append(f"push {name}"),
                                   range_pop=lambda: LOG.append("pop")))
    return tm


class Step:
    """A decode step of the contract whose output depends on a counter in its state."""

    def __init__(self):
        self.pos = t([0.0])
        self.state = [self.pos]
        self.start, self.capacity = 16, None

    def advance(self, p):
        LOG.append(f"advance {p}")
        self.pos.copy_(t([float(p)]))

    def step(self):
        LOG.append("step")
        return t([[0.0, float(self.pos[0]) % 3, 1.0]])


@pytest.fixture
def truth(monkeypatch):
    """``_graph_truth`` imported against the stand-in torch (and forgotten afterwards)."""
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    monkeypatch.syspath_prepend(str(STEPS))
    for name in ("_graph_truth", "_ds4lab_steps"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    mod = importlib.import_module("_graph_truth")
    monkeypatch.setattr(mod, "_driver_version", lambda: None)
    monkeypatch.setattr(mod, "_graph_nodes", lambda g: None)
    blocks = []

    def timed(run_block, restore, warmup=0, blocks_=0):  # one block each, its calls kept
        restore()
        start = len(LOG)
        run_block()
        blocks.append(LOG[start:])
        return 1.0, [1.0, 1.0]

    monkeypatch.setattr(mod, "_timed_blocks", timed)
    LOG.clear()
    yield mod, blocks
    LOG.clear()
    for name in ("_graph_truth", "_ds4lab_steps"):
        sys.modules.pop(name, None)


def _iterations(calls: list, first: str) -> list:
    """``calls`` cut into iterations, each starting at an ``advance``."""
    out = []
    for c in calls:
        if c.startswith("advance"):
            out.append([])
        out[-1].append(c)
    assert out and out[0][0] == first
    return out


def test_the_replay_is_timed_in_the_scripts_own_loop_body_and_advance_plus_replay_apart(truth):
    mod, blocks = truth
    args = types.SimpleNamespace(prompt=16, seed=0)
    res = mod.measure_truth("fam", __file__, "default", "float32", lambda *a, **k: Step(), args, None,
                            loop=mod.DecodeLoop("fam_step"))
    assert res["outcome"] == "replays wrong"  # the graph keeps the capture position's output
    eager, replay, bare = blocks
    body = ["push fam_step", "step", "pop", "argmax"]
    assert [it[1:] for it in _iterations(eager, "advance 16")] == [body] * mod.BLOCK_STEPS
    assert [it[1:] for it in _iterations(replay, "advance 16")] == [
        ["push fam_step", "replay", "pop", "argmax"]] * mod.BLOCK_STEPS
    assert [it[1:] for it in _iterations(bare, "advance 16")] == [["replay"]] * mod.BLOCK_STEPS
    assert res["loop_body"] is True and res["replay_us"] == res["replay_bare_us"] == 1.0

    # the loop without --truth runs the very same body, the eager step inside the range
    LOG.clear()
    mod.DecodeLoop("fam_step")(Step(), 16, Step().step)
    assert LOG == ["advance 16", *body]


def test_the_scripts_command_line_loop_and_its_truth_share_the_body(truth, monkeypatch, tmp_path, capsys):
    mod, blocks = truth
    monkeypatch.setattr(sys, "argv", ["fam.py", "--steps", "3"])
    assert mod.main("fam", __file__, ["default"], lambda *a, **k: Step(), "fam_step") == 0
    loop_calls = list(LOG)
    assert [it[1:] for it in _iterations(loop_calls, "advance 16")] == [["push fam_step", "step", "pop", "argmax"]] * 3
    LOG.clear()
    seen = {}
    real = mod.measure_truth

    def spy(*a, loop=None, **k):
        seen["loop"] = loop
        return real(*a, loop=loop, **k)

    monkeypatch.setattr(mod, "measure_truth", spy)
    monkeypatch.setattr(sys, "argv", ["fam.py", "--truth", str(tmp_path / "t.json")])
    assert mod.main("fam", __file__, ["default"], lambda *a, **k: Step(), "fam_step") == 0
    assert isinstance(seen["loop"], mod.DecodeLoop) and seen["loop"].nvtx_name == "fam_step"
    assert (tmp_path / "t.json").is_file()


def test_ds4labs_own_scripts_time_their_own_loop_body(truth, monkeypatch, tmp_path):
    mod, blocks = truth
    S = importlib.import_module("_ds4lab_steps")
    assert S.main("ds4lab-x", ("c",), lambda *a, **k: Step(), argv=["--steps", "2"]) == 0
    loop = _iterations([c for c in LOG if c != "argmax"], "advance 16")  # the final print reads one argmax
    assert [it[1:] for it in loop[2:]] == [[f"push {S.TOKEN_RANGE}", "step", "pop"]] * 2  # after two warm steps
    LOG.clear()
    blocks.clear()
    assert S.main("ds4lab-x", ("c",), lambda *a, **k: Step(), argv=["--truth", str(tmp_path / "t.json")]) == 0
    eager, replay, bare = blocks
    assert [it[1:] for it in _iterations(eager, "advance 16")] == [[f"push {S.TOKEN_RANGE}", "step", "pop"]] * 10
    assert [it[1:] for it in _iterations(replay, "advance 16")] == [[f"push {S.TOKEN_RANGE}", "replay", "pop"]] * 10
