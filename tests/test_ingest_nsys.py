"""nsys stats CSV reports told apart by their titles, and SQLite exports with graph executions and
NVTX domains: files written from the published formats (Nsight Systems Analysis Guide report names
and columns; the export's table and column names), good and malformed."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.jobs.ingest import ingest, ingest_all
from ds4lab.trace.sources import SourceError, detect

# the two-report example of issue 13, verbatim
TWO_REPORTS = '''
 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"70.0","1,400,000","400","3,500.0","3,488.0","3,200","4,100","90.2","moe_gateup_decode"

 ** OS Runtime Summary (osrt_sum):

"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"92.5","8,000,000,000","80","100,000,000.0","100,000,000.0","99,000,000","101,000,000","500,000.0","poll"
'''

MEM = '''
 ** CUDA GPU MemOps Summary (by Time) (cuda_gpu_mem_time_sum):

"Time (%)","Total Time (ns)","Count","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Operation"
"80.0","4,000","2","2,000.0","2,000.0","1,500","2,500","707.1","[CUDA memset]"
"20.0","1,000","1","1,000.0","1,000.0","1,000","1,000","0.0","[CUDA memcpy Host-to-Device]"

 ** CUDA GPU MemOps Summary (by Size) (cuda_gpu_mem_size_sum):

"Total (MB)","Count","Avg (MB)","Med (MB)","Min (MB)","Max (MB)","StdDev (MB)","Operation"
"0.016","1","0.016","0.016","0.016","0.016","0.000","[CUDA memcpy Host-to-Device]"
'''

NVTX_KERN = '''
 ** NVTX Range Kernel Summary (nvtx_kern_sum):

"NVTX Range","Style","PID","TID","NVTX Inst","Kern Inst","Total Time (ns)","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Kernel Name"
"ds4lab:q_a","PushPop","4242","4242","43","43","548,000","12,744.2","12,736.0","12,640","12,992","80.1","q8_matvec"
"ds4lab:gateup","PushPop","4242","4242","43","43","1,234,567","28,710.9","28,704.0","28,512","29,120","120.5","moe_gateup_decode"
'''

# an older nsys: report names before the 2022 renaming, "Processing" lines, unit-less columns
OLD = '''Using report.sqlite for SQL queries.
Running [/opt/nvidia/nsight-systems/2021.3/reports/gpukernsum.py report.sqlite]...
Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2021.3/reports/gpukernsum.py]...

"Time(%)","Total Time","Instances","Average","Minimum","Maximum","StdDev","Name"
"61.3","2,000,000","400","5,000.0","4,000","6,000","100.0","moe_gateup_decode"
'''

TRACE = '''
 ** CUDA GPU Trace (cuda_gpu_trace):

"Start (ns)","Duration (ns)","CorrId","GrdX","GrdY","GrdZ","BlkX","BlkY","BlkZ","Reg/Trd","StcSMem (MB)","DymSMem (MB)","Bytes (MB)","Throughput (MBps)","SrcMemKd","DstMemKd","Device","Ctx","Strm","Name"
"1,000","4,200","11","64","1","1","256","1","1","32","0.000","0.000","","","","","NVIDIA H200 (0)","1","7","q8_matvec"
"6,000","900","12","","","","","","","","","","0.016","17,777.7","Pageable","Device","NVIDIA H200 (0)","1","7","[CUDA memcpy Host-to-Device]"
'''


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_two_report_example_gives_one_kernel_row_and_the_os_calls_apart(tmp_path):
    p = write(tmp_path, "stats.csv", TWO_REPORTS)
    assert detect(p) == "nsys-csv"
    r = ingest(p)
    k = r.tables["nsys_kernels"]
    assert k.name.tolist() == ["moe_gateup_decode"] and "poll" not in set(k.name)
    assert k.total_time_us.item() == pytest.approx(1400.0) and k.instances.item() == 400
    o = r.tables["nsys_osrt"]
    assert o.name.tolist() == ["poll"] and o.num_calls.item() == 80  # the call count is kept
    assert o.total_time_us.item() == pytest.approx(8e6)
    assert set(o.report) == {"osrt_sum"} and set(k.report) == {"cuda_gpu_kern_sum"}


def test_memory_operation_summaries_are_their_own_tables(tmp_path):
    r = ingest(write(tmp_path, "mem.csv", TWO_REPORTS + MEM))
    t = r.tables["nsys_mem_time"]
    assert t.operation.tolist() == ["[CUDA memset]", "[CUDA memcpy Host-to-Device]"]
    assert t["count"].tolist() == [2, 1] and t.avg_us[0] == pytest.approx(2.0)
    s = r.tables["nsys_mem_size"]
    assert s.total_mb.item() == pytest.approx(0.016) and s.name.item() == "[CUDA memcpy Host-to-Device]"
    assert len(r.tables["nsys_kernels"]) == 1  # nothing of the memory reports leaked in


def test_every_column_of_a_report_is_kept(tmp_path):
    r = ingest(write(tmp_path, "stats.csv", TWO_REPORTS))
    k = r.tables["nsys_kernels"]
    for c in ("time_pct", "total_time_us", "instances", "avg_us", "med_us", "min_us", "max_us", "stddev_us", "name"):
        assert c in k, c
    assert k.med_us.item() == pytest.approx(3.488) and k.stddev_us.item() == pytest.approx(0.0902)


def test_nvtx_kern_sum_is_read(tmp_path):
    p = write(tmp_path, "nk.csv", NVTX_KERN)
    assert detect(p) == "nsys-csv"
    t = ingest(p).tables["nsys_nvtx_kernels"]
    assert t.nvtx_range.tolist() == ["ds4lab:q_a", "ds4lab:gateup"]
    assert t.name.tolist() == ["q8_matvec", "moe_gateup_decode"]  # the kernel
    assert t.kern_inst.tolist() == [43, 43] and t.total_time_us[1] == pytest.approx(1234.567)


def test_older_names_and_unitless_columns_read_as_ns_with_a_warning(tmp_path):
    p = write(tmp_path, "old.csv", OLD)
    assert detect(p) == "nsys-csv"
    r = ingest(p)
    k = r.tables["nsys_kernels"]
    assert k.report.item() == "gpukernsum"
    assert k.total_time_us.item() == pytest.approx(2000.0) and k.average_us.item() == pytest.approx(5.0)
    assert k.minimum_us.item() == pytest.approx(4.0) and k.time_pct.item() == pytest.approx(61.3)
    assert any("read as ns" in w and "Average" in w for w in r.warnings)


def test_gpu_trace_rows_keep_empty_cells(tmp_path):
    t = ingest(write(tmp_path, "trace.csv", TRACE)).tables["nsys_gpu_trace"]
    assert t.name.tolist() == ["q8_matvec", "[CUDA memcpy Host-to-Device]"]
    assert t.start_us.tolist() == pytest.approx([1.0, 6.0]) and t.duration_us.tolist() == pytest.approx([4.2, 0.9])
    assert t.grdx[0] == 64 and pd.isna(t.grdx[1]) and t.srcmemkd[1] == "Pageable"


def test_an_unknown_report_is_skipped_by_name(tmp_path):
    other = '''
 ** CUDA Summary (API/Kernels/MemOps) (cuda_api_gpu_sum):

"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Category","Operation"
"50.0","1,000","1","1,000.0","1,000.0","1,000","1,000","0.0","CUDA_KERNEL","q8_matvec"
'''
    p = write(tmp_path, "s.csv", TWO_REPORTS + other)
    r = ingest(p)
    assert set(r.tables) == {"nsys_kernels", "nsys_osrt"}
    assert any("cuda_api_gpu_sum" in w and "skipped" in w for w in r.warnings)
    out = tmp_path / "o"
    c = cli("ingest", p, "--out", out)
    assert c.exit_code == 0 and "cuda_api_gpu_sum" in c.stderr
    assert "cuda_api_gpu_sum" in (out / "ingest_warnings.csv").read_text()


def test_only_unknown_reports_is_an_error(tmp_path):
    p = write(tmp_path, "s.csv", ' ** Unified Memory Summary (um_sum):\n\n"Total Time (ns)","Name"\n"1","x"\n')
    with pytest.raises(SourceError, match=r"s.csv:0: no report ds4lab reads .*um_sum"):
        ingest(p)


def test_untitled_table_of_unknown_shape_is_skipped_with_its_columns(tmp_path):
    text = TWO_REPORTS + '\n"Total Time (ns)","Num Calls","Name"\n"5","1","futex"\n'
    r = ingest(write(tmp_path, "s.csv", text))
    assert set(r.tables) == {"nsys_kernels", "nsys_osrt"}
    assert any("without a report title" in w and "Num Calls" in w for w in r.warnings)


def test_a_malformed_row_in_a_later_report_names_file_line_and_column(tmp_path):
    bad = TWO_REPORTS.replace('"80","100,000,000.0"', '"-80","100,000,000.0"')
    p = write(tmp_path, "s.csv", bad)
    line = bad.splitlines().index(next(l for l in bad.splitlines() if '"-80"' in l)) + 1
    with pytest.raises(SourceError, match=rf"s.csv:{line}: Num Calls=-80 is negative"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert r.tables["nsys_kernels"].name.tolist() == ["moe_gateup_decode"]  # nothing read before is lost
    assert "nsys_osrt" not in r.tables and r.problems[0]["line"] == line


def test_a_row_with_too_few_fields_names_the_report(tmp_path):
    bad = MEM.replace('"0.016","1","0.016","0.016","0.016","0.016","0.000","[CUDA memcpy Host-to-Device]"',
                      '"0.016","1","[CUDA memcpy Host-to-Device]"')
    with pytest.raises(SourceError, match=r"3 fields, the header of report cuda_gpu_mem_size_sum has 8"):
        ingest(write(tmp_path, "m.csv", bad))


# ----------------------------------------------------------------------------- SQLite
def make_export(path, *, node_level: bool, domain_row: bool = True, kernel_table="CUPTI_ACTIVITY_KIND_KERNEL",
                enum_table: bool = False, bad_graph: bool = False):
    """An nsys SQLite export of two eager kernels and two executions of one graph (graphId 7), with
    the graph's kernels (node level) or without them (graph level: --cuda-graph-trace=graph)."""
    con = sqlite3.connect(path)
    con.execute("create table StringIds (id integer primary key, value text)")
    con.executemany("insert into StringIds values (?, ?)",
                    [(1, "embed_token"), (2, "q8_matvec"), (3, "token"), (4, "layer"), (5, "ds4lab")])
    con.execute(f"create table {kernel_table} (start integer not null, end integer not null, deviceId integer, "
                "contextId integer, streamId integer, correlationId integer, globalPid integer, "
                "demangledName integer, shortName integer, mangledName integer, graphNodeId integer, graphId integer, "
                "gridX integer, gridY integer, gridZ integer, blockX integer, blockY integer, blockZ integer, "
                "registersPerThread integer)")
    rows = [(1000, 2000, 0, 1, 7, 100, 1, 1, 1, None, None, None, 1, 1, 1, 256, 1, 1, 16),
            (2500, 6000, 0, 1, 7, 101, 1, 2, 2, None, None, None, 64, 1, 1, 256, 1, 1, 32)]
    if node_level:
        rows += [(10000, 11000, 0, 1, 7, 102, 1, 1, 1, None, 1, 7, 1, 1, 1, 256, 1, 1, 16),
                 (11100, 14000, 0, 1, 7, 102, 1, 2, 2, None, 2, 7, 64, 1, 1, 256, 1, 1, 32)]
    con.executemany(f"insert into {kernel_table} values ({','.join('?' * 19)})", rows)
    con.execute("create table CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start integer not null, end integer not null, "
                "deviceId integer, contextId integer, streamId integer, correlationId integer, globalPid integer, "
                "graphId integer, graphExecId integer)")
    g = [(10000, 14500, 0, 1, 7, 102, 1, 7, 1), (20000, 24400, 0, 1, 7, 103, 1, 7, 1)]
    if bad_graph:
        g.append((30000, 29000, 0, 1, 7, 104, 1, 7, 1))
    con.executemany("insert into CUPTI_ACTIVITY_KIND_GRAPH_TRACE values (?,?,?,?,?,?,?,?,?)", g)
    con.execute("create table NVTX_EVENTS (start integer not null, end integer, eventType integer not null, "
                "rangeId integer, category integer, color integer, text text, globalTid integer, endGlobalTid "
                "integer, textId integer, domainId integer, uint64Value integer, int64Value integer)")
    tid = (4242 << 24) | 4242
    nv = [(500, 30000, 59, None, None, None, None, tid, None, 3, 2, None, 1000),  # ds4lab:token
          (600, 9000, 59, None, None, None, None, tid, None, 4, 2, None, 0),     # ds4lab:layer
          (700, 800, 59, None, None, None, "other", tid, None, None, 0, None, None)]  # the default domain
    if domain_row:
        nv.insert(0, (400, None, 75 if not enum_table else 99, None, None, None, "ds4lab", tid, None, None, 2, None,
                      None))
    con.executemany(f"insert into NVTX_EVENTS values ({','.join('?' * 13)})", nv)
    if enum_table:
        con.execute("create table ENUM_NSYS_EVENT_TYPE (id integer primary key, name text, label text)")
        con.executemany("insert into ENUM_NSYS_EVENT_TYPE values (?,?,?)",
                        [(59, "NvtxPushPopRange", "NVTX PushPop Range"), (99, "NvtxDomainCreate", "NVTX domain")])
    con.commit()
    con.close()


def test_graph_level_export_gives_graphs_and_a_warning_naming_the_fix(tmp_path):
    p = tmp_path / "graph.sqlite"
    make_export(p, node_level=False)
    r = ingest(p)
    assert r.tables["kernels"].name.tolist() == ["embed_token", "q8_matvec"]  # the eager ones only
    g = r.tables["graphs"]
    assert len(g) == 2 and g.graphId.tolist() == [7, 7] and g.us.tolist() == pytest.approx([4.5, 4.4])
    assert any("--cuda-graph-trace=node" in w and "graphId 7" in w for w in r.warnings)
    c = cli("ingest", p, "--out", tmp_path / "o")
    assert c.exit_code == 0 and "--cuda-graph-trace=node" in c.stderr
    assert (tmp_path / "o" / "graphs.csv").is_file()


def test_node_level_export_has_the_graph_kernels_and_no_warning(tmp_path):
    p = tmp_path / "node.sqlite"
    make_export(p, node_level=True)
    r = ingest(p)
    k = r.tables["kernels"]
    assert len(k) == 4 and k.graphId.fillna(0).tolist() == [0, 0, 7, 7]
    assert k.graphNodeId.fillna(0).tolist() == [0, 0, 1, 2] and k.gridX.tolist() == [1, 64, 1, 64]
    assert len(r.tables["graphs"]) == 2 and not r.warnings


def test_nvtx_rows_carry_their_domain_name(tmp_path):
    p = tmp_path / "n.sqlite"
    make_export(p, node_level=True)
    n = ingest(p).tables["nvtx"]
    assert n.name.tolist() == ["token", "layer", "other"]
    assert n.domain.tolist() == ["ds4lab", "ds4lab", "default"] and n.domain_id.tolist() == [2, 2, 0]


def test_domain_create_id_from_the_enum_table(tmp_path):
    p = tmp_path / "e.sqlite"
    make_export(p, node_level=True, enum_table=True)
    assert ingest(p).tables["nvtx"].domain.tolist()[:2] == ["ds4lab", "ds4lab"]


def test_unnamed_domain_says_so(tmp_path):
    p = tmp_path / "u.sqlite"
    make_export(p, node_level=True, domain_row=False)
    assert ingest(p).tables["nvtx"].domain[0].startswith("domain 2 (not named")


def test_version_suffixed_table_is_found(tmp_path):
    p = tmp_path / "v.sqlite"
    make_export(p, node_level=True, kernel_table="CUPTI_ACTIVITY_KIND_KERNEL_V2")
    assert len(ingest(p).tables["kernels"]) == 4


def test_bad_graph_row_names_the_row(tmp_path):
    p = tmp_path / "b.sqlite"
    make_export(p, node_level=True, bad_graph=True)
    with pytest.raises(SourceError, match=r"b.sqlite:3: graph execution row ending before it starts"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert len(r.tables["graphs"]) == 2 and len(r.tables["kernels"]) == 4


def test_ingest_all_writes_each_report_table(tmp_path):
    a = write(tmp_path, "a.csv", TWO_REPORTS + MEM)
    b = tmp_path / "b.sqlite"
    make_export(b, node_level=False)
    out = tmp_path / "o"
    ingest_all([a, b], out)
    names = {f.name for f in out.glob("*.csv")}
    assert {"nsys_kernels.csv", "nsys_osrt.csv", "nsys_mem_time.csv", "nsys_mem_size.csv", "kernels.csv",
            "graphs.csv", "nvtx.csv", "ingest_warnings.csv"} <= names
    # a second ingest of only one file leaves no table of the first behind
    ingest_all([a], out)
    assert not (out / "graphs.csv").exists() and not (out / "ingest_warnings.csv").exists()


def test_a_report_title_without_a_table_is_named(tmp_path):
    text = (" ** CUDA GPU MemOps Summary (by Time) (cuda_gpu_mem_time_sum):\n\n"
            "SKIPPED: report.sqlite does not contain GPU memory data.\n" + TWO_REPORTS)
    r = ingest(write(tmp_path, "s.csv", text))
    assert set(r.tables) == {"nsys_kernels", "nsys_osrt"}
    assert any("cuda_gpu_mem_time_sum has no table (SKIPPED: report.sqlite does not contain GPU memory data.)" in w
               for w in r.warnings)


@pytest.mark.parametrize("title,report,header,row,table,check", [
    ("CUDA API Summary", "cuda_api_sum",
     '"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"',
     '"55.0","2,500,000","1,121","2,230.1","2,100.0","1,900","9,800","300.2","cuLaunchKernel"',
     "nsys_cuda_api", lambda t: t.num_calls.item() == 1121 and t.name.item() == "cuLaunchKernel"),
    ("NVTX Range Summary", "nvtx_sum",
     '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Style","Range"',
     '"60.0","8,875,200","1","8,875,200.0","8,875,200.0","8,875,200","8,875,200","0.0","PushPop","ds4lab:token"',
     "nsys_nvtx", lambda t: t.name.item() == "ds4lab:token" and t["style"].item() == "PushPop"
     and t.total_time_us.item() == pytest.approx(8875.2)),
    ("NVTX Push/Pop Range Summary", "nvtxsum",
     '"Time(%)","Total Time (ns)","Instances","Average","Minimum","Maximum","StdDev","Range"',
     '"60.0","8,875,200","1","8,875,200.0","8,875,200","8,875,200","0.0","token"',
     "nsys_nvtx", lambda t: t.average_us.item() == pytest.approx(8875.2)),
    ("CUDA API Trace", "cuda_api_trace",
     '"Start (ns)","Duration (ns)","Name","Result","CorrID","Pid","Tid","T-Pri","Thread Name"',
     '"1,000","5,600","cudaLaunchKernel","0","11","4242","4242","20","python3"',
     "nsys_api_trace", lambda t: t.duration_us.item() == pytest.approx(5.6) and t.thread_name.item() == "python3"),
])
def test_each_report_kind_into_its_table(tmp_path, title, report, header, row, table, check):
    p = write(tmp_path, "r.csv", f"\n ** {title} ({report}):\n\n{header}\n{row}\n")
    r = ingest(p)
    assert set(r.tables) == {table} and check(r.tables[table])
    assert set(r.tables[table].report) == {report}


def test_unitless_size_columns_are_not_taken_for_times(tmp_path):
    old = ('Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2021.3/reports/gpumemsizesum.py]...\n\n'
           '"Total","Operations","Average","Minimum","Maximum","Operation"\n'
           '"16.000","1","16.000","16.000","16.000","[CUDA memcpy HtoD]"\n')
    r = ingest(write(tmp_path, "m.csv", old))
    t = r.tables["nsys_mem_size"]
    assert t.total_unit_not_stated.item() == 16.0 and t.average_unit_not_stated.item() == 16.0
    assert not any(c.endswith("_us") for c in t.columns)
    assert any("kept as printed" in w for w in r.warnings) and not any("read as ns" in w for w in r.warnings)
