"""ds4lab compare of context ladders (``ds4lab context``'s context.csv): drawn side by side, one panel
per stage, only the contexts every source holds, what a source lacks named in the figure; labels
naming what differs and MODELED; a context folder beside a ladder folder."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.report import plots
from ds4lab.jobs.compare import compare
from ds4lab.report.compare_tables import CompareError, collect

ROOT = Path(__file__).resolve().parents[1]
H200_OLD = ROOT / "docs/measurements/h200-2026-11-30b/context"  # stages 0,2,3,3c at 1024…65536, a context.log beside
H200 = ROOT / "docs/measurements/h200-2026-12-01/round3/context"  # stages 0,i,i+,3,3c at 1024 and 16384
SHORT = {"0": "eager, legacy", "i": "ds4 islands", "3": "whole token", "3c": "one graph"}
CAL = {"name": "NVIDIA H200 (2026-12-01)", "shipped": True}


def context_run(tmp_path, name, rng, stages=("0", "3", "3c"), contexts=(1024, 4096), modeled=True, **meta):
    """A context folder as ``ds4lab context`` writes it (random µs); returns (folder, its rows)."""
    d = tmp_path / name
    d.mkdir(parents=True)
    backend = "sim" if modeled else "cupy"
    m = {"ds4lab": "0.1.0", "job": "context", "status": "complete", "modeled": modeled, "backend": backend,
         "measured": not modeled, "preset": {"name": "tiny" if modeled else "ds4-flash", "long_context": True},
         "stages": list(stages), "contexts": list(contexts), "tokens": 16, "span": 8,
         **({"calibration": CAL, "device": "simulated GPU"} if modeled else {"device": "NVIDIA H200"}), **meta}
    rows = []
    for c in contexts:
        for st in stages:
            med = float(rng.uniform(500, 20000))
            rows.append({"stage": st, "short": SHORT[st], "context": c, "us_median": med,
                         "us_p25": med - float(rng.uniform(1, 400)), "us_p75": med + float(rng.uniform(1, 400)),
                         "n": 16, "exact": True, "backend": backend, "preset": m["preset"]["name"],
                         "modeled": modeled})
    df = pd.DataFrame(rows)
    df.to_csv(d / "context.csv", index=False)
    (d / "meta.json").write_text(json.dumps(m))
    return d, df


def ladder_run(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "ladder.csv").write_text("stage,short,us_median,us_p25,us_p75,n,backend,preset,modeled\n"
                                  "0,\"eager, legacy\",10524.0,10328.9,10711.4,200,cupy,ds4-flash,False\n"
                                  "3,whole token,8875.2,8800.0,8900.0,200,cupy,ds4-flash,False\n")
    (d / "meta.json").write_text(json.dumps({"ds4lab": "0.1.0", "job": "ladder", "status": "complete",
                                             "device": "NVIDIA H200", "measured": True, "backend": "cupy",
                                             "preset": {"name": "ds4-flash"}, "stages": ["0", "3"],
                                             "long_context": False, "start_pos": 1000}))
    return d


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # never a traceback
    return r


def drawn(monkeypatch):
    """What compare hands to the figure helpers: {"context": sources, "context title", "ladder": series}."""
    got = {}
    real_ctx, real_bars = plots.compare_context_figure, plots.grouped_bars_figure

    def ctx(sources, stages=None, **kw):
        got["context"], got["context stages"], got["context title"] = sources, list(stages), kw.get("title")
        got["context names"] = kw.get("names")
        return real_ctx(sources, stages, **kw)

    def bars(series, xs, ylabel, title, rotate=False, **kw):
        got["ladder"] = series
        return real_bars(series, xs, ylabel, title, rotate=rotate, **kw)

    monkeypatch.setattr(plots, "compare_context_figure", ctx)
    monkeypatch.setattr(plots, "grouped_bars_figure", bars)
    return got


def figure_text(fig) -> str:
    return " ".join([t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes]
                    + [t.get_text() for ax in fig.axes for t in ax.texts])


# ----------------------------------------------------------------------------- two context folders
def test_two_context_folders_are_drawn_side_by_side(tmp_path, rng, monkeypatch):
    gpu, gdf = context_run(tmp_path, "gpu", rng, modeled=False)
    sim, sdf = context_run(tmp_path, "sim", rng)
    got = drawn(monkeypatch)
    out = tmp_path / "cmp"
    r = cli("compare", gpu, sim, "--out", out)
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {f"compare_context.{e}" for e in ("png", "svg", "pdf")} | {"meta.json"}
    # labels: the preset that differs, the GPU or MODELED with its calibration; the stages, shared, not repeated
    assert list(got["context"]) == ["gpu · ds4-flash (NVIDIA H200)",
                                    "sim · tiny (MODELED, calibration NVIDIA H200 (2026-12-01))"]
    assert got["context stages"] == ["0", "3", "3c"]
    assert got["context names"] == {"0": "eager, legacy", "3": "whole token", "3c": "one graph"}
    for (label, pts), df in zip(got["context"].items(), (gdf, sdf)):
        assert pts == {st: {int(r.context): pytest.approx((r.us_median, r.us_p25, r.us_p75)) for r in g.itertuples()}
                       for st, g in df.groupby("stage", sort=False)}, label
    assert "MODELED and measured" in got["context title"]
    svg = (out / "compare_context.svg").read_text()
    assert "MODELED" in svg and "NVIDIA H200" in svg
    assert json.loads((out / "meta.json").read_text())["labels"] == list(got["context"])
    # the same folder twice, or a copy of it, is still two sources of the same numbers: refused
    with pytest.raises(CompareError, match="given twice"):
        compare([gpu, tmp_path / "." / "gpu"], tmp_path / "cmp2")


def test_context_labels_name_the_settings_that_differ(tmp_path, rng):
    a, _ = context_run(tmp_path, "a", rng)
    b, _ = context_run(tmp_path, "b", rng, stages=("0", "i", "3", "3c"),
                       calibration={"name": "mine", "shipped": False, "path": "/tmp/mine.json", "sha256": "cd" * 32})
    c, _ = context_run(tmp_path, "c", rng, status="running")
    warned = []
    got = [t.label for t in collect([a, b, c], warned.append) if t.kind == "context"]
    assert "stages 0,3,3c" in got[0] and "stages 0,i,3,3c" in got[1]
    assert "calibration NVIDIA H200 (2026-12-01)" in got[0]
    assert "calibration mine (/tmp/mine.json, sha256 cdcdcdcdcdcd)" in got[1]
    assert all("MODELED" in g for g in got)
    assert got[2].endswith("(incomplete: running)") and len(warned) == 1 and str(c) in warned[0]


# ----------------------------------------------------------------------------- like with like
def test_only_contexts_every_source_holds_are_drawn_and_the_rest_is_named(rng):
    def pts(contexts):
        return {c: (m, m - 10, m + 10) for c, m in zip(contexts, rng.uniform(100, 1000, len(contexts)))}

    a = {"0": pts([1024, 2048, 16384]), "3": pts([1024, 2048, 16384]), "i": pts([1024, 2048, 16384])}
    b = {"0": pts([1024, 4096, 16384]), "3": pts([1024, 4096])}  # no stage i; stage 3 not at 16384
    fig = plots.compare_context_figure({"A": a, "B": b}, ["0", "i", "3"], names={"0": "eager", "3": "whole token"})
    try:
        panels = [ax for ax in fig.axes if ax.get_title()]
        assert [ax.get_title().split("\n")[0] for ax in panels] == ["stage 0 · eager", "stage i",
                                                                   "stage 3 · whole token"]
        for ax in panels:
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1024", "16384"]
        assert "not in 1 of 2 sources" in panels[1].get_title()
        assert "not in" not in panels[0].get_title() + panels[2].get_title()
        # each source's medians at the contexts drawn, in order; a gap (NaN) where it has none
        lines = {c.get_label(): c.lines[0].get_ydata() for c in panels[0].containers}
        assert list(lines["A"]) == pytest.approx([a["0"][1024][0], a["0"][16384][0]])
        assert list(lines["B"]) == pytest.approx([b["0"][1024][0], b["0"][16384][0]])
        b3 = {c.get_label(): c.lines[0].get_ydata() for c in panels[2].containers}["B"]
        assert b3[0] == pytest.approx(b["3"][1024][0]) and b3[1] != b3[1]
        text = figure_text(fig)
        assert "• A: context 4096" in text  # the others' 4096 is not drawn: named
        assert "• B: context 2048; stage i; stage 3 at 16384" in text
    finally:
        plt.close(fig)
    fig = plots.compare_context_figure({"A": {"i": pts([1024])}, "B": {"0": pts([1024]), "i": pts([1024])}},
                                       ["0", "i"])
    try:  # A has no stage 0, the first panel: in the legend all the same
        assert [t.get_text() for t in fig.legends[0].get_texts()] == ["A", "B"]
    finally:
        plt.close(fig)
    fig = plots.compare_context_figure({"A": {"0": pts([1024])}, "B": {"0": pts([2048])}}, ["0"])
    try:
        text = figure_text(fig)
        assert "no context is in every source" in text
        assert "• A: context 2048" in text and "• B: context 1024" in text
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- mixed inputs
def test_a_context_folder_beside_a_ladder_folder_is_two_figures(tmp_path, rng, monkeypatch):
    """A ladder is one position, a context ladder several: never one figure; each legend names only
    what differs within its own figure (here: nothing, though the ladder's stages and preset differ)."""
    ctx, _ = context_run(tmp_path, "ctx", rng, modeled=False, preset={"name": "tiny"})
    lad = ladder_run(tmp_path, "lad")
    got = drawn(monkeypatch)
    out = tmp_path / "cmp"
    r = cli("compare", ctx, lad, "--out", out)
    assert r.exit_code == 0, r.output
    assert {p.stem for p in out.iterdir()} == {"compare_context", "compare_ladder", "meta"}
    assert list(got["context"]) == ["ctx · tiny (NVIDIA H200)"]
    assert list(got["ladder"]) == ["lad · ds4-flash (NVIDIA H200)"]
    assert "MODELED" not in got["context title"]
    # a second context folder changes the context figure's legends only
    ctx2, _ = context_run(tmp_path, "ctx2", rng, modeled=False, stages=("0", "3"))
    labels = {t.kind: [] for t in collect([ctx, lad, ctx2], lambda m: None)}
    for t in collect([ctx, lad, ctx2], lambda m: None):
        labels[t.kind].append(t.label)
    assert labels == {"context": ["ctx · tiny · stages 0,3,3c (NVIDIA H200)",
                                  "ctx2 · ds4-flash · stages 0,3 (NVIDIA H200)"],
                      "ladder": ["lad · ds4-flash (NVIDIA H200)"]}


@pytest.mark.parametrize("text,why", [
    ("stage,us_median\n0,10\n", r"context.csv: not a context table: no column context"),
    ("stage,context,us_median\n0,1024,10\n3,late,8\n", r"context.csv:3: context='late' is not a number"),
    ("stage,context,us_median\n0,1024,10\n3,,8\n", r"context.csv:3: context=.* is not a number"),
    ("stage,context,us_median\n0,1024,fast\n", r"context.csv:2: us_median='fast' is not a number"),
])
def test_a_context_table_that_cannot_be_drawn_is_an_error(tmp_path, text, why):
    d = tmp_path / "run"
    d.mkdir()
    (d / "context.csv").write_text(text)
    with pytest.raises(CompareError, match=why):
        compare([d], tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists()


# ----------------------------------------------------------------------------- the H200 records
def test_two_h200_context_records_compare_like_with_like(tmp_path, monkeypatch):
    """The stored H200 records: 1024 and 16384 in both; 4096 and 65536, stage 2 and stages i, i+ named
    as missing. The older record's console log (context.log) is no table and is passed over."""
    assert (H200_OLD / "context.log").is_file()
    got = drawn(monkeypatch)
    figs = []
    real_save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, stem, formats=("png", "svg", "pdf"):
                        figs.append(figure_text(fig)) or real_save(fig, stem, formats))
    r = cli("compare", H200_OLD, H200, "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    old, new = got["context"]
    assert "stages 0,2,3,3c" in old and "stages 0,i,i+,3,3c" in new and "(NVIDIA H200)" in new
    assert got["context stages"] == ["0", "i", "i+", "2", "3", "3c"]  # ladder order
    assert set(got["context"][old]["0"]) == {1024, 4096, 16384, 65536}
    assert got["context"][new]["3c"][16384][0] == pytest.approx(12633.264064788818)
    text = figs[0]
    assert "the contexts every source holds (1024, 16384)" in text
    assert f"• {old}: stages i, i+" in text and f"• {new}: contexts 4096, 65536; stage 2" in text


def test_a_console_log_beside_a_table_is_passed_over(tmp_path):
    lad = ladder_run(tmp_path, "lad")
    (lad / "ladder.log").write_text("ds4lab ladder · ds4-flash · measured on NVIDIA H200\nstage 0 10524.0 µs\n")
    assert [t.label for t in collect([lad], lambda m: None)] == ["lad · ds4-flash (NVIDIA H200)"]
    only = tmp_path / "only"
    only.mkdir()
    (only / "run.log").write_text("hello\n")
    with pytest.raises(CompareError, match="no table compare can draw in .*only"):
        compare([only], tmp_path / "cmp")


@pytest.mark.slow
def test_a_sim_context_run_beside_the_h200_record(tmp_path, monkeypatch):
    """GPU against sim, as exported into a pull request: a real sim run, MODELED in its label and the
    title, the contexts only one of them holds named."""
    sim = tmp_path / "sim"
    r = cli("context", "--backend", "sim", "--preset", "tiny", "--stages", "0,3c", "--contexts", "1024,2048",
            "--tokens", "2", "--warmup", "1", "--out", sim)
    assert r.exit_code == 0, r.output
    got = drawn(monkeypatch)
    out = tmp_path / "cmp"
    r = cli("compare", H200, sim, "--out", out)
    assert r.exit_code == 0, r.output
    gpu_label, sim_label = got["context"]
    assert gpu_label.startswith("context · ds4-flash") and "(NVIDIA H200)" in gpu_label
    assert sim_label.startswith("sim · tiny") and "(MODELED, calibration NVIDIA H200" in sim_label
    assert "stages 0,3c" in sim_label and "stages 0,i,i+,3,3c" in gpu_label
    assert "MODELED and measured" in got["context title"]
    assert set(got["context"][sim_label]) == {"0", "3c"}
    svg = (out / "compare_context.svg").read_text()
    assert "MODELED" in svg
