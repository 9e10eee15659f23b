"""The audit's in-process recording on a stand-in ``cupti`` module (every record kind, Python stacks of
hazard-class calls, NVTX markers, stream types), the saved file, the script runner (exit status,
exceptions, Ctrl-C), and the errors without CUPTI. The real thing runs in ``test_audit_record_gpu.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace as R

import pytest

import fake_cupti
from fake_cupti import ActivityKind as K
from ds4lab.trace import recording as REC
from ds4lab.trace.sources import SourceError, detect
from ds4lab.trace.sources import read_events as read


def device_work(m, corr_kernel, corr_copy, corr_sync):
    m.deliver([
        R(kind=K.CONCURRENT_KERNEL, name=b"_Z6matmulPfS_", start=m.clock + 5, end=m.clock + 50, device_id=0,
          stream_id=13, correlation_id=corr_kernel, grid_x=4, grid_y=2, grid_z=1, block_x=128, block_y=1, block_z=1,
          static_shared_memory=0, dynamic_shared_memory=1024, graph_id=0, graph_node_id=0),
        R(kind=K.MEMCPY, copy_kind=1, start=m.clock + 60, end=m.clock + 70, device_id=0, stream_id=7,
          correlation_id=corr_copy, bytes=8, src_kind=1, dst_kind=3, graph_id=0, graph_node_id=0),
        R(kind=K.SYNCHRONIZATION, type=3, start=m.clock + 80, end=m.clock + 90, context_id=1, stream_id=7,
          correlation_id=corr_sync, cuda_event_id=0xFFFFFFFF),
        R(kind=K.STREAM, flag=2, context_id=1, stream_id=13, correlation_id=0),
    ])


def decode_step(m):
    """A tiny stand-in decode step: a launch, a pageable copy, a sync, inside an NVTX range."""
    t = m.get_timestamp()
    m.deliver([R(kind=K.MARKER, flags_=2, timestamp=t, id=1, name="decode_step", domain="llm",
                 object_id=R(pt=R(process_id=os.getpid(), thread_id=77)))])
    k = m.call("cudaLaunchKernel_v7000")
    c = m.call("cudaMemcpyAsync_v3020")
    s = m.call("cudaStreamSynchronize_v3020")
    device_work(m, k, c, s)
    m.deliver([R(kind=K.MARKER, flags_=4, timestamp=m.get_timestamp(), id=1, name="", domain="llm",
                 object_id=R(pt=R(process_id=os.getpid(), thread_id=77)))])
    return k, c, s


def test_recording_tables_every_kind(monkeypatch, tmp_path):
    m = fake_cupti.install(monkeypatch)
    monkeypatch.setattr(REC, "demangle", lambda names: {"_Z6matmulPfS_": "matmul(float*, float*)"})
    from ds4lab.trace import cupti as C

    monkeypatch.setattr(C, "current_context", lambda: 0x55)  # a context, as cuCtxGetCurrent gives it
    with REC.recording() as rec:
        with pytest.raises(RuntimeError, match="still running"):
            rec.table()
        m.call("cudaMalloc_v3020")
        k, c, s = decode_step(m)
    assert m.enabled == set() and m.subscribers == {}  # everything given back
    assert m.thread_id_type == fake_cupti.ActivityThreadIdType.SYSTEM
    t = rec.table()
    df = t.frame
    assert t.source == "<recording>" and t.tool == "cupti (cupti-python 13.0.1-fake)"
    api = df[df.kind == "api"].set_index("correlation")
    assert api.name.tolist() == ["cudaMalloc", "cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize"]
    assert (api.domain == "runtime").all() and (api.tid == 77).all()
    # Python stacks on the hazard-class calls only
    assert "test_recording_tables_every_kind" in api.loc[1, "stack"]
    assert "decode_step" in api.loc[c, "stack"] and "decode_step" in api.loc[s, "stack"]
    assert api.loc[k, "stack"] == ""  # a plain launch pays nothing
    # device rows and what they give the calls
    kr = df[df.kind == "kernel"].iloc[0]
    assert (kr["name"], kr.grid, kr.block, kr.shared_bytes, kr.stream) == ("matmul(float*, float*)", "4,2,1",
                                                                            "128,1,1", 1024, 13)
    assert kr.stream_type == "non_blocking" and api.loc[k, "stream_type"] == "non_blocking"
    mc = df[df.kind == "memcpy"].iloc[0]
    assert (mc.copy_kind, mc.host_memory, mc["name"]) == ("HtoD", "pageable", "Memcpy HtoD (Pageable -> Device)")
    assert mc.stream_type == "legacy"  # stream 7: the legacy stream's id as CUPTI gives it
    sy = df[df.kind == "sync"].iloc[0]
    assert (sy.sync_kind, sy.stream, sy.event, sy.device) == ("stream", 7, -1, 0)
    assert api.loc[s, "stream"] == 7 and api.loc[c, "device"] == 0
    # the NVTX marker pair is a range, and the calls inside it say so
    nv = df[df.kind == "nvtx"]
    assert nv["name"].tolist() == ["decode_step"] and nv.domain.iloc[0] == "llm"
    assert api.loc[k, "nvtx_path"] == "decode_step" and api.loc[1, "nvtx_path"] == ""
    assert any("Python stacks recorded at 3" in n for n in t.notes)
    # saved and read back
    p = rec.save(tmp_path)
    assert p.name == "recording.csv.gz" and detect(p) == "recording"
    back = read(p)
    assert back.frame.equals(df)


def test_refused_kind_and_refused_subscriber_are_noted(monkeypatch):
    m = fake_cupti.install(monkeypatch, refuse=("MARKER",))

    def no(*a):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    monkeypatch.setattr(m, "subscribe", no)
    with REC.recording() as rec:
        m.call("cudaMalloc_v3020")
    notes = " ".join(rec.table().notes)
    assert "MARKER" in notes and "no Python stacks" in notes and "MULTIPLE_SUBSCRIBERS" in notes


def test_recording_without_cupti_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(REC, "cupti_available", lambda: (False, "cupti-python not importable (test)"))
    with pytest.raises(SourceError, match="cannot record: cupti-python not importable"):
        with REC.recording():
            pass
    with pytest.raises(SourceError, match="cannot record"):
        REC.run_script(["python", "x.py"], "out")


def test_run_script_names_the_reason_the_subprocess_could_not_record(monkeypatch, tmp_path):
    """Past the parent's check, the child runs with no usable CUPTI here: the error file carries its reason."""
    monkeypatch.setattr(REC, "cupti_available", lambda: (True, "ok"))
    script = tmp_path / "s.py"
    script.write_text("print('never')\n")
    try:
        import cupti.cupti  # noqa: F401
        pytest.skip("cupti-python imports here: the child could record")
    except Exception:
        pass
    with pytest.raises(SourceError, match="cannot record: cupti-python not importable"):
        REC.run_script([sys.executable, str(script)], tmp_path / "out")
    with pytest.raises(SourceError, match="no script given"):
        REC.run_script(["python"], tmp_path / "out")


@pytest.mark.parametrize("body, status", [("sys.exit(3)", 3), ("raise ValueError('boom')", 1),
                                          ("raise KeyboardInterrupt", 130), ("pass", 0)])
def test_runner_saves_what_was_recorded_and_passes_the_status_on(monkeypatch, tmp_path, body, status, capsys):
    m = fake_cupti.install(monkeypatch)
    script = tmp_path / "decode.py"
    script.write_text("import sys\nimport fake_cupti_mod as m\nm.call('cudaMalloc_v3020')\n"
                      "assert sys.argv == [sys.argv[0], '--tokens', '4'], sys.argv\n" + body + "\n")
    monkeypatch.setitem(sys.modules, "fake_cupti_mod", m)
    out = tmp_path / "rec.csv.gz"
    argv_before, path_before = list(sys.argv), list(sys.path)
    rc = REC.main(["--out", str(out), "--", "python", str(script), "--tokens", "4"])
    assert (sys.argv, sys.path) == (argv_before, path_before)  # the runner puts them back
    assert rc == status
    t = read(out)
    assert (t.frame.kind == "api").sum() == 1 and t.frame["name"].iloc[0] == "cudaMalloc"
    stack = t.frame["stack"].iloc[0].split(";")
    assert stack[0] == f"{script}:3 <module>"  # the runner's own frames (runpy, click, ds4lab) are cut
    assert ("exited with status" in " ".join(t.notes)) == (status != 0)
    assert str(script) in t.source
    if status == 1:
        assert "ValueError: boom" in capsys.readouterr().err


def test_host_ranges_stand_in_for_nvtx_ranges_that_never_reached_cupti(monkeypatch):
    m = fake_cupti.install(monkeypatch)
    monkeypatch.setattr(REC, "demangle", lambda names: {})
    monkeypatch.setattr(REC.threading, "get_native_id", lambda: 77)  # the fake's calls are on thread 77
    with REC.recording(stacks=False) as rec:
        for _ in range(2):
            with rec.host_range("decode_step"):
                k = m.call("cudaLaunchKernel_v7000")
                device_work(m, k, m.call("cudaMemcpyAsync_v3020"), m.call("cudaStreamSynchronize_v3020"))
    t = rec.table()
    nv = t.frame[t.frame.kind == "nvtx"]
    assert nv["name"].tolist() == ["decode_step"] * 2 and (nv.domain == REC.HOST_RANGE_DOMAIN).all()
    launches = t.frame[(t.frame.kind == "api") & (t.frame["name"] == "cudaLaunchKernel")]
    assert (launches.nvtx_path == "decode_step").all() and len(launches) == 2
    assert any("no NVTX range decode_step reached CUPTI" in n for n in t.notes)


def test_host_ranges_give_way_to_the_nvtx_ranges_cupti_saw(monkeypatch):
    m = fake_cupti.install(monkeypatch)
    monkeypatch.setattr(REC, "demangle", lambda names: {})
    with REC.recording(stacks=False) as rec:
        with rec.host_range("decode_step"):
            decode_step(m)
    nv = rec.table().frame.query("kind == 'nvtx'")
    assert nv["name"].tolist() == ["decode_step"] and nv.domain.iloc[0] == "llm"  # NVTX's own, once


@pytest.mark.parametrize("asks", [True, False])
def test_the_capture_path_runner_answers_yes_and_keeps_only_a_pass_that_was_asked(monkeypatch, tmp_path, asks):
    """``--as-if-capturing``: inside the script PyTorch says the stream captures (a stand-in torch); a script
    that never asks leaves no table, only the reason (it ran the recorded path again)."""
    from types import SimpleNamespace

    from ds4lab.trace.capture_path import NOT_ASKED

    fake_cupti.install(monkeypatch)
    torch = SimpleNamespace(cuda=SimpleNamespace(is_current_stream_capturing=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", torch)
    script = tmp_path / "decode.py"
    script.write_text("import torch\n" + ("assert torch.cuda.is_current_stream_capturing() is True\n" if asks else ""))
    out = tmp_path / "capture-path.csv.gz"
    assert REC.main(["--out", str(out), "--as-if-capturing", "--", "python", str(script)]) == 0
    assert torch.cuda.is_current_stream_capturing() is False  # put back
    err = out.with_name(out.name + ".error.txt")
    assert out.is_file() == asks and err.is_file() == (not asks)
    if not asks:
        assert err.read_text().strip() == NOT_ASKED


def test_the_capture_path_runner_without_torch_says_so(monkeypatch, tmp_path):
    fake_cupti.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    script = tmp_path / "decode.py"
    script.write_text("pass\n")
    out = tmp_path / "capture-path.csv.gz"
    assert REC.main(["--out", str(out), "--as-if-capturing", "--", "python", str(script)]) == 2
    assert not out.exists() and "torch" in out.with_name(out.name + ".error.txt").read_text()


#: What the script of the markers-pass test saw of CUPTI while it ran.
SEEN: dict = {}


def test_the_markers_pass_records_the_nvtx_ranges_and_nothing_else(monkeypatch, tmp_path):
    """``--markers``: only CUPTI's MARKER activity is enabled (no API, kernel or copy activity, no callback
    subscriber: the loop runs untraced), the ranges are saved with the script's argv and ``pass: markers``."""
    m = fake_cupti.install(monkeypatch)
    monkeypatch.setattr(REC, "demangle", lambda names: {})
    SEEN.clear()
    monkeypatch.setitem(sys.modules, "fake_cupti_mod", m)
    monkeypatch.setitem(sys.modules, "step_mod", sys.modules[__name__])
    script = tmp_path / "decode.py"
    script.write_text("import fake_cupti_mod as m, step_mod\n"
                      "step_mod.SEEN['enabled'] = set(m.enabled); step_mod.SEEN['subscribers'] = dict(m.subscribers)\n"
                      "for _ in range(3):\n    step_mod.decode_step(m)\n")
    out = tmp_path / "recording.markers.csv.gz"
    assert REC.main(["--out", str(out), "--markers", "--", "python", str(script), "--tokens", "3"]) == 0
    assert SEEN["enabled"] == {int(K.MARKER)} and not SEEN["subscribers"]
    t = read(out)
    assert set(t.frame["kind"]) == {"nvtx"} and t.frame["name"].tolist() == ["decode_step"] * 3
    assert t.header["pass"] == REC.MARKERS_PASS and t.header["argv"] == [str(script), "--tokens", "3"]


def test_the_markers_pass_is_found_beside_its_recording_by_the_whole_stem(tmp_path):
    rec, other = tmp_path / "recording.csv.gz", tmp_path / "my.run.csv.gz"
    assert REC.markers_name(rec).name == "recording.markers.csv.gz"
    assert REC.markers_name(other).name == "my.run.markers.csv.gz"
    assert REC.markers_beside(other) is None
    REC.markers_name(other).write_bytes(b"")
    assert REC.markers_beside(other) == tmp_path / "my.run.markers.csv.gz"
    assert REC.markers_beside(tmp_path / "my.csv.gz") is None  # another stem: not its pass
    assert REC.markers_beside(REC.markers_name(other)) is None  # a pass has no pass beside it
    assert REC.markers_beside(tmp_path / "capture-path.csv.gz") is None


def _fake_passes(monkeypatch, ask_stack):
    """run_script with every pass a stand-in that writes its table: which passes ran, in order."""
    from ds4lab.trace.events import EventTable, make_frame
    from ds4lab.trace.sources.saved import write_table

    ran = []

    def run_pass(cmd, env, say):
        out = Path(cmd[cmd.index("--out") + 1])
        kind = ("markers" if "--markers" in cmd else "capture-path" if "--as-if-capturing" in cmd else
                "arguments" if "--arguments" in cmd else "timed")
        ran.append(kind)
        rows = [{"kind": "api", "name": "cudaStreamIsCapturing_v10000", "pid": 1, "tid": 1, "start_ns": 10,
                 "end_ns": 20, "stack": ask_stack}]
        write_table(EventTable(make_frame(rows), "<recording>", "cupti"), out)
        return 0

    monkeypatch.setattr(REC, "cupti_available", lambda: (True, "ok"))
    monkeypatch.setattr(REC, "_run_pass", run_pass)
    return ran


@pytest.mark.parametrize("stack, capture_path", [
    ("decode.py:3 <module>;torch/nn/modules/module.py:1370 convert", False),  # PyTorch's C++ asked CUDA
    ("decode.py:3 <module>;torch/cuda/graphs.py:50 is_current_stream_capturing", True),
    ("", True)])  # no stack: it cannot be told, so the pass runs
def test_run_script_records_the_markers_pass_and_a_capture_path_only_where_python_may_ask(monkeypatch, tmp_path,
                                                                                        stack, capture_path):
    ran = _fake_passes(monkeypatch, stack)
    said = []
    console = R(print=lambda *a, **k: said.append(" ".join(map(str, a))))
    out = REC.run_script(["python", "decode.py"], tmp_path, console, arguments=True)
    assert out == tmp_path / "recording.csv.gz"
    assert ran == ["timed", *(["capture-path"] if capture_path else []), "markers", "arguments"]
    assert (tmp_path / "recording.markers.csv.gz").is_file()
    assert any("every time from C/C++" in s for s in said) == (not capture_path)
    ran.clear()
    REC.run_script(["python", "decode.py"], tmp_path, console, markers=False)
    assert "markers" not in ran and not (tmp_path / "recording.markers.csv.gz").exists()  # an old pass is removed
