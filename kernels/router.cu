// Router: logits, top-k selection with weights, and hash routing for the first layers.
#include "common.cuh"

// logits [T, N] = x [T, E] . W[N, E]^T. block = (tpr, 256 / tpr): a group of tpr threads per
// (expert, token), each taking every tpr-th float4 of the row, added in-block in a fixed order
// (group_sum); grid = (ceil(N / (256 / tpr)), T) (ds4lab/ops.py:split_geometry). E % 4 == 0.
extern "C" __global__ void router_logits(const float* __restrict__ w, const float* __restrict__ x,
                                         float* __restrict__ logits, int N, int E) {
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

// Top-k per token: highest logit first, ties to the lower index. grid = T, block = N rounded
// up to a multiple of 32 (N <= 1024).
extern "C" __global__ void router_topk(const float* __restrict__ logits, int* __restrict__ ids,
                                       float* __restrict__ wts, int N, int k) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ int chosen;
    const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const float* lg = logits + (size_t)t * N;
    float v = (e < N) ? lg[e] : -3.402823466e38f;
    if (v != v) v = -3.402823466e38f;  // NaN logits rank last: every chosen id stays in 0..N-1
    bool taken = e >= N;
    for (int j = 0; j < k; ++j) {
        float bestv = taken ? -3.402823466e38f : v;
        int besti = taken ? 0x7fffffff : e;
        if (taken && e < N) bestv = __int_as_float(0xff800000);  // -inf: below every untaken value
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bestv, o);
            int oi = __shfl_xor_sync(0xffffffffu, besti, o);
            if (ov > bestv || (ov == bestv && oi < besti)) { bestv = ov; besti = oi; }
        }
        if (lane == 0) { bv[warp] = bestv; bi[warp] = besti; }
        __syncthreads();
        if (e == 0) {
            float gv = bv[0]; int gi = bi[0];
            for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
                if (bv[w] > gv || (bv[w] == gv && bi[w] < gi)) { gv = bv[w]; gi = bi[w]; }
            chosen = gi;
            ids[(size_t)t * k + j] = gi;
        }
        __syncthreads();
        if (e == chosen) taken = true;
        __syncthreads();
    }
    if (e == 0) write_weights(lg, ids + (size_t)t * k, wts + (size_t)t * k, k);
}

// Hash routing (first layers): experts from the token id, weights from the router's scores.
// token_ids [T] when given, else token_id / the per-token scalars (T = 1). grid = T, block = 32.
extern "C" __global__ void router_hash(const float* __restrict__ logits, int* __restrict__ ids,
                                       float* __restrict__ wts, int N, int k, u32 key,
                                       const int* __restrict__ token_ids,
                                       const int* scal, int pos, int kv_row, int n_valid, int token_id) {
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
