// ds4's routed-MoE path (ds4_cuda.cu at b0309611) over its expert formats, in ds4lab's own kernels.
//
// One decode token, four launches: xq_quantize_q8k (the input to Q8_K) -> moe_gateup_mid_<fmt>
// (gate and up rows of every selected expert against the Q8_K input, clamped SwiGLU, times the
// expert's router weight) -> moe_midq_q8k (the middle to Q8_K) -> moe_down_sum_<fmt> (each expert's
// down rows against its middle, the experts summed). More than one token: the sorted pairs of
// kernels/moe.cu, then moe_gateup_mid_tiled_<fmt>, moe_midq_q8k, moe_down_tiled_<fmt>, moe_sum_slots.
//
// Weight formats (ggml's, as ds4.c reads them; ds4lab/token/weights.py SUPERBLOCKS): super-blocks of
// 256 weights, packed as in the file: Q4_K 144 bytes, Q2_K 84, IQ2_XXS 66. Rows are runs of blocks.
// Activations: Q8_K per 256 values, as separate arrays: int8 quants [rows, n], fp32 scale
// [rows, n/256], int16 sums of 16 quants [rows, n/16].
//
// Hopper habits: a block stages its weight rows into shared memory with 16-byte cp.async copies (a
// format's block boundaries do not fall on 16 bytes; a tile of rows does), every copy of the tile in
// flight before the first wait; then each warp takes a row, its lanes the row's sub-blocks of 32.
// Sums are in a fixed order (lane, then a butterfly over the warp, then slots in order): the same
// inputs give the same bits, eager or replayed.
#include "common.cuh"

typedef unsigned short u16;
typedef unsigned long long u64;

#include "ds4_formats.cuh"

#define DS4_QK_K 256

// ----------------------------------------------------------------------------- staging
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Issue the copy of n16 16-byte chunks, src and dst 16-byte aligned (the caller waits).
__device__ __forceinline__ void stage16(u8* dst, const u8* src, int n16) {
    for (int c = threadIdx.x; c < n16; c += blockDim.x) cp_async16(dst + 16 * c, src + 16 * c);
}

// The Q8_K activation of sub-block s (32 values) of one row: words, scale, the two sums of 16.
struct Act {
    int a[8];
    float dx;
    short2 bs;
};

__device__ __forceinline__ Act load_act(const i8* __restrict__ xq, const float* __restrict__ xd,
                                        const short* __restrict__ xb, int s) {
    Act r;
    const int4* v = reinterpret_cast<const int4*>(xq + 32 * s);
    const int4 v0 = __ldg(v), v1 = __ldg(v + 1);
    r.a[0] = v0.x; r.a[1] = v0.y; r.a[2] = v0.z; r.a[3] = v0.w;
    r.a[4] = v1.x; r.a[5] = v1.y; r.a[6] = v1.z; r.a[7] = v1.w;
    r.dx = __ldg(xd + (s >> 3));
    r.bs = __ldg(reinterpret_cast<const short2*>(xb) + s);
    return r;
}

// One warp: row (shared memory, nsub sub-blocks) . activation row; the sum in every lane.
template <class Fmt>
__device__ __forceinline__ float row_dot(const u8* row, const i8* xq, const float* xd, const short* xb, int nsub,
                                         const uint2* lut) {
    float acc = 0.0f;
    for (int s = threadIdx.x & 31; s < nsub; s += 32) {
        const Act x = load_act(xq, xd, xb, s);
        acc += Fmt::sub(row + (s >> 3) * Fmt::BYTES, s & 7, x.a, x.dx, x.bs, lut);
    }
    return warp_sum(acc);
}

// ds4's clamped SwiGLU times the router weight (moe_gate_up_mid_decode_*: gate at most limit, up
// within +-limit, silu(gate) * up * weight).
__device__ __forceinline__ float swiglu_weighted(float g, float u, float limit, float w) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (g / (1.0f + expf(-g))) * u * w;
}

// ----------------------------------------------------------------------------- gate/up
// Block: R row pairs (gate row r, up row F + r; r = blockIdx.x * R + i) of expert e, staged once, for
// each pair of plist (cnt pairs; pair p reads token p / k's input, writes mid[p, r]).
// Dynamic shared memory: 2 * R * row_bytes, plus 2 KiB for the IQ2 grid.
template <class Fmt>
__device__ __forceinline__ void gateup_rows(const u8* __restrict__ bank, const u64* __restrict__ grid,
                                            const i8* __restrict__ xq, const float* __restrict__ xd,
                                            const short* __restrict__ xb, const float* __restrict__ wts,
                                            float* __restrict__ mid, int e, const int* plist, int cnt, int P,
                                            int k, int F, int E, int R, float limit) {
    extern __shared__ __align__(16) u8 smem[];
    const int row_bytes = E / DS4_QK_K * Fmt::BYTES, nsub = E / 32, r0 = blockIdx.x * R;
    const u8* gsrc = bank + (size_t)e * 2 * F * row_bytes + (size_t)r0 * row_bytes;
    const int tile = R * row_bytes;
    stage16(smem, gsrc, tile / 16);
    stage16(smem + tile, gsrc + (size_t)F * row_bytes, tile / 16);
    const uint2* lut = reinterpret_cast<const uint2*>(smem + 2 * tile);
    if (Fmt::LUT) stage16(smem + 2 * tile, reinterpret_cast<const u8*>(grid), 256 * 8 / 16);
    cp_async_wait_all();
    __syncthreads();
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    for (int j = 0; j < cnt; ++j) {
        const int p = plist[j];
        if (p < 0 || p >= P) continue;
        const int t = p / k;
        const i8* q = xq + (size_t)t * E;
        const float* d = xd + (size_t)t * (E / 256);
        const short* b = xb + (size_t)t * (E / 16);
        const float w = wts[p];
        for (int i = warp; i < R; i += warps) {
            const float g = row_dot<Fmt>(smem + i * row_bytes, q, d, b, nsub, lut);
            const float u = row_dot<Fmt>(smem + tile + i * row_bytes, q, d, b, nsub, lut);
            if ((threadIdx.x & 31) == 0) mid[(size_t)p * F + r0 + i] = swiglu_weighted(g, u, limit, w);
        }
    }
}

// Decode (no sort): grid (F / R, P), pair p = blockIdx.y with expert ids[p]. An expert id outside the
// bank writes a zero middle (the pair adds nothing downstream).
template <class Fmt>
__device__ __forceinline__ void gateup_decode(const u8* bank, const u64* grid, const i8* xq, const float* xd,
                                              const short* xb, const int* ids, const float* wts, float* mid, int k,
                                              int F, int E, int n_experts, int R, float limit) {
    const int p = blockIdx.y, e = ids[p];
    if ((unsigned)e >= (unsigned)n_experts) {
        for (int i = threadIdx.x; i < R; i += blockDim.x) mid[(size_t)p * F + blockIdx.x * R + i] = 0.0f;
        return;
    }
    gateup_rows<Fmt>(bank, grid, xq, xd, xb, wts, mid, e, &p, 1, (int)gridDim.y, k, F, E, R, limit);
}

// Sorted (tokens > 1): grid (F / R, max_tiles), tile (expert, start, count) of the sorted pair list;
// blocks past n_tiles exit. Bounds as moe_gateup_tiled's (stale counts may leave bad tiles).
template <class Fmt>
__device__ __forceinline__ void gateup_tiled(const u8* bank, const u64* grid, const i8* xq, const float* xd,
                                             const short* xb, const int* sorted, const int* tiles,
                                             const int* n_tiles, const float* wts, float* mid, int k, int F, int E,
                                             int P, int n_experts, int R, float limit) {
    if ((int)blockIdx.y >= n_tiles[0]) return;
    const int* tl = tiles + 3 * blockIdx.y;
    const int e = tl[0], start = tl[1];
    if (e < 0 || e >= n_experts || start < 0 || start >= P) return;
    const int cnt = min(tl[2], P - start);
    gateup_rows<Fmt>(bank, grid, xq, xd, xb, wts, mid, e, sorted + start, cnt, P, k, F, E, R, limit);
}

// The launchable kernels (written out: the cupy backend finds kernels by their extern "C" names). The
// decode kernels are held to 40 registers (6 blocks of 256 per SM, no spills with nvcc 13 for sm_90), so
// ds4-flash's 768 IQ2_XXS blocks (R = 16) fit in one wave on 132 SMs.
#define GATEUP_ARGS                                                                                             \
    const u8 *__restrict__ bank, const u64 *__restrict__ grid, const i8 *__restrict__ xq,                      \
        const float *__restrict__ xd, const short *__restrict__ xb
#define GATEUP_DECODE_ARGS                                                                                      \
    const int *__restrict__ ids, const float *__restrict__ wts, float *__restrict__ mid, int k, int F, int E,  \
        int n_experts, int R, float limit
#define GATEUP_TILED_ARGS                                                                                       \
    const int *__restrict__ sorted, const int *__restrict__ tiles, const int *__restrict__ n_tiles,            \
        const float *__restrict__ wts, float *__restrict__ mid, int k, int F, int E, int P, int n_experts, int R, \
        float limit

extern "C" __global__ void __launch_bounds__(256, 6) moe_gateup_mid_iq2_xxs(GATEUP_ARGS, GATEUP_DECODE_ARGS) {
    DS4_PDL_ENTRY();
    gateup_decode<FmtIQ2XXS>(bank, grid, xq, xd, xb, ids, wts, mid, k, F, E, n_experts, R, limit);
}

extern "C" __global__ void __launch_bounds__(256, 6) moe_gateup_mid_q4_k(GATEUP_ARGS, GATEUP_DECODE_ARGS) {
    DS4_PDL_ENTRY();
    gateup_decode<FmtQ4K>(bank, grid, xq, xd, xb, ids, wts, mid, k, F, E, n_experts, R, limit);
}

extern "C" __global__ void moe_gateup_mid_tiled_iq2_xxs(GATEUP_ARGS, GATEUP_TILED_ARGS) {
    DS4_PDL_ENTRY();
    gateup_tiled<FmtIQ2XXS>(bank, grid, xq, xd, xb, sorted, tiles, n_tiles, wts, mid, k, F, E, P, n_experts, R,
                            limit);
}

extern "C" __global__ void moe_gateup_mid_tiled_q4_k(GATEUP_ARGS, GATEUP_TILED_ARGS) {
    DS4_PDL_ENTRY();
    gateup_tiled<FmtQ4K>(bank, grid, xq, xd, xb, sorted, tiles, n_tiles, wts, mid, k, F, E, P, n_experts, R, limit);
}

// ----------------------------------------------------------------------------- down
// Decode: y[t, r] = sum over the k slots s (in order) of down_{ids[t k + s]}[r] . midq[t k + s].
// grid (E / R, T); the block stages R rows of each of the k experts (k tiles in flight together),
// warps take (slot, row) units, a slot's partials are added in slot order.
// Dynamic shared memory: k * R * row_bytes + 4 * k * R. An expert outside the bank adds nothing.
template <class Fmt>
__device__ __forceinline__ void down_sum(const u8* __restrict__ bank, const i8* __restrict__ mq,
                                         const float* __restrict__ md, const short* __restrict__ mb,
                                         const int* __restrict__ ids, float* __restrict__ y, int k, int F, int E,
                                         int n_experts, int R) {
    extern __shared__ __align__(16) u8 smem[];
    const int row_bytes = F / DS4_QK_K * Fmt::BYTES, nsub = F / 32, r0 = blockIdx.x * R, t = blockIdx.y;
    const int tile = R * row_bytes;
    float* part = reinterpret_cast<float*>(smem + k * tile);
    for (int s = 0; s < k; ++s) {
        const int e = ids[t * k + s];
        if ((unsigned)e < (unsigned)n_experts)
            stage16(smem + s * tile, bank + (size_t)e * E * row_bytes + (size_t)r0 * row_bytes, tile / 16);
    }
    cp_async_wait_all();
    __syncthreads();
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    for (int u = warp; u < k * R; u += warps) {
        const int s = u / R, i = u - s * R, p = t * k + s;
        float v = 0.0f;
        if ((unsigned)ids[p] < (unsigned)n_experts)
            v = row_dot<Fmt>(smem + s * tile + i * row_bytes, mq + (size_t)p * F, md + (size_t)p * (F / 256),
                             mb + (size_t)p * (F / 16), nsub, nullptr);
        if ((threadIdx.x & 31) == 0) part[u] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < k; ++s) acc += part[s * R + i];
        y[(size_t)t * E + r0 + i] = acc;
    }
}

// Sorted (tokens > 1): out[p, r] = down_e[r] . midq[p] for the pairs of one tile; grid (E / R, max_tiles).
// Dynamic shared memory: R * row_bytes.
template <class Fmt>
__device__ __forceinline__ void down_tiled(const u8* __restrict__ bank, const i8* __restrict__ mq,
                                           const float* __restrict__ md, const short* __restrict__ mb,
                                           const int* __restrict__ sorted, const int* __restrict__ tiles,
                                           const int* __restrict__ n_tiles, float* __restrict__ out, int F, int E,
                                           int P, int n_experts, int R) {
    extern __shared__ __align__(16) u8 smem[];
    if ((int)blockIdx.y >= n_tiles[0]) return;
    const int* tl = tiles + 3 * blockIdx.y;
    const int e = tl[0], start = tl[1];
    if (e < 0 || e >= n_experts || start < 0 || start >= P) return;
    const int cnt = min(tl[2], P - start);
    const int row_bytes = F / DS4_QK_K * Fmt::BYTES, nsub = F / 32, r0 = blockIdx.x * R;
    stage16(smem, bank + (size_t)e * E * row_bytes + (size_t)r0 * row_bytes, R * row_bytes / 16);
    cp_async_wait_all();
    __syncthreads();
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    for (int u = warp; u < cnt * R; u += warps) {
        const int j = u / R, i = u - j * R, p = sorted[start + j];
        if (p < 0 || p >= P) continue;
        const float v = row_dot<Fmt>(smem + i * row_bytes, mq + (size_t)p * F, md + (size_t)p * (F / 256),
                                     mb + (size_t)p * (F / 16), nsub, nullptr);
        if ((threadIdx.x & 31) == 0) out[(size_t)p * E + r0 + i] = v;
    }
}

#define DOWN_ARGS                                                                                               \
    const u8 *__restrict__ bank, const i8 *__restrict__ mq, const float *__restrict__ md,                      \
        const short *__restrict__ mb
#define DOWN_SUM_ARGS const int *__restrict__ ids, float *__restrict__ y, int k, int F, int E, int n_experts, int R
#define DOWN_TILED_ARGS                                                                                         \
    const int *__restrict__ sorted, const int *__restrict__ tiles, const int *__restrict__ n_tiles,            \
        float *__restrict__ out, int F, int E, int P, int n_experts, int R

extern "C" __global__ void moe_down_sum_q2_k(DOWN_ARGS, DOWN_SUM_ARGS) {
    DS4_PDL_ENTRY();
    down_sum<FmtQ2K>(bank, mq, md, mb, ids, y, k, F, E, n_experts, R);
}

extern "C" __global__ void moe_down_sum_q4_k(DOWN_ARGS, DOWN_SUM_ARGS) {
    DS4_PDL_ENTRY();
    down_sum<FmtQ4K>(bank, mq, md, mb, ids, y, k, F, E, n_experts, R);
}

extern "C" __global__ void moe_down_tiled_q2_k(DOWN_ARGS, DOWN_TILED_ARGS) {
    DS4_PDL_ENTRY();
    down_tiled<FmtQ2K>(bank, mq, md, mb, sorted, tiles, n_tiles, out, F, E, P, n_experts, R);
}

extern "C" __global__ void moe_down_tiled_q4_k(DOWN_ARGS, DOWN_TILED_ARGS) {
    DS4_PDL_ENTRY();
    down_tiled<FmtQ4K>(bank, mq, md, mb, sorted, tiles, n_tiles, out, F, E, P, n_experts, R);
}

// sum (tokens > 1): y[t, r] = sum over s (in order) of out[t k + s, r]; the router weights are in the
// middle already (ds4_cuda.cu moe_sum_kernel). grid (ceil(E / 256), T), block 256.
extern "C" __global__ void moe_sum_slots(const float* __restrict__ out, float* __restrict__ y, int k, int E) {
    DS4_PDL_ENTRY();
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= E) return;
    float acc = 0.0f;
    for (int s = 0; s < k; ++s) acc += out[((size_t)t * k + s) * E + r];
    y[(size_t)t * E + r] = acc;
}

// ----------------------------------------------------------------------------- Q8_K
// One block of 256 values, one per thread (blockDim 256), as ds4's q8_K_quantize_kernel: the value of
// largest magnitude by its shared-memory tree (at strides 128 .. 1, position i takes i + stride's
// candidate when strictly larger; strides 16 .. 1 here by shuffles within warp 0, the same pairs),
// iscale = -127 / max, q = rint(iscale * x) in [-128, 127], d = 1 / iscale, sums of 16.
__device__ __forceinline__ void q8k_block(float v, i8* __restrict__ q, float* __restrict__ d,
                                          short* __restrict__ bs) {
    __shared__ float sa[256], sv[256];
    __shared__ float s_iscale;
    const int tid = threadIdx.x;
    sa[tid] = fabsf(v);
    sv[tid] = v;
    __syncthreads();
    for (int st = 128; st >= 32; st >>= 1) {
        if (tid < st && sa[tid + st] > sa[tid]) {
            sa[tid] = sa[tid + st];
            sv[tid] = sv[tid + st];
        }
        __syncthreads();
    }
    if (tid < 32) {
        float a = sa[tid], m = sv[tid];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float a2 = __shfl_down_sync(0xffffffffu, a, o), m2 = __shfl_down_sync(0xffffffffu, m, o);
            if (a2 > a) {
                a = a2;
                m = m2;
            }
        }
        if (tid == 0) s_iscale = a == 0.0f ? 0.0f : -127.0f / m;
    }
    __syncthreads();
    const float iscale = s_iscale;
    int qi = 0;
    if (iscale != 0.0f) qi = max(-128, min(127, __float2int_rn(iscale * v)));
    q[tid] = (i8)qi;
    int sum = qi;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((tid & 15) == 0) bs[tid >> 4] = (short)sum;
    if (tid == 0) *d = iscale == 0.0f ? 0.0f : 1.0f / iscale;
}

// x [rows, n] fp32 -> Q8_K. grid (n / 256, rows), block 256. xq: the routed MoE's input.
extern "C" __global__ void xq_quantize_q8k(const float* __restrict__ x, i8* __restrict__ q, float* __restrict__ d,
                                           short* __restrict__ bs, int n) {
    DS4_PDL_ENTRY();
    const size_t base = (size_t)blockIdx.y * n + (size_t)blockIdx.x * 256;
    q8k_block(x[base + threadIdx.x], q + base, d + (size_t)blockIdx.y * (n / 256) + blockIdx.x, bs + base / 16);
}

// The same for the middle (midq), under its own name so traces tell the stages apart.
extern "C" __global__ void moe_midq_q8k(const float* __restrict__ x, i8* __restrict__ q, float* __restrict__ d,
                                        short* __restrict__ bs, int n) {
    DS4_PDL_ENTRY();
    const size_t base = (size_t)blockIdx.y * n + (size_t)blockIdx.x * 256;
    q8k_block(x[base + threadIdx.x], q + base, d + (size_t)blockIdx.y * (n / 256) + blockIdx.x, bs + base / 16);
}

// ----------------------------------------------------------------------------- weights
// A super-block stack [subs, bytes_per_sub] from a seed (ds4lab/token/weights.py gen_superblocks, bit
// for bit): byte i of sub-tensor sub is the top byte of element_hash(key, sub, i), except in the fp16
// scale fields (byte offsets off0 and off1, -1 for none) of each block: mean * (0.75 + 0.5 U),
// U from element_hash(key ^ salt, sub, block), rounded to nearest even. grid.y = sub.
__device__ __forceinline__ u32 scale_field_bits(u32 key, u32 sub, u32 blk, float mean) {
    const float u = ds4_unit(ds4_element_hash(key, sub, blk));
    return __half_as_ushort(__float2half_rn(__fmul_rn(mean, __fadd_rn(0.75f, __fmul_rn(0.5f, u)))));
}

extern "C" __global__ void init_superblocks(u8* out, unsigned long long bytes_per_sub, int block_bytes, u32 key,
                                            int off0, float mean0, u32 salt0, int off1, float mean1, u32 salt1) {
    const u32 sub = blockIdx.y;
    u8* o = out + (size_t)sub * bytes_per_sub;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes_per_sub;
         i += (size_t)gridDim.x * blockDim.x) {
        const u32 blk = (u32)(i / block_bytes), j = (u32)(i - (size_t)blk * block_bytes);
        u32 v;
        if (off0 >= 0 && j - (u32)off0 < 2u) v = scale_field_bits(key ^ salt0, sub, blk, mean0) >> (8 * (j - off0));
        else if (off1 >= 0 && j - (u32)off1 < 2u) v = scale_field_bits(key ^ salt1, sub, blk, mean1) >> (8 * (j - off1));
        else v = ds4_element_hash(key, sub, (u32)i) >> 24;
        o[i] = (u8)v;
    }
}
