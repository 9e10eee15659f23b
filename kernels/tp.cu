// Tensor parallelism (ds4lab/tp/ops.py): what two ranks of one token add to the single-GPU launches.
#include "common.cuh"

// Hyper-connection expand and residual add after the reduction: h[s][r] += post_s * (y[r] + extra[r]),
// post_s = 2*sigmoid(mix_logits[S + s]); the epilogue of q8_matvec_expand (dense.cu) written the same way,
// so the same y gives the same bits. One thread per (stream, row); grid (ceil(rows / 256), S).
extern "C" __global__ void tp_expand(float* __restrict__ h, const float* __restrict__ mix_logits,
                                     const float* __restrict__ y, const float* __restrict__ extra, int rows, int S) {
    DS4_PDL_ENTRY();
    const int r = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (r >= rows || s >= S) return;
    const float hv = h[(size_t)s * rows + r];
    const float ex = extra ? extra[r] : 0.0f;
    const float post = 2.0f / (1.0f + expf(-mix_logits[S + s]));
    h[(size_t)s * rows + r] = hv + post * (y[r] + ex);
}

// The router's expert ids made local to a rank that holds experts lo .. lo + n_local - 1: id - lo there,
// -1 elsewhere (the routed-MoE kernels leave an id outside their bank out: a zero middle, no down term).
extern "C" __global__ void tp_localize_ids(const int* __restrict__ ids, int* __restrict__ out, int lo, int n_local,
                                           int P) {
    DS4_PDL_ENTRY();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    const int e = ids[p] - lo;
    out[p] = (e >= 0 && e < n_local) ? e : -1;
}

// ds4's peer path: the sum of the two ranks' partial sums, rank 0's first, on every rank (out = a + b).
extern "C" __global__ void tp_add2(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                                   int n) {
    DS4_PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
