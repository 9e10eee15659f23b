// Routed MoE with ds4's stage names: xq, sort (count, prefix, scatter, tiles), gateup, midq,
// down, sum. Experts: 4-bit blocks; activations: Q8_K (256 int8 + one fp32 scale).
#include "common.cuh"

#ifndef MOE_TILE
#define MOE_TILE 8
#endif

// Quantize one 256-block of fp32 values held one per thread (blockDim = 256). Returns q.
__device__ __forceinline__ void quantize_block(float v, i8* q, float* d) {
    const float amax = block_max(fabsf(v));
    const float s = amax / 127.0f;
    int qi = 0;
    if (s != 0.0f) { qi = __float2int_rn(v / s); qi = max(-127, min(127, qi)); }
    q[threadIdx.x] = (i8)qi;
    if (threadIdx.x == 0) *d = s;
}

// xq: x [T, n] fp32 -> Q8_K. grid = (n/256, T), block = 256.
extern "C" __global__ void xq_quantize(const float* __restrict__ x, i8* __restrict__ q, float* __restrict__ d, int n) {
    const size_t base = (size_t)blockIdx.y * n + (size_t)blockIdx.x * 256;
    quantize_block(x[base + threadIdx.x], q + base, d + (size_t)blockIdx.y * (n / 256) + blockIdx.x);
}

// ---------------------------------------------------------------- sort (tokens > 1)
// Count (token, expert) pairs per expert. counts must be cleared first (the memset).
extern "C" __global__ void moe_count(const int* __restrict__ ids, int* __restrict__ counts, int P) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < P) atomicAdd(&counts[ids[p]], 1);
}

// Block-wide exclusive scan of one int per thread (blockDim <= 1024, multiple of 32).
__device__ int block_exclusive_scan(int v, int* total) {
    __shared__ int warp_tot[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) { int y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = (lane < (int)(blockDim.x >> 5)) ? warp_tot[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) { int y = __shfl_up_sync(0xffffffffu, w, o); if (lane >= o) w += y; }
        warp_tot[lane] = w;
    }
    __syncthreads();
    int incl = x + (warp ? warp_tot[warp - 1] : 0);
    if (total) *total = warp_tot[(blockDim.x >> 5) - 1];
    __syncthreads();
    return incl - v;
}

// Exclusive prefix sum of the counts -> offsets; cursor starts at the offsets. One block.
extern "C" __global__ void moe_prefix(const int* __restrict__ counts, int* __restrict__ offsets,
                                      int* __restrict__ cursor, int N) {
    const int e = threadIdx.x;
    int c = e < N ? counts[e] : 0;
    int off = block_exclusive_scan(c, nullptr);
    if (e < N) { offsets[e] = off; cursor[e] = off; }
}

// Scatter pair ids into expert order (order within an expert is the atomics' order).
extern "C" __global__ void moe_scatter(const int* __restrict__ ids, int* __restrict__ cursor,
                                       int* __restrict__ sorted, int P) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    int pos = atomicAdd(&cursor[ids[p]], 1);
    if (pos < P) sorted[pos] = p;  // bounds: stale counts (an escaped counts clear) must not write past the list
}

// Expert tiles of at most MOE_TILE pairs: tiles[i] = (expert, start, count); n_tiles[0]. One block.
extern "C" __global__ void moe_tiles(const int* __restrict__ counts, const int* __restrict__ offsets,
                                     int* __restrict__ tiles, int* __restrict__ n_tiles, int N, int max_tiles) {
    const int e = threadIdx.x;
    const int c = e < N ? counts[e] : 0;
    const int nt = (c + MOE_TILE - 1) / MOE_TILE;
    __shared__ int total;
    int base = block_exclusive_scan(nt, &total);
    for (int s = 0; s < nt && base + s < max_tiles; ++s) {
        int* tl = tiles + 3 * (base + s);
        tl[0] = e;
        tl[1] = offsets[e] + s * MOE_TILE;
        tl[2] = min(MOE_TILE, c - s * MOE_TILE);
    }
    if (e == 0) n_tiles[0] = min(total, max_tiles);
}

// ---------------------------------------------------------------- expert matvecs
// Row r of expert e's gate/up [2F, E] (4-bit) times token t's Q8_K input, written to gate/up [P, F].
__device__ __forceinline__ void store_gateup(float v, float* gate, float* up, int p, int r, int F) {
    if (r < F) gate[(size_t)p * F + r] = v; else up[(size_t)p * F + (r - F)] = v;
}

// gateup, decode path (no sort): one warp computes gate row r and up row r + F of a pair's
// expert (they share the activation loads). grid = (F/8, P), block = 256. (Four iterations'
// loads in flight per lane ran 12 % slower on the H200: 66 registers, fewer blocks per SM.)
extern "C" __global__ void moe_gateup_decode(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                             const i8* __restrict__ xq, const float* __restrict__ xd,
                                             const int* __restrict__ ids, float* __restrict__ gate,
                                             float* __restrict__ up, int k, int F, int E, int n_experts) {
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int p = blockIdx.y, t = p / k;
    if (r >= F || (unsigned)ids[p] >= (unsigned)n_experts) return;  // never index past the bank
    const size_t g = (size_t)ids[p] * 2 * F + r, u = g + F;
    float a0, a1;
    q4_q8k_row_dot2<2>(wq + g * (E / 2), wd + g * (E / 32), wq + u * (E / 2), wd + u * (E / 32),
                    xq + (size_t)t * E, xd + (size_t)t * (E / 256), E, lane, a0, a1);
    a0 = warp_sum(a0);
    a1 = warp_sum(a1);
    if (lane == 0) { gate[(size_t)p * F + r] = a0; up[(size_t)p * F + r] = a1; }
}

// Tiled path (tokens > 1): each block row-slice reads its weights once per tile of pairs.
// grid = (rows/8, max_tiles); blocks past n_tiles exit.
template <bool GATEUP>
__device__ void tiled_rows(const u8* __restrict__ wq, const __half* __restrict__ wd,
                           const i8* __restrict__ xq, const float* __restrict__ xd,
                           const int* __restrict__ sorted, const int* __restrict__ tiles,
                           const int* __restrict__ n_tiles, float* __restrict__ out0, float* __restrict__ out1,
                           int k, int rows, int cols, int F, int x_per_token, int P, int n_experts) {
    if ((int)blockIdx.y >= n_tiles[0]) return;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int* tl = tiles + 3 * blockIdx.y;
    const int e = tl[0], start = tl[1];
    // Bounds: with stale counts (an escaped counts clear) tiles can point past the pair list.
    const int cnt = (start < 0 || start >= P) ? 0 : min(tl[2], P - start);
    if (e < 0 || e >= n_experts) return;
    const size_t row = (size_t)e * rows + r;
    const u8* q = wq + row * (cols / 2);
    const __half* d = wd + row * (cols / 32);
    float acc[MOE_TILE];
    int src[MOE_TILE];
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j) {
        acc[j] = 0.0f;
        int p = j < cnt ? sorted[start + j] : 0;
        p = (p < 0 || p >= P) ? 0 : p;
        src[j] = x_per_token ? p / k : p;
    }
    const int blocks = cols >> 5;
    for (int b = lane; b < blocks; b += 32) {
        int4 w = __ldg(reinterpret_cast<const int4*>(q) + b);
        const float ws = __half2float(d[b]);
        const int wv[4] = {w.x, w.y, w.z, w.w};
        int lo[4], hi[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            lo[m] = __vsub4(wv[m] & 0x0F0F0F0F, 0x08080808);
            hi[m] = __vsub4((wv[m] >> 4) & 0x0F0F0F0F, 0x08080808);
        }
#pragma unroll
        for (int j = 0; j < MOE_TILE; ++j) {
            if (j < cnt) {
                const i8* xr = xq + (size_t)src[j] * cols;
                int4 xa = __ldg(reinterpret_cast<const int4*>(xr) + 2 * b);
                int4 xb = __ldg(reinterpret_cast<const int4*>(xr) + 2 * b + 1);
                int isum = 0;
                isum = __dp4a(lo[0], xa.x, isum); isum = __dp4a(lo[1], xa.y, isum);
                isum = __dp4a(lo[2], xa.z, isum); isum = __dp4a(lo[3], xa.w, isum);
                isum = __dp4a(hi[0], xb.x, isum); isum = __dp4a(hi[1], xb.y, isum);
                isum = __dp4a(hi[2], xb.z, isum); isum = __dp4a(hi[3], xb.w, isum);
                acc[j] += (float)isum * ws * xd[(size_t)src[j] * (cols / 256) + (b >> 3)];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j) {
        if (j < cnt) {
            float v = warp_sum(acc[j]);
            int p = sorted[start + j];
            if (lane == 0 && p >= 0 && p < P) {
                if (GATEUP) store_gateup(v, out0, out1, p, r, F);
                else out0[(size_t)p * rows + r] = v;
            }
        }
    }
}

extern "C" __global__ void moe_gateup_tiled(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                            const i8* __restrict__ xq, const float* __restrict__ xd,
                                            const int* __restrict__ sorted, const int* __restrict__ tiles,
                                            const int* __restrict__ n_tiles, float* __restrict__ gate,
                                            float* __restrict__ up, int k, int F, int E, int P, int n_experts) {
    tiled_rows<true>(wq, wd, xq, xd, sorted, tiles, n_tiles, gate, up, k, 2 * F, E, F, 1, P, n_experts);
}

// midq: clamped SwiGLU of gate/up [P, F], quantized to Q8_K. grid = (F/256, P), block = 256.
extern "C" __global__ void moe_midq(const float* __restrict__ gate, const float* __restrict__ up,
                                    i8* __restrict__ mq, float* __restrict__ md, int F, float limit) {
    const size_t i = (size_t)blockIdx.y * F + (size_t)blockIdx.x * 256 + threadIdx.x;
    float g = fminf(gate[i], limit);
    float u = fminf(fmaxf(up[i], -limit), limit);
    float v = g / (1.0f + expf(-g)) * u;
    quantize_block(v, mq + (size_t)blockIdx.y * F + (size_t)blockIdx.x * 256,
                   md + (size_t)blockIdx.y * (F / 256) + blockIdx.x);
}

// down, decode path: out [P, E] = expert down [E, F] (4-bit) . midq[p]. One warp computes rows
// r and r + E/2. grid = (E/16, P).
extern "C" __global__ void moe_down_decode(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                           const i8* __restrict__ mq, const float* __restrict__ md,
                                           const int* __restrict__ ids, float* __restrict__ out, int F, int E,
                                           int n_experts) {
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int p = blockIdx.y, half = E / 2;
    if (r >= half || (unsigned)ids[p] >= (unsigned)n_experts) return;  // never index past the bank
    const size_t r0 = (size_t)ids[p] * E + r, r1 = r0 + half;
    float a0, a1;
    q4_q8k_row_dot2<2>(wq + r0 * (F / 2), wd + r0 * (F / 32), wq + r1 * (F / 2), wd + r1 * (F / 32),
                    mq + (size_t)p * F, md + (size_t)p * (F / 256), F, lane, a0, a1);
    a0 = warp_sum(a0);
    a1 = warp_sum(a1);
    if (lane == 0) { out[(size_t)p * E + r] = a0; out[(size_t)p * E + r + half] = a1; }
}

extern "C" __global__ void moe_down_tiled(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                          const i8* __restrict__ mq, const float* __restrict__ md,
                                          const int* __restrict__ sorted, const int* __restrict__ tiles,
                                          const int* __restrict__ n_tiles, float* __restrict__ out,
                                          int k, int F, int E, int P, int n_experts) {
    tiled_rows<false>(wq, wd, mq, md, sorted, tiles, n_tiles, out, nullptr, k, E, F, F, 0, P, n_experts);
}

// sum: y[t] = sum_j w[t, j] * out[t*k + j]. grid = (ceil(E/256), T), block = 256.
extern "C" __global__ void moe_sum(const float* __restrict__ out, const float* __restrict__ wts,
                                   float* __restrict__ y, int k, int E) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= E) return;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += wts[(size_t)t * k + j] * out[((size_t)t * k + j) * E + i];
    y[(size_t)t * E + i] = acc;
}
