"""NumPy reference for every op of the decode token: pure functions, each mirroring one kernel in ``kernels/``.
Arithmetic is float64 except where the kernel's own float32 rounding is the point (activation quantization); outputs
are float32. Used by the tests (GPU kernels against these) and the ``numpy`` backend. Formats: ``docs/model.md``."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .config import MOE_TILE, Q8_0_BLOCK, Q8_K_BLOCK, QK_K, TOPK_MERGE_GROUP
from .weights import IQ2XXS_GRID, SUPERBLOCKS, QTensor, iq2_sign_byte

f32, f64 = np.float32, np.float64


# ----------------------------------------------------------------------------- quant formats
def dequant(w: QTensor) -> np.ndarray:
    """Dequantize a matrix in any of ds4lab's weight formats to float64 ``[..., rows, cols]`` (Q8_0, ds4lab's 4-bit
    blocks, or a super-block format: :func:`dequant_superblocks`)."""
    if w.fmt in SUPERBLOCKS:
        lead = w.qs.shape[:-1]
        return dequant_superblocks(w.fmt, w.qs.reshape(-1, SUPERBLOCKS[w.fmt].nbytes)).reshape(*lead, w.cols)
    d = w.d.astype(f64)
    if w.fmt == "q8_0":
        q = w.qs.astype(f64)
    elif w.fmt == "q4":
        lead = w.qs.shape[:-1]
        b = w.qs.reshape(*lead, w.cols // Q8_0_BLOCK, 16)
        lo = (b & 0x0F).astype(f64) - 8
        hi = (b >> 4).astype(f64) - 8
        q = np.concatenate([lo, hi], axis=-1).reshape(*lead, w.cols)
    else:
        raise ValueError(f"unknown quant format {w.fmt!r}")
    return q * np.repeat(d, Q8_0_BLOCK, axis=-1)


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    """The little-endian fp16 field at byte ``off`` of every block ``b [n, nbytes]``, as float64."""
    return np.ascontiguousarray(b[:, off:off + 2]).view(np.float16)[:, 0].astype(f64)


def q4_k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit scales and mins of the 8 sub-blocks of Q4_K blocks from their 12 scale bytes ``[n, 12]`` (ggml
    ``get_scale_min_k4``; ``docs/model.md``, "The formats, bit for bit"). Returns two int64 ``[n, 8]``."""
    s = scales.astype(np.int64)
    sc = np.empty((s.shape[0], 8), np.int64)
    m = np.empty_like(sc)
    sc[:, :4], m[:, :4] = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    m[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, m


def dequant_superblocks(fmt: str, b: np.ndarray) -> np.ndarray:
    """float64 weights ``[n, 256]`` of ``n`` packed super-blocks ``b`` (uint8 ``[n, nbytes]``), by ggml's
    ``dequantize_row_q4_K`` / ``_q2_K`` / ``_iq2_xxs`` (layouts: ``docs/model.md``, "The formats, bit for bit"). Raises
    ValueError: unknown format or a block width that is not the format's."""
    if fmt not in SUPERBLOCKS or b.shape[-1] != SUPERBLOCKS[fmt].nbytes:
        raise ValueError(f"dequant_superblocks: format {fmt!r}, blocks of {b.shape[-1]} bytes")
    n = b.shape[0]
    if fmt == "q4_k":
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, m = q4_k_scale_min(b[:, 4:16])
        qs = b[:, 16:144].reshape(n, 4, 32)
        q = np.stack([qs & 15, qs >> 4], axis=2).reshape(n, 8, 32).astype(f64)  # sub-block 2g, 2g + 1
        w = d[:, None, None] * sc[:, :, None] * q - dmin[:, None, None] * m[:, :, None]
        return w.reshape(n, QK_K)
    if fmt == "q2_k":
        sc = b[:, 0:16].astype(np.int64).reshape(n, 2, 4, 2)  # [half, shift step, first/second 16]
        qs = b[:, 16:80].reshape(n, 2, 1, 32)
        q = (qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3  # [n, half, step, 32]
        q = q.reshape(n, 2, 4, 2, 16).astype(f64)
        d, dmin = _f16(b, 80), _f16(b, 82)
        w = (d[:, None, None, None, None] * (sc & 15)[..., None] * q
             - dmin[:, None, None, None, None] * (sc >> 4)[..., None])
        return w.reshape(n, QK_K)
    d = _f16(b, 0)
    aux = np.ascontiguousarray(b[:, 2:66]).view("<u4").reshape(n, 8, 2)
    grid_idx = aux[:, :, 0:1] >> (8 * np.arange(4, dtype=np.uint32)) & np.uint32(255)  # [n, 8, 4]
    sign_idx = aux[:, :, 1:2] >> (7 * np.arange(4, dtype=np.uint32)) & np.uint32(127)
    scale = (0.5 + (aux[:, :, 1] >> np.uint32(28)).astype(f64)) * 0.25  # [n, 8]
    signed = _iq2_signed_grid()[grid_idx.astype(np.int64) * 128 + sign_idx.astype(np.int64)]  # [n, 8, 4, 8]
    w = (d[:, None] * scale)[:, :, None, None] * signed
    return w.reshape(n, QK_K)


@functools.lru_cache(maxsize=1)
def _iq2_signed_grid() -> np.ndarray:
    """Every signed IQ2_XXS group: float64 ``[256 * 128, 8]``, row ``grid * 128 + sign index``."""
    mags = IQ2XXS_GRID.view(np.uint8).reshape(256, 1, 8).astype(f64)
    bits = (iq2_sign_byte(np.arange(128))[:, None] >> np.arange(8, dtype=np.uint8)) & 1  # [128, 8]
    return (mags * (1.0 - 2.0 * bits)[None]).reshape(256 * 128, 8)


def quantize_q8k_ds4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize float32 ``x [T, n]`` to Q8_K as ds4's CUDA ``q8_K_quantize_kernel`` does (ds4_cuda.cu at b0309611;
    ``docs/model.md``: the kernel's tree picks ``max``, ``d = 1 / iscale``, all float32, round half to even); an
    all-zero block gets zeros. Returns int8 ``[T, n]``, float32 ``[T, n / 256]``, int16 ``[T, n / 16]``."""
    x = np.asarray(x, dtype=f32)
    T, n = x.shape
    blk = x.reshape(T, n // Q8_K_BLOCK, Q8_K_BLOCK)
    a, v = np.abs(blk), blk.copy()
    s = Q8_K_BLOCK // 2
    while s:
        take = a[..., s:2 * s] > a[..., :s]
        a[..., :s] = np.where(take, a[..., s:2 * s], a[..., :s])
        v[..., :s] = np.where(take, v[..., s:2 * s], v[..., :s])
        s //= 2
    amax, vmax = a[..., 0], v[..., 0]
    zero = amax == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, f32(0.0), f32(-127.0) / np.where(zero, f32(1.0), vmax)).astype(f32)
    q = np.rint(iscale[..., None] * blk).clip(-128, 127).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(zero, f32(0.0), f32(1.0) / np.where(zero, f32(1.0), iscale)).astype(f32)
    bsums = q.reshape(T, n // 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    return q.reshape(T, n), d, bsums


def quantize_q8k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize float32 ``x [T, n]`` to Q8_K as ``xq_quantize``/``moe_midq`` do: per 256, ``d = amax / 127``, ``q =
    rint(x / d)`` in float32 (all-zero block: zeros). Returns int8 ``[T, n]``, float32 ``[T, n/256]``."""
    x = np.asarray(x, dtype=f32)
    T, n = x.shape
    blk = x.reshape(T, n // Q8_K_BLOCK, Q8_K_BLOCK)
    amax = np.abs(blk).max(axis=-1)
    d = (amax / f32(127.0)).astype(f32)
    safe = np.where(d == 0, f32(1.0), d)
    q = np.where(d[..., None] == 0, f32(0.0), np.rint(blk / safe[..., None]))
    return q.clip(-127, 127).astype(np.int8).reshape(T, n), d


def dequant_q8k(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """float64 values of a Q8_K activation ``(q [T, n], d [T, n/256])``."""
    return q.astype(f64) * np.repeat(d.astype(f64), Q8_K_BLOCK, axis=-1)


# ----------------------------------------------------------------------------- dense ops
def q8_matvec(w: QTensor, x: np.ndarray, rows_per_group: int | None = None, group_stride: int = 0) -> np.ndarray:
    """``y[r] = W[r] · x[g*stride : g*stride + cols]``, ``g = r // rows_per_group`` (None: a plain matvec); ``w`` Q8_0
    ``[rows, cols]``, ``x`` float32. Returns float32 ``[rows]``."""
    W = dequant(w)
    x = np.asarray(x, dtype=f64)
    if rows_per_group is None:
        return (W @ x[: w.cols]).astype(f32)
    groups = w.rows // rows_per_group
    out = np.empty(w.rows, dtype=f64)
    for g in range(groups):
        r = slice(g * rows_per_group, (g + 1) * rows_per_group)
        out[r] = W[r] @ x[g * group_stride: g * group_stride + w.cols]
    return out.astype(f32)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """RMS norm of each row of ``x [rows, dim]`` (times ``w [dim]`` when given). float32 out."""
    x = np.asarray(x, dtype=f64)
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * np.asarray(w, dtype=f64)
    return y.astype(f32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=f64)))


def hc_mix_logits(hn: np.ndarray, wmix: np.ndarray) -> np.ndarray:
    """Hyper-connection mixing logits ``Wmix [2S, S*E] @ flat(hn)``, ``hn [S, E]``: float32 ``[2S]`` (pre-mix, then
    expand)."""
    S = hn.shape[0]
    W = np.asarray(wmix, dtype=f64).reshape(2 * S, -1)
    return (W @ np.asarray(hn, dtype=f64).reshape(-1)).astype(f32)


def hc_mix_partials(hn: np.ndarray, wmix: np.ndarray, nsplit: int) -> np.ndarray:
    """``hc_mix``'s partial sums: float32 ``[2S, nsplit]``, slice ``s`` of ``flat(hn)`` per column."""
    S = hn.shape[0]
    W = np.asarray(wmix, dtype=f64).reshape(2 * S, nsplit, -1)
    v = np.asarray(hn, dtype=f64).reshape(nsplit, -1)
    return np.einsum("jsi,si->js", W, v).astype(f32)


def sum_partials(part: np.ndarray) -> np.ndarray:
    """Row sums of float32 partials ``[2S, nsplit]`` in float64, stored as float32 (``hc_premix``)."""
    return np.asarray(part, dtype=f64).sum(axis=-1).astype(f32)


def mix_weights(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(pre, post)`` from mixing logits ``[2S]``: softmax of the first S, ``2*sigmoid`` of the rest."""
    lg = np.asarray(logits, dtype=f64)
    S = lg.size // 2
    pre = np.exp(lg[:S] - lg[:S].max())
    return pre / pre.sum(), 2.0 * sigmoid(lg[S:])


def hc_premix(h: np.ndarray, logits: np.ndarray, w_norm: np.ndarray, eps: float) -> np.ndarray:
    """``rms_norm(sum_s pre[s] * h[s]) * w_norm``: the sublayer input from streams ``h [S, E]``."""
    pre, _ = mix_weights(logits)
    x = (pre[:, None] * np.asarray(h, dtype=f64)).sum(axis=0)
    return rms_norm(x[None], w_norm, eps)[0]


def rope(x: np.ndarray, pos: int, rope_dims: int, theta: float) -> np.ndarray:
    """Rotate the last ``rope_dims`` of each row of ``x [rows, D]`` by position ``pos``: interleaved pairs, frequency
    ``theta^(-2i/rope_dims)``, the angle in float64 (as on the device)."""
    x = np.asarray(x, dtype=f64).copy()
    D = x.shape[-1]
    i = np.arange(rope_dims // 2, dtype=f64)
    ang = pos * theta ** (-2.0 * i / rope_dims)
    c, s = np.cos(ang), np.sin(ang)
    a = x[..., D - rope_dims::2].copy()
    b = x[..., D - rope_dims + 1::2].copy()
    x[..., D - rope_dims::2] = a * c - b * s
    x[..., D - rope_dims + 1::2] = a * s + b * c
    return x.astype(f32)


def attention_decode(q: np.ndarray, cache: np.ndarray, pos: int, window: int) -> np.ndarray:
    """Sliding-window decode attention, one KV head: ``q [H, D]`` over the ``min(pos+1, W)`` latest rows of the ring
    buffer ``cache [W, D]`` (row ``p % W``; keys and values the same row): :func:`attention_comp` without compressed
    rows. Returns float32 ``[H, D]``."""
    return attention_comp(q, cache, pos, window, None, ())


def expand(h: np.ndarray, logits: np.ndarray, y: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """Hyper-connection expand and residual add: ``h[s] + post[s] * (y + extra)``, ``post`` from ``logits``. float32."""
    _, post = mix_weights(logits)
    v = np.asarray(y, dtype=f64) + (0.0 if extra is None else np.asarray(extra, dtype=f64))
    return (np.asarray(h, dtype=f64) + post[:, None] * v[None]).astype(f32)


def swiglu(gate: np.ndarray, up: np.ndarray, limit: float) -> np.ndarray:
    """Clamped SwiGLU: ``silu(min(gate, limit)) * clip(up, -limit, limit)``. float32 out."""
    g = np.minimum(np.asarray(gate, dtype=f64), limit)
    u = np.clip(np.asarray(up, dtype=f64), -limit, limit)
    return (g * sigmoid(g) * u).astype(f32)


def q8_matvec_swiglu(w: QTensor, x: np.ndarray, limit: float) -> np.ndarray:
    """Shared-expert gate/up: ``swiglu(W[:F] x, W[F:] x)`` with ``w`` Q8_0 ``[2F, E]``."""
    y = dequant(w) @ np.asarray(x, dtype=f64)
    F = w.rows // 2
    return swiglu(y[:F], y[F:], limit)


# ----------------------------------------------------------------------------- router
def router_logits(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Router logits ``[T, N]`` from fp32 weights ``w [N*E]`` (row-major ``[N, E]``) and ``x [T, E]``."""
    x = np.asarray(x, dtype=f64)
    W = np.asarray(w, dtype=f64).reshape(-1, x.shape[-1])
    return (x @ W.T).astype(f32)


#: The key of a NaN score (``kernels/score_order.cuh``: ``DS4_SCORE_KEY_NAN``), below every number's.
SCORE_KEY_NAN = 1


def score_key(scores: np.ndarray) -> np.ndarray:
    """Each float32 score's place in ds4's score order (``router_score_better``) as uint32 keys, higher first: -0.0
    and +0.0 share a key, NaNs rank below every number and share :data:`SCORE_KEY_NAN`, 0 is an empty slot. Mirrors
    ``kernels/score_order.cuh:ds4_score_key`` bit for bit."""
    v = np.asarray(scores, dtype=f32)
    u = np.where(v == 0, f32(0), v).view(np.uint32)
    key = np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000))
    return np.where(np.isnan(v), np.uint32(SCORE_KEY_NAN), key).astype(np.uint32)


def score_order(scores: np.ndarray) -> np.ndarray:
    """Indices along the last axis in the score order (:func:`score_key`), best first, ties to the lower index. int64,
    the shape of ``scores``."""
    return np.argsort(~score_key(scores), axis=-1, kind="stable")


def router_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` experts per token in the score order (:func:`score_key`) and their sigmoid scores normalized to sum
    1. Returns int32 ``[T, k]`` and float32 ``[T, k]``."""
    logits = np.asarray(logits, dtype=f32)
    order = score_order(logits)[:, :k].astype(np.int32)
    return order, router_weights(logits, order)


def router_weights(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Normalized sigmoid scores of the chosen experts ``ids [T, k]``. float32 ``[T, k]``."""
    s = sigmoid(np.take_along_axis(np.asarray(logits, dtype=f64), ids.astype(np.int64), axis=-1))
    return (s / s.sum(axis=-1, keepdims=True)).astype(f32)


# ----------------------------------------------------------------------------- routed MoE
def moe_sort(ids: np.ndarray, n_experts: int, tile: int = MOE_TILE) -> dict[str, np.ndarray]:
    """The ``sort`` stage for ``ids [T, k]``: counts per expert, exclusive offsets, pairs ``p = t*k + j`` in expert
    order (pair order within an expert: compare sets, the kernel's atomics choose), tiles ``(expert, start, count <=
    tile)``."""
    flat = ids.reshape(-1).astype(np.int64)
    counts = np.bincount(flat, minlength=n_experts).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    sorted_pairs = np.argsort(flat, kind="stable").astype(np.int32)
    tiles = [(e, offsets[e] + s, min(tile, counts[e] - s))
             for e in range(n_experts) for s in range(0, counts[e], tile)]
    t = np.array(tiles, dtype=np.int32).reshape(-1, 3)
    return {"counts": counts, "offsets": offsets, "sorted": sorted_pairs, "tiles": t,
            "n_tiles": np.array([len(tiles)], dtype=np.int32)}


def max_tiles(n_pairs: int, n_experts: int, tile: int = MOE_TILE) -> int:
    """Upper bound on the tile count for ``n_pairs`` pairs (sizes the tile buffers and grid)."""
    return -(-n_pairs // tile) + min(n_pairs, n_experts)


@functools.lru_cache(maxsize=256)  # asked on every tiled launch (its bytes estimate): compute once
def expected_tiles(tokens: int, n_used: int, n_experts: int, tile: int = MOE_TILE) -> float:
    """Expected tile count of one sorted routed-MoE call under uniform routing (an expert's pairs are
    Binomial(tokens, n_used / n_experts), ceil(count / tile) tiles each): the tiled kernels' bytes estimate."""
    p = n_used / n_experts
    if p >= 1.0:
        return float(n_experts * -(-tokens // tile))
    pmf = (1.0 - p) ** tokens  # count 0
    total = 0.0
    for c in range(tokens):
        pmf *= (tokens - c) / (c + 1) * p / (1.0 - p)  # now P(count = c + 1)
        total += -(-(c + 1) // tile) * pmf
    return n_experts * total


def expert_matvec(w: QTensor, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """One expert's matrix ``[rows, cols]`` (any weight format) times one Q8_K activation row. float32 ``[rows]``."""
    return (dequant(w) @ dequant_q8k(xq[None], xd[None])[0]).astype(f32)


def moe_gateup(bank_expert, ids: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``gateup`` stage for ``ids [T, k]`` and the Q8_K input ``xq, xd``; ``bank_expert(e)`` gives ``(gate_up, down)``.
    Returns gate, up float32 ``[T*k, F]``."""
    T, k = ids.shape
    out = []
    for p in range(T * k):
        gu = bank_expert(int(ids.reshape(-1)[p]))[0]
        out.append(expert_matvec(gu, xq[p // k], xd[p // k]))
    y = np.stack(out)
    F = y.shape[1] // 2
    return y[:, :F], y[:, F:]


def moe_midq(gate: np.ndarray, up: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """``midq`` stage: clamped SwiGLU then Q8_K quantization. Returns (int8 ``[P, F]``, f32 scales)."""
    return quantize_q8k(swiglu(gate, up, limit))


def moe_down(bank_expert, ids: np.ndarray, mq: np.ndarray, md: np.ndarray) -> np.ndarray:
    """``down`` stage: each pair's expert down projection. float32 ``[T*k, E]``."""
    flat = ids.reshape(-1)
    return np.stack([expert_matvec(bank_expert(int(flat[p]))[1], mq[p], md[p]) for p in range(flat.size)])


def moe_sum(out_pairs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sum`` stage: ``y[t] = sum_j w[t, j] * out_pairs[t*k + j]``. float32 ``[T, E]``."""
    T, k = weights.shape
    o = np.asarray(out_pairs, dtype=f64).reshape(T, k, -1)
    return (np.asarray(weights, dtype=f64)[..., None] * o).sum(axis=1).astype(f32)


def routed_moe(bank_expert, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, limit: float) -> np.ndarray:
    """The whole routed MoE (``xq`` → ``gateup`` → ``midq`` → ``down`` → ``sum``) for ``x [T, E]``."""
    xq, xd = quantize_q8k(x)
    gate, up = moe_gateup(bank_expert, ids, xq, xd)
    mq, md = moe_midq(gate, up, limit)
    return moe_sum(moe_down(bank_expert, ids, mq, md), weights)


# ----------------------------------------------------------------------------- routed MoE, ds4's path
# ds4_cuda.cu at b0309611: xq -> fused gate/up (times the router weight) -> midq -> down with the experts' sum
# (docs/model.md, "One decode token: four launches").
def moe_gateup_mid(gate_up: QTensor, xq: np.ndarray, xd: np.ndarray, weight: float, limit: float) -> np.ndarray:
    """One pair's fused gate/up: ``swiglu(W[:F] x, W[F:] x) * weight`` with ``gate_up`` ``[2F, E]`` (any format) and
    ``x`` the Q8_K row ``(xq [E], xd [E / 256])``; ds4's clamp (gate at most ``limit``, up within ``+-limit``),
    float64. Returns float32 ``[F]``."""
    y = dequant(gate_up) @ dequant_q8k(xq[None], xd[None])[0]
    F = gate_up.rows // 2
    return (swiglu(y[:F], y[F:], limit).astype(f64) * f64(weight)).astype(f32)


def moe_decode_ds4(bank_expert, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, limit: float,
                   n_experts: int) -> np.ndarray:
    """ds4's routed MoE for ``x [T, E]``, experts ``ids [T, k]``, router ``weights [T, k]``; ``bank_expert(e)`` gives
    ``(gate_up, down)``. A pair whose expert is outside ``0 .. n_experts - 1`` adds nothing. float32 ``[T, E]``."""
    xq, xd, _ = quantize_q8k_ds4(x)
    T, k = ids.shape
    flat, wts = ids.reshape(-1), np.asarray(weights, f32).reshape(-1)
    F = bank_expert(0)[0].rows // 2
    ok = [0 <= int(e) < n_experts for e in flat]
    mid = np.stack([moe_gateup_mid(bank_expert(int(e))[0], xq[p // k], xd[p // k], wts[p], limit) if ok[p]
                    else np.zeros(F, f32) for p, e in enumerate(flat)])
    mq, md, _ = quantize_q8k_ds4(mid)
    return np.stack([moe_down_sum([bank_expert(int(flat[p]))[1] if ok[p] else None for p in range(t * k, (t + 1) * k)],
                                  mq[t * k:(t + 1) * k], md[t * k:(t + 1) * k]) for t in range(T)])


def moe_down_sum(downs: list, mq: np.ndarray, md: np.ndarray) -> np.ndarray:
    """ds4's down with the experts' sum fused: ``sum_s downs[s] . x_s`` in float64, ``x_s`` the Q8_K middle ``(mq [k,
    F], md [k, F / 256])`` of slot ``s``; ``downs[s]`` the slot's down matrix ``[E, F]`` (any format), or None for a
    slot whose expert is outside the bank (it adds nothing). float32 ``[E]``."""
    y = None
    for s, w in enumerate(downs):
        if w is not None:
            v = dequant(w) @ dequant_q8k(mq[s][None], md[s][None])[0]
            y = v if y is None else y + v
    if y is None:
        raise ValueError("moe_down_sum: no slot has an expert in the bank (the output size is unknown)")
    return y.astype(f32)


# ----------------------------------------------------------------------------- long-context decode
# ds4.c's compressor_decode_one, compressor_pool_decode_state, indexer_allowed_decode_one and
# layer_attention_mixed_one, written anew (semantics and what is left out: docs/model.md, "Long context"),
# and the per-token host decisions the model, the ops and the tests ask.
#: ds4.c ``DS4_NEG_INF``: the score of an empty state slot.
NEG_INF = -1e30


# ----------------------------------------------------------------------------- host decisions
def is_emit(pos: int, ratio: int) -> bool:
    """True when the token at ``pos`` emits a compressed row: ``(pos + 1) % ratio == 0``."""
    return (pos + 1) % ratio == 0


def comp_count(pos: int, ratio: int) -> int:
    """Compressed rows that exist once the token at ``pos`` is done: ``(pos + 1) // ratio`` (the rows emitted by tokens
    ``0 .. pos``; this token's row included when it emits)."""
    return (pos + 1) // ratio


def comp_row(pos: int, ratio: int) -> int:
    """Row an emitting token at ``pos`` writes: ``pos // ratio``."""
    return pos // ratio


def state_slot(pos: int, ratio: int) -> int:
    """State row the token at ``pos`` stores into: ``4 + pos % 4`` (ratio 4), ``pos % ratio`` else."""
    return (ratio + pos % ratio) if ratio == 4 else pos % ratio


#: Top-k regimes by n_comp, as multiples of top-k (ds4_cuda.cu ``ds4_gpu_indexer_topk_tensor``
#: at top-k 512: <= 1024, <= 2048, <= 4096, <= 8192, then the chunked tree merge).
TOPK_REGIMES = ("all", "sort2k", "sort4k", "sort8k", "sort16k", "chunked")


def topk_regime(n_comp: int, top_k: int) -> str:
    """The indexer regime for ``n_comp`` compressed rows: ``"all"`` (``n_comp <= top_k``), ``"sort{m}k"`` or
    ``"chunked"`` (:data:`TOPK_REGIMES`; ``docs/model.md``, "Long context")."""
    if n_comp < 0:
        raise ValueError(f"n_comp={n_comp} must be >= 0")
    for m, name in ((1, "all"), (2, "sort2k"), (4, "sort4k"), (8, "sort8k"), (16, "sort16k")):
        if n_comp <= m * top_k:
            return name
    return "chunked"


@dataclass(frozen=True)
class TopkStep:
    """One top-k launch: kernel, blocks, sort width; ``src``/``dst`` ``"scores"``, ``"scratch"`` (with a word offset)
    or ``"selected"``; ``sets``: candidate sets a merge block reads (``group`` per block)."""

    kernel: str
    blocks: int
    sort_n: int
    src_off: int = -1
    dst_off: int = -1
    sets: int = 0


def topk_plan(n_comp: int, top_k: int) -> tuple[list[TopkStep], int]:
    """The top-k launches for ``n_comp`` rows and the int32 scratch words they need: one ``indexer_topk`` block
    (``sort{2,4,8,16}k``), or ``indexer_topk_chunk`` over chunks of ``8 * top_k`` then ``indexer_topk_merge`` levels
    of :data:`TOPK_MERGE_GROUP` sets per block and a final merge (``chunked``)."""
    regime = topk_regime(n_comp, top_k)
    if regime == "all":
        return [], 0
    if regime != "chunked":
        m = {"sort2k": 2, "sort4k": 4, "sort8k": 8, "sort16k": 8}[regime]
        return [TopkStep("indexer_topk", 1, m * top_k)], 0
    chunk = 8 * top_k
    n_sets = -(-n_comp // chunk)
    steps = [TopkStep("indexer_topk_chunk", n_sets, chunk, dst_off=0)]
    off, words = 0, n_sets * top_k
    while n_sets > TOPK_MERGE_GROUP:
        nxt = -(-n_sets // TOPK_MERGE_GROUP)
        steps.append(TopkStep("indexer_topk_merge", nxt, chunk, src_off=off, dst_off=words, sets=n_sets))
        off, words, n_sets = words, words + nxt * top_k, nxt
    steps.append(TopkStep("indexer_topk_merge", 1, chunk, src_off=off, dst_off=-1, sets=n_sets))
    return steps, words


# ----------------------------------------------------------------------------- compressor
def compressor_store(state_kv: np.ndarray, state_score: np.ndarray, kv_cur: np.ndarray, sc_cur: np.ndarray,
                     ape: np.ndarray, pos: int, ratio: int) -> tuple[np.ndarray, np.ndarray]:
    """Store this token's rows into the state: ``kv_cur`` and ``sc_cur + ape[pos % ratio]`` at :func:`state_slot`.
    States ``[coff * ratio, width]``, rows ``[width]``, ``ape`` ``[ratio, width]`` (or flat). Returns new float32
    states."""
    kv, sc = np.array(state_kv, dtype=f32), np.array(state_score, dtype=f32)
    width = kv.shape[1]
    a = np.asarray(ape, dtype=f32).reshape(ratio, width)
    slot = state_slot(pos, ratio)
    kv[slot] = np.asarray(kv_cur, dtype=f32)[:width]
    sc[slot] = (np.asarray(sc_cur, dtype=f64)[:width] + a[pos % ratio]).astype(f32)
    return kv, sc


def compressor_pool(state_kv: np.ndarray, state_score: np.ndarray, head_dim: int, ratio: int) -> np.ndarray:
    """Softmax pool of the state per output dimension (``docs/model.md``): float32 ``[head_dim]``; an empty state
    (every score below ``NEG_INF / 2``) pools to 0, as in ds4."""
    kv, sc = np.asarray(state_kv, dtype=f64), np.asarray(state_score, dtype=f64)
    if ratio == 4:
        vals = np.concatenate([kv[:4, :head_dim], kv[4:8, head_dim:2 * head_dim]])
        scores = np.concatenate([sc[:4, :head_dim], sc[4:8, head_dim:2 * head_dim]])
    else:
        vals, scores = kv[:ratio, :head_dim], sc[:ratio, :head_dim]
    m = scores.max(axis=0)
    w = np.exp(scores - m)
    out = (w * vals).sum(axis=0) / w.sum(axis=0)
    return np.where(m <= NEG_INF * 0.5, 0.0, out).astype(f32)


def compressor_emit_row(pooled: np.ndarray, norm_w: np.ndarray, pos: int, ratio: int, rope_dims: int,
                        theta: float, eps: float) -> np.ndarray:
    """The compressed row an emitting token writes: ``rope(rms_norm(pooled) * norm_w)`` at position ``pos + 1 -
    ratio``. float32 ``[head_dim]``. Raises ValueError off an emit token."""
    if not is_emit(pos, ratio):
        raise ValueError(f"position {pos} does not emit at ratio {ratio} ((pos + 1) % ratio != 0)")
    y = rms_norm(np.asarray(pooled, dtype=f32)[None], norm_w, eps)
    return rope(y, pos + 1 - ratio, rope_dims, theta)[0]


def compressor_shift(state_kv: np.ndarray, state_score: np.ndarray, ratio: int) -> tuple[np.ndarray, np.ndarray]:
    """After a ratio-4 emit: the current block (rows 4..7) becomes the previous one (rows 0..3). A no-op copy for ratio
    128. Returns new float32 states."""
    kv, sc = np.array(state_kv, dtype=f32), np.array(state_score, dtype=f32)
    if ratio == 4:
        kv[:4], sc[:4] = kv[4:8], sc[4:8]
    return kv, sc


def compressor_decode(state_kv, state_score, kv_cur, sc_cur, ape, norm_w, pos: int, ratio: int, head_dim: int,
                      rope_dims: int, theta: float, eps: float):
    """One token of the compressor (store; on an emit token pool, norm, rotate, shift): ``(state_kv, state_score,
    row)``, ``row`` None on a non-emit token."""
    kv, sc = compressor_store(state_kv, state_score, kv_cur, sc_cur, ape, pos, ratio)
    if not is_emit(pos, ratio):
        return kv, sc, None
    row = compressor_emit_row(compressor_pool(kv, sc, head_dim, ratio), norm_w, pos, ratio, rope_dims, theta, eps)
    kv, sc = compressor_shift(kv, sc, ratio)
    return kv, sc, row


# ----------------------------------------------------------------------------- indexer
def indexer_scores(q: np.ndarray, w: np.ndarray, keys: np.ndarray, scale: float) -> np.ndarray:
    """``scale * sum_h w[h] * ReLU(q[h] . keys[c])`` for every row ``c`` of ``keys [n, Di]``; ``q [H, Di]``, ``w [H]``.
    float32 ``[n]``."""
    d = np.asarray(keys, dtype=f64) @ np.asarray(q, dtype=f64).T  # [n, H]
    return (scale * (np.maximum(d, 0.0) @ np.asarray(w, dtype=f64))).astype(f32)


def topk_select(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best float32 ``scores`` in the score order (:func:`score_key`), best first, ties to the
    lower index. int32."""
    s = np.asarray(scores, dtype=f32)
    if k > s.size:
        raise ValueError(f"top-k {k} exceeds the {s.size} scores")
    return score_order(s)[:k].astype(np.int32)


def topk_candidates(scores: np.ndarray, n: int, k: int, chunk: int) -> np.ndarray:
    """``indexer_topk_chunk``: the top ``k`` of each chunk of ``chunk`` scores among the first ``n``, int32
    ``[n_chunks, k]``, best first, padded with -1 where a chunk has fewer than ``k`` rows."""
    s = np.asarray(scores, dtype=f32)[:n]
    out = np.full((-(-n // chunk), k), -1, dtype=np.int32)
    for c in range(out.shape[0]):
        part = s[c * chunk:(c + 1) * chunk]
        sel = topk_select(part, min(k, part.size)) + c * chunk
        out[c, :sel.size] = sel
    return out


def topk_merge(scores: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """``indexer_topk_merge``: the top ``k`` (by score, ties to the lower index) of candidate row indices (-1 entries
    ignored). int32 ``[k]``, padded with -1."""
    s = np.asarray(scores, dtype=f32)
    c = np.asarray(candidates, dtype=np.int64).reshape(-1)
    c = np.unique(c[c >= 0])  # ascending: the stable sort below breaks ties to the lower index
    order = c[score_order(s[c])][:k]
    out = np.full(k, -1, dtype=np.int32)
    out[:order.size] = order
    return out


# ----------------------------------------------------------------------------- attention
def attention_comp(q: np.ndarray, cache: np.ndarray, pos: int, window: int, comp: np.ndarray,
                   rows) -> np.ndarray:
    """Decode attention over the raw window (``cache [W, D]``, the ``min(pos + 1, W)`` newest rows) plus the compressed
    rows ``rows`` of ``comp [n, D]``, one KV head: one softmax, scale ``1/sqrt(D)``. Returns float32 ``[H, D]``."""
    n = min(pos + 1, window)
    raw = np.asarray(cache, dtype=f64)[[(p % window) for p in range(pos - n + 1, pos + 1)]]
    rows = np.asarray(rows, dtype=np.int64)
    kv = np.concatenate([raw, np.asarray(comp, dtype=f64)[rows]]) if rows.size else raw
    s = np.asarray(q, dtype=f64) @ kv.T / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ kv).astype(f32)


def attended_rows(pos: int, ratio: int, top_k: int, selected=None) -> np.ndarray:
    """Compressed rows the token at ``pos`` attends in a ratio-``ratio`` layer: every row for ratio 128 or while
    ``n_comp <= top_k``; else ``selected`` (the indexer's top-k). int32."""
    n = comp_count(pos, ratio)
    if ratio != 4 or n <= top_k:
        return np.arange(n, dtype=np.int32)
    if selected is None:
        raise ValueError(f"position {pos}: {n} compressed rows exceed top-k {top_k}: the selection is needed")
    return np.asarray(selected, dtype=np.int32)[:top_k]
