// The order of scores in every top-k (router_topk; the indexer's top-k in longctx.cu), ds4's: a
// higher score first, equal scores to the lower index (ds4_cuda.cu router_score_better), so -0.0
// equals +0.0, and a NaN below every number, -inf included (ds4 never picks a NaN while a number
// is left), NaNs equal to each other. ds4_score_key gives a float's place in that order as an
// unsigned key; 0 is below every key (an empty slot). ds4lab/token/reference.py:score_key mirrors
// it; tests/test_router_order.py compiles this header for the host and holds the two together.
#pragma once

#ifdef __CUDACC__
#define DS4_SCORE_KEY_FN __device__ __forceinline__
#define DS4_FLOAT_BITS(v) __float_as_uint(v)
#else
#include <cstring>
#define DS4_SCORE_KEY_FN inline
static inline unsigned ds4_float_bits_host(float v) { unsigned u; std::memcpy(&u, &v, sizeof u); return u; }
#define DS4_FLOAT_BITS(v) ds4_float_bits_host(v)
#endif

#define DS4_SCORE_KEY_NAN 1u

DS4_SCORE_KEY_FN unsigned ds4_score_key(float v) {
    if (v != v) return DS4_SCORE_KEY_NAN;
    const unsigned u = v == 0.0f ? 0u : DS4_FLOAT_BITS(v);  // -0.0 and +0.0: one key
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
