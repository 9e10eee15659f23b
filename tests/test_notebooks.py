"""The notebooks and their runner: committed without outputs; each runs top to bottom on the
simulated runtime with small parameters, headless, through ``ds4lab.report.notebook_runner`` (nbclient);
the runner's parameter handling and failure reporting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.report.notebook_runner import (NotebookError, coerce, find_notebooks, parameter_defaults,
                                           parse_assignments, run_notebook, set_parameters)

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
SMALL = {
    "BACKEND": "sim", "PRESET": "tiny", "TOKENS": 8, "STAGES": "0,1,3",
    "SWEEP_LAYERS": [2, 4], "SWEEP_LAUNCH_US": [5.0, 9.4], "SWEEP_TOKENS": [1, 2], "HAZARD_PRESET": "tiny",
    "TOKENS_PER_STEP": "1,2,16", "ROUTINGS": "uniform,worst", "STEPS": 2, "CONTEXTS": "128,600",
    "ENGINE": "llama", "CACHE": "dynamic", "TRACE": None, "TOKEN_RANGE": "decode_step",
}
#: Per notebook, where SMALL's value does not fit: 04's context ladder runs an island stage and 3c (a
#: long-context stage). Its CONTEXTS, 128 and 600, cross a top-k regime change of tiny. 05 on BACKEND sim
#: audits the bundled recording of ENGINE and CACHE.
SMALL_FOR = {"04_long_context.ipynb": {"STAGES": "0,i,3,3c"}}


def _notebook(*sources, params="A = 1\nB = 'x'  # a comment\nOUT = 'o'"):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell] + [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} == {"00_quickstart.ipynb", "01_moe_timing.ipynb",
                                           "02_profiling_vs_capture.ipynb", "03_stage_gains.ipynb",
                                           "04_long_context.ipynb", "05_audit.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs and c.execution_count is None, f"{path.name}: a cell has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_cell_first_and_covered(path):
    """One parameters cell, the first code cell, with BACKEND and OUT; every parameter the CI run
    relies on is there under the name the SMALL table uses."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first.metadata.get("tags", [])
    names = parameter_defaults(nb)
    assert {"BACKEND", "OUT"} <= set(names)
    assert set(names) - {"OUT", "MODES"} <= set(SMALL), "a parameter CI does not shrink"


def test_set_parameters_rewrites_only_named_lines():
    nb = _notebook()
    unused = set_parameters(nb, {"A": [2, 3], "Z": 5})
    assert unused == {"Z": 5}
    src = nb.cells[0].source.splitlines()
    assert src[0].startswith("A = [2, 3]")
    assert src[1] == "B = 'x'  # a comment"
    assert parameter_defaults(nb)["A"] == [2, 3]


def test_set_parameters_refuses_a_non_literal():
    with pytest.raises(NotebookError, match="A="):
        set_parameters(_notebook(), {"A": object()})


def test_a_notebook_needs_exactly_one_parameters_cell():
    nb = _notebook()
    nb.cells[0].metadata["tags"] = []
    with pytest.raises(NotebookError, match="found 0"):
        parameter_defaults(nb)


@pytest.mark.parametrize("text,default,want", [
    ("0,1,3", "0,1", "0,1,3"), ('"small"', "x", "small"), ("small", None, "small"), ("None", "x", "None"),
    ("None", None, None), ("8", None, 8), ("8", 200, 8), ("2.5", 9.4, 2.5), ("3", 9.4, 3.0),
    ("[2, 4]", [4, 8], [2, 4]), ("(2, 4)", [4, 8], [2, 4]), ("false", True, False),
])
def test_coerce_follows_the_default(text, default, want):
    got = coerce("P", text, default)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("text,default", [("eight", 200), ("2.5", 200), ("True", 200), ("4", [4]), ("maybe", True)])
def test_coerce_names_a_bad_value(text, default):
    with pytest.raises(NotebookError, match=f"P={text!r}"):
        coerce("P", text, default)


def test_parse_assignments():
    assert parse_assignments(["PRESET=small", "X = 1=2"]) == {"PRESET": "small", "X": "1=2"}
    for bad in ("PRESET", "=3", "1A=2"):
        with pytest.raises(NotebookError, match="NAME=VALUE"):
            parse_assignments([bad])


def test_find_notebooks_by_name_prefix_and_all():
    assert find_notebooks([], NB_DIR) == NOTEBOOKS
    assert [p.name for p in find_notebooks(["01", "00_quickstart"], NB_DIR)] == \
        ["01_moe_timing.ipynb", "00_quickstart.ipynb"]
    with pytest.raises(NotebookError, match="'0' matches several"):
        find_notebooks(["0"], NB_DIR)
    with pytest.raises(NotebookError, match="'99' is not"):
        find_notebooks(["99"], NB_DIR)


@pytest.mark.slow
def test_a_failing_cell_keeps_the_outputs_before_it(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    src = tmp_path / "broken.ipynb"
    nbformat.write(_notebook("print('first', A)", "raise RuntimeError('boom ' + B)", "print('never')"), src)
    r = run_notebook(src, {"A": 41, "B": "y"}, tmp_path / "run" / "broken.ipynb", out_dir=tmp_path / "o",
                     timeout=60)
    assert not r.ok and r.failed_cell == 3 and r.error == "RuntimeError: boom y"
    done = nbformat.read(r.executed, as_version=4)
    assert "first 41" in done.cells[1].outputs[0]["text"]
    assert not done.cells[3].outputs, "cells after the failure do not run"
    assert done.metadata["ds4lab"]["executed"]["parameters"]["OUT"] == str((tmp_path / "o").resolve())
    assert not src.read_text().count("first 41"), "the source notebook is left as it was"


def test_cli_refuses_unknown_parameter_before_running(tmp_path):
    res = CliRunner().invoke(main, ["notebooks", "--set", "PRESTE=small", "--out", str(tmp_path / "o"),
                                    "--dir", str(NB_DIR)])
    assert res.exit_code == 2 and "PRESTE" in res.output and "PRESET" in res.output
    assert not (tmp_path / "o").exists()


def test_cli_refuses_badly_typed_value(tmp_path):
    res = CliRunner().invoke(main, ["notebooks", "--set", "TOKENS=many", "--out", str(tmp_path / "o"),
                                    "--dir", str(NB_DIR)])
    assert res.exit_code == 2 and "TOKENS='many'" in res.output


def test_cli_lists_parameters():
    res = CliRunner().invoke(main, ["notebooks", "--list", "--dir", str(NB_DIR)])
    assert res.exit_code == 0
    assert "01_moe_timing: BACKEND='auto', PRESET=None, TOKENS_PER_STEP='1,2,3,64,512'" in res.output


@pytest.mark.slow
def test_cli_reports_a_failed_notebook_and_runs_the_rest(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    d = tmp_path / "nbs"
    d.mkdir()
    nbformat.write(_notebook("raise ValueError('bad ' + str(A))"), d / "a_bad.ipynb")
    nbformat.write(_notebook("import pathlib; pathlib.Path(OUT).mkdir(parents=True); print(B)"), d / "b_good.ipynb")
    res = CliRunner().invoke(main, ["notebooks", "--dir", str(d), "--set", "A=7", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    assert "FAILED at code cell 2 of 2 in a_bad.ipynb: ValueError: bad 7" in res.output
    runs = json.loads((tmp_path / "o" / "runs.json").read_text())["runs"]
    assert [(r["notebook"], r["ok"]) for r in runs] == [("a_bad.ipynb", False), ("b_good.ipynb", True)]
    assert (tmp_path / "o" / "b_good").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_on_sim(path, tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    names = parameter_defaults(nbformat.read(path, as_version=4))
    values = {n: v for n, v in {**SMALL, **SMALL_FOR.get(path.name, {})}.items() if n in names}
    r = run_notebook(path, values, tmp_path / path.name, out_dir=tmp_path / "out", timeout=600)
    assert r.ok, f"{path.name} failed at code cell {r.failed_cell}: {r.error}"
    assert r.figures, "every notebook exports at least one figure"
    executed = nbformat.read(r.executed, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells])
    assert "MODELED" in text or "modeled" in text, "on sim the notebook says its figures are modeled"


@pytest.mark.slow
def test_an_executed_notebook_is_plain_text_and_names_the_folder_the_results_are_in(tmp_path):
    """Through `ds4lab notebooks`: what the jobs printed is kept without ANSI escape codes, and every
    path in the executed copy (the job's lines, the OUT parameter) is --out's, never the staging
    folder the notebook ran in."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    d = tmp_path / "nbs"
    d.mkdir()
    trace = Path(__file__).resolve().parent / "data" / "audit" / "kineto_stack.json"
    cell = ("from ds4lab.jobs import execute\nfrom ds4lab.jobs.audit import AuditConfig\n"
            f"execute('audit', AuditConfig(files=({str(trace)!r},), out=OUT + '/audit'));")
    nbformat.write(_notebook(cell), d / "a.ipynb")
    res = CliRunner().invoke(main, ["notebooks", "--dir", str(d), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    final = (tmp_path / "o" / "a").resolve()
    done = nbformat.read(tmp_path / "o" / "a.ipynb", as_version=4)
    texts = [o.get("text", "") + "".join(o.get("data", {}).get("text/plain", "")) for o in done.cells[1].outputs]
    printed = "".join(texts).replace("\n", "")  # rich wraps at the notebook's width
    assert f"pdf in {final / 'audit'}" in printed and f"results in {final / 'audit'}/" in printed, printed
    assert not [t for t in texts if "\x1b" in t], "ANSI escape codes in the saved text"
    assert ".ds4lab-staging" not in (tmp_path / "o" / "a.ipynb").read_text()
    assert f"OUT = {str(final)!r}" in done.cells[0].source
    assert (final / "audit" / "audit.csv").is_file()


@pytest.mark.parametrize("args,needle", [
    (["--set", "OUT=/tmp/x"], "OUT is set by --out"),
    (["--set", "PRESET=huge"], "PRESET='huge'"),
    (["--set", "STAGES=[1]"], "unknown stage(s) [1]"),
    (["--set", "TOKENS=-5"], "TOKENS=-5"),
    (["--set", "SWEEP_LAUNCH_US=[1, 'a']"], "SWEEP_LAUNCH_US"),
    (["--set", "ROUTINGS=uniform,sideways"], "ROUTINGS='uniform,sideways'"),
    (["00", "00_quickstart"], "two notebooks named 00_quickstart"),
])
def test_cli_refuses_before_any_kernel_starts(args, needle, tmp_path):
    res = CliRunner().invoke(main, ["notebooks", *args, "--dir", str(NB_DIR), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_cli_names_a_broken_notebook(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    (d / "bad.ipynb").write_text("{not json")
    res = CliRunner().invoke(main, ["notebooks", "--dir", str(d), "--list"])
    assert res.exit_code == 2 and "bad.ipynb" in res.output and "not a readable notebook" in res.output


def test_cli_out_below_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    res = CliRunner().invoke(main, ["notebooks", "00", "--dir", str(NB_DIR), "--out", str(f / "sub")])
    assert res.exit_code == 2 and "is a file" in res.output


@pytest.mark.slow
def test_figures_listed_are_this_runs_and_ctrl_c_is_an_interruption(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    src = tmp_path / "n.ipynb"
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "old.png").write_bytes(b"from an earlier run")
    import os
    import time

    old = time.time() - 3600
    os.utime(tmp_path / "o" / "old.png", (old, old))
    nbformat.write(_notebook("import pathlib; pathlib.Path(OUT, 'new.png').write_bytes(b'x')",
                             "import os, signal, time; os.kill(os.getppid(), signal.SIGINT); time.sleep(20)",
                             "print('never')"), src)
    t0 = time.perf_counter()
    r = run_notebook(src, {}, tmp_path / "run" / "n.ipynb", out_dir=tmp_path / "o", timeout=60)
    assert r.interrupted and not r.ok and r.error == "interrupted (Ctrl-C)"
    assert time.perf_counter() - t0 < 15, "the interrupted cell was not waited out"
    assert r.figures == ["new.png"]


def test_committed_notebooks_are_what_make_notebooks_writes(tmp_path):
    """scripts/make_notebooks.py is the notebooks' source: regenerated, every committed notebook is the
    same, cell for cell (an edit made to an .ipynb by hand, or a source edit not regenerated, fails)."""
    import subprocess
    import sys

    import nbformat

    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(root / "scripts" / "make_notebooks.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    made = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    committed = sorted(p.name for p in (root / "notebooks").glob("*.ipynb"))
    assert made == committed
    for name in made:
        a = nbformat.read(tmp_path / name, as_version=4)
        b = nbformat.read(root / "notebooks" / name, as_version=4)
        assert [(c.cell_type, c.source) for c in a.cells] == [(c.cell_type, c.source) for c in b.cells], name


@pytest.mark.slow
def test_a_cell_past_the_timeout_is_named_without_a_traceback(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    d = tmp_path / "nbs"
    d.mkdir()
    nbformat.write(_notebook("print('quick', A)", "import time; time.sleep(30)", "print('never')"), d / "slow.ipynb")
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "ds4lab.cli", "notebooks", "--dir", str(d), "--timeout", "1",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(repo)))
    out = res.stdout + res.stderr  # the real stderr: the kernel's own output would show here
    assert res.returncode == 1, out
    assert "FAILED at code cell 3 of 4 in slow.ipynb: timed out after 1 s" in out
    assert "None" not in out and "Traceback" not in out and "ZMQ" not in out and "zmq" not in out
    runs = json.loads((tmp_path / "o" / "runs.json").read_text())["runs"]
    assert runs[0]["timed_out_cell"] == 3 and runs[0]["failed_cell"] == 3
    done = nbformat.read(tmp_path / "o" / "slow.ipynb", as_version=4)
    assert "quick 1" in done.cells[1].outputs[0]["text"]  # the cells before it kept their outputs
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["status"].startswith("failed")


def test_a_second_run_into_the_same_folder_is_refused_up_front(tmp_path):
    import os
    import time

    from ds4lab.report.results import Lock, lock_path

    out = tmp_path / "o"
    held = Lock(lock_path(out), out).acquire()  # another `ds4lab notebooks` into the same folder
    try:
        t0 = time.perf_counter()
        res = CliRunner().invoke(main, ["notebooks", "00", "--dir", str(NB_DIR), "--out", str(out)])
        assert res.exit_code == 2 and f"in use by another ds4lab run (PID {os.getpid()}" in res.output
        assert time.perf_counter() - t0 < 10, "refused before any kernel starts"
        assert not out.exists()
    finally:
        held.release()
