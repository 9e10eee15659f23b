"""The audit's recording on a real GPU (CuPy workload, cupti-python): every activity kind the audit
reads, Python stacks at hazard-class calls, stream kinds, and the script runner with NVTX ranges.
Skipped without a GPU or without cupti-python."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

KERNEL = r'''
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
'''


@pytest.fixture(scope="module")
def cupti_ok():
    from ds4lab.trace.cupti import cupti_available

    ok, why = cupti_available()
    if not ok:
        pytest.skip(why)


def workload(cp):
    """Hazard-class calls and plain launches, as a decode loop's host code makes them."""
    import numpy as np

    rt = cp.cuda.runtime
    k = cp.RawKernel(KERNEL, "add_one")
    x = cp.zeros(1024, dtype=cp.float32)
    k((4,), (256,), (x, np.int32(1024)))  # legacy stream
    ptr = rt.malloc(4096)  # cudaMalloc
    host = np.arange(1024, dtype=np.float32)
    rt.memcpy(ptr, host.ctypes.data, 4096, rt.memcpyHostToDevice)  # synchronous, pageable
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        k((4,), (256,), (x, np.int32(1024)))
        x[:8].fill(0)  # cudaMemsetAsync
    ev = cp.cuda.Event()
    ev.record(s)
    ev.synchronize()
    s.synchronize()
    rt.deviceSynchronize()
    rt.free(ptr)


def test_recording_a_cupy_workload(cupti_ok, tmp_path):
    import cupy as cp

    from ds4lab.trace.recording import recording
    from ds4lab.trace.sources import read_events as read

    workload(cp)  # compile and warm up outside the recording
    with recording() as rec:
        workload(cp)
    t = rec.table()
    df = t.frame
    kinds = set(df.kind)
    assert {"api", "kernel", "memcpy", "memset", "sync"} <= kinds, (kinds, t.notes)
    api = df[df.kind == "api"]
    assert {"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaEventSynchronize"} <= set(api.name), sorted(set(api.name))
    malloc = api[api.name == "cudaMalloc"].iloc[0]
    assert "test_audit_record_gpu.py" in malloc["stack"] and "workload" in malloc["stack"]
    k = df[(df.kind == "kernel") & (df.name == "add_one")]
    assert len(k) == 2 and (k.grid == "4,1,1").all() and (k.block == "256,1,1").all()
    assert set(k.stream_type) == {"legacy", "non_blocking"}, k[["stream", "stream_type"]]
    m = df[df.kind == "memcpy"]
    assert (m.copy_kind == "HtoD").any() and (m[m.copy_kind == "HtoD"].host_memory == "pageable").any()
    sy = df[df.kind == "sync"]
    assert {"stream", "context", "event"} <= set(sy.sync_kind), set(sy.sync_kind)
    back = read(rec.save(tmp_path))
    assert back.frame.equals(df)


def test_running_a_script_records_nvtx_ranges_and_passes_the_status(cupti_ok, tmp_path):
    from ds4lab.trace.recording import run_script
    from ds4lab.trace.sources import read_events as read

    script = tmp_path / "decode.py"
    script.write_text(textwrap.dedent('''
        import sys, nvtx, cupy as cp
        sys.path.insert(0, %r)
        from test_audit_record_gpu import workload
        for _ in range(3):
            with nvtx.annotate("decode_step", domain="llm"):
                workload(cp)
        sys.exit(5)
    ''' % str(__import__("pathlib").Path(__file__).parent)))
    p = run_script([sys.executable, str(script)], tmp_path / "out")
    t = read(p)
    df = t.frame
    nv = df[df.kind == "nvtx"]
    assert (nv.name == "decode_step").sum() == 3 and (nv.domain == "llm").all(), t.notes
    api = df[df.kind == "api"]
    assert api[api.name == "cudaMalloc"].nvtx_path.eq("decode_step").all()
    assert any("status 5" in n for n in t.notes)
    # the markers pass beside it: the same ranges of an untraced run, and nothing else recorded
    from ds4lab.trace.recording import MARKERS_PASS, markers_beside

    m = read(markers_beside(p))
    assert set(m.frame.kind) == {"nvtx"} and (m.frame.name == "decode_step").sum() == 3, m.notes
    assert m.header["pass"] == MARKERS_PASS and m.header["argv"] == t.header["argv"]


@pytest.mark.parametrize("callbacks", ["native", "python"])
def test_an_argument_pass_reads_every_launch_through_either_callback_path(cupti_ok, monkeypatch, callbacks):
    """The argument pass on a real GPU through CUPTI's C API (a ctypes subscriber, the default) and through
    cupti-python's wrapper (``DS4LAB_CUPTI_CALLBACKS=python``): every launch read, the int argument's bytes
    where the kernel's layout puts them, and the stack of a launch naming this file."""
    import struct

    import cupy as cp
    import numpy as np

    from ds4lab.trace import cupti as C
    from ds4lab.trace.recording import recording

    monkeypatch.setenv(C.CALLBACKS_ENV, callbacks)
    assert C.CuptiSession.get().subscriber is None
    monkeypatch.setattr(C.CuptiSession.get(), "api", None)  # the path chosen again at the next subscription
    k = cp.RawKernel(KERNEL, "add_one")
    x = cp.zeros(1024, dtype=cp.float32)
    k((4,), (256,), (x, np.int32(1024)))
    cp.cuda.runtime.deviceSynchronize()
    with recording(arguments=True) as rec:
        for n in (1000, 1001, 1002):
            k((4,), (256,), (x, np.int32(n)))
        cp.cuda.runtime.deviceSynchronize()
    session = C.CuptiSession.get()
    assert isinstance(session.api, C.NativeCallbacks) == (callbacks == "native")
    st = rec.arguments
    assert len(st.launches) == 3 and all(d is not None for _, d in st.launches.values()), st.notes
    ns = []
    for c in sorted(st.launches):
        name, params, blob = st.params(c)
        assert name.endswith("add_one") and [s for _, s in params] == [8, 4]
        ns.append(struct.unpack("<i", blob[8:12])[0] if blob else None)
    assert ns == [1000, 1001, 1002], st.notes  # differing bytes are kept (no tokens: every value)
    assert all("test_audit_record_gpu.py" in s for s in st.stacks.values()) and st.stacks
