"""The conformance scenarios on the simulated runtime, against the record the H200 produced.

``docs/measurements/h200-2026-12-02-ds4/conformance/conformance-cupy.json`` is what ``ds4lab
conformance --backend cupy`` recorded on the lent H200 (driver 580.159.04, CuPy 14.2.0; 195
scenarios, 1 753 steps, 0 disagreements; the conditional-node and programmatic-launch scenarios
included, the two-GPU ones skipped on its one GPU): every call's error name, every graph's nodes, every value
after replay. The sim must reproduce each step exactly;
a change to a sim rule that breaks agreement with the real GPU fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4lab.conformance import SCENARIOS, run_scenarios

RECORD = (Path(__file__).resolve().parents[1]
          / "docs/measurements/h200-2026-12-02-ds4/conformance/conformance-cupy.json")


@pytest.fixture(scope="module")
def sim_results():
    from ds4lab.sim.backend import SimBackend

    return run_scenarios(SimBackend())


@pytest.fixture(scope="module")
def gpu_record():
    return json.loads(RECORD.read_text())


def test_the_record_holds_every_scenario_and_no_swallowed_status(gpu_record):
    """Every scenario without a documented expectation ran on the H200 (one written from the
    documentation waits for the next H200 run with its ``expect``), and the queries that CuPy answers
    with a status (instead of raising) were recorded by name, not as ``ok`` (issue of the 2026-11-29 record)."""
    assert {s.name for s in SCENARIOS if not s.expect} <= set(gpu_record)
    assert gpu_record["stream_query_captured"]["stream_query"] == "cudaErrorStreamCaptureUnsupported"
    assert gpu_record["event_query_captured"]["event_query"] == "cudaErrorCapturedEvent"


def test_at_least_80_scenarios_and_every_one_is_checked(gpu_record):
    assert len(SCENARIOS) >= 80
    for sc in SCENARIOS:
        # either the H200 recorded it, or it states what the CUDA documentation (or a measured fact) says
        ran = sc.name in gpu_record and "<skipped>" not in gpu_record[sc.name]
        assert ran or (sc.expect and sc.source), sc.name


def test_at_least_30_scenarios_cover_the_hazard_table():
    assert len(SCENARIOS) >= 30
    covers = " ".join(s.covers for s in SCENARIOS)
    # one entry per row of the context file's hazard table, plus the cross-thread rule
    for row in ("sync memset on the legacy stream", "host-timed profiling", "kernel launched on the legacy stream",
                "allocation inside capture", "host scalars passed by value", "host readback", "device synchronize",
                "cuBLAS", "from another thread"):
        assert row.lower() in covers.lower(), row


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_sim_matches_h200(name, sim_results, gpu_record):
    got = sim_results[name]
    # a scenario written from the documentation, not yet run on the H200 (or skipped there: two GPUs)
    if name not in gpu_record or "<skipped>" in gpu_record[name]:
        sc = next(s for s in SCENARIOS if s.name == name)
        assert not [k for k in got if k.startswith("<")], got
        diffs = {k: (v, got.get(k)) for k, v in sc.expect.items() if got.get(k) != v}
        assert not diffs, f"sim vs documented expectation (doc, sim) [{sc.source}]: {diffs}"
        return
    want = gpu_record[name]
    assert "<exception>" not in got, got.get("<exception>")
    diffs = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
    assert not diffs, f"sim vs H200 (H200, sim): {diffs}"
