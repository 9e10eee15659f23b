"""``ds4lab tp token|ladder|trace``: the tensor-parallel commands as jobs of the one command line, on two
simulated devices (the ``tiny`` preset; seconds): each writes its result folder; bad input exits 2 before
anything runs."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.jobs import JOBS, execute
from ds4lab.jobs.tp import TPConfig


def test_tp_is_a_job_and_a_command():
    assert "tp" in JOBS and set(main.commands["tp"].commands) == {"token", "ladder", "trace"}


def test_token_against_the_single_gpu_token(tmp_path):
    r = CliRunner().invoke(main, ["tp", "token", "--preset", "tiny", "--tokens", "2", "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "t" / "tp-token.json").read_text())
    assert got["ranks_identical"] is True and got["worst_bound_ratio"] <= 1.0
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["job"] == "tp-token" and meta["status"] == "complete" and meta["reduce"] == "nccl"


def test_ladder_writes_its_table(tmp_path):
    res = execute("tp", TPConfig(command="ladder", preset="tiny", stages="0,3:in", tokens=4, rounds=2, exact_tokens=2,
                                 out=tmp_path / "l"))
    df = pd.read_csv(tmp_path / "l" / "tp-ladder.csv")
    assert list(df.stage) == ["0", "3:in"] and df.exact.all() and df.modeled.all()
    assert res.table("tp-ladder").equals(res.value)


def test_bad_input_exits_2_before_anything_runs(tmp_path):
    r = CliRunner().invoke(main, ["tp", "ladder", "--preset", "tiny", "--stages", "0,9", "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "unknown tensor-parallel stage" in r.output and not (tmp_path / "b").exists()
    r = CliRunner().invoke(main, ["tp", "trace", "--preset", "tiny", "--stage", "7", "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "--stage 7" in r.output
