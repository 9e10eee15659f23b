"""The capture ladder under tensor parallelism on two simulated ranks (``ds4lab.tp.ladder``): stages 0, i and
3 (and 3c on the long-context token) with the collectives inside the graph and between graphs, each
bit-identical to TP stage 0 on both ranks, with µs per token paired against stage 0 (MODELED). ds4's peer
copies: refused inside an island, wrong inside the token graph, exact between graphs. CPU only, ``tiny``."""

from __future__ import annotations

import pytest

from ds4lab.capture import stream as S
from ds4lab.token.config import get_preset
from ds4lab.token.model import TokenOptions
from ds4lab.tp.group import TPGroup
from ds4lab.tp.ladder import default_table, tp_ladder
from ds4lab.tp.stages import TP_STAGES, parse_tp_stages

TINY = get_preset("tiny")
L, HASH = TINY.n_layers, TINY.n_hash_layers
STAGES = "0,i:in,i:out,3:in,3:out"


def _ladder(reduce: str, cfg=TINY, stages=STAGES, start=1000, long_context=False):
    with S.graphs_enabled():
        g = TPGroup(cfg, reduce=reduce, opts=TokenOptions(vocab=True))
        rows = tp_ladder(g, parse_tp_stages(stages, long_context=long_context), default_table(3, 2, 2, start=start))
    return g, {r["stage"]: r for r in rows}


@pytest.fixture(scope="module")
def nccl():
    return _ladder("nccl")


def test_every_stage_is_exact_on_both_ranks_with_nccl(nccl):
    _, rows = nccl
    for name, r in rows.items():
        assert r["exact"] and r["ranks_identical"] and r["failures"] == "none", (name, r)


def test_where_the_collectives_run(nccl):
    g, rows = nccl
    # eager collectives per token: every reduction in stage 0 and with the collectives outside the graphs;
    # inside, only the hash-routed layers' (ds4 keeps their island 1 eager), none in the whole-token graph
    assert rows["0"]["collectives"] == rows["i:out"]["collectives"] == rows["3:out"]["collectives"] == 2 * L
    assert rows["i:in"]["collectives"] == 2 * HASH and rows["3:in"]["collectives"] == 0
    assert rows["3:in"]["graph_launches"] == 1 and rows["3:out"]["graph_launches"] == 2 * L + 1
    assert rows["i:in"]["graph_launches"] == L + (L - HASH) and rows["i:out"]["graph_launches"] == L + 3 * (L - HASH)
    assert rows["3:in"]["collectives_in_graph"] and not rows["3:out"]["collectives_in_graph"]


def test_the_whole_token_graph_holds_every_collective(nccl):
    g, _ = nccl
    runs = g.stage_runs(TP_STAGES["3:in"].stage, TokenOptions(vocab=True))
    with S.graphs_enabled():
        from ds4lab.experiments.stage_run import Span

        g.run(lambda r: runs[r].record(Span(1000, 2)))
    for run in runs:
        graphs = [e.graph_exec.graph for e in run.cache.entries.values() if e.graph_exec is not None]
        assert len(graphs) == 1
        assert sum(1 for n in graphs[0].nodes if isinstance(n.info, tuple) and n.info[0] == "nccl") == 2 * L


def test_timing_is_paired_and_modeled(nccl):
    _, rows = nccl
    for r in rows.values():
        assert r["us_median"] > 0 and r["us_rank0"] > 0 and r["us_rank1"] > 0
    assert rows["0"]["gain_us"] == 0 and rows["3:in"]["gain_us"] > 0  # the whole token replayed beats eager


def test_ds4s_peer_copies_belong_between_graphs():
    _, rows = _ladder("peer")
    assert rows["0"]["exact"] and rows["i:out"]["exact"] and rows["3:out"]["exact"]
    assert rows["i:in"]["exact"] and rows["i:in"]["failures"].startswith("cudaErrorStreamCaptureImplicit=")
    assert not rows["3:in"]["exact"] and rows["3:in"]["first_difference"]  # escaped the graph: replays wrong


def test_long_context_one_graph_for_every_position_with_the_collectives_inside_or_out():
    cfg = TINY.replace(long_context=True, max_context=4096)
    _, rows = _ladder("nccl", cfg, "0,3c:in,3c:out", start=4 * cfg.index_top_k * 8 - 3, long_context=True)
    for name in ("3c:in", "3c:out"):
        assert rows[name]["exact"] and rows[name]["ranks_identical"], rows[name]
