"""The argument fixtures recorded on a GPU (``scripts/make_audit_fixtures.py`` writes them into
``tests/data/audit_args/``): on the CPU, the audit of each recording with its argument pass names what
torch.cuda.graph did with the same step (``engine.json`` beside it), or says 'unknown' — never 'replays
right' where torch replayed it wrong. Skipped until the fixtures exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4lab.audit.analysis import analyze
from ds4lab.audit.arguments import store_beside
from ds4lab.audit.engines import TOKEN_RANGE
from ds4lab.audit.frozen import RIGHT, UNKNOWN, attach
from ds4lab.trace.sources import read_events as read
from ds4lab.audit.validate import OUTCOMES, predicted_outcome

ROOT = Path(__file__).parent / "data" / "audit_args"
RUNS = sorted(p for p in ROOT.glob("*") if (p / "engine.json").is_file()) if ROOT.is_dir() else []


@pytest.mark.skipif(not RUNS, reason="no GPU-recorded argument fixtures yet (scripts/make_audit_fixtures.py)")
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_audit_with_arguments_names_what_torch_did(run):
    torch_run = json.loads((run / "engine.json").read_text())
    rep = analyze([read(run / "recording.csv.gz")], token_range=TOKEN_RANGE)[0]
    attach(rep, store_beside(run / "recording.csv.gz"))
    verdict, why = predicted_outcome(rep)
    expected = OUTCOMES[torch_run["outcome"]]
    assert verdict in (expected, UNKNOWN), (verdict, why, torch_run["detail"])
    assert not (verdict == RIGHT and expected != RIGHT)
