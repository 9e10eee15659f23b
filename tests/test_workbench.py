"""``ds4lab.Lab``, the workbench in one object for notebooks: every method runs its job on the sim (the
``tiny`` preset, small counts: seconds each) and returns the job's result with its tables and figure;
its keywords are the job config's, with that config's defaults; what a GPU-only job cannot do on the sim
is refused as the command line refuses it."""

from __future__ import annotations

import inspect
import re
import io
import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from rich.console import Console

import ds4lab
from ds4lab.errors import BadInput
from ds4lab.jobs.result import JobResult

ROUND3 = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "h200-2026-12-01" / "round3"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return ds4lab.Lab(backend="sim", preset="tiny", out=tmp_path_factory.mktemp("lab"),
                      console=Console(file=io.StringIO(), width=160))


@pytest.fixture(scope="module")
def traced(lab):
    return lab.trace(stages="0,3", tokens=1, warmup=1)


def _has(res: JobResult, table: str, figure: str | None = None) -> None:
    assert isinstance(res, JobResult) and len(res.table(table)) > 0
    if figure is not None:
        assert isinstance(res.figure(figure), Figure)
    assert res.out is not None and (res.out / "meta.json").is_file()
    assert json.loads((res.out / "meta.json").read_text())["status"] == "complete"


def test_the_lab_is_one_attribute_away_and_lists_its_experiments():
    assert "Lab" in dir(ds4lab) and ds4lab.Lab is __import__("ds4lab.lab", fromlist=["Lab"]).Lab
    names = {n for n in dir(ds4lab.Lab) if not n.startswith("_")}
    assert {"ladder", "context", "moe", "exclusion", "hazards", "audit", "ds4", "trace", "calibrate", "tp"} <= names
    for n in names:
        assert getattr(ds4lab.Lab, n).__doc__, f"Lab.{n} has no docstring"


def test_a_methods_keywords_are_its_configs_with_its_defaults():
    from ds4lab.jobs.ladder import LadderConfig

    sig = inspect.signature(ds4lab.Lab.ladder)
    assert sig.parameters["tokens"].default == LadderConfig().tokens and sig.parameters["rounds"].kind is \
        inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="no option tokenz"):
        ds4lab.Lab(backend="sim").ladder(tokenz=3)


def test_ladder_and_context(lab):
    res = lab.ladder(stages="0,3", tokens=4, rounds=2, exact_tokens=2, warmup=1)
    _has(res, "ladder", "ladder")
    assert list(res.table().stage) == ["0", "3"] and res.table().exact.all() and res.out == lab.out / "ladder"
    res = lab.context(stages="0,3", contexts="256,512", tokens=2, span=4, warmup=1)
    _has(res, "context", "context")
    assert sorted(set(res.table().context)) == [256, 512] and res.meta["preset"]["name"] == "tiny"


def test_hazards_run_and_tp(lab):
    res = lab.hazards(hazard="device-sync")
    _has(res, "hazards")
    assert res.value[0]["exact"] and res.value[0]["hazard"] == "device-sync"
    res = lab.run(tokens=2, warmup=1)
    _has(res, "census")
    res = lab.tp(command="token", tokens=2)
    assert res.value["ranks_identical"] and (res.out / "tp-token.json").is_file()


def test_moe_and_exclusion(lab):
    res = lab.moe(modes=["in-graph"], tokens_per_step=[1, 2], routings=["uniform"], steps=2, share_tokens=0,
                  overhead=False)
    _has(res, "summary", "moe-stages")
    assert set(res.table("moe")["mode"]) == {"in-graph"}
    _has(lab.exclusion(overhead_calls=2), "exclusion", "exclusion")


def test_trace_then_its_audit(lab, traced):
    _has(traced, "trace_kernels", "trace")
    res = lab.audit(files=(str(traced.out / "trace.json"),))
    _has(res, "audit")
    assert res.value and res.figures


def test_audit_of_a_bundled_engine_on_the_sim(lab):
    res = lab.audit(engine="llama", cache="dynamic")
    _has(res, "audit", "audit")
    assert any("torch-llama-dynamic" in str(src) for src in res.meta["sources"])  # the bundled recording


def test_calibrate_from_a_record_and_compare(lab):
    res = lab.calibrate(from_ladder=(str(ROUND3 / "islands"),), out=lab.out / "calibration.json")
    assert res.value["host_launch_us"] > 0 and len(res.table("host_fit")) > 0
    assert (lab.out / "calibration.json").is_file()
    res = lab.compare(dirs=(str(lab.out / "ladder"), str(lab.out / "context")))
    assert {"compare_ladder", "compare_context"} <= set(res.figures)


def test_conformance_on_the_sim(lab):
    res = lab.conformance(names=["sync_memset_escapes[global]"])
    assert isinstance(res, JobResult) and res.out == lab.out / "conformance"


def test_what_needs_a_gpu_or_ds4_is_refused_as_the_command_line_refuses_it(lab):
    with pytest.raises(BadInput, match="--backend sim"):
        lab.bench()
    with pytest.raises(BadInput, match="needs source=PATH"):
        lab.ds4()


def test_tables_of_what_there_is():
    assert "tiny" in ds4lab.Lab.presets().index
    assert {"0", "3"} <= set(ds4lab.Lab.stages().columns) | set(ds4lab.Lab.stages().index)
    hz = ds4lab.Lab.hazard_table()
    assert {"device-sync", "tp-collective-order"} <= set(hz.index) and set(hz.steps) >= {"token", "moe", "tp"}


# ----------------------------------------------------------------------------- what notebooks reach through the lab
def test_the_preset_a_job_runs_with_and_one_token(lab):
    assert not lab.on_gpu and lab.preset_for("context") == "tiny"
    assert ds4lab.Lab(backend="sim").preset_for("context") == "small"
    tok = lab.token()
    assert tok.label.startswith("backend sim · preset tiny") and "MODELED" in tok.label
    assert tok.by_kind.set_index("kind").launches["kernel"] > 10
    r = tok.ranges(layer=0)
    assert list(r.columns) == ["cluster (NVTX category)", "op range", "kernel"] and len(r) > 5
    assert set(tok.by_cluster.index) >= set(r["cluster (NVTX category)"])


def test_a_traces_timeline_and_where_its_file_is(lab, traced):
    assert isinstance(lab.timeline(traced, first_layers=1), Figure)
    with pytest.raises(ValueError, match="first_layers=9"):
        lab.timeline(traced, first_layers=9)
    assert traced.where("trace.json") == traced.out / "trace.json" and "MODELED" in traced.label()
    assert issubclass(lab.TraceError, Exception)


def test_moe_from_text_and_its_views(lab):
    res = lab.moe(tokens_per_step="1,2,9999", routings="uniform,worst", modes="in-graph", steps=2, share_tokens=0,
                  overhead=False)
    assert sorted(set(res.table("moe").tokens)) == [1, 2] and set(res.table("moe").routing) == {"uniform", "worst"}
    assert "at most" in lab.console.file.getvalue()
    t = lab.moe_stages(res)
    assert list(t.columns)[-1] == "total" and len(t) == 4
    assert isinstance(lab.moe_distribution(res, routing="worst"), Figure)
    with pytest.raises(ValueError, match="routing='hash'"):
        lab.moe_distribution(res, routing="hash")


def test_the_whatif_sweeps_and_the_host_whatif_are_results_with_their_figure(lab, tmp_path):
    w = lab.whatif(layers=(2, 4), launch_us=(5.0, 9.4), tokens_per_step=(1, 2))
    assert list(w.table("layers")["layers"]) == [2, 4] and isinstance(w.figure("whatif"), Figure) and w.out is None
    assert lab.save(w.figure(), tmp_path / "w") is w.figure() and (tmp_path / "w.png").is_file()
    assert lab.save(None, tmp_path / "none") is None and not (tmp_path / "none.png").exists()
    h = lab.host_whatif((128,), 3.2, preset="tiny", stages="0,3", tokens=2)
    assert set(h.table().stage) == {"0", "3"} and h.table().host.nunique() == 2 and isinstance(h.figure(), Figure)
    with pytest.raises(BadInput, match="host cost 0"):
        lab.host_whatif((128,), 0, preset="tiny")


def test_the_launch_scan_its_figure_and_a_regime_change(lab):
    scan = lab.launch_scan()
    assert scan.preset == "tiny" and isinstance(lab.launches_figure(scan), Figure)
    first = scan.visible_changes()[0]
    view = lab.regime_change(scan)
    assert view.equals(scan.decisions_table(first))
    with pytest.raises(ValueError, match="change=-1"):
        lab.regime_change(scan, change=-1)


def test_context_graphs_and_the_capture_stages_record(lab):
    ctx = lab.context(stages="0,3", contexts="256,512", tokens=2, span=4, warmup=1, out=lab.out / "ctx-graphs")
    assert list(lab.context_graphs(ctx).index) == [256, 512]
    cs, where = lab.capture_stages("record")
    assert "h200-2026-12-02b" in where and (cs[cs.stage == "3"].x_stage_3 == 1).all()
    assert "not measurable" in " ".join(cs["gain over 3"]) or "µs (" in " ".join(cs["gain over 3"])
    assert lab.capture_stages(None)[0] is None
    with pytest.raises(ValueError, match="not of context"):
        lab.capture_stages(ctx.out.parent / "ladder")
    import shutil

    no3 = shutil.copytree(ctx.out, lab.out / "ctx-no-3")
    t = ctx.table()
    t[t.stage != "3"].to_csv(no3 / "context.csv", index=False)
    with pytest.raises(ValueError, match="no stage 3"):
        lab.capture_stages(no3)


def test_a_bundled_engines_audit_beside_torch(lab):
    source = lab.engine("llama", "dynamic")
    assert "bundled recording of llama" in source.note and source.torch_run is not None
    rep = lab.audit(files=(str(source.trace),), token_range="decode_step", out=lab.out / "engine-audit").value[0]
    assert isinstance(lab.audit_figure(rep), Figure)
    got = lab.against_torch(rep, source)
    assert {"torch_outcome", "audit_verdict", "verdict_agrees"} <= set(got.index)
    assert "your own trace" in lab.against_torch(rep, lab.engine(trace=source.trace))


def test_ds4_beside_the_rebuild_without_a_record_and_the_contexts_checked(lab, tmp_path):
    view = lab.beside_ds4(None)
    assert view.record is None and "ds4lab's side only" in view.label and view.islands.empty
    assert set(view.ladder().engine) == {"ds4lab rebuild"} and view.gains().engine.eq("ds4lab").all()
    assert view.census((1024,)).context.tolist()[-1] == 1024 and view.kernel_kinds().empty
    with pytest.raises(ValueError, match="not a ds4lab ds4 result folder"):
        lab.beside_ds4(tmp_path)
    assert lab.contexts("128,600", "tiny") == (128, 600)
    with pytest.raises(BadInput, match="CONTEXTS='128,99999': 99999 is past tiny's longest context"):
        lab.contexts("128,99999", "tiny", name="CONTEXTS")
    with pytest.raises(BadInput, match="CONTEXTS='x'"):
        lab.contexts("x", "tiny", name="CONTEXTS")


def test_bad_input_to_the_lab_is_named_at_once():
    """An unknown backend or preset is refused when the Lab is made, and an option of the wrong type before any
    job runs, each naming the value."""
    from ds4lab import Lab

    with pytest.raises(ValueError, match="unknown backend 'gpu'.*cupy"):
        Lab("gpu")
    with pytest.raises(Exception, match="unknown preset 'huge'"):
        Lab("sim", preset="huge")
    lab = Lab("sim", preset="tiny")
    with pytest.raises(TypeError, match=r"Lab.ladder: tokens='abc' must be an integer"):
        lab.ladder(tokens="abc")
    with pytest.raises(TypeError, match=r"Lab.ladder: nvtx=1 must be True or False"):
        lab.ladder(nvtx=1)
    with pytest.raises(TypeError, match=r"Lab.ladder: stages=\['0'\] must be a string"):
        lab.ladder(stages=["0"])


def test_a_bad_value_given_to_the_lab_is_named_as_the_keyword_typed():
    """A job's check speaks the command line's flags (``--tokens -5``); called from a notebook the error names the
    keyword the user typed (``tokens=-5``), and the command line keeps its flag."""
    from click.testing import CliRunner

    from ds4lab import Lab
    from ds4lab.cli import main

    with pytest.raises(BadInput, match=r"^Lab.ladder: tokens=-5 must be at least 1$"):
        Lab("sim", preset="tiny").ladder(tokens=-5)
    r = CliRunner().invoke(main, ["ladder", "--backend", "sim", "--preset", "tiny", "--tokens", "-5"])
    assert r.exit_code == 2 and "'--tokens': -5" in r.output


def test_a_capture_mode_no_runtime_has_is_refused_before_the_job_runs(tmp_path):
    """``mode="bogus"`` from Python (the command line's choice list never sees it) is refused naming the keyword and
    the value, for every job whose config names a capture mode; nothing is written."""
    from ds4lab import Lab

    lab = Lab("sim", preset="tiny", out=tmp_path)
    for call, typed in ((lambda: lab.ladder(mode="bogus"), "mode='bogus'"),
                        (lambda: lab.hazards(hazard="sync-memset", mode="bogus"), "mode='bogus'"),
                        (lambda: lab.trace(capture_mode="x"), "capture_mode='x'")):
        with pytest.raises(BadInput, match=rf"{re.escape(typed)}: not a stream-capture mode; choose from global"):
            call()
    assert not any(tmp_path.iterdir())


def test_one_path_where_the_lab_takes_a_list_is_a_list_of_one(tmp_path):
    """``files="a.csv.gz"`` is that one file, not its characters (a notebook user's natural call)."""
    from ds4lab import Lab
    from ds4lab.audit.engines import recorded

    res = Lab("sim", out=tmp_path).audit(files=str(recorded("llama", "static")))
    assert len(res.value) == 1 and res.value[0].tokens.n == 8


def test_keywords_a_job_would_ignore_or_misread_are_refused():
    """A backend given to one method (the Lab's is used: Lab("cupy")), a seed that is not a whole number, and a
    negative step count are refused, each naming the keyword and the value."""
    from ds4lab import Lab

    with pytest.raises(TypeError, match=r"Lab.run: backend='tpu' is the Lab's; make one with it: Lab\('tpu'\)"):
        Lab("sim", preset="tiny").run(backend="tpu")
    assert "backend" not in inspect.signature(Lab.run).parameters
    with pytest.raises(ValueError, match=r"Lab: seed='x' must be a whole number"):
        Lab("sim", seed="x")
    with pytest.raises(BadInput, match=r"Lab.moe: steps=-1: at least one reported step"):
        Lab("sim", preset="tiny").moe(steps=-1)
