"""Helpers several test files share (imported as ``helpers``: pytest puts this folder on the path)."""

from __future__ import annotations

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
