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

// Programmatic dependent launch (PDL), the device-side half (CUDA Programming Guide, "Programmatic
// Dependent Launch and Synchronization"; PTX ISA, griddepcontrol, sm_90 and later). Compiled in only
// where the module is built with -DDS4_PDL=1 (the stages that launch with the programmatic
// stream-serialization attribute: ds4lab/backends/cupy_device_graphs.py); every other build, and
// every build before sm_90, has an empty macro, so the kernels of the other stages are unchanged.
//
// DS4_PDL_ENTRY() is the first statement of every kernel of the decode token, executed by every
// thread before anything else:
//   griddepcontrol.wait             blocks until the grids this one depends on programmatically
//                                   have completed and their writes are visible (a no-op for a
//                                   grid launched without the attribute);
//   griddepcontrol.launch_dependents lets the grid after this one be scheduled once every block of
//                                   this grid has executed it (or exited).
// Nothing runs before the wait, so the only work that overlaps a predecessor is the dependent's
// launch and the scheduling of its blocks; and because every block waits before it can exit, no
// grid completes before its predecessor does, so a wait covers every earlier kernel of the chain,
// not only the one just before (docs/capture-stages.md, "Why each overlap is safe").
#if defined(DS4_PDL) && DS4_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DS4_PDL_ENTRY()                                                \
    do {                                                               \
        asm volatile("griddepcontrol.wait;" ::: "memory");             \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#else
#define DS4_PDL_ENTRY() \
    do {                \
    } while (0)
#endif

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

// Thread-block clusters (sm_90): a kernel declared with DS4_CLUSTER_DIMS(x, y, z) before
// __global__ runs in clusters of that shape, whose blocks read each other's shared memory.
// Before sm_90 DS4_CLUSTERS is 0 and the macro is empty: such a kernel takes another path there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DS4_CLUSTERS 1
#define DS4_CLUSTER_DIMS(x, y, z) __cluster_dims__(x, y, z)

// Every thread of every block of the cluster: what each wrote to its shared memory before is
// visible to the others after.
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The address of cluster block `rank`'s copy of the shared-memory word at p.
__device__ __forceinline__ unsigned dsmem_addr(const void* p, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(r) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
    return r;
}

__device__ __forceinline__ float dsmem_f32(const float* p, unsigned rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dsmem_addr(p, rank)) : "memory");
    return v;
}

__device__ __forceinline__ float2 dsmem_f32x2(const float2* p, unsigned rank) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(dsmem_addr(p, rank))
                 : "memory");
    return v;
}
#else
#define DS4_CLUSTERS 0
#define DS4_CLUSTER_DIMS(x, y, z)
#endif
