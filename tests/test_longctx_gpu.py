"""Every long-context kernel (kernels/longctx.cu) against its NumPy reference, on fresh random inputs.

Each op runs through its launch site (``ds4lab.token.ops``) on the ``cupy`` backend and on the
``numpy`` backend (which runs the reference, ``ds4lab.token.reference``) from the same host
data. Buffers a kernel only writes start poisoned (NaN / -1) so an unwritten element fails;
buffers it updates in place (compressor state, compressed cache) start from random rows, and
what must stay untouched is compared too. Tolerances: fp32 sums of at most a few thousand
terms against a float64 reference, 2e-5 relative; copies and selections must match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.token import reference as LR
from ds4lab.token import ops
from ds4lab.token import weights as W
from ds4lab.token.config import get_preset
from ds4lab.capture.launch import Launcher
from ds4lab.token.model import DecodeModel, TokenOptions

pytestmark = pytest.mark.gpu

from helpers import F32_RTOL, rel, token_rtol  # noqa: E402


class Both:
    """Runs one launch-site function on both backends. ``bufs``: name → host array (copied to
    each backend as it is: inputs and in-place buffers) or (shape, dtype) (poisoned output)."""

    def __init__(self, cb, nb):
        self.be = {"gpu": cb, "ref": nb}

    def run(self, fn, bufs: dict, scal=None):
        res = {}
        for tag, be in self.be.items():
            dev = {}
            for k, v in bufs.items():
                if isinstance(v, W.QTensor):
                    dev[k] = W.QTensor(v.fmt, v.rows, v.cols, be.from_host(v.qs), be.from_host(v.d))
                    continue
                if isinstance(v, tuple):
                    shape, dtype = v
                    v = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype=dtype)
                dev[k] = be.from_host(np.asarray(v))
            ts = None
            if scal is not None:  # (pos, cfg, device?): by value, or from a device buffer
                pos, cfg, device = scal
                v = ops.host_scalars(cfg, pos, 1)
                buf = be.from_host(v) if device else None
                ts = ops.TokenScalars(int(v[0]), int(v[1]), int(v[2]), int(v[3]), buf)
            fn(Launcher(be), dev, ts)
            be.synchronize()
            res[tag] = {k: be.to_host(dev[k]) for k in bufs if not isinstance(bufs[k], W.QTensor)}
        return res["gpu"], res["ref"]


@pytest.fixture(scope="module")
def both(cupy_backend, numpy_backend):
    return Both(cupy_backend, numpy_backend)


CFG = get_preset("small", long_context=True)
FLASH = get_preset("ds4-flash", long_context=True)


def f32(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


# ----------------------------------------------------------------------------- compressor
@pytest.mark.parametrize("ratio,D", [(4, 512), (128, 512), (4, 128), (128, 64)])
@pytest.mark.parametrize("device", [False, True])
def test_comp_store(both, rng, ratio, D, device):
    coff = 2 if ratio == 4 else 1
    width = coff * D
    pos = int(rng.integers(0, 100000))
    bufs = {"kvsc": f32(rng, 2 * width), "ape": f32(rng, ratio * width, scale=0.5),
            "skv": f32(rng, coff * ratio, width), "ssc": f32(rng, coff * ratio, width)}
    g, r = both.run(lambda L, b, ts: ops.comp_store(L, "s", b["kvsc"], b["ape"], b["skv"], b["ssc"], width, ratio, ts),
                    bufs, (pos, CFG, device))
    assert np.array_equal(g["skv"], r["skv"])
    np.testing.assert_allclose(g["ssc"], r["ssc"], rtol=1e-6)
    slot = LR.state_slot(pos, ratio)
    assert np.array_equal(np.delete(g["skv"], slot, 0), np.delete(bufs["skv"], slot, 0))  # other rows untouched


@pytest.mark.parametrize("ratio,D", [(4, 512), (128, 512), (4, 64), (128, 128)])
def test_comp_pool(both, rng, ratio, D):
    coff = 2 if ratio == 4 else 1
    sc = f32(rng, coff * ratio, coff * D, scale=3.0)
    if ratio == 128:
        sc[:, 5] = LR.NEG_INF  # an empty column pools to zero
    bufs = {"skv": f32(rng, coff * ratio, coff * D), "ssc": sc, "out": ((D,), np.float32)}
    g, r = both.run(lambda L, b, ts: ops.comp_pool(L, "p", b["skv"], b["ssc"], b["out"], D, ratio), bufs)
    assert rel(g["out"], r["out"]) < F32_RTOL
    if ratio == 128:
        assert g["out"][5] == 0.0


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("emit", [True, False])
def test_comp_rope_store(both, rng, ratio, emit):
    cfg = FLASH
    D = cfg.head_dim
    rows = 64
    pos = int(rng.integers(1, rows - 1)) * ratio + (ratio - 1 if emit else int(rng.integers(0, ratio - 1)))
    bufs = {"row": f32(rng, D), "comp": f32(rng, rows, D)}
    g, r = both.run(lambda L, b, ts: ops.comp_rope_store(L, "r", b["row"], b["comp"], D, ratio, cfg, ts), bufs,
                    (pos, cfg, True))
    assert rel(g["comp"], r["comp"]) < F32_RTOL
    changed = np.flatnonzero((g["comp"] != bufs["comp"]).any(axis=1))
    assert changed.tolist() == ([pos // ratio] if emit else [])


@pytest.mark.parametrize("emit", [True, False])
def test_comp_shift(both, rng, emit):
    width = 1024
    pos = 4 * int(rng.integers(1, 1000)) + (3 if emit else 1)
    bufs = {"skv": f32(rng, 8, width), "ssc": f32(rng, 8, width)}
    g, r = both.run(lambda L, b, ts: ops.comp_shift(L, "sh", b["skv"], b["ssc"], width, 4, ts), bufs,
                    (pos, CFG, False))
    assert np.array_equal(g["skv"], r["skv"]) and np.array_equal(g["ssc"], r["ssc"])
    assert np.array_equal(g["skv"][:4], bufs["skv"][4:] if emit else bufs["skv"][:4])


# ----------------------------------------------------------------------------- indexer
@pytest.mark.parametrize("rows,cols", [(8192, 1024), (64, 4096), (16, 256)])
@pytest.mark.parametrize("skip", [False, True])
def test_q8_matvec_when(both, rng, rows, cols, skip):
    """Stage 3c's predicated indexer projection: dense.cu's matvec, or nothing while n_comp <= min_comp."""
    k = 512
    n_comp = k - 3 if skip else k + 5
    pos = 4 * n_comp + 1
    bufs = {"w": W.gen_q8_0(int(rng.integers(2**32)), 0, rows, cols), "x": f32(rng, cols), "y": ((rows,), np.float32)}
    g, r = both.run(lambda L, b, ts: ops.q8_matvec_when(L, "m", b["w"], b["x"], b["y"], 4, k, ts), bufs,
                    (pos, CFG, True))
    if skip:
        assert np.isnan(g["y"]).all() and np.isnan(r["y"]).all()
    else:
        assert rel(g["y"], r["y"]) < F32_RTOL
        # stage 3c is bit-identical to stage 0 only if this equals dense.cu's q8_matvec to the bit
        plain, _ = both.run(lambda L, b, ts: ops.q8_matvec(L, "m", b["w"], b["x"], b["y"]), bufs)
        assert np.array_equal(g["y"].view(np.uint32), plain["y"].view(np.uint32))


def test_indexer_skips_while_every_row_is_attended(both, rng):
    """Stage 3c's min_comp: scores untouched and every chunk candidate -1 while n_comp <= top-k."""
    cfg = FLASH
    k = cfg.index_top_k
    n_comp = k - 1
    pos = 4 * n_comp + 1
    bufs = {"q": f32(rng, cfg.index_q_dim), "w": f32(rng, cfg.index_heads), "keys": f32(rng, 2048, cfg.index_head_dim),
            "scores": ((2048,), np.float32), "cand": ((4 * k,), np.int32)}

    def fn(L, b, ts):
        ops.indexer_score(L, "s", b["q"], b["w"], b["keys"], b["scores"], 64, cfg, 4, ts, min_comp=k)
        ops.indexer_topk_chunk(L, "c", b["scores"], b["cand"], 4, 8 * k, cfg, 4, ts, min_comp=k)

    g, r = both.run(fn, bufs, (pos, cfg, True))
    assert np.isnan(g["scores"]).all() and (g["cand"] == -1).all()
    assert np.array_equal(g["cand"], r["cand"])


@pytest.mark.parametrize("cfg", [FLASH, CFG], ids=["ds4-flash", "small"])
@pytest.mark.parametrize("n_comp", [5, 33, 1000, 3001])
def test_indexer_score(both, rng, cfg, n_comp):
    H, Di = cfg.index_heads, cfg.index_head_dim
    pos = 4 * n_comp + int(rng.integers(0, 3))  # (pos + 1) // 4 == n_comp
    cap = 4096
    blocks = ops.cdiv(min(cap, n_comp + 70), ops.INDEX_ROWS)  # more rows covered than exist
    bufs = {"q": f32(rng, H * Di), "w": f32(rng, H), "keys": f32(rng, cap, Di), "scores": ((cap,), np.float32)}
    g, r = both.run(lambda L, b, ts: ops.indexer_score(L, "sc", b["q"], b["w"], b["keys"], b["scores"], blocks, cfg, 4,
                                                       ts), bufs, (pos, cfg, True))
    assert rel(g["scores"][:n_comp], r["scores"][:n_comp]) < F32_RTOL
    assert np.isnan(g["scores"][n_comp:]).all()  # rows past n_comp untouched


@pytest.mark.parametrize("k,n_comp", [(512, 700), (512, 1024), (512, 1500), (512, 4096), (512, 8192),
                                      (64, 65), (64, 1000), (8, 9), (8, 100)])
@pytest.mark.parametrize("ties", [False, True, "nan"])
def test_indexer_topk_one_block(both, rng, k, n_comp, ties):
    """The one-block top-k in the score order (kernels/score_order.cuh): ties to the lower index,
    -0.0 equal to +0.0, NaN after every number."""
    cfg = FLASH.replace(index_top_k=k)
    steps, _ = LR.topk_plan(n_comp, k)
    assert len(steps) == 1 and steps[0].kernel == "indexer_topk"
    s = f32(rng, n_comp)
    if ties is True:
        s = np.round(s * 4) / 4  # many equal scores: ties go to the lower index
    elif ties == "nan":  # NaN scores and signed zeros among them
        for v, share in ((np.nan, 0.1), (-0.0, 0.1), (0.0, 0.1)):
            s[rng.random(n_comp) < share] = np.float32(v)
    pos = 4 * n_comp - 1  # (pos + 1) // 4 == n_comp
    bufs = {"scores": s, "sel": ((k,), np.int32)}
    g, r = both.run(lambda L, b, ts: ops.indexer_topk(L, "t", b["scores"], b["sel"], steps[0].sort_n, cfg, 4, ts),
                    bufs, (pos, cfg, False))
    assert np.array_equal(g["sel"], r["sel"])
    assert g["sel"].tolist() == LR.topk_select(s, k).tolist()


@pytest.mark.parametrize("k,n_comp", [(512, 8193), (512, 32768), (64, 1025), (64, 9 * 512 + 7), (8, 64 * 70)])
def test_indexer_topk_chunked(both, rng, k, n_comp):
    cfg = FLASH.replace(index_top_k=k)
    steps, words = LR.topk_plan(n_comp, k)
    assert steps[0].kernel == "indexer_topk_chunk"
    s = f32(rng, n_comp)
    pos = 4 * n_comp

    def fn(L, b, ts):
        for st in steps:
            if st.kernel == "indexer_topk_chunk":
                ops.indexer_topk_chunk(L, "c", b["scores"], b["scratch"], st.blocks, st.sort_n, cfg, 4, ts)
            else:
                final = st.dst_off < 0
                ops.indexer_topk_merge(L, "m", b["scores"], b["scratch"], st.src_off,
                                       b["sel"] if final else b["scratch"], 0 if final else st.dst_off,
                                       st.blocks, st.sets, st.sort_n, cfg)

    g, r = both.run(fn, {"scores": s, "scratch": ((words,), np.int32), "sel": ((k,), np.int32)}, (pos, cfg, True))
    assert np.array_equal(g["scratch"], r["scratch"])
    assert g["sel"].tolist() == LR.topk_select(s, k).tolist()


# ----------------------------------------------------------------------------- attention
@pytest.mark.parametrize("cfg", [FLASH, CFG], ids=["ds4-flash", "small"])
@pytest.mark.parametrize("ratio,pos,use_sel", [(4, 50, False), (4, 2000, False), (4, 65535, True),
                                               (4, 50, "device"), (4, 65535, "device"),
                                               (128, 100, False), (128, 131071, False)])
@pytest.mark.parametrize("device", [False, True])
def test_attention_comp(both, rng, cfg, ratio, pos, use_sel, device):
    if use_sel is True and LR.comp_count(pos, ratio) <= cfg.index_top_k:
        pytest.skip("fewer rows than top-k")
    n = LR.comp_count(pos, ratio)
    k = cfg.index_top_k
    H, D = cfg.n_heads, cfg.head_dim
    sel = np.full(k, -1, np.int32)  # (-1 past n_comp, as the top-k writes it: never read)
    sel[: min(n, k)] = rng.permutation(n)[:k]
    bufs = {"q": f32(rng, H, D), "cache": f32(rng, cfg.window, D), "comp": f32(rng, max(n, 1), D),
            "sel": sel, "o": ((H, D), np.float32)}
    g, r = both.run(lambda L, b, ts: ops.attention_comp(L, "a", b["q"], b["cache"], b["comp"],
                                                        b["sel"] if use_sel else None, b["o"], cfg, ratio, use_sel,
                                                        ts, n_rows=k if use_sel else n),
                    bufs, (pos, cfg, device))
    assert rel(g["o"], r["o"]) < F32_RTOL


# ----------------------------------------------------------------------------- the token
@pytest.mark.parametrize("scalars,longctx", [("value", "host"), ("device", "host"), ("device", "device")])
def test_long_context_token_matches_reference(cupy_backend, numpy_backend, scalars, longctx):
    """Tiny with 4 layers (ratio 4 and 128): tokens across emits and every top-k regime, with the
    launch decisions on the host (ds4) and on the device (stage 3c)."""
    cfg = get_preset("tiny", long_context=True, n_layers=4)
    opts = TokenOptions(scalars=scalars, vocab=True, longctx=longctx)
    tokens = [(3, 7), (66, 8), (67, 9), (127, 10), (300, 11), (600, 12), (3000, 13), (4095, 14)]
    g = DecodeModel(cfg, cupy_backend, opts)
    r = DecodeModel(cfg, numpy_backend, opts)
    for pos, tok in tokens:
        g.token(pos, tok)
        r.token(pos, tok)
        assert rel(g.hidden(), r.hidden()) < token_rtol(cfg), pos
        assert rel(g.output_logits(), r.output_logits()) < token_rtol(cfg), pos
    assert np.array_equal(cupy_backend.to_host(g.lc.sel), numpy_backend.to_host(r.lc.sel))


@pytest.mark.slow
def test_long_context_flash_partial_token(cupy_backend, numpy_backend):
    """ds4-flash dimensions, first 4 layers (both ratios), at 65 535 (emit of both ratios, sort16k)."""
    cfg = get_preset("ds4-flash", long_context=True, max_context=131072)
    opts = TokenOptions(scalars="device")
    g = DecodeModel(cfg, cupy_backend, opts, n_layers=4)
    r = DecodeModel(cfg, numpy_backend, opts, n_layers=4)
    for m in (g, r):
        m.token(65535, 77)
    assert rel(g.hidden(), r.hidden()) < token_rtol(cfg)


def test_indexer_topk_chunk_worst_case_grid(both, rng):
    """Stage 3c's worst-case grid: chunks past n_comp write -1 candidates without sorting, and the
    merges ignore them."""
    cfg = FLASH
    k, cap = cfg.index_top_k, cfg.comp_capacity(4)
    steps, words = LR.topk_plan(cap, k)
    n_comp = 5000
    s = f32(rng, cap)

    def fn(L, b, ts):
        for st in steps:
            if st.kernel == "indexer_topk_chunk":
                ops.indexer_topk_chunk(L, "c", b["scores"], b["scratch"], st.blocks, st.sort_n, cfg, 4, ts)
            else:
                final = st.dst_off < 0
                ops.indexer_topk_merge(L, "m", b["scores"], b["scratch"], st.src_off,
                                       b["sel"] if final else b["scratch"], 0 if final else st.dst_off,
                                       st.blocks, st.sets, st.sort_n, cfg)

    g, r = both.run(fn, {"scores": s, "scratch": ((words,), np.int32), "sel": ((k,), np.int32)},
                    (4 * n_comp, cfg, True))
    assert np.array_equal(g["scratch"], r["scratch"])
    assert g["sel"].tolist() == LR.topk_select(s[:n_comp], k).tolist()


# ----------------------------------------------------------------------------- hazards: GPU and sim agree
@pytest.mark.parametrize("mode", ["thread_local", "relaxed"])
@pytest.mark.parametrize("name", ["compressor-emit", "indexer-regime", "comp-row-by-value", "topk-alloc"])
def test_longctx_hazard_same_on_gpu_and_sim(cupy_backend, name, mode):
    from ds4lab.experiments.hazards import demonstrate
    from ds4lab.sim import SimBackend

    cfg = get_preset("tiny", n_layers=4)
    g = demonstrate(name, cupy_backend, cfg, mode=mode)
    s = demonstrate(name, SimBackend(seed=cfg.seed), cfg, mode=mode)
    for k in ("outcome", "errors", "exact", "first_mismatch", "exact_3c", "graphs_3c"):
        assert g[k] == s[k], (k, g[k], s[k])
