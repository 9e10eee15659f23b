"""ds4lab ingest: each format from files written from its specification, good and malformed."""

from __future__ import annotations

import json
import sqlite3

import pytest

from ds4lab.ingest import IngestError, detect, ingest, ingest_all

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
    ("ds4: CUDA MoE profile tokens=4 pairs=7 xq=1 sort=0 gateup=0 midq=0 down=0 sum=0 total=1 ms", "multiple"),
    ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=-1 sort=0 gateup=0 midq=0 down=0 sum=0 total=1 ms", "negative"),
])
def test_ds4_log_malformed_line(tmp_path, bad, why):
    p = write(tmp_path, "run.txt", "\n".join([DS4_OK, "noise", bad, DS4_OK]))
    with pytest.raises(IngestError, match=rf"run.txt:3: .*{why}"):
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
    with pytest.raises(IngestError, match=rf"stats.csv:{line}: .*{why}"):
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
    with pytest.raises(IngestError, match=r"r.sqlite:3: kernel row"):
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
    with pytest.raises(IngestError, match="x.txt: not a ds4 MoE profile log"):
        detect(p)
    with pytest.raises(IngestError, match="no such file"):
        detect(tmp_path / "missing")


def test_cli_ingest_and_compare(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    log = write(tmp_path, "log.txt", "\n".join([DS4_OK, "ds4: CUDA MoE profile tokens=oops", DS4_BATCH]))
    r = CliRunner().invoke(main, ["ingest", str(log), "--out", str(tmp_path / "a")])
    assert r.exit_code == 1 and "log.txt:2" in r.output
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
