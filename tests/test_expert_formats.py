"""ds4's routed-expert formats and decode MoE on the CPU.

Hand-built blocks checked against values worked out from the published definitions (ggml's
``block_q4_K``, ``block_q2_K``, ``block_iq2_xxs``, the IQ2 grid and sign tables, ``quantize_row_q8_K``
as ds4's CUDA kernel runs it); the vectorized dequantization against a loop transcription of those
definitions; the seeded generator against its own specification; ds4's routed MoE reference against a
straightforward dequantize-then-matmul in float64; the launch sites' geometry, bytes and modeled cost;
whole tokens of every expert format on the ``numpy`` and ``sim`` backends.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ds4lab.executor.numpy_backend import NumpyBackend
from ds4lab.moeprof.rows import kernel_stage
from ds4lab.sim.backend import SimBackend
from ds4lab.sim.costmodel import Calibration, stand_in
from ds4lab.timing import token_bytes
from ds4lab.token import ops
from ds4lab.token import reference as R
from ds4lab.token import weights as W
from ds4lab.token.config import EXPERT_FORMATS, PRESETS, ConfigError, get_preset, is_ds4_flash
from ds4lab.token.model import DecodeModel, TokenOptions

DS4_FORMATS = [f for f, (_, _, path) in EXPERT_FORMATS.items() if path == "ds4"]


def f16(v: float) -> list[int]:
    """Little-endian bytes of an fp16 value."""
    return list(np.float16(v).tobytes())


def block(fmt: str, fields: dict[int, list[int]]) -> np.ndarray:
    """One zero super-block of ``fmt`` with ``fields`` (byte offset -> bytes) written in."""
    b = np.zeros(W.SUPERBLOCKS[fmt].nbytes, np.uint8)
    for off, v in fields.items():
        b[off:off + len(v)] = v
    return b[None]


# ----------------------------------------------------------------------------- hand-checked blocks
def test_q4_k_hand_block():
    """d = 1, dmin = 0.5; sub-block 0: scale 3, min 5 (bytes 0 and 4, low 6 bits); sub-block 4:
    scale 18 = 2 | 1 << 4 (byte 8's low nibble, byte 0's top bits), min 39 = 7 | 2 << 4 (byte 8's high
    nibble, byte 4's top bits); quant byte 0 = 0xA7 (weight 0: 7, weight 32: 10), byte 64 = 0x0C
    (weight 128: 12)."""
    scales = [0x43, 0, 0, 0, 0x85, 0, 0, 0, 0x72, 0, 0, 0]
    qs = [0] * 128
    qs[0], qs[64] = 0xA7, 0x0C
    b = block("q4_k", {0: f16(1.0), 2: f16(0.5), 4: scales, 16: qs})
    sc, m = R.q4_k_scale_min(b[:, 4:16])
    assert sc[0].tolist() == [3, 0, 0, 0, 18, 0, 0, 0] and m[0].tolist() == [5, 0, 0, 0, 39, 0, 0, 0]
    w = R.dequant_superblocks("q4_k", b)[0]
    assert w[0] == 3 * 7 - 0.5 * 5 == 18.5
    assert w[1] == -2.5  # q = 0: only the min
    assert w[32] == 0.0  # sub-block 1: scale 0, min 0
    assert w[128] == 18 * 12 - 0.5 * 39 == 196.5
    assert w[129] == -19.5
    assert np.count_nonzero(w) == 64  # sub-blocks 0 and 4 carry a min


def test_q2_k_hand_block():
    """d = 2, dmin = 1; scale bytes: 0 = 0x31 (scale 1, min 3), 1 = 0x02, 2 = 0x4F (15, 4), 4 = 0x11,
    9 = 0x15 (5, 1); quant byte 0 = 0b11100100 (2 bits per shift step: 0, 1, 2, 3), byte 16 = 3,
    byte 49 = 2 (second half, l = 17)."""
    scales = [0] * 16
    scales[0], scales[1], scales[2], scales[4], scales[9] = 0x31, 0x02, 0x4F, 0x11, 0x15
    qs = [0] * 64
    qs[0], qs[16], qs[49] = 0b11100100, 3, 2
    w = R.dequant_superblocks("q2_k", block("q2_k", {0: scales, 16: qs, 80: f16(2.0), 82: f16(1.0)}))[0]
    assert w[0] == 2 * 1 * 0 - 3 == -3.0
    assert w[1] == -3.0
    assert w[16] == 2 * 2 * 3 - 0 == 12.0  # l = 16: the second scale of the pair
    assert w[32] == 2 * 15 * 1 - 4 == 26.0  # shift step 1, scale byte 2
    assert w[64] == 2 * 1 * 2 - 1 == 3.0  # shift step 2, scale byte 4
    assert w[96] == 0.0  # shift step 3: quant 3, scale byte 6 = 0
    assert w[145] == 2 * 5 * 2 - 1 == 19.0  # half 1, l = 17: quant byte 49, scale byte 9


def test_iq2_xxs_hand_block():
    """d = 1; sub-block 0: grid indices (1, 0, 255, 0), sign indices (1, 0, 127, 0), scale 3, so
    every weight is 0.875 x grid x sign; the other sub-blocks are zero bytes: grid 0 (all 8), no sign,
    scale 0 -> 0.125 x 8 = 1."""
    aux1 = 1 | (0 << 7) | (127 << 14) | (0 << 21) | (3 << 28)
    qs = [1, 0, 255, 0] + list(np.uint32(aux1).tobytes())
    w = R.dequant_superblocks("iq2_xxs", block("iq2_xxs", {0: f16(1.0), 2: qs}))[0]
    # grid[1] = 0x080808080808082b: byte 0 is 43; sign byte of index 1 is 0x81 (bits 0 and 7).
    assert w[:8].tolist() == [-0.875 * 43] + [7.0] * 6 + [-7.0]
    assert w[8:16].tolist() == [7.0] * 8
    # grid[255] = 0x2b2b2b1908081908: bytes 8, 25, 8, 8, 25, 43, 43, 43; sign index 127: 7 bits set, the
    # parity bit too: all eight negated.
    assert w[16:24].tolist() == [-0.875 * g for g in (8, 25, 8, 8, 25, 43, 43, 43)]
    assert w[24:32].tolist() == [7.0] * 8
    assert (w[32:] == 1.0).all()


def test_iq2_tables_as_published():
    """ggml's ksigns_iq2xs (first 16 entries as published) is index | parity << 7; the grid's
    entries quoted from ggml-common.h; every grid byte is 8, 25 or 43; 256 distinct points."""
    assert W.iq2_sign_byte(np.arange(16)).tolist() == [0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141,
                                                        142, 15]
    s = W.iq2_sign_byte(np.arange(128)).astype(int)
    assert all(bin(v).count("1") % 2 == 0 for v in s) and (s & 127).tolist() == list(range(128))
    assert [int(W.IQ2XXS_GRID[i]) for i in (0, 1, 2, 255)] == [0x0808080808080808, 0x080808080808082b,
                                                               0x0808080808081919, 0x2b2b2b1908081908]
    assert set(W.IQ2XXS_GRID.view(np.uint8).tolist()) == {8, 25, 43}
    assert len(set(W.IQ2XXS_GRID.tolist())) == 256


# ----------------------------------------------------------------------------- dequantization
def _f16v(b, off) -> float:
    return float(np.frombuffer(bytes(b[off:off + 2]), np.float16)[0])


#: The IQ2_XXS grid points as lists of 8 magnitudes (byte j of the little-endian uint64).
GRID_BYTES = [[(int(g) >> (8 * j)) & 0xFF for j in range(8)] for g in W.IQ2XXS_GRID]


def loop_dequant(fmt: str, b: np.ndarray) -> list[float]:
    """One block, transcribed from ggml's dequantize_row_q4_K / _q2_K / _iq2_xxs loops."""
    b = [int(v) for v in b]
    y = []
    if fmt == "q4_k":
        d, mn, sc, q = _f16v(b, 0), _f16v(b, 2), b[4:16], b[16:]

        def scale_min(j):
            if j < 4:
                return sc[j] & 63, sc[j + 4] & 63
            return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)

        for g in range(4):
            s1, m1 = scale_min(2 * g)
            s2, m2 = scale_min(2 * g + 1)
            y += [d * s1 * (q[32 * g + l] & 0xF) - mn * m1 for l in range(32)]
            y += [d * s2 * (q[32 * g + l] >> 4) - mn * m2 for l in range(32)]
    elif fmt == "q2_k":
        sc, q, d, mn = b[0:16], b[16:80], _f16v(b, 80), _f16v(b, 82)
        i = 0
        for n in range(2):
            for shift in (0, 2, 4, 6):
                for half in range(2):
                    s = sc[i]
                    i += 1
                    y += [d * (s & 0xF) * ((q[32 * n + 16 * half + l] >> shift) & 3) - mn * (s >> 4) for l in range(16)]
    else:
        d, grid = _f16v(b, 0), GRID_BYTES
        for ib in range(8):
            a0 = int.from_bytes(bytes(b[2 + 8 * ib: 6 + 8 * ib]), "little")
            a1 = int.from_bytes(bytes(b[6 + 8 * ib: 10 + 8 * ib]), "little")
            db = d * (0.5 + (a1 >> 28)) * 0.25
            for l in range(4):
                idx = (a1 >> (7 * l)) & 127
                signs = idx | ((bin(idx).count("1") & 1) << 7)
                g = grid[(a0 >> (8 * l)) & 0xFF]
                y += [db * g[j] * (-1.0 if signs & (1 << j) else 1.0) for j in range(8)]
    return y


@pytest.mark.parametrize("fmt", list(W.SUPERBLOCKS))
def test_dequant_matches_published_loops(fmt, rng):
    t = W.gen_superblocks(fmt, int(rng.integers(2**32)), int(rng.integers(256)), 3, 512)
    blocks = t.qs.reshape(-1, W.SUPERBLOCKS[fmt].nbytes)
    want = np.array([loop_dequant(fmt, b) for b in blocks])
    np.testing.assert_allclose(R.dequant_superblocks(fmt, blocks), want, rtol=1e-14, atol=0)
    np.testing.assert_allclose(R.dequant(t), want.reshape(3, 512), rtol=1e-14, atol=0)
    # A stack dequantizes expert by expert.
    bank = W.QTensor(fmt, 3, 512, np.stack([t.qs, t.qs]), None)
    assert np.array_equal(R.dequant(bank)[1], R.dequant(t))


def test_dequant_refuses_wrong_block_width():
    with pytest.raises(ValueError, match="q2_k"):
        R.dequant_superblocks("q2_k", np.zeros((2, 66), np.uint8))


# ----------------------------------------------------------------------------- generation
@pytest.mark.parametrize("fmt", list(W.SUPERBLOCKS))
def test_generation_follows_its_specification(fmt, rng):
    key, sub, rows, cols = int(rng.integers(2**32)), int(rng.integers(1000)), 4, 768
    t = W.gen_superblocks(fmt, key, sub, rows, cols)
    f = W.SUPERBLOCKS[fmt]
    assert t.d is None and t.qs.dtype == np.uint8 and t.qs.shape == (rows, cols // 256 * f.nbytes)
    assert t.nbytes == W.spec_bytes(W.WeightSpec("x", fmt, rows, cols)) == rows * cols * f.nbytes // 256
    b = t.qs.reshape(-1, f.nbytes)
    hb = (W.element_hash(key, sub, np.arange(b.size, dtype=np.uint32)) >> np.uint32(24)).astype(np.uint8)
    hb = hb.reshape(b.shape)
    in_field = np.zeros(f.nbytes, bool)
    for off, mean, salt in W.superblock_fields(fmt, cols):
        in_field[off:off + 2] = True
        u = W.unit_float(W.element_hash(key ^ salt, sub, np.arange(b.shape[0], dtype=np.uint32)))
        want = (mean * (np.float32(0.75) + np.float32(0.5) * u)).astype(np.float16)
        got = np.ascontiguousarray(b[:, off:off + 2]).view(np.float16)[:, 0]
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        assert np.isfinite(got).all() and (got > 0).all()
    assert np.array_equal(b[:, ~in_field], hb[:, ~in_field])
    assert np.array_equal(W.gen_superblocks(fmt, key, sub, rows, cols).qs, t.qs)
    assert not np.array_equal(W.gen_superblocks(fmt, key, sub + 1, rows, cols).qs, t.qs)


@pytest.mark.parametrize("fmt", list(W.SUPERBLOCKS))
def test_generated_weights_are_zero_mean_with_unit_scaled_std(fmt):
    """The scale fields' means give weights of std about 1/sqrt(cols) and mean about 0, as the other
    formats' (so 43 layers keep the hidden state finite)."""
    cols = 2048
    w = R.dequant(W.gen_superblocks(fmt, 4321, 7, 256, cols)) * math.sqrt(cols)
    assert abs(w.std() - 1.0) < 0.05 and abs(w.mean()) < 0.05


def test_generation_refuses_partial_blocks():
    with pytest.raises(ValueError, match="cols=300"):
        W.gen_superblocks("q4_k", 1, 0, 2, 300)
    with pytest.raises(ValueError, match="q9_k"):
        W.gen_superblocks("q9_k", 1, 0, 2, 256)


# ----------------------------------------------------------------------------- Q8_K as ds4 quantizes
def test_q8k_ds4_hand_block():
    """Largest magnitude 127 (positive): iscale = -1, so q = rint(-x) with ties to even and d = -1."""
    x = np.zeros((1, 256), np.float32)
    x[0, :6] = [127.0, 2.5, 3.5, -0.5, -126.4, 1.5]
    q, d, bs = R.quantize_q8k_ds4(x)
    assert q[0, :6].tolist() == [-127, -2, -4, 0, 126, -2]
    assert d.tolist() == [[-1.0]]
    assert bs[0, 0] == sum(q[0, :16].tolist()) == -9 and (bs[0, 1:] == 0).all()
    assert bs.dtype == np.int16 and q.dtype == np.int8 and d.dtype == np.float32


def test_q8k_ds4_tie_follows_the_cuda_tree():
    """+a at 128 and -a at 64: the tree's stride-128 step moves +a to position 0, which then keeps it
    against -a (not strictly larger). ds4.c's CPU quantizer (first largest) would take -a."""
    x = np.zeros((1, 256), np.float32)
    x[0, 64], x[0, 128] = -3.0, 3.0
    q, d, _ = R.quantize_q8k_ds4(x)
    assert d[0, 0] < 0 and q[0, 128] == -127 and q[0, 64] == 127


def test_q8k_ds4_zero_block_and_round_trip(rng):
    x = (rng.standard_normal((3, 512)) * rng.uniform(0.1, 10, (3, 1))).astype(np.float32)
    x[1, 256:] = 0.0
    q, d, bs = R.quantize_q8k_ds4(x)
    assert d[1, 1] == 0 and not q[1, 256:].any() and not bs[1, 16:].any()
    err = np.abs(R.dequant_q8k(q, d) - x)
    assert (err <= np.repeat(np.abs(d), 256, axis=1) / 2 + 1e-6).all()
    assert np.array_equal(bs, q.reshape(3, 32, 16).astype(np.int64).sum(-1))
    assert (np.abs(q).max(axis=1) == 127).all()


# ----------------------------------------------------------------------------- ds4's routed MoE reference
def straight_moe(cfg, bank, x, ids, wts):
    """ds4's decode MoE written out: loop dequantization, Q8_K by the tree, float64 matmuls."""

    cache = {}

    def deq(t):
        if id(t.qs) not in cache:
            blocks = t.qs.reshape(-1, W.SUPERBLOCKS[t.fmt].nbytes)
            cache[id(t.qs)] = (t, np.array([loop_dequant(t.fmt, b) for b in blocks]).reshape(t.rows, t.cols))
        return cache[id(t.qs)][1]

    xq, xd, _ = R.quantize_q8k_ds4(x)
    T, k = ids.shape
    F, lim = cfg.expert_ffn, cfg.swiglu_limit
    mid = np.zeros((T * k, F), np.float32)
    for p in range(T * k):
        e = int(ids.reshape(-1)[p])
        if not 0 <= e < cfg.n_experts:
            continue
        h = deq(bank["gate_up"][e]) @ (xq[p // k].astype(np.float64) * np.repeat(xd[p // k], 256))
        g, u = np.minimum(h[:F], lim), np.clip(h[F:], -lim, lim)
        mid[p] = (g / (1.0 + np.exp(-g)) * u * float(wts.reshape(-1)[p])).astype(np.float32)
    mq, md, _ = R.quantize_q8k_ds4(mid)
    y = np.zeros((T, cfg.embed))
    for p in range(T * k):
        e = int(ids.reshape(-1)[p])
        if 0 <= e < cfg.n_experts:
            y[p // k] += deq(bank["down"][e]) @ (mq[p].astype(np.float64) * np.repeat(md[p], 256))
    return y


@pytest.mark.parametrize("fmt", DS4_FORMATS)
def test_moe_decode_reference_against_straightforward(fmt, rng):
    cfg = get_preset("tiny", expert_format=fmt)
    be = NumpyBackend(seed=int(rng.integers(2**31)))
    bank = {k: be.make_weight(s) for k, s in W.bank_specs(cfg, 0).items()}
    T, k = 2, cfg.n_used
    x = (rng.standard_normal((T, cfg.embed)) * 3).astype(np.float32)  # the clamp engages
    ids = np.stack([rng.choice(cfg.n_experts, k, replace=False) for _ in range(T)]).astype(np.int32)
    ids[1, 2] = cfg.n_experts + 3  # outside the bank: adds nothing
    wts = rng.dirichlet(np.ones(k), T).astype(np.float32)
    got = R.moe_decode_ds4(lambda e: (bank["gate_up"][e], bank["down"][e]), x, ids, wts, cfg.swiglu_limit,
                           cfg.n_experts)
    want = straight_moe(cfg, bank, x, ids, wts)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-6


# ----------------------------------------------------------------------------- launch sites
def _moe_records(preset: str):
    """The routed-MoE launch records of one ds4-flash-sized decode token (sim, timing only)."""
    be = SimBackend(timing_only=True)
    m = DecodeModel(get_preset(preset), be, TokenOptions(), n_layers=4)
    with m.L.recording() as rec:
        m.token(1000, 5)
    return [r for r in rec if r.cluster == "moe" and r.layer == 3], m


def test_ds4_flash_moe_launches():
    """Four launches; grids of one wave (768 gate/up blocks of 16 row pairs, 512 down blocks of 8 rows);
    the bytes the roofline charges are the six experts' weights in their formats plus activations."""
    recs, m = _moe_records("ds4-flash")
    assert [r.kernel for r in recs] == ["xq_quantize_q8k", "moe_gateup_mid_iq2_xxs", "moe_midq_q8k",
                                        "moe_down_sum_q2_k"]
    xq, gu, mq, dn = recs
    assert xq.grid == (16, 1) and mq.grid == (8, 6)
    assert gu.grid == (2048 // 16, 6) and gu.shared == 2 * 16 * 16 * 66 + 256 * 8
    assert dn.grid == (4096 // 8, 1) and dn.shared == 6 * 8 * 8 * 84 + 4 * 6 * 8
    gate_up_expert, down_expert = 2 * 2048 * 4096 * 66 // 256, 4096 * 2048 * 84 // 256
    assert 6 * gate_up_expert < gu.nbytes < 6 * gate_up_expert * 1.01
    assert 6 * down_expert < dn.nbytes < 6 * down_expert * 1.01
    assert all(r.shared <= ops.DS4_SMEM_MAX for r in recs)


def test_ds4_flash_q4k_moe_launches():
    recs, _ = _moe_records("ds4-flash-q4k")
    assert [r.kernel for r in recs] == ["xq_quantize_q8k", "moe_gateup_mid_q4_k", "moe_midq_q8k", "moe_down_sum_q4_k"]
    gu, dn = recs[1], recs[3]
    assert gu.grid == (2048 // 8, 6) and gu.shared == 2 * 8 * 16 * 144
    assert dn.grid == (4096 // 4, 1) and dn.shared == 6 * 4 * 8 * 144 + 4 * 6 * 4


def test_ds4_rows_refuses_a_row_too_wide():
    assert ops.ds4_rows("t", 256, 66, 2) == (16, 2 * 16 * 66)
    assert ops.ds4_rows("t", 256, 84, 1)[0] == 16
    assert ops.ds4_rows("t", 256, 84 * 3, 1)[0] == 16  # 16 x 252 bytes: whole 16-byte chunks
    with pytest.raises(ValueError, match="row bytes=40000"):
        ops.ds4_rows("gate/up", 256, 40000, 2)


def test_gateup_site_refuses_a_format_without_kernels():
    be = NumpyBackend()
    cfg = get_preset("tiny", expert_format="q4blk")
    bank = be.make_weight(W.bank_specs(cfg, 0)["gate_up"])
    with pytest.raises(ValueError, match="'q4'"):
        ops.moe_gateup_mid(None, "g", bank, None, None, None, None, None, None, None, 6, cfg)


def test_new_kernels_have_a_stage_and_a_modeled_cost():
    """Trace records map the new kernels to ds4's profile stages. The shipped calibration carries the
    H200 fits of the decode kernels (docs/measurements/h200-2026-12-01-moe-ds4) and prices the tiled
    ones, not measured yet, with the fit of the kernel each stands in for."""
    cal = Calibration.load()
    measured = {"xq_quantize_q8k": "xq", "moe_gateup_mid_iq2_xxs": "gateup", "moe_gateup_mid_q4_k": "gateup",
                "moe_midq_q8k": "midq", "moe_down_sum_q2_k": "down", "moe_down_sum_q4_k": "down"}
    standing_in = {"moe_gateup_mid_tiled_iq2_xxs": "gateup", "moe_gateup_mid_tiled_q4_k": "gateup",
                   "moe_down_tiled_q2_k": "down", "moe_down_tiled_q4_k": "down", "moe_sum_slots": "sum"}
    for name, stage in {**measured, **standing_in}.items():
        assert kernel_stage(name) == stage and stand_in(name) in cal.kernels
    for name in measured:
        fit = cal.kernels[name]
        assert "h200-2026-12-01-moe-ds4" in fit["source"] and fit["samples"] >= 43
    # ds4-flash's IQ2_XXS gate/up (26.0 MB a launch) as measured: ~27 us, not the earlier kernel's ~11.
    assert cal.kernel_us("moe_gateup_mid_iq2_xxs", 26029488) == pytest.approx(27.4, abs=0.5)
    for name in standing_in:
        assert name not in cal.kernels
        assert cal.kernel_us(name, 10**7) == cal.kernel_us(stand_in(name), 10**7)
    assert stand_in("q8_matvec") is None
    general = cal.kernel_fixed_us + 10**7 / (cal.bandwidth_GBps * 1e3)
    assert cal.kernel_us("init_superblocks", 10**7) == pytest.approx(general)


def test_bytes_floor_follows_the_format():
    fl = {p: token_bytes(get_preset(p), vocab=False)["routed_experts"] for p in
          ("ds4-flash", "ds4-flash-q4k", "ds4-flash-q4blk")}
    E, F = 4096, 2048
    assert fl["ds4-flash"] == 43 * 6 * (2 * F * E // 256 * 66 + E * F // 256 * 84)
    assert fl["ds4-flash-q4k"] == fl["ds4-flash-q4blk"] == 43 * 6 * 3 * F * E * 9 // 16
    other = {p: token_bytes(get_preset(p), vocab=False)["layer_weights"] for p in fl}
    assert len(set(other.values())) == 1  # only the experts change


# ----------------------------------------------------------------------------- config and presets
def test_expert_format_field_and_presets():
    assert get_preset("ds4-flash").expert_format == "iq2_xxs+q2_k" and get_preset("ds4-flash").moe_path == "ds4"
    assert get_preset("ds4-flash-q4k").expert_formats == ("q4_k", "q4_k")
    assert get_preset("ds4-flash-q4blk").moe_path == "five" and get_preset("small-q4blk").expert_formats == ("q4", "q4")
    for name, cfg in PRESETS.items():
        base = {k: v for k, v in cfg.summary().items() if k not in ("name", "expert_format", "routed_moe")}
        twin = get_preset(name.replace("-q4k", "").replace("-q4blk", ""))
        assert base == {k: v for k, v in twin.summary().items() if k not in ("name", "expert_format", "routed_moe")}
    assert "b0309611" in get_preset("ds4-flash").summary()["routed_moe"]
    assert "5 launches" in get_preset("ds4-flash-q4blk").summary()["routed_moe"]
    with pytest.raises(ConfigError, match="expert_format='q3_k'"):
        get_preset("tiny", expert_format="q3_k")
    assert [is_ds4_flash(n) for n in ("ds4-flash", "ds4-flash-q4k", "ds4-flash-q4blk", "small", "tiny", None)] == \
        [True, True, True, False, False, False]


# ----------------------------------------------------------------------------- whole tokens
def _tokens(cfg, be, seq=((7, 11), (8, 300), (9, 5))):
    m = DecodeModel(cfg, be, TokenOptions(vocab=True))
    for pos, tok in seq:
        m.token(pos, tok)
    return m


@pytest.mark.parametrize("fmt", list(EXPERT_FORMATS))
def test_tiny_token_each_format_numpy_and_sim(fmt):
    """Every format runs whole tokens on the CPU: finite, the same numbers on sim as on numpy (sim
    computes with the NumPy reference), the formats' tokens differ (other weights)."""
    cfg = get_preset("tiny", expert_format=fmt)
    a = _tokens(cfg, NumpyBackend(seed=cfg.seed))
    b = _tokens(cfg, SimBackend())
    assert np.isfinite(a.hidden()).all() and np.isfinite(a.output_logits()).all()
    assert np.array_equal(a.hidden(), b.hidden()) and np.array_equal(a.output_logits(), b.output_logits())
    other = _tokens(get_preset("tiny", expert_format="q4blk" if fmt != "q4blk" else "q4_k"), NumpyBackend())
    assert not np.array_equal(a.hidden(), other.hidden())


def test_small_token_ds4_formats_numpy():
    """small's wider rows (4 super-blocks of the input, 2 of the middle) through a partial token."""
    cfg = get_preset("small")
    m = DecodeModel(cfg, NumpyBackend(seed=cfg.seed), TokenOptions(), n_layers=4)
    m.token(1000, 17)
    assert np.isfinite(m.hidden()).all()
    assert m.L.census.total("kernel") == 1 + 25 * 4
