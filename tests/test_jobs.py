"""The job layer (:mod:`ds4lab.jobs`): one default-preset rule, one error hierarchy with its exit
codes, the backend each job asks for, and the scoped launch recorder."""

from __future__ import annotations

import pytest

from ds4lab import jobs
from ds4lab.backends import BackendUnavailable, make_backend
from ds4lab.token.config import ConfigError, get_preset
from ds4lab.errors import BadInput, CheckFailed
from ds4lab.jobs.common import DEFAULT_PRESETS, default_preset, exit_code
from ds4lab.token.model import DecodeModel, TokenOptions
from ds4lab.report.results import OutputError


def test_every_job_has_a_default_preset_row_and_a_module():
    for job in jobs.JOBS:
        # conformance builds its own small models; audit, ingest and compare model no preset (they read files);
        # each notebook picks its own; ds4 runs ds4 itself on a Flash-shaped model (ds4 opens no other shape)
        assert job in DEFAULT_PRESETS or job in ("conformance", "audit", "audit-validate", "ingest", "compare",
                                                 "notebooks", "ds4")
        mod = jobs.module(job)
        assert callable(mod.run)
    with pytest.raises(KeyError, match="unknown job 'nope'"):
        jobs.module("nope")


def test_default_preset_depends_on_the_backend_only_through_the_table():
    sim = make_backend("sim", timing_only=True)
    assert default_preset("ladder", sim) == DEFAULT_PRESETS["ladder"][1] == "small"
    # every job models small on the CPU (run defaulted to tiny); run's sim then models time only
    assert {job: default_preset(job, sim) for job, (_, cpu) in DEFAULT_PRESETS.items() if cpu} == {
        job: "small" for job, (_, cpu) in DEFAULT_PRESETS.items() if cpu}
    from ds4lab.jobs.run import RunConfig, timing_only_for

    assert timing_only_for(RunConfig()) and timing_only_for(RunConfig(preset="small"))
    assert not timing_only_for(RunConfig(preset="tiny")) and not timing_only_for(RunConfig(timing_only=False))

    class FakeGpu:
        is_gpu = True

    assert default_preset("ladder", FakeGpu()) == "ds4-flash"
    assert default_preset("bench", sim) == "ds4-flash"  # GPU-only jobs have no CPU row


@pytest.mark.parametrize("exc, code", [
    (BadInput("x"), 2), (OutputError("x"), 2), (ConfigError("x"), 2), (BackendUnavailable("x"), 2),
    (MemoryError("x"), 2), (CheckFailed("x"), 1), (RuntimeError("x"), 1), (ValueError("x"), 1),
    (KeyboardInterrupt(), 130)])
def test_exit_codes_come_from_the_error_class_not_the_order_of_except_clauses(exc, code):
    assert exit_code(exc) == code


def test_not_exact_is_a_failed_check_not_bad_input():
    from ds4lab.jobs.ladder import NotExact
    from ds4lab.experiments.stages import StageInputError

    assert exit_code(NotExact("stage 3: hidden")) == 1
    assert exit_code(StageInputError("stage 9")) == 2


def test_gpu_only_job_without_a_gpu_is_refused_before_any_work(tmp_path):
    from ds4lab.backends.cupy_backend import gpu_usable

    if gpu_usable()[0]:
        pytest.skip("a GPU is usable here")
    from ds4lab.jobs.bench import BenchConfig

    with pytest.raises(BackendUnavailable, match="ds4lab bench measures a GPU"):
        jobs.execute("bench", BenchConfig(out=tmp_path / "b"), backend="auto")
    assert not (tmp_path / "b").exists()


def test_every_command_is_a_job_returning_the_one_result_type():
    """Every command but the listings (``presets``) and ``notebooks`` runs through ``JOBS``; each job's
    ``run`` declares the one result type."""
    import inspect

    from ds4lab.cli import main

    commands = set(main.commands) - {"presets", "notebooks"}
    assert commands <= set(jobs.JOBS), sorted(commands - set(jobs.JOBS))
    assert {"trace", "compare", "ingest", "audit-validate"} <= set(jobs.JOBS)
    for name in jobs.JOBS:
        ret = inspect.signature(jobs.module(name).run).return_annotation
        assert ret in ("JobResult", jobs.JobResult), f"{name}: run returns {ret!r}"


def test_the_result_type_names_its_tables_and_figures():
    r = jobs.JobResult("ladder", {"job": "ladder"}, tables={"ladder": 1}, figures={"ladder": 2, "other": 3})
    assert r.table() == 1 and r.figure() == 2 and r.figure("other") == 3
    with pytest.raises(KeyError, match="no table 'x'; its tables: ladder"):
        r.table("x")


def test_a_job_refuses_a_backend_it_does_not_run_on():
    from ds4lab.jobs.ladder import LadderConfig

    with pytest.raises(BadInput, match="--backend numpy"):
        jobs.execute("ladder", LadderConfig(), backend="numpy")


def test_launcher_recording_is_scoped_and_restores_the_outer_recorder():
    m = DecodeModel(get_preset("tiny"), make_backend("sim", timing_only=True), TokenOptions(vocab=False),
                    n_layers=1)
    with m.L.recording() as outer:
        m.token(1000, 3)
        n_outer = len(outer)
        with m.L.recording() as inner:
            m.token(1001, 4)
        assert len(inner) == n_outer and m.L.trace is outer
    assert m.L.trace is None
    assert len(outer) == 2 * n_outer  # the inner block's launches belong to the outer block too


def test_model_observe_restores_the_previous_observer_even_on_error():
    from ds4lab.token.model import MoeObserver

    m = DecodeModel(get_preset("tiny"), make_backend("sim", timing_only=True), TokenOptions(vocab=False),
                    n_layers=1)
    a, b = MoeObserver(), MoeObserver()
    with m.observe(a):
        assert m.moe_observer is a
        with pytest.raises(RuntimeError):
            with m.observe(b):
                assert m.moe_observer is b
                raise RuntimeError("inside")
        assert m.moe_observer is a
    assert m.moe_observer is None


def test_figure_titles_name_the_calibration_not_its_dict(tmp_path):
    """A modeled figure's title names the calibration (shipped: its name; else name, path, hash)."""
    import json

    from ds4lab.sim.calibration import backend_calibration
    from ds4lab.report.plots import provenance_title

    be = make_backend("sim", timing_only=True)
    meta = {"modeled": True, "calibration": backend_calibration(be), "preset": {"name": "tiny"}}
    title = provenance_title(meta, "x")
    assert be.calibration_name in title and "sha256" not in title and "{" not in title
    cal = json.loads(open(be.calibration["path"]).read())
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(cal))
    from ds4lab.sim.backend import SimBackend

    other = SimBackend(timing_only=True, calibration=edited)
    title2 = provenance_title({**meta, "calibration": backend_calibration(other)}, "x")
    assert str(edited) in title2 and "sha256" in title2
