"""Shared fixtures. GPU tests are marked ``gpu`` and skipped cleanly where no GPU is usable."""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab.backends.cupy_backend import gpu_usable


def pytest_collection_modifyitems(config, items):
    ok, why = gpu_usable()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """Fresh random inputs on every run (never zeros); the seed is printed on failure."""
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def cupy_backend():
    from ds4lab.backends.cupy_backend import CupyBackend

    return CupyBackend(seed=1234)


@pytest.fixture(scope="session")
def numpy_backend():
    from ds4lab.backends.numpy_backend import NumpyBackend

    return NumpyBackend(seed=1234)


@pytest.fixture
def sim():
    """A fresh simulated runtime that computes (a new arena, clock and capture state per test)."""
    from ds4lab.sim.backend import SimBackend

    return SimBackend()


@pytest.fixture
def graphs_restored():
    """The DS4_CUDA_GRAPHS flag and this thread's stream override put back after the test."""
    from ds4lab.capture import stream as S

    was, prev = S.graphs_flag(), S.capture_get_override()
    yield
    S.set_graphs_enabled(was)
    S.capture_set_stream(prev)


@pytest.fixture
def graphs_on(graphs_restored):
    """DS4_CUDA_GRAPHS on for the test (flag and override restored after)."""
    from ds4lab.capture import stream as S

    S.set_graphs_enabled(True)

