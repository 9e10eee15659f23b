// Dense decode ops: Q8_0 matvecs, RMS norms, hyper-connection mix/pre-mix/expand, RoPE,
// KV store, the token embedding. One decode token (T = 1); fp32 activations.
#include "q8.cuh"

// Q8_0 matvecs. Launch geometry (ds4lab/token/ops.py:q8_launch): block = (tpr, 256 / tpr), a
// thread group of tpr threads (32..256, a multiple of 32) per Q8_NR consecutive rows, 256 / tpr
// groups per block; grid = ceil(rows / (Q8_NR * groups)). Thread t of a group takes the 16-byte
// chunks t, t + tpr, ... of each of its rows (q8_group_dot); the group's partial sums are added
// in-block in a fixed order (group_sum), no atomics: bit-identical run to run. With smx = 1 the
// block first copies its x slice into shared memory (dynamic, 5 * cols bytes: q8_stage_x), after
// issuing its first weight loads; x is then read from there instead of L1.
extern "C" __global__ void q8_matvec(const i8* __restrict__ qs, const __half* __restrict__ d,
                                     const float* __restrict__ x, float* __restrict__ y,
                                     int rows, int cols, int rows_per_group, int group_stride, int smx) {
    DS4_PDL_ENTRY();
    q8_matvec_rows(qs, d, x, y, rows, cols, rows_per_group, group_stride, smx);
}

__device__ __forceinline__ float swiglu_clamped(float g, float u, float limit) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g / (1.0f + expf(-g)) * u;
}

// Shared expert gate/up with clamped SwiGLU: W is [2F, cols], rows 0..F-1 gate, F..2F-1 up.
// Thread group j computes gate rows r .. r + Q8_NR/2 - 1 and the up rows F + r ..: mid[r ..].
extern "C" __global__ void q8_matvec_swiglu(const i8* __restrict__ qs, const __half* __restrict__ d,
                                            const float* __restrict__ x, float* __restrict__ mid,
                                            int F, int cols, float limit, int smx) {
    DS4_PDL_ENTRY();
    constexpr int H = Q8_NR / 2;
    const int r0 = (blockIdx.x * blockDim.y + threadIdx.y) * H;
    size_t rr[Q8_NR];
#pragma unroll
    for (int r = 0; r < H; ++r) {
        rr[r] = (size_t)min(r0 + r, F - 1);
        rr[H + r] = rr[r] + F;
    }
    float a[Q8_NR];
    q8_rows_dot_x<Q8_NR>(qs, d, rr, r0 < F, x, cols, smx, a);
    group_sum<Q8_NR>(a);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < H; ++r)
            if (r0 + r < F) mid[r0 + r] = swiglu_clamped(a[r], a[H + r], limit);
    }
}

// Down/output projection with hyper-connection expand and residual add:
// h[s][r] += post_s * (W[r] . x + extra[r]), post_s = 2*sigmoid(mix_logits[S + s]). S * Q8_NR <= 32.
// The epilogue's inputs (h, extra, the mix logits) are loaded before the dot products, one
// (stream, row) per lane of the group's first warp, which then adds and stores in parallel.
extern "C" __global__ void q8_matvec_expand(const i8* __restrict__ qs, const __half* __restrict__ d,
                                            const float* __restrict__ x, float* __restrict__ h,
                                            const float* __restrict__ mix_logits, const float* __restrict__ extra,
                                            int rows, int cols, int S, int smx) {
    DS4_PDL_ENTRY();
    size_t rr[Q8_NR];
    const int row0 = q8_group_rows(rows, rr);
    const int lane = threadIdx.x;  // < 32: the group's first warp
    const int es = lane / Q8_NR, er = lane - es * Q8_NR, erow = row0 + er;
    const bool mine = lane < 32 && es < S && erow < rows;
    float hv = 0.0f, ex = 0.0f, post = 0.0f;
    if (mine) {
        hv = h[(size_t)es * rows + erow];
        if (extra) ex = extra[erow];
        post = 2.0f / (1.0f + expf(-mix_logits[S + es]));
    }
    float a[Q8_NR];
    q8_rows_dot_x<Q8_NR>(qs, d, rr, row0 < rows, x, cols, smx, a);
    group_sum<Q8_NR>(a);
    if (threadIdx.x < 32) {
        float y = 0.0f;
#pragma unroll
        for (int r = 0; r < Q8_NR; ++r) {
            const float v = __shfl_sync(0xffffffffu, a[r], 0);
            if (r == er) y = v;
        }
        if (mine) h[(size_t)es * rows + erow] = hv + post * (y + ex);
    }
}

// Up to RMS_VEC float4 per thread stay in registers between the sum of squares and the write
// (few enough registers for 1024-thread blocks: no __launch_bounds__ needed).
#define RMS_VEC 2

// RMS norm of each row of x [rows, dim] (times w when given); y may be x (in place). One block
// per row; ds4lab/ops.py sizes the block to dim/4 threads (at most 1024), so each thread loads
// its float4 of x and of w once, up front, and writes it after one block reduction. Other
// shapes (dim not a multiple of 4, or more than RMS_VEC float4 per thread) take a plain loop.
extern "C" __global__ void rms_norm_rows(const float* x, const float* __restrict__ w,
                                         float* y, int dim, float eps) {
    DS4_PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* yr = y + (size_t)blockIdx.x * dim;
    const int nv = dim >> 2;
    if ((dim & 3) == 0 && nv <= RMS_VEC * (int)blockDim.x) {
        float4 v[RMS_VEC], wv[RMS_VEC];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < RMS_VEC; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            wv[k] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (i < nv) {
                v[k] = reinterpret_cast<const float4*>(xr)[i];
                if (w) wv[k] = __ldg(reinterpret_cast<const float4*>(w) + i);
            }
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
        const float scale = rsqrtf(block_sum(ss) / dim + eps);
#pragma unroll
        for (int k = 0; k < RMS_VEC; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < nv)
                reinterpret_cast<float4*>(yr)[i] = make_float4(v[k].x * scale * wv[k].x, v[k].y * scale * wv[k].y,
                                                               v[k].z * scale * wv[k].z, v[k].w * scale * wv[k].w);
        }
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

#define HC_MIX_SPLIT 16

// Hyper-connection mixing logits, partial sums: part[j][s] = Wmix[j][slice s] . flat(hn)[slice s].
// grid = (2S, HC_MIX_SPLIT): enough blocks to stream Wmix at bandwidth; hc_premix adds the
// partials in a fixed order (deterministic, no atomics).
extern "C" __global__ void hc_mix(const float* __restrict__ hn, const float* __restrict__ wmix,
                                  float* __restrict__ part, int n) {
    DS4_PDL_ENTRY();
    const int per = n / HC_MIX_SPLIT, s = blockIdx.y;
    const float4* w = reinterpret_cast<const float4*>(wmix + (size_t)blockIdx.x * n + (size_t)s * per);
    const float4* v = reinterpret_cast<const float4*>(hn + (size_t)s * per);
    float acc = 0.0f;
    for (int i = threadIdx.x; i < per / 4; i += blockDim.x) {
        float4 a = w[i], b = v[i];
        acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x * HC_MIX_SPLIT + s] = acc;
}

// Pre-mix: logits[j] = sum of hc_mix's partials (written back to logits[j] for the expand),
// x = rms_norm(sum_s softmax(logits[0:S])_s * h[s]) * w. One block of 1024 threads. The streams
// and the norm weight are loaded into registers first (one float4 per stream per thread when
// E <= 4 * blockDim.x, E % 4 == 0 and S <= 4), so their latency overlaps the partials' sum;
// the normed row is written once. part == logits is allowed only when the logits are final
// already (the output mix passes zeros and nsplit = 1). S <= 8.
// (Measured on the H200, scripts/bench_kernels.py: this one-block kernel, 3.3 µs, beat a version
// that loads the 16 partials at once, 3.45 µs, and one spread over a cluster of 8 blocks that adds
// the sum of squares through distributed shared memory, 4.0 µs.)
extern "C" __global__ void hc_premix(const float* __restrict__ h, const float* part,
                                     float* logits, const float* __restrict__ w,
                                     float* __restrict__ x, int S, int E, int nsplit, float eps) {
    DS4_PDL_ENTRY();
    __shared__ float lg[16];
    const int nv = E >> 2, i = threadIdx.x;
    const bool vec = (E & 3) == 0 && nv <= (int)blockDim.x && S <= 4;
    float4 hv[4], wv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (vec && i < nv) {
        wv = __ldg(reinterpret_cast<const float4*>(w) + i);
#pragma unroll
        for (int s = 0; s < 4; ++s)
            if (s < S) hv[s] = __ldg(reinterpret_cast<const float4*>(h + (size_t)s * E) + i);
    }
    if (threadIdx.x < 2 * S) {
        float a = 0.0f;
        for (int s = 0; s < nsplit; ++s) a += part[threadIdx.x * nsplit + s];
        lg[threadIdx.x] = a;
    }
    __syncthreads();
    if (threadIdx.x < 2 * S && logits) logits[threadIdx.x] = lg[threadIdx.x];
    float pre[8];
    float m = -3.402823466e38f, z = 0.0f;
    for (int s = 0; s < S; ++s) m = fmaxf(m, lg[s]);
    for (int s = 0; s < S; ++s) { pre[s] = expf(lg[s] - m); z += pre[s]; }
    float ss = 0.0f;
    if (vec) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < nv) {
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                if (s < S) {
                    const float c = pre[s] / z;
                    v.x += c * hv[s].x; v.y += c * hv[s].y; v.z += c * hv[s].z; v.w += c * hv[s].w;
                }
            }
        }
        ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        const float scale = rsqrtf(block_sum(ss) / E + eps);
        if (i < nv)
            reinterpret_cast<float4*>(x)[i] = make_float4(v.x * scale * wv.x, v.y * scale * wv.y,
                                                          v.z * scale * wv.z, v.w * scale * wv.w);
        return;
    }
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < S; ++s) v += pre[s] / z * h[(size_t)s * E + i];
        x[i] = v;
        ss += v * v;
    }
    const float scale = rsqrtf(block_sum(ss) / E + eps);
    for (int i = threadIdx.x; i < E; i += blockDim.x) x[i] = x[i] * scale * w[i];
}

__device__ __forceinline__ void rope_pair(float& a, float& b, int pos, int i, int rope_dims, double theta) {
    double ang = (double)pos * pow(theta, -2.0 * i / rope_dims);
    double s, c;
    sincos(ang, &s, &c);
    float cf = (float)c, sf = (float)s;
    float a0 = a, b0 = b;
    a = a0 * cf - b0 * sf;
    b = a0 * sf + b0 * cf;
}

// RoPE on the last rope_dims of each query head, in place. grid = heads, block >= rope_dims/2.
extern "C" __global__ void rope_q(float* __restrict__ q, int D, int rope_dims, double theta,
                                  const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    const int i = threadIdx.x;
    if (i >= rope_dims / 2) return;
    float* base = q + (size_t)blockIdx.x * D + (D - rope_dims) + 2 * i;
    rope_pair(base[0], base[1], t.pos, i, rope_dims, theta);
}

// RoPE on the last rope_dims of the KV row, then store it at the position's ring-buffer row.
extern "C" __global__ void rope_store_kv(const float* __restrict__ kv, float* __restrict__ cache,
                                         int D, int rope_dims, double theta,
                                         const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    float* dst = cache + (size_t)t.kv_row * D;
    const int first = D - rope_dims;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        if (i < first) dst[i] = kv[i];
        else if (((i - first) & 1) == 0) {
            float a = kv[i], b = kv[i + 1];
            rope_pair(a, b, t.pos, (i - first) / 2, rope_dims, theta);
            dst[i] = a;
            dst[i + 1] = b;
        }
    }
}

// Input embedding of the token id (hashed U(-1,1)), copied into all S streams.
extern "C" __global__ void embed_token(float* __restrict__ h, int S, int E, u32 key,
                                       const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < E; i += gridDim.x * blockDim.x) {
        u32 idx = (u32)t.token_id * (u32)E + (u32)i;
        float v = __fsub_rn(__fmul_rn(ds4_unit(ds4_element_hash(key, 0, idx)), 2.0f), 1.0f);
        for (int s = 0; s < S; ++s) h[(size_t)s * E + i] = v;
    }
}
