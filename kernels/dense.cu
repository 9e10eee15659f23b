// Dense decode ops: Q8_0 matvecs, RMS norms, hyper-connection mix/pre-mix/expand, RoPE,
// KV store, the token embedding. One decode token (T = 1); fp32 activations.
#include "common.cuh"

// Q8_0 matvecs. Launch geometry (ds4lab/ops.py:q8_geometry): block = (tpr, 256 / tpr), a
// thread group of tpr threads (32..256, a multiple of 32) per row pair, 256 / tpr pairs per
// block; grid = ceil(pairs / (256 / tpr)). Small matrices get wide groups (the reduction
// dimension split over up to 8 warps, added in-block in a fixed order), large ones one warp per
// pair, so every shape launches enough blocks to fill the GPU. Weights are read in 16-byte
// loads (q8_rows_dot); no atomics, so results are bit-identical run to run.

// y[r] = W[r] . x[g*group_stride : +cols], g = r / rows_per_group; rows and rows_per_group even.
extern "C" __global__ void q8_matvec(const i8* __restrict__ qs, const __half* __restrict__ d,
                                     const float* __restrict__ x, float* __restrict__ y,
                                     int rows, int cols, int rows_per_group, int group_stride) {
    const int row = (blockIdx.x * blockDim.y + threadIdx.y) * 2;
    const bool on = row < rows;
    float a[2] = {0.0f, 0.0f};
    if (on) {
        const size_t rr[2] = {(size_t)row, (size_t)row + 1};
        q8_rows_dot<2>(qs, d, rr, x + (size_t)(row / rows_per_group) * group_stride, cols, threadIdx.x,
                       blockDim.x, a);
    }
    group_sum<2>(a);
    if (on && threadIdx.x == 0) { y[row] = a[0]; y[row + 1] = a[1]; }
}

__device__ __forceinline__ float swiglu_clamped(float g, float u, float limit) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g / (1.0f + expf(-g)) * u;
}

// Shared expert gate/up with clamped SwiGLU: W is [2F, cols], rows 0..F-1 gate, F..2F-1 up.
// Thread group j computes gate row r and up row r + F together (one pair).
extern "C" __global__ void q8_matvec_swiglu(const i8* __restrict__ qs, const __half* __restrict__ d,
                                            const float* __restrict__ x, float* __restrict__ mid,
                                            int F, int cols, float limit) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool on = row < F;
    float a[2] = {0.0f, 0.0f};
    if (on) {
        const size_t rr[2] = {(size_t)row, (size_t)row + F};
        q8_rows_dot<2>(qs, d, rr, x, cols, threadIdx.x, blockDim.x, a);
    }
    group_sum<2>(a);
    if (on && threadIdx.x == 0) mid[row] = swiglu_clamped(a[0], a[1], limit);
}

// Down/output projection with hyper-connection expand and residual add:
// h[s][r] += post_s * (W[r] . x + extra[r]), post_s = 2*sigmoid(mix_logits[S + s]). Rows even.
extern "C" __global__ void q8_matvec_expand(const i8* __restrict__ qs, const __half* __restrict__ d,
                                            const float* __restrict__ x, float* __restrict__ h,
                                            const float* __restrict__ mix_logits, const float* __restrict__ extra,
                                            int rows, int cols, int S) {
    const int row = (blockIdx.x * blockDim.y + threadIdx.y) * 2;
    const bool on = row < rows;
    float a[2] = {0.0f, 0.0f};
    if (on) {
        const size_t rr[2] = {(size_t)row, (size_t)row + 1};
        q8_rows_dot<2>(qs, d, rr, x, cols, threadIdx.x, blockDim.x, a);
    }
    group_sum<2>(a);
    if (on && threadIdx.x == 0) {
        float y0 = a[0], y1 = a[1];
        if (extra) { y0 += extra[row]; y1 += extra[row + 1]; }
        for (int s = 0; s < S; ++s) {
            const float post = 2.0f / (1.0f + expf(-mix_logits[S + s]));
            h[(size_t)s * rows + row] += post * y0;
            h[(size_t)s * rows + row + 1] += post * y1;
        }
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
extern "C" __global__ void hc_premix(const float* __restrict__ h, const float* part,
                                     float* logits, const float* __restrict__ w,
                                     float* __restrict__ x, int S, int E, int nsplit, float eps) {
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
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < E; i += gridDim.x * blockDim.x) {
        u32 idx = (u32)t.token_id * (u32)E + (u32)i;
        float v = __fsub_rn(__fmul_rn(ds4_unit(ds4_element_hash(key, 0, idx)), 2.0f), 1.0f);
        for (int s = 0; s < S; ++s) h[(size_t)s * E + i] = v;
    }
}
