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


SYNTH = Path(__file__).parent / "data" / "steps_synth"


def _rope_line() -> int:
    """The line of the synthetic pass that passes the host's position to ``rope`` by value (its cause)."""
    import audit_args_synth

    src = Path(audit_args_synth.__file__).read_text().splitlines()
    return next(i for i, t in enumerate(src, 1) if 'ROPE, [p64(tmp), struct.pack("<i", pos)]' in t)


def _fake_steps(monkeypatch, tmp_path, cause_line=None, check_verdict=None):
    """``run_step`` replaced by what it writes, from the stand-in CUPTI's argument passes: the synthetic
    step's host-counter cache passes its position by value (replays wrong, its cause named by the truth at
    ``cause_line``), the device-counter one replays right."""
    import audit_args_synth as S
    from ds4lab.audit import arguments as A
    from ds4lab.audit import steps

    passes = {}
    for cache, kw in (("host-counter", {}), ("device-counter", {"host_counter": False, "host_slot": False})):
        d = tmp_path / "rec" / cache
        d.mkdir(parents=True)
        rec, _, _ = S.record(monkeypatch, d, **kw)
        rec.save(d / "recording.csv.gz")  # its own timed pass stands in for the timed one
        st = A.load(d / "arguments.json.gz")
        st.cost = {"per_launch_us": 4.2, "per_launch_lo": 3.9, "per_launch_hi": 4.6, "text": "4.20 µs per launch"}
        A.save(st, d / "arguments.json.gz")
        passes[cache] = d
    seen = []

    def run_step(script, family, cache, dtype, out, say=print, capture_cost=True):
        seen.append((Path(script).name, family, cache, dtype))
        wrong = cache == "host-counter"
        d = passes[cache]
        truth = {"outcome": "replays wrong" if wrong else "replays right", "replay_us": 100.0, "eager_us": 300.0,
                 "cause": ({"file": "audit_args_synth.py", "line": cause_line or _rope_line(), "kernel_hint": "rope"}
                           if wrong else None)}
        verdict = check_verdict or truth["outcome"]
        r = {"family": family, "cache": cache, "dtype": dtype, "outcome": truth["outcome"], "truth": truth,
             "replay_us": 100.0, "eager_us": 300.0, "cause": truth["cause"], "recording": str(d / "recording.csv.gz"),
             "arguments": str(d / "arguments.json.gz"), "overhead": A.load(d / "arguments.json.gz").cost,
             "check": {"verdict": verdict, "detail": "6 positions compared", "replay_sync_us": 110.0}}
        folder = Path(out) / f"{family}-{cache}-{dtype}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "engine.json").write_text(json.dumps(r))
        return r

    monkeypatch.setattr(steps, "run_step", run_step)
    return seen


def test_the_steps_folder_lists_its_families_and_leaves_shared_code_out(tmp_path):
    """Every ``*.py`` not starting with ``_`` is a family, its ``--list`` run as a script; ds4lab's own
    families ship as such scripts (prefixed ``ds4lab-``); a folder without any is refused, named."""
    from ds4lab.audit.steps import discover, listing
    from ds4lab.errors import BadInput

    (script,) = discover(SYNTH)
    assert script.name == "synth-counter.py"
    assert listing(script) == {"family": "synth-counter", "caches": ["host-counter", "device-counter"],
                               "dtypes": ["float32"], "script": str(script)}
    shipped = {p.name: p for p in discover()}
    assert {f"ds4lab-{f}.py" for f in ("llama", "deepseek-v3", "qwen2-moe", "mistral", "gemma2", "qwen2",
                                       "handwritten")} <= set(shipped)
    assert not any(n.startswith("_") for n in shipped)
    for name in ("ds4lab-llama.py", "ds4lab-handwritten.py"):  # --list needs no torch: run on the CPU
        ls = listing(shipped[name])
        assert ls["family"] == name[:-3] and ls["dtypes"] == ["float32", "bfloat16"]
    assert listing(shipped["ds4lab-handwritten.py"])["caches"] == ["host-counter", "device-counter", "host-read"]
    with pytest.raises(BadInput, match="no step script"):
        discover(tmp_path)
    (tmp_path / "bad.py").write_text("print('no json')\n")
    with pytest.raises(BadInput, match=r"bad.py --list: exit 0, no \{family, caches, dtypes\}"):
        listing(tmp_path / "bad.py")


def test_each_family_runs_on_the_users_path_and_is_held_to_its_truth(tmp_path, monkeypatch):
    """The synthetic step in both caches: the audit names the truth's outcome; the wrong one leads with its
    true cause (the host position passed to rope, at the line its truth names) and counts the others; the
    right one has no frozen finding; check_replay agrees; the argument cost is carried; a name filters."""
    from ds4lab.jobs.audit import write_report

    seen = _fake_steps(monkeypatch, tmp_path)
    rows = []
    df = V.validate((), (), tmp_path / "v", steps=SYNTH, say=lambda *a: None, on_row=lambda r: rows.append(len(r)),
                    on_report=lambda rep, under: write_report([rep], tmp_path / "v" / under))
    assert rows == [1, 2] and [x[2] for x in seen] == ["host-counter", "device-counter"]
    assert all(x[0] == "synth-counter.py" and x[1] == "synth-counter" for x in seen)
    df = df.set_index("cache")
    wrong, right = df.loc["host-counter"], df.loc["device-counter"]
    assert wrong.audit_verdict == "replays wrong" and right.audit_verdict == "replays right" and df.verdict_agrees.all()
    assert wrong.cause_first and wrong.lead.startswith("rope at ") and "audit_args_synth.py" in wrong.lead
    assert "and 1 other finding(s)" in wrong.audit_why and wrong.cause == f"audit_args_synth.py:{_rope_line()} (rope)"
    assert right.frozen_findings == 0 and not right.frozen_on_right and pd.isna(right.cause_first)
    assert df.check_agrees.all() and list(df.capture_us_per_launch) == [4.2, 4.2]
    assert (tmp_path / "v" / "synth-counter-host-counter-float32" / "audit" / "arguments.csv").is_file()
    md = V.markdown(df.reset_index())
    assert "| rope at " in md and "(yes)" in md and "replays right (agrees)" in md
    only = V.validate(("device-counter",), (), tmp_path / "w", steps=SYNTH, say=lambda *a: None)
    assert list(only.cache) == ["device-counter"]
    with pytest.raises(Exception, match="unknown nope; families: synth-counter"):
        V.validate(("nope",), (), tmp_path / "x", steps=SYNTH, say=lambda *a: None)


def test_a_wrong_replay_led_by_another_cause_or_a_disagreeing_check_fails_the_job(tmp_path, monkeypatch):
    """The truth names another line as the cause, and check_replay says the opposite of torch: the job
    writes its table, then fails naming both."""
    from ds4lab.jobs import audit_validate as J

    _fake_steps(monkeypatch, tmp_path, cause_line=1, check_verdict="replays right")
    monkeypatch.setattr(engines, "available", lambda: (True, ""))
    out = tmp_path / "v"
    with pytest.raises(CheckFailed, match=r"synth-counter/host-counter/float32 \(torch replays wrong, audit replays "
                                          r"wrong.*not led by its true cause, check_replay replays right\)"):
        J.run(J.ValidateConfig(out=out, steps=SYNTH, dtypes=("float32",)), None, None)
    assert (out / "validate.md").is_file()
    df = pd.read_csv(out / "validate.csv").set_index("cache")
    assert not df.loc["host-counter", "cause_first"] and not df.loc["host-counter", "check_agrees"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"].startswith("failed") and meta["cause_first"] == 0


def test_a_frozen_finding_on_a_step_that_replays_right_fails(tmp_path):
    """The rows validate flags: a step torch replays right that got any frozen finding, whatever the
    verdict says; a cause not led with; a check_replay that disagrees; a time outside the tolerance."""
    rows = pd.DataFrame([
        {"verdict_agrees": True, "time_agrees": True, "frozen_on_right": True, "cause_first": None, "check_agrees": True},
        {"verdict_agrees": True, "time_agrees": None, "frozen_on_right": False, "cause_first": True, "check_agrees": True},
        {"verdict_agrees": True, "time_agrees": True, "frozen_on_right": False, "cause_first": False,
         "check_agrees": None},
        {"verdict_agrees": True, "time_agrees": False, "frozen_on_right": False, "cause_first": None,
         "check_agrees": True},
        {"verdict_agrees": True, "time_agrees": True, "frozen_on_right": False, "cause_first": None,
         "check_agrees": False},
    ])
    assert list(V.failures(rows).index) == [0, 2, 3, 4]
    assert V.cause_first({"where": "/u/step.py:131 fwd", "name": "triton_bias_kernel"},
                         {"file": "step.py", "line": 131, "kernel_hint": "BIAS"}) is True
    assert V.cause_first({"where": "/u/step.py:13 fwd", "name": "k"}, {"file": "step.py", "line": 131}) is False
    assert V.cause_first({"where": "/u/step.py:131 fwd", "name": "k"}, {"file": "step.py", "line": 131,
                                                                      "kernel_hint": "bias"}) is False
    assert V.cause_first({"where": "x.py:1 f"}, None) is None


def test_the_true_cause_is_found_on_any_line_of_its_statement(tmp_path):
    """A kernel call written over several lines is reached from its first line, while the truth may name
    the line holding the host value (cupy_kv_row on the H200: the frame at :71, the int at :72)."""
    (tmp_path / "step.py").write_text("x = 1\nkernel((1,), (2,), (a,\n       int(pos), n))\ny = 2\n")
    lead = {"where": "ds4lab/data/steps/step.py:2 write_kv", "name": "write_kv_row"}
    cause = {"file": "step.py", "line": 3, "kernel_hint": "write_kv_row"}
    assert V.cause_first(lead, cause) is False  # the lines alone differ
    assert V.cause_first(lead, cause, tmp_path) is True
    assert V.cause_first({**lead, "where": "step.py:1 f"}, cause, tmp_path) is False  # another statement
    assert V.cause_first({**lead, "where": "step.py:4 f"}, cause, tmp_path) is False


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
    assert df.loc["host-counter", "measured_loop"] == V.BARE_LOOP and df.loc["host-counter", "time_agrees"]
    assert df.loc["host-counter", "host_times"] == "traced"  # no markers pass beside these in-process runs
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


def test_only_the_scripts_a_name_names_are_asked_their_list(tmp_path, monkeypatch):
    """Each ``--list`` is a process (the shipped scripts import torch to answer it): a run of some families
    asks only their scripts; a name no script is named after (a cache, a family named otherwise) asks them all."""
    from ds4lab.audit import steps

    for stem, fam, caches in (("a", "fam-a", ["static"]), ("b", "b", ["static", "dynamic"]), ("c", "c", ["x"])):
        (tmp_path / f"{stem}.py").write_text(
            f"import json\nprint(json.dumps({{'family': {fam!r}, 'caches': {caches!r}, 'dtypes': ['float32']}}))\n")
    asked = []
    real = steps.listing
    monkeypatch.setattr(steps, "listing", lambda s, **k: asked.append(Path(s).stem) or real(s, **k))
    assert [(f, c) for f, c, *_ in V.runs(("b",), (), steps=tmp_path)] == [("b", "static"), ("b", "dynamic")]
    assert asked == ["b"]
    asked.clear()
    assert [(f, c) for f, c, *_ in V.runs(("b", "dynamic"), (), steps=tmp_path)] == [("b", "dynamic")]
    assert asked == ["b"]
    asked.clear()
    assert {(f, c) for f, c, *_ in V.runs(("static",), (), steps=tmp_path)} == {("fam-a", "static"), ("b", "static")}
    assert sorted(asked) == ["a", "b", "c"]
    asked.clear()
    assert [(f, c) for f, c, *_ in V.runs(("fam-a", "c"), (), steps=tmp_path)] == [("fam-a", "static"), ("c", "x")]
    assert asked == ["c", "a", "b", "c"]  # c first (named), then every script for fam-a


def test_a_damaged_arguments_file_is_named_with_its_defect_in_the_verdict(tmp_path):
    """A run whose arguments.csv.gz is cut short: the verdict's why names that file and its defect (not "the
    trace carries no kernel arguments", whose advice would be to record what is there)."""
    import shutil

    from ds4lab.jobs.audit_validate import ValidateConfig, run

    good = Path(__file__).parent / "data" / "audit_args" / "handwritten-host-counter-float32"
    cfg = dict(engines=("handwritten",), caches=("host-counter",), dtypes=("float32",))
    cut = tmp_path / "cut" / good.name
    shutil.copytree(good, cut)
    data = (good / "arguments.csv.gz").read_bytes()
    (cut / "arguments.csv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckFailed):  # the verdict is unknown: it disagrees with torch's
        run(ValidateConfig(**cfg, runs_from=cut.parent, out=tmp_path / "o"))
    row = pd.read_csv(tmp_path / "o" / "validate.csv").iloc[0]
    why = row["audit_why"]
    assert "carries no kernel arguments" not in why
    assert "arguments.csv.gz cannot be read: its compressed stream ends early" in why
