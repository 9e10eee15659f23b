"""NumPy reference of long-context decode: compressor, indexer, top-k, compressed attention.

Semantics read from ds4's CPU reference path (``ds4.c``, snapshot of May 2026) and written anew:

* ``compressor_decode_one``: every token projects the sublayer input to a kv row and a score row
  (``width`` wide), adds the learned per-slot bias ``ape[pos % ratio]`` to the score, and stores
  both into a rolling state at slot ``pos % ratio`` (ratio 4: slot ``4 + pos % 4``: the state
  holds the previous block in rows 0..3 and the current block in rows 4..7). Only when
  ``(pos + 1) % ratio == 0`` it *emits*: pools the state into one row, RMS-norms it (times the
  norm weight), rotates it at position ``pos + 1 - ratio`` with the compressed-layer RoPE base,
  writes it as compressed row ``pos // ratio``, and (ratio 4) copies the current block over the
  previous one.
* ``compressor_pool_decode_state``: per output dimension ``j`` a softmax over the state's scores
  weights the state's kv values. Ratio 128: rows 0..127, column ``j``. Ratio 4 (two lanes of
  ``head_dim``): the previous block's lane 0 (rows 0..3, column ``j``) and the current block's
  lane 1 (rows 4..7, column ``head_dim + j``): consecutive compressed rows overlap.
* ``indexer_allowed_decode_one``: score of compressed row ``c`` is
  ``scale * sum_h w_h * ReLU(q_h . k_c)`` with ``scale = 1 / sqrt(index_head_dim * index_heads)``;
  the ``top_k`` best rows are attended (all rows while ``n_comp <= top_k``).
* ``layer_attention_mixed_one``: one softmax over the raw window rows and the attended compressed
  rows (ds4lab has no attention sinks: docs/model.md).

ds4's fp8 round trip of the compressed kv rows and the indexer's Hadamard (QAT) rotation are
left out (docs/model.md). Arithmetic is float64; outputs float32, the device buffers' dtype.
The per-token host decisions (emit or not, number of compressed rows, top-k regime and launch
plan) are here too: the model, the ops and the tests ask these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import TOPK_MERGE_GROUP

f32, f64 = np.float32, np.float64
#: ds4.c ``DS4_NEG_INF``: the score of an empty state slot.
NEG_INF = -1e30


# ----------------------------------------------------------------------------- host decisions
def is_emit(pos: int, ratio: int) -> bool:
    """True when the token at ``pos`` emits a compressed row: ``(pos + 1) % ratio == 0``."""
    return (pos + 1) % ratio == 0


def comp_count(pos: int, ratio: int) -> int:
    """Compressed rows that exist once the token at ``pos`` is done: ``(pos + 1) // ratio``
    (the rows emitted by tokens ``0 .. pos``; this token's row included when it emits)."""
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
    """The indexer regime for ``n_comp`` compressed rows (see :data:`TOPK_REGIMES`).

    ``"all"``: ``n_comp <= top_k``, no indexer scoring or selection, every row is attended.
    ``"sort{m}k"``: one block selects from at most ``m * top_k`` scores. ``"chunked"``: above
    ``16 * top_k``, chunks of ``8 * top_k`` select candidates, a tree merge reduces them.
    """
    if n_comp < 0:
        raise ValueError(f"n_comp={n_comp} must be >= 0")
    for m, name in ((1, "all"), (2, "sort2k"), (4, "sort4k"), (8, "sort8k"), (16, "sort16k")):
        if n_comp <= m * top_k:
            return name
    return "chunked"


@dataclass(frozen=True)
class TopkStep:
    """One top-k launch: kernel, grid (blocks), sort width, and where it reads and writes.

    ``src``/``dst``: ``"scores"`` (the score row), ``"scratch"`` with a word offset, or
    ``"selected"``; ``sets``: candidate sets a merge block reads (``group`` of them per block).
    """

    kernel: str
    blocks: int
    sort_n: int
    src_off: int = -1
    dst_off: int = -1
    sets: int = 0


def topk_plan(n_comp: int, top_k: int) -> tuple[list[TopkStep], int]:
    """The top-k launches for ``n_comp`` rows and the scratch words they need.

    ``sort{2,4,8}k``: one ``indexer_topk`` block sorting the next power of two (``m * top_k``);
    ``sort16k``: one block streaming over all scores with an ``8 * top_k`` sort. ``chunked``:
    ``indexer_topk_chunk`` over chunks of ``8 * top_k`` (one block each, ``top_k`` candidates
    each, into scratch), ``indexer_topk_merge`` levels of :data:`TOPK_MERGE_GROUP` sets per
    block while more than that many sets remain, and a final merge into the selection.
    Scratch (int32 words) grows with n_comp: ds4 takes it from its grow-on-demand allocator.
    """
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
    """Store this token's rows into the state: ``kv_cur`` and ``sc_cur + ape[pos % ratio]`` at
    :func:`state_slot`. States ``[coff * ratio, width]``, rows ``[width]``, ``ape`` ``[ratio, width]``
    (or flat). Returns new float32 states."""
    kv, sc = np.array(state_kv, dtype=f32), np.array(state_score, dtype=f32)
    width = kv.shape[1]
    a = np.asarray(ape, dtype=f32).reshape(ratio, width)
    slot = state_slot(pos, ratio)
    kv[slot] = np.asarray(kv_cur, dtype=f32)[:width]
    sc[slot] = (np.asarray(sc_cur, dtype=f64)[:width] + a[pos % ratio]).astype(f32)
    return kv, sc


def compressor_pool(state_kv: np.ndarray, state_score: np.ndarray, head_dim: int, ratio: int) -> np.ndarray:
    """Softmax pool of the state per output dimension (see the module docstring). float32 ``[head_dim]``.

    A dimension whose every score is below ``NEG_INF / 2`` (an empty state) pools to 0, as in ds4.
    """
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


def rope_rows(x: np.ndarray, pos: int, rope_dims: int, theta: float) -> np.ndarray:
    """RoPE of the last ``rope_dims`` of each row (pairs ``(2i, 2i+1)``), as ``reference.rope``."""
    from .reference import rope

    return rope(x, pos, rope_dims, theta)


def compressor_emit_row(pooled: np.ndarray, norm_w: np.ndarray, pos: int, ratio: int, rope_dims: int,
                        theta: float, eps: float) -> np.ndarray:
    """The compressed row an emitting token writes: ``rope(rms_norm(pooled) * norm_w)`` at
    position ``pos + 1 - ratio``. float32 ``[head_dim]``. Raises ValueError off an emit token."""
    from .reference import rms_norm

    if not is_emit(pos, ratio):
        raise ValueError(f"position {pos} does not emit at ratio {ratio} ((pos + 1) % ratio != 0)")
    y = rms_norm(np.asarray(pooled, dtype=f32)[None], norm_w, eps)
    return rope_rows(y, pos + 1 - ratio, rope_dims, theta)[0]


def compressor_shift(state_kv: np.ndarray, state_score: np.ndarray, ratio: int) -> tuple[np.ndarray, np.ndarray]:
    """After a ratio-4 emit: the current block (rows 4..7) becomes the previous one (rows 0..3).
    A no-op copy for ratio 128. Returns new float32 states."""
    kv, sc = np.array(state_kv, dtype=f32), np.array(state_score, dtype=f32)
    if ratio == 4:
        kv[:4], sc[:4] = kv[4:8], sc[4:8]
    return kv, sc


def compressor_decode(state_kv, state_score, kv_cur, sc_cur, ape, norm_w, pos: int, ratio: int, head_dim: int,
                      rope_dims: int, theta: float, eps: float):
    """One token of the compressor: store, and on an emit token pool, norm, rotate and shift.

    Returns ``(state_kv, state_score, row)`` with ``row`` None on a non-emit token.
    """
    kv, sc = compressor_store(state_kv, state_score, kv_cur, sc_cur, ape, pos, ratio)
    if not is_emit(pos, ratio):
        return kv, sc, None
    row = compressor_emit_row(compressor_pool(kv, sc, head_dim, ratio), norm_w, pos, ratio, rope_dims, theta, eps)
    kv, sc = compressor_shift(kv, sc, ratio)
    return kv, sc, row


# ----------------------------------------------------------------------------- indexer
def indexer_scores(q: np.ndarray, w: np.ndarray, keys: np.ndarray, scale: float) -> np.ndarray:
    """``scale * sum_h w[h] * ReLU(q[h] . keys[c])`` for every row ``c`` of ``keys [n, Di]``;
    ``q [H, Di]``, ``w [H]``. float32 ``[n]``."""
    d = np.asarray(keys, dtype=f64) @ np.asarray(q, dtype=f64).T  # [n, H]
    return (scale * (np.maximum(d, 0.0) @ np.asarray(w, dtype=f64))).astype(f32)


def topk_select(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest float32 ``scores``, best first, ties to the lower index. int32."""
    s = np.asarray(scores, dtype=f32)
    if k > s.size:
        raise ValueError(f"top-k {k} exceeds the {s.size} scores")
    return np.argsort(-s, kind="stable")[:k].astype(np.int32)


def topk_candidates(scores: np.ndarray, n: int, k: int, chunk: int) -> np.ndarray:
    """``indexer_topk_chunk``: the top ``k`` of each chunk of ``chunk`` scores among the first ``n``,
    int32 ``[n_chunks, k]``, best first, padded with -1 where a chunk has fewer than ``k`` rows."""
    s = np.asarray(scores, dtype=f32)[:n]
    out = np.full((-(-n // chunk), k), -1, dtype=np.int32)
    for c in range(out.shape[0]):
        part = s[c * chunk:(c + 1) * chunk]
        sel = topk_select(part, min(k, part.size)) + c * chunk
        out[c, :sel.size] = sel
    return out


def topk_merge(scores: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """``indexer_topk_merge``: the top ``k`` (by score, ties to the lower index) of candidate row
    indices (-1 entries ignored). int32 ``[k]``, padded with -1."""
    s = np.asarray(scores, dtype=f32)
    c = np.asarray(candidates, dtype=np.int64).reshape(-1)
    c = np.unique(c[c >= 0])  # ascending: the stable sort below breaks ties to the lower index
    order = c[np.argsort(-s[c], kind="stable")][:k]
    out = np.full(k, -1, dtype=np.int32)
    out[:order.size] = order
    return out


# ----------------------------------------------------------------------------- attention
def attention_comp(q: np.ndarray, cache: np.ndarray, pos: int, window: int, comp: np.ndarray,
                   rows) -> np.ndarray:
    """Decode attention over the raw window plus compressed rows, one KV head.

    ``q [H, D]``; ``cache [W, D]`` the raw ring buffer (the ``min(pos + 1, W)`` newest positions,
    row ``p % W``); ``comp [n, D]`` compressed rows of which ``rows`` (indices) are attended.
    One softmax over all of them, scale ``1/sqrt(D)``; keys and values are the same rows.
    Returns float32 ``[H, D]``.
    """
    n = min(pos + 1, window)
    raw = np.asarray(cache, dtype=f64)[[(p % window) for p in range(pos - n + 1, pos + 1)]]
    rows = np.asarray(rows, dtype=np.int64)
    kv = np.concatenate([raw, np.asarray(comp, dtype=f64)[rows]]) if rows.size else raw
    s = np.asarray(q, dtype=f64) @ kv.T / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ kv).astype(f32)


def attended_rows(pos: int, ratio: int, top_k: int, selected=None) -> np.ndarray:
    """Compressed rows the token at ``pos`` attends in a ratio-``ratio`` layer: every row for
    ratio 128 or while ``n_comp <= top_k``; else ``selected`` (the indexer's top-k). int32."""
    n = comp_count(pos, ratio)
    if ratio != 4 or n <= top_k:
        return np.arange(n, dtype=np.int32)
    if selected is None:
        raise ValueError(f"position {pos}: {n} compressed rows exceed top-k {top_k}: the selection is needed")
    return np.asarray(selected, dtype=np.int32)[:top_k]
