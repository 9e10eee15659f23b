// A tiny kernel for launch-cost measurements: the work is negligible, the launch is not.
#include "common.cuh"

extern "C" __global__ void tiny_add(float* __restrict__ x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
