"""Times no trace can hold are refused in one line naming the file, the event or row, the field and the value
(a duration or timestamp past any clock, a cell beyond a 64-bit integer, a negative start); times that are
possible but implausible are read and said in a note (device work starting well before its launch call, launch
calls taking milliseconds: ns written where µs are expected)."""

from __future__ import annotations

import gzip
import re
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from audit_fixtures import write_kineto
from ds4lab.cli import main
from ds4lab.trace.sources import SourceError, read_events

LLAMA = Path(__file__).parents[1] / "ds4lab" / "data" / "audit" / "torch-llama-static.csv.gz"


def _kineto(tmp_path: Path, edit) -> Path:
    doc = json.loads(write_kineto(tmp_path / "k.json", tokens=3).read_text())
    for e in doc["traceEvents"]:
        edit(e)
    (tmp_path / "k.json").write_text(json.dumps(doc))
    return tmp_path / "k.json"


def _set_first(cat, field, value):
    done = []

    def edit(e):
        if e.get("cat") == cat and not done:
            e[field] = value
            done.append(1)
    return edit


@pytest.mark.parametrize("cat,field,value", [("kernel", "dur", 1e300), ("user_annotation", "ts", 1e18)])
def test_a_kineto_time_past_any_clock_is_refused_naming_the_event(tmp_path, cat, field, value):
    path = _kineto(tmp_path, _set_first(cat, field, value))
    shown = re.escape(f"{value:g}")
    with pytest.raises(SourceError, match=rf"k\.json: traceEvents\[\d+\] \({cat} .*field '{field}' is {shown} µs"):
        read_events(path)
    r = CliRunner().invoke(main, ["audit", str(path), "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "OverflowError" not in r.output and f"field '{field}'" in r.output


def _saved(tmp_path: Path, row: int, value: str) -> Path:
    lines = gzip.open(LLAMA, "rt").read().splitlines()
    cols = lines[1].split(",")
    f = lines[2 + row].split(",")
    assert f[0] == "api"  # a row without quoted commas
    f[cols.index("start_ns")] = value
    lines[2 + row] = ",".join(f)
    path = tmp_path / "rec.csv.gz"
    with gzip.open(path, "wt") as out:
        out.write("\n".join(lines) + "\n")
    return path


def test_a_saved_cell_beyond_a_64_bit_integer_is_named_as_overflow(tmp_path):
    path = _saved(tmp_path, 0, "9" * 25)
    with pytest.raises(SourceError, match=r"rec\.csv\.gz: row 1 \(line 3\): field 'start_ns' is 9+, beyond a 64-bit"):
        read_events(path)


def test_a_saved_negative_start_is_refused_naming_row_field_and_value(tmp_path):
    path = _saved(tmp_path, 0, "-1796213000205625223")
    with pytest.raises(SourceError, match=r"rec\.csv\.gz: row 1 \(api .*field 'start_ns' is -1,796,213,000,205,625,223 "
                                          r"ns \(negative"):
        read_events(path)


def test_device_work_long_before_its_launch_call_is_noted(tmp_path):
    path = _kineto(tmp_path, lambda e: e.update(ts=e["ts"] - 1000.0) if e.get("cat") == "kernel" else None)
    t = read_events(path)
    assert any("start before the call that launched them" in n for n in t.notes)


def test_launch_calls_taking_milliseconds_are_noted_as_a_likely_unit_slip(tmp_path):
    def scale(e):
        if "ts" in e and e.get("ph") == "X":
            e["ts"], e["dur"] = e["ts"] * 1000.0, e["dur"] * 1000.0
    t = read_events(_kineto(tmp_path, scale))
    assert any("may be in ns where µs are expected" in n for n in t.notes)
    good = read_events(write_kineto(tmp_path / "g.json", tokens=3))
    assert not any("µs are expected" in n or "before the call" in n for n in good.notes)


def test_a_kineto_trace_whose_ts_are_negative_is_audited_as_the_same_trace_shifted(tmp_path):
    """Chrome trace ``ts`` relative to a base before the events (all negative): every time is shifted by one amount,
    said in a note, and the audit's verdict and token times are those of the trace as written from zero."""
    good = write_kineto(tmp_path / "g.json", tokens=3)
    doc = json.loads(good.read_text())
    last = max(e["ts"] for e in doc["traceEvents"] if "ts" in e)
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] -= last + 10.0
    neg = tmp_path / "n.json"
    neg.write_text(json.dumps(doc))
    t = read_events(neg)
    assert t.frame["start_ns"].min() == 0
    assert any("negative ts" in n and "shifted" in n for n in t.notes)
    outs = {}
    for name, path in (("g", good), ("n", neg)):
        r = CliRunner().invoke(main, ["audit", str(path), "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        tok = pd.read_csv(tmp_path / name / "tokens.csv").drop(columns=["source"])
        outs[name] = tok.drop(columns=[c for c in tok if c.startswith("start")]).to_csv()
        line = [x for x in r.output.splitlines() if "replay (" in x]
        outs[name + "_verdict"] = line
    assert outs["g"] == outs["n"] and outs["g_verdict"] == outs["n_verdict"] and outs["g_verdict"]


def test_kernels_that_overlap_on_one_stream_are_noted(tmp_path):
    """A stream runs its kernels one after another: kernels written twice 0.5 µs apart, or one kernel lasting 1e9 µs
    inside a 200 µs token, are read as written and said in a note; the trace as recorded gets no such note."""
    assert not any("still runs" in n for n in read_events(write_kineto(tmp_path / "g.json", tokens=3)).notes)
    doc = json.loads(write_kineto(tmp_path / "k.json", tokens=3).read_text())
    doc["traceEvents"] += [dict(e, ts=e["ts"] + 0.5) for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    (tmp_path / "twice.json").write_text(json.dumps(doc))
    t = read_events(tmp_path / "twice.json")
    assert any("start while an earlier kernel of their stream still runs" in n for n in t.notes)
    t = read_events(_kineto(tmp_path, _set_first("kernel", "dur", 1e9)))
    assert any("still runs (by up to 999,99" in n for n in t.notes), t.notes
