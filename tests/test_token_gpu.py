"""Whole decode tokens on the GPU: against the NumPy executor, and stage 0's bit-identity."""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.token.config import get_preset, is_ds4_flash
from ds4lab.token.model import DecodeModel, TokenOptions
from helpers import token_rtol

pytestmark = pytest.mark.gpu


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def run_tokens(cfg, be, opts, n_layers=None, tokens=((1000, 11), (1001, 421)), **kw):
    m = DecodeModel(cfg, be, opts, n_layers=n_layers, **kw)
    for pos, tok in tokens:
        m.token(pos, tok)
    be.synchronize()
    return m


@pytest.mark.parametrize("preset,n_layers", [("tiny", None), ("small", None), ("small-q4blk", None),
                                             pytest.param("ds4-flash", 4, marks=pytest.mark.slow),
                                             pytest.param("ds4-flash-q4k", 2, marks=pytest.mark.slow),
                                             pytest.param("ds4-flash-q4blk", 2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("scalars", ["value", "device"])
def test_token_matches_reference(cupy_backend, numpy_backend, preset, n_layers, scalars):
    """Every preset variant (ds4's expert formats and ds4lab's 4-bit blocks) against the numpy executor."""
    cfg = get_preset(preset)
    opts = TokenOptions(scalars=scalars, vocab=not is_ds4_flash(preset))
    g = run_tokens(cfg, cupy_backend, opts, n_layers)
    r = run_tokens(cfg, numpy_backend, opts, n_layers)
    assert np.array_equal(g.selected_experts()[:1], r.selected_experts()[:1])
    assert rel(g.hidden(), r.hidden()) < token_rtol(cfg)
    if opts.vocab:
        assert rel(g.output_logits(), r.output_logits()) < token_rtol(cfg)


def test_stage0_bit_identical(cupy_backend):
    """Flag off, flag on with no override, and the unrouted path give the same bits."""
    cfg = get_preset("small")
    opts = TokenOptions(vocab=True)
    was = S.graphs_flag()
    try:
        S.set_graphs_enabled(False)
        off = run_tokens(cfg, cupy_backend, opts)
        S.set_graphs_enabled(True)
        on = run_tokens(cfg, cupy_backend, opts)
        unrouted = run_tokens(cfg, cupy_backend, opts, routed=False)
        # An override on a non-blocking stream runs the same kernels on another stream.
        st = cupy_backend.new_stream(non_blocking=True)
        with S.stream_override(st):
            override = run_tokens(cfg, cupy_backend, opts)
            st.synchronize()
    finally:
        S.set_graphs_enabled(was)
    for m in (on, unrouted, override):
        assert np.array_equal(m.hidden(), off.hidden())
        assert np.array_equal(m.output_logits(), off.output_logits())
