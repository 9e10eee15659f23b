"""The kernels' format decoding (``kernels/ds4_formats.cuh``) compiled for the CPU and checked against
the NumPy reference, sub-block by sub-block, on fresh random blocks and activations — no GPU needed.

The header is the code the GPU runs (``moe_ds4.cu`` includes it); here a C++ compiler builds it with
plain stand-ins for the CUDA intrinsics it uses (``__dp4a``: four signed byte products added to an
int; ``__popc``; ``__half2float``), so a slip in a bit field, a shift or the sign trick of IQ2_XXS
fails on every machine with ``g++`` (skipped without one). The GPU tests check the same on the H200.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ds4lab.token import reference as R
from ds4lab.token import weights as W

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
CXX = shutil.which("g++") or shutil.which("c++")

HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
typedef uint32_t u32; typedef uint8_t u8; typedef int8_t i8; typedef uint16_t u16;
struct int4 { int x, y, z, w; };
struct uint2 { u32 x, y; };
struct short2 { short x, y; };
struct __half { uint16_t bits; };
static inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
static inline int __popc(u32 v) { return __builtin_popcount(v); }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
#include "ds4_formats.cuh"

static void* slurp(const char* path, size_t n) {
    void* p = std::aligned_alloc(16, (n + 15) / 16 * 16);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(p, 1, n, f) != n) { std::fprintf(stderr, "cannot read %s\n", path); std::exit(2); }
    std::fclose(f);
    return p;
}

// argv: format, blocks, dir. Inputs in dir: w.bin (blocks x bytes), q.bin (blocks x 256 int8),
// d.bin (blocks float), bs.bin (blocks x 16 int16), grid.bin (256 uint64). Output: out.bin (blocks x 8 float).
int main(int argc, char** argv) {
    const char* fmt = argv[1];
    const int n = std::atoi(argv[2]);
    char path[4096];
    const int bytes = !std::strcmp(fmt, "q4_k") ? FmtQ4K::BYTES : !std::strcmp(fmt, "q2_k") ? FmtQ2K::BYTES
                                                                                             : FmtIQ2XXS::BYTES;
    std::snprintf(path, sizeof path, "%s/w.bin", argv[3]);
    const u8* w = (const u8*)slurp(path, (size_t)n * bytes);
    std::snprintf(path, sizeof path, "%s/q.bin", argv[3]);
    const int* q = (const int*)slurp(path, (size_t)n * 256);
    std::snprintf(path, sizeof path, "%s/d.bin", argv[3]);
    const float* d = (const float*)slurp(path, (size_t)n * 4);
    std::snprintf(path, sizeof path, "%s/bs.bin", argv[3]);
    const short* bs = (const short*)slurp(path, (size_t)n * 32);
    std::snprintf(path, sizeof path, "%s/grid.bin", argv[3]);
    const uint2* lut = (const uint2*)slurp(path, 256 * 8);
    float* out = (float*)std::malloc((size_t)n * 8 * 4);
    for (int b = 0; b < n; ++b)
        for (int j = 0; j < 8; ++j) {
            int a[8];
            for (int i = 0; i < 8; ++i) a[i] = q[b * 64 + j * 8 + i];
            const short2 s2 = {bs[b * 16 + 2 * j], bs[b * 16 + 2 * j + 1]};
            const u8* blk = w + (size_t)b * bytes;
            float v;
            if (!std::strcmp(fmt, "q4_k")) v = FmtQ4K::sub(blk, j, a, d[b], s2, lut);
            else if (!std::strcmp(fmt, "q2_k")) v = FmtQ2K::sub(blk, j, a, d[b], s2, lut);
            else v = FmtIQ2XXS::sub(blk, j, a, d[b], s2, lut);
            out[b * 8 + j] = v;
        }
    std::snprintf(path, sizeof path, "%s/out.bin", argv[3]);
    FILE* f = std::fopen(path, "wb");
    std::fwrite(out, 4, (size_t)n * 8, f);
    std::fclose(f);
    return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler (g++) to build the kernels' format code for the CPU")
    d = tmp_path_factory.mktemp("ds4fmt")
    (d / "h.cpp").write_text(HARNESS)
    r = subprocess.run([CXX, "-std=c++17", "-O1", "-w", f"-I{KERNELS}", str(d / "h.cpp"), "-o", str(d / "h")],
                       capture_output=True, text=True)
    if r.returncode:
        if "_Float16" in r.stderr:
            pytest.skip(f"{CXX} has no _Float16 (needed for the fp16 stand-in)")
        pytest.fail(f"the format header does not compile for the CPU:\n{r.stderr}")
    return d / "h"


@pytest.mark.parametrize("fmt", list(W.SUPERBLOCKS))
def test_kernel_format_code_matches_reference(harness, fmt, rng, tmp_path):
    n = 96
    t = W.gen_superblocks(fmt, int(rng.integers(2**32)), int(rng.integers(1000)), 1, 256 * n)
    blocks = t.qs.reshape(n, -1)
    x = (rng.standard_normal((n, 256)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
    q, d, bs = R.quantize_q8k_ds4(x.reshape(1, -1))
    for name, arr in (("w", blocks), ("q", q), ("d", d), ("bs", bs), ("grid", W.IQ2XXS_GRID)):
        np.ascontiguousarray(arr).tofile(tmp_path / f"{name}.bin")
    r = subprocess.run([str(harness), fmt, str(n), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(n, 8)
    w = R.dequant_superblocks(fmt, blocks).reshape(n, 8, 32)
    xa = R.dequant_q8k(q, d).reshape(n, 8, 32)
    want = (w * xa).sum(-1)
    scale = np.abs(w * xa).sum(-1) + 1e-30
    err = np.abs(got - want) / scale
    assert err.max() < 2e-6, (np.unravel_index(err.argmax(), err.shape), got.flat[err.argmax()], want.flat[err.argmax()])
