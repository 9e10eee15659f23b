"""``ds4lab audit validate`` without a GPU: the engines' runs replaced by the bundled H200 recordings and
their outcomes, so what is checked is the comparison, the table written as it goes, and the exit."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ds4lab.audit import engines
from ds4lab.audit import validate as V
from ds4lab.errors import CheckFailed


def _fake_run(outcome_of=None):
    def run_isolated(engine, cache, out, timeout=240):
        r = dict(engines.recorded_outcome(engine, cache))
        if outcome_of:
            r["outcome"] = outcome_of
        r["recording"] = str(engines.recorded(engine, cache))
        return r
    return run_isolated


def test_rows_compare_the_audit_with_torch_and_are_written_as_they_come(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "run_isolated", _fake_run())
    from ds4lab.jobs.audit import write_report

    seen = []
    df = V.validate(["llama"], ["static", "dynamic"], tmp_path, say=lambda *a: None,
                    on_row=lambda rows: seen.append(len(rows)),
                    on_report=lambda rep, under: write_report([rep], tmp_path / under))
    assert seen == [1, 2]
    assert list(df.torch_outcome) == ["captured, replays right", "captured, replays wrong"]
    assert list(df.audit_outcome) == ["replays right", "replays wrong"] and df.verdict_agrees.all()
    ratio = df.predicted_us / df.replay_us
    assert (ratio == df.predicted_over_measured).all() and (df.time_agrees == ((ratio - 1).abs() <= V.TIME_TOLERANCE)).all()
    assert (tmp_path / "llama-static" / "audit" / "plans.csv").is_file()


def test_a_disagreement_fails_the_job_after_writing_the_table(tmp_path, monkeypatch):
    from ds4lab.jobs import audit_validate as J

    monkeypatch.setattr(engines, "run_isolated", _fake_run("refused"))  # torch said refused; the audit will not
    monkeypatch.setattr(engines, "available", lambda: (True, ""))
    out = tmp_path / "v"
    with pytest.raises(CheckFailed, match="llama/static"):
        J.run(J.ValidateConfig(engines=("llama",), caches=("static",), out=out), None, None)
    df = pd.read_csv(out / "validate.csv")
    assert list(df.verdict_agrees) == [False]
    assert json.loads((out / "meta.json").read_text())["status"].startswith("failed")


def test_a_sim_trace_is_labelled_modeled_and_bad_input_leaves_no_folder(tmp_path):
    """ds4lab's trace.json written by the simulated runtime: the audit calls its times MODELED (meta and
    the plans' table); a file the readers refuse is exit 2 with no result folder left behind."""
    from click.testing import CliRunner

    from ds4lab.cli import main
    from ds4lab.jobs import execute
    from ds4lab.jobs.trace import TraceConfig

    execute("trace", TraceConfig(preset="tiny", stages="0", tokens=6, out=tmp_path / "tr"), backend="sim")
    r = CliRunner().invoke(main, ["audit", str(tmp_path / "tr" / "trace.json"), "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "eager µs (MODELED)" in r.output and "(measured" not in r.output
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["modeled"].endswith("process 1: MODELED")
    junk = tmp_path / "junk.txt"
    junk.write_text("not a trace")
    r = CliRunner().invoke(main, ["audit", str(junk), "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "junk.txt" in r.output
    assert not list(tmp_path.glob("b*")) and not list(tmp_path.glob(".b*"))
