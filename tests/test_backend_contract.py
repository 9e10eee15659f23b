"""The backend contract (:mod:`ds4lab.executor.base`), checked the same way on every backend:
numpy and sim always, cupy where a GPU is usable (marked ``gpu``)."""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.backends import DeviceClock, ModeledTime, BACKENDS, Executor, RuntimeApi, can_capture, make_backend, resolve
from ds4lab.backends.cupy_backend import gpu_usable
from ds4lab.capture.stream import LEGACY_STREAM

GPU = pytest.mark.gpu
NAMES = ["numpy", "sim", pytest.param("cupy", marks=[GPU, pytest.mark.skipif(not gpu_usable()[0],
                                                                             reason="no usable GPU")])]


@pytest.fixture(params=NAMES)
def be(request):
    return make_backend(request.param)


def test_every_backend_is_an_executor_with_declared_capabilities(be):
    assert isinstance(be, Executor)
    for attr, kind in (("name", str), ("is_gpu", bool), ("measures_time", bool), ("models_time", bool),
                       ("timing_only", bool)):
        assert isinstance(getattr(be, attr), kind), attr
    # a backend measures time, models it, or makes no timing claim at all; never two of these
    assert not (be.measures_time and be.models_time)
    assert (be.calibration is not None) == be.models_time
    # modeled time is its own protocol: a backend declares it, or has none of its calls
    assert isinstance(be, ModeledTime) == be.models_time
    if be.models_time:
        assert be.calibration_name and be.modeled_copy_GBps()[0] > 0
        assert be.modeled_kernel_us("q8_matvec", 1 << 20) > 0
        records, nxt = be.trace_records()
        assert isinstance(records, list) and nxt == len(records)
        assert be.modeled_start_us(LEGACY_STREAM) >= 0
    else:
        assert be.calibration_name is None
        assert not any(hasattr(be, m) for m in ("trace_records", "modeled_start_us", "modeled_copy_GBps",
                                                "modeled_kernel_us"))
    assert isinstance(be, DeviceClock) == be.is_gpu


def test_runtime_api_is_implemented_by_exactly_the_capturing_backends(be):
    assert can_capture(be) == (be.name in ("sim", "cupy"))
    assert isinstance(be, RuntimeApi) == can_capture(be)


def test_memory_round_trip_and_memsets(be):
    a = np.random.default_rng(3).standard_normal((4, 33)).astype(np.float32)
    d = be.from_host(a)
    assert np.array_equal(be.to_host(d), a)
    z = be.zeros((7,), np.int32)
    be.memset_async(LEGACY_STREAM, z, 1)
    be.synchronize()
    assert be.to_host(z).view(np.uint8).tolist() == [1] * 28
    be.memset_sync(z, 0)
    be.synchronize()
    assert not be.to_host(z).any()


def test_host_clock_moves_forward(be):
    t0 = be.host_clock_us()
    be.from_host(np.ones(1024, np.float32))
    be.synchronize()
    assert be.host_clock_us() >= t0


def test_free_memory_is_a_pair_on_the_gpu_and_none_elsewhere(be):
    mem = be.free_memory()
    if be.is_gpu:
        free, total = mem
        assert 0 < free <= total
    else:
        assert mem is None


def test_event_timing_on_capturing_backends(be):
    if not can_capture(be):
        pytest.skip(f"{be.name} has no runtime API")
    s = be.new_stream(non_blocking=True)
    e0, e1 = be.new_event(), be.new_event()
    buf = be.zeros((1 << 16,), np.float32)
    be.event_record(s, e0)
    be.memset_async(s, buf, 0)
    be.event_record(s, e1)
    be.event_synchronize(e1)
    assert be.event_query(e1) is True
    assert be.event_elapsed_ms(e0, e1) >= 0.0


def test_a_backend_missing_a_method_fails_when_built():
    class Partial(Executor):
        name = "partial"

        def empty(self, shape, dtype):
            return np.empty(shape, dtype)

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_factory_names_the_choices_for_an_unknown_or_disallowed_backend():
    with pytest.raises(ValueError, match="choose one of: auto, cupy, sim"):
        make_backend("numpy", allowed=("auto", "cupy", "sim"))
    with pytest.raises(ValueError, match="'tpu'"):
        make_backend("tpu")
    assert set(BACKENDS) == {"auto", "cupy", "numpy", "sim"}
    assert resolve("auto") == ("cupy" if gpu_usable()[0] else "sim")
