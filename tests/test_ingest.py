"""ds4lab ingest: each format from files written from its specification, good and malformed."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from ds4lab.jobs.ingest import ingest, ingest_all
from ds4lab.trace.sources import SourceError, detect

DS4_OK = ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.004 sort=0.000 gateup=0.021 midq=0.003 "
          "down=0.011 sum=0.002 total=0.041 ms")
DS4_BATCH = ("ds4: CUDA MoE profile tokens=64 pairs=384 xq=0.010 sort=0.035 gateup=0.310 midq=0.020 "
             "down=0.150 sum=0.012 total=0.537 ms")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_ds4_log_with_other_lines(tmp_path):
    p = write(tmp_path, "run.txt", "\n".join([
        "ds4: loading model ...", DS4_OK, "some other output", DS4_BATCH, "ds4: generated 40 tokens"]))
    assert detect(p) == "ds4-log"
    df = ingest(p).tables["ds4_moe"]
    assert len(df) == 14 and set(df.stage) == {"xq", "sort", "gateup", "midq", "down", "sum", "total"}
    assert df[(df.token == 1) & (df.stage == "gateup")].ms.item() == pytest.approx(0.310)
    assert df[df.token == 1].tokens.unique().tolist() == [64]


@pytest.mark.parametrize("bad,why", [
    ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.004 sort=0.0 gateup=0.02 midq=0.003 down=0.01 total=0.04 ms",
     "malformed"),  # a stage missing
    ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=abc sort=0 gateup=0 midq=0 down=0 sum=0 total=0 ms", "malformed"),
    ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=. sort=0 gateup=0 midq=0 down=0 sum=0 total=0 ms",
     r"malformed .*xq='\.' is not a number"),  # once a float() ValueError traceback
    ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=1 sort=e gateup=0 midq=0 down=0 sum=0 total=0 ms",
     r"sort='e' is not a number"),
    ("ds4: CUDA MoE profile tokens=4 pairs=7 xq=1 sort=0 gateup=0 midq=0 down=0 sum=0 total=1 ms", "multiple"),
    ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=-1 sort=0 gateup=0 midq=0 down=0 sum=0 total=1 ms", "negative"),
])
def test_ds4_log_malformed_line(tmp_path, bad, why):
    p = write(tmp_path, "run.txt", "\n".join([DS4_OK, "noise", bad, DS4_OK]))
    with pytest.raises(SourceError, match=rf"run.txt:3: .*{why}"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert len(r.tables["ds4_moe"]) == 14  # the two good lines
    assert [q["line"] for q in r.problems] == [3]


NSYS = '''Generating SQLite file report.sqlite from report.nsys-rep
Processing [report.sqlite] with [/opt/nvidia/nsight-systems/reports/cuda_gpu_kern_sum.py]...

"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"45.2","1,234,567","43","28,710.9","28,704.0","28,512","29,120","120.5","moe_gateup_decode"
"20.1","548,000","43","12,744.2","12,736.0","12,640","12,992","80.1","q8_matvec"

Processing [report.sqlite] with [/opt/nvidia/nsight-systems/reports/nvtx_sum.py]...

"Time (%)","Total Time (us)","Instances","Avg (us)","Med (us)","Min (us)","Max (us)","StdDev (us)","Style","Range"
"60.0","8,875.2","1","8,875.2","8,875.2","8,875.2","8,875.2","0.0","PushPop","token"
"40.0","120.5","43","2.8","2.8","2.5","3.3","0.2","PushPop","moe"
'''


def test_nsys_csv_two_reports_units_and_separators(tmp_path):
    p = write(tmp_path, "stats.csv", NSYS)
    assert detect(p) == "nsys-csv"
    r = ingest(p)
    k, n = r.tables["nsys_kernels"], r.tables["nsys_nvtx"]
    assert k.name.tolist() == ["moe_gateup_decode", "q8_matvec"]
    assert k.total_time_us[0] == pytest.approx(1234.567)  # ns → µs, separators removed
    assert k.instances[0] == 43
    assert n[n.name == "token"].total_time_us.item() == pytest.approx(8875.2)  # already µs


@pytest.mark.parametrize("row,why", [
    ('"20.1","548,000","43","12,744.2","12,736.0","12,640","12,992","80.1"', "fields"),
    ('"20.1","lots","43","12,744.2","12,736.0","12,640","12,992","80.1","q8_matvec"', "bad number"),
])
def test_nsys_csv_malformed_row(tmp_path, row, why):
    text = NSYS.replace('"20.1","548,000","43","12,744.2","12,736.0","12,640","12,992","80.1","q8_matvec"', row)
    p = write(tmp_path, "stats.csv", text)
    line = text.splitlines().index(row) + 1
    with pytest.raises(SourceError, match=rf"stats.csv:{line}: .*{why}"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert len(r.tables["nsys_kernels"]) == 1 and r.problems[0]["line"] == line


def make_sqlite(path, bad_kernel=False):
    con = sqlite3.connect(path)
    con.execute("create table StringIds (id integer primary key, value text)")
    con.executemany("insert into StringIds values (?, ?)", [(1, "moe_gateup_decode"), (2, "q8_matvec"), (3, "moe")])
    con.execute("create table CUPTI_ACTIVITY_KIND_KERNEL (start integer, end integer, deviceId integer, "
                "streamId integer, graphId integer, graphNodeId integer, shortName integer, demangledName integer)")
    rows = [(1000, 29000, 0, 7, 0, 0, 1, 1), (30000, 42000, 0, 7, 5, 11, 2, 2)]
    if bad_kernel:
        rows.append((50000, 40000, 0, 7, 0, 0, 2, 2))
    con.executemany("insert into CUPTI_ACTIVITY_KIND_KERNEL values (?,?,?,?,?,?,?,?)", rows)
    con.execute("create table NVTX_EVENTS (start integer, end integer, eventType integer, text text, "
                "textId integer, domainId integer)")
    con.executemany("insert into NVTX_EVENTS values (?,?,?,?,?,?)",
                    [(500, 45000, 59, None, 3, 1), (600, None, 34, "a mark", None, 1)])
    con.commit()
    con.close()


def test_nsys_sqlite(tmp_path):
    p = tmp_path / "report.bin"  # the name says nothing: the content does
    make_sqlite(p)
    assert detect(p) == "nsys-sqlite"
    r = ingest(p)
    k = r.tables["kernels"]
    assert k.name.tolist() == ["moe_gateup_decode", "q8_matvec"]
    assert k.us.tolist() == [28.0, 12.0]
    assert k.graphId.tolist() == [0, 5] and k.graphNodeId.tolist() == [0, 11]
    n = r.tables["nvtx"]
    assert n.name.tolist() == ["moe"] and n.us.item() == pytest.approx(44.5)  # the mark has no range


def test_nsys_sqlite_bad_row(tmp_path):
    p = tmp_path / "r.sqlite"
    make_sqlite(p, bad_kernel=True)
    with pytest.raises(SourceError, match=r"r.sqlite:3: kernel row"):
        ingest(p)
    assert len(ingest(p, lenient=True).tables["kernels"]) == 2


def test_ds4lab_folder_and_ingest_all(tmp_path):
    d = tmp_path / "h200"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "device": "NVIDIA H200", "measured": True}))
    (d / "ladder.csv").write_text("stage,us_median\n0,10524\n3,8875\n")
    log = write(tmp_path, "log.txt", DS4_OK + "\n")
    out = tmp_path / "out"
    ingest_all([d, log], out)
    lad = (out / "ds4lab_ladder.csv").read_text()
    assert "NVIDIA H200" in lad and "8875" in lad
    assert (out / "ds4_moe.csv").exists()


def test_unknown_input_is_an_error(tmp_path):
    p = write(tmp_path, "x.txt", "hello\nworld\n")
    with pytest.raises(SourceError, match="x.txt: not a ds4 MoE profile log"):
        detect(p, want="tables")
    with pytest.raises(SourceError, match="x.txt: not a trace or profile ds4lab reads"):
        detect(p)
    with pytest.raises(SourceError, match="no such file"):
        detect(tmp_path / "missing")


def test_cli_ingest_and_compare(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    log = write(tmp_path, "log.txt", "\n".join([DS4_OK, "ds4: CUDA MoE profile tokens=oops", DS4_BATCH]))
    r = CliRunner().invoke(main, ["ingest", str(log), "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "log.txt:2" in r.stderr  # bad input: 2, as everywhere in the CLI
    assert not (tmp_path / "a").exists()  # nothing written
    r = CliRunner().invoke(main, ["ingest", str(log), "--lenient", "--out", str(tmp_path / "a")])
    assert r.exit_code == 3 and (tmp_path / "a" / "ds4_moe.csv").exists()
    assert (tmp_path / "a" / "ingest_problems.csv").read_text().count("log.txt") == 1
    d = tmp_path / "b"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "device": "NVIDIA H200", "measured": True}))
    (d / "ladder.csv").write_text("stage,us_median\n0,10524\n3,8875\n")
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(d), "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "c" / "compare_ladder.png").exists() and (tmp_path / "c" / "compare_moe.svg").exists()


# ----------------------------------------------------------------------------- user mistakes: errors, never tracebacks
def cli(*args):
    from click.testing import CliRunner

    from ds4lab.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback
    return r


def test_cli_ingest_bad_number_is_reported_with_file_and_line(tmp_path):
    bad = "ds4: CUDA MoE profile tokens=1 pairs=6 xq=. sort=0 gateup=0 midq=0 down=0 sum=0 total=0 ms"
    log = write(tmp_path, "prof.log", "\n".join([DS4_OK, bad, DS4_BATCH]) + "\n")
    r = cli("ingest", log, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "prof.log:2" in r.stderr and "xq='.'" in r.stderr
    r = cli("ingest", log, "--lenient", "--out", tmp_path / "o")
    assert r.exit_code == 3 and "skipped" in r.stderr and "prof.log:2" in r.stderr
    import pandas as pd

    df = pd.read_csv(tmp_path / "o" / "ds4_moe.csv")
    assert sorted(df.tokens.unique()) == [1, 64] and len(df) == 14  # both good lines kept


@pytest.mark.parametrize("text,why", [
    ('{"ds4lab": "0.1.0", "device": ', r"meta.json:1: broken JSON"),
    ('{\n  "ds4lab": "0.1.0",\n  "device": "H200"\n  "measured": true\n}', r"meta.json:4: broken JSON"),
    ('["ds4lab", "NVIDIA H200"]', r"meta.json: a JSON array, not the object"),
    ('"ds4lab"', r"meta.json: a JSON string"),
    ("", r"meta.json: empty file"),
])
def test_ds4lab_folder_with_broken_meta(tmp_path, text, why):
    d = tmp_path / "run"
    d.mkdir()
    (d / "meta.json").write_text(text)
    (d / "ladder.csv").write_text("stage,us_median\n0,10\n")
    with pytest.raises(SourceError, match=why):
        ingest(d)
    with pytest.raises(SourceError, match=why):  # lenient cannot read an unreadable folder either
        ingest(d, lenient=True)
    r = cli("ingest", d, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "meta.json" in r.stderr and not (tmp_path / "o").exists()


def test_ds4lab_folder_records_status_and_warns(tmp_path):
    d = tmp_path / "killed"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "device": "sim", "modeled": True,
                                             "job": "moe", "status": "running"}))
    (d / "summary.csv").write_text("mode,stage,median_ms\ndeferred,xq,0.01\n")
    r = ingest(d)
    df = r.tables["ds4lab_summary"]
    assert df.status.unique().tolist() == ["running"] and df.modeled.all()
    assert "running" in r.warnings[0] and str(d) in r.warnings[0]
    out = cli("ingest", d, "--out", tmp_path / "o")
    assert out.exit_code == 0 and "warning" in out.stderr and "'running'" in out.stderr


def make_sqlite_cells(path, kernel_rows, nvtx_rows):
    con = sqlite3.connect(path)
    con.execute("create table StringIds (id integer primary key, value text)")
    con.execute("insert into StringIds values (1, 'k1')")
    con.execute("create table CUPTI_ACTIVITY_KIND_KERNEL (start, end, shortName integer)")  # no affinity
    con.executemany("insert into CUPTI_ACTIVITY_KIND_KERNEL values (?,?,?)", kernel_rows)
    con.execute("create table NVTX_EVENTS (start, end, text text)")
    con.executemany("insert into NVTX_EVENTS values (?,?,?)", nvtx_rows)
    con.commit()
    con.close()


@pytest.mark.parametrize("kernel,nvtx,where", [
    ((100, "late", 1), (0, 50, "r"), r"x.sqlite:2: kernel row .*not a number .*end='late'"),
    ((None, 300, 1), (0, 50, "r"), r"x.sqlite:2: kernel row .*start=None"),
    ((100, 200, 1), ("soon", 50, "r"), r"x.sqlite:2: NVTX range .*not a number .*start='soon'"),
    ((100, 200, 1), (None, 50, "r"), r"x.sqlite:2: NVTX range .*start=None"),
    ((100, 200, 1), (10, "x", "r"), r"x.sqlite:2: NVTX range .*end='x'"),
])
def test_nsys_sqlite_text_or_null_times(tmp_path, kernel, nvtx, where):
    p = tmp_path / "x.sqlite"
    make_sqlite_cells(p, [(0, 1000, 1), kernel], [(0, 2000, "token"), nvtx, (5, None, "a mark")])
    with pytest.raises(SourceError, match=where):
        ingest(p)
    r = ingest(p, lenient=True)
    assert len(r.problems) == 1 and r.problems[0]["line"] == 2
    assert len(r.tables["kernels"]) + len(r.tables["nvtx"]) == 3  # the good rows; the mark is no range
    c = cli("ingest", p, "--out", tmp_path / "o")
    assert c.exit_code == 2 and "x.sqlite:2" in c.stderr


def test_nsys_sqlite_path_with_uri_characters(tmp_path):
    p = tmp_path / "run #1?.sqlite"
    make_sqlite_cells(p, [(0, 1000, 1)], [(0, 2000, "token")])
    assert ingest(p).tables["kernels"].us.tolist() == [1.0]


@pytest.mark.parametrize("cmd", ["ingest", "compare"])
@pytest.mark.parametrize("below", [False, True])
def test_out_that_is_a_file(tmp_path, cmd, below):
    f = tmp_path / "taken"
    f.write_text("not a folder\n")
    out = f / "sub" if below else f
    log = write(tmp_path, "log.txt", DS4_OK + "\n")
    if cmd == "ingest":
        r = cli("ingest", log, "--out", out)
    else:
        d = tmp_path / "in"
        assert cli("ingest", log, "--out", d).exit_code == 0
        r = cli("compare", d, "--out", out)
    assert r.exit_code == 2, r.output
    assert f"{f} is a file" in r.stderr and str(out) in r.stderr
    assert f.read_text() == "not a folder\n"


def test_ingest_help_documents_exit_status():
    r = cli("ingest", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "2 bad input" in text and "3 --lenient and some lines were skipped" in text


def test_stale_problems_file_is_removed(tmp_path):
    log = write(tmp_path, "log.txt", DS4_OK + "\nds4: CUDA MoE profile tokens=x\n")
    out = tmp_path / "o"
    assert cli("ingest", log, "--lenient", "--out", out).exit_code == 3
    assert (out / "ingest_problems.csv").exists()
    log.write_text(DS4_OK + "\n")
    assert cli("ingest", log, "--out", out).exit_code == 0
    assert not (out / "ingest_problems.csv").exists()


# ----------------------------------------------------------------------------- provenance of ds4-format logs
def test_ds4lab_header_marks_modeled_lines(tmp_path):
    modeled = write(tmp_path, "moe-ds4.log", "\n".join([
        "# ds4lab moe · MODELED by the sim backend (calibration h200), not measured", DS4_OK, DS4_BATCH]) + "\n")
    real = write(tmp_path, "real.log", "\n".join([DS4_OK, DS4_BATCH]) + "\n")
    measured = write(tmp_path, "gpu.log", "\n".join([
        "# ds4lab moe · measured on NVIDIA H200 · driver 580 · CUDA runtime 13.2 · CuPy 14.2.0", DS4_OK]) + "\n")
    m = ingest(modeled).tables["ds4_moe"]
    assert len(m) == 14 and m.modeled.all() and set(m.backend) == {"ds4lab"}
    assert m.provenance.unique().tolist() == [
        "ds4lab moe · MODELED by the sim backend (calibration h200), not measured"]
    assert m.source.iloc[0] == "moe-ds4.log:2"  # the header is line 1: line numbers stay the file's
    r = ingest(real).tables["ds4_moe"]
    assert not r.modeled.any() and set(r.backend) == {"ds4"} and set(r.provenance) == {"ds4"}
    g = ingest(measured).tables["ds4_moe"]
    assert not g.modeled.any() and set(g.backend) == {"ds4lab"}
    assert g.provenance.iloc[0].startswith("ds4lab moe · measured")


def test_ds4s_stderr_gives_its_profile_lines_and_its_island_lines(tmp_path):
    """One reader for ds4's whole stderr: the profile lines in ``ds4_moe``, its island and model-load lines
    in ``ds4_events`` (what ``ds4lab ds4``'s island table is made from); the reader takes a log of island
    lines alone, and calls one with neither kind a problem."""
    prof = ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.010 sort=0.000 gateup=0.050 midq=0.008 down=0.030 "
            "sum=0.000 total=0.098 ms")
    p = write(tmp_path, "ds4.log", "ds4: CUDA copying 81.02 GiB model to device memory\n"
              "ds4: decode graph captured il=3 island=1 (total 2)\n" + prof + "\n"
              "ds4: decode graph capture failed (il=4 island=1): operation not permitted when stream is capturing\n")
    res = ingest(p)
    ev = res.tables["ds4_events"]
    assert ev.event.tolist() == ["weights gpu-memory", "captured", "capture failed"]
    assert ev.source.tolist() == ["ds4.log:1", "ds4.log:2", "ds4.log:4"] and ev.layer.tolist()[1:] == [3, 4]
    assert ev.error.iloc[2] == "operation not permitted when stream is capturing"
    assert len(res.tables["ds4_moe"]) == 7
    from ds4lab.trace.sources.ds4log import read_ds4_log

    assert not read_ds4_log(write(tmp_path, "islands.log", "ds4: decode graph captured il=0 island=0\n"), False).problems
    with pytest.raises(SourceError, match="no ds4 MoE profile line, island line"):
        read_ds4_log(write(tmp_path, "none.log", "# ds4lab moe · x\nnothing\n"), False)


def test_ds4_lines_header_round_trip(tmp_path):
    import pandas as pd

    from ds4lab import moeprof as M

    ms = {s: 0.01 * (k + 1) for k, s in enumerate(M.MOE_STAGES)}
    ms["total"] = sum(ms.values())  # a header that names no mode: its total is checked as the sum
    rows = [{"token": t, "layer": 0, "tokens": 2, "pairs": 12, "stage": s, "ms": ms[s], "mode": "deferred",
             "routing": "uniform"} for t in range(3) for s in M.STAGES]
    df = pd.DataFrame(rows)
    plain = M.ds4_lines(df)
    assert len(plain) == 3 and all(ln.startswith("ds4: CUDA MoE profile") for ln in plain)
    lines = M.ds4_lines(df, header="ds4lab moe · MODELED by the sim backend (calibration test), not measured")
    assert lines[0] == "# ds4lab moe · MODELED by the sim backend (calibration test), not measured"
    assert lines[1:] == plain
    assert M.ds4_lines(df.iloc[:0], header="ds4lab moe · x") == []  # no call, no header-only file
    back = M.profile_rows(write(tmp_path, "back.log", "\n".join(lines) + "\n"))
    assert len(back) == 3 * len(M.STAGES) and back.modeled.all() and "MODELED" in back.note.iloc[0]
    assert not M.profile_rows(write(tmp_path, "plain.log", "\n".join(plain) + "\n")).modeled.any()
    p = write(tmp_path, "moe-ds4.log", "\n".join(lines) + "\n")
    got = ingest(p).tables["ds4_moe"]
    assert got.modeled.all() and len(got) == 3 * 7
    for bad in ("ds4lab a\nb", "not ds4lab", "ds4lab ds4: CUDA MoE profile tokens=1"):
        with pytest.raises(ValueError, match="header"):
            M.ds4_lines(df, header=bad)


# ----------------------------------------------------------------------------- one source per input file
def ds4_line(tokens=1, pairs=None, total=None, **stages):
    """A ds4 profile line as ds4 prints it (3 decimals per field; total = the stages' sum unless given)."""
    vals = {"xq": 0.004, "sort": 0.0, "gateup": 0.021, "midq": 0.003, "down": 0.011, "sum": 0.002, **stages}
    tot = sum(float(v) for v in vals.values()) if total is None else total
    body = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in vals.items())
    tot = f"{tot:.3f}" if isinstance(tot, float) else tot
    return f"ds4: CUDA MoE profile tokens={tokens} pairs={6 * tokens if pairs is None else pairs} {body} total={tot} ms"


def test_every_table_names_its_input_file(tmp_path):
    import pandas as pd

    a = write(tmp_path, "a.log", ds4_line(gateup=0.010) + "\n")
    b_dir = tmp_path / "other"
    b_dir.mkdir()
    b = write(b_dir, "a.log", ds4_line(gateup=0.030) + "\n")  # the same name, another folder
    s1 = write(tmp_path, "s1.csv", NSYS)
    s2 = write(tmp_path, "s2.csv", NSYS.replace("1,234,567", "2,000,000"))
    q = tmp_path / "r.sqlite"
    make_sqlite(q)
    d = tmp_path / "run"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "device": "NVIDIA H200"}))
    (d / "ladder.csv").write_text("stage,us_median\n0,10\n")
    out = tmp_path / "o"
    ingest_all([a, b, s1, s2, q, d], out)
    moe = pd.read_csv(out / "ds4_moe.csv")
    assert moe.file.tolist() == [str(a)] * 7 + [str(b)] * 7
    assert moe.groupby("file").ms.median().to_dict() != {}  # one group per file, not one table
    kern = pd.read_csv(out / "nsys_kernels.csv")
    assert kern.file.unique().tolist() == [str(s1), str(s2)]
    for name in ("nsys_nvtx", "kernels", "nvtx"):
        t = pd.read_csv(out / f"{name}.csv")
        assert t.file.notna().all() and t.source.notna().all(), name
    assert pd.read_csv(out / "kernels.csv").source.tolist() == ["r.sqlite:1", "r.sqlite:2"]
    assert pd.read_csv(out / "ds4lab_ladder.csv").file.tolist() == [str(d / "ladder.csv")]


@pytest.mark.parametrize("second", ["same", "dot", "abs"])
def test_the_same_input_twice_is_refused(tmp_path, monkeypatch, second):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.log", DS4_OK + "\n")
    other = {"same": "a.log", "dot": "./a.log", "abs": str(tmp_path / "a.log")}[second]
    out = tmp_path / "o"
    out.mkdir()
    (out / "ds4_moe.csv").write_text("old\n")
    r = cli("ingest", "a.log", other, "--out", out)
    assert r.exit_code == 2 and "a.log" in r.stderr and "twice" in r.stderr
    assert (out / "ds4_moe.csv").read_text() == "old\n"  # --out untouched
    with pytest.raises(SourceError, match="given twice"):
        ingest_all(["a.log", other], tmp_path / "o2", lenient=True)
    assert not (tmp_path / "o2").exists()


# ----------------------------------------------------------------------------- mode and routing of ds4lab's logs
HDR = "# ds4lab moe · mode={mode} · routing={routing} · measured on NVIDIA H200 · driver 580 · CuPy 14.2.0"


def test_header_mode_and_routing(tmp_path):
    new = write(tmp_path, "moe-in-graph-zipf.log",
                HDR.format(mode="in-graph", routing="zipf") + "\n" + DS4_OK + "\n")
    g = ingest(new).tables["ds4_moe"]
    assert set(g["mode"]) == {"in-graph"} and set(g.routing) == {"zipf"}
    assert set(g.provenance) == {"ds4lab moe · measured on NVIDIA H200 · driver 580 · CuPy 14.2.0"}
    assert not g.modeled.any() and set(g.backend) == {"ds4lab"}
    old = write(tmp_path, "old.log", "# ds4lab moe · MODELED by the sim backend (calibration h200)\n" + DS4_OK + "\n")
    o = ingest(old).tables["ds4_moe"]
    assert set(o["mode"]) == {"unknown"} and set(o.routing) == {"unknown"} and o.modeled.all()
    real = write(tmp_path, "real.log", DS4_OK + "\n")
    r = ingest(real).tables["ds4_moe"]
    assert set(r["mode"]) == {"host-timed"} and set(r.routing) == {"ds4"}
    # a later header changes the lines after it only
    two = write(tmp_path, "two.log", "\n".join([
        HDR.format(mode="deferred", routing="uniform"), DS4_OK, HDR.format(mode="cupti", routing="worst"),
        DS4_BATCH]) + "\n")
    t = ingest(two).tables["ds4_moe"]
    assert t.groupby("token")["mode"].first().tolist() == ["deferred", "cupti"]
    assert t.groupby("token").routing.first().tolist() == ["uniform", "worst"]


# ----------------------------------------------------------------------------- impossible lines
@pytest.mark.parametrize("bad,why", [
    (ds4_line(tokens=0, pairs=0), r"tokens=0: a MoE call has at least one token"),
    (ds4_line(xq="1e999", total=0.041), r"xq=1e999 is not a finite time"),
    (ds4_line(down="-0.5", total=0.5), r"down=-0.5 is a negative time"),
    (ds4_line(total="-0.041"), r"total=-0.041 is a negative time"),
    (ds4_line(total=0.049), r"total=0.049 is not the sum of the stages \(0.041 ms\)"),
    (ds4_line(total=0.033), r"total=0.033 is not the sum"),
    (ds4_line(tokens=2, pairs=0), r"pairs=0 is not a positive multiple of tokens=2"),
    (ds4_line().replace("tokens=1", "tokens=-1"), r"tokens='-1' is not a whole number"),
])
def test_impossible_ds4_line(tmp_path, bad, why):
    p = write(tmp_path, "run.log", "\n".join([DS4_OK, bad, DS4_BATCH]) + "\n")
    with pytest.raises(SourceError, match=rf"run.log:2: malformed ds4 MoE profile line \({why}"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert [q["line"] for q in r.problems] == [2] and len(r.tables["ds4_moe"]) == 14
    c = cli("ingest", p, "--out", tmp_path / "o")
    assert c.exit_code == 2 and "run.log:2" in c.stderr and not (tmp_path / "o").exists()
    c = cli("ingest", p, "--lenient", "--out", tmp_path / "o")
    assert c.exit_code == 3 and "skipped" in c.stderr and "run.log:2" in c.stderr


def test_total_within_rounding_and_cupti_totals(tmp_path):
    ok = [ds4_line(total=0.048), ds4_line(total=0.034)]  # 0.007 ms off: 7 fields rounded to 3 decimals
    assert len(ingest(write(tmp_path, "ok.log", "\n".join(ok) + "\n")).tables["ds4_moe"]) == 14
    span = ds4_line(total=0.090)  # CUPTI: total = first kernel start to last kernel end, gaps included
    p = write(tmp_path, "cupti.log", HDR.format(mode="cupti", routing="uniform") + "\n" + span + "\n")
    assert ingest(p).tables["ds4_moe"].query("stage == 'total'").ms.item() == pytest.approx(0.090)
    p = write(tmp_path, "graph.log", HDR.format(mode="in-graph", routing="uniform") + "\n" + span + "\n")
    with pytest.raises(SourceError, match="graph.log:2: .*total=0.090 is not the sum"):
        ingest(p)


@pytest.mark.parametrize("cell,col,why", [
    ('"-1,234,567"', "Total Time (ns)", "negative"),
    ('"inf"', "Total Time (ns)", "not a finite number"),
    ('"-43"', "Instances", "negative"),
])
def test_nsys_csv_negative_or_infinite_number(tmp_path, cell, col, why):
    good = '"45.2","1,234,567","43","28,710.9","28,704.0","28,512","29,120","120.5","moe_gateup_decode"'
    cells = good.split('","')
    k = {"Total Time (ns)": 1, "Instances": 2}[col]
    cells[k] = cell.strip('"')
    row = '","'.join(cells)
    p = write(tmp_path, "stats.csv", NSYS.replace(good, row))
    line = NSYS.splitlines().index(good) + 1
    with pytest.raises(SourceError, match=rf"stats.csv:{line}: {re.escape(col)}=.* is {why}"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert r.tables["nsys_kernels"].name.tolist() == ["q8_matvec"] and r.problems[0]["line"] == line


def test_binary_input_error_shows_a_short_escaped_excerpt(tmp_path):
    p = tmp_path / "blob.bin"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 20)
    r = cli("ingest", p, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "blob.bin: not a ds4 MoE profile log" in r.stderr
    assert "\\x89PNG" in r.stderr  # escaped
    msg = r.stderr.strip()
    assert msg.isprintable() and "\ufffd" not in msg and len(msg) < 400
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- --out holds this run's tables only
def test_a_second_ingest_replaces_the_first_ones_tables(tmp_path):
    import pandas as pd

    log = write(tmp_path, "a.log", DS4_OK + "\n")
    stats = write(tmp_path, "stats.csv", NSYS)
    d = tmp_path / "run"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "device": "NVIDIA H200"}))
    (d / "ladder.csv").write_text("stage,us_median\n0,10\n")
    q = tmp_path / "r.sqlite"
    make_sqlite(q)
    out = tmp_path / "o"
    assert cli("ingest", log, d, q, "--out", out).exit_code == 0
    (out / "notes.txt").write_text("mine\n")  # not ingest's: kept
    assert {p.name for p in out.iterdir()} == {"ds4_moe.csv", "ds4lab_ladder.csv", "kernels.csv", "nvtx.csv",
                                               "notes.txt", "meta.json"}
    # an input error leaves --out as it was
    bad = write(tmp_path, "bad.log", "ds4: CUDA MoE profile tokens=x\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert cli("ingest", stats, bad, "--out", out).exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert cli("ingest", stats, "--out", out).exit_code == 0
    assert {p.name for p in out.iterdir()} == {"nsys_kernels.csv", "nsys_nvtx.csv", "notes.txt", "meta.json",
                                               "ingest_warnings.csv"}  # nsys's "Generating SQLite file" line
    assert pd.read_csv(out / "nsys_kernels.csv").file.unique().tolist() == [str(stats)]
    r = cli("compare", out, "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert {p.stem for p in (tmp_path / "cmp").iterdir()} == {"compare_kernels", "meta"}  # no stale MoE or ladder


def test_folder_with_meta_but_no_table_is_an_error(tmp_path):
    d = tmp_path / "empty-run"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "device": "NVIDIA H200", "status": "complete"}))
    for lenient in (False, True):
        with pytest.raises(SourceError, match=r"empty-run: a ds4lab result folder without any table: expected"):
            ingest(d, lenient=lenient)
    r = cli("ingest", d, "--out", tmp_path / "o")
    assert r.exit_code == 2 and str(d) in r.stderr and "expected" in r.stderr and "→" not in r.output
    assert not (tmp_path / "o").exists()


def test_an_unknown_sites_preset_is_refused_before_any_input_is_read(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    log = tmp_path / "moe.log"
    log.write_text("not read\n")
    r = CliRunner().invoke(main, ["ingest", str(log), "--sites", "nope", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--sites 'nope'" in r.output and "tiny" in r.output
    assert not (tmp_path / "o").exists()


def test_a_header_of_mixed_modes_with_cupti_accepts_span_totals(tmp_path):
    """A log of several modes in one file (ds4lab's before one log per mode) whose header names cupti:
    its span totals are not flagged, and the mix is said; without cupti in it, they still are."""
    span = ds4_line(total=0.090)
    mixed = "# ds4lab moe · measured on NVIDIA H200 · modes host-timed, deferred, cupti and routings uniform mixed\n"
    r = ingest(write(tmp_path, "mixed.log", mixed + ds4_line(total=0.041) + "\n" + span + "\n"))
    assert len(r.tables["ds4_moe"]) == 14 and not r.problems
    assert any("mix modes host-timed, deferred, cupti" in w for w in r.warnings)
    plain = "# ds4lab moe · modes host-timed, deferred and routings uniform mixed\n"
    with pytest.raises(SourceError, match="plain.log:3: .*total=0.090 is not the sum"):
        ingest(write(tmp_path, "plain.log", plain + ds4_line(total=0.041) + "\n" + span + "\n"))


def test_gzip_inputs_read_as_their_text(tmp_path):
    """A gzip-compressed ds4 log, ncu CSV or nsys stats CSV is detected and read as its text is; one cut
    short is named as such."""
    import gzip

    for name, text in (("run.log", "\n".join([DS4_OK, "noise", DS4_BATCH]) + "\n"), ("stats.csv", NSYS)):
        plain = write(tmp_path, name, text)
        gz = tmp_path / (name + ".gz")
        gz.write_bytes(gzip.compress(text.encode()))
        assert detect(gz) == detect(plain)
        a, b = ingest(plain).tables, ingest(gz).tables
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].drop(columns=["file", "source"], errors="ignore").equals(
                b[k].drop(columns=["file", "source"], errors="ignore")), k
    data = gzip.compress(("\n".join([DS4_OK] * 4000) + "\n").encode())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match="cut.log.gz: .*gzip stream ends early"):
        ingest(cut)


@pytest.mark.parametrize("record, tables", [
    ("docs/measurements/h200-2026-11-29/moe/moe-ds4.log.gz", {"ds4_moe": 12_672 * 7}),
    ("docs/measurements/h200-2026-11-30b/nsight/ncu.csv.gz", {"ncu_kernels": 300, "ncu_metrics": 8_100,
                                                              "ncu_rules": 543})])
def test_the_repositorys_own_records_are_ingested(record, tables):
    """The measurement records as they are in the repository (gzip), strict: every line read, none
    flagged (the MoE log's cupti lines, whose total is the step's span, included)."""
    from pathlib import Path

    r = ingest(Path(__file__).resolve().parents[1] / record)
    assert not r.problems
    for name, n in tables.items():
        assert len(r.tables[name]) == n, name
