"""compare's honest labels (issue 20): devices and processes apart, the same folder twice refused,
legends naming what differs between the sources, no colour repeated silently, no MoE panel dropped
silently, MODELED in titles, n/a drawn as n/a, eager fallbacks shown."""

from __future__ import annotations

import json
import sqlite3

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.report import plots
from ds4lab.jobs.compare import compare
from ds4lab.report.compare_tables import CompareError, collect

LADDER = ("stage,short,us_median,us_p25,us_p75,n,backend,preset,modeled\n"
          "0,\"eager, legacy\",{a:.1f},10328.9,10711.4,200,{backend},small,{modeled}\n"
          "3,whole token,{b:.1f},8800.0,8900.0,200,{backend},small,{modeled}\n")


def ladder_run(tmp_path, name, rng, **meta):
    d = tmp_path / name
    d.mkdir()
    m = {"ds4lab": "0.1.0", "job": "ladder", "status": "complete", "modeled": True, "backend": "sim",
         "preset": {"name": "small"}, "stages": ["0", "3"], "long_context": False, "start_pos": 1000,
         "calibration": {"name": "NVIDIA H200 (2026-11-30)", "shipped": True}, **meta}
    (d / "ladder.csv").write_text(LADDER.format(a=rng.uniform(9e3, 1.1e4), b=rng.uniform(700, 4000),
                                                backend=m["backend"], modeled=m["modeled"]))
    (d / "meta.json").write_text(json.dumps(m))
    return d


def labels(dirs):
    return [t.label for t in collect(dirs, lambda m: None)]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# ----------------------------------------------------------------------------- devices and processes
def two_gpu_export(path, rng):
    """An nsys SQLite export of one kernel run on two GPUs (deviceId 0 and 1) by two processes."""
    con = sqlite3.connect(path)
    con.execute("create table StringIds (id integer primary key, value text)")
    con.execute("insert into StringIds values (1, 'moe_gateup_decode')")
    con.execute("create table CUPTI_ACTIVITY_KIND_KERNEL (start integer not null, end integer not null, "
                "deviceId integer, contextId integer, streamId integer, correlationId integer, globalPid integer, "
                "demangledName integer, shortName integer)")
    rows, t = [], 1000
    for dev, pid in ((0, 1111), (1, 2222)):
        for _ in range(3):
            dur = int(rng.integers(10_000, 40_000))
            rows.append((t, t + dur, dev, 1, 7, len(rows), pid, 1, 1))
            t += dur + 500
    con.executemany("insert into CUPTI_ACTIVITY_KIND_KERNEL values (?,?,?,?,?,?,?,?,?)", rows)
    con.commit()
    con.close()
    return rows


def test_two_gpus_are_two_bars_never_one_sum(tmp_path, rng, monkeypatch):
    rows = two_gpu_export(tmp_path / "two.sqlite", rng)
    assert cli("ingest", tmp_path / "two.sqlite", "--out", tmp_path / "ing").exit_code == 0
    got = {}
    real = plots.grouped_bars_figure

    def bars(series, xs, ylabel, title, rotate=False, **kw):
        got.update(series)
        return real(series, xs, ylabel, title, rotate=rotate, **kw)

    monkeypatch.setattr(plots, "grouped_bars_figure", bars)
    compare([tmp_path / "ing"], tmp_path / "cmp")
    per_dev = {dev: sum(e - s for s, e, d, *_ in rows if d == dev) / 1e3 for dev in (0, 1)}
    assert len(got) == 2
    (k0, v0), (k1, v1) = sorted(got.items())
    assert "device 0" in k0 and "device 1" in k1
    assert v0["moe_gateup_decode"] == pytest.approx(per_dev[0]) and v1["moe_gateup_decode"] == pytest.approx(per_dev[1])


# ----------------------------------------------------------------------------- the same folder twice
def test_the_same_folder_twice_is_refused_by_path_and_by_content(tmp_path, rng):
    import shutil

    a = ladder_run(tmp_path, "a", rng)
    with pytest.raises(CompareError, match="given twice"):
        compare([a, tmp_path / "." / "a"], tmp_path / "cmp")
    shutil.copytree(a, tmp_path / "copy")
    r = cli("compare", a, tmp_path / "copy", "--out", tmp_path / "cmp")
    assert r.exit_code == 2 and "the same content as" in r.stderr and not (tmp_path / "cmp").exists()


# ----------------------------------------------------------------------------- what differs, named
def test_legends_name_the_settings_that_differ(tmp_path, rng):
    short = ladder_run(tmp_path, "short", rng)
    at785 = ladder_run(tmp_path, "lc785", rng, long_context=True, start_pos=785, stages=["0", "3", "3c"])
    at3874 = ladder_run(tmp_path, "lc3874", rng, long_context=True, start_pos=3874, stages=["0", "3", "3c"])
    got = labels([short, at785, at3874])
    assert "standard token" in got[0] and "start 1000" in got[0] and "stages 0,3 " in got[0] + " "
    assert "long-context token" in got[1] and "start 785" in got[1] and "stages 0,3,3c" in got[1]
    assert "long-context token" in got[2] and "start 3874" in got[2]
    assert len(set(got)) == 3
    edited = ladder_run(tmp_path, "edited", rng, preset={"name": "tiny"}, calibration={
        "name": "NVIDIA H200 (2026-11-30)", "shipped": False, "path": "/tmp/mine.json", "sha256": "ab" * 32})
    got = labels([short, edited])
    assert "small" in got[0] and "tiny" in got[1]
    assert "calibration NVIDIA H200 (2026-11-30) (/tmp/mine.json, sha256 abababababab)" in got[1]
    same = labels([short, ladder_run(tmp_path, "again", rng)])
    assert not any("start" in s or "token" in s for s in same), "settings shared by every source are not repeated"


# ----------------------------------------------------------------------------- colours, panels, titles, n/a
def test_colours_never_repeat_silently(rng):
    series = {f"source {i}": {"0": float(v)} for i, v in enumerate(rng.uniform(1, 10, 45))}
    fig = plots.grouped_bars_figure(series, ["0"], "µs", "t")
    looks = [(tuple(p.get_facecolor()), p.get_hatch()) for p in fig.axes[0].patches]
    plt.close(fig)
    assert len(looks) == 45 and len(set(looks)) == 45
    with pytest.raises(ValueError, match="at most 120"):
        plots.series_style(120)


def test_no_moe_panel_is_dropped_without_a_note(rng):
    stages = ["xq", "gateup"]
    tokens = [1, 2, 3, 16, 64, 128, 256, 512, 1024]
    src = {"a": {T: {s: float(v) for s, v in zip(stages, rng.uniform(1, 50, 2))} for T in tokens}}
    fig = plots.compare_moe_figure(src, stages)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    notes = " ".join(t.get_text() for t in fig.texts)
    plt.close(fig)
    assert len(titles) == 8 and "1024 tokens per step" in notes and "not drawn" in notes
    fig = plots.compare_moe_figure({"a": {T: src["a"][T] for T in tokens[:7]}}, stages)  # seven panels: all drawn
    assert len([ax for ax in fig.axes if ax.get_title()]) == 7
    assert not any("not drawn" in t.get_text() for t in fig.texts)
    plt.close(fig)


def test_titles_say_modeled_where_any_source_is(tmp_path, rng, monkeypatch):
    sim = ladder_run(tmp_path, "sim", rng)
    gpu = ladder_run(tmp_path, "gpu", rng, modeled=False, backend="cupy", device="NVIDIA H200", measured=True)
    got = {}
    real = plots.grouped_bars_figure

    def bars(series, xs, ylabel, title, rotate=False, **kw):
        got.setdefault("titles", []).append(title)
        return real(series, xs, ylabel, title, rotate=rotate, **kw)

    monkeypatch.setattr(plots, "grouped_bars_figure", bars)
    compare([sim, gpu], tmp_path / "c1")
    compare([sim], tmp_path / "c2")
    compare([gpu], tmp_path / "c3")
    assert "MODELED and measured" in got["titles"][0]
    assert "MODELED (simulated runtime)" in got["titles"][1] and "MODELED" not in got["titles"][2]


@pytest.mark.parametrize("exact, mark", [(True, "✓"), (False, "✗"), ("n/a", "not checked"), (None, "not checked")])
def test_a_ladder_without_an_exactness_check_says_not_checked(exact, mark):
    df = pd.DataFrame({"stage": ["0", "3"], "short": ["eager", "whole token"], "us_median": [100.0, 40.0],
                       "us_p25": [90.0, 39.0], "us_p75": [110.0, 41.0], "floor_us": [30.0, 30.0],
                       "speedup": [1.0, 2.5], "exact": [exact, exact], "kernel_launches": [10, 0],
                       "graph_launches": [0, 1]})
    fig = plots.ladder_figure(df, {"modeled": True, "calibration": "h200", "preset": "tiny"})
    texts = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert all(mark in t for t in texts)
    others = {"✓", "✗", "not checked"} - {mark}
    assert not any(o in t for t in texts for o in others)


def test_a_sim_ladder_with_exact_tokens_0_draws_not_checked(tmp_path):
    out = tmp_path / "lad"
    r = cli("ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0,3", "--tokens", "4", "--repeats", "1",
            "--exact-tokens", "0", "--out", out)
    assert r.exit_code == 0, r.output
    svg = (out / "ladder.svg").read_text()
    assert svg.count("not checked") == 3  # both bars, and the footnote that defines it
    assert svg.count("✓") == 1 and svg.count("✗") == 1  # the footnote only: no bar claims or denies exactness


# ----------------------------------------------------------------------------- eager fallbacks
@pytest.mark.slow
def test_moe_calls_that_fell_back_to_eager_are_shown(tmp_path):
    out = tmp_path / "moe"
    r = cli("moe", "--backend", "sim", "--preset", "tiny", "--mode", "host-timed", "--regime", "replayed",
            "--tokens-per-step", "2", "--routing", "uniform", "--steps", "3", "--no-overhead", "--share-tokens", "0",
            "--out", out)
    assert r.exit_code == 0, r.output
    assert "eager fallback" in r.output and "calls that fell back to eager" in r.output
    s = pd.read_csv(out / "summary.csv")
    assert (s.fallback_calls == s.calls).all() and (s.calls > 0).all()
    assert "eager fallback" in (out / "moe-stages.svg").read_text()
    assert json.loads((out / "meta.json").read_text())["eager_fallbacks"][0]["fallback_calls"] == int(s.calls[0])
    c = cli("compare", out, "--out", tmp_path / "cmp")
    assert c.exit_code == 0 and "eager fallback in" in (tmp_path / "cmp" / "compare_moe.svg").read_text()


def test_a_stage_a_source_did_not_run_is_marked_not_left_blank():
    """``compare``'s ladder bars: a stage one folder ran and another did not shows ``n/a`` in the
    empty slot, and the note says what it means."""
    series = {"a (H200)": {"0": 15600.0, "i": 8100.0, "3": 7100.0}, "b (sim)": {"0": 15000.0, "3": 7000.0}}
    fig = plots.grouped_bars_figure(series, ["0", "i", "3"], "µs per token (median)", "stage ladder")
    try:
        ax = fig.axes[0]
        marks = [t for t in ax.texts if t.get_text() == "n/a"]
        assert len(marks) == 1  # b's slot at stage i
        assert any("n/a: the source has no such value" in t.get_text() for t in ax.texts)
    finally:
        plt.close(fig)
