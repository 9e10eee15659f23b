// The Q8_0 matvec core shared by dense.cu and longctx.cu (NVRTC compiles each .cu on its own).
// Layout: int8 qs [rows, cols] row-major, fp16 d [rows, cols / 32] (one scale per 32 weights),
// fp32 x. See dense.cu for the launch geometry (ds4lab/token/ops.py:q8_launch).
#pragma once
#include "common.cuh"

#ifndef Q8_NR
#define Q8_NR 4  // rows per thread group: each x chunk read serves Q8_NR rows
#endif
#ifndef Q8_UNROLL
#define Q8_UNROLL 1  // 16-byte chunks per row each thread loads before the first is used
#endif

extern __shared__ float4 q8_xs[];

// x (cols floats, a multiple of 16) into shared memory as 16-float groups 80 bytes apart: the
// four float4 of a thread's group and the 8 threads of a quarter warp (consecutive groups) fall
// in distinct banks, so the inner loop's x reads are conflict-free. Every thread of the block.
__device__ __forceinline__ void q8_stage_x(const float* __restrict__ x, int cols) {
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = tid; i < (cols >> 2); i += nt) q8_xs[(i >> 2) * 5 + (i & 3)] = __ldg(x4 + i);
}

// One batch of Q8_UNROLL chunks of each of NR rows: the loads, then their use.
template <int NR>
struct Q8Batch {
    int4 v[Q8_UNROLL][NR];
    float s[Q8_UNROLL][NR];

    __device__ __forceinline__ void load(const int4* const (&w)[NR], const __half* const (&d)[NR], int c0, int tpr,
                                         int chunks) {
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            const int c = c0 + u * tpr;
            if (c < chunks) {
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    v[u][r] = __ldg(w[r] + c);
                    s[u][r] = __half2float(d[r][c >> 1]);
                }
            }
        }
    }

    template <bool SMX>
    __device__ __forceinline__ void use(const float* __restrict__ x, int c0, int tpr, int chunks, float (&acc)[NR]) {
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            const int c = c0 + u * tpr;
            if (c < chunks) {
                float4 xs[4];
#pragma unroll
                for (int m = 0; m < 4; ++m)
                    xs[m] = SMX ? q8_xs[c * 5 + m] : __ldg(reinterpret_cast<const float4*>(x) + 4 * c + m);
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] = fmaf(s[u][r], q8_dot16(v[u][r], xs), acc[r]);
            }
        }
    }
};

// acc[r] = this thread's partial of row row[r] . x (reduce with group_sum). Every thread of the
// block calls it (with smx it holds a barrier); `on` false: no loads, acc stays 0.
template <int NR, bool SMX>
__device__ __forceinline__ void q8_group_dot(const i8* __restrict__ qs, const __half* __restrict__ d,
                                             const size_t (&row)[NR], bool on, const float* __restrict__ x,
                                             int cols, float (&acc)[NR]) {
    const int t = threadIdx.x, tpr = blockDim.x, chunks = cols >> 4, nb = cols >> 5;
    const int4* w[NR];
    const __half* dr[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        acc[r] = 0.0f;
        w[r] = reinterpret_cast<const int4*>(qs + row[r] * cols);
        dr[r] = d + row[r] * nb;
    }
    Q8Batch<NR> b;
    if (on) b.load(w, dr, t, tpr, chunks);
    if (SMX) {
        q8_stage_x(x, cols);
        __syncthreads();
    }
    if (!on) return;
    for (int c0 = t;;) {
        b.template use<SMX>(x, c0, tpr, chunks, acc);
        c0 += Q8_UNROLL * tpr;
        if (c0 >= chunks) break;
        b.load(w, dr, c0, tpr, chunks);
    }
}

template <int NR>
__device__ __forceinline__ void q8_rows_dot_x(const i8* __restrict__ qs, const __half* __restrict__ d,
                                              const size_t (&row)[NR], bool on, const float* __restrict__ x,
                                              int cols, int smx, float (&acc)[NR]) {
    if (smx) q8_group_dot<NR, true>(qs, d, row, on, x, cols, acc);
    else q8_group_dot<NR, false>(qs, d, row, on, x, cols, acc);
}

// The Q8_NR rows of this thread group: row0 .. row0 + Q8_NR - 1, past `rows` clamped to the last
// row (loaded, never stored). Returns row0.
__device__ __forceinline__ int q8_group_rows(int rows, size_t (&rr)[Q8_NR]) {
    const int row0 = (blockIdx.x * blockDim.y + threadIdx.y) * Q8_NR;
#pragma unroll
    for (int r = 0; r < Q8_NR; ++r) rr[r] = (size_t)min(row0 + r, rows - 1);
    return row0;
}

// y[r] = W[r] . x[g*group_stride : +cols], g = r / rows_per_group. With smx, every row of a block
// must be in one group (ops.q8_launch checks it). The body of q8_matvec and longctx.cu's
// q8_matvec_when: the same reduction, so the same bits.
__device__ __forceinline__ void q8_matvec_rows(const i8* __restrict__ qs, const __half* __restrict__ d,
                                               const float* __restrict__ x, float* __restrict__ y, int rows,
                                               int cols, int rows_per_group, int group_stride, int smx) {
    size_t rr[Q8_NR];
    const int row0 = q8_group_rows(rows, rr);
    const int gx = smx ? (blockIdx.x * blockDim.y * Q8_NR) / rows_per_group : min(row0, rows - 1) / rows_per_group;
    float a[Q8_NR];
    q8_rows_dot_x<Q8_NR>(qs, d, rr, row0 < rows, x + (size_t)gx * group_stride, cols, smx, a);
    group_sum<Q8_NR>(a);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < Q8_NR; ++r)
            if (row0 + r < rows) y[row0 + r] = a[r];
    }
}
