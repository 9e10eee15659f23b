"""``ds4lab.audit.check_replay`` without a GPU: the PyTorch side replaced by a stand-in with a graph's
semantics (a capture records each kernel with the arguments it was given, a replay runs them again; the
memory the step allocates during the capture stays the graph's), so what is checked is the procedure:
the warm-up, the capture, the state put back, the eager twin at each position, the first position that
differs, and a refused capture."""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.audit.replay_check import REFUSED, RIGHT, WRONG, check_replay


class FakeOps:
    """A graph that freezes what a CUDA graph freezes: the arguments of each captured kernel."""

    tensor_type = np.ndarray

    def __init__(self):
        self.capturing = False
        self.graph = None
        self.replays = 0
        self.blocks = []

    def kernel(self, fn, *args):
        if self.capturing:
            self.graph.append((fn, args))
        else:
            fn(*args)

    def host_read(self, x):
        if self.capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return float(x[0])

    def warm(self, fn, n):
        for _ in range(n):
            fn()

    def capture(self, fn):
        self.graph, self.capturing = [], True
        try:
            out = fn()
        finally:
            self.capturing = False
        return list(self.graph), out

    def replay(self, g):
        self.replays += 1
        for fn, args in g:
            fn(*args)

    def sync(self):
        pass

    clone = staticmethod(lambda x: x.copy())

    def copy_into(self, dst, src):
        dst[...] = src

    same_shape = staticmethod(lambda a, b: a.shape == b.shape)
    dtype = staticmethod(lambda x: "float32")

    @staticmethod
    def rel_err(got, ref):
        d = np.linalg.norm(ref)
        return float(np.linalg.norm(got - ref) / d) if d else float(np.linalg.norm(got))

    same_argmax = staticmethod(lambda a, b: bool(np.argmax(a) == np.argmax(b)))
    def launch(self, g):
        self.replay(g)

    def time_blocks(self, fn, steps, rounds):
        for _ in range(steps * rounds):
            fn()
        self.blocks.append((steps, rounds))
        return [10.0 + 2.5 * (i % 3) for i in range(rounds)]  # 10, 12.5, 15, ...

    def time_device(self, g, n):
        for _ in range(n):
            self.launch(g)
        return [7.0] * n


def _write(cache, i, v):
    cache[i] = v


def _write_dev(cache, pos):
    cache[int(pos[0])] = pos[0]
    pos[0] += 1


def _total(out, cache):
    out[0] = cache.sum()
    out[1] = cache.max()


class HostCounterDecoder:
    """Keeps its write index on the host: the graph replays the captured one."""

    def __init__(self, ops):
        self.cache, self.pos = np.zeros(32, dtype=np.float32), 3
        self.step = lambda: self._step(ops)  # the ops stay out of the state the check walks

    def _step(self, ops):
        out = np.zeros(2, dtype=np.float32)  # allocated by the step: the graph's own at capture
        ops.kernel(_write, self.cache, self.pos, float(self.pos))
        ops.kernel(_total, out, self.cache)
        self.pos += 1
        return out


class DeviceCounterDecoder(HostCounterDecoder):
    def __init__(self, ops):
        super().__init__(ops)
        self.dpos = np.array([3], dtype=np.int64)

    def _step(self, ops):
        out = np.zeros(2, dtype=np.float32)
        ops.kernel(_write_dev, self.cache, self.dpos)
        ops.kernel(_total, out, self.cache)
        return out


def test_a_host_counter_replays_wrong_from_the_first_replayed_position():
    ops = FakeOps()
    d = HostCounterDecoder(ops)
    r = check_replay(d.step, d, ops=ops, positions=4, warmup=2)
    assert r.outcome == WRONG and r.verdict == "replays wrong"
    assert r.captured_at == 2 and r.first_position == 3 and r.first_output == "output"
    assert "from position 3" in r.detail
    # timed: blocks of replays that never wait (median and quartiles), then waiting for each, then the device alone
    blocks = [10.0 + 2.5 * (i % 3) for i in range(10)]
    assert r.replay_us == 12.5 and r.replay_device_us == 7.0
    assert r.replay_spread == (np.percentile(blocks, 25), np.percentile(blocks, 75))
    assert ops.blocks == [(10, 10), (1, 20)] and r.replay_sync_us == 12.5
    # the eager twin advanced the host counter, the state after it was put back each time
    assert d.pos == 3 + 2 + 1 + 4


def test_a_device_counter_replays_right():
    ops = FakeOps()
    d = DeviceCounterDecoder(ops)
    r = check_replay(d.step, d, ops=ops, positions=5, warmup=2, time_replays=0)
    assert r.outcome == RIGHT and r.first_position is None and r.replay_us is None
    assert len(r.errors) == 5 and all(e["rel_err"] == 0 for e in r.errors)
    assert ops.replays == 5


def test_a_step_that_reads_a_device_value_on_the_host_is_refused():
    ops = FakeOps()
    d = DeviceCounterDecoder(ops)

    def step():
        out = d.step()
        if ops.host_read(d.dpos) > 1e9:  # .item() on the host
            raise AssertionError
        return out

    r = check_replay(step, d, ops=ops)
    assert r.outcome == REFUSED and r.verdict == "refused" and "not permitted when stream is capturing" in r.error


def test_advance_writes_each_position_before_the_twin_and_the_replay():
    ops = FakeOps()
    ids = np.zeros(1, dtype=np.float32)
    seen = []

    def advance(p):
        seen.append(p)
        ids[0] = p

    def step():
        out = np.zeros(2, dtype=np.float32)
        ops.kernel(lambda o, x: o.__setitem__(0, x[0] * 2), out, ids)  # reads the static input buffer
        return out

    r = check_replay(step, [ids], advance=advance, start=10, positions=3, warmup=1, time_replays=0, ops=ops)
    assert r.outcome == RIGHT
    assert seen == [10, 11, 11, 12, 12, 13, 13, 14, 14]


def test_a_step_that_returns_no_tensor_is_named():
    ops = FakeOps()
    with pytest.raises(TypeError, match="returned int"):
        check_replay(lambda: 3, [], ops=ops, warmup=0)


class BoundedDecoder(DeviceCounterDecoder):
    """A static cache of ``capacity`` positions written at a device counter: a write past its end is a
    device-side assert (here: IndexError), as ``index_copy_`` out of bounds is on the GPU."""

    def __init__(self, ops, capacity, start):
        super().__init__(ops)
        self.cache = np.zeros(capacity, dtype=np.float32)
        self.dpos = np.array([start], dtype=np.int64)


def test_a_cache_near_its_capacity_is_never_run_past_it_and_the_positions_are_said():
    """A 128-position static cache with a prompt of 120: the comparison is cut to the positions left, and
    each timed block starts again from the same state, so no step writes past the cache."""
    ops = FakeOps()
    d = BoundedDecoder(ops, 128, 116)
    r = check_replay(d.step, d, ops=ops, start=116, positions=6, warmup=2, capacity=128)
    assert r.outcome == RIGHT and r.positions_compared == 6 and len(r.errors) == 6
    assert r.steps_timed == 3 and r.replay_us is not None and r.replay_device_us == 7.0
    assert "6 replays match" in r.detail and "capacity 128" in r.detail and "timed over 3 position(s)" in r.detail
    assert int(d.dpos[0]) <= 128
    d = BoundedDecoder(ops, 128, 120)
    r = check_replay(d.step, d, ops=FakeOps(), start=120, positions=6, warmup=2, capacity=128)
    assert r.positions_compared == 4 and r.steps_timed == 1 and int(d.dpos[0]) <= 128
    with pytest.raises(IndexError):  # without the capacity the timed loops run past the cache
        check_replay(d.step, BoundedDecoder(ops, 128, 120), ops=FakeOps(), start=120, positions=6, warmup=2)


def test_a_capacity_with_no_room_to_compare_is_refused_in_one_line():
    from ds4lab.audit.replay_check import StateError

    ops = FakeOps()
    with pytest.raises(StateError, match=r"capacity 123 leaves 0 position\(s\) to compare"):
        check_replay(lambda: None, [], ops=ops, start=120, warmup=2, capacity=123)


class Param(np.ndarray):
    """A module's weight: never snapshotted (ops.keep), and copying it would fail."""


class ModuleOps(FakeOps):
    def __init__(self):
        super().__init__()
        self.no_grad_entered = 0

    def keep(self, x):
        return not isinstance(x, Param)

    def clone(self, x):
        if isinstance(x, Param):
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        return x.copy()

    def no_grad(self):
        import contextlib

        self.no_grad_entered += 1
        return contextlib.nullcontext()


def test_a_module_holding_its_own_counter_and_weights_is_checked_without_its_parameters():
    """The state is a module: its weights (parameters) are left out of the snapshot, its host counter is
    put back, and the check runs without autograd."""
    ops = ModuleOps()
    d = HostCounterDecoder(ops)
    d.weight = np.ones(4, dtype=np.float32).view(Param)
    r = check_replay(d.step, d, ops=ops, positions=3, warmup=1, time_replays=0)
    assert r.outcome == WRONG and r.first_position == 2 and ops.no_grad_entered == 1


def test_a_state_that_cannot_be_snapshotted_is_refused_in_one_line():
    from ds4lab.audit.replay_check import StateError

    class NoKeepOps(ModuleOps):
        keep = None

    ops = NoKeepOps()
    d = HostCounterDecoder(ops)
    d.weight = np.ones(4, dtype=np.float32).view(Param)
    with pytest.raises(StateError) as e:
        check_replay(d.step, d, ops=ops, positions=3, warmup=1, time_replays=0)
    text = str(e.value)
    assert "\n" not in text and text.startswith("check_replay: the state cannot be snapshotted")
    assert "HostCounterDecoder.weight (Param)" in text and "requires grad" in text
