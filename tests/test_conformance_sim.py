"""The conformance scenarios on the simulated runtime, against the record the H200 produced.

``docs/measurements/h200-2026-11-29/conformance-cupy.json`` is what ``ds4lab conformance
--backend cupy`` recorded on the lent H200 (driver 580.159.04, CuPy 14.2.0): every call's error
name, every graph's nodes, every value after replay. The sim must reproduce each step exactly;
a change to a sim rule that breaks agreement with the real GPU fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4lab.conformance import SCENARIOS, run_scenarios

RECORD = Path(__file__).resolve().parents[1] / "docs/measurements/h200-2026-11-29/conformance-cupy.json"


@pytest.fixture(scope="module")
def sim_results():
    from ds4lab.sim.backend import SimBackend

    return run_scenarios(SimBackend())


@pytest.fixture(scope="module")
def gpu_record():
    return json.loads(RECORD.read_text())


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
    if name not in gpu_record:
        pytest.fail(f"scenario {name} has no H200 record: run `ds4lab conformance --backend cupy` on a GPU "
                    "and update the record")
    got, want = sim_results[name], gpu_record[name]
    assert "<exception>" not in got, got.get("<exception>")
    diffs = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
    assert not diffs, f"sim vs H200 (H200, sim): {diffs}"
