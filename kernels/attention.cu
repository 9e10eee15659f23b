// Sliding-window decode attention with one KV head (keys = values = the cached row).
#include "common.cuh"

#define ATTN_MAX_WINDOW 1024
#define ATTN_MAX_DIM 1024
#define ATTN_WARPS 8

// q [H, D], cache [W, D] ring buffer (row p % W holds position p), o [H, D].
// Attends to the n_valid newest rows ending at kv_row, oldest first. grid = H, block = 256.
// Scores: warp w takes rows w, w+8, ...; values: the same rows, each lane holding D/32 output
// dims (float2 steps; D a multiple of 64), then the 8 warps' partial outputs are added in
// warp order through shared memory (deterministic).
extern "C" __global__ void attention_decode(const float* __restrict__ q, const float* __restrict__ cache,
                                            float* __restrict__ o, int D, int W,
                                            const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    __shared__ float p[ATTN_MAX_WINDOW];
    __shared__ float red[ATTN_WARPS][ATTN_MAX_DIM];
    const int n = t.n_valid;
    const float* qh = q + (size_t)blockIdx.x * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int steps = D / 64;  // float2 steps per lane
    const float inv = rsqrtf((float)D);
    float2 qv[16];
#pragma unroll
    for (int c = 0; c < 16; ++c)
        if (c < steps) qv[c] = reinterpret_cast<const float2*>(qh)[c * 32 + lane];
    for (int j = warp; j < n; j += ATTN_WARPS) {
        int row = t.kv_row - (n - 1 - j);
        if (row < 0) row += W;
        const float2* k = reinterpret_cast<const float2*>(cache + (size_t)row * D);
        float acc = 0.0f;
#pragma unroll
        for (int c = 0; c < 16; ++c)
            if (c < steps) { float2 kv = k[c * 32 + lane]; acc += qv[c].x * kv.x + qv[c].y * kv.y; }
        acc = warp_sum(acc);
        if (lane == 0) p[j] = acc * inv;
    }
    __syncthreads();
    float m = -3.402823466e38f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, p[j]);
    m = block_max(m);
    float z = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) { float e = expf(p[j] - m); p[j] = e; z += e; }
    z = block_sum(z);  // ends with a barrier: every p[j] is visible below
    float2 acc[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) acc[c] = make_float2(0.0f, 0.0f);
    for (int j = warp; j < n; j += ATTN_WARPS) {
        int row = t.kv_row - (n - 1 - j);
        if (row < 0) row += W;
        const float2* v = reinterpret_cast<const float2*>(cache + (size_t)row * D);
        const float pj = p[j];
#pragma unroll
        for (int c = 0; c < 16; ++c)
            if (c < steps) { float2 vv = v[c * 32 + lane]; acc[c].x += pj * vv.x; acc[c].y += pj * vv.y; }
    }
#pragma unroll
    for (int c = 0; c < 16; ++c)
        if (c < steps) reinterpret_cast<float2*>(red[warp])[c * 32 + lane] = acc[c];
    __syncthreads();
    const float rz = 1.0f / z;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) s += red[w][i];
        o[(size_t)blockIdx.x * D + i] = s * rz;
    }
}
