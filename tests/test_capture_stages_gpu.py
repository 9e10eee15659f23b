"""Stages 3cc, 3p, 3cp and 3ccp on the GPU (``-m gpu``; skipped without one): bit for bit stage 0 on the
same GPU across emits and every top-k regime (tiny and small presets, long context), one graph where the
stage promises it, conditional nodes and programmatic edges in the captured graph as the sim models them.
The timing of these stages is the context ladder's (``bash scripts/gpu_round.sh capture-stages``)."""

from __future__ import annotations

from collections import Counter

import pytest

from ds4lab.capture import stream as S
from ds4lab.experiments.stage_run import Span, StageRun, first_difference
from ds4lab.experiments.stages import STAGES
from ds4lab.token.config import get_preset
from ds4lab.token.model import DecodeModel, TokenOptions

pytestmark = pytest.mark.gpu

#: Spans (start, tokens) whose tokens cross emits of both ratios and the top-k regime boundaries of the
#: tiny preset (top-k 8: n_comp 16 / 32 / 64 / 128 at positions 63 / 127 / 255 / 511) and the chunked path.
SPANS = [(60, 8), (124, 8), (252, 8), (508, 8), (1020, 6), (4088, 6)]


@pytest.fixture(scope="module")
def tiny_long(cupy_backend):
    cfg = get_preset("tiny", long_context=True)
    return DecodeModel(cfg, cupy_backend, TokenOptions(vocab=True))


@pytest.mark.parametrize("name", ["3cc", "3p", "3cp", "3ccp"])
def test_device_stage_bit_exact_against_stage_0(tiny_long, name):
    with S.graphs_enabled():
        base = TokenOptions(vocab=True)
        ref = StageRun(tiny_long, STAGES["0"], base)
        run = StageRun(tiny_long, STAGES[name], base,
                       policy=STAGES[name].policy.with_(key_decisions=True) if name == "3p" else None)
        for start, n in SPANS:
            span = Span(start, n)
            diff = first_difference(ref.record(span), run.record(span))
            assert diff is None, (name, start, diff)
        st = run.stats()
        assert not st["failures"] and not st["aborts"], st
        if name != "3p":
            assert st["captures"] == 1 and st["recaptures"] == 0, st


def test_3cc_graph_nodes_and_3ccp_edges_on_the_gpu(tiny_long, cupy_backend):
    """The captured graphs hold what the sim's do: conditional nodes in 3cc's, programmatic edges in 3ccp's."""
    be = cupy_backend
    with S.graphs_enabled():
        for name in ("3cc", "3ccp"):
            run = StageRun(tiny_long, STAGES[name], TokenOptions(vocab=True))
            run.record(Span(100, 3))
            (e,) = [e for e in run.cache.entries.values() if not e.retired]
            g = e.graph_exec.graph
            kinds = Counter(be.graph_node_kinds(g))
            ratios = Counter(tiny_long.cfg.compress_ratio(layer) for layer in range(tiny_long.n_layers))
            # per ratio-4 layer two IF nodes (the compressors' emits) and a SWITCH (the top-k regime), per
            # ratio-128 layer one IF
            assert kinds["conditional"] == 3 * ratios[4] + ratios[128], kinds
            edges = Counter(t for _, _, t in be.graph_edges(g))
            assert (edges["programmatic"] > 0) == (name == "3ccp"), edges


def test_3p_on_small_short_token_bit_exact(cupy_backend):
    cfg = get_preset("small")
    m = DecodeModel(cfg, cupy_backend, TokenOptions(vocab=True))
    with S.graphs_enabled():
        base = TokenOptions(vocab=True)
        ref = StageRun(m, STAGES["0"], base).record(Span(100, 6))
        got = StageRun(m, STAGES["3p"], base).record(Span(100, 6))
    assert first_difference(ref, got) is None
