// In-graph stage timing: a one-thread kernel that writes the GPU's global nanosecond timer into a
// device buffer slot. Launched at each routed-MoE stage boundary (ds4lab/moeprof.py, mode
// "in-graph"), it is an ordinary kernel node when captured, so every replay of the graph writes
// fresh timestamps; the host reads the slots after the replay, outside any capture.
//
// Clock caveat: %globaltimer counts nanoseconds, but its update granularity is implementation
// defined (PTX ISA, "Special registers: %globaltimer"): on some GPUs it advances in steps of about
// 1 µs (finer while a profiler such as CUPTI is attached), which quantizes stages of a few µs.
// globaltimer_probe measures the step on the GPU at hand: 32 ns on the lent H200 (2026-11-29).
#include "common.cuh"

extern "C" __global__ void stamp_time(unsigned long long* __restrict__ slots, int i) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        slots[i] = t;
    }
}

// Spin on %globaltimer from one thread and record the first n increments (ns) it observes:
// their minimum is the timer's update step on this GPU (the resolution of stamp_time).
extern "C" __global__ void globaltimer_probe(unsigned long long* __restrict__ steps, int n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long prev, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(prev));
    int k = 0;
    long long spins = 0;
    while (k < n && spins < (1LL << 26)) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        ++spins;
        if (now != prev) {
            steps[k++] = now - prev;
            prev = now;
        }
    }
    for (; k < n; ++k) steps[k] = 0;  // timer did not move (should not happen)
}
