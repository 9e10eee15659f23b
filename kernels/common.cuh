// Shared device helpers for ds4lab's kernels (compiled by NVRTC through cupy.RawModule).
// No host code, no C++ standard library: NVRTC compiles these without system headers.
#pragma once
#include <cuda_fp16.h>

typedef unsigned int u32;
typedef signed char i8;
typedef unsigned char u8;

#define DS4_Q8_0_BLOCK 32
#define DS4_Q8_K_BLOCK 256

// lowbias32 integer hash; mirrored by ds4lab/weights.py:mix32.
__device__ __forceinline__ u32 ds4_mix32(u32 x) {
    x ^= x >> 16; x *= 0x7feb352dU;
    x ^= x >> 15; x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Hash of element idx of sub-tensor sub of the tensor keyed by key (weights.py:element_hash).
__device__ __forceinline__ u32 ds4_element_hash(u32 key, u32 sub, u32 idx) {
    return ds4_mix32(idx ^ ds4_mix32(key + sub * 0x9E3779B9U));
}

// Uniform float in [0, 1) from the top 24 bits (exact in float32).
__device__ __forceinline__ float ds4_unit(u32 h) {
    return __fmul_rn((float)(h >> 8), 5.9604644775390625e-08f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum; every thread gets the result. blockDim.x a multiple of 32, at most 1024.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = (lane < (int)(blockDim.x >> 5)) ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

__device__ float block_max(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = (lane < (int)(blockDim.x >> 5)) ? part[lane] : -3.402823466e38f;
        s = warp_max(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

// Per-token scalars: read from the device buffer when one is given (capture-safe),
// else the values passed by value (ds4 today: frozen into a graph at capture).
struct TokScalars { int pos, kv_row, n_valid, token_id; };

__device__ __forceinline__ TokScalars tok_scalars(const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    TokScalars t;
    if (scal) { t.pos = scal[0]; t.kv_row = scal[1]; t.n_valid = scal[2]; t.token_id = scal[3]; }
    else { t.pos = pos; t.kv_row = kv_row; t.n_valid = n_valid; t.token_id = token_id; }
    return t;
}

// 16 int8 weights (one 16-byte load) dotted with 16 fp32 activations, exactly as an int8->fp32
// conversion would: each byte b becomes the float 2^23 + (b + 128) through one byte permute
// (PRMT), and subtracting 2^23 + 128 leaves b exactly. I2F, the plain conversion, issues at 16
// per clock per SM on sm_80/sm_90, below the rate at which HBM delivers Q8_0 bytes; PRMT and
// FADD issue at 64 and 128. The products and their order are those of the plain loop.
__device__ __forceinline__ float q8_dot16(int4 v, const float4 (&xs)[4]) {
    const u32 w[4] = {(u32)v.x ^ 0x80808080u, (u32)v.y ^ 0x80808080u, (u32)v.z ^ 0x80808080u,
                      (u32)v.w ^ 0x80808080u};
    const float off = 8388736.0f;  // 2^23 + 128
    float p = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const float a = __int_as_float(__byte_perm(w[m], 0x4B000000u, 0x7440)) - off;
        const float b = __int_as_float(__byte_perm(w[m], 0x4B000000u, 0x7441)) - off;
        const float c = __int_as_float(__byte_perm(w[m], 0x4B000000u, 0x7442)) - off;
        const float e = __int_as_float(__byte_perm(w[m], 0x4B000000u, 0x7443)) - off;
        p = fmaf(a, xs[m].x, p);
        p = fmaf(b, xs[m].y, p);
        p = fmaf(c, xs[m].z, p);
        p = fmaf(e, xs[m].w, p);
    }
    return p;
}

// NR Q8_0 rows (indices row[0..NR-1], each `cols` wide) against the same x, split over the
// `tpr` threads of a thread group: thread t takes the 16-byte chunks t, t + tpr, ... of every
// row, so each x load serves NR rows and each thread keeps 2*NR 16-byte loads in flight.
// acc[r] gets this thread's partial sum of row r (reduce with group_sum).
template <int NR>
__device__ __forceinline__ void q8_rows_dot(const i8* __restrict__ qs, const __half* __restrict__ d,
                                            const size_t (&row)[NR], const float* __restrict__ x,
                                            int cols, int t, int tpr, float (&acc)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    const int chunks = cols >> 4, nb = cols >> 5;
#pragma unroll 2
    for (int c = t; c < chunks; c += tpr) {
        int4 v[NR];
        float s[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            v[r] = __ldg(reinterpret_cast<const int4*>(qs + row[r] * cols) + c);
            s[r] = __half2float(d[row[r] * nb + (c >> 1)]);
        }
        const float4* xv = reinterpret_cast<const float4*>(x) + (c << 2);
        const float4 xs[4] = {xv[0], xv[1], xv[2], xv[3]};
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = fmaf(s[r], q8_dot16(v[r], xs), acc[r]);
    }
}

// Sum of acc[r] over the blockDim.x threads of each thread group (block = (tpr, 256 / tpr),
// tpr a multiple of 32): warp shuffles, then, for tpr > 32, the group's warps added in warp
// order through shared memory. Fixed order, so the same inputs give the same bits every run.
// Every thread of the block must call it (it holds a barrier when tpr > 32). The result is
// valid in the thread with threadIdx.x == 0 of each group.
template <int NR>
__device__ __forceinline__ void group_sum(float (&acc)[NR]) {
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
    const int wpg = blockDim.x >> 5;
    if (wpg > 1) {
        __shared__ float red[32][NR];
        const int tid = threadIdx.y * blockDim.x + threadIdx.x, warp = tid >> 5;
        if ((tid & 31) == 0) {
#pragma unroll
            for (int r = 0; r < NR; ++r) red[warp][r] = acc[r];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                float a = 0.0f;
                for (int w = 0; w < wpg; ++w) a += red[threadIdx.y * wpg + w][r];
                acc[r] = a;
            }
        }
    }
}

// Two 4-bit rows against the same Q8_K activation row, one warp: the activation is loaded once
// for both rows; UNROLL iterations' 16-byte loads are issued before their use.
template <int UNROLL>
__device__ __forceinline__ void q4_q8k_row_dot2(const u8* __restrict__ q0, const __half* __restrict__ d0,
                                                const u8* __restrict__ q1, const __half* __restrict__ d1,
                                                const i8* __restrict__ xq, const float* __restrict__ xd,
                                                int cols, int lane, float& acc0, float& acc1) {
    acc0 = 0.0f; acc1 = 0.0f;
    const int blocks = cols >> 5;
#pragma unroll UNROLL
    for (int b = lane; b < blocks; b += 32) {
        int4 w0 = __ldg(reinterpret_cast<const int4*>(q0) + b);
        int4 w1 = __ldg(reinterpret_cast<const int4*>(q1) + b);
        int4 xa = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b);
        int4 xb = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b + 1);
        const float xs = xd[b >> 3];
        const int wv0[4] = {w0.x, w0.y, w0.z, w0.w};
        const int wv1[4] = {w1.x, w1.y, w1.z, w1.w};
        const int xl[4] = {xa.x, xa.y, xa.z, xa.w};
        const int xh[4] = {xb.x, xb.y, xb.z, xb.w};
        int i0 = 0, i1 = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            i0 = __dp4a((int)__vsub4(wv0[k] & 0x0F0F0F0F, 0x08080808), xl[k], i0);
            i0 = __dp4a((int)__vsub4((wv0[k] >> 4) & 0x0F0F0F0F, 0x08080808), xh[k], i0);
            i1 = __dp4a((int)__vsub4(wv1[k] & 0x0F0F0F0F, 0x08080808), xl[k], i1);
            i1 = __dp4a((int)__vsub4((wv1[k] >> 4) & 0x0F0F0F0F, 0x08080808), xh[k], i1);
        }
        acc0 += (float)i0 * __half2float(d0[b]) * xs;
        acc1 += (float)i1 * __half2float(d1[b]) * xs;
    }
}
