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
