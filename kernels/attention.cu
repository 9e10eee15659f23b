// Sliding-window decode attention with one KV head (keys = values = the cached row).
#include "common.cuh"

#define ATTN_MAX_WINDOW 1024

// q [H, D], cache [W, D] ring buffer (row p % W holds position p), o [H, D].
// Attends to the n_valid newest rows ending at kv_row, oldest first. grid = H, block = 256.
extern "C" __global__ void attention_decode(const float* __restrict__ q, const float* __restrict__ cache,
                                            float* __restrict__ o, int D, int W,
                                            const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    __shared__ float p[ATTN_MAX_WINDOW];
    const int n = t.n_valid;
    const float* qh = q + (size_t)blockIdx.x * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float inv = rsqrtf((float)D);
    for (int j = warp; j < n; j += warps) {
        int row = t.kv_row - (n - 1 - j);
        if (row < 0) row += W;
        const float* k = cache + (size_t)row * D;
        float acc = 0.0f;
        for (int i = lane; i < D; i += 32) acc += qh[i] * k[i];
        acc = warp_sum(acc);
        if (lane == 0) p[j] = acc * inv;
    }
    __syncthreads();
    float m = -3.402823466e38f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, p[j]);
    m = block_max(m);
    float z = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) { float e = expf(p[j] - m); p[j] = e; z += e; }
    z = block_sum(z);
    const float rz = 1.0f / z;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; ++j) {
            int row = t.kv_row - (n - 1 - j);
            if (row < 0) row += W;
            acc += p[j] * cache[(size_t)row * D + i];
        }
        o[(size_t)blockIdx.x * D + i] = acc * rz;
    }
}
