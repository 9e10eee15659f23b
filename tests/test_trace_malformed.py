"""Malformed events in every trace reader: refused as bad input (exit 2, no result folder) naming the file,
the event or row and the field; a JSON ``NaN`` named as ``NaN`` (a whole file, not a cut one); kernels of
negative or zero length counted and noted."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.errors import BadInput
from ds4lab.trace.sources import SourceError, read_events


def kineto(*kernels, api=True):
    """A small Kineto trace: one cudaLaunchKernel per kernel ``(name, ts, dur)``, correlated."""
    ev = []
    for i, (name, ts, dur) in enumerate(kernels, 1):
        if api:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                       "ts": ts - 5, "dur": 3, "args": {"correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                   "args": {"device": 0, "stream": 7, "correlation": i}})
    return {"schemaVersion": 1, "traceEvents": ev}


def test_a_well_formed_trace_reads(tmp_path):
    p = tmp_path / "ok.json"
    p.write_text(json.dumps(kineto(("k0", 100.0, 2.0), ("k1", 110.0, 2.0))))
    t = read_events(p)
    assert (t.frame.kind == "kernel").sum() == 2 and not any("negative" in n or "zero length" in n for n in t.notes)


def test_a_non_numeric_ts_names_the_file_event_and_field(tmp_path):
    d = kineto(("k0", 100.0, 2.0), ("k1", 110.0, 2.0))
    d["traceEvents"][3]["ts"] = "11O.0"  # a letter O: once ValueError: could not convert string to float (exit 1)
    p = tmp_path / "bad_ts.json"
    p.write_text(json.dumps(d))
    with pytest.raises(SourceError, match=r"bad_ts\.json: traceEvents\[3\] \(kernel 'k1'\): field 'ts' is '11O\.0'"):
        read_events(p)
    d["traceEvents"][3]["ts"] = 110.0
    d["traceEvents"][2]["dur"] = "NaN"
    p.write_text(json.dumps(d))
    with pytest.raises(SourceError, match=r"traceEvents\[2\] \(cuda_runtime 'cudaLaunchKernel'\): field 'dur' is NaN"):
        read_events(p)
    d["traceEvents"][2]["dur"] = True
    p.write_text(json.dumps(d))
    with pytest.raises(BadInput, match=r"field 'dur' is True"):
        read_events(p)


def test_the_audit_command_exits_2_and_leaves_no_folder(tmp_path):
    d = kineto(("k0", 100.0, 2.0))
    d["traceEvents"][1]["ts"] = "later"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["audit", str(p), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "bad.json: traceEvents[1]" in r.output and "field 'ts'" in r.output
    assert not out.exists() and not any(tmp_path.glob(".out*"))  # no partial folder, no staging left


@pytest.mark.parametrize("gz", [False, True])
def test_a_whole_file_holding_nan_is_named_not_called_cut(tmp_path, gz):
    d = kineto(("k0", 100.0, 2.0), ("k1", 110.0, 2.0))
    d["traceEvents"][3]["dur"] = float("nan")
    text = json.dumps(d).encode()  # Python's json writes NaN, which JSON does not allow
    assert b"NaN" in text
    p = tmp_path / ("nan.json.gz" if gz else "nan.json")
    p.write_bytes(gzip.compress(text) if gz else text)
    with pytest.raises(SourceError) as ei:
        read_events(p)
    msg = str(ei.value)
    assert "traceEvents[3]: field 'dur' is NaN" in msg and "not cut off" in msg
    assert "take the trace again" not in msg and "is cut" not in msg
    d["traceEvents"][3]["dur"] = float("-inf")
    p.write_bytes(json.dumps(d).encode())
    with pytest.raises(SourceError, match=r"traceEvents\[3\]: field 'dur' is -Infinity"):
        read_events(p)


def test_a_cut_file_is_still_called_cut(tmp_path):
    text = json.dumps(kineto(("k0", 100.0, 2.0), ("k1", 110.0, 2.0))).encode()
    p = tmp_path / "cut.json"
    p.write_bytes(text[: len(text) - 40])
    with pytest.raises(SourceError, match=r"(?s)cut\.json: the JSON is cut at byte .* take the trace again"):
        read_events(p)


def test_negative_and_zero_length_kernels_are_counted_and_noted(tmp_path):
    p = tmp_path / "neg.json"
    p.write_text(json.dumps(kineto(("k0", 100.0, -2.0), ("k1", 110.0, 0.0), ("k2", 120.0, -1.0), ("k3", 130.0, 1.0))))
    t = read_events(p)
    k = t.frame[t.frame.kind == "kernel"]
    assert len(k) == 4 and (k.end_ns >= k.start_ns).all()
    neg = [n for n in t.notes if "negative duration" in n]
    zero = [n for n in t.notes if "zero length" in n]
    assert len(neg) == 1 and neg[0].startswith("2 kernels of negative duration") and "'k0'" in neg[0]
    assert len(zero) == 1 and zero[0].startswith("1 kernels of zero length")


def nsys_export(path, kernels):
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId INT, streamId INT, correlationId INT,
            globalPid INT, demangledName INT, gridX INT, gridY INT, gridZ INT, blockX INT, blockY INT, blockZ INT,
            graphNodeId INT);""")
    con.execute("INSERT INTO StringIds VALUES (1, 'k')")
    for i, (s, e) in enumerate(kernels):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, ?, 1, 1, 1, 1, 32, 1, 1, 0)",
                    (s, e, i + 1, 5 << 24))
    con.commit()
    con.close()


def test_an_nsys_export_with_a_time_that_is_not_a_number_is_refused(tmp_path):
    p = tmp_path / "bad.sqlite"
    nsys_export(p, [(100, 200), ("soon", 400), (500, 600)])  # once ValueError: invalid literal for int() (exit 1)
    with pytest.raises(SourceError, match=r"bad\.sqlite: CUPTI_ACTIVITY_KIND_KERNEL row 2: field start is 'soon'"):
        read_events(p)
    q = tmp_path / "frac.sqlite"
    nsys_export(q, [(100, 200), (300, 400.5)])
    with pytest.raises(SourceError, match=r"row 2: field end is 400\.5"):
        read_events(q)
    r = tmp_path / "null.sqlite"
    nsys_export(r, [(None, 200)])  # once read as start -1, "the source does not say": a kernel without a time
    with pytest.raises(SourceError, match=r"row 1: field start is None"):
        read_events(r)


def test_negative_kernels_in_an_nsys_export_are_noted(tmp_path):
    p = tmp_path / "neg.sqlite"
    nsys_export(p, [(100, 200), (300, 250), (400, 400)])  # once check_frame's ValueError (exit 1)
    t = read_events(p)
    assert any(n.startswith("1 kernels of negative duration") for n in t.notes)
    assert any(n.startswith("1 kernels of zero length") for n in t.notes)


def test_a_saved_table_with_a_cell_that_is_not_a_number_names_row_and_field(tmp_path):
    """A saved table (plain here: the reader takes plain or gzip) whose integer cell is not a whole number."""
    from ds4lab.trace.events import COLUMNS, make_frame
    from ds4lab.trace.sources.saved import MAGIC

    df = make_frame([{"kind": "kernel", "name": f"k{i}", "start_ns": 100 * i, "end_ns": 100 * i + 50} for i in range(3)])
    df = df.astype({"start_ns": object})
    head = MAGIC.decode() + json.dumps({"source": "rec", "tool": "cupti", "notes": [], "columns": list(COLUMNS)}) + "\n"
    saved = tmp_path / "rec.csv"
    for cell, named in (("NaN", "NaN"), ("soon", "'soon'")):  # NaN once pandas' "Integer column has NA values"
        df.loc[1, "start_ns"] = cell
        saved.write_text(head + df.to_csv(index=False))
        with pytest.raises(SourceError, match=rf"rec\.csv: row 2 \(line 4\): field 'start_ns' is {named}, not a whole"):
            read_events(saved)


def test_a_saved_table_whose_gzip_stream_ends_early_is_named_as_not_saved_whole(tmp_path):
    from pathlib import Path

    from ds4lab.trace.sources import read_events

    good = Path(__file__).parent / "data" / "audit_args" / "handwritten-host-counter-float32" / "recording.csv.gz"
    cut = tmp_path / "recording.csv.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(SourceError, match=r"recording\.csv\.gz: its compressed stream ends early \([\d,]+ bytes on disk"):
        read_events(cut)
