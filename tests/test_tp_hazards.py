"""The tensor-parallel hazards (``ds4lab.tp.hazards``, registered in the hazard table as ``all-tp``) on two
simulated ranks: what each does, as the sim's rules say (a collective that would hang a GPU raises in the
sim, at once or after its timeout, never a real hang). CPU only, the ``tiny`` preset, a second or two."""

from __future__ import annotations

import pytest

import ds4lab.tp.hazards  # noqa: F401  (registers the two-rank hazards in the table)
from ds4lab.experiments.hazards import HAZARD_SETS, HAZARDS, demonstrate, hazard_names, register
from ds4lab.sim.backend import SimBackend
from ds4lab.token.config import get_preset

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def results():
    return {n: demonstrate(n, SimBackend(), TINY) for n in HAZARD_SETS["all-tp"]}


def test_the_tp_hazards_are_in_the_table_and_apart_from_the_single_gpu_sets():
    tp = set(HAZARD_SETS["all-tp"])
    assert {"tp-ranks-out-of-step", "tp-collective-order", "tp-host-sync-one-rank"} <= tp
    assert not tp & set(HAZARD_SETS["all"]) and not tp & set(HAZARD_SETS["all-longctx"])
    assert hazard_names("all-tp") == list(HAZARD_SETS["all-tp"]) and all(HAZARDS[n].steps == "tp" for n in tp)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="tp-collective-order is in the table already"):
        register({"tp-collective-order": HAZARDS["tp-collective-order"]}, "again")


def test_ranks_capturing_out_of_step_never_complete(results):
    r = results["tp-ranks-out-of-step"]
    assert r["outcome"] == "never completes (nccl:nonuniform-capture)" and not r["exact"]
    assert r["rank_errors"] == "rank 0: nccl:nonuniform-capture; rank 1: nccl:nonuniform-capture"


def test_a_collective_out_of_order_never_completes(results):
    r = results["tp-collective-order"]
    assert r["outcome"] == "never completes (nccl:mismatch)" and r["captures"] == 0  # eager: no graph needed


def test_a_host_sync_on_one_rank_breaks_its_capture_and_then_the_collective(results):
    r = results["tp-host-sync-one-rank"]
    assert r["errors"] == "cudaErrorStreamCaptureUnsupported=1" and r["retirements"] == 1
    assert r["outcome"] == "never completes (nccl:nonuniform-capture)"


def test_ds4s_peer_copies_refuse_the_island_and_break_the_token_graph(results):
    isl, tok = results["tp-peer-copy-island"], results["tp-peer-copy-token"]
    assert isl["outcome"] == "refused → eager fallback" and isl["exact"]
    assert isl["errors"].startswith("cudaErrorStreamCaptureImplicit=")
    n_islands = 2 * sum(1 for layer in range(TINY.n_layers) if not TINY.is_hash_layer(layer))
    assert isl["retirements"] == n_islands  # island 1 of every routed layer, on both ranks
    assert tok["outcome"] == "captured, replays wrong" and tok["first_mismatch"].startswith("token 1:")


def test_tp_hazards_refuse_a_gpu_backend():
    class Gpu:
        name = "cupy"

    with pytest.raises(ValueError, match="on the sim"):
        demonstrate("tp-collective-order", Gpu(), TINY)
