"""What the Nsight tools really write, read right (issue 20): ncu metrics by section and unit and its
rule rows; ``nsys stats --format csv -o PREFIX`` per-report files; the text (column) format refused;
nothing vanishing in lenient mode; cut-off files; raw reports; duplicates by content; an empty report
named; a conformance folder; ingest into a job's folder or its own input refused. Inputs are built
from the documented formats: the Nsight Compute CLI guide (``--csv``, ``--page details|raw``, the
details page's rule columns of ncu 2023 and later) and the Nsight Systems Analysis Guide (report
names, columns, ``nsys stats --format csv|column -o``)."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.jobs.ingest import ingest, ingest_all
from ds4lab.trace.sources import SourceError, detect

HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size",
        "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name", "Rule Type",
        "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]
SOL, MWA = "GPU Speed Of Light Throughput", "Memory Workload Analysis"


def ncu_details(kernels, sections_order=("sol", "mwa"), device="0", pid="4242"):
    """``ncu --csv --section SpeedOfLight --section MemoryWorkloadAnalysis`` (details page) output.
    ``kernels``: [(id, name, dram %, memory %, memory GB/s, duration ns)]."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(HEAD)
    for kid, name, dram, mem_pct, mem_gbs, dur in kernels:
        base = [str(kid), pid, "python3", "host", name, "1", "7", "(256, 1, 1)", "(132, 1, 1)", device, "9.0"]
        sol = [[SOL, "DRAM Throughput", "%", dram], [SOL, "Duration", "nsecond", dur],
               [SOL, "Memory Throughput", "%", mem_pct], [SOL, "Compute (SM) Throughput", "%", "12.5"]]
        mwa = [[MWA, "Memory Throughput", "Gbyte/second", mem_gbs], [MWA, "Mem Busy", "%", "40.1"]]
        for sec in sections_order:
            for m in (sol if sec == "sol" else mwa):
                w.writerow(base + m + [""] * 5)
        w.writerow(base + ["SpeedOfLight", "", "", "", "SOLBottleneck", "OPT",
                           "Memory is more heavily utilized than Compute: look at the memory workload.", "global",
                           "36.7"])
        w.writerow(base + ["MemoryWorkloadAnalysis_Tables", "", "", "", "UncoalescedGlobalAccess", "WRN",
                           "Only 10.7 of 32 bytes per sector are used.", "", ""])
    return buf.getvalue()


def write(tmp_path, name, text, mode="w"):
    p = tmp_path / name
    if mode == "wb":
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# ----------------------------------------------------------------------------- ncu
@pytest.mark.parametrize("order", [("sol", "mwa"), ("mwa", "sol")])
def test_ncu_memory_throughput_is_keyed_by_section_with_its_unit(tmp_path, rng, order):
    pct, gbs = rng.uniform(20, 90, 2), rng.uniform(300, 4000, 2)
    rows = [(0, "q8_matvec", "61.4", f"{pct[0]:.2f}", f"{gbs[0]:.2f}", "12,500"),
            (1, "moe_gateup_decode", "70.2", f"{pct[1]:.2f}", f"{gbs[1]:.2f}", "19,200")]
    r = ingest(write(tmp_path, "ncu.csv", ncu_details(rows, order)))
    k = r.tables["ncu_kernels"]
    assert k.memory_pct.tolist() == pytest.approx([round(v, 2) for v in pct])  # never the GB/s of the other section
    m = r.tables["ncu_metrics"]
    mt = m[m.metric == "Memory Throughput"].set_index(["id", "section"])
    assert mt.loc[(0, SOL), "unit"] == "%" and mt.loc[(0, MWA), "unit"] == "Gbyte/second"
    assert float(mt.loc[(1, MWA), "value"]) == pytest.approx(round(gbs[1], 2))
    assert (m.metric != "").all(), "a rule's row is not a metric"


def test_ncu_rule_rows_are_kept_in_their_own_table(tmp_path):
    r = ingest(write(tmp_path, "ncu.csv", ncu_details([(0, "q8_matvec", "61.4", "61.4", "2400.1", "12,500")])))
    rules = r.tables["ncu_rules"]
    assert rules.rule.tolist() == ["SOLBottleneck", "UncoalescedGlobalAccess"]
    assert rules.type.tolist() == ["OPT", "WRN"] and rules.speedup_pct[0] == pytest.approx(36.7)
    assert pd.isna(rules.speedup_pct[1]) and rules.kernel.tolist() == ["q8_matvec"] * 2
    assert "10.7 of 32 bytes" in rules.description[1] and rules.section[0] == "SpeedOfLight"
    out = tmp_path / "o"
    assert cli("ingest", tmp_path / "ncu.csv", "--out", out).exit_code == 0
    assert len(pd.read_csv(out / "ncu_rules.csv")) == 2


@pytest.mark.parametrize("value", ["360.51", "-0.5", "100.2"])
def test_a_percentage_of_peak_outside_0_to_100_is_an_error(tmp_path, value):
    text = ncu_details([(0, "q8_matvec", value, "61.4", "2400.1", "12,500")])
    line = text.splitlines().index(next(l for l in text.splitlines() if '"DRAM Throughput","%"' in l)) + 1
    p = write(tmp_path, "ncu.csv", text)
    with pytest.raises(SourceError, match=rf"ncu.csv:{line}: metric 'DRAM Throughput' \({SOL}\) = {value} %: a "
                                          r"percentage of peak lies in 0-100"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert [q["line"] for q in r.problems] == [line] and pd.isna(r.tables["ncu_kernels"].dram_pct[0])


def test_ncu_devices_and_processes_stay_apart_per_site(tmp_path):
    from ds4lab.trace.sources.ncu import per_site

    a = ncu_details([(0, "q8_matvec", "60.0", "60.0", "2000", "10,000")], device="0")
    b = ncu_details([(1, "q8_matvec", "20.0", "20.0", "700", "30,000")], device="1").split("\n", 1)[1]
    k = ingest(write(tmp_path, "two.csv", a + b)).tables["ncu_kernels"]
    assert k.device.tolist() == ["0", "1"] and k.pid.tolist() == [4242, 4242]
    s = per_site(k)
    assert len(s) == 2 and sorted(s.dram_pct) == [20.0, 60.0]  # one median per device, never mixed


# ----------------------------------------------------------------------------- nsys stats -o PREFIX: one file per report
REPORT_FILES = {
    "cuda_gpu_kern_sum": ('"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
                          '"StdDev (ns)","Name"', '"88.3","1,234,567","43","28,710.9","28,704.0","28,512","29,120",'
                          '"120.5","moe_gateup_decode"', "nsys_kernels"),
    "cuda_api_sum": ('"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
                     '"StdDev (ns)","Name"', '"55.0","2,500,000","1,121","2,230.1","2,100.0","1,900","9,800",'
                     '"300.2","cuLaunchKernel"', "nsys_cuda_api"),
    "osrt_sum": ('"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
                 '"StdDev (ns)","Name"', '"92.5","8,000,000,000","80","100,000,000.0","100,000,000.0","99,000,000",'
                 '"101,000,000","500,000.0","poll"', "nsys_osrt"),
    "nvtx_kern_sum": ('"NVTX Range","Style","PID","TID","NVTX Inst","Kern Inst","Total Time (ns)","Avg (ns)",'
                      '"Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Kernel Name"',
                      '"ds4lab:q_a","PushPop","4242","4242","43","43","548,000","12,744.2","12,736.0","12,640",'
                      '"12,992","80.1","q8_matvec"', "nsys_nvtx_kernels"),
    "nvtx_sum": ('"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
                 '"StdDev (ns)","Style","Range"', '"60.0","8,875,200","1","8,875,200.0","8,875,200.0","8,875,200",'
                 '"8,875,200","0.0","PushPop","ds4lab:token"', "nsys_nvtx"),
    "cuda_gpu_mem_time_sum": ('"Time (%)","Total Time (ns)","Count","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
                              '"StdDev (ns)","Operation"', '"80.0","4,000","2","2,000.0","2,000.0","1,500","2,500",'
                              '"707.1","[CUDA memset]"', "nsys_mem_time"),
    "cuda_gpu_mem_size_sum": ('"Total (MB)","Count","Avg (MB)","Med (MB)","Min (MB)","Max (MB)","StdDev (MB)",'
                              '"Operation"', '"0.016","1","0.016","0.016","0.016","0.016","0.000",'
                              '"[CUDA memcpy Host-to-Device]"', "nsys_mem_size"),
    "cuda_gpu_trace": ('"Start (ns)","Duration (ns)","CorrId","GrdX","GrdY","GrdZ","BlkX","BlkY","BlkZ","Reg/Trd",'
                       '"StcSMem (MB)","DymSMem (MB)","Bytes (MB)","Throughput (MBps)","SrcMemKd","DstMemKd",'
                       '"Device","Ctx","Strm","Name"', '"1,000","4,200","11","64","1","1","256","1","1","32",'
                       '"0.000","0.000","","","","","NVIDIA H200 (0)","1","7","q8_matvec"', "nsys_gpu_trace"),
    "cuda_api_trace": ('"Start (ns)","Duration (ns)","Name","Result","CorrID","Pid","Tid","T-Pri","Thread Name"',
                       '"1,000","5,600","cudaLaunchKernel","0","11","4242","4242","20","python3"', "nsys_api_trace"),
}


@pytest.mark.parametrize("report", list(REPORT_FILES))
def test_each_per_report_file_of_nsys_stats_o_is_read(tmp_path, report):
    header, row, table = REPORT_FILES[report]
    p = write(tmp_path, f"prof_{report}.csv", f"{header}\n{row}\n")  # as `nsys stats --format csv -o prof` names it
    assert detect(p) == "nsys-csv"
    r = ingest(p)
    assert set(r.tables) == {table} and set(r.tables[table].report) == {report}, r.warnings


@pytest.mark.parametrize("report", [r for r in REPORT_FILES if r != "osrt_sum"])
def test_a_renamed_per_report_file_is_recognised_by_its_columns(tmp_path, report):
    header, row, table = REPORT_FILES[report]
    r = ingest(write(tmp_path, "renamed.csv", f"{header}\n{row}\n"))
    assert set(r.tables) == {table} and set(r.tables[table].report) == {report}


def test_an_api_summary_of_other_calls_without_its_file_name_is_named_not_guessed(tmp_path):
    header, row, _ = REPORT_FILES["osrt_sum"]
    p = write(tmp_path, "renamed.csv", f"{header}\n{row}\n")
    with pytest.raises(SourceError, match=r"not all CUDA calls: osrt_sum, syscall_sum"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert any("poll" in w and "PREFIX_<report>.csv" in w for w in r.warnings)


# ----------------------------------------------------------------------------- the text (column) format
TEXT = """
 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

 Time (%)  Total Time (ns)  Instances   Avg (ns)     Med (ns)    Min (ns)   Max (ns)   StdDev (ns)         Name
 --------  ---------------  ---------  -----------  ----------  ---------  ---------  -----------  -----------------
     88.3      123,456,789        100  1,234,567.9  1,230,000.0  1,200,000  1,300,000     20,000.1  moe_gateup_decode
      1.9        2,654,321        100     26,543.2     26,500.0     26,000     27,000        100.0  q8_matvec, tiled
      0.4          559,211         43     13,004.9     13,000.0     12,900     13,100         50.0  hc_premix
"""


@pytest.mark.parametrize("lenient", [False, True])
def test_the_text_format_is_refused_with_the_command_that_writes_csv(tmp_path, lenient):
    p = write(tmp_path, "stats.txt", TEXT)
    assert detect(p) == "nsys-csv"
    with pytest.raises(SourceError, match=r"stats.txt:5: this is the text format of nsys stats .*rerun with "
                                          r"`--format csv`"):
        ingest(p, lenient=lenient)
    r = cli("ingest", p, *(["--lenient"] if lenient else []), "--out", tmp_path / "o")
    assert r.exit_code == 2 and "--format csv" in r.stderr and "1 fields" not in r.stderr
    assert not (tmp_path / "o").exists()  # no table with a data row for its header, no row lost quietly


# ----------------------------------------------------------------------------- nothing vanishes in lenient mode
def test_in_lenient_mode_every_line_is_tabled_or_listed(tmp_path):
    k_head, k_row, _ = REPORT_FILES["cuda_gpu_kern_sum"]
    text = "\n".join([
        "Generating SQLite file report.sqlite from report.nsys-rep",                  # 1 nsys's message
        "", " ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):", "",                   # 2-4
        k_head, k_row,                                                                # 5-6
        k_row.replace('"43"', '"-43"'),                                               # 7 bad number
        '"1.0","5"',                                                                  # 8 too few fields
        k_row.replace("moe_gateup_decode", "q8_matvec"),                              # 9
        "", " ** Unified Memory Summary (um_sum):", "",                               # 10-12 not read by ds4lab
        '"Total Time (ns)","Name"', '"1","x"',                                        # 13-14
        "", '"3.0","1,000","1"',                                                      # 15-16 a row with no header
        "", "NOTICE: something nsys says",                                            # 17-18
    ]) + "\n"
    p = write(tmp_path, "stats.csv", text)
    r = ingest(p, lenient=True)
    lines = text.splitlines()
    tabled = {int(s.rsplit(":", 1)[1]) for s in r.tables["nsys_kernels"].source}
    listed = {q["line"] for q in r.problems}
    assert tabled == {6, 9} and listed == {7, 8, 16}
    warned = " ".join(r.warnings)
    assert "um_sum" in warned and "line 11" in warned and "1 row(s)" in warned  # the skipped report and its row
    assert "line(s) 1, 18" in warned  # the lines that are no report's
    structure = {n for n, l in enumerate(lines, 1) if not l.strip() or l.strip().startswith("**")} | {5, 13}
    assert tabled | listed | {1, 14, 18} | structure == set(range(1, len(lines) + 1))
    out = tmp_path / "o"
    c = cli("ingest", p, "--lenient", "--out", out)
    assert c.exit_code == 3
    assert sorted(pd.read_csv(out / "ingest_problems.csv").line) == [7, 8, 16]
    assert len(pd.read_csv(out / "ingest_warnings.csv")) == len(r.warnings)


# ----------------------------------------------------------------------------- cut-off files
def test_a_cut_off_nsys_csv_reports_its_last_line(tmp_path):
    head, row, _ = REPORT_FILES["cuda_gpu_kern_sum"]
    full = f"{head}\n{row}\n{row.replace('moe_gateup_decode', 'q8_matvec')}\n"
    cut = full[:-12]  # the copy stopped inside the last row: same field count, a shorter name
    p = write(tmp_path, "stats.csv", cut)
    with pytest.raises(SourceError, match=r"stats.csv:3: the file ends in the middle of this line: cut off"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert r.tables["nsys_kernels"].name.tolist() == ["moe_gateup_decode"] and r.problems[0]["line"] == 3


def test_a_cut_off_ncu_csv_reports_its_last_line(tmp_path):
    text = ncu_details([(0, "q8_matvec", "61.4", "61.4", "2400.1", "12,500")])
    p = write(tmp_path, "ncu.csv", text.rstrip("\n")[:-5])
    n = len(text.rstrip("\n").splitlines())
    with pytest.raises(SourceError, match=rf"ncu.csv:{n}: the file ends in the middle of this line"):
        ingest(p)


def test_a_cut_off_table_in_a_complete_folder_is_refused_by_ingest_and_compare(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "job": "ladder", "status": "complete"}))
    (d / "ladder.csv").write_text("stage,us_median,us_p25,us_p75\n0,10524.0,10328.9,10711.4\n3,8875.2,88")  # cut
    with pytest.raises(SourceError, match=r"ladder.csv: the file ends in the middle of a line: cut off"):
        ingest(d)
    r = cli("compare", d, "--out", tmp_path / "cmp")
    assert r.exit_code == 2 and "ladder.csv:3" in r.stderr and "cut off" in r.stderr
    (d / "ladder.csv").write_text("stage,us_median,us_p25,us_p75\n0,10524.0,10328.9,10711.4\n3,8875.2\n")  # half row
    with pytest.raises(SourceError, match=r"ladder.csv: 2 fields, the header has 4"):
        ingest(d)


# ----------------------------------------------------------------------------- raw reports, duplicates, empty reports
@pytest.mark.parametrize("name, command", [
    ("prof.nsys-rep", "nsys export --type sqlite --output prof.sqlite prof.nsys-rep"),
    ("prof.qdrep", "nsys export --type sqlite --output prof.sqlite prof.qdrep"),
    ("prof.ncu-rep", "ncu --import prof.ncu-rep --csv > prof.csv"),
])
def test_a_raw_report_is_refused_with_its_export_command(tmp_path, rng, name, command):
    p = write(tmp_path, name, b"\x00\x01NVIDIA" + rng.bytes(4096), mode="wb")
    with pytest.raises(SourceError, match="export it first") as ei:
        ingest(p)
    assert f"`{command}`" in str(ei.value)
    r = cli("ingest", p, "--out", tmp_path / "o")
    assert r.exit_code == 2 and command in r.stderr


def test_an_identical_copy_is_refused_by_content(tmp_path):
    head, row, _ = REPORT_FILES["cuda_gpu_kern_sum"]
    a = write(tmp_path, "a.csv", f"{head}\n{row}\n")
    b = tmp_path / "copy-of-a.csv"
    shutil.copy(a, b)
    with pytest.raises(SourceError, match=r"copy-of-a.csv: the same content as .*a.csv \(sha256 [0-9a-f]{12}\)"):
        ingest_all([a, b], tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_report_with_its_title_and_no_rows_is_called_that(tmp_path):
    head, _, _ = REPORT_FILES["cuda_gpu_kern_sum"]
    p = write(tmp_path, "empty.csv", f" ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):\n\n{head}\n")
    with pytest.raises(SourceError, match=r"report cuda_gpu_kern_sum \(line 1\) has its title and header but no "
                                          r"rows") as ei:
        ingest(p)
    assert "no report title and no CSV table" not in str(ei.value)


# ----------------------------------------------------------------------------- folders
def test_a_conformance_folder_is_ingested_as_ds4lab_s(tmp_path):
    r = cli("conformance", "--backend", "sim", "--scenario", "legacy_sync_memset_during_capture",
            "--out", tmp_path / "conf")
    if r.exit_code != 0:  # the scenario's name, from the suite
        from ds4lab.conformance import SCENARIOS

        r = cli("conformance", "--backend", "sim", "--scenario", SCENARIOS[0].name, "--out", tmp_path / "conf")
    assert r.exit_code == 0, r.output
    assert detect(tmp_path / "conf") == "ds4lab-folder"
    c = cli("ingest", tmp_path / "conf", "--out", tmp_path / "o")
    assert c.exit_code == 0, c.output + c.stderr
    assert "not written by ds4lab" not in c.stderr and (tmp_path / "o" / "ds4lab_conformance.csv").is_file()


def test_ingest_into_a_jobs_folder_or_its_own_input_is_refused(tmp_path):
    lad = tmp_path / "ladder"
    assert cli("ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0", "--tokens", "2", "--repeats", "1",
               "--exact-tokens", "0", "--out", lad).exit_code == 0
    before = {p.name: p.read_bytes() for p in lad.iterdir()}
    log = write(tmp_path, "ds4.log", "ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.013 sort=0.003 gateup=0.031 "
                                     "midq=0.004 down=0.013 sum=0.004 total=0.068 ms\n")
    r = cli("ingest", log, "--out", lad)
    assert r.exit_code == 2 and "holds the results of ds4lab ladder" in r.stderr
    assert {p.name: p.read_bytes() for p in lad.iterdir()} == before  # never labelled with the ladder's meta
    r = cli("ingest", lad, "--out", lad)
    assert r.exit_code == 2 and "the tables would replace what they are read from" in r.stderr
    ing = tmp_path / "ing"
    assert cli("ingest", log, "--out", ing).exit_code == 0
    r = cli("ingest", ing, "--out", ing)
    assert r.exit_code == 2 and "is the input" in r.stderr
    r = cli("compare", lad, "--out", lad)
    assert r.exit_code == 2 and "replace what they are drawn from" in r.stderr


def test_a_second_ingest_into_a_folder_in_use_is_refused_with_the_pid(tmp_path):
    import os

    from ds4lab.report.results import Lock, lock_path

    log = write(tmp_path, "ds4.log", "ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.013 sort=0.003 gateup=0.031 "
                                     "midq=0.004 down=0.013 sum=0.004 total=0.068 ms\n")
    out = tmp_path / "o"
    held = Lock(lock_path(out), out).acquire()
    try:
        r = cli("ingest", log, "--out", out)
        assert r.exit_code == 2 and f"PID {os.getpid()}" in r.stderr
        r = cli("compare", tmp_path, "--out", out)
        assert r.exit_code == 2
    finally:
        held.release()
    assert cli("ingest", log, "--out", out).exit_code == 0


# ----------------------------------------------------------------------------- scripts/ds4lab.sh
def test_ds4lab_sh_runs_in_the_callers_folder(tmp_path):
    """`bash scripts/ds4lab.sh ingest ok.log` from another folder reads ok.log there and writes its
    results there, while the set-up still finds the checkout's .venv."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    stamp, pyproject = repo / ".venv" / ".ds4lab-installed", repo / "pyproject.toml"
    if not stamp.is_file() or stamp.stat().st_mtime < pyproject.stat().st_mtime:
        pytest.skip(".venv is not set up for this pyproject.toml yet: run bash scripts/test.sh (it sets it up)")
    write(tmp_path, "ok.log", "ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.013 sort=0.003 gateup=0.031 midq=0.004 "
                              "down=0.013 sum=0.004 total=0.068 ms\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    r = subprocess.run(["bash", str(repo / "scripts" / "ds4lab.sh"), "ingest", "ok.log", "--out", "o"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "o" / "ds4_moe.csv").is_file() and not (repo / "o").exists()
