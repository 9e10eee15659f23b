"""The measuring jobs' progress display: no refresh thread beside timed work, plain lines in a
Jupyter kernel without ipywidgets, CUDA versions written as users read them."""

from __future__ import annotations

import importlib.util
import io
import threading
import warnings

import pytest
from rich.console import Console

from ds4lab.progress import JobProgress
from ds4lab.report.provenance import cuda_version


def test_bar_starts_no_thread():
    con = Console(file=io.StringIO(), force_terminal=True)
    before = threading.active_count()
    with JobProgress(con, "timing", 10) as p:
        inside = threading.active_count()
        for _ in range(10):
            p.advance()
    assert inside == before, "a redraw thread would compete with host-bound timed launches for the GIL"
    assert p.done == 10


@pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is not None, reason="ipywidgets installed")
def test_jupyter_without_widgets_prints_quarters_and_no_warnings():
    printed = []

    class Recording(Console):
        def print(self, *objects, **kw):
            printed.extend(map(str, objects))

    con = Recording(file=io.StringIO(), force_jupyter=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with JobProgress(con, "moe profile", 8) as p:
            for _ in range(8):
                p.advance()
            p.describe("deferred · uniform")
    assert printed == ["moe profile: 2/8", "moe profile: 4/8", "moe profile: 6/8", "moe profile: 8/8"]


def test_in_jupyter_the_text_a_saved_notebook_keeps_is_plain(monkeypatch):
    """In Jupyter rich shows HTML and keeps a text/plain copy beside it, the text a saved notebook
    (ds4lab notebooks' executed copies) stores: no ANSI codes there, the HTML still styled."""
    import rich.console
    import rich.jupyter

    from ds4lab.progress import make_console

    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)  # as in a notebook's kernel
    shown = []
    monkeypatch.setattr(rich.jupyter, "display",
                        lambda segments, text: shown.append((rich.jupyter._render_segments(segments), text)))
    make_console().print("[bold]ds4lab ladder[/] · wrote 3 files in results/ladder")
    (html, text), = shown
    assert text == "ds4lab ladder · wrote 3 files in results/ladder\n"
    assert "font-weight: bold" in html and "color:" in html


@pytest.mark.parametrize("v,want", [(13020, "13.2"), (12080, "12.8"), (11000, "11.0"), (None, "None"), ("13.2", "13.2")])
def test_cuda_version(v, want):
    assert cuda_version(v) == want


def test_off_a_terminal_a_line_each_quarter_says_the_time_left(monkeypatch):
    """rich draws no bar into a pipe or a CI log: a line at each quarter, with an estimate."""
    import ds4lab.progress as P

    out = io.StringIO()
    con = Console(file=out, force_terminal=False, force_jupyter=False)
    clock = iter(range(100))
    monkeypatch.setattr(P.time, "perf_counter", lambda: float(next(clock)))
    with JobProgress(con, "timing stages", 8, eta=True) as p:
        for _ in range(8):
            p.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("timing stages: 2/8, about ") and lines[0].endswith(" left")
    assert lines[-1] == "timing stages: 8/8" and len(lines) == 4
    assert P.duration(40) == "40 s" and P.duration(600) == "10 min" and P.duration(3 * 3600 + 600) == "3 h 10 min"


def test_the_ladder_says_how_far_its_timing_is_and_how_long_is_left(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import ds4lab.jobs.ladder as L
    from ds4lab.cli import main

    monkeypatch.setattr(L, "ESTIMATE_AFTER_S", 0.0)  # the estimate line at once (it waits 5 s of timing)
    r = CliRunner().invoke(main, ["ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0,3", "--tokens",
                                  "8", "--repeats", "2", "--exact-tokens", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    # 2 stages × (8 warm-up + 4 tokens, then 2 warm-up + 4): 36, the bar's total (warm-up counted)
    assert "timing 36 tokens (2 stages × 2 rounds, warm-up included): about " in said, r.output
    assert "round 1/2 · stage 0: 9/36, about " in said and "round 2/2 · stage 0: 36/36" in said, r.output


def test_the_context_sweep_names_each_cell_and_runs_on_tiny_with_its_defaults(tmp_path):
    """``context --preset tiny`` failed on its own default contexts (65 536 past tiny's 4 096)."""
    from click.testing import CliRunner

    from ds4lab.cli import main

    r = CliRunner().invoke(main, ["context", "--backend", "sim", "--preset", "tiny", "--stages", "0,3",
                                  "--tokens", "4", "--warmup", "1", "--span", "4", "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "note: the tiny preset holds contexts up to 4096: running contexts 512,1024,2048" in said
    assert "context 2048 · round 1/1 · stage 3" in said and "about " in said, r.output
    import pandas as pd

    assert sorted(pd.read_csv(tmp_path / "c" / "context.csv").context.unique()) == [512, 1024, 2048]


@pytest.mark.parametrize("args,line", [
    (["exclusion", "--backend", "sim", "--preset", "tiny"], "sim: cells: 14/56, about "),
    (["moe", "--backend", "sim", "--preset", "tiny", "--tokens-per-step", "1,2", "--routing", "uniform",
      "--steps", "4"], "12/48, about "),
])
def test_every_job_that_times_estimates_the_time_left(tmp_path, args, line):
    from click.testing import CliRunner

    from ds4lab.cli import main

    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert line in " ".join(r.output.split()) and " left" in r.output, r.output


def test_off_a_terminal_a_short_read_leaves_no_lines_and_a_long_one_says_its_estimate(monkeypatch, tmp_path):
    """A reader's progress in a log: nothing for a read of a few seconds (no "reading X: n/N" four
    times over), quarters with the time left for one past LONG_PHASE_S."""
    import ds4lab.progress as P
    from ds4lab.trace.sources.common import Progress

    out = io.StringIO()
    con = Console(file=out, force_terminal=False, force_jupyter=False)
    with Progress(con, "reading x.csv.gz", 100) as prog:
        for n in range(0, 101, 10):
            prog.to(n)
    assert out.getvalue() == ""
    clock = iter(range(0, 1000, 4))  # 4 s a call: a read of about a minute
    monkeypatch.setattr(P.time, "perf_counter", lambda: float(next(clock)))
    with Progress(con, "reading x.csv.gz", 100) as prog:
        for n in range(0, 101, 5):
            prog.to(n)
    lines = out.getvalue().splitlines()
    assert lines and all(ln.startswith("reading x.csv.gz: ") for ln in lines) and len(lines) <= 4
    assert ", about " in lines[0] and lines[0].endswith(" left")


def test_off_a_terminal_a_long_line_is_not_wrapped(monkeypatch):
    """make_console off a terminal: a printed line stays one line, however long (grep finds it)."""
    import sys

    from ds4lab.progress import make_console

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    con = make_console()
    long = "kernel " + "x" * 400 + " end"
    con.print(long)
    assert out.getvalue().rstrip("\n") == long


def test_a_count_takes_its_nouns_number():
    from ds4lab.progress import counted

    assert [counted(n, "figure") for n in (0, 1, 2)] == ["0 figures", "1 figure", "2 figures"]
    assert counted(1, "launch", "launches") == "1 launch" and counted(3, "launch", "launches") == "3 launches"


def test_the_ladders_exactness_phase_says_how_far_it_is_and_how_long_is_left(tmp_path):
    """The exactness phase computes every token (the longest phase of a CPU run): after stage 0's
    reference and after each stage, the runs done and the time left at the pace so far."""
    from click.testing import CliRunner

    from ds4lab.cli import main

    r = CliRunner().invoke(main, ["ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0,3", "--tokens",
                                  "2", "--repeats", "1", "--exact-tokens", "2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "exactness at 1000: stage 0's reference recorded (1/3 runs of 2 tokens, about " in said, r.output
    assert "stage 3: bit-identical to stage 0 (3/3 runs of 2 tokens)" in said, r.output
