// Kernels that set the condition of conditional graph nodes (CUDA Programming Guide, "CUDA Graphs" ->
// "Conditional Graph Nodes"; CUDA Runtime API, cudaGraphConditionalHandleCreate and the device function
// cudaGraphSetConditional). A conditional node reads its handle's value when the graph reaches it; a
// kernel earlier in the same graph sets that value on the device, so the host decides nothing per
// replay. The handles are kernel arguments by value (64-bit, created with the graph being captured).
//
// Stage 3cc (ds4lab/token/longctx_branches.py) launches cond_set_longctx once per compressed layer: it
// reads the position from the token's scalars and sets the layer's emit conditions (IF nodes around
// each compressor's pool, norm, rotate-store and shift) and its top-k regime (a SWITCH node, one body
// per regime). cond_set_from and cond_count_down are the conformance scenarios' probes
// (ds4lab/conformance/device_graphs.py).
#include "common.cuh"

// The device runtime's declaration (cuda_device_runtime_api.h, which NVRTC cannot include here): a
// builtin the driver resolves when the module is loaded. cudaGraphConditionalHandle is an unsigned
// long long (driver_types.h).
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(unsigned long long handle,
                                                                                   unsigned int value);

// The value of a SWITCH handle that runs no body: any value at or above the node's size.
#define DS4_COND_NO_BODY 0xffffffffu

// handle := flag[0]. grid = 1, block = 32 (one thread sets it).
extern "C" __global__ void cond_set_from(unsigned long long handle, const int* __restrict__ flag) {
    DS4_PDL_ENTRY();
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, (unsigned int)flag[0]);
}

// A WHILE body's last kernel: counter[0] -= 1, then handle := (counter[0] > 0), so the body runs
// counter[0] times. grid = 1, block = 32.
extern "C" __global__ void cond_count_down(unsigned long long handle, int* __restrict__ counter) {
    DS4_PDL_ENTRY();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const int left = counter[0] - 1;
    counter[0] = left;
    cudaGraphSetConditional(handle, left > 0 ? 1u : 0u);
}

// The top-k regime of n_comp compressed rows as a SWITCH value (ds4lab/token/reference.py:topk_regime and
// topk_plan, ds4_cuda.cu ds4_gpu_indexer_topk_tensor): n_comp <= top_k selects nothing (every row is
// attended), then one body per regime, in order: sort2k, sort4k, sort8k, sort16k, and the chunked path by
// its number of merge launches (4 + levels, where each level merges `group` candidate sets into one:
// chunks of 8 * top_k rows, one final merge once at most `group` sets remain).
__device__ __forceinline__ unsigned int cond_topk_regime(int n_comp, int top_k, int group) {
    if (n_comp <= top_k) return DS4_COND_NO_BODY;
    if (n_comp <= 2 * top_k) return 0u;
    if (n_comp <= 4 * top_k) return 1u;
    if (n_comp <= 8 * top_k) return 2u;
    if (n_comp <= 16 * top_k) return 3u;
    const int chunk = 8 * top_k;
    int sets = (n_comp + chunk - 1) / chunk;
    unsigned int levels = 0u;
    while (sets > group) {
        sets = (sets + group - 1) / group;
        ++levels;
    }
    return 4u + levels;
}

// One compressed layer's decisions from the position (read from the token's scalars):
//   mask bit 0: h_emit0 := (pos + 1) % ratio == 0  (the attention's compressor emits a row)
//   mask bit 1: h_emit1 := the same                (the indexer's compressor, ratio 4)
//   mask bit 2: h_regime := cond_topk_regime((pos + 1) / ratio, top_k, group)
// grid = 1, block = 32: one thread sets every handle.
extern "C" __global__ void cond_set_longctx(unsigned long long h_emit0, unsigned long long h_emit1,
                                            unsigned long long h_regime, int mask, int ratio, int top_k, int group,
                                            const int* scal, int pos, int kv_row, int n_valid, int token_id) {
    DS4_PDL_ENTRY();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const TokScalars t = tok_scalars(scal, pos, kv_row, n_valid, token_id);
    const unsigned int emit = (t.pos + 1) % ratio == 0 ? 1u : 0u;
    if (mask & 1) cudaGraphSetConditional(h_emit0, emit);
    if (mask & 2) cudaGraphSetConditional(h_emit1, emit);
    if (mask & 4) cudaGraphSetConditional(h_regime, cond_topk_regime((t.pos + 1) / ratio, top_k, group));
}
