// Sliding-window decode attention with one KV head (keys = values = the cached row), split over
// keys (flash-decoding), the splits combined inside the same kernel.
#include "common.cuh"

#define ATTN_MAX_DIM 1024
#ifndef ATTN_HPB
#define ATTN_HPB 4      // heads per block (at most 8, one softmax warp each): a staged key row serves them all
#endif
#ifndef ATTN_NS
#define ATTN_NS 8       // key splits per head group: the blocks of one thread-block cluster (at most 8)
#endif
#define ATTN_THREADS 256
#define ATTN_COLS (ATTN_MAX_DIM / 2 / ATTN_THREADS)  // float2 columns per thread, at most
#define ATTN_MAX_KPS ((1024 + ATTN_NS - 1) / ATTN_NS)  // keys per split at most (the largest window: 1024)

// On sm_90 the ATTN_NS blocks of a head group form a cluster and combine their partials through
// distributed shared memory (common.cuh); before sm_90 through global scratch and a ticket (the
// last block of the group combines).
#define ATTN_CLUSTER_DIMS DS4_CLUSTER_DIMS(1, ATTN_NS, 1)

extern __shared__ float4 attn_smem[];

// q [H, D], cache [W, D] ring buffer (row p % W holds position p), o [H, D]. Attends to the
// n_valid newest rows ending at kv_row, oldest first (key j is row kv_row - (n_valid - 1 - j)).
//
// grid = (ceil(H / ATTN_HPB), ATTN_NS), block = ATTN_THREADS, dynamic shared memory (floats):
// q [HPB, D] | keys [max(kc, HPB), D] | scores [HPB, kc] | state [4 * HPB]
// (ds4lab/token/ops.py:attention_launch). Block (g, s) takes heads g*HPB.. and the keys
// j in [s * kps, (s + 1) * kps) below n_valid, kps = ceil(W / ATTN_NS), kc keys at a time:
//   stage: the key rows of the chunk (and, first, q) into shared memory, one barrier;
//   scores: warp w dots keys w, w + 8, .. with every head, scaled by 1/sqrt(D);
//   softmax: warp h keeps head h's running max m and sum z over the split's keys (online: a
//            new chunk's larger max rescales what came before);
//   values: the thread's float2 columns of every head, acc = acc * rescale + sum_j p_j v_j[c].
// Then the NS partials (m_s, z_s, acc_s) of a head group are combined in split order:
//   o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) z_s, M = max over non-empty splits.
// sm_90: block s combines the columns [s, s + 1) * D / (2 NS) of its heads from the cluster's
// shared memory. Before sm_90: partials to part_o [H, NS, D] / part_ml [H, NS, 2], then the last
// block of the group (integer ticket counter[g], reset by that block; zero before the first
// launch) combines every column. Every value is computed by a fixed thread in a fixed order:
// bit-identical run to run.
extern "C" ATTN_CLUSTER_DIMS __global__ void attention_decode(
        const float* __restrict__ q, const float* __restrict__ cache, float* __restrict__ o,
        int D, int W, int H, int kc, float* part_o, float* part_ml, int* counter,
        const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    const int g = blockIdx.x, s = blockIdx.y;
    const int h0 = g * ATTN_HPB, nh = min(ATTN_HPB, H - h0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = ATTN_THREADS / 32;
    const int n = t.n_valid, kps = (W + ATTN_NS - 1) / ATTN_NS;
    const int j0 = s * kps, j1 = min(j0 + kps, n);  // this split's keys: [j0, j1)
    const int D2 = D >> 1, D4 = D >> 2;
    const float inv = rsqrtf((float)D);
    float* qs = reinterpret_cast<float*>(attn_smem);          // [HPB, D]
    float* ks = qs + ATTN_HPB * D;                             // [max(kc, HPB), D]
    float* sc = ks + max(kc, ATTN_HPB) * D;                    // [HPB, kc]
    float* st = sc + ATTN_HPB * kc;                            // m [HPB], z [HPB], rescale [HPB]
    __shared__ int krow[ATTN_MAX_KPS];                         // cache row of each key of the chunk

    // q of the block's heads (zeros past H), and the running state
    for (int i = tid; i < ATTN_HPB * D4; i += ATTN_THREADS) {
        const int hh = i / D4;
        reinterpret_cast<float4*>(qs)[i] = hh < nh ? __ldg(reinterpret_cast<const float4*>(q + (size_t)h0 * D) + i)
                                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (tid < ATTN_HPB) { st[tid] = -3.402823466e38f; st[ATTN_HPB + tid] = 0.0f; }
    float2 acc[ATTN_COLS][ATTN_HPB];  // float2 columns tid + k * THREADS of every head
#pragma unroll
    for (int k = 0; k < ATTN_COLS; ++k)
#pragma unroll
        for (int hh = 0; hh < ATTN_HPB; ++hh) acc[k][hh] = make_float2(0.0f, 0.0f);

    for (int c0 = j0; c0 < j1; c0 += kc) {
        const int nk = min(kc, j1 - c0);
        for (int j = tid; j < nk; j += ATTN_THREADS) {
            int row = (t.kv_row - (n - 1 - (c0 + j))) % W;
            krow[j] = row < 0 ? row + W : row;
        }
        __syncthreads();  // krow (and, the first time, q) ready; the previous chunk's values done
        for (int i = tid; i < nk * D4; i += ATTN_THREADS) {
            const int j = i / D4, c = i - j * D4;
            reinterpret_cast<float4*>(ks)[i] = __ldg(reinterpret_cast<const float4*>(cache + (size_t)krow[j] * D) + c);
        }
        __syncthreads();
        // scores: warp w takes keys w, w + nwarps, ...; lane l the float4 columns l, l + 32, ...
        for (int j = warp; j < nk; j += nwarps) {
            float4 kv[ATTN_MAX_DIM / 128];
#pragma unroll
            for (int c = 0; c < ATTN_MAX_DIM / 128; ++c)
                if (c * 32 + lane < D4) kv[c] = reinterpret_cast<const float4*>(ks + (size_t)j * D)[c * 32 + lane];
#pragma unroll
            for (int hh = 0; hh < ATTN_HPB; ++hh) {
                float a = 0.0f;
#pragma unroll
                for (int c = 0; c < ATTN_MAX_DIM / 128; ++c) {
                    if (c * 32 + lane < D4) {
                        const float4 qq = reinterpret_cast<const float4*>(qs + (size_t)hh * D)[c * 32 + lane];
                        a += qq.x * kv[c].x + qq.y * kv[c].y + qq.z * kv[c].z + qq.w * kv[c].w;
                    }
                }
                a = warp_sum(a);
                if (lane == 0) sc[hh * kc + j] = a * inv;
            }
        }
        __syncthreads();
        // online softmax: warp hh owns head hh (keys in lane order, then the lanes in a fixed tree)
        if (warp < ATTN_HPB) {
            const int hh = warp;
            float m = -3.402823466e38f;
            for (int j = lane; j < nk; j += 32) m = fmaxf(m, sc[hh * kc + j]);
            m = warp_max(m);
            const float m_old = st[hh], m_new = fmaxf(m_old, m);
            float z = 0.0f;
            for (int j = lane; j < nk; j += 32) {
                const float e = expf(sc[hh * kc + j] - m_new);
                sc[hh * kc + j] = e;
                z += e;
            }
            z = warp_sum(z);
            if (lane == 0) {
                const float r = expf(m_old - m_new);  // 0 on the first non-empty chunk (m_old = -FLT_MAX)
                st[hh] = m_new;
                st[ATTN_HPB + hh] = st[ATTN_HPB + hh] * r + z;
                st[2 * ATTN_HPB + hh] = r;
            }
        }
        __syncthreads();
        // values: acc = acc * rescale + sum_j p_j v_j, per float2 column of this thread, every head
        float r[ATTN_HPB];
#pragma unroll
        for (int hh = 0; hh < ATTN_HPB; ++hh) r[hh] = st[2 * ATTN_HPB + hh];
#pragma unroll
        for (int k = 0; k < ATTN_COLS; ++k) {
            const int c = tid + k * ATTN_THREADS;
            if (c < D2) {
                float2 a[ATTN_HPB];
#pragma unroll
                for (int hh = 0; hh < ATTN_HPB; ++hh) a[hh] = make_float2(acc[k][hh].x * r[hh], acc[k][hh].y * r[hh]);
                for (int j = 0; j < nk; ++j) {
                    const float2 v = reinterpret_cast<const float2*>(ks + (size_t)j * D)[c];
#pragma unroll
                    for (int hh = 0; hh < ATTN_HPB; ++hh) {
                        const float p = sc[hh * kc + j];
                        a[hh].x += p * v.x;
                        a[hh].y += p * v.y;
                    }
                }
#pragma unroll
                for (int hh = 0; hh < ATTN_HPB; ++hh) acc[k][hh] = a[hh];
            }
        }
    }
    __syncthreads();  // every chunk's values done: the key rows are free

#if DS4_CLUSTERS
    // this split's partial in shared memory (over the key rows), then the cluster's combine
    float2* po = reinterpret_cast<float2*>(ks);  // [HPB, D/2]
#pragma unroll
    for (int k = 0; k < ATTN_COLS; ++k) {
        const int c = tid + k * ATTN_THREADS;
        if (c < D2) {
#pragma unroll
            for (int hh = 0; hh < ATTN_HPB; ++hh) po[hh * D2 + c] = acc[k][hh];
        }
    }
    cluster_sync_all();
    const int per = D2 / ATTN_NS;  // float2 columns each block finishes, per head
    for (int i = tid; i < ATTN_HPB * per; i += ATTN_THREADS) {
        const int hh = i / per, c = s * per + (i - hh * per);
        float mk[ATTN_NS], zk[ATTN_NS];
        float2 vk[ATTN_NS];
#pragma unroll
        for (int k = 0; k < ATTN_NS; ++k) {
            mk[k] = dsmem_f32(st + hh, k);
            zk[k] = dsmem_f32(st + ATTN_HPB + hh, k);
            vk[k] = dsmem_f32x2(po + hh * D2 + c, k);
        }
        float M = -3.402823466e38f;
#pragma unroll
        for (int k = 0; k < ATTN_NS; ++k)
            if (zk[k] > 0.0f) M = fmaxf(M, mk[k]);
        float Z = 0.0f;
        float2 a = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < ATTN_NS; ++k) {
            const float wk = zk[k] > 0.0f ? expf(mk[k] - M) : 0.0f;
            Z += wk * zk[k];
            a.x += wk * vk[k].x;
            a.y += wk * vk[k].y;
        }
        const float rz = 1.0f / Z;
        if (hh < nh) reinterpret_cast<float2*>(o + (size_t)(h0 + hh) * D)[c] = make_float2(a.x * rz, a.y * rz);
    }
    cluster_sync_all();  // no block leaves while another still reads its shared memory
#else
    __shared__ int last;
#pragma unroll
    for (int k = 0; k < ATTN_COLS; ++k) {
        const int c = tid + k * ATTN_THREADS;
        if (c < D2) {
#pragma unroll
            for (int hh = 0; hh < ATTN_HPB; ++hh)
                if (hh < nh) reinterpret_cast<float2*>(part_o + ((size_t)(h0 + hh) * ATTN_NS + s) * D)[c] = acc[k][hh];
        }
    }
    if (tid < nh) {
        part_ml[((size_t)(h0 + tid) * ATTN_NS + s) * 2] = st[tid];
        part_ml[((size_t)(h0 + tid) * ATTN_NS + s) * 2 + 1] = st[ATTN_HPB + tid];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counter[g], 1) == ATTN_NS - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = tid; i < nh * D2; i += ATTN_THREADS) {
        const int hh = i / D2, c = i - hh * D2;
        const float* ml = part_ml + (size_t)(h0 + hh) * ATTN_NS * 2;
        float M = -3.402823466e38f;
        for (int k = 0; k < ATTN_NS; ++k)
            if (__ldcg(ml + 2 * k + 1) > 0.0f) M = fmaxf(M, __ldcg(ml + 2 * k));
        float Z = 0.0f;
        float2 a = make_float2(0.0f, 0.0f);
        for (int k = 0; k < ATTN_NS; ++k) {
            const float zk = __ldcg(ml + 2 * k + 1);
            const float wk = zk > 0.0f ? expf(__ldcg(ml + 2 * k) - M) : 0.0f;
            const float2 v = __ldcg(reinterpret_cast<const float2*>(part_o + ((size_t)(h0 + hh) * ATTN_NS + k) * D) + c);
            Z += wk * zk;
            a.x += wk * v.x;
            a.y += wk * v.y;
        }
        const float rz = 1.0f / Z;
        reinterpret_cast<float2*>(o + (size_t)(h0 + hh) * D)[c] = make_float2(a.x * rz, a.y * rz);
    }
    if (tid == 0) counter[g] = 0;
#endif
}
