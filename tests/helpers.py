"""Helpers several test files share (imported as ``helpers``: pytest puts this folder on the path)."""

from __future__ import annotations

import zlib

import numpy as np

from ds4lab.capture import stream as S

#: Relative L2 error a float32 kernel must stay within against its float64 NumPy reference.
F32_RTOL = 2e-5


def token_rtol(cfg) -> float:
    """Relative L2 error a whole token's hidden state (and logits) may show against the NumPy executor.
    ds4lab's five-launch MoE: 1e-4. ds4's path quantizes the MoE input and the SwiGLU output to Q8_K
    (one scale per 256 values): where the GPU's and NumPy's float sums differ in the last bit, a value
    can round to the neighbouring integer and move by 1/127 of its block's largest value, a few 1e-4 of
    the hidden state per flip (the stages themselves are bit-exact on equal inputs: test_moe_ds4_gpu)."""
    return 2e-3 if cfg.moe_path == "ds4" else 1e-4


def rel(a, b) -> float:
    """Relative L2 error of ``a`` against the reference ``b`` (float64); fails on a non-finite ``a``
    (an unwritten or overflowed output)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "non-finite output (unwritten or overflow)"
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def decode_hidden(model, stream, positions) -> list:
    """Decode ``positions`` (token id ``pos % vocab``) on ``stream``; the hidden state after each (host copies)."""
    out = []
    with S.stream_override(stream):
        for p in positions:
            model.token(p, p % model.cfg.vocab)
            model.be.synchronize()
            out.append(model.hidden().copy())
    return out


def derive_seed(base: int, nodeid: str) -> int:
    """A test's own seed from the session's base seed and its node id (the ``rng`` fixture's rule)."""
    return (base + zlib.crc32(nodeid.encode())) % 2**32


#: The router top-k case whose seeds :data:`ROUTER_SEEDS` name (its node id derives their inputs).
ROUTER_TIES_NODEID = "tests/test_kernels_gpu.py::test_router_topk_ties_and_nan[100-32]"
#: Base seeds of the router's tie/NaN inputs at 100 experts, k = 32: the first put -0.0 beside +0.0
#: at the 20th pick (the kernel once ranked +0.0 first); 20 more, fixed.
ROUTER_SEEDS = (2956093227, 1843360094, 4003551263, 308229311, 2560930318, 1178612245, 3650118227, 727369702,
                2219485631, 3391187444, 95528177, 1511339290, 2843099771, 3977245310, 604113858, 1926471513,
                3215867044, 2469705319, 4178015726, 1342597069, 861935244)


def router_tie_nan_logits(rng, N: int) -> np.ndarray:
    """Router logits float32 ``[4, N]`` that exercise the top-k's score order: ties with a chosen
    value; the first half NaN; rounded (many ties, -0.0 beside +0.0); drawn from ±0, ±inf, NaN, ±1."""
    lg = rng.standard_normal((3, N)).astype(np.float32)
    lg[0, 5:N:7] = lg[0, 3]
    lg[1, : N // 2] = np.nan
    lg[2] = np.round(lg[2])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], np.float32)
    return np.vstack([lg, rng.choice(special, N)])
