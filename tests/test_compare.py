"""ds4lab compare: which tables a folder can hold, folders it cannot read, incomplete and modeled runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ds4lab.jobs.compare import compare
from ds4lab.report.compare_tables import CompareError, collect

LADDER = ("stage,short,us_median,us_p25,us_p75,n,backend,preset,modeled\n"
          "0,\"eager, legacy\",10524.0,10328.9,10711.4,200,cupy,{preset},False\n"
          "3,whole token,8875.2,8800.0,8900.0,200,cupy,{preset},False\n")
SUMMARY = ("mode,backend,routing,tokens,stage,n,median_ms,p25_ms,p75_ms,iqr_ms,modeled\n"
           + "".join(f"deferred,cupy,uniform,1,{s},12,{v},{v},{v},0.0,False\n"
                     for s, v in zip(["xq", "sort", "gateup", "midq", "down", "sum"],
                                     [0.013, 0.002, 0.03, 0.004, 0.013, 0.004])))
MOE_ROWS = "token,layer,tokens,pairs,stage,ms,mode,backend,routing,modeled\n" + "".join(
    f"0,0,1,6,{s},{v},deferred,sim,uniform,True\n"
    for s, v in zip(["xq", "sort", "gateup", "midq", "down", "sum"], [0.02, 0.003, 0.05, 0.006, 0.02, 0.006]))
DS4 = ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.013 sort=0.003 gateup=0.031 midq=0.004 down=0.013 "
       "sum=0.004 total=0.068 ms")


def meta(device="NVIDIA H200", **kw):
    return json.dumps({"ds4lab": "0.1.0", "device": device, "measured": True, **kw})


def folder(tmp_path, name, files):
    d = tmp_path / name
    d.mkdir(parents=True)
    for f, text in files.items():
        (d / f).write_text(text)
    return d


def cli(*args):
    from click.testing import CliRunner

    from ds4lab.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # never a traceback
    return r


def labels(dirs, kind=None, warn=None):
    return [t.label for t in collect(dirs, warn or (lambda m: None)) if kind is None or t.kind == kind]


def test_measurement_folder_names_are_recognised(tmp_path):
    """As kept under docs/measurements/: ladder-<preset>.csv with ladder-<preset>.meta.json,
    summary-<preset>.csv with meta-<preset>.json, moe-ds4.log beside them."""
    lad = folder(tmp_path, "ladder", {
        "ladder-ds4-flash.csv": LADDER.format(preset="ds4-flash"),
        "ladder-ds4-flash.meta.json": meta(job="ladder", status="complete"),
        "ladder-small.csv": LADDER.format(preset="small"), "ladder-ds4-flash.png": "png"})
    moe = folder(tmp_path, "moe", {"summary-ds4-flash.csv": SUMMARY, "moe-ds4.log": DS4 + "\n",
                                   "meta-ds4-flash.json": meta(job="moe", status="complete"),
                                   "share.csv": "token,share\n0,0.2\n"})
    got = labels([lad, moe])
    assert got == ["ladder · ladder-ds4-flash (NVIDIA H200)", "ladder · ladder-small (cupy backend, no meta.json)",
                   "moe · summary-ds4-flash (NVIDIA H200)"]  # the log repeats the summary's run: not drawn twice
    out = tmp_path / "cmp"
    r = cli("compare", lad, moe, "--out", out)
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {f"compare_{k}.{e}" for k in ("ladder", "moe")
                                               for e in ("png", "svg", "pdf")} | {"meta.json"}


def test_a_log_alone_is_drawn_with_its_folder_meta(tmp_path):
    d = folder(tmp_path, "moe", {"moe-ds4.log": DS4 + "\n", "meta-ds4-flash.json": meta(job="moe", status="complete")})
    assert labels([d]) == ["moe · moe-ds4 (NVIDIA H200)"]


def test_unreadable_folder_is_an_error_and_nothing_is_written(tmp_path):
    good = folder(tmp_path, "good", {"ladder.csv": LADDER.format(preset="small"), "meta.json": meta(status="complete")})
    bad = folder(tmp_path, "bad", {"notes.txt": "hello", "census.csv": "a,b\n1,2\n", "meta.json": meta()})
    out = tmp_path / "cmp"
    r = cli("compare", good, bad, "--out", out)
    assert r.exit_code == 2
    assert str(bad) in r.stderr and "looked for" in r.stderr and "ladder-<name>.csv" in r.stderr
    assert str(good) not in r.stderr.split("looked for")[0]  # only the unreadable folder is named
    assert not out.exists()
    with pytest.raises(CompareError, match="no table compare can draw in .*bad"):
        compare([good, bad], out)


@pytest.mark.parametrize("files,why", [
    ({"ladder.csv": "stage,median\n0,1\n"}, r"ladder.csv: not a ladder table: no column us_median"),
    ({"ladder.csv": "stage,us_median\n0,10\n3,fast\n"}, r"ladder.csv:3: us_median='fast' is not a number"),
    ({"ladder.csv": ""}, r"ladder.csv: empty file"),
    ({"ladder.csv": "stage,us_median\n"}, r"ladder.csv: a ladder table without rows"),
    ({"ladder.csv": LADDER.format(preset="small"), "meta.json": "{broken"}, r"meta.json:1: broken JSON"),
    ({"ladder.csv": LADDER.format(preset="small"), "meta.json": "[1, 2]"}, r"meta.json: a JSON array"),
    ({"moe-ds4.log": DS4.replace("xq=0.013", "xq=.") + "\n"}, r"moe-ds4.log:1: malformed .*xq='\.'"),
])
def test_unreadable_table_or_meta_is_an_error(tmp_path, files, why):
    d = folder(tmp_path, "run", files)
    with pytest.raises(CompareError, match=why):
        compare([d], tmp_path / "cmp")
    r = cli("compare", d, "--out", tmp_path / "cmp")
    assert r.exit_code == 2 and str(d) in r.stderr
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("status,tag", [("running", "running"), ("interrupted", "interrupted"),
                                        ("failed: out of memory", "failed: out of memory"), (None, "no status")])
def test_incomplete_run_is_warned_about_and_labelled(tmp_path, status, tag):
    m = {"job": "ladder"} if status is None else {"job": "ladder", "status": status}
    d = folder(tmp_path, "killed", {"ladder.csv": LADDER.format(preset="small"), "meta.json": meta(**m)})
    ok = folder(tmp_path, "done", {"ladder.csv": LADDER.format(preset="small"),
                                   "meta.json": meta(job="ladder", status="complete")})
    warned = []
    got = labels([d, ok], warn=warned.append)
    assert got == [f"killed (NVIDIA H200) (incomplete: {tag})", "done (NVIDIA H200)"]
    assert len(warned) == 1 and str(d) in warned[0] and repr(tag) in warned[0]
    r = cli("compare", d, ok, "--out", tmp_path / "cmp")
    assert r.exit_code == 0 and "warning" in r.stderr and str(d) in r.stderr and tag in r.stderr


def test_status_done_and_ingested_status_column(tmp_path):
    d = folder(tmp_path, "d", {"ladder.csv": LADDER.format(preset="small"), "meta.json": meta(status="done")})
    assert labels([d]) == ["d (NVIDIA H200)"]
    src = folder(tmp_path, "src", {"summary.csv": SUMMARY, "meta.json": meta(job="moe", status="interrupted")})
    ing = tmp_path / "ing"
    assert cli("ingest", src, "--out", ing).exit_code == 0
    assert labels([ing]) == ["ing · ds4lab_summary (NVIDIA H200) (incomplete: interrupted)"]


def test_modeled_labels_from_meta_rows_and_ds4lab_header(tmp_path):
    sim = folder(tmp_path, "sim", {"moe.csv": MOE_ROWS, "summary.csv": SUMMARY,
                                   "meta.json": meta("CPU", modeled=True, calibration="h200", status="complete")})
    assert labels([sim]) == ["sim (MODELED, calibration h200)"]  # rows kept, the same run's summary not twice
    norows = folder(tmp_path, "norows", {"moe.csv": MOE_ROWS})  # no meta: the rows' modeled column says it
    assert labels([norows]) == ["norows (MODELED)"]
    # ds4lab's own ds4-format log, ingested: MODELED, unlike a real ds4 log
    log = tmp_path / "moe-ds4.log"
    log.write_text("# ds4lab moe · MODELED by the sim backend (calibration h200), not measured\n" + DS4 + "\n")
    real = tmp_path / "ds4.log"
    real.write_text("ds4: loading\n" + DS4 + "\n")
    assert cli("ingest", log, "--out", tmp_path / "a").exit_code == 0
    assert cli("ingest", real, "--out", tmp_path / "b").exit_code == 0
    assert labels([tmp_path / "a", tmp_path / "b"]) == ["a · ds4_moe (MODELED)", "b · ds4_moe (ds4)"]
    r = cli("compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "cmp")
    assert r.exit_code == 0 and (tmp_path / "cmp" / "compare_moe.svg").read_text().count("MODELED") >= 1


def test_same_folder_names_stay_apart(tmp_path):
    a = folder(tmp_path, "x/run", {"ladder.csv": LADDER.format(preset="small"), "meta.json": meta(status="complete")})
    b = folder(tmp_path, "y/run", {"ladder.csv": LADDER.format(preset="small").replace("8875.2", "8870.1"),
                                   "meta.json": meta(status="complete")})  # another run: other numbers
    got = labels([a, b])
    assert len(set(got)) == 2 and str(b) in got[1]


def test_ingested_folders_one_bar_per_source(tmp_path):
    srcs = [folder(tmp_path, n, {"ladder.csv": LADDER.format(preset="small"),
                                 "meta.json": meta(dev, status="complete")})
            for n, dev in (("h200", "NVIDIA H200"), ("h100", "NVIDIA H100"))]
    assert cli("ingest", *srcs, "--out", tmp_path / "ing").exit_code == 0
    assert labels([tmp_path / "ing"]) == ["ing · ds4lab_ladder · h200/ladder (NVIDIA H200)",
                                          "ing · ds4lab_ladder · h100/ladder (NVIDIA H100)"]


def test_nsys_kernel_tables_are_drawn(tmp_path):
    """README: ingest an nsys stats CSV, then compare it with a ladder folder."""
    stats = tmp_path / "stats.csv"
    stats.write_text('"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
                     '"StdDev (ns)","Name"\n"60.0","1,234,567","43","28,710.9","28,704.0","28,512","29,120","120.5",'
                     '"moe_gateup_decode"\n')
    assert cli("ingest", stats, "--out", tmp_path / "nsys").exit_code == 0
    lad = folder(tmp_path, "lad", {"ladder.csv": LADDER.format(preset="small"), "meta.json": meta(status="complete")})
    r = cli("compare", tmp_path / "nsys", lad, "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cmp" / "compare_kernels.png").exists() and (tmp_path / "cmp" / "compare_ladder.png").exists()
    # nsys sums a kernel over every device and process of the report: the figure says so
    assert "add up every device and process" in (tmp_path / "cmp" / "compare_kernels.svg").read_text()


def test_moe_comparison_is_like_for_like(tmp_path):
    """Per token count, one mode (in-graph before deferred) and uniform routing only."""
    from ds4lab.report.compare_tables import Table, _moe_by_tokens

    rows = []
    for mode, scale in (("deferred", 10.0), ("in-graph", 1.0)):
        for routing, r in (("uniform", 1.0), ("worst", 0.5)):
            for T in (1, 2):
                rows.append({"mode": mode, "routing": routing, "tokens": T, "stage": "gateup",
                             "ms": 0.02 * T * scale * r})
    mode, per = _moe_by_tokens(Table("moe", pd.DataFrame(rows), tmp_path / "moe.csv"))
    assert mode == "in-graph · uniform"
    assert per == {1: {"gateup": pytest.approx(20.0)}, 2: {"gateup": pytest.approx(40.0)}}


# ----------------------------------------------------------------------------- ingested tables: one bar per input file
def ds4(gateup, tokens=1, total=None):
    stages = {"xq": 0.013, "sort": 0.003, "gateup": gateup, "midq": 0.004, "down": 0.013, "sum": 0.004}
    tot = sum(stages.values()) if total is None else total
    return (f"ds4: CUDA MoE profile tokens={tokens} pairs={6 * tokens} "
            + " ".join(f"{k}={v:.3f}" for k, v in stages.items()) + f" total={tot:.3f} ms")


def drawn(monkeypatch):
    """What compare hands to the figure helpers: {figure: {legend label: values}}."""
    from ds4lab.report import plots

    got = {}
    real_bars, real_moe = plots.grouped_bars_figure, plots.compare_moe_figure

    def bars(series, xs, ylabel, title, rotate=False, **kw):
        got["kernels" if rotate else "ladder"] = series
        got["title " + ("kernels" if rotate else "ladder")] = title
        return real_bars(series, xs, ylabel, title, rotate=rotate, **kw)

    def moe(sources, stages, **kw):
        got["moe"] = sources
        got["title moe"] = kw.get("title")
        return real_moe(sources, stages, **kw)

    monkeypatch.setattr(plots, "grouped_bars_figure", bars)
    monkeypatch.setattr(plots, "compare_moe_figure", moe)
    return got


def test_two_ds4_logs_ingested_together_are_two_bars(tmp_path, monkeypatch):
    a = tmp_path / "a.log"
    a.write_text(ds4(0.010) + "\n" + ds4(0.012) + "\n")
    b = tmp_path / "b.log"
    b.write_text(ds4(0.050) + "\n")
    assert cli("ingest", a, b, "--out", tmp_path / "o").exit_code == 0
    got = drawn(monkeypatch)
    compare([tmp_path / "o"], tmp_path / "cmp")
    assert got["moe"] == {"o · ds4_moe · a.log (ds4) · host-timed · ds4": {1: pytest.approx({
                              "xq": 13.0, "sort": 3.0, "gateup": 11.0, "midq": 4.0, "down": 13.0, "sum": 4.0,
                              "total": 48.0})},
                          "o · ds4_moe · b.log (ds4) · host-timed · ds4": {1: pytest.approx({
                              "xq": 13.0, "sort": 3.0, "gateup": 50.0, "midq": 4.0, "down": 13.0, "sum": 4.0,
                              "total": 87.0})}}  # each file's own median, never both files'


def test_two_nsys_reports_ingested_together_are_two_bars(tmp_path, monkeypatch):
    head = ('"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)",'
            '"Name"\n')
    for name, total in (("h200.csv", "1,000,000"), ("h100.csv", "3,000,000")):
        (tmp_path / name).write_text(head + f'"60.0","{total}","43","1","1","1","1","0","moe_gateup_decode"\n')
    assert cli("ingest", tmp_path / "h200.csv", tmp_path / "h100.csv", "--out", tmp_path / "o").exit_code == 0
    got = drawn(monkeypatch)
    compare([tmp_path / "o"], tmp_path / "cmp")
    assert {k: v["moe_gateup_decode"] for k, v in got["kernels"].items()} == {
        "o · nsys_kernels · h200.csv (ingested nsys-csv, no device recorded)": pytest.approx(1000.0),
        "o · nsys_kernels · h100.csv (ingested nsys-csv, no device recorded)": pytest.approx(3000.0)}


def test_one_log_per_mode_and_routing_one_labelled_bar_each(tmp_path, monkeypatch):
    hdr = "# ds4lab moe · mode={} · routing={} · measured on NVIDIA H200 · driver 580"
    logs = []
    for k, (mode, routing) in enumerate((("in-graph", "uniform"), ("in-graph", "zipf"), ("cupti", "uniform"))):
        p = tmp_path / f"moe-{mode}-{routing}.log"
        p.write_text(hdr.format(mode, routing) + "\n" + ds4(0.010 * (k + 1)) + "\n")
        logs.append(p)
    mixed = tmp_path / "mixed.log"  # one file, two modes: one mode drawn (in-graph first), never their median
    mixed.write_text("\n".join([hdr.format("deferred", "uniform"), ds4(0.100), hdr.format("in-graph", "uniform"),
                                ds4(0.020)]) + "\n")
    old = tmp_path / "old.log"
    old.write_text("# ds4lab moe · measured on NVIDIA H200\n" + ds4(0.040) + "\n")
    assert cli("ingest", *logs, mixed, old, "--out", tmp_path / "o").exit_code == 0
    got = drawn(monkeypatch)
    compare([tmp_path / "o"], tmp_path / "cmp")
    gateup = {k: v[1]["gateup"] for k, v in got["moe"].items()}
    tag = "(ds4lab moe · measured on NVIDIA H200 · driver 580)"
    assert gateup == {f"o · ds4_moe · moe-in-graph-uniform.log {tag} · in-graph · uniform": pytest.approx(10.0),
                      f"o · ds4_moe · moe-in-graph-zipf.log {tag} · in-graph · zipf": pytest.approx(20.0),
                      f"o · ds4_moe · moe-cupti-uniform.log {tag} · cupti · uniform": pytest.approx(30.0),
                      f"o · ds4_moe · mixed.log {tag} · in-graph · uniform": pytest.approx(20.0),
                      "o · ds4_moe · old.log (ds4lab moe · measured on NVIDIA H200) · mode unknown · "
                      "routing unknown": pytest.approx(40.0)}


def test_ingested_moe_rows_and_their_summary_are_one_bar(tmp_path, monkeypatch):
    sim = folder(tmp_path, "sim", {"moe.csv": MOE_ROWS, "summary.csv": SUMMARY,
                                   "meta.json": meta("CPU", modeled=True, status="complete")})
    other = folder(tmp_path, "other", {"summary.csv": SUMMARY, "meta.json": meta(status="complete")})
    assert cli("ingest", sim, other, "--out", tmp_path / "ing").exit_code == 0
    assert labels([tmp_path / "ing"], kind=None) == [
        "ing · ds4lab_moe (MODELED)",  # sim's rows; its summary is the same numbers: not drawn
        "ing · ds4lab_summary · other/summary (NVIDIA H200)"]


def test_preset_in_ladder_and_moe_labels(tmp_path):
    lad = folder(tmp_path, "ladder", {"ladder.csv": LADDER.format(preset="small"),
                                      "meta.json": meta("CPU", modeled=True, status="complete",
                                                        preset={"name": "small", "n_layers": 2})})
    named = folder(tmp_path, "named", {"ladder-ds4-flash.csv": LADDER.format(preset="ds4-flash"),
                                       "ladder-ds4-flash.meta.json": meta(status="complete", preset="ds4-flash")})
    moe = folder(tmp_path, "moe", {"summary.csv": SUMMARY, "meta.json": meta(status="complete", preset="tiny")})
    assert labels([lad, named, moe]) == ["ladder · small (MODELED)",
                                         "named · ladder-ds4-flash (NVIDIA H200)",  # the file name says it
                                         "moe · summary · tiny (NVIDIA H200)"]


# ----------------------------------------------------------------------------- figures
def test_bar_legend_is_beside_the_axes(tmp_path, monkeypatch):
    from ds4lab.report import plots

    seen = {}
    real = plots.save

    def save(fig, stem, formats=("png", "svg", "pdf")):
        fig.canvas.draw()
        ax = fig.axes[0]
        leg = ax.get_legend() or (fig.legends[0] if fig.legends else None)
        seen[Path(stem).name] = (leg.get_window_extent(), ax.get_window_extent())
        return real(fig, stem, formats)

    monkeypatch.setattr(plots, "save", save)
    dirs = [folder(tmp_path, f"run{k}", {"ladder.csv": LADDER.format(preset="small").replace("8875.2", f"887{k}.2"),
                                         "meta.json": meta(status="complete")}) for k in range(3)]
    stats = tmp_path / "stats.csv"
    stats.write_text(' ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):\n\n"Total Time (ns)","Instances","Name"\n'
                     '"1,000","1","k1"\n')
    assert cli("ingest", stats, "--out", tmp_path / "nsys").exit_code == 0
    compare([*dirs, tmp_path / "nsys"], tmp_path / "cmp")
    for stem in ("compare_ladder", "compare_kernels"):
        leg, ax = seen[stem]
        assert leg.x0 >= ax.x1, stem  # right of the axes: no bar under it


def test_compare_out_holds_this_runs_figures_only(tmp_path):
    lad = folder(tmp_path, "lad", {"ladder.csv": LADDER.format(preset="small"), "meta.json": meta(status="complete")})
    moe = folder(tmp_path, "moe", {"summary.csv": SUMMARY, "meta.json": meta(status="complete")})
    out = tmp_path / "cmp"
    assert cli("compare", lad, moe, "--out", out).exit_code == 0
    (out / "notes.png").write_text("mine")
    assert cli("compare", lad, "--out", out).exit_code == 0
    assert {p.name for p in out.iterdir()} == {"compare_ladder.png", "compare_ladder.svg", "compare_ladder.pdf",
                                               "notes.png", "meta.json"}
    bad = folder(tmp_path, "bad", {"notes.txt": "hello"})
    assert cli("compare", bad, "--out", out).exit_code == 2  # an error leaves the figures there
    assert (out / "compare_ladder.svg").exists()


def test_a_running_folder_whose_process_is_gone_is_flagged_died(tmp_path):
    """compare asks results.read_meta: a run that died without cleaning up is not 'running'."""
    import json

    from ds4lab.report.compare_tables import _load_meta

    (tmp_path / "meta.json").write_text(json.dumps({"job": "ladder", "status": "running",
                                                    "run": {"pid": 2 ** 22 + 12345, "host": __import__("socket").gethostname()}}))
    assert _load_meta(tmp_path / "meta.json")["status"] == "died"
