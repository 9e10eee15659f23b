"""Launch sites: one function per op of the decode token, each launching one kernel of ``kernels/`` through the
:class:`~ds4lab.capture.launch.Launcher` with the NumPy-reference computation of the same op
(:mod:`ds4lab.token.reference`) for the ``numpy`` backend. Per-token scalars: :class:`TokenScalars`. The long-context
ops are the last section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import reference as R
from .config import BYTES_PER_WEIGHT, MOE_TILE, ModelConfig

i32, u32, f32 = np.int32, np.uint32, np.float32
#: A null device pointer as a kernel argument (8-byte zero).
NULL = np.uint64(0)
WARPS = 8  # warps (rows) per 256-thread block in the warp-per-row kernels
#: Blocks a split launch aims for: about two per SM of an H200 (132 SMs); see split_geometry.
FILL_BLOCKS = 256


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def row_bytes(bank) -> int:
    """Bytes of one row of a (stacked) quantized matrix in its format: ``cols x BYTES_PER_WEIGHT[fmt]`` (any object
    with ``fmt`` and ``cols``: a :class:`~ds4lab.token.weights.QTensor` or a backend's bank)."""
    return int(bank.cols * BYTES_PER_WEIGHT[bank.fmt])


def expert_bytes(bank) -> int:
    """Bytes of one expert's matrix in a routed bank, in its format (``rows x row_bytes``)."""
    return bank.rows * row_bytes(bank)


@dataclass
class TokenScalars:
    """Per-token scalars (position, KV ring-buffer row, window length, token id): by value when ``buf`` is None (ds4
    today), else an int32 ``[4]`` device buffer written before each token."""

    pos: int
    kv_row: int
    n_valid: int
    token_id: int
    buf: Any = None

    def args(self) -> tuple:
        """Kernel arguments ``(const int* scal, pos, kv_row, n_valid, token_id)``."""
        return (NULL if self.buf is None else self.buf, i32(self.pos), i32(self.kv_row),
                i32(self.n_valid), i32(self.token_id))

    def resolve(self) -> tuple[int, int, int, int]:
        """The values a kernel would see (read from ``buf`` when there is one; NumPy only)."""
        if self.buf is None:
            return self.pos, self.kv_row, self.n_valid, self.token_id
        b = np.asarray(self.buf)
        return int(b[0]), int(b[1]), int(b[2]), int(b[3])


def host_scalars(cfg: ModelConfig, pos: int, token_id: int) -> np.ndarray:
    """int32 ``[pos, kv_row, n_valid, token_id]`` for decoding ``token_id`` at ``pos``."""
    return np.array([pos, pos % cfg.window, min(pos + 1, cfg.window), token_id], dtype=np.int32)


# ----------------------------------------------------------------------------- dense
def split_geometry(units: int, chunks: int) -> tuple[tuple, tuple]:
    """Grid and block where a group of ``tpr`` threads (block ``(tpr, 256 // tpr)``) reduces one unit over ``chunks``
    16-byte chunks: the smallest ``tpr`` of 32..256 leaving a thread at most 8 chunks, doubled while the grid has fewer
    than :data:`FILL_BLOCKS` blocks (``docs/design-log.md``, "Q8_0 matvecs"). Returns ``((blocks,), (tpr, groups))``."""
    tpr = 32
    while tpr < 256 and chunks > 8 * tpr:
        tpr *= 2
    while tpr < 256 and 2 * tpr <= chunks and cdiv(units, 256 // tpr) < FILL_BLOCKS:
        tpr *= 2
    groups = 256 // tpr
    return (cdiv(units, groups),), (tpr, groups)


#: Rows per thread group of the Q8_0 matvec kernels: ``Q8_NR`` in ``kernels/q8.cuh`` (a CPU test
#: reads it there). Each 16-byte x chunk a thread reads serves this many rows.
Q8_ROWS = 4
#: Shared memory a block stages x in: 80 bytes per 16 floats (``q8.cuh:q8_stage_x``), at most the
#: 48 KiB a block gets without opting in.
Q8_SMEM_PER_COL, Q8_SMEM_MAX = 5, 48 * 1024
#: Stage x in shared memory where it fits (``smx``); False reads x through L1 in every kernel.
Q8_STAGE_X = True
#: ... and where a block's rows read at least 8 times the x bytes it stages (32 rows): measured on
#: the H200, staging won with 32 rows per block (1024 → 32768: 12.5 vs 14.7 µs; the vocabulary:
#: 135 vs 157 µs) and lost or tied with 16 or fewer (8192 → 4096: 15.4 vs 13.5 µs).
Q8_STAGE_ROWS = 32


@dataclass(frozen=True)
class Q8Launch:
    """Launch configuration of a Q8_0 matvec kernel: grid, block, dynamic shared bytes and the kernel's ``smx``
    argument (1: x staged in shared memory)."""

    grid: tuple
    block: tuple
    shared: int
    smx: int


def q8_launch(units: int, cols: int, rows_per_group: int | None = None) -> Q8Launch:
    """Geometry of the Q8_0 matvec kernels for ``units`` groups of :data:`Q8_ROWS` rows over ``cols`` int8 columns:
    :func:`split_geometry` over ``cols / 16`` chunks, x staged in shared memory when it fits, at least
    :data:`Q8_STAGE_ROWS` rows a block, and with ``rows_per_group`` one x slice per block."""
    grid, block = split_geometry(units, cols // 16)
    rows_per_block = Q8_ROWS * block[1]
    smx = (Q8_STAGE_X and rows_per_block >= Q8_STAGE_ROWS and cols * Q8_SMEM_PER_COL <= Q8_SMEM_MAX
           and (rows_per_group is None or rows_per_group % rows_per_block == 0))
    return Q8Launch(grid, block, cols * Q8_SMEM_PER_COL if smx else 0, int(smx))


def q8_matvec(L, site, w, x, y, rows_per_group=None, group_stride=0):
    """``y [rows] = W x`` (grouped input when ``rows_per_group``): ``kernels/dense.cu:q8_matvec``."""
    rpg = w.rows if rows_per_group is None else rows_per_group

    def ref():
        y.reshape(-1)[: w.rows] = R.q8_matvec(w, np.asarray(x).reshape(-1), rows_per_group, group_stride)

    g = q8_launch(cdiv(w.rows, Q8_ROWS), w.cols, rows_per_group)
    L.kernel(site, "q8_matvec", g.grid, g.block,
             (w.qs, w.d, x, y, i32(w.rows), i32(w.cols), i32(rpg), i32(group_stride), i32(g.smx)), ref,
             nbytes=w.nbytes + 4 * (w.cols * (w.rows // rpg) + w.rows), shared=g.shared)


def q8_matvec_swiglu(L, site, w, x, mid, limit):
    """Shared-expert gate/up + clamped SwiGLU: ``mid [F]`` from ``W [2F, E]``."""
    F = w.rows // 2

    def ref():
        mid[:F] = R.q8_matvec_swiglu(w, x, limit)

    g = q8_launch(cdiv(F, Q8_ROWS // 2), w.cols)
    L.kernel(site, "q8_matvec_swiglu", g.grid, g.block,
             (w.qs, w.d, x, mid, i32(F), i32(w.cols), f32(limit), i32(g.smx)), ref,
             nbytes=w.nbytes + 4 * (w.cols + F), shared=g.shared)


def q8_matvec_expand(L, site, w, x, h, mix, extra, S):
    """``h[s] += post_s * (W x + extra)``: projection, hyper-connection expand, residual add. Raises ValueError when
    ``S * Q8_ROWS`` exceeds a warp (the epilogue's lanes)."""
    if S * Q8_ROWS > 32:
        raise ValueError(f"q8_matvec_expand: S={S} streams x {Q8_ROWS} rows exceed the 32 lanes of the epilogue")

    def ref():
        h[...] = R.expand(h, mix, R.q8_matvec(w, x), None if extra is None else np.asarray(extra).reshape(-1)[: w.rows])

    g = q8_launch(cdiv(w.rows, Q8_ROWS), w.cols)
    L.kernel(site, "q8_matvec_expand", g.grid, g.block,
             (w.qs, w.d, x, h, mix, NULL if extra is None else extra, i32(w.rows), i32(w.cols), i32(S), i32(g.smx)),
             ref, nbytes=w.nbytes + 4 * (w.cols + (2 * S + 1) * w.rows), shared=g.shared)


def norm_threads(dim: int) -> int:
    """Block size of the one-block-per-row norms: one float4 per thread, 32 to 1024 threads."""
    return min(1024, max(32, cdiv(cdiv(dim, 4), 32) * 32))


def rms_norm_rows(L, site, x, w, y, rows, dim, eps):
    """RMS norm of each of ``rows`` rows of width ``dim`` (times ``w`` when not None)."""

    def ref():
        xs = np.asarray(x).reshape(-1)[: rows * dim].reshape(rows, dim)
        y.reshape(-1)[: rows * dim] = R.rms_norm(xs, w, eps).reshape(-1)

    L.kernel(site, "rms_norm_rows", (rows,), (norm_threads(dim),),
             (x, NULL if w is None else w, y, i32(dim), f32(eps)), ref, nbytes=4 * (2 * rows * dim + dim))


#: Partial sums per mixing logit in ``hc_mix`` (``HC_MIX_SPLIT`` in ``kernels/dense.cu``).
HC_MIX_SPLIT = 16


def hc_mix(L, site, hn, wmix, part, S, E):
    """Mixing-logit partial sums ``part [2S, HC_MIX_SPLIT]`` of a hyper-connection."""

    def ref():
        part.reshape(-1)[: 2 * S * HC_MIX_SPLIT] = R.hc_mix_partials(
            np.asarray(hn).reshape(S, E), wmix, HC_MIX_SPLIT).reshape(-1)

    L.kernel(site, "hc_mix", (2 * S, HC_MIX_SPLIT), (256,), (hn, wmix, part, i32(S * E)), ref,
             nbytes=4 * (2 * S * S * E + S * E))


def hc_premix(L, site, h, part, logits, w, x, S, E, eps, nsplit=HC_MIX_SPLIT):
    """Sublayer input ``x [E]`` = norm of the pre-mix of the streams ``h [S, E]`` (one block of 1024 threads); sums
    ``hc_mix``'s partials into ``logits [2S]``, or None when ``part`` holds final logits (``nsplit=1``)."""

    def ref():
        lg = R.sum_partials(np.asarray(part).reshape(-1)[: 2 * S * nsplit].reshape(2 * S, nsplit))
        if logits is not None:
            logits[: 2 * S] = lg
        x[:E] = R.hc_premix(np.asarray(h).reshape(S, E), lg, w, eps)

    L.kernel(site, "hc_premix", (1,), (1024,),
             (h, part, NULL if logits is None else logits, w, x, i32(S), i32(E), i32(nsplit), f32(eps)), ref,
             nbytes=4 * (S * E + 2 * E))


def rope_q(L, site, q, cfg: ModelConfig, ts: TokenScalars, theta: float | None = None):
    """RoPE at the token's position on the last ``rope_dims`` of every query head, in place (base ``theta``, default
    ``cfg.rope_theta``; compressed layers use ``compress_rope_theta``): :func:`rope_heads` over ``[n_heads,
    head_dim]``."""
    rope_heads(L, site, q, cfg.n_heads, cfg.head_dim, cfg, ts, cfg.rope_theta if theta is None else theta)


def rope_store_kv(L, site, kv, cache, cfg: ModelConfig, ts: TokenScalars, theta: float | None = None):
    """RoPE on the KV row, stored at the position's row of the ring-buffer cache ``[W, D]`` (base ``theta``, default
    ``cfg.rope_theta``)."""
    theta = cfg.rope_theta if theta is None else theta

    def ref():
        pos, kv_row, _, _ = ts.resolve()
        cache[kv_row] = R.rope(np.asarray(kv)[None, : cfg.head_dim], pos, cfg.rope_dims, theta)[0]

    L.kernel(site, "rope_store_kv", (1,), (256,),
             (kv, cache, i32(cfg.head_dim), i32(cfg.rope_dims), np.float64(theta)) + ts.args(), ref,
             nbytes=8 * cfg.head_dim)


#: Heads per block and key splits (blocks of one head group: a thread-block cluster on sm_90) of
#: ``attention_decode`` (``ATTN_HPB``, ``ATTN_NS`` in ``kernels/attention.cu``).
ATTN_HPB, ATTN_NS = 4, 8
#: Shared memory ``attention_decode`` may take dynamically: 48 KiB less its static arrays.
ATTN_SMEM = 48 * 1024 - 1024


def attention_splits(cfg: ModelConfig) -> int:
    """Key splits of ``attention_decode``: :data:`ATTN_NS` blocks per head group, each over ``ceil(window / ATTN_NS)``
    keys (fixed per model, so a captured graph's grid fits every window length)."""
    return ATTN_NS


def attention_launch(cfg: ModelConfig) -> tuple[tuple, int, int]:
    """``(grid, kc, shared bytes)`` of ``attention_decode``: grid ``(ceil(H / ATTN_HPB), ATTN_NS)``, ``kc`` the key
    rows a block stages at a time (within :data:`ATTN_SMEM`), and the dynamic shared memory."""
    D, H, HPB = cfg.head_dim, cfg.n_heads, ATTN_HPB
    kps = cdiv(cfg.window, ATTN_NS)
    kc = max(1, min(kps, (ATTN_SMEM // 4 - HPB * D - 4 * HPB) // (D + HPB)))
    floats = HPB * D + max(kc, HPB) * D + HPB * kc + 4 * HPB
    return (cdiv(H, HPB), ATTN_NS), kc, 4 * floats


def attention_scratch(L, cfg: ModelConfig) -> tuple:
    """The attention's split partials owned by ``L``: ``part_o`` float32 ``[H, NS, D]``, ``part_ml`` float32 ``[H, NS,
    2]``, ``counter`` int32 ``[ceil(H / ATTN_HPB)]`` (zero); allocated on the first call (:func:`alloc_scratch`)."""
    H, D, NS = cfg.n_heads, cfg.head_dim, attention_splits(cfg)
    return (L.scratch(("attention.part_o", H, NS, D), (H * NS * D,), np.float32),
            L.scratch(("attention.part_ml", H, NS), (H * NS * 2,), np.float32),
            L.scratch(("attention.counter", H), (cdiv(H, ATTN_HPB),), np.int32))


def alloc_scratch(L, cfg: ModelConfig) -> None:
    """Allocate every op-owned scratch buffer for ``cfg`` now (model build time), so no launch site allocates later,
    inside a capture."""
    attention_scratch(L, cfg)


def attention_decode(L, site, q, cache, o, cfg: ModelConfig, ts: TokenScalars):
    """Sliding-window attention of all heads over the cached window, split over keys with the combine inside the kernel
    (``kernels/attention.cu``); scratch from :func:`attention_scratch`."""

    def ref():
        pos, kv_row, n_valid, _ = ts.resolve()
        # The cache row of position p is p % W; kernel and reference agree when kv_row == pos % W.
        o[...] = R.attention_decode(np.asarray(q).reshape(cfg.n_heads, cfg.head_dim), cache,
                                    pos, cfg.window).reshape(o.shape)

    part_o, part_ml, counter = attention_scratch(L, cfg)
    grid, kc, shared = attention_launch(cfg)
    L.kernel(site, "attention_decode", grid, (256,),
             (q, cache, o, i32(cfg.head_dim), i32(cfg.window), i32(cfg.n_heads), i32(kc), part_o, part_ml, counter)
             + ts.args(), ref,
             nbytes=4 * cfg.head_dim * (2 * cfg.n_heads + cfg.window), shared=shared)


def embed_token(L, site, h, cfg: ModelConfig, key: int, ts: TokenScalars):
    """The token's input embedding copied into all hyper-connection streams ``h [S, E]``."""
    from .weights import embed_row

    def ref():
        tok = ts.resolve()[3]
        h[...] = np.broadcast_to(embed_row(cfg.seed, tok, cfg.embed), h.shape)

    L.kernel(site, "embed_token", (cdiv(cfg.embed, 256),), (256,),
             (h, i32(cfg.hc_streams), i32(cfg.embed), u32(key)) + ts.args(), ref,
             nbytes=4 * cfg.hc_streams * cfg.embed)


# ----------------------------------------------------------------------------- router
def router_logits(L, site, w, x, logits, T, cfg: ModelConfig):
    """Router logits ``[T, N]`` for ``T`` tokens ``x [T, E]``."""
    N, E = cfg.n_experts, cfg.embed

    def ref():
        logits.reshape(-1)[: T * N] = R.router_logits(w, np.asarray(x).reshape(-1)[: T * E].reshape(T, E)).reshape(-1)

    (blocks,), block = split_geometry(N, E // 4)
    L.kernel(site, "router_logits", (blocks, T), block, (w, x, logits, i32(N), i32(E)), ref,
             nbytes=4 * (N * E + T * E + T * N))


def router_topk(L, site, logits, ids, wts, T, cfg: ModelConfig):
    """Top-``n_used`` experts and their normalized sigmoid weights per token: one warp per token
    (``kernels/router.cu:router_topk``). Raises ValueError for more than 32 experts per token."""
    N, k = cfg.n_experts, cfg.n_used
    if k > 32:
        raise ValueError(f"router_topk: n_used={k} exceeds the 32 lanes that hold the selection")

    def ref():
        i, w = R.router_topk(np.asarray(logits).reshape(-1)[: T * N].reshape(T, N), k)
        ids.reshape(-1)[: T * k] = i.reshape(-1)
        wts.reshape(-1)[: T * k] = w.reshape(-1)

    L.kernel(site, "router_topk", (T,), (32,), (logits, ids, wts, i32(N), i32(k)), ref,
             nbytes=4 * T * (N + 2 * k))


def router_hash(L, site, logits, ids, wts, T, cfg: ModelConfig, layer: int, key: int,
                token_ids=None, ts: TokenScalars | None = None):
    """Hash routing (first ``n_hash_layers`` layers): experts from the token ids in ``token_ids [T]`` (device) or,
    for one decode token, ``ts``."""
    from .weights import hash_experts

    N, k = cfg.n_experts, cfg.n_used
    if token_ids is None and (ts is None or T != 1):
        raise ValueError(f"router_hash: T={T} tokens need a token_ids buffer")

    def ref():
        toks = np.asarray(token_ids)[:T] if token_ids is not None else [ts.resolve()[3]]
        sel = np.stack([hash_experts(cfg.seed, int(t), layer, k, N) for t in toks])
        lg = np.asarray(logits).reshape(-1)[: T * N].reshape(T, N)
        ids.reshape(-1)[: T * k] = sel.reshape(-1)
        wts.reshape(-1)[: T * k] = R.router_weights(lg, sel).reshape(-1)

    scal = ts.args() if ts is not None else (NULL, i32(0), i32(0), i32(0), i32(0))
    L.kernel(site, "router_hash", (T,), (32,),
             (logits, ids, wts, i32(N), i32(k), u32(key), NULL if token_ids is None else token_ids) + scal, ref,
             nbytes=4 * T * (1 + 3 * k))


# ----------------------------------------------------------------------------- routed MoE
@dataclass(frozen=True)
class KernelStamp:
    """Profiling points a routed-MoE stage kernel writes itself (``kernels/moe.cu:moe_stamp``): ``%globaltimer`` into
    ``slots[first : first + n]`` as it starts; ``write``: the NumPy reference's stand-in, or None."""

    slots: Any
    first: int
    n: int
    write: Any = None


def stamp_args(stamp: KernelStamp | None) -> tuple:
    """The kernel arguments ``(stamp, stamp_first, stamp_n)`` of a routed-MoE stage kernel."""
    if stamp is None:
        return (NULL, i32(0), i32(0))
    return (stamp.slots, i32(stamp.first), i32(stamp.n))


def stamped(ref, stamp: KernelStamp | None):
    """``ref`` preceded by the stamp's reference write (the kernel stamps as it starts)."""
    if stamp is None or stamp.write is None:
        return ref

    def both():
        stamp.write()
        ref()

    return both


def xq_quantize(L, site, x, q, d, T, n, stamp=None):
    """``xq``: fp32 ``x [T, n]`` to Q8_K ``(q [T, n], d [T, n/256])``."""

    def ref():
        qq, dd = R.quantize_q8k(np.asarray(x).reshape(-1)[: T * n].reshape(T, n))
        q.reshape(-1)[: T * n] = qq.reshape(-1)
        d.reshape(-1)[: T * n // 256] = dd.reshape(-1)

    L.kernel(site, "xq_quantize", (n // 256, T), (256,), (x, q, d, i32(n)) + stamp_args(stamp), stamped(ref, stamp),
             nbytes=5 * T * n + T * n // 64)


def moe_count(L, site, ids, counts, P):
    def ref():
        np.add.at(counts, np.asarray(ids).reshape(-1)[:P], 1)

    L.kernel(site, "moe_count", (cdiv(P, 256),), (256,), (ids, counts, i32(P)), ref, nbytes=8 * P)


def moe_prefix(L, site, counts, offsets, cursor, N):
    def ref():
        c = np.asarray(counts)[:N]
        offsets[:N] = np.concatenate([[0], np.cumsum(c)[:-1]])
        cursor[:N] = offsets[:N]

    L.kernel(site, "moe_prefix", (1,), (cdiv(N, 32) * 32,), (counts, offsets, cursor, i32(N)), ref, nbytes=12 * N)


def moe_scatter(L, site, ids, cursor, sorted_pairs, P):
    def ref():
        for p, e in enumerate(np.asarray(ids).reshape(-1)[:P]):
            if cursor[e] < P:
                sorted_pairs[cursor[e]] = p
            cursor[e] += 1

    L.kernel(site, "moe_scatter", (cdiv(P, 256),), (256,), (ids, cursor, sorted_pairs, i32(P)), ref, nbytes=12 * P)


def moe_tiles(L, site, counts, offsets, tiles, n_tiles, N):
    def ref():
        t = [(e, offsets[e] + s, min(MOE_TILE, counts[e] - s))
             for e in range(N) for s in range(0, int(counts[e]), MOE_TILE)][:max_t]
        if t:
            tiles.reshape(-1, 3)[: len(t)] = np.array(t, dtype=np.int32)
        n_tiles[0] = len(t)

    max_t = tiles.shape[0]
    L.kernel(site, "moe_tiles", (1,), (cdiv(N, 32) * 32,), (counts, offsets, tiles, n_tiles, i32(N), i32(max_t)), ref,
             nbytes=8 * N + 12 * N)


#: Rows per warp of the decode MoE kernels (``MOE_GU_RPW``, ``MOE_DN_RPW`` in ``kernels/moe.cu``; a CPU
#: test reads them there): the gate/up kernel's warp takes ``MOE_GU_RPW / 2`` gate rows and their
#: up rows.
MOE_GU_RPW, MOE_DN_RPW = 2, 4
#: Whether the gate/up and the down kernel stage their activation row in shared memory: the faster
#: way of each on the H200 (``scripts/bench_kernels.py``: gate/up 16.6 µs staged, down 9.5 µs not).
MOE_GU_STAGE, MOE_DN_STAGE = True, False


def moe_stage(cols: int, stage: bool) -> tuple[int, int]:
    """``(shared bytes, smx)`` of a decode MoE kernel whose Q8_K activation row has ``cols`` values: staged in shared
    memory (48 bytes per 32 values) when ``stage`` and it fits in 48 KiB."""
    nbytes = 3 * cols // 2
    return (nbytes, 1) if stage and nbytes <= 48 * 1024 else (0, 0)


def moe_gateup_decode(L, site, bank_gu, xq, xd, ids, gate, up, P, cfg: ModelConfig, stamp=None):
    """``gateup`` without sort: one (token, expert) pair per grid row, ``MOE_GU_RPW / 2`` gate rows and their up rows
    per warp (``kernels/moe.cu``)."""
    F, E, k = cfg.expert_ffn, cfg.embed, cfg.n_used

    def ref():
        flat = np.asarray(ids).reshape(-1)
        for p in range(P):
            t = p // k
            y = R.expert_matvec(bank_gu[int(flat[p])], xq[t], xd[t])
            gate[p], up[p] = y[:F], y[F:]

    shared, smx = moe_stage(E, MOE_GU_STAGE)
    L.kernel(site, "moe_gateup_decode", (cdiv(F, WARPS * MOE_GU_RPW // 2), P), (256,),
             (bank_gu.qs, bank_gu.d, xq, xd, ids, gate, up, i32(k), i32(F), i32(E), i32(cfg.n_experts), i32(smx))
             + stamp_args(stamp), stamped(ref, stamp), nbytes=P * (expert_bytes(bank_gu) + E + 8 * F), shared=shared)


def _for_tiles(sorted_pairs, tiles, n_tiles, P, n_experts):
    """Reference walk of the tile list: (expert, pair) as the tiled kernels see them, with the kernels' bounds checks
    (stale counts can leave tiles pointing past the pair list)."""
    for e, start, cnt in np.asarray(tiles).reshape(-1, 3)[: int(np.asarray(n_tiles)[0])]:
        if not (0 <= e < n_experts) or not (0 <= start < P):
            continue
        for p in np.asarray(sorted_pairs)[start:start + min(cnt, P - start)]:
            if 0 <= p < P:
                yield int(e), int(p)


def _tiled_bytes(bank, P, cfg: ModelConfig) -> int:
    """Weight bytes a tiled expert kernel reads: its expert once per tile, for the tile count expected under uniform
    routing (:func:`ds4lab.token.reference.expected_tiles`)."""
    tiles = R.expected_tiles(P // cfg.n_used, cfg.n_used, cfg.n_experts)
    return int(round(tiles * expert_bytes(bank)))


def moe_gateup_tiled(L, site, bank_gu, xq, xd, sorted_pairs, tiles, n_tiles, gate, up, max_t, P, cfg: ModelConfig,
                     stamp=None):
    """``gateup`` on expert tiles (tokens > 1): each weight row is read once per tile."""
    F, E, k = cfg.expert_ffn, cfg.embed, cfg.n_used

    def ref():
        for e, p in _for_tiles(sorted_pairs, tiles, n_tiles, P, cfg.n_experts):
            y = R.expert_matvec(bank_gu[e], xq[p // k], xd[p // k])
            gate[p], up[p] = y[:F], y[F:]

    L.kernel(site, "moe_gateup_tiled", (cdiv(2 * F, WARPS), max_t), (256,),
             (bank_gu.qs, bank_gu.d, xq, xd, sorted_pairs, tiles, n_tiles, gate, up, i32(k), i32(F), i32(E),
              i32(P), i32(cfg.n_experts)) + stamp_args(stamp), stamped(ref, stamp),
             nbytes=_tiled_bytes(bank_gu, P, cfg) + max_t * 12)


def moe_midq(L, site, gate, up, mq, md, P, cfg: ModelConfig, stamp=None):
    """``midq``: clamped SwiGLU of gate/up ``[P, F]`` quantized to Q8_K."""
    F = cfg.expert_ffn

    def ref():
        q, d = R.moe_midq(gate[:P], up[:P], cfg.swiglu_limit)
        mq[:P], md[:P] = q, d

    L.kernel(site, "moe_midq", (F // 256, P), (256,), (gate, up, mq, md, i32(F), f32(cfg.swiglu_limit)) + stamp_args(stamp),
             stamped(ref, stamp), nbytes=P * F * 9)


def moe_down_decode(L, site, bank_dn, mq, md, ids, out, P, cfg: ModelConfig, stamp=None):
    """``down`` without sort: expert down projection per pair into ``out [P, E]``."""
    F, E = cfg.expert_ffn, cfg.embed

    def ref():
        flat = np.asarray(ids).reshape(-1)
        for p in range(P):
            out[p] = R.expert_matvec(bank_dn[int(flat[p])], mq[p], md[p])

    shared, smx = moe_stage(F, MOE_DN_STAGE)
    L.kernel(site, "moe_down_decode", (cdiv(E, WARPS * MOE_DN_RPW), P), (256,),
             (bank_dn.qs, bank_dn.d, mq, md, ids, out, i32(F), i32(E), i32(cfg.n_experts), i32(smx)) + stamp_args(stamp),
             stamped(ref, stamp), nbytes=P * (expert_bytes(bank_dn) + F + 4 * E), shared=shared)


def moe_down_tiled(L, site, bank_dn, mq, md, sorted_pairs, tiles, n_tiles, out, max_t, P, cfg: ModelConfig,
                   stamp=None):
    """``down`` on expert tiles (tokens > 1)."""
    F, E, k = cfg.expert_ffn, cfg.embed, cfg.n_used

    def ref():
        for e, p in _for_tiles(sorted_pairs, tiles, n_tiles, P, cfg.n_experts):
            out[p] = R.expert_matvec(bank_dn[e], mq[p], md[p])

    L.kernel(site, "moe_down_tiled", (cdiv(E, WARPS), max_t), (256,),
             (bank_dn.qs, bank_dn.d, mq, md, sorted_pairs, tiles, n_tiles, out, i32(k), i32(F), i32(E),
              i32(P), i32(cfg.n_experts)) + stamp_args(stamp), stamped(ref, stamp),
             nbytes=_tiled_bytes(bank_dn, P, cfg) + max_t * 12)


def moe_sum(L, site, out, wts, y, T, cfg: ModelConfig, stamp=None):
    """``sum``: weighted sum of each token's expert outputs into ``y [T, E]``."""
    E, k = cfg.embed, cfg.n_used

    def ref():
        y[:T] = R.moe_sum(out[: T * k], np.asarray(wts).reshape(-1)[: T * k].reshape(T, k))

    L.kernel(site, "moe_sum", (cdiv(E, 256), T), (256,), (out, wts, y, i32(k), i32(E)) + stamp_args(stamp),
             stamped(ref, stamp), nbytes=4 * T * (k * E + E + k))


# ----------------------------------------------------------------------------- routed MoE, ds4's path
# kernels/moe_ds4.cu: ds4's four launches at one token (ds4_cuda.cu at b0309611) over its expert formats
# (Q4_K, Q2_K, IQ2_XXS super-blocks); Q8_K activations as three arrays (quants, scales, sums of 16).

#: Dynamic shared memory a ds4-path block may take without opting in to more (CUDA: 48 KiB).
DS4_SMEM_MAX = 48 * 1024
#: Bytes of the IQ2_XXS grid a gate/up block stages after its weight rows.
IQ2_GRID_BYTES = 256 * 8


def ds4_rows(what: str, rows: int, width: int, copies: int, extra_per_row: int = 0,
             extra: int = 0) -> tuple[int, int]:
    """Rows per block ``R`` of a ds4-path kernel and its dynamic shared memory: the largest of 16, 8, 4, 2, 1 that
    divides ``rows``, makes a tile of ``width``-byte rows whole 16-byte chunks and keeps ``copies * R * width +
    extra_per_row * R + extra`` within :data:`DS4_SMEM_MAX`. Returns ``(R, shared bytes)``. Raises ValueError: no ``R``
    fits (the message names the row width and the budget)."""
    for r in (16, 8, 4, 2, 1):
        smem = copies * r * width + extra_per_row * r + extra
        if rows % r == 0 and (r * width) % 16 == 0 and smem <= DS4_SMEM_MAX:
            return r, smem
    raise ValueError(f"{what}: no rows-per-block fits: rows={rows}, row bytes={width}, {copies} tile(s), "
                     f"{DS4_SMEM_MAX} bytes of shared memory")


def _act_bytes(n: int) -> int:
    """Bytes of one Q8_K row of ``n`` values: quants, fp32 scales, int16 sums of 16."""
    return n + n // 64 + n // 8


def xq_quantize_q8k(L, site, x, q, d, bs, T, n, kernel: str = "xq_quantize_q8k"):
    """``xq`` (ds4): fp32 ``x [T, n]`` to Q8_K (``reference.quantize_q8k_ds4``): ``q`` int8 ``[T, n]``, ``d`` fp32
    ``[T, n / 256]``, ``bs`` int16 ``[T, n / 16]``; ``kernel`` ``moe_midq_q8k`` for the middle (the same code)."""

    def ref():
        qq, dd, bb = R.quantize_q8k_ds4(np.asarray(x).reshape(-1)[: T * n].reshape(T, n))
        q.reshape(-1)[: T * n] = qq.reshape(-1)
        d.reshape(-1)[: T * n // 256] = dd.reshape(-1)
        bs.reshape(-1)[: T * n // 16] = bb.reshape(-1)

    L.kernel(site, kernel, (n // 256, T), (256,), (x, q, d, bs, i32(n)), ref, nbytes=T * (4 * n + _act_bytes(n)))


def moe_midq_q8k(L, site, mid, mq, md, mb, P, cfg: ModelConfig):
    """``midq`` (ds4): the weighted SwiGLU middle ``mid [P, F]`` to Q8_K (``mq``, ``md``, ``mb``)."""
    xq_quantize_q8k(L, site, mid, mq, md, mb, P, cfg.expert_ffn, kernel="moe_midq_q8k")


def _gateup_launch(bank_gu, cfg: ModelConfig, kind: str) -> tuple[str, int, int]:
    """Kernel name, rows per block and shared bytes of a ds4-path gate/up launch."""
    fmt = bank_gu.fmt
    if fmt not in ("iq2_xxs", "q4_k"):
        raise ValueError(f"{kind}: gate/up format {fmt!r}; the ds4 path has iq2_xxs and q4_k kernels")
    r, smem = ds4_rows(kind, cfg.expert_ffn, row_bytes(bank_gu), 2, extra=IQ2_GRID_BYTES if fmt == "iq2_xxs" else 0)
    return f"{kind}_{fmt}", r, smem


def _down_launch(bank_dn, cfg: ModelConfig, kind: str, copies: int) -> tuple[str, int, int]:
    """Kernel name, rows per block and shared bytes of a ds4-path down launch (``copies`` experts staged)."""
    fmt = bank_dn.fmt
    if fmt not in ("q2_k", "q4_k"):
        raise ValueError(f"{kind}: down format {fmt!r}; the ds4 path has q2_k and q4_k kernels")
    r, smem = ds4_rows(kind, cfg.embed, row_bytes(bank_dn), copies, extra_per_row=4 * copies)
    return f"{kind}_{fmt}", r, smem


def _gateup_ref(bank_gu, xq, xd, wts, mid, pairs, cfg: ModelConfig):
    """Reference of the fused gate/up for ``(pair, expert)`` items: ``mid[p]`` (zero for an expert outside the bank, as
    the decode kernel writes)."""
    k, w = cfg.n_used, np.asarray(wts).reshape(-1)
    for p, e in pairs:
        if 0 <= e < cfg.n_experts:
            mid[p] = R.moe_gateup_mid(bank_gu[e], xq[p // k], xd[p // k], w[p], cfg.swiglu_limit)
        else:
            mid[p] = 0.0


def moe_gateup_mid(L, site, bank_gu, grid, xq, xd, xb, ids, wts, mid, P, cfg: ModelConfig):
    """``gateup`` (ds4, no sort): per pair, clamped SwiGLU of its expert's gate and up rows against the Q8_K input,
    times its router weight, into ``mid [P, F]``; grid ``(F / R, P)``. ``grid``: the IQ2_XXS codebook on the device.
    Raises ValueError for a format the path has no kernel for."""
    F, E, k = cfg.expert_ffn, cfg.embed, cfg.n_used
    name, r, smem = _gateup_launch(bank_gu, cfg, "moe_gateup_mid")

    def ref():
        flat = np.asarray(ids).reshape(-1)
        _gateup_ref(bank_gu, xq, xd, wts, mid, ((p, int(flat[p])) for p in range(P)), cfg)

    L.kernel(site, name, (F // r, P), (256,),
             (bank_gu.qs, NULL if grid is None else grid, xq, xd, xb, ids, wts, mid, i32(k), i32(F), i32(E),
              i32(cfg.n_experts), i32(r), f32(cfg.swiglu_limit)), ref, shared=smem,
             nbytes=P * (expert_bytes(bank_gu) + _act_bytes(E) + 4 * F + 8))


def moe_down_sum(L, site, bank_dn, mq, md, mb, ids, y, T, cfg: ModelConfig):
    """``down`` (ds4, no sort) with the experts' sum fused into ``y [T, E]``, slots in order; grid ``(E / R, T)``.
    Raises ValueError for a format the path has no kernel for."""
    F, E, k = cfg.expert_ffn, cfg.embed, cfg.n_used
    name, r, smem = _down_launch(bank_dn, cfg, "moe_down_sum", k)

    def ref():
        flat = np.asarray(ids).reshape(-1)
        for t in range(T):
            sl = range(t * k, (t + 1) * k)
            downs = [bank_dn[int(flat[p])] if 0 <= flat[p] < cfg.n_experts else None for p in sl]
            y[t] = R.moe_down_sum(downs, mq[t * k:(t + 1) * k], md[t * k:(t + 1) * k]) if any(
                w is not None for w in downs) else 0.0

    L.kernel(site, name, (E // r, T), (256,),
             (bank_dn.qs, mq, md, mb, ids, y, i32(k), i32(F), i32(E), i32(cfg.n_experts), i32(r)), ref,
             shared=smem, nbytes=T * k * (expert_bytes(bank_dn) + _act_bytes(F) + 4) + 4 * T * E)


def moe_gateup_mid_tiled(L, site, bank_gu, grid, xq, xd, xb, sorted_pairs, tiles, n_tiles, wts, mid, max_t, P,
                         cfg: ModelConfig):
    """``gateup`` (ds4 formats, tokens > 1) on expert tiles: each block stages its rows of the tile's expert once and
    runs them against every pair of the tile into ``mid``. Grid ``(F / R, max_t)``."""
    F, E, k = cfg.expert_ffn, cfg.embed, cfg.n_used
    name, r, smem = _gateup_launch(bank_gu, cfg, "moe_gateup_mid_tiled")

    def ref():
        _gateup_ref(bank_gu, xq, xd, wts, mid,
                    ((p, e) for e, p in _for_tiles(sorted_pairs, tiles, n_tiles, P, cfg.n_experts)), cfg)

    L.kernel(site, name, (F // r, max_t), (256,),
             (bank_gu.qs, NULL if grid is None else grid, xq, xd, xb, sorted_pairs, tiles, n_tiles, wts, mid,
              i32(k), i32(F), i32(E), i32(P), i32(cfg.n_experts), i32(r), f32(cfg.swiglu_limit)), ref,
             shared=smem, nbytes=_tiled_bytes(bank_gu, P, cfg) + P * (_act_bytes(E) + 4 * F) + max_t * 12)


def moe_down_tiled_ds4(L, site, bank_dn, mq, md, mb, sorted_pairs, tiles, n_tiles, out, max_t, P,
                       cfg: ModelConfig):
    """``down`` (ds4 formats, tokens > 1) on expert tiles: ``out [P, E]``, one row per pair (the sum follows:
    :func:`moe_sum_slots`). Grid ``(E / R, max_t)``."""
    F, E = cfg.expert_ffn, cfg.embed
    name, r, smem = _down_launch(bank_dn, cfg, "moe_down_tiled", 1)
    smem -= 4 * r  # no partial sums in the tiled kernel

    def ref():
        for e, p in _for_tiles(sorted_pairs, tiles, n_tiles, P, cfg.n_experts):
            out[p] = R.moe_down_sum([bank_dn[e]], mq[p:p + 1], md[p:p + 1])

    L.kernel(site, name, (E // r, max_t), (256,),
             (bank_dn.qs, mq, md, mb, sorted_pairs, tiles, n_tiles, out, i32(F), i32(E), i32(P),
              i32(cfg.n_experts), i32(r)), ref,
             shared=smem, nbytes=_tiled_bytes(bank_dn, P, cfg) + P * (_act_bytes(F) + 4 * E) + max_t * 12)


def moe_sum_slots(L, site, out, y, T, cfg: ModelConfig):
    """``sum`` (ds4 formats, tokens > 1): ``y[t] = sum_s out[t k + s]`` in slot order; no weights (ds4 puts them into
    the middle; ds4_cuda.cu ``moe_sum_kernel``)."""
    E, k = cfg.embed, cfg.n_used

    def ref():
        o = np.asarray(out)[: T * k].astype(np.float64).reshape(T, k, E)
        y[:T] = o.sum(axis=1).astype(np.float32)

    L.kernel(site, "moe_sum_slots", (cdiv(E, 256), T), (256,), (out, y, i32(k), i32(E)), ref,
             nbytes=4 * T * (k * E + E))


# ----------------------------------------------------------------------------- long-context launch sites
# kernels/longctx.cu; references in ds4lab.token.reference. The device derives slot, row and n_comp from the
# position; the launch decisions (emit, top-k regime and plan, grids) are the host's (docs/model.md).

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
    """Compressor store: ``kvsc [2 * width]`` (kv then score) into the state slot of the position, the score plus
    ``ape[pos % ratio]`` (ds4.c ``compressor_decode_one``). States fp32 ``[coff * ratio, width]``. Raises ValueError
    for a ratio other than 4 or 128."""
    _check_ratio(ratio)

    def ref():
        pos = ts.resolve()[0]
        v = np.asarray(kvsc).reshape(-1)
        kv, sc = R.compressor_store(state_kv, state_sc, v[:width], v[width:2 * width], ape, pos, ratio)
        state_kv[...], state_sc[...] = kv, sc

    L.kernel(site, "comp_store", (cdiv(width, 256),), (256,),
             (kvsc, ape, state_kv, state_sc, i32(width), i32(ratio)) + ts.args(), ref, nbytes=4 * 4 * width)


def comp_pool(L, site, state_kv, state_sc, pooled, D: int, ratio: int):
    """Softmax pool of the compressor state into ``pooled [D]`` (ds4.c ``compressor_pool_decode_state``). Raises
    ValueError for a ratio other than 4 or 128."""
    _check_ratio(ratio)
    rows = 8 if ratio == 4 else ratio

    def ref():
        pooled[:D] = R.compressor_pool(state_kv, state_sc, D, ratio)

    L.kernel(site, "comp_pool", (cdiv(D, 256),), (256,), (state_kv, state_sc, pooled, i32(D), i32(ratio)), ref,
             nbytes=4 * (2 * rows * D + D))


def comp_rope_store(L, site, row, comp, D: int, ratio: int, cfg: ModelConfig, ts: TokenScalars):
    """On an emit token: ``row`` rotated at ``pos + 1 - ratio`` (base ``compress_rope_theta``) into compressed row
    ``pos // ratio`` of ``comp``; a no-op on any other token (device predicate). Raises ValueError for a ratio other
    than 4 or 128."""
    _check_ratio(ratio)
    theta = cfg.compress_rope_theta

    def ref():
        pos = ts.resolve()[0]
        if R.is_emit(pos, ratio):
            comp[R.comp_row(pos, ratio)] = R.rope(np.asarray(row)[None, :D], pos + 1 - ratio, cfg.rope_dims, theta)[0]

    L.kernel(site, "comp_rope_store", (1,), (256,),
             (row, comp, i32(D), i32(cfg.rope_dims), np.float64(theta), i32(ratio)) + ts.args(), ref,
             nbytes=8 * D)


def comp_shift(L, site, state_kv, state_sc, width: int, ratio: int, ts: TokenScalars):
    """After a ratio-4 emit: the state's current block over its previous one (no-op otherwise). Raises ValueError for a
    ratio other than 4 or 128."""
    _check_ratio(ratio)

    def ref():
        pos = ts.resolve()[0]
        if ratio == 4 and R.is_emit(pos, ratio):
            kv, sc = R.compressor_shift(state_kv, state_sc, ratio)
            state_kv[...], state_sc[...] = kv, sc

    L.kernel(site, "comp_shift", (cdiv(4 * width, 256),), (256,),
             (state_kv, state_sc, i32(width), i32(ratio)) + ts.args(), ref, nbytes=4 * 4 * 4 * width)


def q8_matvec_when(L, site, w, x, y, ratio: int, min_comp: int, ts: TokenScalars):
    """``y = W x`` (``W`` Q8_0 ``[rows, cols]``) unless n_comp <= ``min_comp`` on the device (stage 3c's indexer
    projections: skipped while every compressed row is attended)."""

    def ref():
        if R.comp_count(ts.resolve()[0], ratio) > min_comp:
            y.reshape(-1)[: w.rows] = R.q8_matvec(w, np.asarray(x).reshape(-1))

    g = q8_launch(cdiv(w.rows, Q8_ROWS), w.cols)  # q8_matvec's: the same bits
    L.kernel(site, "q8_matvec_when", g.grid, g.block,
             (w.qs, w.d, x, y, i32(w.rows), i32(w.cols), i32(ratio), i32(min_comp), i32(g.smx)) + ts.args(), ref,
             nbytes=w.nbytes + 4 * (w.cols + w.rows), shared=g.shared)


def rope_heads(L, site, x, heads: int, D: int, cfg: ModelConfig, ts: TokenScalars, theta: float):
    """RoPE at the position on the last ``rope_dims`` of each of ``heads`` rows of width ``D``, in place (the kernel
    ``dense.cu:rope_q``: the query heads, the indexer query)."""

    def ref():
        pos = ts.resolve()[0]
        v = np.asarray(x).reshape(-1)
        v[: heads * D] = R.rope(v[: heads * D].reshape(heads, D), pos, cfg.rope_dims, theta).reshape(-1)

    L.kernel(site, "rope_q", (heads,), (max(32, cdiv(cfg.rope_dims // 2, 32) * 32),),
             (x, i32(D), i32(cfg.rope_dims), np.float64(theta)) + ts.args(), ref,
             nbytes=8 * heads * cfg.rope_dims)


def indexer_score(L, site, q, w, keys, scores, blocks: int, cfg: ModelConfig, ratio: int, ts: TokenScalars,
                  min_comp: int = 0):
    """Indexer scores of the ``n_comp`` compressed rows (``scale * sum_h w_h ReLU(q_h . k_c)``); ``blocks`` x
    :data:`INDEX_ROWS` rows covered, nothing while n_comp <= ``min_comp``."""
    H, Di = cfg.index_heads, cfg.index_head_dim
    scale = 1.0 / np.sqrt(Di * H)

    def ref():
        n = min(R.comp_count(ts.resolve()[0], ratio), blocks * INDEX_ROWS)
        if n and R.comp_count(ts.resolve()[0], ratio) > min_comp:
            scores[:n] = R.indexer_scores(np.asarray(q).reshape(-1)[: H * Di].reshape(H, Di),
                                           np.asarray(w).reshape(-1)[:H], np.asarray(keys)[:n], scale)

    L.kernel(site, "indexer_score", (blocks,), (256,),
             (q, w, keys, scores, i32(H), i32(Di), f32(scale), i32(ratio), i32(min_comp)) + ts.args(), ref,
             nbytes=4 * (blocks * INDEX_ROWS * (Di + 1) + H * (Di + 1)))


def indexer_topk(L, site, scores, selected, sort_n: int, cfg: ModelConfig, ratio: int, ts: TokenScalars):
    """Top ``index_top_k`` of the n_comp scores in one block sorting ``sort_n`` keys (streaming when n_comp > sort_n).
    Best first, ties to the lower index; -1 past n_comp. Raises ValueError for a sort width that is not a power of
    two in ``2 * top_k .. TOPK_SORT_MAX``."""
    k = cfg.index_top_k
    _check_sort(sort_n, k)

    def ref():
        n = R.comp_count(ts.resolve()[0], ratio)
        sel = R.topk_merge(scores, np.arange(n), k)  # -1 padded when n < k, as the kernel
        selected[:k] = sel

    L.kernel(site, "indexer_topk", (1,), (_topk_threads(sort_n),),
             (scores, selected, i32(k), i32(sort_n), i32(ratio)) + ts.args(), ref,
             nbytes=4 * (max(sort_n, k) + k))


def indexer_topk_chunk(L, site, scores, cand, blocks: int, chunk: int, cfg: ModelConfig, ratio: int,
                       ts: TokenScalars, min_comp: int = 0):
    """Chunked top-k, first stage: each of ``blocks`` blocks selects the top ``index_top_k`` of its ``chunk`` scores
    into ``cand[b * k ...]`` (-1 padded; all -1 while n_comp <= ``min_comp``). Raises ValueError for a chunk that is
    not a power of two in ``2 * top_k .. TOPK_SORT_MAX``."""
    k = cfg.index_top_k
    _check_sort(chunk, k)

    def ref():
        n = R.comp_count(ts.resolve()[0], ratio)
        out = np.full((blocks, k), -1, np.int32)
        if n > min_comp:
            c = R.topk_candidates(scores, n, k, chunk)[:blocks]
            out[: c.shape[0]] = c
        cand[: blocks * k] = out.reshape(-1)

    L.kernel(site, "indexer_topk_chunk", (blocks,), (_topk_threads(chunk),),
             (scores, cand, i32(k), i32(chunk), i32(ratio), i32(min_comp)) + ts.args(), ref,
             nbytes=4 * blocks * (chunk + k))


def indexer_topk_merge(L, site, scores, cand, in_off: int, out, out_off: int, blocks: int, n_sets: int,
                       sort_n: int, cfg: ModelConfig):
    """Chunked top-k, merge: block ``b`` selects the top ``index_top_k`` of candidate sets ``[b * group, (b + 1) *
    group)`` at word ``in_off`` of ``cand`` into word ``out_off + b * k`` of ``out``. Raises ValueError when a block's
    ``group * top_k`` candidates exceed the sort width, or the grid does not cover the sets."""
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
            o[out_off + b * k: out_off + (b + 1) * k] = R.topk_merge(scores, c[b * G:(b + 1) * G], k)

    L.kernel(site, "indexer_topk_merge", (blocks,), (_topk_threads(sort_n),),
             (scores, cand, i32(in_off), out, i32(out_off), i32(k), i32(n_sets), i32(G), i32(sort_n)), ref,
             nbytes=4 * (2 * n_sets * k + blocks * k))


def attention_comp(L, site, q, cache, comp, sel, o, cfg: ModelConfig, ratio: int, use_sel,
                   ts: TokenScalars, n_rows: int):
    """Attention of all heads over the raw window plus compressed rows (ds4.c ``layer_attention_mixed_one``, no
    sinks): the first ``index_top_k`` of ``sel`` when ``use_sel`` is True, rows ``0 .. n_comp - 1`` when False,
    the kernel's choice with ``"device"``. ``n_rows``: bytes estimate only."""
    k = cfg.index_top_k
    if use_sel not in (True, False, "device"):
        raise ValueError(f"attention_comp: use_sel={use_sel!r}; choose True, False or 'device'")
    flag = 2 if use_sel == "device" else int(bool(use_sel))

    def ref():
        pos, _, _, _ = ts.resolve()
        n = R.comp_count(pos, ratio)
        on = flag == 1 or (flag == 2 and n > k)
        rows = np.asarray(sel)[: min(k, n)] if on else np.arange(n)
        o[...] = R.attention_comp(np.asarray(q).reshape(cfg.n_heads, cfg.head_dim), cache, pos, cfg.window,
                                   comp, rows).reshape(o.shape)

    L.kernel(site, "attention_comp", (cfg.n_heads,), (256,),
             (q, cache, comp, NULL if sel is None else sel, o, i32(cfg.head_dim), i32(cfg.window), i32(ratio),
              i32(k), i32(flag)) + ts.args(), ref,
             nbytes=4 * cfg.head_dim * (2 * cfg.n_heads + cfg.window + n_rows))
