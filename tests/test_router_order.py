"""The score order of every top-k (router, indexer) on the CPU: the kernels' key
(``kernels/score_order.cuh``, compiled here for the host) against the reference's
(``reference.score_key``), both against ds4's comparison, and the router's top-k on the reference
and on the sim on tie and NaN inputs (the case ``DS4LAB_TEST_SEED=2956093227`` exposed on the H200:
-0.0 beside +0.0 at the 20th of 32 picks)."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ds4lab.capture.launch import Launcher
from ds4lab.token import ops
from ds4lab.token import reference as R
from ds4lab.token.config import get_preset
from helpers import ROUTER_SEEDS, ROUTER_TIES_NODEID, derive_seed, router_tie_nan_logits

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
f32 = np.float32

#: Floats at every edge of the order: signed zeros, infinities, NaN of both signs, the extremes
#: of the normal and subnormal ranges, and ordinary values.
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 3.4028235e38, -3.4028235e38,
                    1.1754944e-38, -1.1754944e-38, 1e-45, -1e-45, 0.5, -2.5], f32)


def ds4_better(a: float, ai: int, b: float, bi: int) -> bool:
    """ds4's comparison (ds4_cuda.cu router_score_better: a > b, equal scores to the lower index),
    with the NaN rule ds4's selection implies: no NaN is picked while a number is left."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(b) and (not math.isnan(a) or ai < bi)
    return a > b or (a == b and ai < bi)


def ds4_topk(row, k: int) -> list[int]:
    """The ``k`` best of ``row`` by :func:`ds4_better`, one pick at a time (as ds4's warp picks)."""
    left, out = list(range(len(row))), []
    for _ in range(k):
        best = left[0]
        for i in left[1:]:
            if ds4_better(float(row[i]), i, float(row[best]), best):
                best = i
        out.append(best)
        left.remove(best)
    return out


def seeded_logits(seed: int) -> np.ndarray:
    return router_tie_nan_logits(np.random.default_rng(derive_seed(seed, ROUTER_TIES_NODEID)), 100)


def test_score_key_is_ds4s_order():
    """Every pair of edge values: the key orders them as ds4's comparison does, and two values share
    a key exactly when ds4 calls them equal (-0.0 and +0.0; two NaNs)."""
    key = R.score_key(SPECIAL)
    assert key.dtype == np.uint32 and (key > 0).all()
    for i, a in enumerate(SPECIAL):
        for j, b in enumerate(SPECIAL):
            # index order reversed so that ds4_better reads the values alone
            assert (key[i] > key[j]) == ds4_better(float(a), 1, float(b), 0), (a, b)
    assert key[0] == key[1] and key[4] == key[5] == R.SCORE_KEY_NAN
    assert key[4] < key[3]  # NaN below -inf


@pytest.fixture(scope="module")
def host_score_key(tmp_path_factory):
    """``ds4_score_key`` of kernels/score_order.cuh compiled for the host: floats in, keys out."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler: the kernels' score key not compiled for the host")
    d = tmp_path_factory.mktemp("score_key")
    (d / "key.cpp").write_text(
        '#include <cstdio>\n#include <cstring>\n#include "score_order.cuh"\n'
        "int main() { unsigned u; while (std::scanf(\"%x\", &u) == 1) { float v; std::memcpy(&v, &u, 4);"
        " std::printf(\"%u\\n\", ds4_score_key(v)); } return 0; }\n")
    subprocess.run([cxx, "-O2", "-std=c++17", f"-I{KERNELS}", "-o", str(d / "key"), str(d / "key.cpp")],
                   check=True, capture_output=True)

    def run(values):
        bits = np.asarray(values, f32).reshape(-1).view(np.uint32)
        out = subprocess.run([str(d / "key")], input=" ".join(f"{b:x}" for b in bits), capture_output=True,
                             text=True, check=True).stdout.split()
        return np.array([int(x) for x in out], np.uint32)

    return run


def test_kernel_score_key_is_the_references(host_score_key, rng):
    """The kernels' key and the reference's agree bit for bit: edge values, the seeds' logits,
    random bit patterns (every class of float)."""
    values = np.concatenate([SPECIAL, seeded_logits(ROUTER_SEEDS[0]).ravel(),
                             rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(f32)])
    assert np.array_equal(host_score_key(values), R.score_key(values))


@pytest.mark.parametrize("seed", ROUTER_SEEDS)
def test_router_topk_reference_on_seeds(seed):
    """The reference's top-32 of 100 on the inputs the GPU test draws from each seed: ds4's pick
    order, weights over the chosen experts (NaN rows aside) summing to 1."""
    lg = seeded_logits(seed)
    ids, w = R.router_topk(lg, 32)
    assert ids.dtype == np.int32 and w.dtype == f32
    for t, row in enumerate(lg):
        assert ids[t].tolist() == ds4_topk(row, 32), t
        assert len(set(ids[t].tolist())) == 32
    ok = ~np.isnan(w).any(axis=1)
    assert np.allclose(w[ok].sum(axis=1), 1.0, atol=1e-6)


def test_router_topk_first_seed_meets_signed_zeros():
    """The first seed's rounded token reaches the zeros at the 20th pick, -0.0 (expert 1) before
    +0.0 (expert 2): the order a key that told the zeros apart got wrong."""
    lg = seeded_logits(ROUTER_SEEDS[0])
    ids, _ = R.router_topk(lg, 32)
    assert (lg[2] >= 1).sum() == 19
    assert ids[2][19:21].tolist() == [1, 2]
    assert np.signbit(lg[2][1]) and lg[2][1] == 0 and not np.signbit(lg[2][2])


def test_router_topk_nan_after_every_number():
    """NaN ranks after -inf, NaNs among themselves by index; ids stay distinct and in range."""
    lg = np.array([[np.nan, -np.inf, np.nan, 2.0, -0.0, 0.0, np.nan]], f32)
    ids, _ = R.router_topk(lg, 7)
    assert ids.tolist() == [[3, 4, 5, 1, 0, 2, 6]]


def test_topk_select_uses_the_same_order():
    """The indexer's top-k (reference.topk_select, kernels/longctx.cu) orders by the same key."""
    s = np.array([0.0, np.nan, -0.0, 1.0, -np.inf, -0.0], f32)
    assert R.topk_select(s, 6).tolist() == [3, 0, 2, 5, 4, 1]
    assert R.topk_merge(s, np.array([5, 1, -1, 2, 0, 4]), 4).tolist() == [0, 2, 5, 4]


@pytest.mark.parametrize("seed", ROUTER_SEEDS[:3])
def test_router_topk_on_the_sim(sim, seed):
    """The sim runs router_topk through the reference: ds4's pick order on the seeds' inputs."""
    lg = seeded_logits(seed)
    T, N, k = lg.shape[0], 100, 32
    cfg = get_preset("small").replace(n_experts=N, n_used=k)
    b = {"lg": sim.from_host(lg), "ids": sim.from_host(np.full((T, k), -1, np.int32)),
         "wts": sim.from_host(np.full((T, k), np.nan, f32))}
    ops.router_topk(Launcher(sim), "k", b["lg"], b["ids"], b["wts"], T, cfg)
    sim.synchronize()
    ids = sim.to_host(b["ids"])
    assert [ids[t].tolist() for t in range(T)] == [ds4_topk(row, k) for row in lg]
