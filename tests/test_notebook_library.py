"""The library functions the notebooks call instead of holding the logic in cells: 04's launch-list
scan and its figure (``experiments.launch_list``, ``plots.launches_figure``), the figures and tables
drawn from a job's folder (``report.views``), the widget-or-parameter choice (``report.widgets``), 05's
choice of trace and its comparison with torch (``audit.engines.audit_source``,
``audit.validate.against_torch``), 01's text parameters (``jobs.moe.text_options``), and
``ds4lab notebooks`` as a job (``jobs.notebooks``)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from ds4lab.errors import BadInput
from ds4lab.jobs import JOBS, execute
from ds4lab.token import reference as LR


# ----------------------------------------------------------------------------- 04: the launch list
def test_shape_changes_are_every_change_of_the_ratio4_launch_shape():
    from ds4lab.experiments.launch_list import shape, shape_changes

    k, max_context = 64, 1 << 15
    got = shape_changes(max_context, k)
    last = LR.comp_count(max_context - 1, 4)
    want = [n for n in range(1, last) if (LR.topk_regime(n, k), len(LR.topk_plan(n, k)[0]))
            != (LR.topk_regime(n + 1, k), len(LR.topk_plan(n + 1, k)[0]))]
    assert got == want and got[:4] == [k, 2 * k, 4 * k, 8 * k], "all → sort2k → sort4k → sort8k → ..."
    assert shape(k, k) == ("all", 0) and shape(k + 1, k)[0] == "sort2k"


def test_anchor_positions_show_each_shape_on_both_sides_and_each_emit_kind():
    from ds4lab.experiments.launch_list import anchor_positions, shape, shape_changes

    k, max_context, ratios = 64, 1 << 15, [4, 128]  # regimes wider than a ratio-128 period, as in ds4-flash
    changes = shape_changes(max_context, k)
    pos = anchor_positions(max_context, ratios, changes)
    assert pos == sorted(set(pos)) and min(pos) >= 4 and max(pos) < max_context
    for nb in changes:
        a = 128 * (4 * nb // 128) - 1  # the last position emitting at every ratio before the change
        if a >= 127:
            assert {a - 4, a - 1, a} <= set(pos) and LR.comp_count(a, 4) <= nb
        if 4 * nb + 3 < max_context - 128:  # and the first after it
            assert any(LR.comp_count(q, 4) > nb and (q + 1) % 128 == 0 and q - 128 < 4 * nb + 3 for q in pos)
    kinds = {((q + 1) % 4 == 0, (q + 1) % 128 == 0) for q in pos}
    assert kinds == {(False, False), (True, False), (True, True)}, "no emit, ratio 4 only, both ratios"
    assert {shape(LR.comp_count(q, 4), k) for q in pos} >= {shape(n + 1, k) for n in changes if 4 * n + 3 < max_context}


def test_scan_counts_the_launch_list_and_shows_where_it_changes():
    from ds4lab.experiments.launch_list import scan

    s = scan("tiny")
    assert s.ratios == [4] and s.changes and s.max_context == 4096  # tiny: ratio-4 layers only
    L = s.launches
    assert list(L.position) == sorted(L.position) and L.position.is_unique
    # an emit adds launches: at one n_comp and shape, a ratio-4 emit token has more kernels than a quiet one
    w = s.window
    quiet, emit = w[w.token == "no emit"].kernels, w[w.token == "emit r4"].kernels
    assert len(w) > 16 and quiet.nunique() == 1 and emit.min() > quiet.max()
    assert (w[(w.position + 1) % 4 == 0].token != "no emit").all()
    t = s.table()
    regimes = list(dict.fromkeys(t.index.get_level_values("regime")))
    assert regimes == [r for r in LR.TOPK_REGIMES if r in regimes] and "all" in regimes and len(regimes) >= 3
    assert set(t.columns) == {"no emit", "emit r4"}
    d = s.decisions_table()
    n = s.visible_changes()[0]
    assert list(d.columns) == [f"position {4 * n - 1}", f"position {4 * n + 3}"]
    assert d.loc["indexer.regime"].tolist() == [repr(shape_) for shape_ in (LR.topk_regime(n, s.top_k),
                                                                             LR.topk_regime(n + 1, s.top_k))]
    assert "counted by the launch census" in s.title()


def test_launches_figure_marks_each_change_and_says_it_counts():
    from ds4lab.experiments.launch_list import scan
    from ds4lab.report import plots

    s = scan("tiny")
    fig = plots.launches_figure(s)
    try:
        left, right = fig.axes
        assert "counted by the launch census" in fig._suptitle.get_text() and "not timed" in fig._suptitle.get_text()
        dotted = [ln for ln in right.lines if ln.get_linestyle() == ":"]
        assert len(dotted) == len([n for n in s.changes if 4 * n + 3 < s.max_context])
        assert right.get_xscale() == "log" and {t.get_text() for t in right.get_legend().get_texts()} == set(s.launches.token)
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- figures from a folder
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from ds4lab.jobs.context import ContextConfig
    from ds4lab.jobs.ladder import LadderConfig
    from ds4lab.jobs.moe import MoeConfig

    d = tmp_path_factory.mktemp("views")
    execute("ladder", LadderConfig(stages="0,3", preset="tiny", tokens=4, rounds=1, out=d / "ladder"), backend="sim")
    execute("context", ContextConfig(stages="0,3,3c", preset="tiny", contexts="128,600", tokens=2, span=4,
                                     out=d / "context"), backend="sim")
    execute("moe", MoeConfig(modes=["deferred", "in-graph"], tokens_per_step=[1, 2], routings=["uniform", "worst"],
                             preset="tiny", steps=2, share_tokens=2, overhead=False, out=d / "moe"), backend="sim")
    return d


def test_figures_are_the_jobs_figures_drawn_again_as_objects(folders):
    from ds4lab.report import views

    for job, names in (("ladder", {"ladder"}), ("context", {"context"}),
                       ("moe", {"moe-stages", "moe-distribution", "moe-share"})):
        open_before = set(plt.get_fignums())
        figs = views.figures(folders / job)
        assert set(figs) == names, job
        assert {p.stem for p in (folders / job).glob("*.png")} >= names, "named as the job's saved files"
        assert set(plt.get_fignums()) == open_before, "taken out of pyplot: a cell shows each once"
        for f in figs.values():
            assert "MODELED" in " ".join(t.get_text() for a in f.axes for t in [a.title]) + (
                f._suptitle.get_text() if f._suptitle else ""), job
    ladder = views.figures(folders / "ladder")["ladder"]
    assert [t.get_text().split("\n")[0] for t in ladder.axes[0].get_xticklabels()] == ["0", "3"]


def test_figures_refuse_a_folder_without_those_results(folders, tmp_path):
    from ds4lab.report import views

    with pytest.raises(ValueError, match="no meta.json"):
        views.figures(tmp_path)
    with pytest.raises(ValueError, match="not of moe"):
        views.moe_stage_table(folders / "ladder")


def test_moe_stage_table_has_ds4s_stages_in_order_per_mode_tokens_and_routing(folders):
    from ds4lab.report import views

    t = views.moe_stage_table(folders / "moe")
    assert list(t.columns) == ["xq", "sort", "gateup", "midq", "down", "sum", "total"][:len(t.columns) - 1] + ["total"]
    assert t.index.names == ["mode", "tokens", "routing"] and len(t) == 2 * 2 * 2
    moe = pd.read_csv(folders / "moe" / "moe.csv")
    one = moe[(moe["mode"] == "deferred") & (moe.tokens == 2) & (moe.routing == "worst") & (moe.stage == "total")]
    assert t.loc[("deferred", 2, "worst"), "total"] == pytest.approx(one.ms.median() * 1e3)


def test_context_graphs_counts_each_stages_graphs_and_3c_against_3(folders):
    from ds4lab.report import views

    g = views.context_graphs(folders / "context")
    df = pd.read_csv(folders / "context" / "context.csv", dtype={"stage": str})
    assert list(g.index) == [128, 600]
    assert list(g.columns[:3]) == ["graphs, stage 0", "graphs, stage 3", "graphs, stage 3c"]
    assert (g["graphs, stage 3c"] == 1).all() and g["graphs, stage 3"].iloc[-1] >= 1
    us = df.set_index(["stage", "context"]).us_median
    assert g.loc[600, "stage 3c µs × stage 3"] == pytest.approx(round(us["3c", 600] / us["3", 600], 3))
    assert {"stage 3 recaptures", "stage 3 retirements"} <= set(g.columns)


# ----------------------------------------------------------------------------- widgets
def _figure(value):
    fig, ax = plt.subplots()
    ax.set_title(f"value {value}")
    return fig


def test_choose_headless_draws_the_parameters_value_once(monkeypatch):
    from ds4lab.report import widgets

    monkeypatch.setenv(widgets.HEADLESS_ENV, "1")
    assert not widgets.interactive()
    before = set(plt.get_fignums())
    fig = widgets.choose(_figure, value=widgets.Choice(3, [1, 2, 3]))
    assert fig.axes[0].get_title() == "value 3"
    assert set(plt.get_fignums()) == before, "out of pyplot: shown once, as the cell's value"
    assert widgets.choose(lambda value: value * 2, value=widgets.Choice(2, [("two", 2)])) == 4
    with pytest.raises(ValueError, match=r"value=7: choose one of 1, 2"):
        widgets.choose(_figure, value=widgets.Choice(7, [1, 2]))


def test_choose_outside_a_kernel_or_without_ipywidgets_takes_the_parameter(monkeypatch):
    from ds4lab.report import widgets

    monkeypatch.delenv(widgets.HEADLESS_ENV, raising=False)
    assert not widgets.interactive()  # pytest is no Jupyter kernel
    assert widgets.choose(lambda n: n + 1, n=widgets.Choice(1, range(3))) == 2


def test_choose_in_jupyterlab_offers_a_dropdown_per_choice(monkeypatch):
    """With a kernel and ipywidgets (stand-ins here), each choice becomes a Dropdown of its options set
    to the parameter's value, and the view is drawn by ipywidgets' interact."""
    from ds4lab.report import widgets

    made, shown = {}, []

    class Dropdown:
        def __init__(self, options, value, description):
            made[description] = (list(options), value)

    def interact(fn, **controls):
        made["interact"] = sorted(controls)
        fn(**{n: made[n][1] for n in controls})
        return fn

    monkeypatch.setitem(sys.modules, "ipywidgets", types.SimpleNamespace(Dropdown=Dropdown, interact=interact))
    import IPython
    import IPython.display

    monkeypatch.setattr(IPython, "get_ipython", lambda: SimpleNamespace(kernel=object()))
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monkeypatch.delenv(widgets.HEADLESS_ENV, raising=False)
    assert widgets.interactive()
    assert widgets.choose(_figure, value=widgets.Choice(2, [("one", 1), ("two", 2)])) is None
    assert made["value"] == ([("one", 1), ("two", 2)], 2) and made["interact"] == ["value"]
    assert len(shown) == 1 and shown[0].axes[0].get_title() == "value 2"


# ----------------------------------------------------------------------------- 05: which trace
def test_audit_source_takes_a_given_trace_then_live_then_the_bundled_one(monkeypatch, tmp_path):
    from ds4lab.audit import engines

    own = engines.audit_source("sim", trace=tmp_path / "mine.json")
    assert (own.kind, own.trace, own.torch_run) == ("own", tmp_path / "mine.json", None)

    monkeypatch.setattr(engines, "available", lambda: (False, "torch is not installed"))
    b = engines.audit_source("auto", "llama", "dynamic")
    assert b.kind == "bundled" and b.trace == engines.recorded("llama", "dynamic") and b.trace.is_file()
    assert b.torch_run["outcome"] == engines.recorded_outcome("llama", "dynamic")["outcome"]
    assert "live recording off: torch is not installed" in b.note
    assert "live recording off" not in engines.audit_source("sim", "llama", "static").note
    with pytest.raises(ValueError, match="records llama/dynamic live, but torch is not installed"):
        engines.audit_source("cupy", "llama", "dynamic", record_into=tmp_path)
    with pytest.raises(ValueError, match="no bundled recording of 'qwen2-moe'"):
        engines.audit_source("sim", "qwen2-moe", "dynamic")
    with pytest.raises(ValueError, match="backend 'torch'"):
        engines.audit_source("torch")


def test_audit_source_records_live_into_a_folder_of_its_own(monkeypatch, tmp_path):
    """Where torch sees a GPU the engine is recorded into ``record_into``, not into the audit's folder
    (notebook 05 on a GPU recorded into its OUT, which the audit then refused)."""
    from ds4lab.audit import engines

    calls = []

    def run_isolated(engine, cache, out):
        calls.append((engine, cache, Path(out)))
        rec = Path(out) / f"{engine}-{cache}" / "recording.csv.gz"
        return {"outcome": "refused", "detail": "x", "recording": str(rec), "device": {"device": "H200"}}

    monkeypatch.setattr(engines, "available", lambda: (True, ""))
    monkeypatch.setattr(engines, "run_isolated", run_isolated)
    s = engines.audit_source("auto", "deepseek-v3", "static", record_into=tmp_path / "nb" / "engine")
    assert calls == [("deepseek-v3", "static", tmp_path / "nb" / "engine")]
    assert s.kind == "live" and s.trace == tmp_path / "nb" / "engine" / "deepseek-v3-static" / "recording.csv.gz"
    assert s.torch_run["outcome"] == "refused" and "on H200 (measured)" in s.note
    with pytest.raises(ValueError, match="needs a folder"):
        engines.audit_source("cupy", "llama", "dynamic")
    monkeypatch.setattr(engines, "run_isolated", lambda *a: {"error": "exit 1: boom"})
    with pytest.raises(ValueError, match="live recording failed: exit 1: boom"):
        engines.audit_source("cupy", "llama", "dynamic", record_into=tmp_path)


def _report(verdict: str, whole_us):
    findings = pd.DataFrame([{"kind": "call", "name": "cudaMemcpy", "call_class": "memcpy_sync", "where": "x.py:3",
                              "verdict_global": verdict}]) if verdict else pd.DataFrame()
    plans = pd.DataFrame([{"plan": "whole token", "predicted_us": whole_us}]) if whole_us else pd.DataFrame()
    # a trace without kernel arguments (``arguments`` None): the audit never calls such a step right
    return SimpleNamespace(findings=findings, plans=plans, tool="kineto", arguments=None)


@pytest.mark.parametrize("verdict,torch_outcome,agrees", [
    ("invalidates", "refused", True), ("frozen", "captured, replays wrong", True),
    # no finding, but no argument evidence either: "captures; replay correctness unknown", not torch's "right"
    ("", "captured, replays right", False),
    ("", "refused", False), ("not in graph", "captured, replays right", False)])
def test_against_torch_sets_the_verdict_beside_torchs_outcome(verdict, torch_outcome, agrees):
    from ds4lab.audit.validate import against_torch

    r = against_torch(_report(verdict, 108.0), {"outcome": torch_outcome, "detail": "d", "replay_us": 100.0})
    assert r["verdict_agrees"] is agrees and r["torch_outcome"] == torch_outcome
    assert r["predicted_over_measured"] == pytest.approx(1.08) and r["time_agrees"] is True
    assert against_torch(_report(verdict, 112.0), {"outcome": torch_outcome, "replay_us": 100.0})["time_agrees"] is False


def test_the_plan_is_held_to_the_loop_it_models():
    from types import SimpleNamespace as N

    from ds4lab.audit.validate import against_torch

    run = {"outcome": "captured, replays right", "replay_us": 100.0, "replay_sync_us": 150.0, "replay_device_us": 90.0}
    free = against_torch(_report("", 104.0), run)  # no blocking call in the tokens: the loop that never waits
    assert free["replay_us"] == 100.0 and free["measured_loop"].startswith("never waits") and free["time_agrees"] is True
    rep = _report("", 148.0)
    rep.items = {0: [N(blocking=False), N(blocking=True)]}  # a synchronize in the token: the waiting loop
    waits = against_torch(rep, run)
    assert waits["replay_us"] == 150.0 and waits["measured_loop"] == "waits per step" and waits["time_agrees"] is True
    assert waits["replay_device_us"] == 90.0


def test_against_torch_without_times_leaves_the_time_check_empty():
    from ds4lab.audit.validate import against_torch

    r = against_torch(_report("invalidates", None), {"outcome": "refused", "error": "exit 1"})
    assert r["predicted_us"] is None and r["time_agrees"] is None and r["torch_detail"] == "exit 1"
    assert against_torch(_report("", 200.0), {"outcome": "captured, replays right", "replay_us": 100.0})[
        "time_agrees"] is False


# ----------------------------------------------------------------------------- 01: text parameters
def test_moe_text_options_keep_the_counts_the_preset_takes():
    from ds4lab import moeprof as M
    from ds4lab.jobs.moe import text_options
    from ds4lab.token.config import get_preset

    limit = get_preset("tiny").max_tokens
    got, note = text_options("sim", "tiny", f"1,2,{limit + 1}", "all", "deferred, in-graph")
    assert got["tokens_per_step"] == [1, 2] and f"tiny takes at most {limit} tokens per step: profiling [1, 2]" in note
    assert got["routings"] == list(M.ROUTINGS) and got["modes"] == ["deferred", "in-graph"]
    got, note = text_options("sim", None, "1", ["uniform"], "all")
    assert got["preset"] == "small" and note == "" and got["modes"] == list(M.MODES) and got["routings"] == ["uniform"]
    assert text_options("sim", "tiny", None, None, "nvtx")[0] == {"preset": "tiny", "modes": ["nvtx"]}
    with pytest.raises(BadInput, match="at most"):
        text_options("sim", "tiny", str(limit + 1), "uniform", "deferred")
    with pytest.raises(BadInput, match="whole numbers"):
        text_options("sim", "tiny", "1,two", "uniform", "deferred")


# ----------------------------------------------------------------------------- the notebooks job
def _nb(path: Path, *cells: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("A = 1\nOUT = 'o'")
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_notebooks_is_a_job_that_checks_everything_before_a_kernel_starts(tmp_path):
    from ds4lab.jobs.notebooks import NotebooksConfig, check_config, plan

    assert JOBS["notebooks"][0] == "notebooks" and JOBS["notebooks"][1].resolve(NotebooksConfig()) == (False, False,
                                                                                                          False)
    _nb(tmp_path / "a.ipynb")
    p = plan(NotebooksConfig(assignments=("A=5",), folder=tmp_path, out=tmp_path / "o"))
    assert p.paths == [tmp_path / "a.ipynb"] and p.values == {tmp_path / "a.ipynb": {"A": 5}}
    for cfg, needle in ((NotebooksConfig(assignments=("Z=1",), folder=tmp_path), "no notebook has a parameter named Z"),
                        (NotebooksConfig(assignments=("A=x",), folder=tmp_path), "A='x'"),
                        (NotebooksConfig(assignments=("OUT=x",), folder=tmp_path), "OUT is set by --out"),
                        (NotebooksConfig(names=("b",), folder=tmp_path), "'b' is not"),
                        (NotebooksConfig(folder=tmp_path, out=""), "names no result folder")):
        with pytest.raises(BadInput, match=needle):
            check_config(cfg)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_notebooks_job_runs_through_execute(tmp_path):
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    from ds4lab.jobs.notebooks import NotebooksConfig, NotebooksFailed

    d = tmp_path / "nbs"
    d.mkdir()
    _nb(d / "a.ipynb", "import pathlib; pathlib.Path(OUT).mkdir(parents=True); print(A * 2)")
    runs = execute("notebooks", NotebooksConfig(assignments=("A=21",), folder=d, out=tmp_path / "o",
                                                timeout=60)).value
    assert [(r["notebook"], r["ok"], r["parameters"]["A"]) for r in runs] == [("a.ipynb", True, 21)]
    assert (tmp_path / "o" / "a.ipynb").is_file() and (tmp_path / "o" / "a").is_dir()
    _nb(d / "b.ipynb", "raise ValueError('no')")
    with pytest.raises(NotebooksFailed, match="failed: b.ipynb"):
        execute("notebooks", NotebooksConfig(folder=d, out=tmp_path / "o2", timeout=60))


@pytest.mark.slow
def test_a_failed_rerun_keeps_the_earlier_results(tmp_path):
    """A notebook that fails on a rerun is a failed run, not a finished one: the earlier good folder
    stays as it was and the failed run is kept beside it."""
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    from ds4lab.jobs.notebooks import NotebooksConfig, NotebooksFailed

    d = tmp_path / "nbs"
    d.mkdir()
    _nb(d / "a.ipynb", "import pathlib; pathlib.Path(OUT).mkdir(parents=True); print(A * 2)")
    execute("notebooks", NotebooksConfig(assignments=("A=21",), folder=d, out=tmp_path / "o", timeout=60))
    before = (tmp_path / "o" / "a.ipynb").read_bytes()
    _nb(d / "a.ipynb", "raise ValueError('no')")
    with pytest.raises(NotebooksFailed):
        execute("notebooks", NotebooksConfig(folder=d, out=tmp_path / "o", timeout=60))
    assert (tmp_path / "o" / "a.ipynb").read_bytes() == before
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["status"] == "complete"
    assert len(list(tmp_path.glob("o.failed-*"))) == 1
