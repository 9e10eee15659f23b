"""Stages 3cc, 3p, 3cp and 3ccp on the simulated runtime (CPU only): bit for bit stage 0 across emits of
both compressors and every top-k regime, one graph for every position where the stage promises it, the
graph's structure (conditional nodes, programmatic edges), what a replay runs at each position, and the
modeled cost of a programmatic edge and of a conditional node (GUESS calibration values)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ds4lab.executor.device_graphs import DeviceGraphApi
from ds4lab.executor.kernel_pdl import MissingDeviceHalf
from ds4lab.executor.numpy_backend import NumpyBackend
from ds4lab.capture import stream as S
from ds4lab.capture.cache import CapturePolicy, GraphCache
from ds4lab.sim import SimBackend
from ds4lab.token import reference as R
from ds4lab.token.config import get_preset
from ds4lab.token.longctx_branches import NO_BODY, SORT_REGIMES, regime_plans, regime_value
from ds4lab.token.model import DecodeModel, TokenOptions

LONG = get_preset("tiny", long_context=True, n_layers=4)  # layers 0, 1 raw; 2 ratio 4; 3 ratio 128
#: Emits of ratio 4 (63, 67) and 128 (127, 255, 4095), every top-k regime (tiny: top-k 8; n_comp 16, 17,
#: 32, 33, 64, 65, 128 and past: sort2k .. sort16k, chunked at 600 and 3000).
POSITIONS = [3, 62, 63, 64, 67, 127, 128, 131, 255, 259, 300, 600, 3000, 4095]


def lc_state(m: DecodeModel) -> list[np.ndarray]:
    out = [m.hidden()] + [m.be.to_host(c) for c in m.cache]
    for bufs in m.lc.layers:
        out += [m.be.to_host(b) for b in (bufs or {}).values()]
    return [np.array(a, copy=True) for a in out]


def _run(longctx: str, pdl: bool, positions=POSITIONS, key_decisions: bool = False, be=None):
    """Decode ``positions`` with the whole token captured (GraphCache on "token") and compare every
    token with the eager host-decision token on NumPy; returns (model, cache stats, backend)."""
    be = be or SimBackend(seed=LONG.seed)
    opts = TokenOptions(scalars="device", counts_clear="async", longctx=longctx, pdl=pdl)
    m = DecodeModel(LONG, be, opts)
    ref = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device"))
    m.executor = GraphCache(be, CapturePolicy(("token",), key_decisions=key_decisions))
    s = be.new_stream(non_blocking=True)
    with S.graphs_enabled(), S.stream_override(s):
        for pos in positions:
            m.token(pos, pos % LONG.vocab)
            be.synchronize()
            ref.token(pos, pos % LONG.vocab)
            same = [np.array_equal(a, b) for a, b in zip(lc_state(m), lc_state(ref))]
            assert all(same), (longctx, pdl, pos, same.index(False))
    return m, m.executor.stats, be


# ----------------------------------------------------------------------------- the stage table
def test_device_stages_in_the_table():
    from ds4lab.experiments.stages import STAGES, fixes_table, parse_stages

    assert [STAGES[n].long_context_only for n in ("3cc", "3p", "3cp", "3ccp")] == [True, False, True, True]
    assert STAGES["3cc"].options["longctx"] == "conditional" and STAGES["3ccp"].options["pdl"] is True
    assert STAGES["3p"].policy.key_decisions and not STAGES["3cc"].policy.key_decisions
    t = fixes_table()
    assert t.loc["conditional nodes set on the device", "3cc"] == "required"
    assert t.loc["both halves of programmatic launch", "3p"] == "required"
    assert t.loc["both halves of programmatic launch", "3cc"] == "—"
    with pytest.raises(ValueError, match="--long-context"):
        parse_stages("3,3cc")
    assert [s.name for s in parse_stages("3,3p")] == ["3", "3p"]


# ----------------------------------------------------------------------------- bit for bit, one graph
@pytest.mark.parametrize("longctx,pdl", [("conditional", False), ("conditional", True), ("device", True)],
                         ids=["3cc", "3ccp", "3cp"])
def test_one_graph_for_every_position_bit_exact(longctx, pdl):
    """3cc, 3ccp and 3cp: captured once (after the warm-up token) and replayed at every other position,
    across both compressors' emits and every top-k regime, bit-identical to ds4's eager host-decision
    token; nothing escaped the graph."""
    m, st, be = _run(longctx, pdl)
    assert st.captures == 1 and st.recaptures == 0 and st.retirements == 0 and not st.failures
    assert st.replays == len(POSITIONS) - 1
    assert be.escapes == []


def test_3p_one_graph_per_token_shape_bit_exact():
    """3p keeps stage 3's graph per token shape (key_decisions): exact at every position."""
    m, st, be = _run("host", True, positions=list(range(56, 80)) + POSITIONS[7:], key_decisions=True)
    assert st.captures >= 4 and st.recaptures == 0 and not st.failures  # {emit, no emit} x {sort2k, sort4k}, ...


def test_3p_on_the_short_token_bit_exact():
    """3p on the token without long context: every kernel programmatic after the first, exact."""
    cfg = get_preset("tiny", n_layers=3)
    be = SimBackend(seed=cfg.seed)
    m = DecodeModel(cfg, be, TokenOptions(scalars="device", counts_clear="async", pdl=True))
    ref = DecodeModel(cfg, NumpyBackend(seed=cfg.seed), TokenOptions(scalars="device"))
    m.executor = GraphCache(be, CapturePolicy(("token",)))
    s = be.new_stream(non_blocking=True)
    with S.graphs_enabled(), S.stream_override(s):
        for pos in (100, 101, 102):
            m.token(pos, pos)
            be.synchronize()
            ref.token(pos, pos)
            assert np.array_equal(m.hidden(), ref.hidden()) and all(
                np.array_equal(be.to_host(a), b) for a, b in zip(m.cache, ref.cache)), pos
    assert m.executor.stats.captures == 1 and m.executor.stats.replays == 2


# ----------------------------------------------------------------------------- the graphs
def _token_graph(m: DecodeModel, be):
    """The executable graph of the model's one cached token graph."""
    (e,) = [e for e in m.executor.entries.values() if not e.retired]
    return e.graph_exec.graph


def test_3cc_graph_holds_ifs_and_a_switch_and_replays_only_ds4s_kernels():
    """The token graph of 3cc: per ratio-4 layer a setter kernel, two IF nodes (the two compressors' emit
    kernels) and a SWITCH with one body per reachable regime; per ratio-128 layer a setter and one IF.
    At a replay the device runs exactly the kernels ds4's host decisions launch at that position (plus the
    setters), never a worst-case grid."""
    m, st, be = _run("conditional", False, positions=[60, 61])
    g = _token_graph(m, be)
    kinds = Counter(be.graph_node_kinds(g))
    conds = [n for n in g.nodes if n.kind == "conditional"]
    assert sorted(Counter(n.info.kind for n in conds).items()) == [("if", 3), ("switch", 1)]
    (sw,) = [n for n in conds if n.info.kind == "switch"]
    # tiny (top-k 8, 1 024 rows): the four sort regimes, the chunked path with one merge and with two
    assert [b for b, _ in regime_plans(LONG, 4)] == [*SORT_REGIMES, "chunked/1", "chunked/2"]
    assert len(sw.info.bodies) == 6
    assert kinds["conditional"] == 4
    host = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device"))
    s = be.new_stream(non_blocking=True)
    for pos in (62, 63, 67, 127, 600, 3000):
        host.L.census.reset()
        host.token(pos, 1)
        want = Counter(site for (_, kind, site), n in host.L.census.counts.items() if kind == "kernel"
                       for _ in range(int(n)))
        be.reset_clock()
        m.scalars(pos, 1)  # the device scalars for this position, as before every replay
        with S.stream_override(s):
            be.graph_launch(m.executor.entries[next(iter(m.executor.entries))].graph_exec, s)
        be.synchronize()
        ran = Counter(name for (_, name, _, _, kind, gid) in be.timeline if kind == "kernel" and gid is not None)
        setters = ran.pop("cond_set_longctx")
        assert setters == 2  # one per compressed layer
        assert sum(ran.values()) == sum(want.values()), (pos, ran, want)


def test_switch_bodies_serve_every_n_comp_with_ds4s_launches():
    """Every n_comp up to the capacity maps to a body whose top-k plan has the launches of ds4's plan for
    that n_comp (same kernels, same count; grids at least as large), the values as the kernel sets them."""
    k = LONG.index_top_k
    assert regime_value(k, k) == NO_BODY and regime_value(k + 1, k) == 0 and regime_value(2 * k + 1, k) == 1
    assert regime_value(16 * k, k) == 3 and regime_value(16 * k + 1, k) == 4
    assert regime_value(8 * k * 8, k) == 4 and regime_value(8 * k * 8 + 1, k) == 5  # 8 chunks: one merge; 9: two
    plans = regime_plans(LONG, 4)
    for n in range(0, LONG.comp_capacity(4) + 1):
        v = regime_value(n, k)
        if v == NO_BODY:
            assert R.topk_regime(n, k) == "all"
            continue
        name, n_plan = plans[v]
        host, body = R.topk_plan(n, k)[0], R.topk_plan(n_plan, k)[0]
        assert [s.kernel for s in host] == [s.kernel for s in body], (n, name)
        assert all(b.blocks >= h.blocks and b.sort_n == h.sort_n for h, b in zip(host, body)), (n, name)
    small = LONG.replace(max_context=16 * k * 4)  # capacity 16 k rows: the chunked regime cannot happen
    assert [r for r, _ in regime_plans(small, 4)] == list(SORT_REGIMES)
    assert regime_plans(LONG, 128) == []


def _cond_set_longctx_value(n: int, k: int, group: int = 8) -> int:
    """kernels/graph_cond.cu:cond_topk_regime, transcribed (the test holds the kernel's C to the Python)."""
    if n <= k:
        return NO_BODY
    for i, m in enumerate((2, 4, 8, 16)):
        if n <= m * k:
            return i
    sets, levels = -(-n // (8 * k)), 0
    while sets > group:
        sets, levels = -(-sets // group), levels + 1
    return 4 + levels


def test_the_kernels_regime_numbering_is_the_models():
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "kernels" / "graph_cond.cu").read_text()
    body = re.search(r"cond_topk_regime\(int n_comp, int top_k, int group\) \{(.*?)\n\}", src, re.S).group(1)
    for needle in ("n_comp <= top_k", "2 * top_k", "4 * top_k", "8 * top_k", "16 * top_k", "8 * top_k",
                   "sets > group", "4u + levels"):
        assert needle in body, needle  # the transcription above follows these lines
    for k in (8, 64, 512):
        for n in list(range(0, 40 * k, max(1, k // 3))) + [128 * k, 512 * k + 1]:
            assert _cond_set_longctx_value(n, k) == regime_value(n, k), (n, k)


def test_3p_graph_has_a_programmatic_edge_between_consecutive_kernels():
    """Stage 3p's token graph: every kernel-to-kernel edge programmatic, any other edge default (the
    launch path sets the attribute only after one kernel node)."""
    m, st, be = _run("host", True, positions=[100, 101], key_decisions=True)
    g = _token_graph(m, be)
    edges = Counter((a, b, t) for a, b, t in be.graph_edges(g))
    kk = sum(v for (a, b, t), v in edges.items() if a == b == "kernel")
    assert kk and edges[("kernel", "kernel", "programmatic")] == kk
    assert all(t == "default" for (a, b, t) in edges if not a == b == "kernel")


def test_3ccp_no_programmatic_edge_across_a_conditional_node():
    m, st, be = _run("conditional", True, positions=[60, 61])
    g = _token_graph(m, be)
    edges = be.graph_edges(g)
    assert all(t == "default" for a, b, t in edges if "conditional" in (a, b))
    assert any(t == "programmatic" for a, b, t in edges)
    bodies = [b for n in g.nodes if n.kind == "conditional" for b in n.info.bodies]
    inner = [e for b in bodies for e in be.graph_edges(b)]
    assert inner and all(t == "programmatic" for a, b, t in inner if a == b == "kernel")


# ----------------------------------------------------------------------------- modeled time (timing-only)
def _modeled_us(longctx: str, pdl: bool, pos: int, cal=None) -> float:
    """The modeled device µs of one replayed token at ``pos`` on a timing-only sim (graph captured on an
    earlier position)."""
    be = SimBackend(seed=LONG.seed, timing_only=True, calibration=cal)
    m = DecodeModel(LONG, be, TokenOptions(scalars="device", counts_clear="async", longctx=longctx, pdl=pdl))
    m.executor = GraphCache(be, CapturePolicy(("token",)))
    s = be.new_stream(non_blocking=True)
    with S.graphs_enabled(), S.stream_override(s):
        for p in (pos - 2, pos - 1):
            m.token(p, 1)
        be.synchronize()
        be.reset_clock()
        m.token(pos, 1)
        be.synchronize()
    assert m.executor.stats.replays >= 1
    return max(e for (_, _, _, e, kind, gid) in be.timeline if gid is not None)


def test_timing_only_replay_follows_the_position_and_prices_the_edges():
    """On the timing-only sim (no numbers computed) the scalars stay real, so a 3cc replay takes the
    branches the position asks for: an emit token costs more than the token before it; 3ccp costs less
    than 3cc by the GUESS pdl_edge_us per programmatic edge; 3cc at a position where every row is attended
    costs less than 3c, which runs its worst-case grids there (position 20: 5 rows, top-k 8)."""
    no_emit, emit = _modeled_us("conditional", False, 62), _modeled_us("conditional", False, 63)
    assert emit > no_emit
    assert _modeled_us("conditional", True, 63) < emit
    assert _modeled_us("conditional", False, 20) < _modeled_us("device", False, 20)


def test_guessed_constants_are_in_the_calibration_schema():
    from ds4lab.sim.calibration import validate
    from ds4lab.sim.costmodel import GUESSED, Calibration

    base = Calibration.load(None)
    assert set(GUESSED) == {"pdl_edge_us", "graph_conditional_us"}
    assert base.pdl_edge_us == 0.5 and base.graph_conditional_us == 1.0  # the shipped file does not set them
    assert base.programmatic_us(10.0) == 9.5 and base.programmatic_us(0.6) == 0.3
    import json

    d = json.loads(open(base.path).read())
    validate(dict(d, pdl_edge_us=0.3, graph_conditional_us=2.0))
    with pytest.raises(ValueError, match="pdl_edge_us"):
        validate(dict(d, pdl_edge_us=-1.0))


# ----------------------------------------------------------------------------- refusals
def test_programmatic_launch_refused_without_the_device_half():
    be = SimBackend()
    x = be.zeros((32,), np.float32)
    with pytest.raises(MissingDeviceHalf, match="empty_kernel"):
        be.launch_programmatic(be.new_stream(), "empty_kernel", (1,), (32,), (), 0, lambda: None)
    with pytest.raises(MissingDeviceHalf, match="no kernel named"):
        be.launch_programmatic(be.new_stream(), "no_such_kernel", (1,), (32,), (x,), 0, lambda: None)
    with pytest.raises(ValueError, match="predecessor"):
        be.launch_programmatic(be.new_stream(), "tiny_add", (1,), (32,), (x,), 0, lambda: None, predecessor="all")


def test_pdl_needs_a_backend_that_launches_programmatically():
    assert not isinstance(NumpyBackend(), DeviceGraphApi) and isinstance(SimBackend(), DeviceGraphApi)
    with pytest.raises(ValueError, match="programmatic"):
        DecodeModel(get_preset("tiny", n_layers=1), NumpyBackend(), TokenOptions(pdl=True))


def test_conditional_eager_on_numpy_takes_the_host_branches():
    """No capture, no conditional node: longctx='conditional' on NumPy runs ds4's launches as the host
    decides them, bit for bit the host path."""
    a = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device", longctx="conditional"))
    b = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device"))
    for pos in (62, 63, 127, 600):
        a.L.census.reset()
        b.L.census.reset()
        a.token(pos, 2)
        b.token(pos, 2)
        assert all(np.array_equal(x, y) for x, y in zip(lc_state(a), lc_state(b))), pos
        ka = sum(n for (_, k, _), n in a.L.census.counts.items() if k == "kernel")
        kb = sum(n for (_, k, _), n in b.L.census.counts.items() if k == "kernel")
        assert ka == kb, pos  # the eager SWITCH body may plan a wider score grid, never more launches


@pytest.mark.slow
# ----------------------------------------------------------------------------- the context ladder
def test_context_ladder_device_stages_on_sim(tmp_path):
    """``ds4lab context --stages 0,3,3c,3cc,3p,3cp,3ccp`` on the sim (tiny), at contexts whose exactness
    spans cross the ratio-4 emits and the sort2k → sort4k boundary (64), the ratio-128 emit and sort4k →
    sort8k (128), and the chunked regime (600), in two interleaved rounds: every stage exact, 3cc, 3cp and
    3ccp one graph each."""
    from ds4lab.jobs import execute
    from ds4lab.jobs.context import ContextConfig

    df = execute("context", ContextConfig(stages="0,3,3c,3cc,3p,3cp,3ccp", preset="tiny", contexts="64,128,600",
                                          span=8, tokens=4, warmup=1, rounds=2, out=tmp_path), backend="sim").table()
    assert df.exact.all() and (df.first_mismatch == "").all(), df[["stage", "context", "first_mismatch"]]
    last = df[df.context == 600].set_index("stage")
    for st in ("3cc", "3cp", "3ccp"):
        assert last.loc[st, "graphs"] == 1 and last.loc[st, "recaptures"] == 0, st
    assert last.loc["3p", "graphs"] >= 2 and last.loc["3cc", "kernel_launches"] == 0
    assert (df.gain_us.notna()).all()


def test_context_repeats_checked(tmp_path):
    from ds4lab.errors import BadInput
    from ds4lab.jobs import execute
    from ds4lab.jobs.context import ContextConfig

    with pytest.raises(BadInput, match="--repeats 5"):
        execute("context", ContextConfig(preset="tiny", tokens=4, rounds=5, out=tmp_path), backend="sim")


def test_every_conditional_handle_has_its_node():
    """Every handle a 3cc capture creates is the handle of one of the graph's conditional nodes (RT
    cudaGraphConditionalHandleCreate: a handle without a node may make the instantiation fail)."""
    be = SimBackend(seed=LONG.seed)
    made = []
    create = be.conditional_handle_create

    def recording(*a, **k):
        h = create(*a, **k)
        made.append(h)
        return h

    be.conditional_handle_create = recording
    m, st, be = _run("conditional", False, positions=[60, 61], be=be)
    g = _token_graph(m, be)
    used = [n.info.handle for n in g.nodes if n.kind == "conditional"]
    assert made and sorted(h.id for h in made) == sorted(h.id for h in used)
