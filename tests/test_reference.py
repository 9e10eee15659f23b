"""The NumPy reference ops against independent, straightforward NumPy formulas.

Inputs are fresh random draws on every run (``rng`` fixture; its seed is printed on failure).
The expected values never call the function under test: weights are dequantized here, by hand,
in float64.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ds4lab.token import reference as R
from ds4lab.token import weights as W
from ds4lab.token.config import MOE_TILE

f32, f64 = np.float32, np.float64


def rel(a, b):
    a, b = np.asarray(a, f64), np.asarray(b, f64)
    assert np.isfinite(a).all()
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def rand_q8(rng, rows, cols) -> W.QTensor:
    qs = rng.integers(-127, 128, size=(rows, cols)).astype(np.int8)
    d = (rng.uniform(0.5, 2.0, size=(rows, cols // 32)) / (64 * np.sqrt(cols))).astype(np.float16)
    return W.QTensor("q8_0", rows, cols, qs, d)


def my_dequant_q8(w: W.QTensor) -> np.ndarray:
    out = np.empty((w.rows, w.cols), f64)
    for r in range(w.rows):
        for b in range(w.cols // 32):
            out[r, b * 32:(b + 1) * 32] = w.qs[r, b * 32:(b + 1) * 32].astype(f64) * float(w.d[r, b])
    return out


def my_dequant_q4(w: W.QTensor) -> np.ndarray:
    out = np.empty((w.rows, w.cols), f64)
    for r in range(w.rows):
        for b in range(w.cols // 32):
            byts = w.qs[r, b * 16:(b + 1) * 16].astype(np.int64)
            vals = np.concatenate([(byts & 0xF) - 8, (byts >> 4) - 8])
            out[r, b * 32:(b + 1) * 32] = vals * float(w.d[r, b])
    return out


def my_q8k(x: np.ndarray):
    """Q8_K by the format's definition: per 256 values, d = amax/127 and q = rint(x/d), float32."""
    x = np.asarray(x, f32)
    T, n = x.shape
    q = np.zeros((T, n), np.int64)
    d = np.zeros((T, n // 256), f32)
    for t in range(T):
        for b in range(n // 256):
            blk = x[t, b * 256:(b + 1) * 256]
            db = f32(np.max(np.abs(blk))) / f32(127)
            d[t, b] = db
            if db != 0:
                q[t, b * 256:(b + 1) * 256] = np.rint(blk / db)
    return q, d


# ----------------------------------------------------------------------------- dense ops
def test_q8_matvec_plain(rng):
    w = rand_q8(rng, 24, 128)
    x = rng.standard_normal(128 + 7).astype(f32)  # only the first `cols` entries are read
    y = R.q8_matvec(w, x)
    assert y.dtype == f32 and y.shape == (24,)
    want = my_dequant_q8(w) @ x[:128].astype(f64)
    assert rel(y, want) < 1e-6


@pytest.mark.parametrize("stride", [64, 96, 0])
def test_q8_matvec_grouped(rng, stride):
    rpg, groups, cols = 5, 4, 64
    w = rand_q8(rng, rpg * groups, cols)
    x = rng.standard_normal((groups - 1) * stride + cols).astype(f32)
    y = R.q8_matvec(w, x, rows_per_group=rpg, group_stride=stride)
    Wd = my_dequant_q8(w)
    want = np.array([Wd[r] @ x[(r // rpg) * stride:(r // rpg) * stride + cols].astype(f64)
                     for r in range(rpg * groups)])
    assert rel(y, want) < 1e-6


def test_rms_norm(rng):
    x = (rng.standard_normal((5, 96)) * rng.uniform(0.1, 10, size=(5, 1))).astype(f32)
    w = rng.uniform(0.5, 1.5, 96).astype(f32)
    eps = 1e-6
    for ww in (w, None):
        y = R.rms_norm(x, ww, eps)
        assert y.dtype == f32
        want = np.empty_like(x, dtype=f64)
        for r in range(5):
            xr = x[r].astype(f64)
            want[r] = xr / np.sqrt(np.sum(xr * xr) / 96 + eps) * (1.0 if ww is None else ww.astype(f64))
        assert rel(y, want) < 1e-6
    # Unweighted output rows have unit RMS.
    y = R.rms_norm(x, None, 0.0).astype(f64)
    assert np.allclose(np.sqrt((y * y).mean(axis=1)), 1.0, atol=1e-6)


def test_rms_norm_eps_matters():
    x = np.full((1, 32), 1e-4, f32)
    small = R.rms_norm(x, None, 1e-12)[0]
    big = R.rms_norm(x, None, 1.0)[0]
    assert np.allclose(small, 1.0, atol=1e-4)
    assert np.allclose(big, 1e-4 / np.sqrt(1e-8 + 1.0), rtol=1e-5)


# ----------------------------------------------------------------------------- rope
@pytest.mark.parametrize("rope_dims", [16, 64])
def test_rope_preserves_pair_norms(rng, rope_dims):
    D = 64
    x = rng.standard_normal((3, D)).astype(f32)
    pos = int(rng.integers(1, 100_000))
    y = R.rope(x, pos, rope_dims, 10000.0).astype(f64)
    xa = x.astype(f64)
    # Untouched part.
    assert np.array_equal(y[:, : D - rope_dims], xa[:, : D - rope_dims])
    nx = np.hypot(xa[:, D - rope_dims::2], xa[:, D - rope_dims + 1::2])
    ny = np.hypot(y[:, D - rope_dims::2], y[:, D - rope_dims + 1::2])
    assert np.allclose(nx, ny, rtol=1e-5, atol=1e-6)
    # And it is not the identity.
    assert not np.allclose(y, xa, atol=1e-3)


def test_rope_pos0_identity(rng):
    x = rng.standard_normal((4, 64)).astype(f32)
    assert np.array_equal(R.rope(x, 0, 32, 10000.0), x)


def test_rope_matches_complex_rotation(rng):
    D, rd, theta = 64, 32, 10000.0
    x = rng.standard_normal((2, D)).astype(f32)
    pos = int(rng.integers(0, 5000))
    y = R.rope(x, pos, rd, theta)
    z = x[:, D - rd::2].astype(f64) + 1j * x[:, D - rd + 1::2].astype(f64)
    freq = np.array([theta ** (-2.0 * i / rd) for i in range(rd // 2)])
    z = z * np.exp(1j * pos * freq)
    want = x.astype(f64).copy()
    want[:, D - rd::2], want[:, D - rd + 1::2] = z.real, z.imag
    assert np.allclose(y, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- attention
def direct_attention(q, cache, positions, window):
    q, cache = q.astype(f64), cache.astype(f64)
    H, D = q.shape
    out = np.zeros((H, D))
    for h in range(H):
        s = np.array([q[h] @ cache[p % window] / np.sqrt(D) for p in positions])
        e = np.exp(s - s.max())
        a = e / e.sum()
        out[h] = sum(a[i] * cache[p % window] for i, p in enumerate(positions))
    return out


def test_attention_partial_window(rng):
    H, D, Wn = 4, 64, 8
    q = rng.standard_normal((H, D)).astype(f32)
    cache = rng.standard_normal((Wn, D)).astype(f32)
    pos = int(rng.integers(0, Wn - 1))  # n_valid = pos + 1 < window
    y = R.attention_decode(q, cache, pos, Wn)
    assert y.dtype == f32 and y.shape == (H, D)
    assert rel(y, direct_attention(q, cache, range(pos + 1), Wn)) < 1e-6
    # Rows beyond the valid ones are never read.
    poisoned = cache.copy()
    poisoned[pos + 1:] = np.nan
    assert np.array_equal(R.attention_decode(q, poisoned, pos, Wn), y)


def test_attention_first_position_returns_the_row(rng):
    q = rng.standard_normal((3, 32)).astype(f32)
    cache = rng.standard_normal((8, 32)).astype(f32)
    y = R.attention_decode(q, cache, 0, 8)
    assert np.allclose(y, np.broadcast_to(cache[0], (3, 32)), rtol=1e-6)


@pytest.mark.parametrize("pos", [7, 8, 29])
def test_attention_full_window(rng, pos):
    H, D, Wn = 4, 64, 8
    q = (rng.standard_normal((H, D)) * 3).astype(f32)
    cache = rng.standard_normal((Wn, D)).astype(f32)
    y = R.attention_decode(q, cache, pos, Wn)
    assert rel(y, direct_attention(q, cache, range(pos - Wn + 1, pos + 1), Wn)) < 1e-6


# ----------------------------------------------------------------------------- Q8_K
def test_quantize_q8k_round_trip_error(rng):
    T, n = 3, 1024
    x = (rng.standard_normal((T, n)) * rng.uniform(1e-3, 1e3, size=(T, 1))).astype(f32)
    q, d = R.quantize_q8k(x)
    assert q.dtype == np.int8 and q.shape == (T, n)
    assert d.dtype == f32 and d.shape == (T, n // 256)
    back = q.astype(f64) * np.repeat(d.astype(f64), 256, axis=1)
    bound = np.repeat(d.astype(f64), 256, axis=1) * (0.5 + 1e-5)
    assert (np.abs(back - x.astype(f64)) <= bound).all()
    # Each block's largest magnitude maps to +-127; d is amax/127 in float32.
    blk = np.abs(x.reshape(T, n // 256, 256)).max(axis=-1)
    assert np.array_equal(d, (blk / f32(127)).astype(f32))
    assert (np.abs(q.reshape(T, n // 256, 256)).max(axis=-1) == 127).all()
    assert np.array_equal(R.dequant_q8k(q, d), back)


def test_quantize_q8k_matches_definition(rng):
    x = rng.standard_normal((2, 512)).astype(f32)
    q, d = R.quantize_q8k(x)
    mq, md = my_q8k(x)
    assert np.array_equal(q.astype(np.int64), mq)
    assert np.array_equal(d, md)


def test_quantize_q8k_zero_block(rng):
    x = rng.standard_normal((2, 768)).astype(f32)
    x[0, 256:512] = 0.0
    x[1] = 0.0
    with np.errstate(all="raise"):  # no 0/0 on the way
        q, d = R.quantize_q8k(x)
    assert d[0, 1] == 0 and (q[0, 256:512] == 0).all()
    assert (d[1] == 0).all() and (q[1] == 0).all()
    assert d[0, 0] > 0 and d[0, 2] > 0 and (q[0, :256] != 0).any()


# ----------------------------------------------------------------------------- router
def my_topk(logits, k):
    ids = []
    for row in logits:
        order = sorted(range(len(row)), key=lambda i: (-float(row[i]), i))
        ids.append(order[:k])
    return np.array(ids)


def test_router_topk_ties_to_lower_index(rng):
    T, N, k = 6, 32, 6
    logits = rng.integers(0, 4, size=(T, N)).astype(f32)  # many ties
    ids, w = R.router_topk(logits, k)
    assert ids.dtype == np.int32 and w.dtype == f32
    assert np.array_equal(ids, my_topk(logits, k))
    s = 1 / (1 + np.exp(-np.take_along_axis(logits.astype(f64), ids.astype(np.int64), 1)))
    assert np.allclose(w, s / s.sum(1, keepdims=True), rtol=1e-6)
    assert np.allclose(w.sum(1), 1.0, atol=1e-6)


def test_router_topk_all_equal_picks_first_k():
    ids, w = R.router_topk(np.zeros((2, 16), f32), 6)
    assert ids.tolist() == [list(range(6))] * 2
    assert np.allclose(w, 1 / 6)


def test_router_topk_distinct_logits(rng):
    logits = rng.standard_normal((4, 64)).astype(f32)
    ids, _ = R.router_topk(logits, 6)
    assert np.array_equal(ids, np.argsort(-logits.astype(f64), axis=1)[:, :6])


def test_router_logits(rng):
    T, N, E = 3, 16, 64
    w = rng.standard_normal(N * E).astype(f32)
    x = rng.standard_normal((T, E)).astype(f32)
    got = R.router_logits(w, x)
    want = np.array([[sum(float(w[n * E + e]) * float(x[t, e]) for e in range(E)) for n in range(N)]
                     for t in range(T)])
    assert rel(got, want) < 1e-6


# ----------------------------------------------------------------------------- moe sort and tiles
def check_sort(ids, N):
    flat = ids.reshape(-1)
    P = flat.size
    s = R.moe_sort(ids, N)
    counts, offsets, srt, tiles = s["counts"], s["offsets"], s["sorted"], s["tiles"]
    assert counts.tolist() == [int((flat == e).sum()) for e in range(N)]
    assert offsets[0] == 0 and offsets.tolist() == [int(counts[:e].sum()) for e in range(N)]
    assert sorted(srt.tolist()) == list(range(P))
    for e in range(N):
        seg = srt[offsets[e]:offsets[e] + counts[e]]
        assert set(seg.tolist()) == {p for p in range(P) if flat[p] == e}
    # Tiles: count in 1..MOE_TILE, expert consistent, every pair covered exactly once.
    assert int(s["n_tiles"][0]) == len(tiles)
    covered = np.zeros(P, int)
    for e, start, cnt in tiles:
        assert 1 <= cnt <= MOE_TILE
        assert offsets[e] <= start and start + cnt <= offsets[e] + counts[e]
        for p in srt[start:start + cnt]:
            assert flat[p] == e
            covered[p] += 1
    assert (covered == 1).all()
    assert len(tiles) <= R.max_tiles(P, N)
    return s


@pytest.mark.parametrize("T,N,k", [(1, 16, 6), (2, 16, 6), (3, 16, 6), (16, 16, 6), (64, 256, 6), (40, 8, 3)])
def test_moe_sort_random(rng, T, N, k):
    ids = np.stack([rng.permutation(N)[:k] for _ in range(T)]).astype(np.int32)
    check_sort(ids, N)


def test_moe_sort_duplicates_and_one_expert(rng):
    # Not what a router produces, but the sort must still cover every pair once.
    check_sort(rng.integers(0, 4, size=(13, 5)).astype(np.int32), 16)
    s = check_sort(np.full((5, 6), 3, np.int32), 16)
    assert s["counts"][3] == 30 and len(s["tiles"]) == 4  # ceil(30 / 8)


def best_tiles(P, N, tile=MOE_TILE):
    """The most tiles any distribution of P pairs over N experts can make (exact DP)."""
    NEG = -1
    best = [0] + [NEG] * P
    for _ in range(N):
        nxt = best[:]
        for used in range(P + 1):
            if best[used] == NEG:
                continue
            for c in range(1, P - used + 1):
                v = best[used] + -(-c // tile)
                if v > nxt[used + c]:
                    nxt[used + c] = v
        best = nxt
    return best[P]


@pytest.mark.parametrize("N", [1, 3, 8, 16])
def test_max_tiles_bounds_worst_case(N):
    for P in range(1, 80):
        assert R.max_tiles(P, N) >= best_tiles(P, N), (P, N)


def test_max_tiles_worst_case_routings():
    # counts of tile+1 per expert: two tiles for every nine pairs.
    for N, per in ((16, MOE_TILE + 1), (8, 2 * MOE_TILE + 1), (16, 1)):
        flat = np.repeat(np.arange(N), per).astype(np.int32)
        s = check_sort(flat.reshape(-1, 1), N)
        assert len(s["tiles"]) == N * -(-per // MOE_TILE)


def test_max_tiles_random_bound(rng):
    for _ in range(30):
        N = int(rng.integers(1, 40))
        P = int(rng.integers(1, 200))
        ids = rng.integers(0, N, size=(P, 1)).astype(np.int32)
        s = R.moe_sort(ids, N)
        assert len(s["tiles"]) <= R.max_tiles(P, N)


@pytest.mark.parametrize("T,k,N,tile", [(3, 2, 4, 2), (4, 1, 3, 2), (2, 3, 5, 1), (3, 2, 4, 8)])
def test_expected_tiles_equals_the_exhaustive_mean(T, k, N, tile):
    """``expected_tiles`` is exact: on small cases it equals the mean tile count over every
    uniform routing (each token one of the C(N, k) expert sets, all equally likely) through
    the reference sort, with tiles small enough that ceil(count / tile) matters."""
    sets = list(itertools.combinations(range(N), k))
    tiles = [len(R.moe_sort(np.array(choice, dtype=np.int32), N, tile)["tiles"])
             for choice in itertools.product(sets, repeat=T)]
    assert R.expected_tiles(T, k, N, tile) == pytest.approx(np.mean(tiles), rel=1e-12)


@pytest.mark.parametrize("T,k,N", [(2, 6, 256), (16, 6, 256), (64, 6, 256), (40, 3, 8), (5, 8, 8)])
def test_expected_tiles_matches_sampled_uniform_routing(rng, T, k, N):
    """The tiled kernels' bytes estimate at the model's sizes: the mean tile count of sampled
    uniform routings (each token k distinct experts) through the reference sort. The bound is 5
    standard errors, so a correct estimate fails about once in 1.7 million runs per case (3 would
    fail one CI run in ~70 across the five cases); a biased one shows at 2 000 samples."""
    counts = []
    for _ in range(2000):
        ids = np.argsort(rng.random((T, N)), axis=1)[:, :k].astype(np.int32)
        counts.append(len(R.moe_sort(ids, N)["tiles"]))
    mean, se = np.mean(counts), np.std(counts) / np.sqrt(len(counts))
    assert abs(R.expected_tiles(T, k, N) - mean) <= 5 * se + 1e-9, (R.expected_tiles(T, k, N), mean, se)
    assert R.expected_tiles(T, k, N) <= R.max_tiles(T * k, N)


# ----------------------------------------------------------------------------- routed MoE
def test_routed_moe_equals_dense(rng):
    E, F, N, k, limit = 256, 256, 8, 3, 10.0
    key = int(rng.integers(0, 2**31))
    gu = [W.gen_q4(key, e, 2 * F, E) for e in range(N)]
    dn = [W.gen_q4(key ^ 0x55, e, E, F) for e in range(N)]
    Wgu = np.stack([my_dequant_q4(t) for t in gu])  # [N, 2F, E]
    Wdn = np.stack([my_dequant_q4(t) for t in dn])  # [N, E, F]
    bank = lambda e: (gu[e], dn[e])  # noqa: E731
    for T in (1, 3):
        x = (rng.standard_normal((T, E)) * 3).astype(f32)
        ids = np.stack([rng.permutation(N)[:k] for _ in range(T)]).astype(np.int32)
        wts = rng.uniform(0.1, 1.0, size=(T, k))
        wts = (wts / wts.sum(1, keepdims=True)).astype(f32)
        got = R.routed_moe(bank, x, ids, wts, limit)
        assert got.dtype == f32 and got.shape == (T, E)
        # Dense: every expert on every token, gated by a dense [T, N] matrix of routing weights.
        G = np.zeros((T, N))
        for t in range(T):
            for j in range(k):
                G[t, ids[t, j]] += wts[t, j]
        xq, xd = my_q8k(x)
        xdq = xq * np.repeat(xd.astype(f64), 256, axis=1)  # [T, E]
        want = np.zeros((T, E))
        for t in range(T):
            for e in range(N):
                if G[t, e] == 0:
                    continue
                y = (Wgu[e] @ xdq[t]).astype(f32).astype(f64)
                g = np.minimum(y[:F], limit)
                u = np.clip(y[F:], -limit, limit)
                mid = (g / (1 + np.exp(-g)) * u).astype(f32)
                mq, md = my_q8k(mid[None])
                m = mq[0] * np.repeat(md[0].astype(f64), 256)
                want[t] += G[t, e] * (Wdn[e] @ m).astype(f32)
        assert rel(got, want) < 1e-5, T


def test_routed_moe_clamps_swiglu(rng):
    """With a tiny limit the SwiGLU clamp changes the result (the limit is really applied)."""
    E, F = 256, 256
    key = int(rng.integers(0, 2**31))
    gu, dn = W.gen_q4(key, 0, 2 * F, E), W.gen_q4(key, 1, E, F)
    x = (rng.standard_normal((1, E)) * 50).astype(f32)
    ids, wts = np.zeros((1, 1), np.int32), np.ones((1, 1), f32)
    a = R.routed_moe(lambda e: (gu, dn), x, ids, wts, 1e6)
    b = R.routed_moe(lambda e: (gu, dn), x, ids, wts, 0.05)
    assert rel(b, a) > 1e-2


# ----------------------------------------------------------------------------- hyper-connections
def test_hc_mix_partials_sum_to_logits(rng):
    S, E, nsplit = 4, 64, 16
    hn = rng.standard_normal((S, E)).astype(f32)
    wmix = rng.standard_normal(2 * S * S * E).astype(f32)
    part = R.hc_mix_partials(hn, wmix, nsplit)
    assert part.shape == (2 * S, nsplit) and part.dtype == f32
    Wm = wmix.astype(f64).reshape(2 * S, S * E)
    flat = hn.astype(f64).reshape(-1)
    chunk = S * E // nsplit
    want = np.array([[Wm[j, c * chunk:(c + 1) * chunk] @ flat[c * chunk:(c + 1) * chunk]
                      for c in range(nsplit)] for j in range(2 * S)])
    assert rel(part, want) < 1e-6
    lg = R.sum_partials(part)
    assert lg.dtype == f32 and lg.shape == (2 * S,)
    assert rel(lg, Wm @ flat) < 1e-6
    assert rel(R.hc_mix_logits(hn, wmix), Wm @ flat) < 1e-6


def test_mix_weights_premix_and_expand(rng):
    S, E, eps = 4, 32, 1e-6
    lg = rng.standard_normal(2 * S).astype(f32)
    h = rng.standard_normal((S, E)).astype(f32)
    wn = rng.uniform(0.5, 1.5, E).astype(f32)
    pre, post = R.mix_weights(lg)
    e = np.exp(lg[:S].astype(f64))
    assert np.allclose(pre, e / e.sum(), rtol=1e-12)
    assert np.allclose(post, 2 / (1 + np.exp(-lg[S:].astype(f64))), rtol=1e-12)
    mixed = sum(pre[s] * h[s].astype(f64) for s in range(S))
    want = mixed / np.sqrt(np.mean(mixed ** 2) + eps) * wn
    assert rel(R.hc_premix(h, lg, wn, eps), want) < 1e-6
    y = rng.standard_normal(E).astype(f32)
    extra = rng.standard_normal(E).astype(f32)
    got = R.expand(h, lg, y, extra)
    want = np.stack([h[s].astype(f64) + post[s] * (y.astype(f64) + extra) for s in range(S)])
    assert rel(got, want) < 1e-6


def test_swiglu_clamped(rng):
    g = (rng.standard_normal(512) * 20).astype(f32)
    u = (rng.standard_normal(512) * 20).astype(f32)
    lim = 7.0
    got = R.swiglu(g, u, lim)
    gg = np.minimum(g.astype(f64), lim)
    uu = np.clip(u.astype(f64), -lim, lim)
    assert rel(got, gg / (1 + np.exp(-gg)) * uu) < 1e-6
    assert np.abs(got).max() <= lim * lim * (1 + 1e-6)
