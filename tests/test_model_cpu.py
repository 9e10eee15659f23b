"""Whole decode tokens on the CPU (``numpy`` backend, preset ``tiny``).

Covers the launch sequence and its census, the hazard toggles that must not change results
on the CPU (device scalars, sync/async counts clear, scratch policy, NVTX, routing), the routed
MoE against the reference, and input validation.
"""

from __future__ import annotations


import numpy as np
import pytest

from ds4lab.token import ops
from ds4lab.token import reference as R
from ds4lab.capture import stream as S
from ds4lab.token import weights as W
from ds4lab.capture.annotate import NullAnnotator, NvtxAnnotator
from ds4lab.executor.numpy_backend import NumpyBackend
from ds4lab.token.config import MOE_TILE, get_preset
from ds4lab.capture.launch import KINDS, Launcher
from ds4lab.token.model import DecodeModel, TokenOptions

TINY = get_preset("tiny")
SEQ = [(0, 5), (1, 17), (2, 400), (3, 5), (9, 250), (10, 511), (11, 0)]  # wraps the 8-row window

# Launches of one layer per cluster, in the order of the context file's layer anatomy
# (decode: T=1, so the routed MoE has no sort stage).
PER_LAYER = {
    "hc_attn": 3,  # stream norm, mix logits, premix + norm
    "query": 5,  # q_a, norm, q_b, head norm, rope
    "kv": 3,  # kv, norm, rope + store
    "attention": 1,
    "output": 2,  # grouped o_a, o_b + expand
    "hc_ffn": 3,
    "router": 2,  # logits, top-k or hash
    "moe": 4,  # ds4's path: xq, gateup (+ weighted SwiGLU), midq, down (+ the experts' sum)
    "shared": 2,  # gate/up + swiglu, down + expand
}


@pytest.fixture
def be():
    return NumpyBackend(seed=1234)


def run(cfg=TINY, opts=None, seq=SEQ, backend=None, **kw):
    m = DecodeModel(cfg, backend or NumpyBackend(seed=cfg.seed), opts or TokenOptions(vocab=True), **kw)
    for pos, tok in seq:
        m.token(pos, tok)
    return m


# ----------------------------------------------------------------------------- a token
def test_token_finite_hidden_and_logits(be):
    m = DecodeModel(TINY, be, TokenOptions(vocab=True))
    m.token(0, 5)
    h, lg = m.hidden(), m.output_logits()
    assert h.shape == (TINY.hc_streams, TINY.embed) and h.dtype == np.float32
    assert lg.shape == (TINY.vocab,) and lg.dtype == np.float32
    assert np.isfinite(h).all() and np.isfinite(lg).all()
    assert lg.std() > 0
    # The hidden state is not the input embedding any more: the layers did something.
    emb = W.embed_row(TINY.seed, 5, TINY.embed)
    assert not np.allclose(h, np.broadcast_to(emb, h.shape))
    h0 = h.copy()
    m.token(1, 6)
    assert not np.array_equal(m.hidden(), h0)


def test_token_without_vocab(be):
    m = DecodeModel(TINY, be, TokenOptions(vocab=False))
    m.token(3, 7)
    assert m.output_logits() is None
    assert np.isfinite(m.hidden()).all()


def test_ring_wrap_positions_stay_finite():
    m = run()
    assert np.isfinite(m.hidden()).all() and np.isfinite(m.output_logits()).all()
    for c in m.cache:
        assert np.isfinite(c).all()


def test_fresh_models_bit_identical():
    a, b = run(), run()
    assert np.array_equal(a.hidden(), b.hidden())
    assert np.array_equal(a.output_logits(), b.output_logits())
    # Only the last router call's rows are valid (T=1 here); the rest of the buffer is scratch.
    assert np.array_equal(a.selected_experts()[:1], b.selected_experts()[:1])
    # ... and the result does depend on the sequence.
    c = run(seq=SEQ[:-1] + [(11, 1)])
    assert not np.array_equal(a.hidden(), c.hidden())


def test_first_layer_uses_hash_routing(be):
    """Layer 0 of tiny is hash-routed: with a 1-layer model the last router call is that layer's."""
    m = DecodeModel(TINY, be, TokenOptions(), n_layers=1)
    m.token(4, 123)
    assert np.array_equal(m.selected_experts()[0],
                          W.hash_experts(TINY.seed, 123, 0, TINY.n_used, TINY.n_experts))


def test_partial_model_bad_layers(be):
    for n in (0, TINY.n_layers + 1):
        with pytest.raises(ValueError, match=f"n_layers={n}"):
            DecodeModel(TINY, be, n_layers=n)


def reference_tokens(m: DecodeModel, seq):
    """The decode token written out straight from the anatomy with reference ops, own KV caches."""
    cfg = m.cfg
    S, E, H, D, eps, lim = cfg.hc_streams, cfg.embed, cfg.n_heads, cfg.head_dim, cfg.rms_eps, cfg.swiglu_limit
    caches = [W.gen_f32(W.tensor_key(cfg.seed, f"kv_prefill@{l}"), cfg.window * D, 1.0, 0.0).reshape(cfg.window, D)
              for l in range(m.n_layers)]

    def premix(h, wmix, wnorm):
        hn = R.rms_norm(h, None, eps)
        lg = R.sum_partials(R.hc_mix_partials(hn, wmix, ops.HC_MIX_SPLIT))
        return lg, R.hc_premix(h, lg, wnorm, eps)

    for pos, tok in seq:
        h = np.broadcast_to(W.embed_row(cfg.seed, tok, E), (S, E)).astype(np.float32)
        for l in range(m.n_layers):
            w = m.layers[l]
            lg, x = premix(h, w["hc_attn_mix"], w["hc_attn_norm"])
            qan = R.rms_norm(R.q8_matvec(w["q_a"], x)[None], w["q_a_norm"], eps)[0]
            q = R.rms_norm(R.q8_matvec(w["q_b"], qan).reshape(H, D), w["q_head_norm"], eps)
            q = R.rope(q, pos, cfg.rope_dims, cfg.rope_theta)
            kvn = R.rms_norm(R.q8_matvec(w["kv"], x)[None], w["kv_norm"], eps)
            caches[l][pos % cfg.window] = R.rope(kvn, pos, cfg.rope_dims, cfg.rope_theta)[0]
            o = R.attention_decode(q, caches[l], pos, cfg.window)
            oa = R.q8_matvec(w["o_a"], o.reshape(-1), rows_per_group=cfg.out_lora, group_stride=cfg.group_in)
            h = R.expand(h, lg, R.q8_matvec(w["o_b"], oa))
            lg, x = premix(h, w["hc_ffn_mix"], w["hc_ffn_norm"])
            rl = R.router_logits(w["router"], x[None])
            if cfg.is_hash_layer(l):
                ids = W.hash_experts(cfg.seed, tok, l, cfg.n_used, cfg.n_experts)[None]
                wts = R.router_weights(rl, ids)
            else:
                ids, wts = R.router_topk(rl, cfg.n_used)
            bank = m.banks[W.bank_of_layer(cfg, l)]
            y = R.routed_moe(lambda e: (bank["gate_up"][e], bank["down"][e]), x[None], ids, wts, lim)[0]
            mid = R.q8_matvec_swiglu(w["sh_gateup"], x, lim)
            h = R.expand(h, lg, R.q8_matvec(w["sh_down"], mid), y)
    logits = None
    if m.opts.vocab:
        xf = R.hc_premix(h, np.zeros(2 * S, np.float32), m.out_norm, eps)
        logits = R.q8_matvec(m.vocab, xf)
    return h, logits, caches


@pytest.mark.parametrize("scalars", ["value", "device"])
def test_token_matches_straight_line_reference(be, scalars):
    seq = [(6, 42), (7, 3), (8, 500), (9, 42)]  # fills, then wraps the 8-row window
    m = DecodeModel(TINY, be, TokenOptions(vocab=True, scalars=scalars))
    for pos, tok in seq:
        m.token(pos, tok)
    h, logits, caches = reference_tokens(m, seq)
    for l in range(TINY.n_layers):
        np.testing.assert_allclose(m.cache[l], caches[l], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(m.hidden(), h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.output_logits(), logits, rtol=1e-5, atol=1e-5)


def test_token_writes_only_its_kv_row(be):
    m = DecodeModel(TINY, be, TokenOptions())
    before = [np.array(c, copy=True) for c in m.cache]
    m.token(10, 7)
    for l in range(TINY.n_layers):
        changed = np.flatnonzero((m.cache[l] != before[l]).any(axis=1)).tolist()
        assert changed == [10 % TINY.window]


# ----------------------------------------------------------------------------- census
def test_census_per_token_launches():
    m = run(seq=SEQ[:3])
    c = m.L.census
    assert c.tokens == 3
    per_cluster = c.frame().groupby("cluster")["launches"].sum().to_dict()
    layer_clusters = {k: v for k, v in per_cluster.items() if k not in ("embed", "final")}
    assert per_cluster["embed"] == 1
    assert per_cluster["final"] == 2
    assert layer_clusters == {k: v * TINY.n_layers for k, v in PER_LAYER.items()}
    per_layer = sum(layer_clusters.values()) / TINY.n_layers
    assert per_layer == sum(PER_LAYER.values()) == 25
    kinds = c.by_kind().set_index("kind")
    assert list(kinds.index) == list(KINDS)
    assert kinds.loc["kernel", "launches"] == 1 + per_layer * TINY.n_layers + 2
    assert c.total("kernel") == 3 * (1 + per_layer * TINY.n_layers + 2)
    for k in ("memset", "gemm", "event", "memcpy"):
        assert kinds.loc[k, "launches"] == 0
    assert c.total() == c.total("kernel")


def test_census_partial_model_and_no_vocab(be):
    m = DecodeModel(TINY, be, TokenOptions(vocab=False), n_layers=2)
    m.token(0, 1)
    assert m.L.census.total("kernel") == 1 + 25 * 2
    assert "final" not in set(m.L.census.frame()["cluster"])


def test_census_router_and_moe_multi_token_one_memset(be, rng):
    m = DecodeModel(TINY, be, TokenOptions())
    T = 3
    x = rng.standard_normal((T, TINY.embed)).astype(np.float32)
    m.router(1, x, T)
    m.routed_moe(1, x, T)
    kinds = m.L.census.by_kind().set_index("kind")
    assert kinds.loc["memset", "launches"] == 1
    assert kinds.loc["memset", "sites"] == 1
    # router (2) + xq, 4 sort kernels, gateup, midq, down, sum (9): the sorted path keeps a sum launch
    assert kinds.loc["kernel", "launches"] == 11
    sites = set(m.L.census.frame()["site"])
    assert {"sort.counts_clear", "sort.count", "sort.prefix", "sort.scatter", "sort.tiles"} <= sites
    # T=1 afterwards: no memset, no sort kernels.
    m.L.census.reset()
    m.router(1, x[:1], 1)
    m.routed_moe(1, x[:1], 1)
    kinds = m.L.census.by_kind().set_index("kind")
    assert kinds.loc["memset", "launches"] == 0
    assert kinds.loc["kernel", "launches"] == 6  # router (2) + ds4's four


def test_launch_trace_matches_census(be):
    m = DecodeModel(TINY, be, TokenOptions(vocab=True))
    m.L.trace = []
    m.token(0, 5)
    tr = m.L.trace
    assert len(tr) == m.L.census.total("kernel") == 78
    assert (tr[0].cluster, tr[0].site, tr[0].layer) == ("embed", "embed", -1)
    assert (tr[-1].cluster, tr[-1].site, tr[-1].kernel) == ("final", "vocab", "q8_matvec")
    assert [r.layer for r in tr[1:-2]] == [l for l in range(TINY.n_layers) for _ in range(25)]
    assert [r.cluster for r in tr[1:26]] == [c for c, n in PER_LAYER.items() for _ in range(n)]
    moe = [r.kernel for r in tr[1:26] if r.cluster == "moe"]
    assert moe == ["xq_quantize_q8k", "moe_gateup_mid_iq2_xxs", "moe_midq_q8k", "moe_down_sum_q2_k"]
    # Off by default: no record kept.
    m2 = DecodeModel(TINY, be, TokenOptions())
    m2.token(0, 5)
    assert m2.L.trace is None


def test_moe_profile_records_seven_events_per_layer():
    m = run(opts=TokenOptions(moe_profile=True), seq=SEQ[:2])
    kinds = m.L.census.by_kind().set_index("kind")
    assert kinds.loc["event", "launches"] == 7 * TINY.n_layers
    assert kinds.loc["event", "sites"] == 7
    ref = run(opts=TokenOptions(), seq=SEQ[:2])
    assert np.array_equal(m.hidden(), ref.hidden())


def test_device_scalars_one_memcpy_and_bit_identical():
    v = run(opts=TokenOptions(vocab=True, scalars="value"))
    d = run(opts=TokenOptions(vocab=True, scalars="device"))
    kv = v.L.census.by_kind().set_index("kind")
    kd = d.L.census.by_kind().set_index("kind")
    assert kv.loc["memcpy", "launches"] == 0
    assert kd.loc["memcpy", "launches"] == 1
    assert kd.loc["kernel", "launches"] == kv.loc["kernel", "launches"]
    assert d.L.census.total("memcpy") == len(SEQ)
    assert np.array_equal(d.hidden(), v.hidden())
    assert np.array_equal(d.output_logits(), v.output_logits())
    # The device buffer holds the last token's scalars.
    pos, tok = SEQ[-1]
    assert d.scal.tolist() == [pos, pos % TINY.window, min(pos + 1, TINY.window), tok]


def test_counts_clear_sync_and_async_identical(rng):
    a = run(opts=TokenOptions(vocab=True, counts_clear="sync"))
    b = run(opts=TokenOptions(vocab=True, counts_clear="async"))
    assert np.array_equal(a.hidden(), b.hidden())
    assert np.array_equal(a.output_logits(), b.output_logits())
    x = rng.standard_normal((5, TINY.embed)).astype(np.float32)
    ys = []
    for m in (a, b):
        m.L.census.reset()
        m.router(2, x, 5)
        ys.append(m.routed_moe(2, x, 5)[:5].copy())
        assert m.L.census.total("memset") == 1
    assert np.array_equal(ys[0], ys[1])
    assert np.isfinite(ys[0]).all()


# ----------------------------------------------------------------------------- routed MoE
@pytest.mark.parametrize("fmt", ["iq2_xxs+q2_k", "q4_k", "q4blk"])
@pytest.mark.parametrize("T", [1, 2, 3, 16])
@pytest.mark.parametrize("layer", [0, 2])  # hash-routed and top-k
def test_routed_moe_matches_reference(T, layer, fmt, be, rng):
    """Each expert format's launch sequence (ds4's four launches or the sorted path; ds4lab's five)
    against the whole-MoE reference of its path, computed from the routing the model chose."""
    cfg = TINY.replace(expert_format=fmt)
    m = DecodeModel(cfg, be, TokenOptions())
    x = (rng.standard_normal((T, TINY.embed)) * 2).astype(np.float32)
    toks = rng.integers(0, TINY.vocab, size=T).astype(np.int32)
    m.token_ids[:T] = toks
    m.router(layer, x, T, token_ids=m.token_ids)
    y = m.routed_moe(layer, x, T)[:T].copy()
    ids = m.selected_experts()[:T].copy()
    wts = np.asarray(m.moe_buf.wts)[:T].copy()
    # Routing against the reference router.
    logits = R.router_logits(m.layers[layer]["router"], x)
    if TINY.is_hash_layer(layer):
        want_ids = np.stack([W.hash_experts(TINY.seed, int(t), layer, TINY.n_used, TINY.n_experts)
                             for t in toks])
        want_w = R.router_weights(logits, want_ids)
    else:
        want_ids, want_w = R.router_topk(logits, TINY.n_used)
    assert np.array_equal(ids, want_ids)
    assert np.allclose(wts, want_w, rtol=1e-6)
    bank = m.banks[W.bank_of_layer(TINY, layer)]
    expert = lambda e: (bank["gate_up"][e], bank["down"][e])  # noqa: E731
    atol = 1e-7
    if cfg.moe_path == "ds4":
        want = R.moe_decode_ds4(expert, x, ids, wts, TINY.swiglu_limit, TINY.n_experts)
        if T > 1:  # the sorted path rounds each expert's row to float32 before the sum; the reference
            atol = 1e-6  # adds the six in float64 (one rounding): ~1e-7 apart on outputs of ~1
    else:
        want = R.routed_moe(expert, x, ids, wts, TINY.swiglu_limit)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=atol)
    if T > 1:
        n_tiles = int(m.moe_buf.n_tiles[0])
        assert n_tiles == len(R.moe_sort(ids, TINY.n_experts)["tiles"]) <= m.moe_buf.max_tiles
        assert (np.asarray(m.moe_buf.tiles)[:n_tiles, 2] <= MOE_TILE).all()


def test_tiled_grid_covers_this_calls_tiles_not_the_capacity(be, rng):
    """After a 16-token call sized the buffers, a 2-token call launches the tiled kernels over its
    own tile bound (empty blocks past it cost ~0.2 ms per call on the H200 at ds4-flash sizes)."""
    m = DecodeModel(TINY, be, TokenOptions())
    x = rng.standard_normal((16, TINY.embed)).astype(np.float32)
    m.token_ids[:16] = rng.integers(0, TINY.vocab, size=16).astype(np.int32)
    for T in (16, 2):
        m.router(2, x, T, token_ids=m.token_ids)
        m.L.trace = trace = []
        m.routed_moe(2, x, T)
        m.L.trace = None
        grids = {r.kernel: r.grid for r in trace}
        bound = R.max_tiles(T * TINY.n_used, TINY.n_experts)
        assert grids["moe_gateup_mid_tiled_iq2_xxs"][1] == grids["moe_down_tiled_q2_k"][1] == bound
    assert bound < m.moe_buf.max_tiles


def test_hash_router_multi_token_needs_token_ids(be, rng):
    m = DecodeModel(TINY, be, TokenOptions())
    x = rng.standard_normal((2, TINY.embed)).astype(np.float32)
    with pytest.raises(ValueError, match="T=2"):
        m.router(0, x, 2)


# ----------------------------------------------------------------------------- scratch
def test_on_demand_scratch_grows(be, rng):
    m = DecodeModel(TINY, be, TokenOptions(scratch="on-demand"))
    b = m.moe_buf
    assert (b.capacity, b.allocations) == (1, 1)
    m.token(0, 3)
    assert (b.capacity, b.allocations) == (1, 1)
    x = rng.standard_normal((16, TINY.embed)).astype(np.float32)
    ys = {}
    for T, cap, allocs in ((3, 3, 2), (2, 3, 2), (3, 3, 2), (16, 16, 3), (1, 16, 3)):
        m.router(1, x[:T], T)
        ys[T] = m.routed_moe(1, x[:T], T)[:T].copy()
        assert (b.capacity, b.allocations) == (cap, allocs), T
        assert np.asarray(b.y).shape[0] == cap
    # Same answers as a preallocated scratch.
    p = DecodeModel(TINY, NumpyBackend(seed=1234), TokenOptions(scratch="prealloc"))
    assert p.moe_buf.capacity == TINY.max_tokens and p.moe_buf.allocations == 1
    for T in (3, 16):
        p.router(1, x[:T], T)
        assert np.array_equal(p.routed_moe(1, x[:T], T)[:T], ys[T])


def test_prealloc_scratch_refuses_beyond_capacity(be, rng):
    cfg = get_preset("tiny", max_tokens=4)
    m = DecodeModel(cfg, be, TokenOptions(scratch="prealloc"))
    x = rng.standard_normal((5, cfg.embed)).astype(np.float32)
    m.router(1, x[:4], 4)  # at capacity: fine
    with pytest.raises(ValueError, match="max_tokens=4") as e:
        m.router(1, x, 5)
    assert "T=5" in str(e.value)
    with pytest.raises(ValueError, match="max_tokens=4"):
        m.moe_buf.ensure(5)
    assert m.moe_buf.allocations == 1


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("pos,tok,needle", [(-1, 5, "-1"), (-100, 5, "-100"), (0, 512, "512"),
                                            (0, -3, "-3"), (4, 10**6, "1000000")])
def test_model_rejects_bad_position_or_token(be, pos, tok, needle):
    m = DecodeModel(TINY, be, TokenOptions())
    with pytest.raises(ValueError, match=needle):
        m.token(pos, tok)
    assert m.L.census.tokens == 0


def test_model_accepts_boundaries(be):
    m = DecodeModel(TINY, be, TokenOptions())
    m.token(0, 0)
    m.token(100_000, TINY.vocab - 1)
    assert np.isfinite(m.hidden()).all()


@pytest.mark.parametrize("pos,tok", [(2**31, 5), (2.5, 5), (0, 7.5)])
def test_model_rejects_unrepresentable_scalars(be, pos, tok):
    m = DecodeModel(TINY, be, TokenOptions())
    with pytest.raises(ValueError, match=str(pos if pos != 0 else tok)):
        m.token(pos, tok)


@pytest.mark.parametrize("field", ["counts_clear", "scalars", "scratch"])
def test_token_options_reject_unknown(field):
    with pytest.raises(ValueError) as e:
        TokenOptions(**{field: "bogus"})
    assert f"TokenOptions.{field}='bogus'" in str(e.value)


def test_token_options_accept_all_valid():
    for cc in ("sync", "async"):
        for sc in ("value", "device"):
            for sp in ("on-demand", "prealloc"):
                o = TokenOptions(counts_clear=cc, scalars=sc, scratch=sp, vocab=True)
                assert o.summary() == {"counts_clear": cc, "scalars": sc, "scratch": sp,
                                       "vocab": True, "moe_profile": False, "moe_host_timed": False,
                                       "legacy_sites": (), "sync_in_body": False, "longctx": "host",
                                           "pdl": False}


# ----------------------------------------------------------------------------- memory check
class GpuLikeBackend(NumpyBackend):
    """The numpy executor reporting ``free`` device bytes (the contract's ``free_memory``)."""

    def __init__(self, free: int, total: int = 2**40) -> None:
        super().__init__(seed=1234)
        self._mem = (free, total)

    def free_memory(self):
        return self._mem


def test_memory_check_refuses_before_allocating():
    need = W.model_bytes(TINY, True) + W.cache_bytes(TINY)  # weights and the KV windows
    with pytest.raises(MemoryError, match="GiB"):
        DecodeModel(TINY, GpuLikeBackend(free=need - 1), TokenOptions(vocab=True))
    with pytest.raises(MemoryError, match="per_layer_experts"):
        DecodeModel(TINY.replace(per_layer_experts=True), GpuLikeBackend(free=need), TokenOptions(vocab=True))
    DecodeModel(TINY, GpuLikeBackend(free=need), TokenOptions(vocab=True))  # just fits


def test_memory_check_partial_model_below_hash_layers():
    """A partial model with fewer layers than hash layers is sized, not re-validated."""
    cfg = get_preset("tiny", n_hash_layers=2)
    m = DecodeModel(cfg, GpuLikeBackend(free=2**40), TokenOptions(), n_layers=1)
    assert m.n_layers == 1
    # A partial model needs fewer bytes: it fits where the whole one would not.
    part = W.model_bytes(cfg, False, 1) + W.cache_bytes(cfg, 1)
    assert part < W.model_bytes(cfg, False) + W.cache_bytes(cfg)
    DecodeModel(cfg, GpuLikeBackend(free=part), TokenOptions(), n_layers=1)
    with pytest.raises(MemoryError):
        DecodeModel(cfg, GpuLikeBackend(free=part - 1), TokenOptions(), n_layers=1)


# ----------------------------------------------------------------------------- launcher: NVTX, routing
class CountingAnnotator:
    """Wraps an annotator and tracks push/pop nesting."""

    enabled = True

    def __init__(self, inner):
        self.inner = inner
        self.depth = 0
        self.max_depth = 0
        self.pushes = 0

    def push(self, message, cluster, payload=None):
        self.inner.push(message, cluster, payload)
        self.depth += 1
        self.pushes += 1
        self.max_depth = max(self.max_depth, self.depth)

    def pop(self):
        self.inner.pop()
        self.depth -= 1
        assert self.depth >= 0, "pop without push"


def test_launcher_annotator_choice(be):
    assert isinstance(Launcher(be).annotator, NullAnnotator)
    assert isinstance(Launcher(be, nvtx=True).annotator, NvtxAnnotator)


def test_token_runs_with_nvtx(be):
    m = DecodeModel(TINY, be, TokenOptions(vocab=True))
    m.L = Launcher(be, nvtx=True)
    assert isinstance(m.L.annotator, NvtxAnnotator)
    ann = CountingAnnotator(m.L.annotator)
    m.L.annotator = ann
    for pos, tok in SEQ[:3]:
        m.token(pos, tok)
    ref = run(seq=SEQ[:3])
    assert np.array_equal(m.hidden(), ref.hidden())
    assert np.array_equal(m.output_logits(), ref.output_logits())
    assert ann.depth == 0
    assert ann.max_depth == 4  # token > layer > cluster > op
    # One range per launch, per cluster scope, per layer and per token.
    per_token_clusters = 1 + len(PER_LAYER) * TINY.n_layers + 1  # embed, layers, final
    assert ann.pushes == 3 * (78 + per_token_clusters + TINY.n_layers + 1)
    assert m.L.census.counts == ref.L.census.counts


def test_model_nvtx_flag(be):
    m = DecodeModel(TINY, be, TokenOptions(scalars="device", moe_profile=True), nvtx=True)
    m.token(0, 9)
    m.token(1, 10)
    assert np.isfinite(m.hidden()).all()
    assert isinstance(m.L.annotator, NvtxAnnotator)


def test_nvtx_balanced_when_a_launch_raises(be):
    L = Launcher(be, nvtx=True)
    ann = CountingAnnotator(L.annotator)
    L.annotator = ann

    def boom():
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError):
        with L.cluster("moe"):
            L.kernel("site", "k", (1,), (1,), (), boom)
    assert ann.depth == 0


class RecordingBackend(NumpyBackend):
    """Records which stream each launch went to."""

    def __init__(self):
        super().__init__(seed=1234)
        self.streams = []

    def launch(self, stream, name, grid, block, args, shared, ref, *rest, **kw):
        self.streams.append(("kernel", stream))
        super().launch(stream, name, grid, block, args, shared, ref, *rest, **kw)

    def memset_async(self, stream, buf, value):
        self.streams.append(("memset_async", stream))
        super().memset_async(stream, buf, value)

    def memset_sync(self, buf, value):
        self.streams.append(("memset_sync", None))
        super().memset_sync(buf, value)

    def copy_h2d(self, stream, dst, src):
        self.streams.append(("memcpy", stream))
        super().copy_h2d(stream, dst, src)


@pytest.mark.parametrize("routed", [True, False])
def test_launches_follow_the_accessor(graphs_restored, routed, rng):
    S.set_graphs_enabled(True)
    rb = RecordingBackend()
    m = DecodeModel(TINY, rb, TokenOptions(scalars="device", counts_clear="async"), routed=routed)
    ov = rb.new_stream()
    x = rng.standard_normal((3, TINY.embed)).astype(np.float32)
    with S.stream_override(ov):
        m.token(0, 5)
        m.router(1, x, 3)
        m.routed_moe(1, x, 3)
    want = ov if routed else S.LEGACY_STREAM
    kinds = {k for k, _ in rb.streams}
    assert kinds == {"kernel", "memset_async", "memcpy"}
    assert all(s is want for _, s in rb.streams)
    # Flag off: the override is ignored.
    S.set_graphs_enabled(False)
    rb.streams.clear()
    with S.stream_override(ov):
        m.token(1, 5)
    assert rb.streams and all(s is S.LEGACY_STREAM for _, s in rb.streams)


def test_sync_memset_and_legacy_kernel_bypass_accessor(graphs_restored):
    S.set_graphs_enabled(True)
    rb = RecordingBackend()
    L = Launcher(rb)
    ov = rb.new_stream()
    buf = np.ones(4, np.int32)
    hit = []
    with S.stream_override(ov):
        L.kernel("a", "k", (1,), (1,), (), lambda: hit.append(1))
        L.kernel("b", "k", (1,), (1,), (), lambda: hit.append(2), legacy=True)
        L.memset("c", buf, 0, sync=True)
        L.memset("d", buf, 0, sync=False)
    assert rb.streams == [("kernel", ov), ("kernel", S.LEGACY_STREAM), ("memset_sync", None),
                          ("memset_async", ov)]
    assert hit == [1, 2] and (buf == 0).all()
    assert L.census.total() == 4 and L.census.total("memset") == 2
