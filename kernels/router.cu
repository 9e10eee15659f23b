// Router: logits, top-k selection with weights, and hash routing for the first layers.
#include "common.cuh"
#include "score_order.cuh"

// logits [T, N] = x [T, E] . W[N, E]^T. block = (tpr, 256 / tpr): a group of tpr threads per
// (expert, token), each taking every tpr-th float4 of the row, added in-block in a fixed order
// (group_sum); grid = (ceil(N / (256 / tpr)), T) (ds4lab/ops.py:split_geometry). E % 4 == 0.
extern "C" __global__ void router_logits(const float* __restrict__ w, const float* __restrict__ x,
                                         float* __restrict__ logits, int N, int E) {
    DS4_PDL_ENTRY();
    const int e = blockIdx.x * blockDim.y + threadIdx.y, t = blockIdx.y;
    float acc[1] = {0.0f};
    if (e < N) {
        const float4* wr = reinterpret_cast<const float4*>(w + (size_t)e * E);
        const float4* xr = reinterpret_cast<const float4*>(x + (size_t)t * E);
#pragma unroll 4
        for (int i = threadIdx.x; i < E / 4; i += blockDim.x) {
            const float4 a = __ldg(wr + i), b = xr[i];
            acc[0] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
    }
    group_sum<1>(acc);
    if (e < N && threadIdx.x == 0) logits[(size_t)t * N + e] = acc[0];
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// Normalized sigmoid weights of the k chosen experts of one token (thread 0 of the block).
__device__ void write_weights(const float* lg, const int* ids, float* wts, int k) {
    float s[32], z = 0.0f;
    for (int j = 0; j < k; ++j) { s[j] = sigmoidf_(lg[ids[j]]); z += s[j]; }
    for (int j = 0; j < k; ++j) wts[j] = s[j] / z;
}

// This lane's best untaken expert among its VPL (lane, lane + 32, ...): highest key, lowest index.
template <int VPL>
__device__ __forceinline__ void lane_best(const unsigned (&key)[VPL], unsigned taken, int lane, unsigned& bk,
                                          int& bi) {
    bk = 0u;
    bi = 0x7fffffff;
#pragma unroll
    for (int m = 0; m < VPL; ++m)
        if (!((taken >> m) & 1u) && key[m] > bk) { bk = key[m]; bi = lane + 32 * m; }
}

// Top-k of one token in one warp: the N logits held VPL per lane (lane, lane + 32, ...) as their
// keys in the score order (score_order.cuh: -0.0 equal to +0.0, NaN below every number); k rounds
// of a warp-wide max of the lanes' best keys, then the lowest index holding it (two redux.sync),
// the owner lane marking it taken and finding its next best. Lane j < k then writes the j-th expert and its weight: sigmoid over the sum of the k sigmoids, added in
// selection order (as write_weights).
template <int VPL>
__device__ __forceinline__ void topk_warp(const float* __restrict__ lg, int* __restrict__ ids,
                                          float* __restrict__ wts, int N, int k) {
    const int lane = threadIdx.x & 31;
    unsigned key[VPL];
#pragma unroll
    for (int m = 0; m < VPL; ++m) {
        const int e = lane + 32 * m;
        key[m] = e < N ? ds4_score_key(lg[e]) : 0u;  // a NaN's key is above 0: every id stays in 0..N-1
    }
    unsigned taken = 0u, bk;
    int bi, mine = 0;
    lane_best<VPL>(key, taken, lane, bk, bi);
    for (int j = 0; j < k; ++j) {
        const unsigned top = __reduce_max_sync(0xffffffffu, bk);
        const int win = (int)__reduce_min_sync(0xffffffffu, bk == top ? (unsigned)bi : 0x7fffffffu);
        if (lane == j) mine = win;
        if ((win & 31) == lane) {
            taken |= 1u << (win >> 5);
            lane_best<VPL>(key, taken, lane, bk, bi);
        }
    }
    const float sj = lane < k ? sigmoidf_(lg[mine]) : 0.0f;
    float z = 0.0f;
    for (int j = 0; j < k; ++j) z += __shfl_sync(0xffffffffu, sj, j);
    if (lane < k) {
        ids[lane] = mine;
        wts[lane] = sj / z;
    }
}

// Top-k per token in the score order (score_order.cuh): highest logit first, ties (-0.0 and +0.0
// included) to the lower index, NaN after every number. grid = T, block = 32 (one warp per token);
// N <= 1024 experts, k <= 32.
extern "C" __global__ void router_topk(const float* __restrict__ logits, int* __restrict__ ids,
                                       float* __restrict__ wts, int N, int k) {
    DS4_PDL_ENTRY();
    const size_t t = blockIdx.x;
    if (N <= 256) topk_warp<8>(logits + t * N, ids + t * k, wts + t * k, N, k);
    else topk_warp<32>(logits + t * N, ids + t * k, wts + t * k, N, k);
}

// Hash routing (first layers): experts from the token id, weights from the router's scores.
// token_ids [T] when given, else token_id / the per-token scalars (T = 1). grid = T, block = 32.
extern "C" __global__ void router_hash(const float* __restrict__ logits, int* __restrict__ ids,
                                       float* __restrict__ wts, int N, int k, u32 key,
                                       const int* __restrict__ token_ids,
                                       const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    if (threadIdx.x != 0) return;
    const int t = blockIdx.x;
    const int tok = token_ids ? token_ids[t] : tok_scalars(scal, pos, kv_row, n_valid, token_id).token_id;
    int* out = ids + (size_t)t * k;
    int n = 0;
    for (u32 a = 0; a < 1024 && n < k; ++a) {
        int e = (int)(ds4_mix32(key + (u32)tok * 0x9E3779B9U + a * 0x85EBCA6BU) % (u32)N);
        bool dup = false;
        for (int j = 0; j < n; ++j) dup |= (out[j] == e);
        if (!dup) out[n++] = e;
    }
    for (int e = 0; n < k; ++e) {
        bool dup = false;
        for (int j = 0; j < n; ++j) dup |= (out[j] == e);
        if (!dup) out[n++] = e;
    }
    write_weights(logits + (size_t)t * N, out, wts + (size_t)t * k, k);
}
