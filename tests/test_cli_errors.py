"""User mistakes get a clear error naming the value and exit status 2, before any work; a job's
folder says whether its run completed (``meta.json`` status), and a rerun never mixes with the
files of an earlier one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ds4lab.report import results
from ds4lab.backends.cupy_backend import gpu_usable
from ds4lab.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "taken"
    f.write_text("not a folder")
    return f


@pytest.mark.parametrize("cmd", [
    ("ladder", "--backend", "sim", "--preset", "tiny"),
    ("ladder", "--backend", "sim", "--preset", "tiny", "--hazard", "device-sync"),
    ("moe", "--backend", "sim", "--preset", "tiny", "--tokens-per-step", "1", "--routing", "uniform"),
    ("conformance", "--backend", "sim", "--scenario", "sync_memset_escapes[global]"),
    ("exclusion", "--backend", "sim"),
], ids=lambda c: " ".join(c[:1] + c[-2:]))
@pytest.mark.parametrize("below", [False, True], ids=["file", "below-a-file"])
def test_out_that_is_a_file(cmd, below, a_file):
    out = a_file / "x" if below else a_file
    r = invoke(*cmd, "--out", out)
    assert r.exit_code == 2, r.output
    assert "cannot write results to" in r.output and ("is a file" in r.output or "existing file" in r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert a_file.read_text() == "not a folder"


@pytest.mark.parametrize("args,needle", [
    (("--stages", "0,7"), "unknown stage(s) 7"),
    (("--stages", "0,3,0"), "stage(s) 0 listed more than once"),
    (("--tokens", "3000000000"), "int32"),
])
def test_ladder_bad_request(args, needle, tmp_path):
    r = invoke("ladder", "--backend", "sim", "--preset", "tiny", *args, "--out", tmp_path / "o")
    assert r.exit_code == 2 and needle in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_moe_token_count_above_the_preset(tmp_path):
    r = invoke("moe", "--backend", "sim", "--preset", "tiny", "--tokens-per-step", "1,100000", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "--tokens-per-step 100000" in r.output and "max_tokens" in r.output, r.output


def test_conformance_unknown_scenario(tmp_path):
    r = invoke("conformance", "--backend", "sim", "--scenario", "no_such_thing", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "no_such_thing" in r.output, r.output


@pytest.mark.skipif(gpu_usable()[0], reason="a GPU is usable here")
def test_conformance_on_cupy_without_a_gpu_is_an_error(tmp_path):
    r = invoke("conformance", "--backend", "cupy", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "cupy" in r.output, r.output
    assert not (tmp_path / "o" / "conformance.csv").exists()


def test_job_folder_statuses_and_earlier_outputs(tmp_path):
    out = tmp_path / "job"
    meta = {"job": "t"}
    with results.job_folder(out, meta, ("summary.csv",)) as f:
        (f / "summary.csv").write_text("run 1")
    (out / "keep.txt").write_text("not ours")
    with results.job_folder(out, meta, ("summary.csv",)) as f:
        assert json.loads((f / "meta.json").read_text())["status"] == "running"
        assert (out / "summary.csv").read_text() == "run 1", "the earlier run's output stays until this one succeeds"
    assert json.loads((out / "meta.json").read_text())["status"] == "complete"
    assert not (out / "summary.csv").exists(), "this run wrote no summary: the earlier one does not pass for it"
    assert (out / "keep.txt").exists()
    with pytest.raises(KeyboardInterrupt):
        with results.job_folder(out, meta):
            raise KeyboardInterrupt
    assert json.loads((out / "meta.json").read_text())["status"] == "complete"
    (stopped,) = tmp_path.glob("job.interrupted-*")
    assert json.loads((stopped / "meta.json").read_text())["status"] == "interrupted"
    with pytest.raises(RuntimeError):
        with results.job_folder(tmp_path / "fresh", meta):
            raise RuntimeError("out of memory")
    assert json.loads((tmp_path / "fresh" / "meta.json").read_text())["status"] == "failed: RuntimeError: out of memory"


def test_ladder_without_stage_0_says_what_gains_are_against(tmp_path):
    r = invoke("ladder", "--backend", "sim", "--preset", "tiny", "--stages", "1,3", "--tokens", "4", "--repeats", "2",
               "--exact-tokens", "0", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "gains (×) are against stage 1" in r.output
    import pandas as pd

    df = pd.read_csv(tmp_path / "o" / "ladder.csv")
    assert set(df["speedup_vs"].astype(str)) == {"1"} and df["speedup"].iloc[0] == pytest.approx(1.0)
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["status"] == "complete"


def test_hazard_expectation_follows_the_capture_mode():
    from ds4lab.experiments.hazards import HAZARDS

    hz = HAZARDS["alloc-in-capture"]
    assert "global and thread-local" in hz.expected("global")
    assert "relaxed capture permits cudaMalloc" in hz.expected("relaxed")
    assert HAZARDS["device-sync"].expected("relaxed") == HAZARDS["device-sync"].expected("global")


@pytest.mark.parametrize("args", [["compare", "results", "--out", ""], ["ingest", "README.md", "--out", ""],
                                  ["notebooks", "00", "--out", ""]])
def test_an_empty_out_is_refused_by_every_command_that_writes(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "current directory" in r.output
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_one_folder_holds_one_job(tmp_path):
    out = tmp_path / "mix"
    assert invoke("ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0", "--tokens", "2", "--repeats", "1",
                  "--exact-tokens", "0", "--out", out).exit_code == 0
    r = invoke("run", "--backend", "numpy", "--preset", "tiny", "--tokens", "1", "--warmup", "0", "--out", out)
    assert r.exit_code == 2 and "holds the results of ds4lab ladder" in r.output
    assert json.loads((out / "meta.json").read_text())["job"] == "ladder"  # the ladder's results untouched


@pytest.mark.parametrize("args, needle", [
    (["moe", "--backend", "sim", "--preset", "tiny", "--tokens-per-step", "1", "--n-layers", "99"], "--n-layers 99"),
    (["exclusion", "--backend", "sim", "--preset", "tiny", "--tokens", "100000"], "--tokens 100000"),
    (["context", "--backend", "sim", "--preset", "tiny", "--contexts", "1024,1024"], "more than once"),
    (["context", "--backend", "sim", "--preset", "tiny", "--contexts", "5000000"], "max_context"),
    (["ladder", "--backend", "sim", "--start-pos", "2147483600"], "--start-pos 2147483600")])
def test_bad_values_are_refused_before_any_work(args, needle, tmp_path):
    r = invoke(*args, "--out", tmp_path / "o")
    assert r.exit_code == 2 and needle in r.output, r.output
    assert not (tmp_path / "o" / "meta.json").exists()


def test_presets_fit_a_terminal_and_keep_their_descriptions():
    """``ds4lab presets``: the dimensions as one table, each preset's long descriptions (its routed
    MoE) below it, so no line runs hundreds of characters wide and nothing is cut."""
    from ds4lab.token.config import PRESETS

    r = CliRunner().invoke(main, ["presets"])
    assert r.exit_code == 0
    assert max(len(line) for line in r.output.splitlines()) <= 160
    for name, p in PRESETS.items():
        assert f"  {name}: {p.summary()['routed_moe']}" in r.output


@pytest.mark.parametrize("cmd", [("notebooks", "--list"), ("presets",), ("conformance", "--list"),
                                 ("hazards", "--help")], ids=" ".join)
def test_a_listing_into_a_closed_pipe_exits_141_without_a_traceback(cmd):
    """``ds4lab notebooks --list | head -1``: the commands that print without a job stop as a process
    ended by SIGPIPE does (141), as the jobs do, not with click's silent status 1. The pipe is closed
    before the command starts, so every write finds it closed."""
    repo = Path(__file__).resolve().parents[1]
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "ds4lab.cli", *cmd], stdout=w, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONPATH=str(repo)), cwd=repo, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141, p.stderr
    assert "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr


def test_an_interrupt_before_any_folder_says_nothing_was_written(capsys):
    """Ctrl-C before a job has a result folder: no "results so far are kept" (there are none)."""
    from ds4lab.cli.support import interrupted

    with pytest.raises(SystemExit) as e:
        interrupted(KeyboardInterrupt())
    err = capsys.readouterr().err
    assert e.value.code == 130 and "before any result was written" in err and "kept" not in err.replace(
        "untouched", "")
    exc = KeyboardInterrupt()
    exc.kept_in = "results/x"
    with pytest.raises(SystemExit):
        interrupted(exc)
    assert "results so far are kept in results/x/" in capsys.readouterr().err
