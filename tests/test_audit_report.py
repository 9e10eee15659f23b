"""The audit's outputs (files, figure, terminal summary), its job (:mod:`ds4lab.jobs.audit`) and its
command line, on synthetic event tables; and, once the trace readers exist, on files they read."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console

from audit_synth import TraceBuilder, decode_step
from ds4lab.audit import analyze
from ds4lab.audit.report import summary
from ds4lab.jobs.audit import write_report as write
from ds4lab.cli import main
from ds4lab.errors import BadInput
from ds4lab.jobs.audit import AuditConfig, check_config, program_argv

HAVE_SOURCES = importlib.util.find_spec("ds4lab.trace.sources") is not None
NEEDS_SOURCES = pytest.mark.skipif(not HAVE_SOURCES, reason="ds4lab.trace.sources (the trace readers) is not in "
                                                            "this checkout yet")


def _hazards(b, layer):
    if layer == 1:
        b.call("cudaMalloc", stack="serve.py:3 main;engine.py:20 step;engine.py:88 grow_scratch")
        b.memset("cudaMemset", stream=0)


def _table(rng, source="decode.json", tokens=6):
    b = TraceBuilder()
    for p in range(tokens):
        decode_step(b, rng, layers=3, pos=10 + p, emit=(p % 3 == 2), extra=_hazards)
    return b.table(source)


def test_write_makes_every_file_with_its_columns(rng, tmp_path):
    reports = analyze([_table(rng)])
    files = write(reports, tmp_path)
    names = {p.name for p in files}
    assert {"audit.csv", "tokens.csv", "spans.csv", "plans.csv", "meta.json", "audit.png", "audit.svg",
            "audit.pdf"} <= names
    audit = pd.read_csv(tmp_path / "audit.csv")
    for c in ("source", "pid", "device", "kind", "name", "call_class", "verdict_global", "verdict_thread_local",
              "verdict_relaxed", "rule_global", "rule_source", "where", "count", "token_range", "fix"):
        assert c in audit.columns, c
    assert set(audit["kind"]) >= {"call", "variation", "host data"}
    malloc = audit[audit["name"] == "cudaMalloc"].iloc[0]
    assert (malloc["verdict_global"], malloc["verdict_relaxed"]) == ("invalidates", "allowed")
    assert malloc["where"] == "engine.py:88 grow_scratch" and "unsafe_call" in malloc["rule_source"]
    sync = audit[audit["name"] == "cudaStreamSynchronize"].iloc[0]
    assert not sync["rule_guess"] and "stream_sync_capturing" in sync["rule_source"]  # PG, measured: no GUESS
    tokens = pd.read_csv(tmp_path / "tokens.csv")
    assert len(tokens) == 6 and {"eager_us", "gpu_busy_us", "shape", "first_invalidating_global"} <= set(tokens)
    plans = pd.read_csv(tmp_path / "plans.csv")
    assert plans["modeled"].all() and set(plans["plan"]) == {"eager (model check)", "whole token", "spans today",
                                                             "one graph per token shape"}
    meta = json.loads((tmp_path / "meta.json").read_text())
    (u,) = meta["units"]
    assert u["source"] == "decode.json" and u["tokens"]["n"] == 6 and u["capture_stream"]["stream"] == 7
    assert meta["calibration"]["name"] and len(meta["calibration"]["sha256"]) == 64
    assert "MODELED" in meta["modeled"] and "kind" in meta["event_table_columns"]


def test_several_units_are_written_apart(rng, tmp_path):
    a = TraceBuilder(pid=1, tid=1)
    b = TraceBuilder(pid=2, tid=2)
    for p in range(4):
        decode_step(a, rng, pos=p)
        decode_step(b, rng, pos=p)
    from ds4lab.trace.events import EventTable, make_frame

    reports = analyze([EventTable(make_frame(a.rows + b.rows), "two.json", "synthetic")])
    files = {p.name for p in write(reports, tmp_path)}
    assert {"audit-p1-d0.png", "audit-p2-d0.png"} <= files
    tokens = pd.read_csv(tmp_path / "tokens.csv")
    assert sorted(tokens.groupby("pid").size().tolist()) == [4, 4]


def test_the_summary_leads_with_what_matters(rng):
    reports = analyze([_table(rng)])
    con = Console(record=True, width=220)
    summary(reports, con)
    text = con.export_text()
    i_inv = text.index("invalidates")
    i_missing = text.index("not in graph")
    i_frozen = text.index("frozen decisions")
    i_plans = text.index("plans: µs per token, MODELED")
    assert i_inv < i_frozen < i_plans and i_missing < i_frozen
    assert "engine.py:88 grow_scratch" in text and "token shape(s)" in text and "calibration" in text
    assert "capturable spans (global mode" in text and "replay" in text and "(MODELED)" in text


def _edited_calibration(tmp_path):
    """An edited copy of the shipped calibration (same name, one constant changed): its path, name, SHA-256."""
    import hashlib

    from ds4lab.sim.calibration import MEASURED_FILE

    d = json.loads(MEASURED_FILE.read_text())
    d["host_graph_launch_us"] += 1.0
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d, indent=1))
    return path, d["name"], hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_calibration_that_is_not_shipped_is_named_by_path_and_hash(rng, tmp_path, monkeypatch):
    """An edited copy of the shipped file through $DS4LAB_CALIBRATION keeps the shipped file's name; the
    plans heading, plans.csv, spans.csv, meta.json and the figure name it by path and hash, as a ladder's
    titles do; the shipped file by its name alone."""
    import matplotlib.pyplot as plt

    from ds4lab.audit.figure import timeline_figure

    path, name, sha = _edited_calibration(tmp_path)
    monkeypatch.setenv("DS4LAB_CALIBRATION", str(path))
    want = f"{name} ({path.resolve()}, sha256 {sha[:12]})"
    (r,) = analyze([_table(rng)])
    assert r.calibration["shipped"] is False and r.calibration_label == want
    out = tmp_path / "out"
    write([r], out)
    assert set(pd.read_csv(out / "plans.csv")["calibration"]) == {want}
    assert set(pd.read_csv(out / "spans.csv")["calibration"]) == {want}
    assert f"(calibration {want})" in json.loads((out / "meta.json").read_text())["modeled"]
    con = Console(record=True, width=400)
    summary([r], con)
    text = " ".join(con.export_text().split())  # the table title wraps at the table's width
    assert f"plans: µs per token, MODELED (measured trace costs + calibration {want})" in text
    fig = timeline_figure(r)
    try:
        assert f"MODELED (calibration {want})" in fig.axes[0].get_title()
    finally:
        plt.close(fig)

    monkeypatch.delenv("DS4LAB_CALIBRATION")
    (shipped,) = analyze([_table(rng)])
    assert shipped.calibration["shipped"] is True and shipped.calibration_label == name
    assert set(shipped.plans["calibration"]) == {name}


def test_every_timed_table_says_which_times_are_modeled(rng, tmp_path):
    """tokens.csv, spans.csv and plans.csv say on every row which tool wrote the trace and whether its
    times are modeled (False for a GPU trace: measured), and that replay_us and the predictions are
    modeled, with the calibration: each row keeps its provenance when copied out of the folder."""
    for tool, modeled in (("pytorch-profiler (Kineto schema 1.0.1)", False), ("ds4lab-trace (0.1.0, MODELED)", True)):
        table = _table(rng)
        table.tool = tool
        (r,) = analyze([table])
        out = tmp_path / f"modeled-{modeled}"
        write([r], out)
        tokens = pd.read_csv(out / "tokens.csv")
        assert list(tokens.columns) == ["source", "pid", "device", *r.token_table.columns, "tool", "modeled"]
        assert set(tokens["tool"]) == {tool} and tokens["modeled"].tolist() == [modeled] * len(tokens)
        spans = pd.read_csv(out / "spans.csv")
        assert len(spans) and list(spans.columns)[-4:] == ["tool", "modeled", "replay_modeled", "calibration"]
        assert set(spans["tool"]) == {tool} and spans["modeled"].tolist() == [modeled] * len(spans)
        assert spans["replay_modeled"].all() and set(spans["calibration"]) == {r.calibration["name"]}
        plans = pd.read_csv(out / "plans.csv")
        assert list(plans.columns)[-4:] == ["calibration", "modeled", "tool", "eager_modeled"]
        assert plans["modeled"].all() and plans["eager_modeled"].tolist() == [modeled] * len(plans)
        assert set(plans["tool"]) == {tool}


# ----------------------------------------------------------------------------- the job
def test_check_config_refuses_bad_input(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    for cfg, msg in ((AuditConfig(), "nothing to audit"),
                     (AuditConfig(files=(trace,), program=("x.py",)), "not both"),
                     (AuditConfig(files=(tmp_path / "missing.json",)), "missing.json: no such file"),
                     (AuditConfig(files=(tmp_path,)), r"a folder, not a trace file \(give a trace inside it: it holds "
                                                      r"t\.json\)"),
                     (AuditConfig(files=(trace, trace)), "given twice"),
                     (AuditConfig(files=(trace,), modes=("eager",)), "--mode eager"),
                     (AuditConfig(files=(trace,), out=" "), "--out ''")):
        with pytest.raises(BadInput, match=msg):
            check_config(cfg)
    bad_cal = tmp_path / "cal.json"
    bad_cal.write_text(json.dumps({"name": "x"}))
    with pytest.raises(BadInput, match="cal.json"):
        check_config(AuditConfig(files=(trace,), calibration=bad_cal))


def test_program_argv_drops_the_interpreter():
    assert program_argv(["python", "decode.py", "--n", "3"]) == ["decode.py", "--n", "3"]
    assert program_argv(["decode.py"]) == ["decode.py"]
    with pytest.raises(BadInput, match="no program"):
        program_argv(["python3"])


def test_the_job_writes_its_folder(rng, tmp_path, monkeypatch):
    from ds4lab import jobs
    import ds4lab.jobs.audit as job

    trace = tmp_path / "decode.json"
    trace.write_text("{}")  # the reader is replaced below: the job's folder handling is what is tested here
    table = _table(rng, source=str(trace))
    monkeypatch.setattr(job, "_sources", lambda cfg, folder, out, console, meta: [table])
    out = tmp_path / "out"
    con = Console(record=True, width=200)
    res = jobs.execute("audit", AuditConfig(files=(trace,), out=out, modes=("global",)), console=con)
    reports = res.value
    assert len(reports) == 1 and reports[0].modes == ("global",)
    assert set(res.tables) == {"audit", "tokens", "spans", "plans"} and "audit" in res.figures
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["job"] == "audit" and meta["inputs"] == [str(trace)]
    assert meta["units"][0]["tokens"]["n"] == 6
    audit = pd.read_csv(out / "audit.csv")
    assert "verdict_global" in audit and "verdict_relaxed" not in audit
    said = " ".join(con.export_text().split())
    assert "wrote audit.csv" in said and "recorded_outcomes" not in meta and "as recorded beside it" not in said
    # no outcome beside the trace, so no untraced step: the saving is the traced step's, and said so
    assert "saving against the traced eager step" in said and "its tracer's cost included" in said
    assert "µs per launch" in said and "h200-2026-12-03" in said
    assert (pd.read_csv(out / "plans.csv")["baseline"] == "traced").all()


def test_the_command_line_exits_2_on_bad_input(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["audit", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "nope.json: no such file" in r.output
    r = runner.invoke(main, ["audit"])
    assert r.exit_code == 2
    r = runner.invoke(main, ["audit", "run", "--", "python"])
    assert r.exit_code == 2 and "no program" in r.output


# ----------------------------------------------------------------------------- with the trace readers
def _kineto(b: TraceBuilder) -> dict:
    """The builder's rows as a PyTorch profiler (Kineto) Chrome trace: cuda_runtime events on the host
    thread, kernel / gpu_memcpy / gpu_memset events on the device's stream, times in µs."""
    ev = []
    for r in b.rows:
        ts, dur = r["start_ns"] / 1e3, (r["end_ns"] - r["start_ns"]) / 1e3
        if r["kind"] == "api":
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": r["name"], "pid": r["pid"], "tid": r["tid"],
                       "ts": ts, "dur": dur, "args": {"correlation": r.get("correlation", 0) or 0}})
        elif r["kind"] in ("kernel", "memcpy", "memset"):
            cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}[r["kind"]]
            args = {"device": r["device"], "stream": r["stream"], "correlation": r["correlation"]}
            if r["kind"] == "kernel":
                args["grid"] = [int(x) for x in r["grid"].split(",")]
                args["block"] = [int(x) for x in r["block"].split(",")]
            ev.append({"ph": "X", "cat": cat, "name": r["name"], "pid": r["device"], "tid": r["stream"],
                       "ts": ts, "dur": dur, "args": args})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


@NEEDS_SOURCES
def test_a_kineto_trace_is_audited_end_to_end(rng, tmp_path):
    b = TraceBuilder()
    for p in range(6):
        decode_step(b, rng, layers=3, pos=10 + p, extra=_hazards)
    path = tmp_path / "torch_trace.json"
    path.write_text(json.dumps(_kineto(b)))
    out = tmp_path / "audit"
    r = CliRunner().invoke(main, ["audit", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    audit = pd.read_csv(out / "audit.csv")
    got = dict(zip(audit["name"], audit["verdict_global"]))
    assert got["cudaMalloc"] == "invalidates" and got["cudaStreamSynchronize"] == "invalidates"
    assert got["cudaMemset"] == "not in graph"
    assert json.loads((out / "meta.json").read_text())["units"][0]["tokens"]["n"] == 6


def test_a_recording_with_its_outcome_beside_it_shows_what_the_gpu_did(tmp_path):
    """A bundled recording: the audit's verdict and, beside it, what torch.cuda.graph did with the
    same engine on the GPU that recorded it (the outcome file next to the recording), in the console
    and in meta.json, and the plans' saving against the eager step it timed untraced (a trace with no
    outcome beside it: test_the_job_writes_its_folder)."""
    from ds4lab.audit.engines import recorded, recorded_outcome

    rec = recorded("deepseek-v3", "static")
    out = tmp_path / "a"
    r = CliRunner().invoke(main, ["audit", str(rec), "--out", str(out)])
    assert r.exit_code == 0, r.output
    want = recorded_outcome("deepseek-v3", "static")
    said = " ".join(r.output.split())
    assert f"torch.cuda.graph on {want['device']['device']}" in said and f"as recorded beside it: {want['outcome']}" in said
    assert json.loads((out / "meta.json").read_text())["recorded_outcomes"] == {str(rec): want}
    # the savings against the eager step the outcome timed untraced, the traced step's kept beside them
    plans = pd.read_csv(out / "plans.csv").set_index("plan")
    assert (plans["baseline"] == "untraced").all() and (plans["eager_untraced_us"] == want["eager_us"]).all()
    whole = plans.loc["whole token"]
    assert whole["saving_untraced_us"] == pytest.approx(want["eager_us"] - whole["predicted_us"])
    assert whole["saving_untraced_lo"] <= whole["saving_untraced_us"] <= whole["saving_untraced_hi"]
    assert whole["saving_us"] == pytest.approx(whole["eager_measured_us"] - whole["predicted_us"], rel=0.2)
    assert pd.isna(plans.loc["eager (model check)", "saving_untraced_us"])
    assert "saving against the untraced eager step" in said
    assert f"savings against the eager step timed untraced: {want['eager_us']:,.1f} µs" in said
    # the terminal shows the kernels' names without template arguments; spans.csv keeps them whole
    assert "<float" not in r.output and "<…>" in r.output
    assert not any(ln.startswith("reading ") for ln in r.output.splitlines())  # no progress lines for a short read
    assert pd.read_csv(out / "spans.csv")["first_kernel"].str.contains("<float", regex=False).any()
    assert "recorded_outcomes" in json.loads((out / "meta.json").read_text())


def test_a_recorded_program_is_named_where_its_recording_ends_up(tmp_path, monkeypatch):
    """``ds4lab audit run``: meta.json names the recording inside --out, where it is once the run's
    staging folder is swapped in, not the staging folder the recorder wrote it into."""
    import shutil
    from pathlib import Path

    from ds4lab.trace import recording as record
    from ds4lab.audit.engines import recorded
    from ds4lab.jobs import execute

    def fake_run_script(argv, folder, console=None, **kw):  # the recorder needs a GPU: its output, as it writes it
        saved = Path(folder) / "recording.csv.gz"
        shutil.copy(recorded("llama", "static"), saved)
        return saved

    monkeypatch.setattr(record, "run_script", fake_run_script)
    out = tmp_path / "a"
    execute("audit", AuditConfig(program=["python", "decode.py"], out=out))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["recording"] == str(out / "recording.csv.gz") and (out / "recording.csv.gz").is_file()


def test_the_terminal_shortens_cxx_kernel_names_and_the_files_keep_them():
    from ds4lab.audit.names import SHORT_NAME_MAX, label, short_names, short_text

    names = {
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
        "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)": "at::native::vectorized_elementwise_kernel<…>",
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, "
        "true, false, 6, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, float> >"
        "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, float>)": "internal::gemvx::kernel<…>",
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 5, false, false>(float*, float const*, "
        "int, int, int, bool const*, int, bool)": "(anonymous namespace)::softmax_warp_forward<…>",
        "q8_matvec": "q8_matvec",
        "operator<(a, b": "operator<(a, b",  # brackets that do not balance: as it is
    }
    assert short_names(names) == names
    assert len(short_names(["k" * 300])["k" * 300]) == SHORT_NAME_MAX
    # the figure's label: the same parse, the function's own name (a short one keeps its namespace)
    assert [label(n) for n in names][:3] == ["vectorized_elementwise_kernel", "gemvx::kernel", "softmax_warp_forward"]
    said = short_text("from std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(cublasGemvParamsEx"
                      "<int, float>) (frozen launch) at nvtx: decode_step, n < 4")
    assert said == "from std::enable_if<…>::type internal::gemvx::kernel<…>(…) (frozen launch) at nvtx: decode_step, n < 4"
