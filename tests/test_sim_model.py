"""Whole decode tokens on the ``sim`` backend (CPU only).

* numbers: a ``tiny`` token on ``sim`` is bit-identical to the ``numpy`` backend's;
* time: a timing-only ``ds4-flash`` token runs in well under a second of Python and its modeled
  time is launch-bound (launches × ``host_launch_us``), as measured on the H200;
* capture: a whole ``tiny`` token captured on a non-blocking stream (thread-local mode, device
  scalars, async counts clear) and replayed at a new position equals an eager token there; with
  scalars by value the replay is stale, as on a GPU.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.executor.numpy_backend import NumpyBackend
from ds4lab.token.config import get_preset
from ds4lab.token.model import DecodeModel, TokenOptions
from ds4lab.sim import SimBackend

TINY = get_preset("tiny")
SEQ = [(0, 5), (1, 17), (2, 400), (9, 250), (10, 511)]  # wraps the 8-row window


def same_state(a: DecodeModel, b: DecodeModel) -> bool:
    return (np.array_equal(a.hidden(), b.hidden())
            and (a.logits is None or np.array_equal(a.output_logits(), b.output_logits()))
            and all(np.array_equal(x, y) for x, y in zip(a.cache, b.cache)))


# ----------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("scalars", ["value", "device"])
def test_tiny_tokens_bit_identical_to_numpy(scalars):
    opts = TokenOptions(vocab=True, scalars=scalars)
    sim = DecodeModel(TINY, SimBackend(seed=TINY.seed), opts)
    ref = DecodeModel(TINY, NumpyBackend(seed=TINY.seed), opts)
    for pos, tok in SEQ:
        sim.token(pos, tok)
        ref.token(pos, tok)
        assert same_state(sim, ref), (pos, tok)
    assert np.array_equal(sim.selected_experts()[:1], ref.selected_experts()[:1])
    assert sim.L.census.counts == ref.L.census.counts


def test_tiny_routed_moe_batch_bit_identical_to_numpy():
    """The sorted-pairs path (T > 1, with the counts clear) on both backends."""
    opts = TokenOptions(counts_clear="sync")
    out = []
    for be in (SimBackend(seed=TINY.seed), NumpyBackend(seed=TINY.seed)):
        m = DecodeModel(TINY, be, opts)
        x = be.from_host(np.random.default_rng(3).standard_normal((5, TINY.embed)).astype(np.float32))
        m.router(1, x, 5)
        out.append(np.array(be.to_host(m.routed_moe(1, x, 5))[:5]))
    assert np.array_equal(out[0], out[1])


# ----------------------------------------------------------------------------- modeled time
def test_ds4_flash_timing_only_token_is_fast_and_launch_bound():
    t0 = time.perf_counter()
    be = SimBackend(timing_only=True)
    m = DecodeModel(get_preset("ds4-flash"), be, TokenOptions(vocab=True))
    be.synchronize()
    start = be.host_time_us
    m.token(1000, 5)
    be.synchronize()
    wall = time.perf_counter() - t0
    assert wall < 5.0, f"construction + one token took {wall:.2f} s of Python"
    modeled = be.host_time_us - start
    launches = m.L.census.total()
    assert launches == 1078  # 25 per layer x 43 + embed + final mix + vocab (ds4's four-launch routed MoE)
    host = launches * be.cal.host_launch_us
    assert modeled > 0
    assert abs(modeled - host) / modeled < 0.05  # launch-bound: the host's launches are the token
    busy = sum(t[3] - t[2] for t in be.timeline[-launches:])
    assert busy < modeled  # the device idles between launches
    assert np.isnan(m.hidden()).all()  # no numbers in timing-only mode
    # Second token: the same figure (no warm-up effects in a model).
    start = be.host_time_us
    m.token(1001, 6)
    be.synchronize()
    assert be.host_time_us - start == pytest.approx(modeled, rel=1e-6)


def test_ds4_flash_captured_token_is_device_bound(graphs_on):
    """The same token replayed as one graph: no host launch gaps, the device-busy time remains."""
    be = SimBackend(timing_only=True)
    m = DecodeModel(get_preset("ds4-flash"), be, TokenOptions(vocab=True, scalars="device"))
    s = be.new_stream(non_blocking=True)
    with S.stream_override(s):
        m.scalars(1000, 5)
        be.begin_capture(s, "thread_local")
        m.token(1000, 5)
        ge = be.graph_instantiate(be.end_capture(s))
    be.synchronize()
    start, busy0 = be.host_time_us, be.device_busy_us
    be.graph_launch(ge, s)
    be.synchronize()
    replay, busy = be.host_time_us - start, be.device_busy_us - busy0
    assert busy == pytest.approx(replay - be.cal.host_graph_launch_us, rel=0.01)
    assert replay < 0.9 * 1078 * be.cal.host_launch_us


# ----------------------------------------------------------------------------- capture and replay
def capture_token(m: DecodeModel, s, pos: int, tok: int, mode: str = "thread_local", copy_scalars: bool = False):
    """Capture one whole token on ``s`` (accessor override set), return the captured graph.

    With device scalars, the scalars are written eagerly before the capture and the token's own
    host-to-device copy is left out of the graph (``write_scalars=False``), so each replay reads
    whatever was written into the scalar buffer before it. ``copy_scalars=True`` leaves the copy in.
    """
    be = m.be
    with S.stream_override(s):
        if m.scal is not None and not copy_scalars:
            m.scalars(pos, tok)
        be.begin_capture(s, mode)
        m.token(pos, tok, write_scalars=copy_scalars or m.scal is None)
        return be.end_capture(s)


def test_captured_tiny_token_replays_at_new_positions(graphs_on):
    opts = TokenOptions(vocab=True, scalars="device", counts_clear="async")
    be = SimBackend(seed=TINY.seed)
    m = DecodeModel(TINY, be, opts)
    ref = DecodeModel(TINY, NumpyBackend(seed=TINY.seed), opts)
    for pos, tok in SEQ[:2]:
        m.token(pos, tok)
        ref.token(pos, tok)
    s = be.new_stream(non_blocking=True)
    before = m.hidden()
    g = capture_token(m, s, 2, 400)
    assert np.array_equal(m.hidden(), before)  # nothing ran during the capture
    kinds = [n["kind"] for n in be.graph_nodes(g)]
    assert kinds == ["kernel"] * (m.L.census.total("kernel") // m.L.census.tokens)  # every kernel, nothing else
    ge = be.graph_instantiate(g)
    for pos, tok in [(2, 400), (3, 7), (9, 250)]:  # the capture position, then new ones (window wraps)
        with S.stream_override(s):
            m.scalars(pos, tok)  # written into the device buffer before the replay
            be.graph_launch(ge, s)
        be.synchronize()
        ref.token(pos, tok)
        assert same_state(m, ref), (pos, tok)
    assert be.escapes == []


def test_captured_token_with_scalars_by_value_replays_stale(graphs_on):
    opts = TokenOptions(scalars="value")
    be = SimBackend(seed=TINY.seed)
    m = DecodeModel(TINY, be, opts)
    at_capture = DecodeModel(TINY, NumpyBackend(seed=TINY.seed), opts)
    wanted = DecodeModel(TINY, NumpyBackend(seed=TINY.seed), opts)
    s = be.new_stream(non_blocking=True)
    ge = be.graph_instantiate(capture_token(m, s, 4, 100))
    be.graph_launch(ge, s)  # "meant" as position 5, token 200: the graph only knows position 4, token 100
    at_capture.token(4, 100)
    wanted.token(5, 200)
    assert same_state(m, at_capture)
    assert not np.array_equal(m.hidden(), wanted.hidden())


def test_captured_host_scalar_copy_replays_capture_time_values(graphs_on):
    """Left in the graph, the scalars' host-to-device copy restores the capture-time scalars."""
    opts = TokenOptions(scalars="device")
    be = SimBackend(seed=TINY.seed)
    m = DecodeModel(TINY, be, opts)
    at_capture = DecodeModel(TINY, NumpyBackend(seed=TINY.seed), opts)
    s = be.new_stream(non_blocking=True)
    g = capture_token(m, s, 4, 100, copy_scalars=True)
    assert be.graph_nodes(g)[0] == {"kind": "memcpy", "name": "memcpy HtoD"}
    with S.stream_override(s):
        m.scalars(5, 200)
        be.graph_launch(be.graph_instantiate(g), s)
    at_capture.token(4, 100)
    assert same_state(m, at_capture)


@pytest.mark.parametrize("clear", ["sync", "async"])
def test_moe_counts_clear_in_capture(graphs_on, clear):
    """T > 1: the synchronous counts clear escapes the graph; the async one is a memset node."""
    be = SimBackend(seed=TINY.seed)
    m = DecodeModel(TINY, be, TokenOptions(counts_clear=clear))
    x = be.from_host(np.random.default_rng(5).standard_normal((3, TINY.embed)).astype(np.float32))
    s = be.new_stream(non_blocking=True)
    with S.stream_override(s):
        be.begin_capture(s, "thread_local")
        m.router(1, x, 3)
        m.routed_moe(1, x, 3)
        g = be.end_capture(s)
    kinds = [n["kind"] for n in be.graph_nodes(g)]
    if clear == "sync":
        assert "memset" not in kinds and ("cudaMemset", "memset") in be.escapes
    else:
        assert kinds.count("memset") == 1 and be.escapes == []
    # Replay twice: only a graph with the clear gets the same routed-MoE output both times.
    outs = []
    for _ in range(2):
        be.graph_launch(be.graph_instantiate(g), s)
        be.synchronize()
        outs.append(np.array(be.to_host(m.moe_buf.y)[:3]))
    assert np.array_equal(outs[0], outs[1]) == (clear == "async")


def test_blocking_capture_stream_with_sync_clear_is_refused(graphs_on):
    be = SimBackend(seed=TINY.seed)
    m = DecodeModel(TINY, be, TokenOptions(counts_clear="sync"))
    x = be.from_host(np.ones((2, TINY.embed), np.float32))
    s = be.new_stream(non_blocking=False)
    with S.stream_override(s):
        be.begin_capture(s, "thread_local")
        m.router(1, x, 2)
        with pytest.raises(Exception) as ei:
            m.routed_moe(1, x, 2)
        assert getattr(ei.value, "name", "") == "cudaErrorStreamCaptureImplicit"
        with pytest.raises(Exception) as ei:
            be.end_capture(s)
        assert ei.value.name == "cudaErrorStreamCaptureInvalidated"
