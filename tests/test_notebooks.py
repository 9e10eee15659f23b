"""The notebooks and their runner: each notebook's source is a jupytext percent-format ``.py`` paired
with its ``.ipynb`` (committed without outputs, the two in sync, the source free of unused imports);
each runs top to bottom on the simulated runtime with small parameters, headless, through
``ds4lab.report.notebook_runner`` (papermill); the runner's parameter handling, failure reporting and
stop signals (``ds4lab notebooks``: SIGTERM 143, SIGHUP 129, a job inside the kernel stopped cleanly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.report.notebook_runner import (INJECTED_TAG, NotebookError, coerce, find_notebooks, parameter_defaults,
                                           parse_assignments, run_notebook)

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
SOURCES = sorted(NB_DIR.glob("*.py"))
SMALL = {
    "BACKEND": "sim", "PRESET": "tiny", "TOKENS": 8, "STAGES": "0,1,3",
    "SWEEP_LAYERS": [2, 4], "SWEEP_LAUNCH_US": [5.0, 9.4], "SWEEP_TOKENS": [1, 2], "HAZARD_PRESET": "tiny",
    "TOKENS_PER_STEP": "1,2,16", "ROUTINGS": "uniform,worst", "STEPS": 2, "CONTEXTS": "128,600",
    "ENGINE": "llama", "CACHE": "dynamic", "TRACE": None, "TOKEN_RANGE": "decode_step",
    "TRACE_LAYERS": 1, "ROUTING_SHOWN": "worst", "REGIME_CHANGE": None,
    "DS4_SOURCE": None, "DS4_RESULTS": None, "C_HOST_US": 3.2, "CAPTURE_STAGES": "record",
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


def _write(path: Path, *sources, **kw) -> Path:
    import nbformat

    nbformat.write(_notebook(*sources, **kw), path)
    return path


def _own(nb) -> list:
    """The notebook's own code cells (papermill's injected parameters cell left out)."""
    return [c for c in nb.cells if c.cell_type == "code" and INJECTED_TAG not in c.metadata.get("tags", [])]


def _injected(nb):
    return next(c for c in nb.cells if INJECTED_TAG in c.metadata.get("tags", []))


def test_there_are_notebooks_each_with_its_source():
    assert {p.name for p in NOTEBOOKS} == {"00_quickstart.ipynb", "01_moe_timing.ipynb",
                                           "02_profiling_vs_capture.ipynb", "03_stage_gains.ipynb",
                                           "04_long_context.ipynb", "05_audit.ipynb", "06_ds4_itself.ipynb"}
    assert [p.stem for p in SOURCES] == [p.stem for p in NOTEBOOKS], "every .ipynb has its .py source, and no more"
    assert not (NB_DIR.parent / "scripts" / "make_notebooks.py").exists()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_matches_its_source(path):
    """``jupytext --sync``: the committed .ipynb holds the cells of its .py source (type, text, tags),
    and says it is paired with it; an edit to one without the other fails here."""
    jupytext = pytest.importorskip("jupytext")
    import nbformat

    nb = nbformat.read(path, as_version=4)
    src = jupytext.read(path.with_suffix(".py"))
    cells = lambda n: [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in n.cells]  # noqa: E731
    assert cells(nb) == cells(src), f"{path.name} and {path.stem}.py differ: run jupytext --sync {path.stem}.py"
    assert nb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"


def unused_imports(source: str) -> list[str]:
    """Names a module imports at top level and never uses (a ``# noqa`` line and ``__future__`` aside)."""
    import ast

    tree = ast.parse(source)
    lines = source.splitlines()
    imported = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "noqa" not in lines[node.lineno - 1]:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for a in node.names:
                imported[(a.asname or a.name).split(".")[0]] = node.lineno
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    return sorted(name for name in imported if name not in used)


def test_the_unused_import_check_can_fail():
    assert unused_imports("import json\nfrom pathlib import Path\nimport os.path\nPath('x')") == ["json", "os"]
    assert unused_imports("import json  # noqa: F401\nfrom x import (a,\n b)\nb()") == ["a"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_notebook_sources_import_only_what_they_use(path):
    assert unused_imports(path.read_text()) == []


def ds4lab_imports(source: str) -> list[str]:
    """Every import of ds4lab in ``source`` (at any depth), as ``module: names``."""
    import ast

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ds4lab":
            out.append(f"{node.module}: {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "ds4lab"]
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_notebooks_reach_ds4lab_through_the_lab_alone(path):
    """A notebook imports one thing of ds4lab, ``Lab``: what it needs is a Lab method or a method of a
    result a Lab method returns (the check finds an import inside a cell's block too)."""
    assert ds4lab_imports(path.read_text()) == ["ds4lab: Lab"]
    assert sorted(ds4lab_imports("if x:\n    from ds4lab.jobs import execute\nfrom ds4lab import Lab\n")) == [
        "ds4lab.jobs: execute", "ds4lab: Lab"]


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
    names = parameter_defaults(path)
    assert {"BACKEND", "OUT"} <= set(names)
    assert set(names) - {"OUT", "MODES"} <= set(SMALL), "a parameter CI does not shrink"


def test_parameters_are_papermills_reading_of_the_cell(tmp_path):
    from ds4lab.report.notebook_runner import parameters

    p = _write(tmp_path / "n.ipynb", params="A = 1\nB = 'x'  # a comment\nC = [2, 3]\nOUT = 'o'")
    assert parameter_defaults(p) == {"A": 1, "B": "x", "C": [2, 3], "OUT": "o"}
    assert parameters(p)["B"]["help"] == "a comment"


def test_a_notebook_needs_exactly_one_parameters_cell(tmp_path):
    nb = _notebook()
    nb.cells[0].metadata["tags"] = []
    import nbformat

    nbformat.write(nb, tmp_path / "n.ipynb")
    with pytest.raises(NotebookError, match="found 0"):
        parameter_defaults(tmp_path / "n.ipynb")


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
    assert find_notebooks([str(NB_DIR / "05_audit.py"), "04_long_context.py"], NB_DIR) == \
        [NB_DIR / "05_audit.ipynb", NB_DIR / "04_long_context.ipynb"], "a source names the notebook paired with it"


@pytest.mark.slow
def test_a_failing_cell_keeps_the_outputs_before_it(tmp_path):
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    import nbformat

    src = _write(tmp_path / "broken.ipynb", "print('first', A)", "raise RuntimeError('boom ' + B)", "print('never')")
    r = run_notebook(src, {"A": 41, "B": "y"}, tmp_path / "run" / "broken.ipynb", out_dir=tmp_path / "o",
                     timeout=60)
    assert not r.ok and r.failed_cell == 3 and r.cells == 4 and r.error == "RuntimeError: boom y"
    done = nbformat.read(r.executed, as_version=4)
    own = _own(done)
    assert "first 41" in own[1].outputs[0]["text"]
    assert not own[3].outputs, "cells after the failure do not run"
    assert "papermill-error-cell-tag" in json.dumps([c.metadata for c in done.cells]), "papermill marks the failure"
    assert "A = 41" in _injected(done).source and "B = \"y\"" in _injected(done).source
    assert done.metadata["ds4lab"]["executed"]["parameters"]["OUT"] == str((tmp_path / "o").resolve())
    assert not src.read_text().count("first 41"), "the source notebook is left as it was"


def test_cli_refuses_unknown_parameter_before_running(tmp_path):
    res = CliRunner().invoke(main, ["notebooks", "--set", "PRESTE=small", "--out", str(tmp_path / "o"),
                                    "--dir", str(NB_DIR)])
    assert res.exit_code == 2 and "no notebook has a parameter named PRESTE" in res.output and "PRESET" in res.output
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
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")

    d = tmp_path / "nbs"
    d.mkdir()
    _write(d / "a_bad.ipynb", "raise ValueError('bad ' + str(A))")
    _write(d / "b_good.ipynb", "import pathlib; pathlib.Path(OUT).mkdir(parents=True); print(B)")
    res = CliRunner().invoke(main, ["notebooks", "--dir", str(d), "--set", "A=7", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    assert "FAILED at code cell 2 of 2 in a_bad.ipynb: ValueError: bad 7" in res.output
    assert "failed: a_bad.ipynb" in res.output
    runs = json.loads((tmp_path / "o" / "runs.json").read_text())["runs"]
    assert [(r["notebook"], r["ok"]) for r in runs] == [("a_bad.ipynb", False), ("b_good.ipynb", True)]
    assert (tmp_path / "o" / "b_good").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_on_sim(path, tmp_path):
    """Each notebook top to bottom on the sim with small parameters: it writes its figures' files and
    shows the figures the library drew (image outputs of figure objects, each once), says MODELED."""
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    import nbformat

    names = parameter_defaults(path)
    values = {n: v for n, v in {**SMALL, **SMALL_FOR.get(path.name, {})}.items() if n in names}
    r = run_notebook(path, values, tmp_path / path.name, out_dir=tmp_path / "out", timeout=600)
    assert r.ok, f"{path.name} failed at code cell {r.failed_cell}: {r.error}"
    assert r.figures, "every notebook exports at least one figure"
    executed = nbformat.read(r.executed, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells])
    assert "MODELED" in text or "modeled" in text, "on sim the notebook says its figures are modeled"
    shown = [sum("image/png" in o.get("data", {}) for o in c.outputs) for c in _own(executed)]
    assert sum(shown) >= 1 and max(shown) == 1, f"figures shown per cell: {shown}"
    assert "IPython.core.display.Image" not in text and "Image(filename" not in json.dumps(
        [c.source for c in executed.cells]), "figures are the library's objects, not PNG files read back"


@pytest.mark.slow
def test_an_executed_notebook_is_plain_text_and_names_the_folder_the_results_are_in(tmp_path):
    """Through `ds4lab notebooks`: what the jobs printed is kept without ANSI escape codes, and every
    path in the executed copy (the job's lines, the OUT parameter) is --out's, never the staging
    folder the notebook ran in."""
    pytest.importorskip("papermill")
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
    texts = [o.get("text", "") + "".join(o.get("data", {}).get("text/plain", "")) for o in _own(done)[1].outputs]
    printed = "".join(texts).replace("\n", "")  # rich wraps at the notebook's width
    assert f"pdf in {final / 'audit'}" in printed and f"results in {final / 'audit'}/" in printed, printed
    assert not [t for t in texts if "\x1b" in t], "ANSI escape codes in the saved text"
    assert ".ds4lab-staging" not in (tmp_path / "o" / "a.ipynb").read_text()
    assert f'OUT = "{final}"' in _injected(done).source
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
    pytest.importorskip("papermill")
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


@pytest.mark.slow
def test_a_cell_past_the_timeout_is_named_without_a_traceback(tmp_path):
    pytest.importorskip("papermill")
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
    assert "quick 1" in _own(done)[1].outputs[0]["text"]  # the cells before it kept their outputs
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


#: A cell that runs a job of its own in the notebook's OUT (as the workbench notebooks do) and is still
#: working when the run is stopped.
_INNER_JOB = """import time
from pathlib import Path
from ds4lab.report.results import job_folder
with job_folder(Path(OUT) / 'inner', {'job': 'inner'}) as f:
    (f / 'partial.txt').write_text('so far')
    time.sleep(120)
"""


def _stopped_run(tmp_path, signum, to_group: bool):
    """``ds4lab notebooks`` (its own process group) over two notebooks, the first's job running, stopped
    with ``signum`` sent to the process, or to its whole group as a closed terminal sends SIGHUP."""
    import os
    import signal  # noqa: F401 - the callers' signal numbers
    import subprocess
    import sys
    import time

    d = tmp_path / "nbs"
    d.mkdir()
    _write(d / "a.ipynb", _INNER_JOB, "print('never')")
    _write(d / "b.ipynb", "print('never either')")
    repo = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-m", "ds4lab.cli", "notebooks", "--dir", str(d), "--out",
                          str(tmp_path / "o")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(repo)), start_new_session=True)
    try:
        working = tmp_path / ".o.ds4lab-staging" / "a" / ".inner.ds4lab-staging" / "partial.txt"
        end = time.time() + 180
        while not working.exists():
            assert p.poll() is None and time.time() < end, p.communicate()[0] if p.poll() is not None else "slow"
            time.sleep(0.2)
        (os.killpg if to_group else os.kill)(p.pid, signum)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    left = sorted(str(x.relative_to(tmp_path)) for x in tmp_path.rglob(".*") if "ds4lab" in x.name)
    return p.returncode, out, left


@pytest.mark.slow
@pytest.mark.parametrize("signame,to_group,status", [("SIGTERM", False, 143), ("SIGHUP", True, 129)])
def test_a_stop_signal_is_reported_as_itself_and_the_job_in_the_kernel_stops_cleanly(tmp_path, signame, to_group,
                                                                                     status):
    """SIGTERM (to the process) and SIGHUP (to its process group: a closed terminal) stop ``ds4lab
    notebooks`` with the shell's status for that signal and ``interrupted (SIG…)`` in its meta.json and
    runs.json; the signal reaches the kernel, so the job running in a cell records the same status and
    keeps its partial results where its folder was: no staging folder says ``running``, no lock file
    is left, and the next notebook does not run."""
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    import signal

    rc, out, left = _stopped_run(tmp_path, getattr(signal, signame), to_group)
    assert rc == status, out
    assert f"interrupted ({signame})" in out and "Traceback" not in out, out
    o = tmp_path / "o"
    assert json.loads((o / "meta.json").read_text())["status"] == f"interrupted ({signame})"
    runs = json.loads((o / "runs.json").read_text())["runs"]
    assert [(r["notebook"], r["interrupted"], r["error"]) for r in runs] == [("a.ipynb", True,
                                                                              f"interrupted ({signame})")]
    assert runs[0]["failed_cell"] == 2
    inner = o / "a" / "inner"
    assert json.loads((inner / "meta.json").read_text())["status"] == f"interrupted ({signame})"
    assert (inner / "partial.txt").read_text() == "so far"
    assert left == [], f"staging folders or locks left behind: {left}"


@pytest.mark.slow
def test_an_interruption_raised_in_the_progress_callback_is_an_interruption(tmp_path):
    """A console closed under ``ds4lab notebooks`` stops it from the progress line (rich raises
    ``Terminated(SIGPIPE)`` there, in the thread running the notebook): the run is interrupted by that
    signal, not a failed notebook."""
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    import signal

    from ds4lab.errors import Terminated

    def on_cell(i, n):
        if i == 2:
            raise Terminated(signal.SIGPIPE)

    src = _write(tmp_path / "n.ipynb", "print('one')", "print('two')")
    r = run_notebook(src, {}, tmp_path / "run" / "n.ipynb", out_dir=tmp_path / "o", timeout=60, on_cell=on_cell)
    assert r.interrupted and not r.ok and r.signum == signal.SIGPIPE and r.error == "interrupted (SIGPIPE)"
