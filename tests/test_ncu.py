"""Nsight Compute ``ncu --csv`` output (details and raw pages, program output and ``==PROF==``
lines before the CSV, ds4lab's NVTX stack) into per-kernel and per-site tables, joined to
ds4lab's launch sites; compare's per-site bandwidth figure. Inputs written from the published
format (Nsight Compute CLI guide: --csv, --page, --nvtx; the column layout ncu prints)."""

from __future__ import annotations

import csv
import io

import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.jobs.ingest import ingest, site_table
from ds4lab.trace.sources import SourceError, detect
from ds4lab.trace.sources.ncu import ds4lab_levels, join_sites, parse_nvtx_stack, per_site

NVTX_COL = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
HEAD = ["ID", "Process ID", "Process Name", "Host Name", NVTX_COL, "Kernel Name", "Context", "Stream", "Block Size",
        "Grid Size", "Device", "CC"]


def stack(*ranges, tid=4242):
    """An NVTX cell as ncu prints it: the thread id, then each push/pop range quoted."""
    return f"{tid}  " + "  ".join(f'"ds4lab:{n}:INT64:{p}:ARGB:ff4c72b0:ASCII:{n}"' for n, p in ranges)


KERNELS = [  # id, kernel, grid, block, NVTX stack, duration (usecond), DRAM %, SM %, memory %, registers
    (0, "hc_premix", "(1, 1, 1)", "(1024, 1, 1)",
     stack(("token", 1000), ("layer", 0), ("hc_attn", 0), ("premix_norm", 0)), "3.71", "1.20", "2.50", "2.90", "32"),
    (1, "q8_matvec", "(4, 1, 1)", "(256, 1, 1)",
     stack(("token", 1000), ("layer", 0), ("query", 0), ("q_a", 0)), "12.50", "61.40", "20.10", "61.40", "40"),
    (2, "q8_matvec", "(4, 1, 1)", "(256, 1, 1)",
     stack(("token", 1000), ("layer", 1), ("query", 1), ("q_a", 1)), "12.30", "62.00", "20.00", "62.00", "40"),
    (3, "embed_token", "(1, 1, 1)", "(256, 1, 1)",
     stack(("token", 1001), ("embed", -1), ("embed", -1)), "1.10", "3.00", "1.00", "3.00", "16"),
]
METRICS = [("GPU Speed Of Light Throughput", "Duration", "usecond", 5),
           ("GPU Speed Of Light Throughput", "DRAM Throughput", "%", 6),
           ("GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", 7),
           ("GPU Speed Of Light Throughput", "Memory Throughput", "%", 8),
           ("Launch Statistics", "Registers Per Thread", "register/thread", 9)]
PREAMBLE = ("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
            "ds4lab run · ds4-flash · cupy backend\n"
            "==PROF== Profiling \"hc_premix\" - 0: 0%....50%....100% - 9 passes\n")


def details(rows=KERNELS, rule_columns=True, preamble=PREAMBLE, tail="==PROF== Disconnected from process 4242\n"):
    """``ncu --csv --nvtx --section SpeedOfLight --section LaunchStats`` (details page) output."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    extra = ["Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]
    w.writerow(HEAD + ["Section Name", "Metric Name", "Metric Unit", "Metric Value"] + (extra if rule_columns else []))
    for kid, name, grid, block, nv, *vals in rows:
        base = [str(kid), "4242", "python3.12", "127.0.0.1", nv, name, "1", "13", block, grid, "0", "9.0"]
        for section, metric, unit, idx in METRICS:
            w.writerow(base + [section, metric, unit, vals[idx - 5]] + ([""] * 5 if rule_columns else []))
        if rule_columns:
            w.writerow(base + ["SpeedOfLight", "", "", "", "SOLBottleneck", "OPT", "Memory is more heavily utilized",
                               "", ""])
    return preamble + buf.getvalue() + tail


RAW_METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread"]


def raw(rows=KERNELS):
    """``ncu --csv --page raw --nvtx --metrics ...`` output: a header, a units row, one row per kernel."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(HEAD + RAW_METRICS)
    w.writerow([""] * len(HEAD) + ["nsecond", "%", "%", "%", "register/thread"])
    for kid, name, grid, block, nv, dur, dram, sm, mem, reg in rows:
        w.writerow([str(kid), "4242", "python3.12", "127.0.0.1", nv, name, "1", "13", block, grid, "0", "9.0",
                    f"{float(dur) * 1000:,.0f}", dram, sm, mem, reg])
    return PREAMBLE + buf.getvalue()


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_nvtx_stack_cell_parsed_outermost_first():
    s = parse_nvtx_stack(stack(("token", 1000), ("layer", 3), ("query", 3), ("q_a", 3)))
    assert [r["name"] for r in s] == ["token", "layer", "query", "q_a"]
    assert [r["payload"] for r in s] == [1000, 3, 3, 3] and {r["domain"] for r in s} == {"ds4lab"}
    assert ds4lab_levels(s) == {"position": 1000, "layer": 3, "cluster": "query", "op": "q_a"}
    # outside a layer (the embedding), and another domain's range, are not taken for ds4lab's
    other = parse_nvtx_stack('7  "<default domain>:step:none:none:none:none:none:none"  '
                             '"ds4lab:token:INT64:5:ARGB:0:ASCII:token"  "ds4lab:embed:INT64:-1:x:0:y:embed"  '
                             '"ds4lab:embed:INT64:-1:x:0:y:embed"')
    assert ds4lab_levels(other) == {"position": 5, "layer": None, "cluster": "embed", "op": "embed"}
    # a range name holding ':' keeps it; "none" payloads are None
    odd = parse_nvtx_stack('1  "<default domain>:step:3:none:none:none:none:none:none"')
    assert odd == [{"domain": "<default domain>", "name": "step:3", "payload": None}]


@pytest.mark.parametrize("page", ["details", "raw"])
def test_pages_give_one_row_per_kernel(tmp_path, page):
    p = write(tmp_path, "ncu.csv", details() if page == "details" else raw())
    assert detect(p) == "ncu-csv"
    r = ingest(p)
    k = r.tables["ncu_kernels"]
    assert k.id.tolist() == [0, 1, 2, 3] and set(k.page) == {page}
    assert k.kernel.tolist() == ["hc_premix", "q8_matvec", "q8_matvec", "embed_token"]
    assert k.grid[1] == "(4, 1, 1)" and k.block[0] == "(1024, 1, 1)"
    assert k.duration_us.tolist() == pytest.approx([3.71, 12.5, 12.3, 1.1])  # usecond, or nsecond → µs
    assert k.dram_pct.tolist() == pytest.approx([1.2, 61.4, 62.0, 3.0])
    assert k.sm_pct[1] == pytest.approx(20.1) and k.memory_pct[1] == pytest.approx(61.4)
    assert k.registers.tolist() == [32, 40, 40, 16]
    assert k.cluster.tolist() == ["hc_attn", "query", "query", "embed"]
    assert k.op.tolist() == ["premix_norm", "q_a", "q_a", "embed"]
    assert k.layer.tolist()[:3] == [0, 0, 1] and pd.isna(k.layer[3]) and k.position.tolist() == [1000] * 3 + [1001]
    assert "ds4lab:token > ds4lab:layer" in k.nvtx[0]
    assert k.provenance[0] == "Nsight Compute, CC 9.0"
    m = r.tables["ncu_metrics"]
    assert len(m) >= 4 * 5 and set(m.file) == {str(p)}


def test_details_without_rule_columns_and_without_preamble(tmp_path):
    p = write(tmp_path, "n.csv", details(rule_columns=False, preamble="", tail=""))
    assert len(ingest(p).tables["ncu_kernels"]) == 4


def test_per_site_medians(tmp_path):
    k = ingest(write(tmp_path, "ncu.csv", details())).tables["ncu_kernels"]
    s = per_site(k)
    q = s[(s.cluster == "query") & (s.op == "q_a")].iloc[0]
    assert q.launches == 2 and q.dram_pct == pytest.approx(61.7) and q.duration_us == pytest.approx(12.4)
    assert s.iloc[0].op == "q_a"  # the most time first


def test_join_to_launch_sites_gives_bytes_and_bandwidth(tmp_path):
    sites = site_table("tiny")
    q_a = sites[(sites.cluster == "query") & (sites.op == "q_a") & (sites.layer == 0)].iloc[0]
    k = ingest(write(tmp_path, "ncu.csv", details())).tables["ncu_kernels"]
    j = join_sites(k, sites)
    row = j[(j.op == "q_a") & (j.layer == 0)].iloc[0]
    assert row["site_kernel"] == q_a["kernel"] == "q8_matvec" and row["nbytes"] == q_a["nbytes"]
    assert row["achieved_GBps"] == pytest.approx(q_a["nbytes"] / (12.5 * 1e3))
    assert j.site_known.all()
    e = j[j.op == "embed"].iloc[0]  # outside a layer: joined on layer -1
    assert e.site_kernel == "embed_token"


def test_ingest_with_sites_flags_unknown_ops(tmp_path):
    rows = KERNELS + [(4, "mystery", "(1, 1, 1)", "(32, 1, 1)",
                       stack(("token", 1000), ("layer", 0), ("query", 0), ("not_a_site", 0)),
                       "1.0", "1.0", "1.0", "1.0", "8")]
    r = ingest(write(tmp_path, "ncu.csv", details(rows)), sites="tiny")
    k = r.tables["ncu_kernels"]
    assert k.site_known.tolist() == [True, True, True, True, False]
    assert any("query/not_a_site" in w for w in r.warnings)
    assert "achieved_GBps" in r.tables["ncu_sites"]


def test_ingest_with_an_unknown_preset_is_an_error(tmp_path):
    with pytest.raises(SourceError, match=r"--sites nope: unknown preset"):
        ingest(write(tmp_path, "ncu.csv", details()), sites="nope")


def test_no_nvtx_stack_is_warned_about(tmp_path):
    rows = [(kid, n, g, b, "", *v) for kid, n, g, b, _nv, *v in KERNELS]
    r = ingest(write(tmp_path, "ncu.csv", details(rows)))
    assert r.tables["ncu_kernels"].op.isna().all()
    assert any("no kernel carries ds4lab's NVTX stack" in w for w in r.warnings)


@pytest.mark.parametrize("bad,why", [
    ('"4.2x"', r"metric 'Duration' \(GPU Speed Of Light Throughput\): '4.2x' is not a number"),
    ('"-3"', r"metric 'Duration' \(GPU Speed Of Light Throughput\) = -3 is negative"),
])
def test_malformed_metric_value_names_file_and_line(tmp_path, bad, why):
    text = details()
    lines = text.splitlines()
    n = next(i for i, l in enumerate(lines) if '"Duration","usecond","12.50"' in l)
    lines[n] = lines[n].replace('"12.50"', bad)
    p = write(tmp_path, "ncu.csv", "\n".join(lines) + "\n")
    with pytest.raises(SourceError, match=rf"ncu.csv:{n + 1}: {why}"):
        ingest(p)
    r = ingest(p, lenient=True)
    assert len(r.tables["ncu_kernels"]) == 4 and r.problems[0]["line"] == n + 1


def test_unknown_duration_unit_is_malformed(tmp_path):
    p = write(tmp_path, "ncu.csv", details().replace('"Duration","usecond"', '"Duration","fortnight"'))
    with pytest.raises(SourceError, match=r"unit 'fortnight' is not a time unit"):
        ingest(p)


def test_short_row_is_malformed(tmp_path):
    text = details() + '"9","4242","python3.12"\n'
    n = len(text.splitlines())
    with pytest.raises(SourceError, match=rf"ncu.csv:{n}: 3 fields, the ncu header"):
        ingest(write(tmp_path, "ncu.csv", text))


def test_prof_lines_without_csv_are_not_ncu_csv(tmp_path):
    p = write(tmp_path, "log.txt", "==PROF== Connected to process 1\nhello\n")
    with pytest.raises(SourceError, match="not a ds4 MoE profile log"):
        detect(p, want="tables")


def test_cli_ingest_and_compare_draw_per_site_bandwidth(tmp_path):
    a = write(tmp_path, "h200.csv", details())
    b = write(tmp_path, "other.csv", raw())
    out = tmp_path / "ncu"
    r = CliRunner().invoke(main, ["ingest", str(a), str(b), "--out", str(out), "--sites", "tiny"])
    assert r.exit_code == 0, r.output
    s = pd.read_csv(out / "ncu_sites.csv")
    assert set(s.file) == {str(a), str(b)} and {"cluster", "op", "dram_pct", "achieved_GBps"} <= set(s.columns)
    c = CliRunner().invoke(main, ["compare", str(out), "--out", str(tmp_path / "cmp")])
    assert c.exit_code == 0, c.output
    assert (tmp_path / "cmp" / "compare_ncu_sites.png").is_file()


def test_join_without_layer_payloads_uses_the_sites_first_layer():
    sites = site_table("tiny")
    k = pd.DataFrame({"cluster": ["query", "embed", "query"], "op": ["q_a", "embed", "nope"],
                      "layer": [None, None, None], "duration_us": [10.0, 1.0, 1.0], "kernel": ["q8_matvec"] * 3})
    j = join_sites(k, sites)
    first = sites[(sites.cluster == "query") & (sites.op == "q_a")].iloc[0]
    assert j["nbytes"][0] == first["nbytes"] and j["site_layer"][0] == first["layer"]
    assert j["site_kernel"][1] == "embed_token" and j["site_layer"][1] == -1
    assert j.site_known.tolist() == [True, True, False] and pd.isna(j["nbytes"][2])


def test_readme_ncu_command_is_the_one_the_device_script_runs():
    """The Nsight Compute command of docs/nsight.md (linked from the README) is the one the ``nsight``
    step of scripts/gpu_round.sh runs on the GPU machine (so what the page shows is what was tested
    there)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def words(text):
        return re.sub(r"\s+", " ", text.replace("\\\n", " ")).strip()

    readme = (root / "docs" / "nsight.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", readme, re.S) if b.lstrip().startswith("ncu "))
    shown = words(block.split("> ncu.csv")[0])
    script = (root / "scripts" / "gpu_round.sh").read_text()
    run = words(script[script.index("ncu --nvtx"):script.index("> $R/ncu.csv")])
    run = run.replace("'", '"').replace("$D", "python3 -m ds4lab.cli").replace("$R/ncu-run", "results/ncu-run")
    assert run == shown
