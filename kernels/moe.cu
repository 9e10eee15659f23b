// Routed MoE with ds4's stage names: xq, sort (count, prefix, scatter, tiles), gateup, midq,
// down, sum. Experts: 4-bit blocks; activations: Q8_K (256 int8 + one fp32 scale).
#include "common.cuh"

#ifndef MOE_TILE
#define MOE_TILE 8
#endif

// Profiling points folded into the stages' kernels (ds4lab/moeprof/modes/in_graph.py): given a
// slot buffer, thread 0 of block (0, 0) writes %globaltimer (ns) into slots first .. first + n - 1
// as its first instruction, so a stage is timed from its first kernel's start with no stamp
// kernel of its own. NULL: nothing (every launch outside the in-graph profile).
#define MOE_STAMP_ARGS unsigned long long* __restrict__ stamp, int stamp_first, int stamp_n
__device__ __forceinline__ void moe_stamp(unsigned long long* __restrict__ stamp, int first, int n) {
    if (stamp && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        for (int i = 0; i < n; ++i) stamp[first + i] = t;
    }
}

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
extern "C" __global__ void xq_quantize(const float* __restrict__ x, i8* __restrict__ q, float* __restrict__ d, int n, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    const size_t base = (size_t)blockIdx.y * n + (size_t)blockIdx.x * 256;
    quantize_block(x[base + threadIdx.x], q + base, d + (size_t)blockIdx.y * (n / 256) + blockIdx.x);
}

// ---------------------------------------------------------------- sort (tokens > 1)
// Count (token, expert) pairs per expert. counts must be cleared first (the memset).
extern "C" __global__ void moe_count(const int* __restrict__ ids, int* __restrict__ counts, int P) {
    DS4_PDL_ENTRY();
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
    DS4_PDL_ENTRY();
    const int e = threadIdx.x;
    int c = e < N ? counts[e] : 0;
    int off = block_exclusive_scan(c, nullptr);
    if (e < N) { offsets[e] = off; cursor[e] = off; }
}

// Scatter pair ids into expert order (order within an expert is the atomics' order).
extern "C" __global__ void moe_scatter(const int* __restrict__ ids, int* __restrict__ cursor,
                                       int* __restrict__ sorted, int P) {
    DS4_PDL_ENTRY();
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    int pos = atomicAdd(&cursor[ids[p]], 1);
    if (pos < P) sorted[pos] = p;  // bounds: stale counts (an escaped counts clear) must not write past the list
}

// Expert tiles of at most MOE_TILE pairs: tiles[i] = (expert, start, count); n_tiles[0]. One block.
extern "C" __global__ void moe_tiles(const int* __restrict__ counts, const int* __restrict__ offsets,
                                     int* __restrict__ tiles, int* __restrict__ n_tiles, int N, int max_tiles) {
    DS4_PDL_ENTRY();
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

// ---------------------------------------------------------------- decode path (T = 1, no sort)
// One warp computes R rows of one pair's expert against the pair's Q8_K row: lane l takes the
// 32-weight blocks l, l + 32, ... of each row (one 16-byte load per row and block), U blocks per
// row loaded before the first is used, so each activation load serves R rows. With smx = 1 the
// block first copies the activation row into shared memory (dynamic, 3 * cols / 2 bytes:
// moe_stage_x), after issuing its first weight loads. Each row's sum is added in the same order
// whatever R and U are: the results do not depend on them. Measured on the H200 (ds4-flash,
// scripts/bench_kernels.py, docs/measurements/h200-2026-12-01/kernels): gate/up fastest with 2 rows (a gate row and its up row)
// and 2 blocks in flight, down with 4 rows and 1.
#ifndef MOE_GU_RPW
#define MOE_GU_RPW 2
#endif
#ifndef MOE_GU_UNROLL
#define MOE_GU_UNROLL 2
#endif
#ifndef MOE_DN_RPW
#define MOE_DN_RPW 4
#endif
#ifndef MOE_DN_UNROLL
#define MOE_DN_UNROLL 1
#endif

extern __shared__ int4 moe_xs[];

// The Q8_K row (cols int8, a multiple of 32) into shared memory as 32-byte blocks 48 bytes apart:
// the two int4 of a lane's block, and the 8 lanes of a quarter warp, fall in distinct banks.
__device__ __forceinline__ void moe_stage_x(const i8* __restrict__ xq, int cols) {
    const int4* x4 = reinterpret_cast<const int4*>(xq);
    for (int i = threadIdx.x; i < (cols >> 4); i += blockDim.x) moe_xs[3 * (i >> 1) + (i & 1)] = __ldg(x4 + i);
}

template <int R, int U>
struct Q4Batch {
    int4 w[U][R];
    float s[U][R];

    __device__ __forceinline__ void load(const int4* const (&q)[R], const __half* const (&d)[R], int b0, int nb) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + 32 * u;
            if (b < nb) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    w[u][r] = __ldg(q[r] + b);
                    s[u][r] = __half2float(d[r][b]);
                }
            }
        }
    }

    template <bool SMX>
    __device__ __forceinline__ void use(const i8* __restrict__ xq, const float* __restrict__ xd, int b0, int nb,
                                        float (&acc)[R]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + 32 * u;
            if (b < nb) {
                const int4 xa = SMX ? moe_xs[3 * b] : __ldg(reinterpret_cast<const int4*>(xq) + 2 * b);
                const int4 xb = SMX ? moe_xs[3 * b + 1] : __ldg(reinterpret_cast<const int4*>(xq) + 2 * b + 1);
                const float xs = xd[b >> 3];
                const int xl[4] = {xa.x, xa.y, xa.z, xa.w};
                const int xh[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const int wv[4] = {w[u][r].x, w[u][r].y, w[u][r].z, w[u][r].w};
                    int i = 0;
#pragma unroll
                    for (int m = 0; m < 4; ++m) {
                        i = __dp4a((int)__vsub4(wv[m] & 0x0F0F0F0F, 0x08080808), xl[m], i);
                        i = __dp4a((int)__vsub4((wv[m] >> 4) & 0x0F0F0F0F, 0x08080808), xh[m], i);
                    }
                    acc[r] += (float)i * s[u][r] * xs;
                }
            }
        }
    }
};

// acc[r] = this lane's partial of 4-bit row row[r] (of `cols` weights) . the Q8_K row (xq, xd). Every thread of the block calls it (with smx it holds a barrier); `on`
// false: no loads, acc stays 0.
template <int R, int U, bool SMX>
__device__ __forceinline__ void q4_rows_dot(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                            const size_t (&row)[R], bool on, const i8* __restrict__ xq,
                                            const float* __restrict__ xd, int cols, float (&acc)[R]) {
    const int lane = threadIdx.x & 31, nb = cols >> 5;
    const int4* q[R];
    const __half* d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = 0.0f;
        q[r] = reinterpret_cast<const int4*>(wq + row[r] * (cols / 2));
        d[r] = wd + row[r] * nb;
    }
    Q4Batch<R, U> bt;
    if (on) bt.load(q, d, lane, nb);
    if (SMX) {
        moe_stage_x(xq, cols);
        __syncthreads();
    }
    if (!on) return;
    for (int b0 = lane;;) {
        bt.template use<SMX>(xq, xd, b0, nb, acc);
        b0 += 32 * U;
        if (b0 >= nb) break;
        bt.load(q, d, b0, nb);
    }
}

// The warp's R row sums (every lane gets them): q4_rows_dot with the activation row staged in
// shared memory (smx) or read through L1, then added across the warp.
template <int R, int U>
__device__ __forceinline__ void q4_rows_warp_dot(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                                 const size_t (&row)[R], bool on, const i8* __restrict__ xq,
                                                 const float* __restrict__ xd, int cols, int smx, float (&acc)[R]) {
    if (smx) q4_rows_dot<R, U, true>(wq, wd, row, on, xq, xd, cols, acc);
    else q4_rows_dot<R, U, false>(wq, wd, row, on, xq, xd, cols, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}

// gateup: warp w of block (bx, p) computes gate rows r0 .. r0 + MOE_GU_RPW/2 - 1 (r0 = (bx * 8 + w) *
// MOE_GU_RPW / 2) and the matching up rows of pair p's expert. grid = (ceil(F / (4 * MOE_GU_RPW)), P),
// block = 256, dynamic shared memory 3 * E / 2 bytes with smx.
extern "C" __global__ void moe_gateup_decode(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                             const i8* __restrict__ xq, const float* __restrict__ xd,
                                             const int* __restrict__ ids, float* __restrict__ gate,
                                             float* __restrict__ up, int k, int F, int E, int n_experts, int smx, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    constexpr int H = MOE_GU_RPW / 2;
    const int lane = threadIdx.x & 31, r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * H;
    const int p = blockIdx.y, t = p / k, e = ids[p];
    if ((unsigned)e >= (unsigned)n_experts) return;  // never index past the bank (uniform over the block)
    size_t rr[MOE_GU_RPW];
#pragma unroll
    for (int h = 0; h < H; ++h) {
        rr[h] = (size_t)e * 2 * F + min(r0 + h, F - 1);
        rr[H + h] = rr[h] + F;
    }
    float a[MOE_GU_RPW];
    q4_rows_warp_dot<MOE_GU_RPW, MOE_GU_UNROLL>(wq, wd, rr, r0 < F, xq + (size_t)t * E, xd + (size_t)t * (E / 256), E,
                                                smx, a);
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < H; ++h)
            if (r0 + h < F) { gate[(size_t)p * F + r0 + h] = a[h]; up[(size_t)p * F + r0 + h] = a[H + h]; }
    }
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
                                            float* __restrict__ up, int k, int F, int E, int P, int n_experts, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    tiled_rows<true>(wq, wd, xq, xd, sorted, tiles, n_tiles, gate, up, k, 2 * F, E, F, 1, P, n_experts);
}

// midq: clamped SwiGLU of gate/up [P, F], quantized to Q8_K. grid = (F/256, P), block = 256.
extern "C" __global__ void moe_midq(const float* __restrict__ gate, const float* __restrict__ up,
                                    i8* __restrict__ mq, float* __restrict__ md, int F, float limit, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    const size_t i = (size_t)blockIdx.y * F + (size_t)blockIdx.x * 256 + threadIdx.x;
    float g = fminf(gate[i], limit);
    float u = fminf(fmaxf(up[i], -limit), limit);
    float v = g / (1.0f + expf(-g)) * u;
    quantize_block(v, mq + (size_t)blockIdx.y * F + (size_t)blockIdx.x * 256,
                   md + (size_t)blockIdx.y * (F / 256) + blockIdx.x);
}

// down: out [P, E] = expert down [E, F] (4-bit) . midq[p]. Warp w of block (bx, p) computes rows
// r0 .. r0 + MOE_DN_RPW - 1, r0 = (bx * 8 + w) * MOE_DN_RPW. grid = (ceil(E / (8 * MOE_DN_RPW)), P),
// block = 256, dynamic shared memory 3 * F / 2 bytes with smx.
extern "C" __global__ void moe_down_decode(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                           const i8* __restrict__ mq, const float* __restrict__ md,
                                           const int* __restrict__ ids, float* __restrict__ out, int F, int E,
                                           int n_experts, int smx, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    const int lane = threadIdx.x & 31, r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * MOE_DN_RPW;
    const int p = blockIdx.y, e = ids[p];
    if ((unsigned)e >= (unsigned)n_experts) return;  // never index past the bank (uniform over the block)
    size_t rr[MOE_DN_RPW];
#pragma unroll
    for (int r = 0; r < MOE_DN_RPW; ++r) rr[r] = (size_t)e * E + min(r0 + r, E - 1);
    float a[MOE_DN_RPW];
    q4_rows_warp_dot<MOE_DN_RPW, MOE_DN_UNROLL>(wq, wd, rr, r0 < E, mq + (size_t)p * F, md + (size_t)p * (F / 256), F,
                                                smx, a);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MOE_DN_RPW; ++r)
            if (r0 + r < E) out[(size_t)p * E + r0 + r] = a[r];
    }
}

extern "C" __global__ void moe_down_tiled(const u8* __restrict__ wq, const __half* __restrict__ wd,
                                          const i8* __restrict__ mq, const float* __restrict__ md,
                                          const int* __restrict__ sorted, const int* __restrict__ tiles,
                                          const int* __restrict__ n_tiles, float* __restrict__ out,
                                          int k, int F, int E, int P, int n_experts, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    tiled_rows<false>(wq, wd, mq, md, sorted, tiles, n_tiles, out, nullptr, k, E, F, F, 0, P, n_experts);
}

// sum: y[t] = sum_j w[t, j] * out[t*k + j]. grid = (ceil(E/256), T), block = 256.
extern "C" __global__ void moe_sum(const float* __restrict__ out, const float* __restrict__ wts,
                                   float* __restrict__ y, int k, int E, MOE_STAMP_ARGS) {
    DS4_PDL_ENTRY();
    moe_stamp(stamp, stamp_first, stamp_n);
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= E) return;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += wts[(size_t)t * k + j] * out[((size_t)t * k + j) * E + i];
    y[(size_t)t * E + i] = acc;
}
