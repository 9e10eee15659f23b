"""The tensor-parallel token (two ranks, threads, on the sim) against the single-GPU token.

* With the verification reduction (each reduction replaced by the single-GPU values from the same
  inputs), the TP token is the single-GPU token bit for bit: every launch outside the reductions is exact.
* With NCCL's all-reduce and with ds4's peer copies (bit-identical to each other, and the same bits on
  both ranks), every reduction stays within ``reduction_bound`` of the single-GPU value from the same
  inputs, and it does differ (the order of the sum changed), so the bound is what the test holds.
CPU only; the ``tiny`` preset, a few seconds in all.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.experiments.stage_run import Span
from ds4lab.token import reference as R
from ds4lab.token.config import ConfigError, get_preset
from ds4lab.token.weights import WeightSpec, gen_qtensor
from ds4lab.tp.group import TPGroup, compare_with_single
from ds4lab.tp.reduce import reduction_bound
from ds4lab.tp.shard import ShardPlan, col_slice, row_slice

TINY = get_preset("tiny")


@pytest.fixture(autouse=True)
def graphs_on():
    with S.graphs_enabled():
        yield


def _strip(r):
    return {k: v for k, v in r.items() if k not in ("checks", "snapshots", "reference")}


# ----------------------------------------------------------------------------- the split
def test_shard_plan_covers_the_model_once():
    plans = [ShardPlan.for_rank(TINY, r, 2) for r in range(2)]
    for attr, n in (("heads", TINY.n_heads), ("groups", TINY.out_groups), ("ffn", TINY.expert_ffn),
                    ("experts", TINY.n_experts)):
        got = [i for p in plans for i in getattr(p, attr)]
        assert got == list(range(n)), attr
    assert plans[1].local_config().n_heads == TINY.n_heads // 2 and plans[1].owner_of_expert(TINY.n_experts - 1) == 1


@pytest.mark.parametrize("change,word", [({"n_heads": 6, "out_groups": 3}, "out_groups"),
                                         ({"expert_format": "q4blk"}, "routed MoE")])
def test_a_model_that_does_not_split_is_refused_by_name(change, word):
    with pytest.raises(ConfigError, match=word):
        ShardPlan.for_rank(TINY.replace(**change), 0, 2)
    with pytest.raises(ConfigError, match="rank=2"):
        ShardPlan.for_rank(TINY, 2, 2)


def test_row_and_column_slices_are_exact():
    W = gen_qtensor("q8_0", 77, 0, 64, 128)
    x = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    rows = row_slice(W, [range(8, 16), range(40, 48)])
    assert R.dequant(rows).tobytes() == np.concatenate([R.dequant(W)[8:16], R.dequant(W)[40:48]]).tobytes()
    cols = col_slice(W, range(32, 96))
    assert R.dequant(cols).tobytes() == np.ascontiguousarray(R.dequant(W)[:, 32:96]).tobytes()
    assert R.q8_matvec(cols, x[32:96]).shape == (64,)
    with pytest.raises(ValueError, match="Q8_0 blocks"):
        col_slice(W, range(16, 48))


# ----------------------------------------------------------------------------- exact outside the reductions
@pytest.mark.parametrize("placement", ["inside", "outside"])
def test_with_single_gpu_reductions_the_tp_token_is_the_single_gpu_token(placement):
    r = compare_with_single(TINY, Span(1000, 3), reduce="oracle", placement=placement, check=False)
    assert r["first_difference"] is None and r["ranks_identical"], _strip(r)


def test_long_context_tp_token_is_exact_outside_the_reductions():
    cfg = TINY.replace(long_context=True, max_context=4096)
    r = compare_with_single(cfg, Span(4 * cfg.index_top_k * 8 - 3, 4), reduce="oracle", check=False)  # past top-k
    assert r["first_difference"] is None and r["ranks_identical"], _strip(r)


# ----------------------------------------------------------------------------- the reductions
@pytest.fixture(scope="module")
def nccl_and_peer():
    with S.graphs_enabled():
        return {red: compare_with_single(TINY, Span(1000, 3), reduce=red, check=True) for red in ("nccl", "peer")}


def test_nccl_and_peer_reductions_give_the_same_bits_on_both_ranks(nccl_and_peer):
    a, b = nccl_and_peer["nccl"], nccl_and_peer["peer"]
    assert a["ranks_identical"] and b["ranks_identical"]
    from ds4lab.experiments.stage_run import first_difference

    assert first_difference(a["snapshots"][0], b["snapshots"][0]) is None


def test_every_reduction_is_within_the_stated_bound_and_not_trivially(nccl_and_peer):
    for red, r in nccl_and_peer.items():
        layers = TINY.n_layers
        assert len(r["checks"]) == 3 * layers * 2 * 2, red  # 3 tokens x layers x 2 points x 2 ranks
        assert r["worst_bound_ratio"] <= 1.0, (red, r["worst_bound_ratio"])
        assert r["elements_differing"] > 0, red  # the sum's order did change: the bound is what holds
        assert r["first_difference"] is not None
        # end to end (an observation, not a bound: the layers after a reduction are not linear)
        assert r["max_rel_hidden"] < 1e-5, r["max_rel_hidden"]


def test_reduction_bound_holds_for_fp32_partial_sums_and_catches_a_wrong_sum():
    rng = np.random.default_rng(7)
    worst, caught = 0.0, False
    for _ in range(200):
        n = 256
        w, x = rng.standard_normal((64, n)), rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3)
        p = [(w[:, :n // 2] @ x[:n // 2]).astype(np.float32), (w[:, n // 2:] @ x[n // 2:]).astype(np.float32)]
        tp = (p[0] + p[1]).astype(np.float32)
        single = (w @ x).astype(np.float32)
        b = reduction_bound(p, single, n, np.abs(w) @ np.abs(x))
        worst = max(worst, float((np.abs(tp.astype(np.float64) - single) / b).max()))
        wrong = (p[0] * np.float32(1 + 2.0 ** -20) + p[1]).astype(np.float32)  # a few ulps off
        caught |= bool((np.abs(wrong.astype(np.float64) - single) > b).any())
    assert worst <= 1.0 and caught


def test_the_tp_token_launches_two_collectives_per_layer():
    g = TPGroup(TINY, reduce="nccl", opts=None)
    m = g.models[0]
    g.run(lambda r: g.models[r].token(1000, 7))
    by = m.L.census.frame(per_token=False)
    coll = by[by.kind == "collective"]
    assert int(coll.launches.sum()) == 2 * TINY.n_layers
    assert set(coll.site) == {"tp.allreduce.attn", "tp.allreduce.ffn"}
    # the rank holds its heads, half the shared expert and half the experts
    assert m.q.shape[0] == TINY.n_heads // 2 and m.sh_mid.shape[0] == TINY.expert_ffn // 2
    assert len(m.banks[0]["gate_up"]) == TINY.n_experts // 2
