"""Helpers several test files share (imported as ``helpers``: pytest puts this folder on the path)."""

from __future__ import annotations

import numpy as np

from ds4lab.capture import stream as S

#: Relative L2 error a float32 kernel must stay within against its float64 NumPy reference.
F32_RTOL = 2e-5


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
