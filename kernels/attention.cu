// Sliding-window decode attention with one KV head (keys = values = the cached row),
// split over keys (flash-decoding) with the combine finished inside the same kernel.
#include "common.cuh"

#define ATTN_MAX_DIM 1024
#define ATTN_KPB 16    // keys per block
#define ATTN_HPB 4     // heads per block: each key row loaded once serves this many heads
#define ATTN_MAX_SPLITS 64  // ceil(1024 / ATTN_KPB): the largest window the config allows

// q [H, D], cache [W, D] ring buffer (row p % W holds position p), o [H, D]. Attends to the
// n_valid newest rows ending at kv_row, oldest first (key j is row kv_row - (n_valid - 1 - j)).
//
// grid = (ceil(H / ATTN_HPB), NS = ceil(W / ATTN_KPB)), block = 256 (8 warps). Block (g, s) takes
// heads g*HPB.. and keys s*KPB..+KPB-1 (those below n_valid; a split past them is empty):
//   scores: warp w dots keys w and w + 8 with every head of the block (float2 steps, D a
//           multiple of 64), scaled by 1/sqrt(D);
//   softmax: per head, max m_s and z_s = sum exp(score - m_s) over the split's keys, in key order;
//   values: o_s[d] = sum_j exp(score_j - m_s) v_j[d], in key order;
// and writes (m_s, z_s, o_s) to its slot of the scratch (part_ml [H, NS, 2], part_o [H, NS, D]).
// The last block of head group g to finish (an integer ticket counter, counter[g], that the
// last block resets to 0 for the next launch) combines the NS slots in split order:
//   o = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) z_s, M = max over non-empty splits.
// Every value is computed by a fixed thread in a fixed order, whichever block comes last, so
// results are bit-identical run to run. counter must be zero before the first launch.
extern "C" __global__ void attention_decode(
        const float* __restrict__ q, const float* __restrict__ cache, float* __restrict__ o,
        int D, int W, int H, float* part_o, float* part_ml, int* counter,
        const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    __shared__ float2 qs[ATTN_HPB][ATTN_MAX_DIM / 2];
    __shared__ float sc[ATTN_HPB][ATTN_KPB];
    __shared__ float sm[ATTN_HPB], sz[ATTN_HPB];
    __shared__ int krow[ATTN_KPB];
    __shared__ float cm[ATTN_HPB][ATTN_MAX_SPLITS], cw[ATTN_HPB][ATTN_MAX_SPLITS];
    __shared__ int last;
    const int g = blockIdx.x, s = blockIdx.y, NS = gridDim.y;
    const int h0 = g * ATTN_HPB, nh = min(ATTN_HPB, H - h0);
    const int n = t.n_valid, j0 = s * ATTN_KPB, nk = max(0, min(ATTN_KPB, n - j0));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int D2 = D >> 1, steps = D >> 6;  // float2 per row; float2 steps per lane
    const float inv = rsqrtf((float)D);

    for (int i = threadIdx.x; i < ATTN_HPB * D2; i += blockDim.x) {
        const int hh = i / D2, c = i - hh * D2;
        qs[hh][c] = hh < nh ? reinterpret_cast<const float2*>(q + (size_t)(h0 + hh) * D)[c] : make_float2(0.0f, 0.0f);
    }
    if (threadIdx.x < ATTN_KPB) {
        int row = t.kv_row - (n - 1 - (j0 + (int)threadIdx.x));
        row %= W;
        if (row < 0) row += W;
        krow[threadIdx.x] = row;
    }
    __syncthreads();

    // scores: two keys per warp, every head of the block
#pragma unroll
    for (int kk = 0; kk < ATTN_KPB / 8; ++kk) {
        const int j = warp + 8 * kk;
        if (j < nk) {
            const float2* k = reinterpret_cast<const float2*>(cache + (size_t)krow[j] * D);
            float2 kv[16];
#pragma unroll
            for (int c = 0; c < 16; ++c)
                if (c < steps) kv[c] = k[c * 32 + lane];
#pragma unroll
            for (int hh = 0; hh < ATTN_HPB; ++hh) {
                float acc = 0.0f;
#pragma unroll
                for (int c = 0; c < 16; ++c)
                    if (c < steps) { const float2 qq = qs[hh][c * 32 + lane]; acc += qq.x * kv[c].x + qq.y * kv[c].y; }
                acc = warp_sum(acc);
                if (lane == 0) sc[hh][j] = acc * inv;
            }
        }
    }
    __syncthreads();

    // softmax within the split, per head, in key order
    if (threadIdx.x < ATTN_HPB) {
        const int hh = threadIdx.x;
        float m = -3.402823466e38f, z = 0.0f;
        for (int j = 0; j < nk; ++j) m = fmaxf(m, sc[hh][j]);
        for (int j = 0; j < nk; ++j) { const float e = expf(sc[hh][j] - m); sc[hh][j] = e; z += e; }
        sm[hh] = m;
        sz[hh] = z;
    }
    __syncthreads();

    // values: thread takes float2 column c for every head of the block
    for (int c = threadIdx.x; c < D2; c += blockDim.x) {
        float2 acc[ATTN_HPB];
#pragma unroll
        for (int hh = 0; hh < ATTN_HPB; ++hh) acc[hh] = make_float2(0.0f, 0.0f);
#pragma unroll 4
        for (int j = 0; j < nk; ++j) {
            const float2 v = reinterpret_cast<const float2*>(cache + (size_t)krow[j] * D)[c];
#pragma unroll
            for (int hh = 0; hh < ATTN_HPB; ++hh) {
                const float p = sc[hh][j];
                acc[hh].x += p * v.x;
                acc[hh].y += p * v.y;
            }
        }
        for (int hh = 0; hh < nh; ++hh)
            reinterpret_cast<float2*>(part_o + ((size_t)(h0 + hh) * NS + s) * D)[c] = acc[hh];
    }
    if (threadIdx.x < nh) {
        part_ml[((size_t)(h0 + threadIdx.x) * NS + s) * 2] = sm[threadIdx.x];
        part_ml[((size_t)(h0 + threadIdx.x) * NS + s) * 2 + 1] = sz[threadIdx.x];
    }
    // Publish this split, then take a ticket; the last of the NS blocks of group g combines.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counter[g], 1) == NS - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();

    // The group's (m, z) pairs into shared memory, one load per thread (not a serial chain).
    for (int i = threadIdx.x; i < nh * NS; i += blockDim.x) {
        const int hh = i / NS, k = i - hh * NS;
        const float2 mz = __ldcg(reinterpret_cast<const float2*>(part_ml) + (size_t)(h0 + hh) * NS + k);
        cm[hh][k] = mz.x;
        cw[hh][k] = mz.y;
    }
    __syncthreads();
    if (threadIdx.x < nh) {
        const int hh = threadIdx.x;
        float M = -3.402823466e38f;
        for (int k = 0; k < NS; ++k)
            if (cw[hh][k] > 0.0f) M = fmaxf(M, cm[hh][k]);
        float Z = 0.0f;
        for (int k = 0; k < NS; ++k) {
            const float zk = cw[hh][k];
            const float wk = zk > 0.0f ? expf(cm[hh][k] - M) : 0.0f;
            cw[hh][k] = wk;
            Z += wk * zk;
        }
        const float rz = 1.0f / Z;
        for (int k = 0; k < NS; ++k) cw[hh][k] *= rz;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * D2; i += blockDim.x) {
        const int hh = i / D2, c = i - hh * D2;
        const float2* po = reinterpret_cast<const float2*>(part_o + (size_t)(h0 + hh) * NS * D) + c;
        float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll 8
        for (int k = 0; k < NS; ++k) {
            const float2 v = __ldcg(po + (size_t)k * D2);
            const float wk = cw[hh][k];
            acc.x += wk * v.x;
            acc.y += wk * v.y;
        }
        reinterpret_cast<float2*>(o + (size_t)(h0 + hh) * D)[c] = acc;
    }
    if (threadIdx.x == 0) counter[g] = 0;
}
