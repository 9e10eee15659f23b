"""``ds4lab audit validate`` without a GPU: the engines' runs replaced by the bundled H200 recordings and
their outcomes, so what is checked is the comparison, the table written as it goes, and the exit."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ds4lab.audit import engines
from ds4lab.audit import frozen as F
from ds4lab.audit import validate as V
from ds4lab.errors import CheckFailed


def _fake_run(outcome_of=None):
    def run_isolated(engine, cache, out, dtype="float32", timeout=900):
        r = dict(engines.recorded_outcome(engine, cache))
        if outcome_of:
            r["outcome"] = outcome_of
        r["recording"] = str(engines.recorded(engine, cache))
        return r
    return run_isolated


def test_rows_compare_the_audit_with_torch_and_are_written_as_they_come(tmp_path, monkeypatch):
    """The bundled recordings have no argument pass: the step torch replayed right is 'unknown from this
    trace' (no agreement: the audit could not name it); the one with a changing grid is named."""
    monkeypatch.setattr(engines, "run_isolated", _fake_run())
    from ds4lab.jobs.audit import write_report

    seen = []
    df = V.validate(["llama"], ["static", "dynamic"], tmp_path, say=lambda *a: None,
                    on_row=lambda rows: seen.append(len(rows)),
                    on_report=lambda rep, under: write_report([rep], tmp_path / under))
    assert seen == [1, 2]
    assert list(df.cache) == ["dynamic", "static"]  # the family's own order
    assert list(df.torch_outcome) == ["captured, replays wrong", "captured, replays right"]
    assert list(df.audit_verdict) == ["replays wrong", F.UNKNOWN] and list(df.verdict_agrees) == [True, False]
    assert "ds4lab audit run" in df.audit_why[1]
    ratio = df.predicted_us / df.replay_us
    assert (ratio == df.predicted_over_measured).all() and (df.time_agrees == ((ratio - 1).abs() <= V.TIME_TOLERANCE)).all()
    assert (tmp_path / "llama-static-float32" / "audit" / "plans.csv").is_file()
    md = V.markdown(df)
    assert md.count("\n") == 4 and "| llama | static | float32 |" in md


def test_an_argument_pass_decides_the_verdict_and_its_cost_is_in_the_table(tmp_path, monkeypatch):
    """A hand-written decoder whose cache keeps its write index on the host, recorded with its arguments
    (synthetic, through the stand-in CUPTI): the audit names torch's 'replays wrong' from the frozen value
    and slot; the cost per launch is carried into the row; the device-counter twin replays right."""
    import audit_args_synth as S
    from ds4lab.audit import arguments as A

    runs = {}
    for cache, kw in (("host-counter", {}), ("device-counter", {"host_counter": False, "host_slot": False})):
        d = tmp_path / "rec" / cache
        d.mkdir(parents=True)
        rec, _, _ = S.record(monkeypatch, d, **kw)
        rec.save(d / "recording.csv.gz")  # its own timed pass stands in for the timed one
        st = A.load(d / "arguments.json.gz")
        st.cost = {"per_launch_us": 4.2, "per_launch_lo": 3.9, "per_launch_hi": 4.6, "text": "4.20 µs per launch"}
        A.save(st, d / "arguments.json.gz")
        runs[cache] = d

    def run_isolated(engine, cache, out, dtype="float32", timeout=900):
        d = runs[cache]
        return {"outcome": "captured, replays wrong" if cache == "host-counter" else "captured, replays right",
                "recording": str(d / "recording.csv.gz"), "arguments": str(d / "arguments.json.gz"),
                "overhead": A.load(d / "arguments.json.gz").cost, "replay_us": 100.0, "eager_us": 300.0}

    monkeypatch.setattr(engines, "run_isolated", run_isolated)
    df = V.validate(["handwritten"], ["device-counter", "host-counter"], tmp_path / "v", say=lambda *a: None)
    assert list(df.audit_verdict) == ["replays wrong", "replays right"] and df.verdict_agrees.all()
    assert df.frozen_findings[0] >= 2 and "frozen value" in df.frozen[0] and df.frozen_findings[1] == 0
    assert list(df.capture_us_per_launch) == [4.2, 4.2]
    assert (tmp_path / "v" / "handwritten-host-counter-float32" / "audit" / "arguments.csv").is_file()


def test_a_disagreement_fails_the_job_after_writing_the_table(tmp_path, monkeypatch):
    from ds4lab.jobs import audit_validate as J

    monkeypatch.setattr(engines, "run_isolated", _fake_run("refused"))  # torch said refused; the audit will not
    monkeypatch.setattr(engines, "available", lambda: (True, ""))
    out = tmp_path / "v"
    with pytest.raises(CheckFailed, match="llama/static/float32"):
        J.run(J.ValidateConfig(engines=("llama",), caches=("static",), out=out, dtypes=("float32",)), None, None)
    assert (out / "validate.md").is_file()
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


def test_a_recording_inside_the_result_folder_is_named_by_its_place_there(tmp_path):
    """validate.csv names a run's files inside its result folder, which may be a staging folder renamed
    when the run finishes (an absolute path into it would name nothing afterwards)."""
    out = tmp_path / ".v.staging"
    inside = out / "llama-static-float32" / "recording.csv.gz"
    assert V._inside(str(inside), out) == "llama-static-float32/recording.csv.gz"
    elsewhere = tmp_path / "rec" / "recording.csv.gz"
    assert V._inside(str(elsewhere), out) == str(elsewhere) and V._inside("", out) == ""


def test_runs_from_audits_the_saved_runs_without_a_gpu(tmp_path):
    import pandas as pd

    from ds4lab.errors import CheckFailed
    from ds4lab.jobs.audit_validate import ValidateConfig, run

    src = Path(__file__).parent / "data" / "audit_args"
    run(ValidateConfig(engines=("handwritten",), dtypes=("float32",), runs_from=src, out=tmp_path / "v"))
    df = pd.read_csv(tmp_path / "v" / "validate.csv").set_index("cache")
    assert set(df.index) == {"host-counter", "device-counter", "host-read"} and df["verdict_agrees"].all()
    assert df.loc["device-counter", "audit_verdict"] == "replays right"
    assert df.loc["host-counter", "audit_verdict"] == "replays wrong" and df.loc["host-counter", "verdict_agrees"]
    assert df.loc["host-read", "audit_verdict"] == "refused" and df.loc["host-read", "verdict_agrees"]
    assert df.loc["host-counter", "measured_loop"] == "never waits" and df.loc["host-counter", "time_agrees"]
    assert (tmp_path / "v" / "handwritten-host-counter-float32" / "audit" / "audit.csv").is_file()


def test_runs_from_refuses_what_it_cannot_use(tmp_path):
    from ds4lab.errors import BadInput
    from ds4lab.jobs.audit_validate import ValidateConfig, check_config, run

    with pytest.raises(BadInput, match="no such folder"):
        check_config(ValidateConfig(runs_from=tmp_path / "nope"))
    with pytest.raises(BadInput, match="no run in it"):
        check_config(ValidateConfig(runs_from=tmp_path))
    src = Path(__file__).parent / "data" / "audit_args"
    with pytest.raises(BadInput, match="--runs-from's folder"):
        run(ValidateConfig(runs_from=src, out=src))
    with pytest.raises(BadInput, match="none of the runs asked for"):
        run(ValidateConfig(engines=("gemma2",), runs_from=src, out=tmp_path / "w"))  # no gemma2 fixture
    assert not (tmp_path / "w").exists()  # refused before anything was written


def test_runs_from_names_a_run_folder_it_cannot_audit(tmp_path):
    """A run without its recording, an engine.json that does not parse: refused up front, the file named;
    an argument pass that does not read: the run is audited without it and its row says why."""
    import shutil

    import pandas as pd

    from ds4lab.errors import BadInput, CheckFailed
    from ds4lab.jobs.audit_validate import ValidateConfig, run

    good = Path(__file__).parent / "data" / "audit_args" / "handwritten-host-counter-float32"
    cfg = dict(engines=("handwritten",), caches=("host-counter",), dtypes=("float32",))
    bare = tmp_path / "bare" / good.name
    bare.mkdir(parents=True)
    shutil.copy(good / "engine.json", bare / "engine.json")
    with pytest.raises(BadInput, match="recording.csv.gz is missing"):
        run(ValidateConfig(**cfg, runs_from=bare.parent, out=tmp_path / "o1"))
    (bare / "engine.json").write_text("{")
    with pytest.raises(BadInput, match=r"engine.json: not a run's engine.json \(JSONDecodeError"):
        run(ValidateConfig(**cfg, runs_from=bare.parent, out=tmp_path / "o2"))
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    cut = tmp_path / "cut" / good.name
    shutil.copytree(good, cut)
    (cut / "arguments.json.gz").write_bytes((good / "arguments.json.gz").read_bytes()[:200])
    with pytest.raises(CheckFailed):  # without its arguments the verdict is unknown: it disagrees
        run(ValidateConfig(**cfg, runs_from=cut.parent, out=tmp_path / "o3"))
    row = pd.read_csv(tmp_path / "o3" / "validate.csv").iloc[0]
    assert "kernel arguments not compared" in row["error"] and "not a ds4lab arguments file" in row["error"]


def test_the_markdown_shows_no_ratio_for_a_run_that_did_not_replay():
    """A refused run read back from validate.csv has a predicted time and NaN for the replay: a dash."""
    import pandas as pd

    from ds4lab.audit.validate import markdown

    row = {"family": "handwritten", "cache": "host-read", "dtype": "float32", "torch_outcome": "refused",
           "torch_detail": "", "audit_verdict": "refused", "verdict_agrees": True, "frozen_findings": 0, "frozen": "",
           "predicted_us": 153.0, "replay_us": float("nan"), "predicted_over_measured": float("nan"),
           "time_agrees": None, "replay_device_us": float("nan"), "capture_us_per_launch": 77.0, "capture_lo": 71.8,
           "capture_hi": 82.4, "capture_cost": "", "same_work": float("nan"), "graph_kernels": float("nan"),
           "token_kernels": 35}
    line = markdown(pd.DataFrame([row])).splitlines()[2]
    assert "nan" not in line and "| — | — |" in line
