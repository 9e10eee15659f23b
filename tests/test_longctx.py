"""Long-context decode on the CPU: configuration, NumPy references, host decisions, the token.

The references are checked on hand-computable cases; the token's numpy and sim runs are checked
against each other and against the references composed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.token import weights as W
from ds4lab.token.config import ConfigError, get_preset


# ----------------------------------------------------------------------------- configuration
def test_layer_rule_follows_ds4():
    cfg = get_preset("ds4-flash", long_context=True)
    ratios = [cfg.compress_ratio(layer) for layer in range(cfg.n_layers)]
    assert ratios[:6] == [0, 0, 4, 128, 4, 128]
    assert ratios[-1] == 4  # layer 42
    assert ratios.count(4) == 21 and ratios.count(128) == 20


def test_long_context_off_means_no_compression():
    cfg = get_preset("ds4-flash")
    assert not cfg.long_context
    assert all(cfg.compress_ratio(layer) == 0 for layer in range(cfg.n_layers))
    assert W.compress_specs(cfg, 2) == {}


@pytest.mark.parametrize("name", ["small", "tiny"])
def test_small_presets_same_structure(name):
    cfg = get_preset(name, long_context=True, n_layers=4)
    assert [cfg.compress_ratio(layer) for layer in range(4)] == [0, 0, 4, 128]
    flash = get_preset("ds4-flash")
    assert cfg.index_top_k < flash.index_top_k and cfg.index_head_dim <= flash.index_head_dim


def test_ds4_flash_long_context_dimensions():
    cfg = get_preset("ds4-flash", long_context=True)
    assert (cfg.index_heads, cfg.index_head_dim, cfg.index_top_k) == (64, 128, 512)
    assert cfg.compress_rope_theta == 160000.0
    assert cfg.max_context > 131072
    s = W.compress_specs(cfg, 2)
    assert (s["comp_kvgate"].rows, s["comp_kvgate"].cols) == (2 * 1024, 4096)  # kv + gate, 2 lanes of 512
    assert (s["index_comp_kvgate"].rows, s["index_q_b"].rows, s["index_q_b"].cols) == (2 * 256, 64 * 128, 1024)
    assert s["comp_ape"].cols == 4 * 1024
    s = W.compress_specs(cfg, 3)
    assert set(s) == {"comp_kvgate", "comp_ape", "comp_norm"}
    assert s["comp_kvgate"].rows == 2 * 512 and s["comp_ape"].cols == 128 * 512


def test_cache_layout_and_bytes():
    cfg = get_preset("ds4-flash", long_context=True, max_context=131072)
    lay = W.cache_layout(cfg, 2)
    assert lay["comp"] == (32768, 512) and lay["index"] == (32768, 128)
    assert lay["comp_state_kv"] == (8, 1024) and lay["index_state_kv"] == (8, 256)
    assert W.cache_layout(cfg, 3)["comp"] == (1024, 512)
    assert W.cache_layout(cfg, 3)["comp_state_kv"] == (128, 512)
    assert set(W.cache_layout(cfg, 0)) == {"kv"}
    total = W.cache_bytes(cfg)
    assert total == sum(4 * r * c for layer in range(43) for r, c in W.cache_layout(cfg, layer).values())
    assert 1.5e9 < total < 2.5e9  # 21 x (64 + 16) MiB + 20 x 2 MiB + windows
    off = W.cache_bytes(get_preset("ds4-flash"))
    assert off == 43 * 128 * 512 * 4


@pytest.mark.parametrize("override,needle", [
    ({"max_context": 1000}, "max_context=1000"),
    ({"max_context": 0}, "max_context=0"),
    ({"start_pos": 4096}, "start_pos=4096"),
    ({"start_pos": -1}, "start_pos=-1"),
    ({"index_top_k": 12}, "index_top_k=12"),
    ({"index_top_k": 1024}, "index_top_k=1024"),
    ({"index_head_dim": 48}, "index_head_dim=48"),
    ({"rope_dims": 48}, "rope_dims=48"),
    ({"index_heads": 3}, "index_heads=3"),
    ({"compress_rope_theta": 0.0}, "compress_rope_theta"),
    ({"long_context": 1}, "long_context=1"),
])
def test_long_context_config_errors_name_the_value(override, needle):
    with pytest.raises(ConfigError) as e:
        get_preset("tiny", **override)
    assert needle in str(e.value) and str(e.value).startswith("tiny:")


def test_compress_ratio_layer_out_of_range():
    with pytest.raises(ConfigError, match="layer=3"):
        get_preset("tiny", long_context=True).compress_ratio(3)


# ----------------------------------------------------------------------------- references
from ds4lab.token import reference as LR  # noqa: E402
from ds4lab.token import reference as R  # noqa: E402


def test_emit_boundaries_and_rows():
    assert [LR.is_emit(p, 4) for p in range(8)] == [False, False, False, True] * 2
    assert LR.is_emit(127, 128) and not LR.is_emit(128, 128) and LR.is_emit(255, 128)
    assert [LR.comp_count(p, 4) for p in (0, 2, 3, 4, 7)] == [0, 0, 1, 1, 2]
    assert LR.comp_count(65535, 128) == 512 and LR.comp_row(65535, 128) == 511
    assert [LR.state_slot(p, 4) for p in (0, 3, 5)] == [4, 7, 5]
    assert LR.state_slot(130, 128) == 2


def test_store_adds_ape_of_the_slot():
    kv = np.zeros((8, 4), np.float32)
    sc = np.full((8, 4), -5.0, np.float32)
    ape = np.arange(16, dtype=np.float32).reshape(4, 4)
    nkv, nsc = LR.compressor_store(kv, sc, np.ones(4), np.full(4, 10.0), ape, pos=6, ratio=4)
    assert np.array_equal(nkv[6], np.ones(4)) and np.array_equal(nsc[6], 10.0 + ape[2])
    assert np.array_equal(np.delete(nsc, 6, axis=0), np.delete(sc, 6, axis=0))
    assert np.all(sc == -5.0)  # inputs untouched


def test_pool_ratio128_equal_scores_is_the_mean():
    rng = np.random.default_rng(1)
    kv = rng.standard_normal((128, 8)).astype(np.float32)
    out = LR.compressor_pool(kv, np.zeros((128, 8), np.float32), 8, 128)
    np.testing.assert_allclose(out, kv.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-7)


def test_pool_ratio4_reads_previous_lane0_and_current_lane1():
    D = 2
    kv = np.arange(8 * 2 * D, dtype=np.float32).reshape(8, 2 * D)
    sc = np.full((8, 2 * D), -50.0, np.float32)
    sc[1, 0] = 0.0   # previous block, lane 0, dim 0: wins dim 0
    sc[6, D + 1] = 0.0  # current block, lane 1, dim 1: wins dim 1
    sc[6, 0] = 100.0  # current block lane 0 is never read
    out = LR.compressor_pool(kv, sc, D, 4)
    np.testing.assert_allclose(out, [kv[1, 0], kv[6, D + 1]], rtol=1e-12)
    # two equal winners: their mean
    sc[5, D + 1] = 0.0
    np.testing.assert_allclose(LR.compressor_pool(kv, sc, D, 4)[1], (kv[6, D + 1] + kv[5, D + 1]) / 2, rtol=1e-6)


def test_pool_empty_state_is_zero():
    out = LR.compressor_pool(np.ones((128, 4)), np.full((128, 4), LR.NEG_INF), 4, 128)
    assert np.array_equal(out, np.zeros(4, np.float32))


def test_emit_row_at_first_block_is_the_normed_pool():
    pooled = np.array([3.0, -4.0, 0.0, 0.0], np.float32)  # rms = 2.5
    w = np.array([1.0, 2.0, 1.0, 1.0], np.float32)
    row = LR.compressor_emit_row(pooled, w, pos=3, ratio=4, rope_dims=2, theta=160000.0, eps=0.0)
    np.testing.assert_allclose(row, [1.2, -3.2, 0.0, 0.0], rtol=1e-6)  # RoPE at position 0: identity
    with pytest.raises(ValueError, match="position 4"):
        LR.compressor_emit_row(pooled, w, pos=4, ratio=4, rope_dims=2, theta=1e4, eps=0.0)


def test_emit_row_rotates_at_block_start():
    pooled = np.array([1.0, 1.0, 1.0, 0.0], np.float32)
    w = np.ones(4, np.float32)
    row = LR.compressor_emit_row(pooled, w, pos=7, ratio=4, rope_dims=2, theta=160000.0, eps=0.0)
    n = R.rms_norm(pooled[None], w, 0.0)[0]
    c, s = np.cos(4.0), np.sin(4.0)  # position 7 + 1 - 4 = 4, frequency 1 for the first pair
    np.testing.assert_allclose(row, [n[0], n[1], n[2] * c, n[2] * s], rtol=1e-5, atol=1e-6)


def test_shift_and_decode_sequence():
    rng = np.random.default_rng(2)
    D, ratio = 4, 4
    kv = rng.standard_normal((8, 2 * D)).astype(np.float32)
    sc = rng.standard_normal((8, 2 * D)).astype(np.float32)
    ape = rng.standard_normal((4, 2 * D)).astype(np.float32)
    w = np.ones(D, np.float32)
    rows = []
    for pos in range(8, 16):
        kv, sc, row = LR.compressor_decode(kv, sc, rng.standard_normal(2 * D), rng.standard_normal(2 * D), ape, w,
                                           pos, ratio, D, 2, 160000.0, 1e-6)
        rows.append(row)
        if LR.is_emit(pos, ratio):
            assert np.array_equal(kv[:4], kv[4:8]) and np.array_equal(sc[:4], sc[4:8])
    assert [r is not None for r in rows] == [False, False, False, True] * 2


def test_indexer_scores_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    w = np.array([2.0, 3.0])
    keys = np.array([[1.0, -1.0], [2.0, 2.0]])
    np.testing.assert_allclose(LR.indexer_scores(q, w, keys, 0.5), [1.0, 5.0])


def test_topk_select_order_and_ties():
    s = np.array([0.5, 2.0, 2.0, -1.0, 3.0], np.float32)
    assert LR.topk_select(s, 3).tolist() == [4, 1, 2]
    with pytest.raises(ValueError, match="top-k 6"):
        LR.topk_select(s, 6)


@pytest.mark.parametrize("n,regime", [(0, "all"), (8, "all"), (9, "sort2k"), (16, "sort2k"), (17, "sort4k"),
                                      (32, "sort4k"), (33, "sort8k"), (64, "sort8k"), (65, "sort16k"),
                                      (128, "sort16k"), (129, "chunked")])
def test_topk_regime_boundaries(n, regime):
    assert LR.topk_regime(n, 8) == regime


def test_topk_regime_ds4_thresholds():
    assert [LR.topk_regime(n, 512) for n in (512, 1024, 1025, 2048, 4096, 8192, 8193)] == [
        "all", "sort2k", "sort4k", "sort4k", "sort8k", "sort16k", "chunked"]


def test_topk_plan_chunked_tree():
    steps, words = LR.topk_plan(129, 8)
    assert [(s.kernel, s.blocks) for s in steps] == [("indexer_topk_chunk", 3), ("indexer_topk_merge", 1)]
    assert words == 24
    steps, words = LR.topk_plan(64 * 9 + 1, 8)  # 10 chunks: one tree level of 2 blocks, then the final merge
    assert [(s.kernel, s.blocks, s.sets) for s in steps] == [
        ("indexer_topk_chunk", 10, 0), ("indexer_topk_merge", 2, 10), ("indexer_topk_merge", 1, 2)]
    assert words == 80 + 16 and steps[1].dst_off == 80 and steps[2].src_off == 80
    assert LR.topk_plan(8, 8) == ([], 0)
    assert LR.topk_plan(100, 8)[0][0].sort_n == 64  # sort16k streams with an 8 x k sort


@pytest.mark.parametrize("n", [129, 577, 1000, 64 * 64 + 3])
def test_chunk_and_merge_equal_the_plain_topk(n):
    rng = np.random.default_rng(n)
    k = 8
    s = rng.standard_normal(n).astype(np.float32)
    steps, words = LR.topk_plan(n, k)
    scratch = np.full(words, -7, np.int32)
    sel = None
    for st in steps:
        if st.kernel == "indexer_topk_chunk":
            scratch[: st.blocks * k] = LR.topk_candidates(s, n, k, st.sort_n).reshape(-1)
        else:
            src = scratch[st.src_off: st.src_off + st.sets * k].reshape(st.sets, k)
            outs = [LR.topk_merge(s, src[b * 8:(b + 1) * 8], k) for b in range(st.blocks)]
            if st.dst_off < 0:
                sel = outs[0]
            else:
                scratch[st.dst_off: st.dst_off + st.blocks * k] = np.concatenate(outs)
    assert sel.tolist() == LR.topk_select(s, k).tolist()


def test_attention_comp_without_rows_is_window_attention():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    cache = rng.standard_normal((8, 64)).astype(np.float32)
    comp = rng.standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(LR.attention_comp(q, cache, 20, 8, comp, []), R.attention_decode(q, cache, 20, 8),
                               rtol=1e-6)
    # a compressed row equal to a window row counts twice: same as a window with that row doubled
    comp[2] = cache[20 % 8]
    full = LR.attention_comp(q, cache, 20, 8, comp, [2])
    kv = np.concatenate([cache[[(p % 8) for p in range(13, 21)]], cache[[20 % 8]]]).astype(np.float64)
    s = q.astype(np.float64) @ kv.T / 8.0
    p = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(full, (p / p.sum(1, keepdims=True)) @ kv, rtol=1e-5)


def test_attended_rows():
    assert LR.attended_rows(30, 4, 8).tolist() == list(range(7))
    assert LR.attended_rows(1023, 128, 8).tolist() == list(range(8))
    with pytest.raises(ValueError, match="position 40"):
        LR.attended_rows(40, 4, 8)
    assert LR.attended_rows(40, 4, 8, selected=np.arange(20, 0, -1)).tolist() == list(range(20, 12, -1))


# ----------------------------------------------------------------------------- the token (numpy, sim)
from ds4lab.capture import stream as S  # noqa: E402
from ds4lab.executor.numpy_backend import NumpyBackend  # noqa: E402
from ds4lab.capture.cache import CapturePolicy, GraphCache  # noqa: E402
from ds4lab.token.model import DecodeModel, TokenOptions  # noqa: E402
from ds4lab.sim import SimBackend  # noqa: E402

LONG = get_preset("tiny", long_context=True, n_layers=4)  # layers 0, 1 raw; 2 ratio 4; 3 ratio 128
#: Positions crossing ratio-4 emits, every top-k regime, ratio-128 emits (127, 255, 4095).
LONG_SEQ = [(3, 7), (64, 8), (66, 9), (67, 10), (127, 11), (255, 12), (300, 13), (600, 14), (3000, 15),
            (4095, 16)]


def lc_state(m: DecodeModel) -> list[np.ndarray]:
    out = [m.hidden()] + [m.be.to_host(c) for c in m.cache]
    for bufs in m.lc.layers:
        out += [m.be.to_host(b) for b in (bufs or {}).values()]
    return [np.array(a, copy=True) for a in out]


def test_off_by_default_no_long_context_buffers():
    m = DecodeModel(get_preset("tiny"), NumpyBackend())
    assert m.lc is None and m.compressed_ratios() == []
    assert m.longctx_decisions(100) == ()


def test_long_context_token_sim_equals_numpy():
    sim = DecodeModel(LONG, SimBackend(seed=LONG.seed), TokenOptions(vocab=True))
    ref = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(vocab=True))
    for pos, tok in LONG_SEQ:
        sim.token(pos, tok)
        ref.token(pos, tok)
        assert all(np.array_equal(a, b) for a, b in zip(lc_state(sim), lc_state(ref))), pos
        assert np.isfinite(ref.hidden()).all()
    assert sim.L.census.counts == ref.L.census.counts


def census_of(m: DecodeModel, pos: int, tok: int = 3):
    m.L.census.reset()
    m.token(pos, tok)
    return m.L.census


@pytest.mark.parametrize("pos,extra", [
    (64, 4 + 2 + 4 + 1),            # no emit; compressors 2 + 2 (ratio 4), 2 (ratio 128); indexer 4 + 1 top-k
    (3, 4 + 8 + 2),                 # both ratio-4 compressors emit (+4 each); every row attended: no indexer
    (67, 4 + 8 + 2 + 4 + 1),        # emit, sort4k
    (127, 4 + 8 + 2 + 3 + 4 + 1),   # both ratios emit (ratio 128: pool, norm, rotate-store; no shift)
    (600, 4 + 2 + 4 + 2),           # chunked: chunk + final merge
    (3000, 4 + 2 + 4 + 3),          # chunked with one tree level
])
def test_census_by_position(pos, extra):
    m = DecodeModel(LONG, NumpyBackend(seed=LONG.seed))
    base = DecodeModel(LONG.replace(long_context=False), NumpyBackend(seed=LONG.seed))
    assert census_of(m, pos).total() == census_of(base, pos).total() + extra


def test_emit_launch_sites_only_on_emit_tokens():
    m = DecodeModel(LONG, NumpyBackend(seed=LONG.seed))
    sites = lambda c: {s for (_, k, s) in c.counts}  # noqa: E731
    assert "comp_pool" not in sites(census_of(m, 64)) and "comp_shift" in sites(census_of(m, 67))
    assert "index_topk_chunk" in sites(census_of(m, 600)) and "index_score" not in sites(census_of(m, 3))


def test_model_wiring_matches_composed_references():
    """Layer 2 alone (ratio 4) at an emit token past top-k rows: the state, the emitted rows, the
    indexer's scores and selection equal the references composed by hand from the model's buffers."""
    cfg = LONG
    m = DecodeModel(cfg, NumpyBackend(seed=cfg.seed), n_layers=3)
    lc, w = m.lc, m.layers[2]
    pos = 4 * 40 + 3
    before = {k: v.copy() for k, v in lc.layers[2].items()}
    m.token(pos, 9)
    D, Di = cfg.head_dim, cfg.index_head_dim
    for lane, dim, kvsc, rows in (("comp", D, lc.kvsc, "comp"), ("index", Di, lc.ikvsc, "index")):
        pre = "comp" if lane == "comp" else "index_comp"
        kv, sc, row = LR.compressor_decode(before[f"{lane}_state_kv"], before[f"{lane}_state_score"],
                                           kvsc[: 2 * dim], kvsc[2 * dim: 4 * dim], w[f"{pre}_ape"], w[f"{pre}_norm"],
                                           pos, 4, dim, cfg.rope_dims, cfg.compress_rope_theta, cfg.rms_eps)
        assert np.array_equal(lc.layers[2][f"{lane}_state_kv"], kv)
        np.testing.assert_allclose(lc.layers[2][f"{lane}_state_score"], sc, rtol=1e-6)
        np.testing.assert_allclose(lc.layers[2][rows][pos // 4], row, rtol=1e-5, atol=1e-6)
        other = np.delete(np.arange(before[rows].shape[0]), pos // 4)
        assert np.array_equal(lc.layers[2][rows][other], before[rows][other])
    n = LR.comp_count(pos, 4)
    q = lc.iq.reshape(cfg.index_heads, Di)
    scores = LR.indexer_scores(q, lc.iw, lc.layers[2]["index"][:n], 1 / np.sqrt(Di * cfg.index_heads))
    np.testing.assert_allclose(lc.scores[:n], scores, rtol=1e-6)
    assert lc.sel.tolist() == LR.topk_select(lc.scores[:n], cfg.index_top_k).tolist()


def test_reset_state_refills_long_context_caches():
    m = DecodeModel(LONG, NumpyBackend(seed=LONG.seed))
    fresh = lc_state(m)[1:]
    m.token(67, 3)
    assert not all(np.array_equal(a, b) for a, b in zip(lc_state(m)[1:], fresh))
    m.reset_state()
    assert all(np.array_equal(a, b) for a, b in zip(lc_state(m)[1:], fresh))


def test_position_past_max_context_is_refused():
    m = DecodeModel(LONG, NumpyBackend(seed=LONG.seed))
    with pytest.raises(ValueError, match="max_context=4096"):
        m.token(4096, 1)


def test_memory_bytes_counts_the_compressed_caches():
    m = DecodeModel(LONG, NumpyBackend(seed=LONG.seed))
    assert m.memory_bytes()["caches"] == W.cache_bytes(LONG)
    assert W.cache_bytes(LONG) > W.cache_bytes(LONG.replace(long_context=False))


def test_ds4_flash_long_context_timing_only_token_at_131071():
    """ds4-flash with long context on the timing-only sim: a token at 131 071 (both ratios emit,
    chunked top-k) and one at 65 536 issue their launches; the caches are sized, not computed."""
    cfg = get_preset("ds4-flash", long_context=True)
    be = SimBackend(timing_only=True)
    m = DecodeModel(cfg, be, TokenOptions(scalars="device"))
    counts = {p: census_of(m, p).total() for p in (65536, 131071)}
    assert counts[131071] > counts[65536] > 1121
    assert ("indexer", "kernel", "index_topk_chunk") in m.L.census.counts


@pytest.mark.parametrize("guard", [True, False])
def test_whole_token_graph_guard_across_emits_and_regimes(graphs_on, guard):
    """Stage 3 (one graph per token shape, device scalars) from 60 to 70: emits at 63 and 67, the
    top-k regime changes at 65. The guard re-asks the long-context decisions before each replay
    and recaptures on a change: every token exact. Without it the graph captured on a non-emit
    token is replayed across an emit: wrong."""
    opts = TokenOptions(scalars="device", counts_clear="async")
    be = SimBackend(seed=LONG.seed)
    m = DecodeModel(LONG, be, opts)
    ref = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), opts)
    m.executor = GraphCache(be, CapturePolicy({"token"}, guard=guard))
    s = be.new_stream(non_blocking=True)
    exact = []
    with S.stream_override(s):
        for pos in range(60, 71):
            m.token(pos, pos)
            be.synchronize()
            ref.token(pos, pos)
            exact.append(all(np.array_equal(a, b) for a, b in zip(lc_state(m), lc_state(ref))))
    st = m.executor.stats
    if guard:
        assert all(exact) and st.recaptures >= 3 and st.replays >= 1
    else:
        assert not all(exact) and st.recaptures == 0


# ----------------------------------------------------------------------------- stage 3c: device-side decisions
def test_device_decisions_same_numbers_one_launch_list():
    host = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device"))
    dev = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device", longctx="device"))
    totals, decisions = set(), set()
    for pos, tok in LONG_SEQ:
        host.token(pos, tok)
        dev.L.census.reset()
        dev.token(pos, tok)
        totals.add(dev.L.census.total())
        decisions.add(dev.host_decisions("token", -1, 1, dev._scalars_no_write(pos, tok)))
        assert all(np.array_equal(a, b) for a, b in zip(lc_state(dev), lc_state(host))), pos
    assert len(totals) == 1 and len(decisions) == 1
    # ds4's emit kernels of both compressors and the worst-case chunked top-k on every token
    sites = {s for (_, k, s) in dev.L.census.counts}
    assert {"comp_pool", "comp_rope_store", "comp_shift", "index_comp_pool", "index_comp_shift",
            "index_topk_chunk", "index_topk_merge"} <= sites


def test_stage3c_one_graph_for_every_position(graphs_on):
    """Stage 3c on the sim: the whole token captured once and replayed across emits of both ratios,
    top-k regime changes and the chunked path, exact against eager host-decision tokens."""
    be = SimBackend(seed=LONG.seed)
    m = DecodeModel(LONG, be, TokenOptions(scalars="device", counts_clear="async", longctx="device"))
    ref = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scalars="device"))
    m.executor = GraphCache(be, CapturePolicy({"token"}))
    s = be.new_stream(non_blocking=True)
    positions = list(range(60, 70)) + [127, 128, 255, 600, 3000, 4095]
    with S.stream_override(s):
        for pos in positions:
            m.token(pos, pos % LONG.vocab)
            be.synchronize()
            ref.token(pos, pos % LONG.vocab)
            assert all(np.array_equal(a, b) for a, b in zip(lc_state(m), lc_state(ref))), pos
    st = m.executor.stats
    assert st.captures == 1 and st.recaptures == 0 and st.replays == len(positions) - 1  # all but the warm-up
    assert be.escapes == []


def test_topk_scratch_grows_on_demand_with_n_comp():
    """Host decisions with on-demand scratch: the chunked top-k's scratch is a fresh allocation
    whenever more chunks are needed (ds4's grow-on-demand allocator), bumping the buffer generation."""
    m = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scratch="on-demand"))
    assert m.lc.topk.allocations == 0
    m.token(600, 1)  # 150 rows: 3 chunks
    gen, allocs = m.generation, m.lc.topk.allocations
    assert allocs == 1
    m.token(601, 1)
    assert m.lc.topk.allocations == allocs
    m.token(3000, 1)  # 750 rows: 12 chunks and a tree level
    assert m.lc.topk.allocations == allocs + 1 and m.generation > gen
    pre = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), TokenOptions(scratch="prealloc"))
    pre.token(3000, 1)
    assert pre.lc.topk.allocations == 1


def test_longctx_option_checked():
    with pytest.raises(ValueError, match="TokenOptions.longctx='both'"):
        TokenOptions(longctx="both")


def test_graph_cache_keyed_by_decisions_keeps_one_graph_per_shape(graphs_on):
    """Stage 3 with host decisions and ``key_decisions``: emit and non-emit tokens (and each
    top-k regime) keep their own graph; no recapture; every token exact."""
    opts = TokenOptions(scalars="device", counts_clear="async")
    be = SimBackend(seed=LONG.seed)
    m = DecodeModel(LONG, be, opts)
    ref = DecodeModel(LONG, NumpyBackend(seed=LONG.seed), opts)
    m.executor = GraphCache(be, CapturePolicy({"token"}, key_decisions=True))
    s = be.new_stream(non_blocking=True)
    shapes = set()
    with S.stream_override(s):
        for pos in range(56, 80):
            shapes.add(m.longctx_decisions(pos, by_value=False))
            m.token(pos, pos)
            be.synchronize()
            ref.token(pos, pos)
            assert all(np.array_equal(a, b) for a, b in zip(lc_state(m), lc_state(ref))), pos
    st = m.executor.stats
    assert st.recaptures == 0 and st.retirements == 0
    assert st.captures == len(shapes) == 4  # {emit, no emit} x {sort2k, sort4k}


# ----------------------------------------------------------------------------- the ladder across context
def test_context_ladder_on_sim(tmp_path):
    import pandas as pd

    from ds4lab.jobs import execute
    from ds4lab.jobs.context import ContextConfig

    df = execute("context", ContextConfig(stages="0,2,3,3c", preset="tiny", contexts=[128, 600], span=8, tokens=6,
                                          warmup=2, out=tmp_path), backend="sim").table()
    assert list(df.stage) == ["0", "2", "3", "3c"] * 2 and list(df.context) == [128] * 4 + [600] * 4
    assert df.exact.all() and (df.first_mismatch == "").all()
    last = df[df.context == 600].set_index("stage")
    assert last.loc["3c", "graphs"] == 1 and last.loc["3c", "recaptures"] == 0
    assert last.loc["3", "graphs"] >= 2  # one per token shape seen so far
    assert last.loc["0", "graph_launches"] == 0 and last.loc["3c", "kernel_launches"] == 0
    for f in ("context.csv", "meta.json", "context.png", "context.svg", "context.pdf"):
        assert (tmp_path / f).is_file(), f
    csv = pd.read_csv(tmp_path / "context.csv")
    assert {"stage", "context", "us_median", "us_p25", "us_p75", "exact", "first_mismatch", "graphs",
            "recaptures"} <= set(csv.columns)


@pytest.mark.parametrize("kw,needle", [(dict(stages="0,4"), "4"), (dict(contexts="12,x"), "'x'"),
                                       (dict(contexts=[2]), "2 must be at least 4"), (dict(span=-1), "--span -1"),
                                       (dict(contexts="4096,1024"), "ascending order"),
                                       (dict(contexts="1024,,2048"), "empty element"), (dict(contexts=""), "no context"),
                                       (dict(span=100000), "at most 256")])
def test_context_ladder_input_errors(tmp_path, kw, needle):
    from ds4lab.errors import BadInput
    from ds4lab.jobs import execute
    from ds4lab.jobs.context import ContextConfig

    with pytest.raises(BadInput, match=needle):
        execute("context", ContextConfig(preset="tiny", out=tmp_path, **kw), backend="sim")
    assert not (tmp_path / "meta.json").exists()  # refused before any work


# ----------------------------------------------------------------------------- long-context hazards
from ds4lab.experiments.hazards import HAZARDS, demonstrate  # noqa: E402

HAZARD_OUTCOMES = {  # (capture mode, hazard) → outcome, first differing tensor (prefix)
    ("thread_local", "compressor-emit"): ("captured, replays wrong", "token 3: kv_cache[2].comp"),
    ("thread_local", "indexer-regime"): ("captured, replays wrong", "token 8: kv_cache[3]"),
    ("thread_local", "comp-row-by-value"): ("captured, replays wrong", "token 2: kv_cache[2].comp_state"),
    ("thread_local", "topk-alloc"): ("refused → eager fallback", ""),
    ("relaxed", "topk-alloc"): ("captured, exact", ""),
}


@pytest.mark.parametrize("mode,name", sorted(HAZARD_OUTCOMES))
def test_longctx_hazards_on_sim(mode, name):
    cfg = get_preset("tiny", n_layers=4)
    r = demonstrate(name, SimBackend(seed=cfg.seed), cfg, mode=mode)
    outcome, first = HAZARD_OUTCOMES[(mode, name)]
    assert r["outcome"] == outcome and r["first_mismatch"].startswith(first), r
    assert r["exact"] == (first == "")
    if name == "topk-alloc" and mode == "thread_local":
        assert r["errors"] == "cudaErrorStreamCaptureUnsupported=1"
    assert r["exact_3c"] and r["graphs_3c"] == 1  # stage 3c: one graph, exact
    assert r["expected"] == HAZARDS[name].expected(mode)


def test_hazard_unknown_name():
    with pytest.raises(ValueError, match="'nope'.*compressor-emit"):
        demonstrate("nope", SimBackend(), get_preset("tiny"))


@pytest.mark.parametrize("call,needle", [
    (lambda L, c: ops.comp_pool(L, "p", None, None, None, 64, 8), "ratio=8"),
    (lambda L, c: ops.indexer_topk(L, "t", None, None, 24, c, 4, None), "sort_n=24"),
    (lambda L, c: ops.indexer_topk(L, "t", None, None, 8, c, 4, None), "sort_n=8"),
    (lambda L, c: ops.indexer_topk_chunk(L, "t", None, None, 2, 8192, c, 4, None), "sort_n=8192"),
    (lambda L, c: ops.indexer_topk_merge(L, "m", None, None, 0, None, 0, 3, 10, 64, c), "blocks=3"),
])
def test_long_context_ops_refuse_bad_shapes(call, needle):
    from ds4lab.capture.launch import Launcher

    with pytest.raises(ValueError, match=needle):
        call(Launcher(NumpyBackend()), LONG)


from ds4lab.token import ops  # noqa: E402


def test_a_context_run_without_exactness_times_only(tmp_path):
    """``--span 0``: no stage compared bit for bit (the fits' timing-only runs: ``sim_context``), so
    ``exact`` is n/a and nothing is computed."""
    from ds4lab.jobs import execute
    from ds4lab.jobs.context import ContextConfig

    df = execute("context", ContextConfig(stages="0,3", preset="tiny", contexts="64", span=0, tokens=2, warmup=1,
                                          out=str(tmp_path)), backend="sim").table()
    assert set(df.stage) == {"0", "3"} and (df.exact == "n/a").all() and (df.us_median > 0).all()
