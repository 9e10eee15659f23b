"""A malformed Kineto trace is refused at once with exit 2, naming the file, the event and the field;
a JSON ``NaN`` is named as NaN, not as a cut file; zero- and negative-length kernels are counted and
noted. (Each fails without its fix: a non-numeric ``ts`` was a ValueError, exit 1, with a partial
folder; a NaN was "cut, take the trace again"; negative kernels passed without a word.)"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from audit_fixtures import kineto_events, write_kineto
from ds4lab.audit.sources import SourceError, read
from ds4lab.cli import main


def _doc(events):
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": events}


def test_a_non_numeric_ts_is_refused_naming_the_event_and_field(tmp_path):
    ev = kineto_events(3)
    i = next(k for k, e in enumerate(ev) if e.get("ph") == "X")
    ev[i]["ts"] = "soon"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(_doc(ev)))
    with pytest.raises(SourceError, match=r"'ts' is 'soon', not a number"):
        read(p)
    r = CliRunner().invoke(main, ["audit", str(p), "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "t.json" in r.output and "'ts'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "a").exists()


def test_a_nan_is_named_as_nan_not_as_a_cut_file(tmp_path):
    ev = kineto_events(3)
    i = next(k for k, e in enumerate(ev) if e.get("ph") == "X")
    ev[i]["dur"] = float("nan")
    p = tmp_path / "t.json"
    p.write_text(json.dumps(_doc(ev)))  # Python writes NaN, which JSON has not
    with pytest.raises(SourceError) as e:
        read(p)
    assert "NaN" in str(e.value) and "cut" not in str(e.value)


def test_zero_and_negative_kernels_are_counted_and_noted(tmp_path):
    ev = kineto_events(3)
    ks = [e for e in ev if e.get("cat") == "kernel"]
    ks[0]["dur"], ks[1]["dur"], ks[2]["dur"] = 0, -3.5, -1
    p = tmp_path / "t.json"
    p.write_text(json.dumps(_doc(ev)))
    t = read(p)
    assert any("1 kernel events of zero length and 2 of negative length" in n for n in t.notes), t.notes
    clean = read(write_kineto(tmp_path / "clean.json"))
    assert not any("zero length" in n for n in clean.notes)
