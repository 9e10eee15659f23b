"""Side passes recorded beside a recording are paired with it only when they are runs of the same program
(:mod:`ds4lab.audit.pairing`): an argument pass of another program is refused, as the markers and capture-path
passes are, and the replay verdict is then unknown, with the reason; where the headers do not name the program,
a pass whose tokens launch other kernel counts than the recording's is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ds4lab.audit import frozen as F
from ds4lab.audit.analysis import analyze
from ds4lab.audit.arguments import store_beside
from ds4lab.audit.pairing import check_same_program
from ds4lab.cli import main
from ds4lab.trace.sources import read_events as read

ARGS = Path(__file__).parent / "data" / "audit_args"
KV, CONTROL = ARGS / "cupy_kv_row-default-float32", ARGS / "device_control-default-float32"


def _mismatched(tmp_path: Path) -> Path:
    """cupy_kv_row's recording beside device_control's argument pass (a folder as a user could assemble)."""
    shutil.copy(KV / "recording.csv.gz", tmp_path / "recording.csv.gz")
    for name in ("arguments.csv.gz", "arguments.json.gz"):
        shutil.copy(CONTROL / name, tmp_path / name)
    return tmp_path / "recording.csv.gz"


@pytest.mark.skipif(not KV.is_dir() or not CONTROL.is_dir(), reason="argument fixtures not present")
def test_an_argument_pass_of_another_program_is_refused_and_the_replay_verdict_is_unknown(tmp_path):
    rec = _mismatched(tmp_path)
    r = CliRunner().invoke(main, ["audit", str(rec), "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "replays right" not in text
    assert F.ARGUMENTS_NOT_USED in text and "another program than the recording" in text
    assert "device_control.py" in text and "cupy_kv_row.py" in text
    replay = json.loads((tmp_path / "a" / "meta.json").read_text())["units"][0]["replay"]
    assert replay["verdict"] == F.UNKNOWN and "not a pass of this program" in replay["why"]
    assert not (tmp_path / "a" / "arguments.csv").exists()


@pytest.mark.skipif(not KV.is_dir() or not CONTROL.is_dir(), reason="argument fixtures not present")
def test_a_pass_whose_header_names_no_program_is_refused_where_its_launches_differ(tmp_path):
    rec = _mismatched(tmp_path)
    table = read(rec)
    table.header = {k: v for k, v in table.header.items() if k != "argv"}
    rep = analyze([table])[0]
    F.attach(rep, store_beside(rec), table, rec)
    assert rep.arguments is None
    assert "launch 22 kernels each where the recording's launch 23" in rep.arguments_refused
    assert F.verdict(rep).verdict == F.UNKNOWN


@pytest.mark.skipif(not KV.is_dir(), reason="argument fixtures not present")
def test_the_same_programs_argument_pass_is_still_compared(tmp_path):
    shutil.copytree(KV, tmp_path / "kv")
    rec = tmp_path / "kv" / "recording.csv.gz"
    table = read(rec)
    rep = analyze([table])[0]
    F.attach(rep, store_beside(rec), table, rec)
    assert rep.arguments is not None and not rep.arguments_refused


def test_one_check_names_every_key_that_differs():
    class T:
        def __init__(self, source, **header):
            self.source, self.header = source, header

    with pytest.raises(ValueError, match=r"p\.csv\.gz: recorded from another step .*engine 'a' against 'b'"):
        check_same_program(T("p.csv.gz", engine="a", cache="c"), T("r", engine="b", cache="c"), "step")
    check_same_program(T("p", engine="a"), T("r", cache="x"))  # nothing in common: nothing to tell
