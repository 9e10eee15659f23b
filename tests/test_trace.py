"""ds4lab trace: the sim's modeled schedule and ds4lab's recorded NVTX ranges as Trace Event JSON
(one process per stage), the CUPTI record path with a stand-in module, and the command line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.jobs.trace import TraceConfig, TraceError, api_call_rows, device_rows, kernel_source
from ds4lab.jobs.trace import run as run_trace
from ds4lab.trace.chrome import chrome_trace, load_trace
from ds4lab.trace.live import RecordingAnnotator
from ds4lab.trace.sources import SourceError


def sim():
    from ds4lab.backends import make_backend

    return make_backend("sim", timing_only=True)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    return run_trace(TraceConfig(preset="tiny", stages="0,3", tokens=2, out=out), sim())


def test_trace_json_loads_as_trace_event_json(traced):
    """The issue's done-when on a machine without a GPU: traceEvents with complete events for
    kernels and NVTX ranges."""
    data = json.loads((traced.out / "trace.json").read_text())
    assert data["displayTimeUnit"] == "ns" and isinstance(data["traceEvents"], list)
    x = [e for e in data["traceEvents"] if e["ph"] == "X"]
    cats = {e["cat"] for e in x}
    assert {"kernel", "nvtx"} <= cats
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in x)
    assert load_trace(traced.out)["otherData"]["modeled"] is True


def test_one_process_per_stage_labelled_modeled(traced):
    ev = load_trace(traced.out / "trace.json")["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == 2 and names[1].startswith("stage 0") and names[2].startswith("stage 3")
    assert all("MODELED" in n for n in names.values())
    for pid in names:  # each stage from 0
        assert min(e["ts"] for e in ev if e["ph"] == "X" and e["pid"] == pid) == pytest.approx(0.0)


def test_kernels_match_launch_sites_and_graph_ids(traced):
    k = traced.table("trace_kernels")[traced.table("trace_kernels").kind == "kernel"]
    per = traced.meta["kernels_per_token"]
    assert traced.meta["sites_matched"] == {"0": True, "3": True}
    s0, s3 = k[k.stage == "0"], k[k.stage == "3"]
    assert len(s0) == len(s3) == 2 * per
    assert (s0.graph_id == 0).all()  # eager
    assert (s3.graph_id != 0).all()  # replayed: every kernel from a graph
    one = s3[s3.token == s3.token.min()]
    assert one.graph_node_id.tolist()[:5] == sorted(one.graph_node_id.tolist())[:5]
    assert one.graph_id.nunique() == 1 and s3.token.nunique() == 2
    assert s0.site.tolist() == s3.site.tolist() and s0.site.notna().all()


def test_nvtx_ranges_nest_and_replay_pushes_no_op_ranges(traced):
    n = traced.table("trace_nvtx")
    e = n[n.stage == "0"]
    assert set(e.name) >= {"token", "layer", "q_a"} and e[e.name == "token"].depth.eq(0).all()
    assert e[e.name == "layer"].depth.eq(1).all()
    r = n[n.stage == "3"]
    assert "q_a" not in set(r.name) and (r.name == "token").sum() == 2  # the graph is launched, not its ops
    tok = e[e.name == "token"].iloc[0]
    inside = e[(e.start_us >= tok.start_us) & (e.end_us <= tok.end_us)]
    assert len(inside) > 1  # ranges nest inside the token range


def test_eager_token_has_launch_gaps_the_replay_closes(traced):
    def busy_over_span(st):
        k = traced.table("trace_kernels")[(traced.table("trace_kernels").stage == st) & (traced.table("trace_kernels").kind == "kernel")]
        k = k[k.token == k.token.min()]
        return (k.end_us - k.start_us).sum() / (k.end_us.max() - k.start_us.min())
    assert busy_over_span("3") > busy_over_span("0")


def test_files_and_meta(traced):
    names = {p.name for p in traced.files}
    assert {"trace.json", "trace_kernels.csv", "trace_nvtx.csv", "trace.png", "trace.svg", "trace.pdf"} <= names
    meta = json.loads((traced.out / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["job"] == "trace" and meta["modeled"] is True
    assert "modeled" in meta["kernel_source"]


def test_every_csv_row_says_backend_preset_and_modeled(traced):
    """trace_kernels.csv, trace_nvtx.csv and trace_api.csv keep their provenance when copied: after
    the table's own columns, backend, preset and modeled on every row (as ladder.csv)."""
    import pandas as pd

    for name in ("trace_kernels", "trace_nvtx", "trace_api"):
        frame = traced.table(name)  # the table as written: the job's columns, then the three
        df = pd.read_csv(traced.out / f"{name}.csv")
        assert len(df) == len(frame) > 0, name
        assert list(df.columns) == list(frame.columns) and list(df.columns)[-3:] == ["backend", "preset", "modeled"], name
        assert set(df["backend"]) == {"sim"} and set(df["preset"]) == {"tiny"}, name
        assert df["modeled"].dtype == bool and df["modeled"].all(), name


def test_recording_annotator_records_only_when_on_and_forwards():
    t = iter(range(100))
    calls = []

    class Inner:
        def push(self, *a):
            calls.append(("push", a[0]))

        def pop(self):
            calls.append(("pop",))

    a = RecordingAnnotator(lambda: next(t), inner=Inner())
    a.push("token", "token", 5)
    a.pop()
    assert a.ranges == [] and len(calls) == 2
    a.recording = True
    a.push("token", "token", 5)
    a.push("q_a", "query", 0)
    a.pop()
    a.pop()
    assert [(r.name, r.depth) for r in a.ranges] == [("q_a", 1), ("token", 0)]
    assert a.ranges[1].start_ns < a.ranges[0].start_ns < a.ranges[0].end_ns < a.ranges[1].end_ns
    with pytest.raises(IndexError):
        a.pop()


def test_cupti_records_keep_stream_graph_and_node_ids(monkeypatch):
    """The GPU path without a GPU: a stand-in ``cupti`` module (``tests/fake_cupti.py``) under ds4lab's
    one CUPTI session; the API level of the same span comes with it."""
    import fake_cupti
    from types import SimpleNamespace as R

    m = fake_cupti.install(monkeypatch)
    K = fake_cupti.ActivityKind
    from ds4lab.trace.cupti import TRACE_KINDS
    from ds4lab.trace.live import CuptiTimeline

    src = CuptiTimeline(TRACE_KINDS)
    src.start()
    corr = m.call("cudaLaunchKernel_v7000")
    m.deliver([R(kind=K.CONCURRENT_KERNEL, name=b"q8_matvec", start=100, end=200, device_id=0, stream_id=13,
                 correlation_id=corr, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1, block_z=1,
                 static_shared_memory=0, dynamic_shared_memory=0, graph_id=4, graph_node_id=9),
               R(kind=K.MEMSET, start=210, end=220, device_id=0, stream_id=13, correlation_id=0, bytes=4, memory_kind=3,
                 graph_id=4, graph_node_id=10),
               R(kind=K.STREAM, flag=2, context_id=1, stream_id=13, correlation_id=0),
               R(kind=K.MARKER, flags_=2, timestamp=0, id=1, name="x", domain="", object_id=None)])
    got = device_rows(src, src.take())
    assert got[0] == {"name": "q8_matvec", "kind": "kernel", "start_ns": 100, "end_ns": 200, "stream": 13,
                      "graph_id": 4, "graph_node_id": 9, "correlation": corr, "stream_id": 13, "stream_type": "",
                      "device": 0}
    assert got[1]["kind"] == "memset" and got[1]["bytes"] == 4 and len(got) == 2
    calls, types = api_call_rows(src, src.take_api())
    assert [(c["kind"], c["name"]) for c in calls] == [("api", "cudaLaunchKernel")] and types[13] == "non_blocking"
    assert src.clock_ns() > 0 and int(K.CONCURRENT_KERNEL) in m.enabled
    src.stop()
    assert m.enabled == set()  # everything the trace enabled is disabled again


def test_sim_trace_records_the_api_level_and_scalar_args(traced):
    """On the sim: the backend calls of each traced token (MODELED), linked to their device work, and
    each eager kernel's scalar arguments; a replayed token makes one cudaGraphLaunch."""
    api = traced.table("trace_api")
    s0, s3 = api[api.stage == "0"], api[api.stage == "3"]
    k = traced.table("trace_kernels")
    k0 = k[(k.stage == "0") & (k.kind == "kernel")]
    launches = s0[s0.name == "cudaLaunchKernel"]
    assert len(launches) == len(k0)  # one call per eager kernel
    assert set(k0.correlation) == set(launches.correlation)
    assert (s3.name == "cudaGraphLaunch").sum() == 2  # two traced tokens, one graph each
    assert (launches.stream_type == "legacy").all()  # stage 0: the legacy stream
    assert (s3[s3.name == "cudaGraphLaunch"].stream_type == "non_blocking").all()
    assert k0.args.notna().all() and (k0.args != "").any()
    # a position-like argument: the same launch site, different values in the two tokens
    per = traced.meta["kernels_per_token"]
    a, b = k0.args.tolist()[:per], k0.args.tolist()[per:2 * per]
    assert any(x != y for x, y in zip(a, b))
    assert (k[(k.stage == "3") & (k.kind == "kernel")].get("args").isna()).all()  # replayed: frozen args
    assert (traced.out / "trace_api.csv").is_file()


def test_the_audit_reads_ds4labs_trace(traced):
    from ds4lab.trace.sources import detect
    from ds4lab.trace.sources import read_events as read

    p = traced.out / "trace.json"
    assert detect(p) == "ds4lab-trace"
    t = read(p)
    df = t.frame
    assert "MODELED" in t.tool and set(df.pid) == {1, 2}
    api = df[df.kind == "api"]
    s0 = api[api.pid == 1]
    assert (s0.name == "cudaLaunchKernel").sum() == (df[(df.pid == 1) & (df.kind == "kernel")].shape[0])
    launches = s0[s0.name == "cudaLaunchKernel"]
    assert launches.nvtx_path.str.startswith("token").all() and (launches.stream_type == "legacy").all()
    k = df[(df.kind == "kernel") & (df.pid == 1)]
    assert (k.args != "").any() and k.nvtx_path.str.contains("/").all()
    assert (df[(df.kind == "kernel") & (df.pid == 2)].graph_id > 0).all()


def test_no_kernel_source_on_the_numpy_backend():
    from ds4lab.executor.numpy_backend import NumpyBackend

    with pytest.raises(TraceError, match="no kernel timeline on the numpy backend"):
        kernel_source(NumpyBackend())


def test_bad_requests(tmp_path):
    with pytest.raises(TraceError, match="unknown stage"):
        run_trace(TraceConfig(preset="tiny", stages="0,7", out=tmp_path / "a"), sim())
    with pytest.raises(TraceError, match="at least 1"):
        run_trace(TraceConfig(preset="tiny", tokens=0, out=tmp_path / "b"), sim())
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_load_trace_names_a_bad_event(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"traceEvents": [{"name": "k", "ph": "X", "pid": 1, "ts": 0.0}]}))
    with pytest.raises(SourceError, match=r"traceEvents\[0\] is a complete event without numeric ts and dur"):
        load_trace(p)
    p.write_text("[]")
    with pytest.raises(SourceError, match="no traceEvents list"):
        load_trace(p)


def test_chrome_trace_of_empty_stage_tables_has_metadata_only():
    import pandas as pd

    d = chrome_trace(pd.DataFrame(), pd.DataFrame(), {"stages": ["0"], "modeled": True})
    assert {e["ph"] for e in d["traceEvents"]} == {"M"}


def test_cli_trace_on_the_sim(tmp_path):
    out = tmp_path / "t"
    r = CliRunner().invoke(main, ["trace", "--backend", "sim", "--preset", "tiny", "--stages", "0,3",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "MODELED" in r.output and (out / "trace.json").is_file()
    bad = CliRunner().invoke(main, ["trace", "--backend", "sim", "--preset", "tiny", "--stages", "x"])
    assert bad.exit_code == 2 and "unknown stage" in bad.output


def test_the_job_runs_through_the_jobs_layer(tmp_path):
    from ds4lab.jobs import execute

    res = execute("trace", TraceConfig(stages="0", tokens=1, out=tmp_path / "j"), backend="sim")
    assert res.meta["preset"]["name"] == "small"  # the trace job's default off a GPU, as every job's
    assert load_trace(tmp_path / "j")["otherData"]["stages"] == ["0"]
