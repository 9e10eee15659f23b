// Weight and input initialisation from a seed: element = f(key, sub, index), bit for bit the
// same as ds4lab/weights.py, so the NumPy reference regenerates any slice without a copy.
#include "common.cuh"

#define SCALE_SALT 0x5BD1E995U

__device__ __forceinline__ __half block_scale(u32 key, u32 sub, u32 nb, float base) {
    float u = ds4_unit(ds4_element_hash(key ^ SCALE_SALT, sub, nb));
    return __float2half_rn(__fmul_rn(base, __fadd_rn(0.75f, __fmul_rn(0.5f, u))));
}

// Q8_0 stack [subs, rows, cols]: grid.y = sub.
extern "C" __global__ void init_q8_0(i8* qs, __half* d, int rows, int cols, u32 key, float base) {
    const u32 sub = blockIdx.y;
    const size_t n = (size_t)rows * cols, nb = n / DS4_Q8_0_BLOCK;
    i8* q = qs + sub * n;
    __half* s = d + sub * nb;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int v = (int)(ds4_element_hash(key, sub, (u32)i) >> 24) - 128;
        q[i] = (i8)(v < -127 ? -127 : v);
        if (i < nb) s[i] = block_scale(key, sub, (u32)i, base);
    }
}

// 4-bit stack [subs, rows, cols/2 bytes]: in each 32-block, byte j = value j | value j+16 << 4.
extern "C" __global__ void init_q4(u8* qs, __half* d, int rows, int cols, u32 key, float base) {
    const u32 sub = blockIdx.y;
    const size_t n = (size_t)rows * cols, nbytes = n / 2, nb = n / DS4_Q8_0_BLOCK;
    u8* q = qs + sub * nbytes;
    __half* s = d + sub * nb;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < nbytes; k += (size_t)gridDim.x * blockDim.x) {
        size_t blk = k >> 4, j = k & 15;
        u32 lo_idx = (u32)(blk * 32 + j);
        u32 lo = ds4_element_hash(key, sub, lo_idx) >> 28;
        u32 hi = ds4_element_hash(key, sub, lo_idx + 16) >> 28;
        q[k] = (u8)(lo | (hi << 4));
        if (k < nb) s[k] = block_scale(key, sub, (u32)k, base);
    }
}

// fp32 vector: offset + scale * U(-1, 1).
extern "C" __global__ void init_f32(float* out, long long n, u32 key, float scale, float offset) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float u = ds4_unit(ds4_element_hash(key, 0, (u32)i));
        out[i] = __fadd_rn(offset, __fmul_rn(scale, __fsub_rn(__fmul_rn(u, 2.0f), 1.0f)));
    }
}
