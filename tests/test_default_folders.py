"""Default result folders: one per command and per what it ran. ``hazards all`` and
``hazards all-longctx`` each have their own; a run into a default folder that holds another
experiment's results (another hazard set, mode, preset, inputs) keeps them whole beside it as
``.replaced-<time>`` instead of replacing them; a rerun of the same experiment replaces as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.jobs.common import default_folder, out_folder
from ds4lab.report.results import job_folder


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def meta_of(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text())


def test_hazard_sets_have_their_own_default_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("sync-memset", "host-scalars"):
        r = cli("hazards", name, "--backend", "sim", "--preset", "tiny")
        assert r.exit_code == 0, r.output
    res = tmp_path / "results"
    assert sorted(p.name for p in res.iterdir()) == ["hazards-host-scalars-tiny-sim", "hazards-sync-memset-tiny-sim"]
    for name in ("sync-memset", "host-scalars"):
        m = meta_of(res / f"hazards-{name}-tiny-sim")
        assert m["hazards"] == [name] and m["ran"]["hazard"] == name


def test_a_default_folder_keeps_another_experiments_results_beside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = tmp_path / "results"
    folder = res / "hazards-sync-memset-tiny-sim"
    assert cli("hazards", "sync-memset", "--backend", "sim", "--preset", "tiny").exit_code == 0
    first = (folder / "hazards.csv").read_text()
    r = cli("hazards", "sync-memset", "--backend", "sim", "--preset", "tiny", "--mode", "global")
    assert r.exit_code == 0, r.output
    (kept,) = res.glob("hazards-sync-memset-tiny-sim.replaced-*")
    assert (kept / "hazards.csv").read_text() == first and meta_of(kept)["ran"]["mode"] == "thread_local"
    assert meta_of(folder)["ran"]["mode"] == "global"
    said = " ".join(r.output.split())  # rich wraps long lines
    assert "kept the earlier results as hazards-sync-memset-tiny-sim.replaced-" in said
    assert "mode='thread_local' (this run: 'global')" in said
    # the same experiment again: replaced, nothing more kept
    assert cli("hazards", "sync-memset", "--backend", "sim", "--preset", "tiny", "--mode", "global").exit_code == 0
    assert len(list(res.glob("*.replaced-*"))) == 1


def test_an_out_given_is_replaced_by_a_rerun_as_before(tmp_path):
    out = tmp_path / "mine"
    for mode in ("thread_local", "global"):
        r = cli("hazards", "sync-memset", "--backend", "sim", "--preset", "tiny", "--mode", mode, "--out", out)
        assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and "ran" not in meta_of(out)


def test_job_folder_ran(tmp_path):
    out = tmp_path / "x"
    for inputs in (["a"], ["a"], ["b"]):
        with job_folder(out, {"job": "t"}, ("t.csv",), say=lambda m: None, ran={"inputs": inputs}) as f:
            (f / "t.csv").write_text(",".join(inputs))
    (kept,) = tmp_path.glob("x.replaced-*")
    assert (kept / "t.csv").read_text() == "a" and (out / "t.csv").read_text() == "b"
    # a folder that records nothing of what it ran (an older ds4lab) is kept too: it cannot be told apart
    old = tmp_path / "old"
    with job_folder(old, {"job": "t"}, ("t.csv",), say=lambda m: None) as f:
        (f / "t.csv").write_text("old")
    with job_folder(old, {"job": "t"}, ("t.csv",), say=lambda m: None, ran={"inputs": ["a"]}) as f:
        (f / "t.csv").write_text("new")
    (kept,) = tmp_path.glob("old.replaced-*")
    assert (kept / "t.csv").read_text() == "old"


@pytest.mark.parametrize("job,parts,want", [
    ("hazards", ("all", "small", "sim"), "results/hazards-all-small-sim"),
    ("hazards", ("all-longctx", "small", "sim"), "results/hazards-all-longctx-small-sim"),
    ("ladder", ("small", "sim", None), "results/ladder-small-sim"),
    ("ladder", ("small", "sim", "longctx"), "results/ladder-small-sim-longctx"),
])
def test_default_folder_names(job, parts, want):
    assert default_folder(job, *parts) == Path(want)
    assert out_folder(None, job, parts, {"preset": "small"}) == (Path(want), {"preset": "small", "job": job})
    assert out_folder("mine", job, parts, {"preset": "small"}) == (Path("mine"), None)


def test_ingest_of_other_inputs_keeps_the_earlier_tables_beside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.004 sort=0.000 gateup=0.021 midq=0.003 down=0.011 "
            "sum=0.002 total=0.041 ms\n")
    for name in ("a.log", "b.log"):
        (tmp_path / name).write_text(line)
        assert cli("ingest", name).exit_code == 0
    (kept,) = (tmp_path / "results").glob("ingested.replaced-*")
    assert "a.log" in (kept / "ds4_moe.csv").read_text()
    assert "b.log" in (tmp_path / "results" / "ingested" / "ds4_moe.csv").read_text()
