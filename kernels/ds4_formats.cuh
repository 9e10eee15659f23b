// The routed-expert formats of ds4 (ggml's super-blocks of 256 weights, as ds4.c reads them) as the
// kernels of moe_ds4.cu decode them: one sub-block of 32 weights against 32 Q8_K activations.
//
// Fmt::sub(block, j, a, dx, bs, lut): sub-block j (32 weights) of the super-block at `block` dotted with
// the Q8_K activation words a[8] (its 32 int8, four to a word), times the activation's scale dx; bs holds
// the activation's two int16 sums of 16 (the Q2_K/Q4_K min terms); lut: the IQ2_XXS grid (IQ2_XXS only).
// Block alignment the callers guarantee: Q4_K 16 bytes, Q2_K 4, IQ2_XXS 2.
//
// Device code without CUDA headers of its own: moe_ds4.cu includes it after common.cuh; the host test
// (tests/test_moe_ds4_host.py) compiles it with stand-ins for the intrinsics and checks every sub-block
// against the NumPy reference.
#pragma once

__device__ __forceinline__ float half_at(const u8* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// ----------------------------------------------------------------------------- formats
// Fmt::sub(block, j, a, dx, bs, lut): sub-block j (32 weights) of a super-block in shared memory dotted
// with the Q8_K activation words a[8] (its 32 int8), times the activation's scale dx; bs holds the
// activation's two int16 sums of 16 (the Q2_K/Q4_K min terms).

// IQ2_XXS (ggml block_iq2_xxs): fp16 d, then per sub-block aux0 (4 grid indices) and aux1 (4 sign
// indices of 7 bits, scale s in the top 4). Group l: d * (2s + 1) / 8 * grid[idx] * signs. The sign
// byte is the 7 bits and their parity (ggml ksigns_iq2xs); bit j negates weight j. A negated weight
// enters the dot as ~g = -g - 1 plus the activation once more: dp4a(g ^ m, a) + dp4a(b, a).
struct FmtIQ2XXS {
    static constexpr int BYTES = 66;
    static constexpr bool LUT = true;
    __device__ __forceinline__ static float sub(const u8* blk, int j, const int (&a)[8], float dx, short2,
                                                const uint2* lut) {
        const u16* q = reinterpret_cast<const u16*>(blk + 2 + 8 * j);
        const u32 aux0 = (u32)q[0] | ((u32)q[1] << 16), aux1 = (u32)q[2] | ((u32)q[3] << 16);
        int s = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint2 g = lut[(aux0 >> (8 * l)) & 255u];
            const u32 si = (aux1 >> (7 * l)) & 127u;
            const u32 sb = si | ((__popc(si) & 1u) << 7);
            const u32 b0 = ((sb & 15u) * 0x00204081u) & 0x01010101u;  // bit i -> byte i (0 or 1)
            const u32 b1 = ((sb >> 4) * 0x00204081u) & 0x01010101u;
            s = __dp4a((int)(g.x ^ (b0 * 255u)), a[2 * l], s);
            s = __dp4a((int)b0, a[2 * l], s);
            s = __dp4a((int)(g.y ^ (b1 * 255u)), a[2 * l + 1], s);
            s = __dp4a((int)b1, a[2 * l + 1], s);
        }
        const int ls = 2 * (int)(aux1 >> 28) + 1;
        return (0.125f * half_at(blk) * dx) * (float)(s * ls);
    }
};

// Q4_K (ggml block_q4_K): fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins (get_scale_min_k4), 128
// bytes of quants: bytes 32g..32g+31 hold sub-block 2g (low nibbles) and 2g+1 (high nibbles).
struct FmtQ4K {
    static constexpr int BYTES = 144;
    static constexpr bool LUT = false;
    __device__ __forceinline__ static float sub(const u8* blk, int j, const int (&a)[8], float dx, short2 bs,
                                                const uint2*) {
        const u8* sc = blk + 4;
        int scj, mj;
        if (j < 4) {
            scj = sc[j] & 63;
            mj = sc[j + 4] & 63;
        } else {
            scj = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
            mj = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        const int4* qv = reinterpret_cast<const int4*>(blk + 16 + 32 * (j >> 1));
        const int4 q0 = qv[0], q1 = qv[1];
        const int w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const int sh = 4 * (j & 1);
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) s = __dp4a((w[i] >> sh) & 0x0f0f0f0f, a[i], s);
        const int bsum = (int)bs.x + (int)bs.y;
        return dx * (half_at(blk) * (float)(scj * s) - half_at(blk + 2) * (float)(mj * bsum));
    }
};

// Q2_K (ggml block_q2_K): 16 scale bytes (scale low nibble, min high nibble, one per 16 weights), 64
// bytes of 2-bit quants, fp16 d, fp16 dmin. Sub-block j = 4h + t: weights 128h + 32t + l take bits 2t
// of quant byte 32h + l and scale byte 8h + 2t + (l >= 16).
struct FmtQ2K {
    static constexpr int BYTES = 84;
    static constexpr bool LUT = false;
    __device__ __forceinline__ static float sub(const u8* blk, int j, const int (&a)[8], float dx, short2 bs,
                                                const uint2*) {
        const int h = j >> 2, t = j & 3;
        const u32* qw = reinterpret_cast<const u32*>(blk + 16 + 32 * h);
        const int sh = 2 * t;
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) s0 = __dp4a((int)((qw[i] >> sh) & 0x03030303u), a[i], s0);
#pragma unroll
        for (int i = 4; i < 8; ++i) s1 = __dp4a((int)((qw[i] >> sh) & 0x03030303u), a[i], s1);
        const int c0 = blk[8 * h + 2 * t], c1 = blk[8 * h + 2 * t + 1];
        const int isum = (c0 & 15) * s0 + (c1 & 15) * s1;
        const int msum = (c0 >> 4) * (int)bs.x + (c1 >> 4) * (int)bs.y;
        return dx * (half_at(blk + 80) * (float)isum - half_at(blk + 82) * (float)msum);
    }
};

