"""The audit across devices (``ds4lab.audit.collectives``) on the tensor-parallel token's trace (``ds4lab.tp.trace``,
the sim): collectives paired by rank, each pairing's rule, and the deadlock risk of a per-rank capture plan in
which one rank falls back to eager. CPU only, ``tiny``."""

from __future__ import annotations

import pandas as pd
import pytest

from ds4lab.audit.analysis import analyze
from ds4lab.audit.collectives import collective_op, pair_collectives, per_rank_plan
from ds4lab.trace.events import EventTable, make_frame
from ds4lab.capture import stream as S
from ds4lab.token.config import get_preset
from ds4lab.token.model import TokenOptions
from ds4lab.tp.group import TPGroup
from ds4lab.tp.trace import record_tp_table

TINY = get_preset("tiny")
TOKENS = 2
N = 2 * TINY.n_layers * TOKENS


@pytest.fixture(scope="module")
def tables():
    with S.graphs_enabled():
        g = TPGroup(TINY, opts=TokenOptions(vocab=True))
        return {st: record_tp_table(g, st, tokens=TOKENS) for st in ("0", "3:in")}


def test_nccl_kernel_names():
    assert collective_op("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "AllReduce"
    assert collective_op("ncclKernel_AllGather_RING_LL_Sum_int8_t") == "AllGather"
    assert collective_op("q8_matvec") is None


def test_collectives_pair_by_rank_eager_and_from_graphs(tables):
    for st, launch in (("0", "eager"), ("3:in", "graph")):
        p = pair_collectives(tables[st].frame)
        assert len(p) == N and set(p.verdict) == {"paired"} and set(p.rule) == {"nccl_pair"}
        assert set(p["p0d0.launch"]) == set(p["p0d1.launch"]) == {launch}


def _mix(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([a[a.device == 0], b[b.device == 1]]).sort_values("start_ns", kind="stable")


def test_one_rank_from_graphs_and_the_other_eager_is_named(tables):
    p = pair_collectives(_mix(tables["3:in"].frame, tables["0"].frame))
    assert set(p.verdict) == {"mixed capture"} and set(p.rule) == {"nccl_nonuniform"}


def test_a_missing_or_different_collective_is_named(tables):
    f = tables["0"].frame
    coll = f[(f.kind == "kernel") & f.name.str.startswith("nccl")]
    last1 = coll[coll.device == 1].index[-1]
    p = pair_collectives(f.drop(index=last1))
    assert p.verdict.iloc[-1] == "missing" and p.rule.iloc[-1] == "nccl_timeout" and (p.verdict.iloc[:-1] == "paired").all()
    g = f.copy()
    g.loc[coll[coll.device == 1].index[3], "name"] = "ncclDevKernel_AllGather_f32"
    p = pair_collectives(g)
    assert p.verdict.iloc[3] == "differ" and p.rule.iloc[3] == "nccl_mismatch"


def test_a_per_rank_plan_where_one_rank_falls_back_is_a_deadlock_risk(tables):
    f = tables["0"].frame
    reports = analyze([tables["0"]], token_range="token")
    ok = per_rank_plan(reports, "thread_local")
    assert set(ok.risk) == {"none"} and ok.captures.all() and (ok.collectives == N).all()
    glob = per_rank_plan(reports, "global")  # one process, a thread per GPU: NCCL asks thread-local capture
    assert not glob.captures.any() and all("nccl_global_multithread" in r for r in glob.risk)
    tok = f[(f.kind == "nvtx") & (f.device == 0)].iloc[0]
    sync = {"kind": "api", "name": "cudaDeviceSynchronize", "domain": "runtime", "pid": 0, "tid": 1, "device": 0,
            "start_ns": int(tok.start_ns) + 1, "end_ns": int(tok.start_ns) + 2}
    rows = [dict(r) for _, r in f.iterrows()] + [sync]
    bad = per_rank_plan(analyze([EventTable(make_frame(rows), "<injected>", "test")], token_range="token"),
                        "thread_local")
    by = bad.set_index("unit")
    assert not by.loc["p0d0", "captures"] and by.loc["p0d1", "captures"]
    assert by.loc["p0d0", "falls_back_at"].startswith("cudaDeviceSynchronize")
    assert set(bad.risk) == {by.loc["p0d0", "risk"]} and "deadlock risk (rule nccl_nonuniform)" in by.loc["p0d0", "risk"]


def test_the_trace_is_written_for_ds4lab_audit(tmp_path):
    """``ds4lab tp trace``: the job writes the recorded table, the pairs and the plan into its folder."""
    from ds4lab.jobs import execute
    from ds4lab.jobs.tp import TPConfig
    from ds4lab.trace.sources import read_events as read

    res = execute("tp", TPConfig(command="trace", preset="tiny", stage="3:out", tokens=TOKENS, out=tmp_path))
    assert [f.name for f in res.files] == ["trace-tp.csv.gz", "tp-collectives.csv", "tp-plan.csv"]
    t = read(tmp_path / "trace-tp.csv.gz")
    assert set(t.frame.device[t.frame.kind == "kernel"]) == {0, 1}
    pairs = pd.read_csv(tmp_path / "tp-collectives.csv")
    assert len(pairs) == N and set(pairs.verdict) == {"paired"} and set(pairs["p0d0.launch"]) == {"eager"}
