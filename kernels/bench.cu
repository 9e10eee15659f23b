// A tiny kernel for launch-cost measurements: the work is negligible, the launch is not.
#include "common.cuh"

extern "C" __global__ void tiny_add(float* __restrict__ x, int n) {
    DS4_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

// The least work a kernel can be: t_min of the launch-list floor is the replay time per kernel
// of a graph of these (ds4lab/measure/floors.py).
extern "C" __global__ void empty_kernel() {}

// Keep the GPU busy for about `ns` nanoseconds, so launches queued behind it run back to back
// (per-op timing without the host's launch gaps).
extern "C" __global__ void spin_wait(long long ns) {
    long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    long long now = start;
    while (now - start < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

// Probe kernels for the conformance scenarios: a scalar passed by value (frozen into a graph at
// capture) and the same scalar read from device memory (read at replay).
extern "C" __global__ void fill_value(float* __restrict__ x, int n, float v) {
    DS4_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

extern "C" __global__ void fill_from(float* __restrict__ x, int n, const float* __restrict__ v) {
    DS4_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v[0];
}
