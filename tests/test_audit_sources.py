"""The audit's sources: Kineto traces (with and without stacks, plain and gzip), Nsight Systems SQLite
exports of three schema generations, saved tables, detection by content, and every bad input."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import audit_fixtures as F
from ds4lab.trace.events import COLUMNS, EventTable, check_frame
from ds4lab.trace.sources import SourceError, detect
from ds4lab.trace.sources import read_events as read
from ds4lab.trace.sources.saved import write_table
from ds4lab.trace.table import Rows, finish

DATA = Path(__file__).parent / "data" / "audit"
TOKENS = 3
CALLS = 1 + TOKENS * (F.K + 4)  # cudaMalloc once, then per token K launches, memcpy, memset, event record, sync


def table(name):
    return read(DATA / name)


# ----------------------------------------------------------------------------- the committed fixtures
@pytest.mark.parametrize("name", ["kineto_stack.json", "kineto_nostack.json", "kineto_stack.json.gz",
                                  "nsys_2020.sqlite", "nsys_2024.sqlite", "nsys_2026.sqlite"])
def test_every_source_gives_the_same_loop(name):
    t = table(name)
    check_frame(t.frame)
    procs = 2 if name == "nsys_2026.sqlite" else 1
    df = t.frame[t.frame.pid == F.PID]
    k = df[df.kind == "kernel"]
    assert (df.kind == "api").sum() == CALLS
    assert k.name.tolist() == [f"k{i}" for i in range(F.K)] * TOKENS
    assert k.grid.tolist()[:F.K] == [f"{i + 1},1,1" for i in range(F.K)] and (k.block == "128,1,1").all()
    assert (k.stream == F.STREAM).all() and (k.device == 0).all()
    assert ((df.kind == "memcpy").sum(), (df.kind == "memset").sum(), (df.kind == "sync").sum()) == (TOKENS,) * 3
    nv = df[df.kind == "nvtx"]
    assert nv.name.tolist() == ["decode_step"] * TOKENS
    assert len(t.frame.pid.unique()) == procs
    assert t.frame.start_ns.is_monotonic_increasing


@pytest.mark.parametrize("name", ["kineto_stack.json", "nsys_2024.sqlite", "nsys_2020.sqlite"])
def test_api_rows_carry_stream_device_and_the_nvtx_path(name):
    df = table(name).frame
    api = df[df.kind == "api"]
    launches = api[api.name == "cudaLaunchKernel"]
    assert (launches.stream == F.STREAM).all() and (launches.device == 0).all()
    assert (launches.tid == F.TID).all() and (launches.domain.isin(["runtime"])).all()
    assert (launches.nvtx_path == "decode_step").all()
    # every device row was launched by a call the table holds, and takes its NVTX path
    dev = df[df.kind.isin(["kernel", "memcpy", "memset", "sync"])]
    assert dev.correlation.isin(api.correlation).all() and (dev.nvtx_path == "decode_step").all()
    # the one-time allocation of token 0
    assert api[api.name == "cudaMalloc"].shape[0] == 1


def test_kineto_memcpy_sync_and_event_record():
    df = table("kineto_stack.json").frame
    m = df[df.kind == "memcpy"].iloc[0]
    assert (m.copy_kind, m.host_memory, m.bytes) == ("HtoD", "pageable", 4)
    s = df[df.kind == "sync"].iloc[0]
    assert (s.sync_kind, s.stream) == ("stream", F.STREAM)
    rec = df[(df.kind == "api") & (df.name == "cudaEventRecord")].iloc[0]
    assert (rec.stream, rec.event) == (F.STREAM, 5)  # from its cuda_event record


def test_kineto_stacks_from_python_function_frames():
    df = table("kineto_stack.json").frame
    api = df[df.kind == "api"]
    launch = api[api.name == "cudaLaunchKernel"].iloc[0]
    assert launch.stack == "gen.py:10 generate;model.py:20 forward;layer.py:30 step"
    sync = api[api.name == "cudaStreamSynchronize"].iloc[0]
    assert sync.stack == "gen.py:10 generate;<built-in method item of Tensor object>"  # address dropped
    k = df[df.kind == "kernel"].iloc[0]
    assert k.stack == launch.stack  # a kernel says where it was launched from
    nostack = table("kineto_nostack.json")
    assert (nostack.frame["stack"] == "").all()
    assert any("with_stack" in n for n in nostack.notes)


def test_kineto_gz_equals_plain_and_notes_name_what_is_not_tabled():
    a, b = table("kineto_stack.json"), table("kineto_stack.json.gz")
    pd.testing.assert_frame_equal(a.frame, b.frame)
    assert any("'cpu_op'" in n for n in a.notes) and any("gpu_user_annotation" in n for n in a.notes)
    assert a.tool == "pytorch-profiler (Kineto schema 1)"
    assert (a.frame[a.frame.kind == "nvtx"].domain == "torch.record_function").all()


def test_nsys_generations_versions_enums_and_stream_types():
    old, new, newest = table("nsys_2020.sqlite"), table("nsys_2024.sqlite"), table("nsys_2026.sqlite")
    assert old.tool == "nsys-sqlite (schema not recorded)"
    assert new.tool == "nsys-sqlite (schema 3.16.1, Nsight Systems 2024.6.2.225)"
    assert "3.24.14" in newest.tool
    # the 2020 export has no ENUM_CUDA_MEM_KIND: pageable or pinned is unknown, and said so
    assert (old.frame[old.frame.kind == "memcpy"].host_memory == "").all()
    assert any("ENUM_CUDA_MEM_KIND" in n for n in old.notes)
    m = new.frame[new.frame.kind == "memcpy"].iloc[0]
    assert (m.copy_kind, m.host_memory, m["name"]) == ("HtoD", "pageable", "Memcpy HtoD (Pageable -> Device)")
    assert (old.frame[old.frame.kind == "memcpy"].copy_kind == "HtoD").all()
    # legacy stream from TARGET_INFO_CUDA_CONTEXT_INFO.nullStreamId; unknown in 2020
    k = new.frame[new.frame.kind == "kernel"]
    assert (k.stream_type == "legacy").all() and (old.frame.stream_type == "").all()
    assert (k.graph_id == 0).all()  # graphNodeId 0: not launched from a graph
    g = new.frame[new.frame.kind == "graph"]
    assert len(g) == 1 and g.graph_id.iloc[0] == 1 and any("cuda-graph-trace=node" in n for n in new.notes)
    # domain names of NVTX ranges, and the mark left out with a note
    assert (new.frame[new.frame.kind == "nvtx"].domain == "llm").all()
    assert any("NVTX marks" in n for n in new.notes)


def test_nsys_2026_backtrace_rows_skipped_and_processes_apart():
    t = table("nsys_2026.sqlite")
    df = t.frame
    assert any("backtrace" in n for n in t.notes)
    for pid, dev in ((F.PID, 0), (F.PID + 100, 1)):
        p = df[df.pid == pid]
        assert (p[p.kind == "kernel"].device == dev).all()
        assert (p[p.kind == "api"].device == dev).all()  # a one-device process: its calls take that device
        assert (p.kind == "api").sum() == CALLS


def test_nsys_reader_keeps_ingest_working():
    from ds4lab.jobs.ingest import ingest

    res = ingest(DATA / "nsys_2024.sqlite")
    assert {"kernels", "nvtx", "graphs"} <= set(res.tables) and len(res.tables["kernels"]) == TOKENS * F.K


def test_fixture_generator_reproduces_the_committed_files(tmp_path):
    for p in F.write_all(tmp_path):
        a, b = read(p).frame, read(DATA / p.name).frame
        pd.testing.assert_frame_equal(a.drop(columns="stack"), b.drop(columns="stack"))


# ----------------------------------------------------------------------------- saved tables, detection
def test_saved_table_round_trip_with_header(tmp_path, rng):
    t = table("kineto_stack.json")
    p = write_table(t, tmp_path / "t.csv.gz", exit_status=3)
    assert detect(p) == "recording"
    back = read(p)
    pd.testing.assert_frame_equal(back.frame, t.frame)
    assert back.tool == t.tool and any("status 3" in n for n in back.notes)
    # random cells survive too (strings with commas, quotes and semicolons)
    rows = Rows()
    for i in range(50):
        rows.add(kind="api", name=f'cuda"x{rng.integers(0, 9)},y', start_ns=int(rng.integers(0, 1 << 40)),
                 end_ns=-1, stack="a.py:1 f;b.py:2 g")
    t2 = EventTable(finish(rows.frame()), "<recording>", "cupti")
    pd.testing.assert_frame_equal(read(write_table(t2, tmp_path / "r.csv.gz")).frame, t2.frame)


def test_detection_is_by_content(tmp_path):
    for src, name in (("kineto_stack.json", "trace.txt"), ("nsys_2024.sqlite", "export.json"),
                      ("kineto_stack.json.gz", "noext")):
        shutil.copy(DATA / src, tmp_path / name)
    assert detect(tmp_path / "trace.txt") == "kineto"
    assert detect(tmp_path / "export.json") == "nsys-sqlite"
    assert detect(tmp_path / "noext") == "kineto"


# ----------------------------------------------------------------------------- bad input
def test_no_cuda_activity_names_the_file_and_what_it_holds(tmp_path):
    p = tmp_path / "cpu.json"
    ev = [e for e in F.kineto_events(2) if e.get("cat") in ("cpu_op", "python_function", "user_annotation")]
    p.write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(SourceError, match=r"cpu\.json: no CUDA activity at all.*cpu_op"):
        read(p)
    db = tmp_path / "osrt.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE StringIds (id INTEGER, value TEXT); CREATE TABLE OSRT_API (start INT, end INT);")
    con.close()
    with pytest.raises(SourceError, match=r"osrt\.sqlite: an Nsight Systems export without CUDA tables.*OSRT_API"):
        read(db)


def test_truncated_json_names_the_byte_offset(tmp_path):
    full = (DATA / "kineto_stack.json").read_bytes()
    p = tmp_path / "cut.json"
    p.write_bytes(full[: len(full) // 2])
    with pytest.raises(SourceError, match=r"cut\.json: the JSON is cut at byte [\d,]+, after \d+ complete events") as e:
        read(p)
    assert "\n" not in str(e.value), "one line: the parser's drawing of where it stopped is left out"
    g = tmp_path / "cut.json.gz"
    gz = (DATA / "kineto_stack.json.gz").read_bytes()
    g.write_bytes(gz[: len(gz) - 200])
    with pytest.raises(SourceError, match=r"cut\.json\.gz: the (gzip stream is cut|JSON is cut)"):
        read(g)


def test_raw_nsight_report_says_how_to_export(tmp_path, monkeypatch):
    p = tmp_path / "run.nsys-rep"
    p.write_bytes(b"\x00\x01QDSTRM-ish binary")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SourceError, match=r"nsys export --type sqlite --output .*run\.sqlite .*run\.nsys-rep"):
        read(p)


def test_raw_nsight_report_is_exported_when_nsys_is_on_path(tmp_path, monkeypatch):
    """A stand-in ``nsys`` on PATH that writes the export: the audit runs it and reads the result."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    exe = bin_ / "nsys"
    exe.write_text(f"#!/bin/sh\n{shutil.which('cp')} {DATA / 'nsys_2024.sqlite'} \"$5\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_))
    p = tmp_path / "run.qdrep"
    p.write_bytes(b"\x00binary")
    t = read(p)
    assert (t.frame.kind == "kernel").sum() == TOKENS * F.K and Path(t.source).name == "run.sqlite"


def test_not_a_trace(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(SourceError, match=r"x\.csv: not a trace the audit reads"):
        read(p)
    with pytest.raises(SourceError, match="no such file"):
        read(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(SourceError, match="empty file"):
        read(tmp_path / "empty.json")


def test_the_outcome_beside_a_recording_names_the_recording(tmp_path):
    """The outcome .json that sits beside a bundled recording is not a trace: the error says which file
    to give (the .csv.gz beside it), and the command exits 2; so does a recorded run's engine.json."""
    import shlex

    from click.testing import CliRunner

    from ds4lab.audit.engines import recorded
    from ds4lab.cli import main

    rec = recorded("llama", "dynamic")
    side = rec.with_name("torch-llama-dynamic.json")
    with pytest.raises(SourceError) as ei:
        read(side)
    msg = str(ei.value)
    assert msg.startswith(f"{side}: the outcome of a recorded decode loop") and "not its events" in msg
    assert msg.endswith(f"audit the recording beside it: ds4lab audit {shlex.quote(str(rec))}")
    r = CliRunner().invoke(main, ["audit", str(side), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and f"ds4lab audit {shlex.quote(str(rec))}" in " ".join(r.output.split())
    assert not (tmp_path / "out").exists()

    run = tmp_path / "llama-dynamic"  # a recorded run's folder: engine.json beside recording.csv.gz
    run.mkdir()
    shutil.copy(rec, run / "recording.csv.gz")
    (run / "engine.json").write_text(side.read_text())
    with pytest.raises(SourceError, match=r"ds4lab audit \S*llama-dynamic/recording\.csv\.gz$"):
        read(run / "engine.json")
    (run / "recording.csv.gz").unlink()  # nothing beside it: the plain refusal
    with pytest.raises(SourceError, match=r"engine\.json: not a trace the audit reads") as ei:
        read(run / "engine.json")
    assert "audit the recording beside it" not in str(ei.value)


def test_source_error_is_bad_input():
    from ds4lab.errors import BadInput

    assert issubclass(SourceError, BadInput)


# ----------------------------------------------------------------------------- large files: streamed
@pytest.mark.slow
def test_large_trace_is_streamed_in_bounded_memory(tmp_path):
    """A with_stack trace where python_function and cpu_op events outnumber the CUDA ones 10:1 (20:1 in
    the second file). The reader's peak (tracemalloc, after a warm-up read so that imports are not
    counted) grows with the rows it keeps (a few copies of the table while it is sorted and built, and
    24 bytes per Python frame), not with the file's text: both files keep the same rows, the second is
    ~1.8x the bytes, and the peaks are the same (measured: 2.8 MB for 4 000 kept rows, files of 3.4 and
    6.1 MB)."""
    def write(path, tokens, frames_per_call):
        with open(path, "w") as f:
            f.write('{"schemaVersion": 1, "traceEvents": [\n')
            first = True
            for t in range(tokens):
                base = t * 100_000.0
                for i in range(20):
                    at = base + i * 50
                    evs = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": at, "dur": 5.0, "args": {"correlation": t * 100 + i, "cbid": 211}},
                           {"ph": "X", "cat": "kernel", "name": f"kernel_{i}", "pid": 0, "tid": 7, "ts": at + 6,
                            "dur": 3.0, "args": {"correlation": t * 100 + i, "device": 0, "stream": 7,
                                                 "grid": [i + 1, 1, 1], "block": [128, 1, 1]}}]
                    for d in range(frames_per_call):
                        evs.append({"ph": "X", "cat": "python_function", "name": f"mod{d}.py({d}): f{d}", "pid": 1,
                                    "tid": 1, "ts": at - 1 + d * 0.01, "dur": 7.0 - d * 0.02,
                                    "args": {"Python id": d}})
                        evs.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                                    "ts": at, "dur": 1.0, "args": {"External id": 1}})
                    for e in evs:
                        f.write(("" if first else ",\n") + json.dumps(e))
                        first = False
            f.write("\n]}\n")
        return path

    def peak(path):
        tracemalloc.start()
        t = read(path)
        _, pk = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return pk, t

    read(DATA / "kineto_stack.json")  # imports done before measuring
    a = write(tmp_path / "a.json", 100, 5)
    b = write(tmp_path / "b.json", 100, 10)
    (pa, ta), (pb, tb) = peak(a), peak(b)
    assert len(ta.frame) == len(tb.frame) == 100 * 40
    assert (tb.frame[tb.frame.kind == "api"]["stack"].str.count(";") == 9).all()  # ten frames per call
    size_a, size_b = a.stat().st_size, b.stat().st_size
    assert size_b > 1.7 * size_a
    print(f"peak {pa:,} B for {size_a:,} B, {pb:,} B for {size_b:,} B; {len(ta.frame)} rows")
    assert pb < 0.5 * size_b  # never the file's text
    assert pb < 1.2 * pa  # twice the events not tabled: the same peak (frames cost 24 bytes each)
    assert pa < 1000 * len(ta.frame)  # about 0.7 kB per kept row here, fixed costs included


def test_progress_over_bytes_and_rows():
    seen = []
    read(DATA / "kineto_stack.json.gz", progress=lambda done, total: seen.append((done, total)))
    size = (DATA / "kineto_stack.json.gz").stat().st_size
    assert seen and seen[-1] == (size, size)  # over the file's own (compressed) bytes, ending at the total
    from rich.console import Console

    con = Console(file=__import__("io").StringIO(), force_terminal=False)
    t = read(DATA / "nsys_2024.sqlite", progress=con)  # a console: a bar (a small export stays under 20 000 rows)
    assert (t.frame.kind == "kernel").sum() == TOKENS * F.K


def test_an_export_of_unknown_schema_says_what_it_lacks(tmp_path):
    p = tmp_path / "odd.sqlite"
    con = sqlite3.connect(p)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'k');
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, nameId INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (100, 200, 1);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL_V2 (start INT, end INT, shortName INT, deviceId INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL_V2 VALUES (300, 400, 2, 0);
    """)
    con.close()
    t = read(p)
    notes = " ".join(t.notes)
    assert "CUPTI_ACTIVITY_KIND_RUNTIME has no globalTid, correlationId column" in notes
    assert "CUPTI_ACTIVITY_KIND_KERNEL_V2 has no correlationId, streamId, gridX, blockX column" in notes
    k = t.frame[t.frame.kind == "kernel"].iloc[0]
    assert (k["name"], k.stream, k.grid, k.correlation) == ("k", -1, "", -1)  # unknown, never invented
    assert t.frame[t.frame.kind == "api"]["name"].tolist() == ["cudaLaunchKernel"]
