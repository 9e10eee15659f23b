"""``ds4lab.Lab``, the workbench in one object for notebooks: every method runs its job on the sim (the
``tiny`` preset, small counts: seconds each) and returns the job's result with its tables and figure;
its keywords are the job config's, with that config's defaults; what a GPU-only job cannot do on the sim
is refused as the command line refuses it."""

from __future__ import annotations

import inspect
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
    with pytest.raises(BadInput, match="needs --source"):
        lab.ds4()


def test_tables_of_what_there_is():
    assert "tiny" in ds4lab.Lab.presets().index
    assert {"0", "3"} <= set(ds4lab.Lab.stages().columns) | set(ds4lab.Lab.stages().index)
    hz = ds4lab.Lab.hazard_table()
    assert {"device-sync", "tp-collective-order"} <= set(hz.index) and set(hz.steps) >= {"token", "moe", "tp"}
