"""Every GPU kernel against its NumPy reference, on fresh random inputs.

Each op runs twice through the same launch site (``ds4lab.token.ops``): once on the ``cupy``
backend and once on the ``numpy`` backend (the reference), from the same host inputs, with
outputs poisoned (NaN / -1) before the launch so an unwritten element fails.
Tolerances: fp32 accumulation over at most a few thousand terms against a float64
reference lands near 1e-6 relative; we allow 2e-5. Integer stages (quantization, counts,
routing) must match exactly, except where a float32 SwiGLU rounding flip may move one
quantized value by one step (``midq``).
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.token import ops
from ds4lab.token import reference as R
from ds4lab.token import weights as W
from ds4lab.token.config import get_preset
from ds4lab.capture.launch import Launcher

pytestmark = pytest.mark.gpu

from helpers import (F32_RTOL, ROUTER_SEEDS, ROUTER_TIES_NODEID, derive_seed, rel,  # noqa: E402
                     router_tie_nan_logits)


class Both:
    """Runs one launch-site function on both backends from the same host data."""

    def __init__(self, cb, nb):
        self.be = {"gpu": cb, "ref": nb}

    def run(self, fn, inputs: dict, outputs: dict):
        res = {}
        for tag, be in self.be.items():
            bufs = {}
            for k, v in inputs.items():
                if isinstance(v, W.QTensor):
                    bufs[k] = W.QTensor(v.fmt, v.rows, v.cols, be.from_host(v.qs), be.from_host(v.d))
                else:
                    bufs[k] = be.from_host(np.asarray(v))
            for k, (shape, dtype) in outputs.items():
                init = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype=dtype)
                bufs[k] = be.from_host(init)
            fn(Launcher(be), bufs)
            be.synchronize()
            res[tag] = {k: be.to_host(bufs[k]) for k in outputs}
        return res["gpu"], res["ref"]


@pytest.fixture(scope="module")
def both(cupy_backend, numpy_backend):
    return Both(cupy_backend, numpy_backend)


def q8(rows, cols, rng):
    return W.gen_q8_0(int(rng.integers(2**32)), 0, rows, cols)


def q4_bank(n, rows, cols, rng):
    key = int(rng.integers(2**32))
    ts = [W.gen_q4(key, e, rows, cols) for e in range(n)]
    return W.QTensor("q4", rows, cols, np.stack([t.qs for t in ts]), np.stack([t.d for t in ts]))


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize("fmt,rows,cols,subs", [("q8_0", 96, 256, 1), ("q4", 64, 512, 3), ("f32", 1, 5000, 1)])
def test_weight_init_bit_identical(cupy_backend, numpy_backend, fmt, rows, cols, subs):
    spec = W.WeightSpec(f"test.{fmt}", fmt, rows, cols, subs=subs, scale=0.3, offset=0.5)
    g = cupy_backend.make_weight(spec)
    r = numpy_backend.make_weight(spec)
    if fmt == "f32":
        assert np.array_equal(cupy_backend.to_host(g), r)
        return
    for e in range(subs):
        ge = g[e] if subs > 1 else g
        re = r[e] if subs > 1 else r
        assert np.array_equal(cupy_backend.to_host(ge.qs), re.qs)
        assert np.array_equal(cupy_backend.to_host(ge.d).view(np.uint16), re.d.view(np.uint16))


# ----------------------------------------------------------------------------- dense
# Shapes cover every thread-group width of ops.q8_launch: 256 (1024x4096, 512x4096), 128
# (512x2048 grouped), 64 (2048x1024), 32 (8192x4096 grouped like o_a; 64x256, where a warp has
# more threads than the row has 16-byte chunks).
@pytest.mark.parametrize("rows,cols,groups", [(1024, 4096, None), (2048, 1024, None), (512, 2048, 4),
                                              (512, 4096, None), (8192, 4096, 8), (64, 256, None)])
def test_q8_matvec(both, rng, rows, cols, groups):
    w = q8(rows, cols, rng)
    n_in = cols * (groups or 1)
    x = rng.standard_normal(n_in).astype(np.float32)
    rpg = rows // groups if groups else None

    g, r = both.run(lambda L, b: ops.q8_matvec(L, "t", b["w"], b["x"], b["y"], rpg, cols if groups else 0),
                    {"w": w, "x": x}, {"y": ((rows,), np.float32)})
    assert rel(g["y"], r["y"]) < F32_RTOL


@pytest.mark.parametrize("rows,cols,groups,stage", [(1030, 256, None, True), (6, 512, None, True),
                                                     (96, 512, 6, True), (64, 16384, None, True),
                                                     (1024, 4096, 8, False)])
def test_q8_matvec_edges(both, rng, rows, cols, groups, stage, monkeypatch):
    """Rows not a multiple of a thread group's rows (the last group clamps), a grouped matvec whose
    groups do not align with the blocks (x read through L1), x too wide for shared memory, and x
    staging turned off."""
    monkeypatch.setattr(ops, "Q8_STAGE_X", stage)
    w = q8(rows, cols, rng)
    x = rng.standard_normal(cols * (groups or 1)).astype(np.float32)
    rpg = rows // groups if groups else None
    g, r = both.run(lambda L, b: ops.q8_matvec(L, "t", b["w"], b["x"], b["y"], rpg, cols if groups else 0),
                    {"w": w, "x": x}, {"y": ((rows,), np.float32)})
    assert rel(g["y"], r["y"]) < F32_RTOL


@pytest.mark.parametrize("F,E,S", [(1027, 512, 4), (2048, 4096, 4), (64, 8192, 2)])
def test_q8_swiglu_and_expand_edges(both, rng, F, E, S):
    """SwiGLU with an odd row count; expand with every stream count the epilogue's lanes cover."""
    wg = q8(2 * F, E, rng)
    x = (3 * rng.standard_normal(E)).astype(np.float32)
    g, r = both.run(lambda L, b: ops.q8_matvec_swiglu(L, "t", b["w"], b["x"], b["m"], 10.0),
                    {"w": wg, "x": x}, {"m": ((F,), np.float32)})
    assert rel(g["m"], r["m"]) < F32_RTOL
    C = -(-F // 32) * 32  # the down matrix's columns: Q8_0 blocks of 32
    wd = q8(E, C, rng)
    h0 = rng.standard_normal((S, E)).astype(np.float32)
    inputs = {"w": wd, "x": rng.standard_normal(C).astype(np.float32),
              "mix": rng.standard_normal(2 * S).astype(np.float32), "extra": rng.standard_normal(E).astype(np.float32)}

    def fn(L, b):
        b["h"][...] = L.backend.from_host(h0)
        ops.q8_matvec_expand(L, "t", b["w"], b["x"], b["h"], b["mix"], b["extra"], S)

    g, r = both.run(fn, inputs, {"h": ((S, E), np.float32)})
    assert rel(g["h"] - h0, r["h"] - h0) < F32_RTOL


def test_q8_matvec_swiglu(both, rng):
    F, E = 512, 1024
    w = q8(2 * F, E, rng)
    x = (3 * rng.standard_normal(E)).astype(np.float32)  # large enough that the clamp engages
    g, r = both.run(lambda L, b: ops.q8_matvec_swiglu(L, "t", b["w"], b["x"], b["m"], 1.0),
                    {"w": w, "x": x}, {"m": ((F,), np.float32)})
    assert rel(g["m"], r["m"]) < F32_RTOL


@pytest.mark.parametrize("C", [512, 4096])
@pytest.mark.parametrize("with_extra", [False, True])
def test_q8_matvec_expand(both, rng, with_extra, C):
    S, E = 4, 1024
    w = q8(E, C, rng)
    inputs = {"w": w, "x": rng.standard_normal(C).astype(np.float32),
              "mix": rng.standard_normal(2 * S).astype(np.float32),
              "extra": rng.standard_normal(E).astype(np.float32)}
    h0 = rng.standard_normal((S, E)).astype(np.float32)

    def fn(L, b):
        b["h"][...] = L.backend.from_host(h0)  # h starts from h0 on both backends
        ops.q8_matvec_expand(L, "t", b["w"], b["x"], b["h"], b["mix"], b["extra"] if with_extra else None, S)

    g, r = both.run(fn, inputs, {"h": ((S, E), np.float32)})
    assert rel(g["h"] - h0, r["h"] - h0) < F32_RTOL


@pytest.mark.parametrize("rows,dim", [(64, 512), (4, 4096), (1, 1024), (3, 1030), (2, 20000)])
@pytest.mark.parametrize("weighted", [False, True])
def test_rms_norm_rows(both, rng, weighted, rows, dim):
    """In-register path (dim % 4 == 0, at most 2 float4 per thread) and the plain loop (1030, 20000)."""
    x = (5 * rng.standard_normal((rows, dim))).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    g, r = both.run(lambda L, b: ops.rms_norm_rows(L, "t", b["x"], b["w"] if weighted else None, b["y"], rows, dim, 1e-6),
                    {"x": x, "w": w}, {"y": ((rows, dim), np.float32)})
    assert rel(g["y"], r["y"]) < F32_RTOL


@pytest.mark.parametrize("E", [4096, 8192])
def test_hc_mix_and_premix(both, rng, E):
    """E = 4096: one float4 per thread in registers; 8192: the plain loop."""
    S = 4
    nsplit = ops.HC_MIX_SPLIT
    hn = rng.standard_normal((S, E)).astype(np.float32)
    wmix = (rng.standard_normal(2 * S * S * E) / np.sqrt(S * E)).astype(np.float32)
    wn = rng.standard_normal(E).astype(np.float32)

    def fn(L, b):
        ops.hc_mix(L, "m", b["hn"], b["wmix"], b["part"], S, E)
        ops.hc_premix(L, "p", b["hn"], b["part"], b["lg"], b["wn"], b["x"], S, E, 1e-6)

    g, r = both.run(fn, {"hn": hn, "wmix": wmix, "wn": wn},
                    {"part": ((2 * S * nsplit,), np.float32), "lg": ((2 * S,), np.float32), "x": ((E,), np.float32)})
    assert rel(g["part"], r["part"]) < F32_RTOL
    # The logits against the unsplit float64 product: the split is an exact regrouping.
    assert rel(g["lg"], R.hc_mix_logits(hn, wmix)) < F32_RTOL
    assert rel(g["x"], r["x"]) < F32_RTOL


@pytest.mark.parametrize("S,E,nsplit,logits", [(4, 4096, 16, True), (6, 1030, 16, True), (4, 65536, 16, True),
                                                (4, 4096, 1, False), (4, 100, 3, True)])
def test_hc_premix_paths(both, rng, S, E, nsplit, logits):
    """Every path of the pre-mix: streams in registers (E = 4096, E = 100: fewer float4 than
    threads), the plain loop (S > 4, E not a multiple of 4, E wider than one float4 per thread),
    final logits passed in (the output mix: nsplit 1, no logits written)."""
    h = rng.standard_normal((S, E)).astype(np.float32)
    part = (0.3 * rng.standard_normal(2 * S * nsplit)).astype(np.float32)
    w = rng.standard_normal(E).astype(np.float32)

    def fn(L, b):
        ops.hc_premix(L, "t", b["h"], b["part"], b["lg"] if logits else None, b["w"], b["x"], S, E, 1e-6,
                      nsplit=nsplit)

    g, r = both.run(fn, {"h": h, "part": part, "w": w}, {"lg": ((2 * S,), np.float32), "x": ((E,), np.float32)})
    assert rel(g["x"], r["x"]) < F32_RTOL
    if logits:
        assert rel(g["lg"], r["lg"]) < F32_RTOL


@pytest.mark.parametrize("mode", ["value", "device"])
@pytest.mark.parametrize("pos", [5, 131_071])
def test_rope_kv_store_attention(both, rng, mode, pos):
    cfg = get_preset("ds4-flash")
    H, D = cfg.n_heads, cfg.head_dim
    hs = ops.host_scalars(cfg, pos, 17)
    inputs = {"q0": rng.standard_normal((H, D)).astype(np.float32),
              "kv": rng.standard_normal(D).astype(np.float32),
              "cache0": rng.standard_normal((cfg.window, D)).astype(np.float32), "scal": hs}

    def fn(L, b):
        ts = ops.TokenScalars(*map(int, hs), b["scal"] if mode == "device" else None)
        b["cache"][...] = b["cache0"]
        b["q"][...] = b["q0"]
        ops.rope_q(L, "rq", b["q"], cfg, ts)
        ops.rope_store_kv(L, "rk", b["kv"], b["cache"], cfg, ts)
        ops.attention_decode(L, "at", b["q"], b["cache"], b["o"], cfg, ts)

    g, r = both.run(fn, inputs, {"q": ((H, D), np.float32), "cache": ((cfg.window, D), np.float32),
                                 "o": ((H, D), np.float32)})
    assert rel(g["q"], r["q"]) < F32_RTOL
    assert rel(g["cache"], r["cache"]) < F32_RTOL
    assert rel(g["o"], r["o"]) < F32_RTOL


@pytest.mark.parametrize("preset,pos", [("tiny", 3), ("tiny", 40), ("small", 70), ("small", 1000),
                                        ("ds4-flash", 0), ("ds4-flash", 77), ("ds4-flash", 5000)])
def test_attention_split_combine(both, rng, preset, pos):
    """Split-over-keys attention at every window fill (empty splits, a partial split, a full
    window), three launches in a row: the same bits each time (the in-kernel combine has a fixed
    order, and the last block resets its ticket), the tickets back at zero."""
    cfg = get_preset(preset)
    H, D = cfg.n_heads, cfg.head_dim
    hs = ops.host_scalars(cfg, pos, 3)
    inputs = {"q": rng.standard_normal((H, D)).astype(np.float32),
              "cache": rng.standard_normal((cfg.window, D)).astype(np.float32), "scal": hs}
    tickets = {}

    def fn(L, b):
        ts = ops.TokenScalars(*map(int, hs), b["scal"])
        for name in ("o1", "o2", "o"):
            ops.attention_decode(L, "at", b["q"], b["cache"], b[name], cfg, ts)
        tickets[L.backend.name] = ops.attention_scratch(L, cfg)[2]

    out = {k: ((H, D), np.float32) for k in ("o1", "o2", "o")}
    g, r = both.run(fn, inputs, out)
    assert rel(g["o"], r["o"]) < F32_RTOL
    assert np.array_equal(g["o1"], g["o"]) and np.array_equal(g["o2"], g["o"])
    assert not both.be["gpu"].to_host(tickets["cupy"]).any()


@pytest.mark.parametrize("overrides,pos", [({"window": 1024}, 700), ({"window": 1024}, 5000),
                                           ({"head_dim": 1024}, 90), ({"n_heads": 10, "out_groups": 2}, 300)])
def test_attention_chunks_and_partial_head_groups(both, rng, overrides, pos):
    """Splits staged in several chunks (online softmax across them: a window of 1024, a head of
    1024), and a last head group with fewer than ATTN_HPB heads."""
    cfg = get_preset("small", **overrides)
    H, D = cfg.n_heads, cfg.head_dim
    hs = ops.host_scalars(cfg, pos, 3)
    inputs = {"q": rng.standard_normal((H, D)).astype(np.float32),
              "cache": rng.standard_normal((cfg.window, D)).astype(np.float32), "scal": hs}

    def fn(L, b):
        ts = ops.TokenScalars(*map(int, hs), b["scal"])
        ops.attention_decode(L, "at", b["q"], b["cache"], b["o"], cfg, ts)

    g, r = both.run(fn, inputs, {"o": ((H, D), np.float32)})
    assert rel(g["o"], r["o"]) < F32_RTOL


@pytest.mark.parametrize("mode", ["value", "device"])
def test_embed_token(both, mode):
    cfg = get_preset("small")
    hs = ops.host_scalars(cfg, 3, 8191)

    def fn(L, b):
        ts = ops.TokenScalars(*map(int, hs), b["scal"] if mode == "device" else None)
        ops.embed_token(L, "e", b["h"], cfg, W.tensor_key(cfg.seed, "embed"), ts)

    g, r = both.run(fn, {"scal": hs}, {"h": ((cfg.hc_streams, cfg.embed), np.float32)})
    assert np.array_equal(g["h"], r["h"])


# ----------------------------------------------------------------------------- router
@pytest.mark.parametrize("T", [1, 3, 512])
def test_router_topk(both, rng, T):
    cfg = get_preset("ds4-flash")
    N, E, k = cfg.n_experts, cfg.embed, cfg.n_used
    w = (rng.standard_normal(N * E) / np.sqrt(E)).astype(np.float32)
    x = rng.standard_normal((T, E)).astype(np.float32)

    def fn(L, b):
        ops.router_logits(L, "l", b["w"], b["x"], b["lg"], T, cfg)
        ops.router_topk(L, "k", b["lg"], b["ids"], b["wts"], T, cfg)

    g, r = both.run(fn, {"w": w, "x": x}, {"lg": ((T, N), np.float32), "ids": ((T, k), np.int32),
                                           "wts": ((T, k), np.float32)})
    assert rel(g["lg"], r["lg"]) < F32_RTOL
    # Selection from the GPU's own logits must be exact (ties to the lower index).
    ids_ref, w_ref = R.router_topk(g["lg"], k)
    assert np.array_equal(g["ids"], ids_ref)
    assert rel(g["wts"], w_ref) < F32_RTOL


def check_router_ties_and_nan(both, lg, N, k):
    """router_topk on ``lg [T, N]`` against the reference: ids exact (the score order,
    kernels/score_order.cuh), weights within F32_RTOL where no NaN logit was chosen."""
    T = lg.shape[0]
    cfg = get_preset("small").replace(n_experts=N, n_used=k)
    g, r = both.run(lambda L, b: ops.router_topk(L, "k", b["lg"], b["ids"], b["wts"], T, cfg),
                    {"lg": lg}, {"ids": ((T, k), np.int32), "wts": ((T, k), np.float32)})
    ids_ref, _ = R.router_topk(lg, k)
    assert np.array_equal(r["ids"], ids_ref)
    for t in range(T):
        assert np.array_equal(g["ids"][t], ids_ref[t]), (
            f"token {t}: first difference at pick {np.argmax(g['ids'][t] != ids_ref[t])}: "
            f"{g['ids'][t].tolist()} against {ids_ref[t].tolist()} (logits {lg[t].tolist()})")
    ok = ~np.isnan(r["wts"]).any(axis=1)
    assert rel(g["wts"][ok], r["wts"][ok]) < F32_RTOL


@pytest.mark.parametrize("N,k", [(256, 6), (1024, 8), (100, 32), (33, 1)])
def test_router_topk_ties_and_nan(both, rng, N, k):
    """One warp per token at every expert count (8 or 32 logits per lane): ties (-0.0 and +0.0
    included) go to the lower index, NaN ranks after every number, exact against the reference."""
    check_router_ties_and_nan(both, router_tie_nan_logits(rng, N), N, k)


@pytest.mark.parametrize("seed", ROUTER_SEEDS)
def test_router_topk_ties_and_nan_seeds(both, seed):
    """The 100-expert, k = 32 case from fixed base seeds, its inputs exactly as
    ``DS4LAB_TEST_SEED=<seed>`` gives test_router_topk_ties_and_nan[100-32] (the first seed ranked
    +0.0 before an earlier -0.0 once)."""
    rng = np.random.default_rng(derive_seed(seed, ROUTER_TIES_NODEID))
    check_router_ties_and_nan(both, router_tie_nan_logits(rng, 100), 100, 32)


@pytest.mark.parametrize("T", [1, 3, 64])
def test_router_hash(both, rng, T):
    cfg = get_preset("ds4-flash")
    N, k = cfg.n_experts, cfg.n_used
    lg = rng.standard_normal((T, N)).astype(np.float32)
    toks = rng.integers(0, cfg.vocab, T).astype(np.int32)
    hs = ops.host_scalars(cfg, 9, int(toks[0]))
    key = W.tensor_key(cfg.seed, "hash_route@1")

    def fn(L, b):
        if T == 1:
            ts = ops.TokenScalars(*map(int, hs), b["scal"])
            ops.router_hash(L, "h", b["lg"], b["ids"], b["wts"], 1, cfg, 1, key, ts=ts)
        else:
            ops.router_hash(L, "h", b["lg"], b["ids"], b["wts"], T, cfg, 1, key, token_ids=b["toks"])

    g, r = both.run(fn, {"lg": lg, "toks": toks, "scal": hs},
                    {"ids": ((T, k), np.int32), "wts": ((T, k), np.float32)})
    assert np.array_equal(g["ids"], r["ids"])
    assert all(len(set(row)) == k for row in g["ids"])
    assert rel(g["wts"], r["wts"]) < F32_RTOL


# ----------------------------------------------------------------------------- routed MoE
@pytest.mark.parametrize("T", [1, 2, 3, 64, 512])
def test_xq_quantize_exact(both, rng, T):
    E = 4096
    x = (rng.standard_normal((T, E)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    g, r = both.run(lambda L, b: ops.xq_quantize(L, "xq", b["x"], b["q"], b["d"], T, E),
                    {"x": x}, {"q": ((T, E), np.int8), "d": ((T, E // 256), np.float32)})
    assert np.array_equal(g["q"], r["q"])
    assert np.array_equal(g["d"], r["d"])


@pytest.mark.parametrize("T,skew", [(2, False), (3, False), (64, True), (512, False), (512, True)])
def test_moe_sort_stages(both, rng, T, skew):
    cfg = get_preset("ds4-flash")
    N, k = cfg.n_experts, cfg.n_used
    P = T * k
    if skew:  # every token to the same experts: worst case for tiles
        ids = np.tile(np.arange(k, dtype=np.int32), (T, 1))
    else:
        ids = np.stack([rng.choice(N, k, replace=False) for _ in range(T)]).astype(np.int32)
    mt = R.max_tiles(P, N)

    def fn(L, b):
        L.memset("c", b["counts"], 0)
        ops.moe_count(L, "n", b["ids"], b["counts"], P)
        ops.moe_prefix(L, "p", b["counts"], b["offsets"], b["cursor"], N)
        ops.moe_scatter(L, "s", b["ids"], b["cursor"], b["sorted"], P)
        ops.moe_tiles(L, "t", b["counts"], b["offsets"], b["tiles"], b["nt"], N)

    outs = {k_: ((N,), np.int32) for k_ in ("counts", "offsets", "cursor")}
    outs.update(sorted=((P,), np.int32), tiles=((mt, 3), np.int32), nt=((1,), np.int32))
    g, r = both.run(fn, {"ids": ids}, outs)
    ref = R.moe_sort(ids, N)
    for key in ("counts", "offsets"):
        assert np.array_equal(g[key], ref[key])
    assert g["nt"][0] == ref["n_tiles"][0]
    assert np.array_equal(g["tiles"][: g["nt"][0]], ref["tiles"])
    for e in range(N):  # same pairs per expert (order within an expert is the atomics')
        s = slice(ref["offsets"][e], ref["offsets"][e] + ref["counts"][e])
        assert sorted(g["sorted"][s]) == sorted(ref["sorted"][s])


@pytest.mark.parametrize("T", [1, 2, 3, 64, 512])
def test_routed_moe_stagewise(cupy_backend, numpy_backend, rng, T):
    """The routed MoE cluster (router included) on the GPU, each stage checked against the
    reference computed from the GPU's own inputs to that stage, so each tolerance fits one
    stage's arithmetic; then the whole cluster against the all-reference result."""
    from ds4lab.token.model import DecodeModel, TokenOptions

    cfg = get_preset("small-q4blk", max_tokens=512)  # ds4lab's five-launch path (ds4's: test_moe_ds4_gpu.py)
    k = cfg.n_used
    P = T * k
    x = rng.standard_normal((T, cfg.embed)).astype(np.float32)
    m = DecodeModel(cfg, cupy_backend, TokenOptions(counts_clear="async"), n_layers=4)
    xb = cupy_backend.from_host(x)
    m.router(3, xb, T)
    y = m.routed_moe(3, xb, T)
    cupy_backend.synchronize()
    b = {name: cupy_backend.to_host(getattr(m.moe_buf, name))
         for name in ("logits", "ids", "wts", "xq", "xd", "gate", "up", "mq", "md", "out")}
    y = cupy_backend.to_host(y)[:T]
    bank = numpy_backend.make_weight(W.bank_specs(cfg, 0)["gate_up"]), numpy_backend.make_weight(W.bank_specs(cfg, 0)["down"])
    expert = lambda e: (bank[0][e], bank[1][e])  # noqa: E731

    ids, wts = R.router_topk(b["logits"][:T], k)
    assert np.array_equal(b["ids"][:T], ids)
    assert rel(b["wts"][:T], wts) < F32_RTOL
    xq, xd = R.quantize_q8k(x)
    assert np.array_equal(b["xq"][:T], xq) and np.array_equal(b["xd"][:T], xd)
    gate, up = R.moe_gateup(expert, ids, xq, xd)
    assert rel(b["gate"][:P], gate) < F32_RTOL and rel(b["up"][:P], up) < F32_RTOL
    mq, md = R.moe_midq(b["gate"][:P], b["up"][:P], cfg.swiglu_limit)
    # fp32 SwiGLU vs float64: a value on a rounding boundary may land one step away.
    dq = np.abs(b["mq"][:P].astype(int) - mq.astype(int))
    assert dq.max() <= 1 and (dq > 0).mean() < 1e-3
    assert rel(b["md"][:P], md) < 1e-6
    out = R.moe_down(expert, ids, b["mq"][:P], b["md"][:P])
    assert rel(b["out"][:P], out) < F32_RTOL
    assert rel(y, R.moe_sum(b["out"][:P], b["wts"][:T])) < F32_RTOL
    # End to end: the midq flips above move the output by up to ~1e-3 relative.
    assert rel(y, R.routed_moe(expert, x, ids, wts, cfg.swiglu_limit)) < 2e-3
