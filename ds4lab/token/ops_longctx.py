"""Launch sites of the long-context ops (kernels/longctx.cu): the compressor (store, pool,
rotate-store, shift), the indexer (query gated by n_comp, head RoPE, scores, the top-k variants)
and attention over the raw window plus compressed rows.

Same conventions as :mod:`ds4lab.token.ops` (its helpers and :class:`~ds4lab.token.ops.TokenScalars`). The
references are in ``ds4lab/longctx_reference.py`` (module docstrings give ds4's functions).
Position-dependent values (state slot, compressed row, n_comp) are derived from the position on
the device; the launch decisions (emit or not, top-k regime and plan, grids) are the host's,
taken by the model from the position (longctx_reference).
"""

from __future__ import annotations

import numpy as np

from . import longctx_reference as LR
from . import reference as R
from .config import ModelConfig
from .ops import NULL, TokenScalars, cdiv, f32, i32, q8_geometry

#: Compressed rows per ``indexer_score`` block (``LC_INDEX_ROWS`` in kernels/longctx.cu).
INDEX_ROWS = 32


def _topk_threads(sort_n: int) -> int:
    return max(32, min(1024, sort_n // 2))


def _check_ratio(ratio: int) -> None:
    """The compressor kernels know two layouts: ratio 4 (two lanes, 8 state rows) and 128."""
    from .config import COMPRESS_RATIOS

    if ratio not in COMPRESS_RATIOS:
        raise ValueError(f"compression ratio={ratio}: the kernels know {COMPRESS_RATIOS[0]} and {COMPRESS_RATIOS[1]}")


def _check_sort(sort_n: int, k: int) -> None:
    """A top-k sort width: a power of two, at least 2 x top-k, at most ``TOPK_SORT_MAX`` keys."""
    from .config import TOPK_SORT_MAX

    if sort_n & (sort_n - 1) or not 2 * k <= sort_n <= TOPK_SORT_MAX:
        raise ValueError(f"top-k sort width sort_n={sort_n} must be a power of two in 2 x top-k={2 * k} .. "
                         f"{TOPK_SORT_MAX} (bitonic sort in shared memory)")


def comp_store(L, site, kvsc, ape, state_kv, state_sc, width: int, ratio: int, ts: TokenScalars):
    """Compressor store: ``kvsc [2 * width]`` (kv then score) into the state slot of the
    position, the score plus ``ape[pos % ratio]`` (ds4.c ``compressor_decode_one``). States
    fp32 ``[coff * ratio, width]``. Raises ValueError for a ratio other than 4 or 128."""
    _check_ratio(ratio)

    def ref():
        pos = ts.resolve()[0]
        v = np.asarray(kvsc).reshape(-1)
        kv, sc = LR.compressor_store(state_kv, state_sc, v[:width], v[width:2 * width], ape, pos, ratio)
        state_kv[...], state_sc[...] = kv, sc

    L.kernel(site, "comp_store", (cdiv(width, 256),), (256,),
             (kvsc, ape, state_kv, state_sc, i32(width), i32(ratio)) + ts.args(), ref, nbytes=4 * 4 * width)


def comp_pool(L, site, state_kv, state_sc, pooled, D: int, ratio: int):
    """Softmax pool of the compressor state into ``pooled [D]`` (ds4.c ``compressor_pool_decode_state``).
    Raises ValueError for a ratio other than 4 or 128."""
    _check_ratio(ratio)
    rows = 8 if ratio == 4 else ratio

    def ref():
        pooled[:D] = LR.compressor_pool(state_kv, state_sc, D, ratio)

    L.kernel(site, "comp_pool", (cdiv(D, 256),), (256,), (state_kv, state_sc, pooled, i32(D), i32(ratio)), ref,
             nbytes=4 * (2 * rows * D + D))


def comp_rope_store(L, site, row, comp, D: int, ratio: int, cfg: ModelConfig, ts: TokenScalars):
    """On an emit token: ``row`` rotated at ``pos + 1 - ratio`` (base ``compress_rope_theta``) into
    compressed row ``pos // ratio`` of ``comp``; a no-op on any other token (device predicate).
    Raises ValueError for a ratio other than 4 or 128."""
    _check_ratio(ratio)
    theta = cfg.compress_rope_theta

    def ref():
        pos = ts.resolve()[0]
        if LR.is_emit(pos, ratio):
            comp[LR.comp_row(pos, ratio)] = LR.rope_rows(np.asarray(row)[None, :D], pos + 1 - ratio,
                                                         cfg.rope_dims, theta)[0]

    L.kernel(site, "comp_rope_store", (1,), (256,),
             (row, comp, i32(D), i32(cfg.rope_dims), np.float64(theta), i32(ratio)) + ts.args(), ref,
             nbytes=8 * D)


def comp_shift(L, site, state_kv, state_sc, width: int, ratio: int, ts: TokenScalars):
    """After a ratio-4 emit: the state's current block over its previous one (no-op otherwise).
    Raises ValueError for a ratio other than 4 or 128."""
    _check_ratio(ratio)

    def ref():
        pos = ts.resolve()[0]
        if ratio == 4 and LR.is_emit(pos, ratio):
            kv, sc = LR.compressor_shift(state_kv, state_sc, ratio)
            state_kv[...], state_sc[...] = kv, sc

    L.kernel(site, "comp_shift", (cdiv(4 * width, 256),), (256,),
             (state_kv, state_sc, i32(width), i32(ratio)) + ts.args(), ref, nbytes=4 * 4 * 4 * width)


def q8_matvec_when(L, site, w, x, y, ratio: int, min_comp: int, ts: TokenScalars):
    """``y = W x`` (``W`` Q8_0 ``[rows, cols]``, rows even) unless n_comp <= ``min_comp`` on the
    device (stage 3c's indexer projections: skipped while every compressed row is attended)."""
    if w.rows % 2:
        raise ValueError(f"q8_matvec_when: rows={w.rows} must be even (two rows per thread group)")

    def ref():
        if LR.comp_count(ts.resolve()[0], ratio) > min_comp:
            y.reshape(-1)[: w.rows] = R.q8_matvec(w, np.asarray(x).reshape(-1))

    grid, block = q8_geometry(w.rows // 2, w.cols)  # q8_matvec's: the same bits
    L.kernel(site, "q8_matvec_when", grid, block,
             (w.qs, w.d, x, y, i32(w.rows), i32(w.cols), i32(ratio), i32(min_comp)) + ts.args(), ref,
             nbytes=w.nbytes + 4 * (w.cols + w.rows))


def rope_heads(L, site, x, heads: int, D: int, cfg: ModelConfig, ts: TokenScalars, theta: float):
    """RoPE at the position on the last ``rope_dims`` of each of ``heads`` rows of width ``D``
    (the indexer query), in place: ``dense.cu:rope_q`` on another shape."""

    def ref():
        pos = ts.resolve()[0]
        v = np.asarray(x).reshape(-1)
        v[: heads * D] = R.rope(v[: heads * D].reshape(heads, D), pos, cfg.rope_dims, theta).reshape(-1)

    L.kernel(site, "rope_q", (heads,), (max(32, cdiv(cfg.rope_dims // 2, 32) * 32),),
             (x, i32(D), i32(cfg.rope_dims), np.float64(theta)) + ts.args(), ref,
             nbytes=8 * heads * cfg.rope_dims)


def indexer_score(L, site, q, w, keys, scores, blocks: int, cfg: ModelConfig, ratio: int, ts: TokenScalars,
                  min_comp: int = 0):
    """Indexer scores of the ``n_comp`` compressed rows (ds4.c ``indexer_allowed_decode_one``):
    ``scale * sum_h w_h ReLU(q_h . k_c)``, scale ``1/sqrt(index_head_dim * index_heads)``.
    ``blocks`` x :data:`INDEX_ROWS` rows are covered (blocks past n_comp exit at once); nothing
    while n_comp <= ``min_comp`` (stage 3c passes top-k: no selection is used then)."""
    H, Di = cfg.index_heads, cfg.index_head_dim
    scale = 1.0 / np.sqrt(Di * H)

    def ref():
        n = min(LR.comp_count(ts.resolve()[0], ratio), blocks * INDEX_ROWS)
        if n and LR.comp_count(ts.resolve()[0], ratio) > min_comp:
            scores[:n] = LR.indexer_scores(np.asarray(q).reshape(-1)[: H * Di].reshape(H, Di),
                                           np.asarray(w).reshape(-1)[:H], np.asarray(keys)[:n], scale)

    L.kernel(site, "indexer_score", (blocks,), (256,),
             (q, w, keys, scores, i32(H), i32(Di), f32(scale), i32(ratio), i32(min_comp)) + ts.args(), ref,
             nbytes=4 * (blocks * INDEX_ROWS * (Di + 1) + H * (Di + 1)))


def indexer_topk(L, site, scores, selected, sort_n: int, cfg: ModelConfig, ratio: int, ts: TokenScalars):
    """Top ``index_top_k`` of the n_comp scores in one block sorting ``sort_n`` keys (streaming
    when n_comp > sort_n). Best first, ties to the lower index; -1 past n_comp. Raises ValueError
    for a sort width that is not a power of two in ``2 * top_k .. TOPK_SORT_MAX``."""
    k = cfg.index_top_k
    _check_sort(sort_n, k)

    def ref():
        n = LR.comp_count(ts.resolve()[0], ratio)
        sel = LR.topk_merge(scores, np.arange(n), k)  # -1 padded when n < k, as the kernel
        selected[:k] = sel

    L.kernel(site, "indexer_topk", (1,), (_topk_threads(sort_n),),
             (scores, selected, i32(k), i32(sort_n), i32(ratio)) + ts.args(), ref,
             nbytes=4 * (max(sort_n, k) + k))


def indexer_topk_chunk(L, site, scores, cand, blocks: int, chunk: int, cfg: ModelConfig, ratio: int,
                       ts: TokenScalars, min_comp: int = 0):
    """Chunked top-k, first stage: each of ``blocks`` blocks selects the top ``index_top_k`` of
    its ``chunk`` scores into ``cand[b * k ...]`` (-1 padded; all -1 while n_comp <= ``min_comp``).
    Raises ValueError for a chunk that is not a power of two in ``2 * top_k .. TOPK_SORT_MAX``."""
    k = cfg.index_top_k
    _check_sort(chunk, k)

    def ref():
        n = LR.comp_count(ts.resolve()[0], ratio)
        out = np.full((blocks, k), -1, np.int32)
        if n > min_comp:
            c = LR.topk_candidates(scores, n, k, chunk)[:blocks]
            out[: c.shape[0]] = c
        cand[: blocks * k] = out.reshape(-1)

    L.kernel(site, "indexer_topk_chunk", (blocks,), (_topk_threads(chunk),),
             (scores, cand, i32(k), i32(chunk), i32(ratio), i32(min_comp)) + ts.args(), ref,
             nbytes=4 * blocks * (chunk + k))


def indexer_topk_merge(L, site, scores, cand, in_off: int, out, out_off: int, blocks: int, n_sets: int,
                       sort_n: int, cfg: ModelConfig):
    """Chunked top-k, merge: block ``b`` selects the top ``index_top_k`` of candidate sets
    ``[b * group, (b + 1) * group)`` at word ``in_off`` of ``cand`` into word ``out_off + b * k``
    of ``out`` (the scratch for a tree level, the selection for the final merge). Raises
    ValueError when a block's ``group * top_k`` candidates exceed the sort width, or the grid does
    not cover the sets."""
    from .config import TOPK_MERGE_GROUP as G

    k = cfg.index_top_k
    _check_sort(sort_n, k)
    if G * k > sort_n:
        raise ValueError(f"indexer_topk_merge: {G} sets x top-k {k} = {G * k} candidates exceed sort_n={sort_n}")
    if blocks != -(-n_sets // G):
        raise ValueError(f"indexer_topk_merge: blocks={blocks} for n_sets={n_sets} (need {-(-n_sets // G)})")

    def ref():
        c = np.asarray(cand).reshape(-1)[in_off: in_off + n_sets * k].reshape(n_sets, k)
        o = np.asarray(out).reshape(-1)
        for b in range(blocks):
            o[out_off + b * k: out_off + (b + 1) * k] = LR.topk_merge(scores, c[b * G:(b + 1) * G], k)

    L.kernel(site, "indexer_topk_merge", (blocks,), (_topk_threads(sort_n),),
             (scores, cand, i32(in_off), out, i32(out_off), i32(k), i32(n_sets), i32(G), i32(sort_n)), ref,
             nbytes=4 * (2 * n_sets * k + blocks * k))


def attention_comp(L, site, q, cache, comp, sel, o, cfg: ModelConfig, ratio: int, use_sel,
                   ts: TokenScalars, n_rows: int):
    """Attention of all heads over the raw window plus compressed rows (ds4.c
    ``layer_attention_mixed_one``, without sinks): the first ``index_top_k`` entries of ``sel``
    when ``use_sel`` is True (ratio 4 past top-k rows), rows ``0 .. n_comp - 1`` when False, and
    with ``use_sel="device"`` (stage 3c) the kernel picks ``sel`` exactly when n_comp > top-k.
    ``n_rows``: the compressed rows the host expects (bytes estimate only)."""
    k = cfg.index_top_k
    if use_sel not in (True, False, "device"):
        raise ValueError(f"attention_comp: use_sel={use_sel!r}; choose True, False or 'device'")
    flag = 2 if use_sel == "device" else int(bool(use_sel))

    def ref():
        pos, _, _, _ = ts.resolve()
        n = LR.comp_count(pos, ratio)
        on = flag == 1 or (flag == 2 and n > k)
        rows = np.asarray(sel)[: min(k, n)] if on else np.arange(n)
        o[...] = LR.attention_comp(np.asarray(q).reshape(cfg.n_heads, cfg.head_dim), cache, pos, cfg.window,
                                   comp, rows).reshape(o.shape)

    L.kernel(site, "attention_comp", (cfg.n_heads,), (256,),
             (q, cache, comp, NULL if sel is None else sel, o, i32(cfg.head_dim), i32(cfg.window), i32(ratio),
              i32(k), i32(flag)) + ts.args(), ref,
             nbytes=4 * cfg.head_dim * (2 * cfg.n_heads + cfg.window + n_rows))
