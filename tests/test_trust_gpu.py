"""The cupy backend reports every CUDA status by name (no swallowed query status) and CUDA's
reason for a refused executable update; the same calls on the sim answer the same way."""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.errors import CudaError, GraphExecUpdateError



def _add_graph(be, s, x, n):
    be.begin_capture(s, "thread_local")
    for _ in range(n):
        be.memset_async(s, x, 1)
    return be.end_capture(s)


@pytest.fixture(params=[pytest.param("cupy", marks=pytest.mark.gpu), "sim"])
def be(request):
    if request.param == "cupy":
        return request.getfixturevalue("cupy_backend")
    from ds4lab.sim.backend import SimBackend

    return SimBackend()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_stream_query_on_a_capturing_stream_raises_by_name(be, mode):
    s = be.new_stream()
    be.begin_capture(s, mode)
    with pytest.raises(CudaError) as ei:
        be.stream_query(s)
    assert ei.value.name == "cudaErrorStreamCaptureUnsupported"
    assert be.capture_status(s) == "invalidated"
    with pytest.raises(CudaError, match="cudaErrorStreamCaptureInvalidated"):
        be.end_capture(s)
    assert be.stream_query(s) is True  # an ordinary stream again, nothing pending


def test_event_query_of_an_invalidated_capture_raises_invalid_value(be):
    s = be.new_stream()
    e = be.new_event()
    x = be.zeros((16,), np.float32)
    be.begin_capture(s, "relaxed")
    be.memset_async(s, x, 0)
    be.event_record(s, e)
    with pytest.raises(CudaError):
        be.synchronize()  # invalidates
    with pytest.raises(CudaError) as ei:
        be.event_query(e)
    assert ei.value.name == "cudaErrorInvalidValue"
    with pytest.raises(CudaError):
        be.end_capture(s)


def test_refused_update_names_cuda_result_and_node_type(be):
    s = be.new_stream()
    x = be.zeros((16,), np.float32)
    ex = be.graph_instantiate(_add_graph(be, s, x, 1))
    with pytest.raises(GraphExecUpdateError) as ei:
        be.graph_exec_update(ex, _add_graph(be, s, x, 2))
    assert ei.value.name == "cudaErrorGraphExecUpdateFailure"
    assert ei.value.result == "cudaGraphExecUpdateErrorTopologyChanged"
    be.graph_exec_update(ex, _add_graph(be, s, x, 1))  # same topology: accepted


class _FakeRuntime:
    """CuPy's ``runtime`` as far as the queries go: it *returns* a status (gpu-facts.md)."""

    def __init__(self, status: int) -> None:
        self.status = status

    def streamQuery(self, ptr):
        return self.status

    def eventQuery(self, ptr):
        return self.status


@pytest.mark.parametrize("status,want", [(0, True), (600, False), (900, "cudaErrorStreamCaptureUnsupported"),
                                         (1, "cudaErrorInvalidValue"), (907, "cudaErrorCapturedEvent"),
                                         (400, "cudaErrorInvalidResourceHandle")])
@pytest.mark.parametrize("which", ["stream", "event"])
def test_cupy_queries_raise_every_status_but_success_and_not_ready_cpu(status, want, which):
    """The swallowed-status bug without a GPU: a returned status other than 0 or 600 is raised by name."""
    from types import SimpleNamespace

    from ds4lab.backends.cupy_backend import CupyBackend

    be = CupyBackend.__new__(CupyBackend)  # no GPU here: only the query path is exercised
    be.cp = SimpleNamespace(cuda=SimpleNamespace(runtime=_FakeRuntime(status)))
    call = (lambda: be.stream_query(SimpleNamespace(ptr=7))) if which == "stream" else \
        (lambda: be.event_query(SimpleNamespace(ptr=7)))
    if isinstance(want, bool):
        assert call() is want
    else:
        with pytest.raises(CudaError) as ei:
            call()
        assert ei.value.name == want
