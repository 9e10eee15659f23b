// Long-context decode: the compressor (store, pool, rotate-and-store, shift), the indexer
// (scores, top-k in one block, chunked top-k and its merge) and attention over the raw window
// plus compressed rows. NumPy reference: ds4lab/longctx_reference.py (semantics from ds4.c:
// compressor_decode_one, compressor_pool_decode_state, indexer_allowed_decode_one,
// layer_attention_mixed_one; regimes from ds4_cuda.cu ds4_gpu_indexer_topk_tensor).
//
// Every kernel takes the per-token scalars (const int* scal, pos, kv_row, n_valid, token_id) and
// derives the position-dependent values from the position on the device: the state slot, the
// compressed row, the number of compressed rows n_comp = (pos + 1) / ratio. The kernels that
// only make sense on an emit token ((pos + 1) % ratio == 0) return at once on any other token,
// and the kernels over compressed rows skip rows at or past n_comp, so a grid sized for more
// rows than exist is correct.
#include "q8.cuh"
#include "score_order.cuh"

#define LC_MAX_DIM 1024          // head dim of the attention kernel (float2 lanes, as attention.cu)
#define LC_WARPS 8
#define LC_INDEX_MAX_Q 8192      // index heads x index head dim held in shared memory
#define LC_INDEX_MAX_HEADS 256
#define LC_INDEX_ROWS 32         // compressed rows per indexer-score block (4 per warp)
#define LC_SORT_MAX 4096         // 64-bit keys one top-k block sorts (32 KiB of shared memory)
#define LC_MERGE_MAX_GROUP 32    // candidate sets one merge block reads

__device__ __forceinline__ int lc_n_comp(int pos, int ratio) { return (pos + 1) / ratio; }
__device__ __forceinline__ bool lc_emit(int pos, int ratio) { return (pos + 1) % ratio == 0; }

// The same rotation as dense.cu's RoPE: pair (2i, 2i+1) of the last rope_dims, angle formed in
// double so large positions stay exact.
__device__ __forceinline__ void lc_rope_pair(float& a, float& b, int pos, int i, int rope_dims, double theta) {
    double ang = (double)pos * pow(theta, -2.0 * i / rope_dims);
    double s, c;
    sincos(ang, &s, &c);
    float cf = (float)c, sf = (float)s;
    float a0 = a, b0 = b;
    a = a0 * cf - b0 * sf;
    b = a0 * sf + b0 * cf;
}

// ------------------------------------------------------------------------------ compressor
// Store this token's kv row and score row (+ ape[pos % ratio]) into the rolling state.
// kvsc [2 * width]: kv then score (the stacked kv/gate projection); ape [ratio, width];
// state_kv, state_sc [coff * ratio, width]; slot 4 + pos % 4 (ratio 4) or pos % ratio.
// grid = ceil(width / 256), block = 256.
extern "C" __global__ void comp_store(const float* __restrict__ kvsc, const float* __restrict__ ape,
                                      float* __restrict__ state_kv, float* __restrict__ state_sc,
                                      int width, int ratio,
                                      const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const int m = t.pos % ratio;
    const int slot = ratio == 4 ? 4 + m : m;
    state_kv[(size_t)slot * width + i] = kvsc[i];
    state_sc[(size_t)slot * width + i] = kvsc[width + i] + ape[(size_t)m * width + i];
}

// Softmax pool per output dimension j < D. Ratio 128: rows 0..127, column j (width D).
// Ratio 4 (width 2D): rows 0..3 column j (previous block, lane 0) and rows 4..7 column D + j
// (current block, lane 1). An all-empty column (scores <= -1e30 / 2) pools to 0.
// grid = ceil(D / 256), block = 256.
extern "C" __global__ void comp_pool(const float* __restrict__ state_kv, const float* __restrict__ state_sc,
                                     float* __restrict__ pooled, int D, int ratio) {
    DS4_PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D) return;
    const int width = ratio == 4 ? 2 * D : D;
    const int rows = ratio == 4 ? 8 : ratio;
    float m = -3.402823466e38f;
    for (int r = 0; r < rows; ++r) {
        const int col = (ratio == 4 && r >= 4) ? D + j : j;
        m = fmaxf(m, state_sc[(size_t)r * width + col]);
    }
    if (m <= -0.5e30f) { pooled[j] = 0.0f; return; }
    float z = 0.0f, s = 0.0f;
    for (int r = 0; r < rows; ++r) {
        const int col = (ratio == 4 && r >= 4) ? D + j : j;
        const float w = expf(state_sc[(size_t)r * width + col] - m);
        z += w;
        s += w * state_kv[(size_t)r * width + col];
    }
    pooled[j] = s / z;
}

// On an emit token: RoPE (last rope_dims, base theta) at position pos + 1 - ratio of the normed
// pooled row, stored as compressed row pos / ratio of comp [rows, D]. Other tokens: no-op.
// grid = 1, block = 256.
extern "C" __global__ void comp_rope_store(const float* __restrict__ row, float* __restrict__ comp,
                                           int D, int rope_dims, double theta, int ratio,
                                           const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    if (!lc_emit(t.pos, ratio)) return;
    float* dst = comp + (size_t)(t.pos / ratio) * D;
    const int first = D - rope_dims, rpos = t.pos + 1 - ratio;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        if (i < first) dst[i] = row[i];
        else if (((i - first) & 1) == 0) {
            float a = row[i], b = row[i + 1];
            lc_rope_pair(a, b, rpos, (i - first) / 2, rope_dims, theta);
            dst[i] = a;
            dst[i + 1] = b;
        }
    }
}

// On an emit token of a ratio-4 layer: rows 4..7 of both states copied over rows 0..3.
// Other tokens (and ratio 128): no-op. grid = ceil(4 * width / 256), block = 256.
extern "C" __global__ void comp_shift(float* __restrict__ state_kv, float* __restrict__ state_sc,
                                      int width, int ratio,
                                      const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    if (ratio != 4 || !lc_emit(t.pos, ratio)) return;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 4 * width) return;
    state_kv[i] = state_kv[4 * (size_t)width + i];
    state_sc[i] = state_sc[4 * (size_t)width + i];
}

// ------------------------------------------------------------------------------ indexer
// Stage 3c's indexer projections: q8_matvec's body (q8.cuh:q8_matvec_rows), launched with the same
// geometry (ops.q8_launch), so its output is bit-identical to q8_matvec's; skipped on the device
// while n_comp = (pos + 1) / ratio <= min_comp (every compressed row is attended: the output is
// unused). W Q8_0 [rows, cols], cols a multiple of 32.
extern "C" __global__ void q8_matvec_when(const i8* __restrict__ qs, const __half* __restrict__ d,
                                          const float* __restrict__ x, float* __restrict__ y, int rows, int cols,
                                          int ratio, int min_comp, int smx,
                                          const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    if (lc_n_comp(t.pos, ratio) <= min_comp) return;  // uniform over the grid: no thread reaches a barrier
    q8_matvec_rows(qs, d, x, y, rows, cols, rows, 0, smx);
}

// scores[c] = scale * sum_h w[h] * max(0, q[h] . keys[c]) for c < n_comp = (pos + 1) / ratio;
// nothing when n_comp <= min_comp (0 on ds4's path; top-k in stage 3c, where no selection is used).
// q [H, Di] (Di a multiple of 32, at most 256; H * Di <= 8192), w [H], keys [rows, Di].
// grid = ceil(rows covered / 32), block = 256: warp w takes rows base + w + 8 r, r < 4; lane l
// holds key dims l, l + 32, ...; one warp sum per head (fixed order: deterministic).
extern "C" __global__ void indexer_score(const float* __restrict__ q, const float* __restrict__ w,
                                         const float* __restrict__ keys, float* __restrict__ scores,
                                         int H, int Di, float scale, int ratio, int min_comp,
                                         const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    __shared__ float qs[LC_INDEX_MAX_Q];
    __shared__ float ws[LC_INDEX_MAX_HEADS];
    const int n = lc_n_comp(t.pos, ratio);
    const int base = blockIdx.x * LC_INDEX_ROWS;
    // The whole block is past the rows that exist, or (stage 3c) every row is attended anyway
    // (n_comp <= min_comp = top-k): nothing to score (uniform: no barrier skipped).
    if (base >= n || n <= min_comp) return;
    for (int i = threadIdx.x; i < H * Di; i += blockDim.x) qs[i] = q[i];
    for (int i = threadIdx.x; i < H; i += blockDim.x) ws[i] = w[i];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = Di / 32;
    for (int r = 0; r < LC_INDEX_ROWS / LC_WARPS; ++r) {
        const int c = base + warp + LC_WARPS * r;
        if (c >= n) break;
        float k[8];
#pragma unroll
        for (int m = 0; m < 8; ++m)
            if (m < per) k[m] = keys[(size_t)c * Di + m * 32 + lane];
        float acc = 0.0f;
        for (int h = 0; h < H; ++h) {
            float d = 0.0f;
#pragma unroll
            for (int m = 0; m < 8; ++m)
                if (m < per) d += k[m] * qs[h * Di + m * 32 + lane];
            d = warp_sum(d);
            acc += fmaxf(d, 0.0f) * ws[h];
        }
        if (lane == 0) scores[c] = scale * acc;
    }
}

// Keys of the top-k sort: the score's key in the score order (score_order.cuh: -0.0 equal to
// +0.0, NaN below every number), then the complemented row index (ties go to the lower index);
// 0 marks an empty slot.
__device__ __forceinline__ unsigned long long lc_key(float v, int idx) {
    return ((unsigned long long)ds4_score_key(v) << 32) | (unsigned long long)(0xffffffffu - (u32)idx);
}

__device__ __forceinline__ int lc_key_index(unsigned long long key) {
    return key == 0ull ? -1 : (int)(0xffffffffu - (u32)key);
}

// Bitonic sort of keys[0 .. sort_n) in descending order (sort_n a power of two).
__device__ void lc_sort_desc(unsigned long long* keys, int sort_n) {
    for (int k = 2; k <= sort_n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < sort_n; i += blockDim.x) {
                const int l = i ^ j;
                if (l > i) {
                    const unsigned long long a = keys[i], b = keys[l];
                    const bool desc = (i & k) == 0;
                    if (desc ? (a < b) : (a > b)) { keys[i] = b; keys[l] = a; }
                }
            }
            __syncthreads();
        }
    }
}

// The top_k of n items, best first, into out[0 .. top_k): the kept top_k slots plus the next
// sort_n - top_k items are sorted until every item has been seen; -1 where fewer exist. Item e
// is row e0 + e, or, with cand, row cand[e] (none when -1), or, with pre (the valid prefix of
// each of several candidate sets of stride `stride`: set s holds pre[s + 1] - pre[s] rows first),
// row cand[s * stride + e - pre[s]] for the set s with pre[s] <= e < pre[s + 1]. When n fits one
// sort, the sort is only as wide as needed (a power of two, at least top_k).
__device__ void lc_topk_block(const float* __restrict__ scores, const int* __restrict__ cand, int e0, int n,
                              int top_k, int sort_n, int* __restrict__ out,
                              const int* pre = nullptr, int stride = 0) {
    __shared__ unsigned long long keys[LC_SORT_MAX];
    if (n <= sort_n) {
        const int p2 = n <= 1 ? 1 : 1 << (32 - __clz(n - 1));
        sort_n = max(top_k, p2);
    }
    int seen = 0, keep = 0;
    do {
        const int take = sort_n - keep;
        for (int s = keep + threadIdx.x; s < sort_n; s += blockDim.x) {
            const int e = seen + (s - keep);
            unsigned long long key = 0ull;
            if (e < n) {
                int idx;
                if (pre) {
                    int set = 0;
                    while (e >= pre[set + 1]) ++set;
                    idx = cand[(size_t)set * stride + (e - pre[set])];
                } else {
                    idx = cand ? cand[e] : e0 + e;
                }
                if (idx >= 0) key = lc_key(scores[idx], idx);
            }
            keys[s] = key;
        }
        __syncthreads();
        lc_sort_desc(keys, sort_n);
        seen += take;
        keep = top_k;
    } while (seen < n);
    for (int i = threadIdx.x; i < top_k; i += blockDim.x) out[i] = lc_key_index(keys[i]);
    __syncthreads();
}

// One block: the top_k of the n_comp = (pos + 1) / ratio scores, with a sort of sort_n keys
// (one pass when n_comp <= sort_n, else streaming). grid = 1, block = min(1024, sort_n / 2).
extern "C" __global__ void indexer_topk(const float* __restrict__ scores, int* __restrict__ selected,
                                        int top_k, int sort_n, int ratio,
                                        const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    lc_topk_block(scores, nullptr, 0, lc_n_comp(t.pos, ratio), top_k, sort_n, selected);
}

// Chunked path, first stage: block b takes the top_k of scores [b * chunk, (b + 1) * chunk)
// (clipped to n_comp) into cand [b * top_k ..); a block past n_comp, and every block while
// n_comp <= min_comp (stage 3c: no selection needed), writes -1s.
// grid = number of chunks, block = min(1024, chunk / 2).
extern "C" __global__ void indexer_topk_chunk(const float* __restrict__ scores, int* __restrict__ cand,
                                              int top_k, int chunk, int ratio, int min_comp,
                                              const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    const int n_comp = lc_n_comp(t.pos, ratio);
    const int e0 = blockIdx.x * chunk;
    const int n = n_comp <= min_comp ? 0 : max(0, min(chunk, n_comp - e0));
    if (n == 0) {  // a chunk past n_comp (worst-case grid), or no selection needed: no candidates, no sort
        for (int i = threadIdx.x; i < top_k; i += blockDim.x) cand[(size_t)blockIdx.x * top_k + i] = -1;
        return;
    }
    lc_topk_block(scores, nullptr, e0, n, top_k, chunk, cand + (size_t)blockIdx.x * top_k);
}

// Chunked path, merge: block b takes the top_k of the candidate sets [b * group, (b + 1) *
// group) of the n_sets sets of top_k row indices at word in_off of cand into word
// out_off + b * top_k of out. Each set is written best first and -1 padded, so its valid rows are
// a prefix (found by binary search); only those are sorted (a block of empty sets, as the
// worst-case grids of stage 3c leave them, writes -1 and sorts nothing).
// grid = ceil(n_sets / group), block = min(1024, sort_n / 2); group <= 32, group * top_k <= sort_n.
extern "C" __global__ void indexer_topk_merge(const float* __restrict__ scores, const int* cand, int in_off,
                                              int* out, int out_off, int top_k, int n_sets, int group,
                                              int sort_n) {
    DS4_PDL_ENTRY();
    __shared__ int pre[LC_MERGE_MAX_GROUP + 1];
    const int s0 = blockIdx.x * group;
    const int sets = max(0, min(min(group, LC_MERGE_MAX_GROUP), n_sets - s0));
    const int* base = cand + in_off + (size_t)s0 * top_k;
    if (threadIdx.x < sets) {  // one thread per set: its valid prefix (the first -1), by binary search
        const int* c = base + (size_t)threadIdx.x * top_k;
        int lo = 0, hi = top_k;
        while (lo < hi) { const int mid = (lo + hi) >> 1; if (c[mid] >= 0) lo = mid + 1; else hi = mid; }
        pre[threadIdx.x + 1] = lo;
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // counts to offsets (at most 32 sets)
        pre[0] = 0;
        for (int s = 0; s < sets; ++s) pre[s + 1] += pre[s];
    }
    __syncthreads();
    const int valid = pre[sets];
    int* dst = out + out_off + (size_t)blockIdx.x * top_k;
    if (valid == 0) {
        for (int i = threadIdx.x; i < top_k; i += blockDim.x) dst[i] = -1;
        return;
    }
    lc_topk_block(scores, base, 0, valid, top_k, sort_n, dst, pre, top_k);
}

// ------------------------------------------------------------------------------ attention
// Decode attention over the raw window (the n_valid newest rows of the ring buffer cache [W, D],
// ending at kv_row) plus compressed rows of comp [rows, D]: with use_sel 1, the first
// min(top_k, n_comp) entries of sel (row indices); with 0, rows 0 .. n_comp - 1, where n_comp =
// (pos + 1) / ratio; with 2 (the device decides), sel exactly when n_comp > top_k. q, o [H, D]; keys = values; scale 1/sqrt(D). grid = H, block = 256.
// Each warp keeps an online softmax (running max, sum, output) over its rows; the 8 warps are
// combined in warp order (deterministic). No length limit.
extern "C" __global__ void attention_comp(const float* __restrict__ q, const float* __restrict__ cache,
                                          const float* __restrict__ comp, const int* __restrict__ sel,
                                          float* __restrict__ o, int D, int W, int ratio, int top_k, int use_sel,
                                          const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    __shared__ float red[LC_WARPS][LC_MAX_DIM];
    __shared__ float wm[LC_WARPS], wz[LC_WARPS];
    const int n_raw = t.n_valid;
    const int n_comp = lc_n_comp(t.pos, ratio);
    const bool sel_on = use_sel == 1 || (use_sel == 2 && n_comp > top_k);
    const int n_c = sel_on ? min(top_k, n_comp) : n_comp;
    const int n = n_raw + n_c;
    const float* qh = q + (size_t)blockIdx.x * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int steps = D / 64;
    const float inv = rsqrtf((float)D);
    float2 qv[16], acc[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) {
        acc[c] = make_float2(0.0f, 0.0f);
        if (c < steps) qv[c] = reinterpret_cast<const float2*>(qh)[c * 32 + lane];
    }
    float m = -3.402823466e38f, z = 0.0f;
    for (int j = warp; j < n; j += LC_WARPS) {
        const float* src;
        if (j < n_raw) {
            int row = t.kv_row - (n_raw - 1 - j);
            if (row < 0) row += W;
            src = cache + (size_t)row * D;
        } else {
            const int r = sel_on ? sel[j - n_raw] : j - n_raw;
            src = comp + (size_t)r * D;
        }
        const float2* kv = reinterpret_cast<const float2*>(src);
        float2 v[16];
        float d = 0.0f;
#pragma unroll
        for (int c = 0; c < 16; ++c)
            if (c < steps) { v[c] = kv[c * 32 + lane]; d += qv[c].x * v[c].x + qv[c].y * v[c].y; }
        const float s = warp_sum(d) * inv;
        const float mn = fmaxf(m, s);
        const float cs = expf(m - mn), e = expf(s - mn);
#pragma unroll
        for (int c = 0; c < 16; ++c)
            if (c < steps) { acc[c].x = acc[c].x * cs + e * v[c].x; acc[c].y = acc[c].y * cs + e * v[c].y; }
        z = z * cs + e;
        m = mn;
    }
#pragma unroll
    for (int c = 0; c < 16; ++c)
        if (c < steps) reinterpret_cast<float2*>(red[warp])[c * 32 + lane] = acc[c];
    if (lane == 0) { wm[warp] = z > 0.0f ? m : -3.402823466e38f; wz[warp] = z; }
    __syncthreads();
    float M = -3.402823466e38f;
    for (int w = 0; w < LC_WARPS; ++w) M = fmaxf(M, wm[w]);
    float f[LC_WARPS], Z = 0.0f;
    for (int w = 0; w < LC_WARPS; ++w) { f[w] = wz[w] > 0.0f ? expf(wm[w] - M) : 0.0f; Z += f[w] * wz[w]; }
    const float rz = 1.0f / Z;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < LC_WARPS; ++w) s += f[w] * red[w][i];
        o[(size_t)blockIdx.x * D + i] = s * rz;
    }
}
