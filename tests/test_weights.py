"""Hash-generated weights: the 32-bit mixer, the generators, hash routing and memory planning.

Expected values are computed here independently, in plain Python integers (masking with
``& 0xFFFFFFFF``) or float64 NumPy, never through the function under test.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from ds4lab.token import reference as R
from ds4lab.token import weights as W
from ds4lab.token.config import get_preset

MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def lowbias32(x: int) -> int:
    """Chris Wellons' lowbias32, step by step in Python ints."""
    x &= MASK
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK
    x ^= x >> 16
    return x


def my_tensor_key(seed: int, name: str) -> int:
    return lowbias32((seed * GOLDEN + zlib.crc32(name.encode())) & MASK)


def my_element_hash(key: int, sub: int, idx: int) -> int:
    return lowbias32(idx ^ lowbias32((key + sub * GOLDEN) & MASK))


# ----------------------------------------------------------------------------- mix32
@pytest.mark.parametrize("x", [0, 1, 2, 0x12345678, 0x80000000, 0xDEADBEEF, MASK])
def test_mix32_matches_hand_computed(x):
    assert int(W.mix32(np.uint32(x))) == lowbias32(x)
    assert W.mix32_int(x) == lowbias32(x)


def test_mix32_known_values():
    # lowbias32 fixes 0; a few constants computed by hand from the three xorshift-multiply rounds.
    assert lowbias32(0) == 0
    assert int(W.mix32(np.uint32(0))) == 0
    arr = np.array([1, 2, 3, 1 << 31], dtype=np.uint32)
    assert W.mix32(arr).tolist() == [lowbias32(int(v)) for v in arr]
    assert W.mix32(arr).dtype == np.uint32


def test_mix32_int_masks_wide_inputs():
    assert W.mix32_int((1 << 40) + 7) == lowbias32(7)
    assert W.mix32_int(-1) == lowbias32(MASK)


def test_mix32_random_inputs_match(rng):
    xs = rng.integers(0, 2**32, size=200, dtype=np.uint64)
    assert W.mix32(xs.astype(np.uint32)).tolist() == [lowbias32(int(v)) for v in xs]


@pytest.mark.parametrize("start", [0, 2**32 - 500_000, None])
def test_mix32_no_collisions_on_a_million(start, rng):
    if start is None:
        start = int(rng.integers(0, 2**32))
    x = ((np.arange(1_000_000, dtype=np.uint64) + np.uint64(start)) & np.uint64(MASK)).astype(np.uint32)
    h = W.mix32(x)
    assert h.dtype == np.uint32
    assert np.unique(h).size == x.size


def test_keys_and_element_hash_independent(rng):
    assert W.tensor_key(1234, "q_a@0") == my_tensor_key(1234, "q_a@0")
    assert W.tensor_key(1234, "q_a@0") != W.tensor_key(1234, "q_a@1")
    assert W.tensor_key(1234, "q_a@0") != W.tensor_key(1235, "q_a@0")
    key = int(rng.integers(0, 2**32))
    idx = rng.integers(0, 2**32, size=50, dtype=np.uint64)
    for sub in (0, 1, 255):
        got = W.element_hash(key, sub, idx.astype(np.uint32))
        assert got.tolist() == [my_element_hash(key, sub, int(i)) for i in idx]


# ----------------------------------------------------------------------------- generators
def test_gen_q8_0_deterministic_and_keyed(rng):
    key = int(rng.integers(0, 2**31))
    a = W.gen_q8_0(key, 0, 16, 64)
    b = W.gen_q8_0(key, 0, 16, 64)
    assert np.array_equal(a.qs, b.qs) and np.array_equal(a.d, b.d)
    assert (a.qs.shape, a.qs.dtype, a.d.shape, a.d.dtype) == ((16, 64), np.int8, (16, 2), np.float16)
    for other in (W.gen_q8_0(key + 1, 0, 16, 64), W.gen_q8_0(key, 1, 16, 64)):
        assert not np.array_equal(a.qs, other.qs)
        assert not np.array_equal(a.d, other.d)


def test_gen_q4_deterministic_and_keyed(rng):
    key = int(rng.integers(0, 2**31))
    a = W.gen_q4(key, 3, 8, 128)
    b = W.gen_q4(key, 3, 8, 128)
    assert np.array_equal(a.qs, b.qs) and np.array_equal(a.d, b.d)
    assert (a.qs.shape, a.qs.dtype, a.d.shape) == ((8, 64), np.uint8, (8, 4))
    for other in (W.gen_q4(key ^ 1, 3, 8, 128), W.gen_q4(key, 4, 8, 128)):
        assert not np.array_equal(a.qs, other.qs)
        assert not np.array_equal(a.d, other.d)


def test_gen_f32_deterministic_keyed_and_in_range(rng):
    key = int(rng.integers(0, 2**31))
    a = W.gen_f32(key, 4096, 0.25, 1.0)
    assert a.dtype == np.float32 and a.shape == (4096,)
    assert np.array_equal(a, W.gen_f32(key, 4096, 0.25, 1.0))
    assert not np.array_equal(a, W.gen_f32(key + 1, 4096, 0.25, 1.0))
    assert a.min() >= 0.75 and a.max() < 1.25
    assert abs(a.mean() - 1.0) < 0.02  # uniform around the offset
    # Independent: offset + scale * (2u - 1), u from the top 24 bits of the element hash.
    h = np.array([my_element_hash(key, 0, i) for i in range(64)], dtype=np.uint64)
    u = (h >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
    assert np.allclose(a[:64], 1.0 + 0.25 * (2 * u - 1), rtol=0, atol=1e-6)


def test_q8_values_in_range(rng):
    t = W.gen_q8_0(int(rng.integers(0, 2**31)), 0, 128, 512)
    assert t.qs.min() >= -127 and t.qs.max() <= 127
    # The whole range is used (a uniform byte over 65536 draws reaches both ends).
    assert t.qs.min() == -127 and t.qs.max() == 127


@pytest.mark.parametrize("fmt", ["q8_0", "q4"])
@pytest.mark.parametrize("cols", [256, 2048])
def test_dequantized_std_close_to_inv_sqrt_cols(fmt, cols, rng):
    gen = W.gen_q8_0 if fmt == "q8_0" else W.gen_q4
    t = gen(int(rng.integers(0, 2**31)), 0, 64, cols)
    std = R.dequant(t).std()
    target = 1.0 / np.sqrt(cols)
    assert abs(std / target - 1.0) < 0.2, (std, target)


def test_q8_dequant_matches_independent(rng):
    key, sub = int(rng.integers(0, 2**31)), 2
    rows, cols = 4, 64
    t = W.gen_q8_0(key, sub, rows, cols)
    h = np.array([my_element_hash(key, sub, i) for i in range(rows * cols)], dtype=np.int64)
    q = np.clip((h >> 24) - 128, -127, 127).reshape(rows, cols)
    assert np.array_equal(t.qs.astype(np.int64), q)
    want = q * np.repeat(t.d.astype(np.float64), 32, axis=1)
    assert np.array_equal(R.dequant(t), want)


def test_q4_round_trip_matches_hash_nibbles(rng):
    key, sub = int(rng.integers(0, 2**31)), 5
    rows, cols = 6, 96
    t = W.gen_q4(key, sub, rows, cols)
    h = W.element_hash(key, sub, np.arange(rows * cols, dtype=np.uint32))
    v = (h >> np.uint32(28)).astype(np.int64).reshape(rows, cols) - 8
    assert v.min() >= -8 and v.max() <= 7
    scale = np.repeat(t.d.astype(np.float64), 32, axis=1)
    assert np.array_equal(R.dequant(t), v * scale)


def test_q4_packing_layout(rng):
    """Byte j of a block holds value j in its low nibble and value j+16 in its high nibble."""
    key = int(rng.integers(0, 2**31))
    t = W.gen_q4(key, 0, 1, 64)
    h = W.element_hash(key, 0, np.arange(64, dtype=np.uint32))
    nib = (h >> np.uint32(28)).astype(np.uint8)
    for blk in range(2):
        for j in range(16):
            byte = int(t.qs[0, blk * 16 + j])
            assert byte & 0x0F == nib[blk * 32 + j]
            assert byte >> 4 == nib[blk * 32 + 16 + j]


@pytest.mark.parametrize("gen,std", [(W.gen_q8_0, 73.6), (W.gen_q4, 4.61)])
def test_scales_independent(gen, std, rng):
    key, sub, rows, cols = int(rng.integers(0, 2**31)), 1, 3, 128
    t = gen(key, sub, rows, cols)
    nb = rows * cols // 32
    hs = np.array([my_element_hash(key ^ 0x5BD1E995, sub, i) for i in range(nb)], dtype=np.uint64)
    u = (hs >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
    base = 1.0 / (std * np.sqrt(cols))
    want = (base * (0.75 + 0.5 * u)).reshape(rows, cols // 32)
    assert np.allclose(t.d.astype(np.float64), want, rtol=1e-3, atol=0)


def test_qtensor_indexing_and_bytes(rng):
    t = W.gen_q4(int(rng.integers(0, 2**31)), 0, 8, 64)
    assert t.nbytes == 8 * 32 + 8 * 2 * 2
    assert t.row_bytes() == 64 * 0.5 + 2 * 2


# ----------------------------------------------------------------------------- hash routing
def my_hash_experts(seed, token_id, layer, n_used, n_experts):
    key = my_tensor_key(seed, f"hash_route@{layer}")
    chosen = []
    for a in range(1024):
        if len(chosen) == n_used:
            break
        e = lowbias32(key + token_id * GOLDEN + a * 0x85EBCA6B) % n_experts
        if e not in chosen:
            chosen.append(e)
    e = 0
    while len(chosen) < n_used:
        if e not in chosen:
            chosen.append(e)
        e += 1
    return chosen


@pytest.mark.parametrize("n_used,n_experts", [(6, 256), (6, 16), (1, 2), (8, 64)])
def test_hash_experts_distinct_in_range_deterministic(n_used, n_experts, rng):
    for _ in range(20):
        tok, layer = int(rng.integers(0, 129280)), int(rng.integers(0, 3))
        ids = W.hash_experts(1234, tok, layer, n_used, n_experts)
        assert ids.dtype == np.int32 and ids.shape == (n_used,)
        assert len(set(ids.tolist())) == n_used
        assert ids.min() >= 0 and ids.max() < n_experts
        assert np.array_equal(ids, W.hash_experts(1234, tok, layer, n_used, n_experts))
        assert ids.tolist() == my_hash_experts(1234, tok, layer, n_used, n_experts)


def test_hash_experts_vary_with_token_layer_seed():
    base = W.hash_experts(1234, 7, 0, 6, 256)
    assert not np.array_equal(base, W.hash_experts(1234, 8, 0, 6, 256))
    assert not np.array_equal(base, W.hash_experts(1234, 7, 1, 6, 256))
    assert not np.array_equal(base, W.hash_experts(99, 7, 0, 6, 256))
    many = {tuple(W.hash_experts(1234, t, 0, 6, 256)) for t in range(200)}
    assert len(many) > 190


@pytest.mark.parametrize("n", [1, 6, 16, 1000])
def test_hash_experts_fills_when_all_used(n):
    # n=1000: 1024 draws cannot find all 1000 ids, so the fill path must complete the set.
    ids = W.hash_experts(1234, 3, 0, n, n)
    assert sorted(ids.tolist()) == list(range(n))


def test_hash_experts_fill_uses_lowest_unused():
    # 1024 draws over 4000 experts find ~900 distinct ids; the remainder must be the lowest unused.
    ids = W.hash_experts(1234, 11, 2, 1000, 4000).tolist()
    assert len(set(ids)) == 1000
    assert ids == my_hash_experts(1234, 11, 2, 1000, 4000)
    # The drawn prefix is what 1024 draws find; everything after it is the lowest unused ids.
    drawn = []
    key = my_tensor_key(1234, "hash_route@2")
    for a in range(1024):
        e = lowbias32(key + 11 * GOLDEN + a * 0x85EBCA6B) % 4000
        if e not in drawn:
            drawn.append(e)
    assert 800 < len(drawn) < 1000
    assert ids[: len(drawn)] == drawn
    fill = [e for e in range(4000) if e not in drawn][: 1000 - len(drawn)]
    assert ids[len(drawn):] == fill


# ----------------------------------------------------------------------------- memory planning
def test_model_bytes_ds4_flash_plausible():
    cfg = get_preset("ds4-flash")
    total = W.model_bytes(cfg, True)
    assert 5e9 < total < 20e9
    # The vocabulary projection is a Q8_0 [vocab, embed] matrix: 1.0625 bytes per weight.
    assert total - W.model_bytes(cfg, False) == 129280 * 4096 * 17 // 16


#: Bytes of one ds4-flash expert bank by format, by hand: 256 experts of gate/up [4096, 4096] and
#: down [4096, 2048]; IQ2_XXS 66 bytes and Q2_K 84 bytes per 256 weights, ds4lab's 4-bit blocks 16 bytes
#: of values + a 2-byte scale per 32.
_GU, _DN = 256 * 2 * 2048 * 4096, 256 * 4096 * 2048
DS4_FLASH_BANK = {"ds4-flash": _GU // 256 * 66 + _DN // 256 * 84,
                  "ds4-flash-q4k": (_GU + _DN) // 256 * 144,
                  "ds4-flash-q4blk": (_GU + _DN) // 2 + 2 * ((_GU + _DN) // 32)}


@pytest.mark.parametrize("preset", list(DS4_FLASH_BANK))
def test_per_layer_experts_adds_42_banks(preset):
    cfg = get_preset(preset)
    bank = DS4_FLASH_BANK[preset]
    diff = W.model_bytes(cfg.replace(per_layer_experts=True), False) - W.model_bytes(cfg, False)
    assert diff == 42 * bank
    assert DS4_FLASH_BANK["ds4-flash-q4k"] == DS4_FLASH_BANK["ds4-flash-q4blk"]  # Q4_K: 4.5 bits, as the blocks'
    assert DS4_FLASH_BANK["ds4-flash"] < 0.55 * DS4_FLASH_BANK["ds4-flash-q4k"]  # the q2 model: about half


def test_model_bytes_partial_model():
    cfg = get_preset("ds4-flash")
    full = W.model_bytes(cfg, False)
    one = W.model_bytes(cfg, False, 1)
    two = W.model_bytes(cfg, False, 2)
    assert one < two < full
    per_layer = two - one  # one more layer, same shared bank
    assert full == one + 42 * per_layer
    # Per-layer banks: a 2-layer partial model holds exactly 2 banks.
    pl = cfg.replace(per_layer_experts=True)
    assert W.model_bytes(pl, False, 2) - W.model_bytes(cfg, False, 2) == DS4_FLASH_BANK["ds4-flash"]


@pytest.mark.parametrize("fmt", ["q4blk", "q4_k", "iq2_xxs+q2_k"])
def test_model_bytes_counts_every_tensor(fmt):
    cfg = get_preset("tiny", expert_format=fmt)
    # Independent tally of the tiny model from the layer anatomy.
    E, S, F, D = cfg.embed, cfg.hc_streams, cfg.expert_ffn, cfg.head_dim
    q8 = lambda r, c: r * c + 2 * (r * c // 32)  # noqa: E731
    f32 = lambda n: 4 * n  # noqa: E731
    layer = (2 * f32(2 * S * S * E) + 2 * f32(E) + q8(cfg.q_lora, E) + f32(cfg.q_lora)
             + q8(cfg.q_dim, cfg.q_lora) + f32(D) + q8(D, E) + f32(D)
             + q8(cfg.out_groups * cfg.out_lora, cfg.group_in) + q8(E, cfg.out_groups * cfg.out_lora)
             + f32(cfg.n_experts * E) + q8(2 * F, E) + q8(E, F))
    gu, dn = cfg.n_experts * 2 * F * E, cfg.n_experts * E * F
    bank = {"q4blk": (gu + dn) // 2 + 2 * ((gu + dn) // 32), "q4_k": (gu + dn) // 256 * 144,
            "iq2_xxs+q2_k": gu // 256 * 66 + dn // 256 * 84}[fmt]
    want = cfg.n_layers * layer + bank + f32(E)
    assert W.model_bytes(cfg, False) == want
    assert W.model_bytes(cfg, True) == want + q8(cfg.vocab, E)


def test_embed_row_deterministic_and_distinct():
    a = W.embed_row(1234, 5, 256)
    assert a.dtype == np.float32 and a.shape == (256,)
    assert np.array_equal(a, W.embed_row(1234, 5, 256))
    assert not np.array_equal(a, W.embed_row(1234, 6, 256))
    assert a.min() >= -1 and a.max() < 1
