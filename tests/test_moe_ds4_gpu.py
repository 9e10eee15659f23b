"""ds4's routed-MoE kernels (``kernels/moe_ds4.cu``) on the GPU against the NumPy reference, on fresh
random inputs; whole tokens of every expert format against the ``numpy`` executor; every ladder stage
bit-identical to stage 0 with ds4's formats (whole tokens of every variant: ``test_token_gpu.py``).

Tolerances as ``test_kernels_gpu.py``: fp32 accumulation against a float64 reference, 2e-5 relative;
the Q8_K quantization of the GPU's own fp32 values is exact (the same float32 arithmetic); end to end
the middle's quantization may move a value by one step where the GPU's fp32 middle and the float64
one round apart (~1e-3 relative on the output).
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.capture.launch import Launcher
from ds4lab.token import ops
from ds4lab.token import reference as R
from ds4lab.token import weights as W
from ds4lab.token.config import EXPERT_FORMATS, get_preset
from ds4lab.token.model import DecodeModel, TokenOptions

pytestmark = pytest.mark.gpu

F32_RTOL = 2e-5
DS4_FORMATS = [f for f, (_, _, path) in EXPERT_FORMATS.items() if path == "ds4"]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "non-finite output (unwritten or overflow)"
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize("fmt", list(W.SUPERBLOCKS))
@pytest.mark.parametrize("rows,cols,subs", [(96, 512, 3), (33, 256, 1), (16, 4096, 2)])
def test_superblock_init_bit_identical(cupy_backend, numpy_backend, fmt, rows, cols, subs):
    """init_superblocks fills every byte as weights.gen_superblocks does (hash bytes, fp16 scales)."""
    spec = W.WeightSpec(f"test.{fmt}.{rows}x{cols}", fmt, rows, cols, subs=subs)
    g = cupy_backend.make_weight(spec)
    r = numpy_backend.make_weight(spec)
    for e in range(subs):
        ge = g[e] if subs > 1 else g
        re = r[e] if subs > 1 else r
        assert ge.d is None and ge.fmt == fmt
        assert np.array_equal(cupy_backend.to_host(ge.qs), re.qs)


# ----------------------------------------------------------------------------- Q8_K
@pytest.mark.parametrize("T,n", [(1, 4096), (3, 2048), (64, 4096), (6, 256)])
def test_q8k_quantize_exact(cupy_backend, numpy_backend, rng, T, n):
    """xq_quantize_q8k and moe_midq_q8k against ds4's arithmetic: quants, scales and sums of 16 bit for
    bit, with a block of zeros and blocks whose largest magnitude appears as +a and -a (the tree's
    tie rule decides the scale's sign)."""
    x = (rng.standard_normal((T, n)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    x[0, :256] = 0.0
    if n >= 1024:
        blk = x[-1, 256:512]
        a = np.float32(np.abs(blk).max() * 1.5)
        x[-1, 256 + 64], x[-1, 256 + 128] = -a, a  # the tree keeps +a (ds4.c's CPU loop would take -a)
        x[-1, 512 + 3], x[-1, 512 + 200] = a, -a
    out = {}
    for tag, be in (("gpu", cupy_backend), ("ref", numpy_backend)):
        L = Launcher(be)
        xb = be.from_host(x)
        bufs = [be.from_host(np.full(s, -1, dt)) for s, dt in (((T, n), np.int8), ((T, n // 256), np.float32),
                                                                 ((T, n // 16), np.int16))]
        bufs2 = [be.from_host(np.full(s, -1, dt)) for s, dt in (((T, n), np.int8), ((T, n // 256), np.float32),
                                                                  ((T, n // 16), np.int16))]
        ops.xq_quantize_q8k(L, "xq", xb, *bufs, T, n)
        ops.moe_midq_q8k(L, "midq", xb, *bufs2, T, get_preset("tiny", expert_ffn=n))
        be.synchronize()
        out[tag] = [be.to_host(b) for b in bufs + bufs2]
    for g, r in zip(out["gpu"], out["ref"]):
        assert np.array_equal(g.view(np.uint8), r.view(np.uint8))
    assert not out["gpu"][0][0, :256].any() and out["gpu"][1][0, 0] == 0
    if n >= 1024:
        assert out["gpu"][1][-1, 1] < 0  # +a kept: d = 1 / (-127 / a)


# ----------------------------------------------------------------------------- the four launches, stage by stage
@pytest.fixture
def memo_dequant(monkeypatch):
    """The reference's dequantization memoized per tensor for one test (an expert is dequantized once,
    not once per pair): the same values, far fewer seconds at ds4-flash widths."""
    cache, plain = {}, R.dequant

    def dequant(w):
        key = (id(w.qs), w.fmt)
        if key not in cache:
            cache[key] = (w, plain(w))
        return cache[key][1]

    monkeypatch.setattr(R, "dequant", dequant)


def _model(preset: str, fmt: str, be):
    cfg = get_preset(preset, expert_format=fmt, n_experts=32, max_tokens=64)
    return DecodeModel(cfg, be, TokenOptions(counts_clear="async"), n_layers=4)


def _expert(numpy_backend, cfg):
    bank = {k: numpy_backend.make_weight(s) for k, s in W.bank_specs(cfg, 0).items()}
    return lambda e: (bank["gate_up"][e], bank["down"][e])


@pytest.mark.parametrize("fmt", DS4_FORMATS)
@pytest.mark.parametrize("preset,T", [("small", 1), ("small", 3), ("small", 16), ("ds4-flash", 1), ("ds4-flash", 2)])
def test_routed_moe_stagewise(cupy_backend, numpy_backend, rng, memo_dequant, preset, fmt, T):
    """ds4's routed MoE on the GPU (four launches at one token; sort, tiled gate/up and down, and the
    sum at more), each stage against the reference computed from the GPU's own inputs to that stage,
    then the whole call against the all-reference result (ds4-flash widths: 4096 inputs, 2048 middle)."""
    m = _model(preset, fmt, cupy_backend)
    cfg, k = m.cfg, m.cfg.n_used
    P = T * k
    x = (rng.standard_normal((T, cfg.embed)) * 2).astype(np.float32)
    xb = cupy_backend.from_host(x)
    m.router(3, xb, T)
    m.L.trace = trace = []
    y = m.routed_moe(3, xb, T)
    m.L.trace = None
    cupy_backend.synchronize()
    names = [r.kernel for r in trace]
    gu, dn = cfg.expert_formats
    if T == 1:
        assert names == ["xq_quantize_q8k", f"moe_gateup_mid_{gu}", "moe_midq_q8k", f"moe_down_sum_{dn}"]
    else:
        assert names[-4:] == [f"moe_gateup_mid_tiled_{gu}", "moe_midq_q8k", f"moe_down_tiled_{dn}", "moe_sum_slots"]
    b = {n: cupy_backend.to_host(getattr(m.moe_buf, n)) for n in ("ids", "wts", "xq", "xd", "xb", "mid", "mq", "md",
                                                                  "mb", "out")}
    y = cupy_backend.to_host(y)[:T]
    expert = _expert(numpy_backend, cfg)
    ids, wts = b["ids"][:T], b["wts"][:T]
    assert all(len(set(r)) == k for r in ids)
    xq, xd, xs = R.quantize_q8k_ds4(x)
    assert np.array_equal(b["xq"][:T], xq) and np.array_equal(b["xd"][:T], xd) and np.array_equal(b["xb"][:T], xs)
    mid = np.stack([R.moe_gateup_mid(expert(int(e))[0], b["xq"][p // k], b["xd"][p // k], b["wts"].reshape(-1)[p],
                                     cfg.swiglu_limit) for p, e in enumerate(ids.reshape(-1))])
    assert rel(b["mid"][:P], mid) < F32_RTOL
    mq, md, ms = R.quantize_q8k_ds4(b["mid"][:P])  # the GPU's own middle: exact
    assert np.array_equal(b["mq"][:P], mq) and np.array_equal(b["md"][:P], md) and np.array_equal(b["mb"][:P], ms)
    for t in range(T):
        sl = slice(t * k, (t + 1) * k)
        want = R.moe_down_sum([expert(int(e))[1] for e in ids[t]], b["mq"][sl], b["md"][sl])
        if T == 1:
            assert rel(y[t], want) < F32_RTOL
        else:
            outs = [R.moe_down_sum([expert(int(e))[1]], b["mq"][p:p + 1], b["md"][p:p + 1])
                    for p, e in zip(range(t * k, (t + 1) * k), ids[t])]
            assert rel(b["out"][sl], np.stack(outs)) < F32_RTOL
            assert rel(y[t], b["out"][sl].astype(np.float64).sum(0)) < 1e-6
    full = R.moe_decode_ds4(expert, x, ids, wts, cfg.swiglu_limit, cfg.n_experts)
    assert rel(y, full) < 2e-3


@pytest.mark.parametrize("fmt", DS4_FORMATS)
def test_expert_outside_the_bank_adds_nothing(cupy_backend, numpy_backend, rng, fmt):
    """A pair whose expert id is outside the bank: the decode gate/up writes a zero middle, the down
    skips the slot; the reference agrees."""
    cfg = get_preset("small", expert_format=fmt, n_experts=32)
    k, E, F = cfg.n_used, cfg.embed, cfg.expert_ffn
    x = rng.standard_normal((1, E)).astype(np.float32)
    ids = rng.choice(cfg.n_experts, (1, k), replace=False).astype(np.int32)
    ids[0, 2] = cfg.n_experts + 5
    wts = rng.dirichlet(np.ones(k), 1).astype(np.float32)
    res = {}
    for tag, be in (("gpu", cupy_backend), ("ref", numpy_backend)):
        L = Launcher(be)
        bank = {kk: be.make_weight(s) for kk, s in W.bank_specs(cfg, 0).items()}
        grid = be.from_host(W.IQ2XXS_GRID)
        q, d, s = (be.from_host(a) for a in R.quantize_q8k_ds4(x))
        mid = be.from_host(np.full((k, F), np.nan, np.float32))
        mq, md, mb = (be.from_host(np.full(sh, -1, dt)) for sh, dt in (((k, F), np.int8), ((k, F // 256), np.float32),
                                                                        ((k, F // 16), np.int16)))
        y = be.from_host(np.full((1, E), np.nan, np.float32))
        idb, wb = be.from_host(ids), be.from_host(wts)
        ops.moe_gateup_mid(L, "g", bank["gate_up"], grid, q, d, s, idb, wb, mid, k, cfg)
        ops.moe_midq_q8k(L, "m", mid, mq, md, mb, k, cfg)
        ops.moe_down_sum(L, "d", bank["down"], mq, md, mb, idb, y, 1, cfg)
        be.synchronize()
        res[tag] = (be.to_host(mid), be.to_host(y))
    assert (res["gpu"][0][2] == 0).all()
    assert rel(res["gpu"][0], res["ref"][0]) < F32_RTOL
    assert rel(res["gpu"][1], res["ref"][1]) < 2e-3


# ----------------------------------------------------------------------------- ladder stages
# (Whole tokens of every preset variant against the numpy executor: tests/test_token_gpu.py.)
@pytest.mark.parametrize("preset", ["tiny", "small", "small-q4blk", pytest.param("ds4-flash-q4k", marks=pytest.mark.slow)])
def test_ladder_stages_bit_identical_to_stage0(cupy_backend, tmp_path, preset):
    """Every stage of the ladder (captured clusters, the whole token, parameter updates) gives stage 0's
    bits with ds4's four-launch routed MoE in every layer."""
    from ds4lab.jobs import execute
    from ds4lab.jobs.ladder import LadderConfig

    df = execute("ladder", LadderConfig(stages="0,0s,1,2,3,3u", preset=preset, tokens=6, warmup=1, exact_tokens=3,
                                        rounds=1, out=tmp_path), backend="cupy").table()
    assert df.exact.tolist() == [True] * 6, df[["stage", "exact"]]
