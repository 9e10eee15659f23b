"""Shared fixtures. GPU tests are marked ``gpu`` and skipped cleanly where no GPU is usable."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest

from ds4lab.backends.cupy_backend import gpu_usable
from helpers import derive_seed


def pytest_collection_modifyitems(config, items):
    ok, why = gpu_usable()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: Set to reproduce a run's random inputs (its value is printed in the session header).
SEED_ENV = "DS4LAB_TEST_SEED"


def pytest_configure(config):
    """One base seed per session (fresh unless ``DS4LAB_TEST_SEED`` is set), from which every test
    derives its own (:func:`rng`)."""
    env = os.environ.get(SEED_ENV)
    config.ds4lab_seed = int(env) if env else secrets.randbits(32)


def pytest_report_header(config):
    return f"random inputs: {SEED_ENV}={config.ds4lab_seed} reproduces this run's"


@pytest.fixture
def rng(request):
    """Random inputs (never zeros), seeded per test from the session's base seed and the test's id:
    fresh every session, reproducible with ``DS4LAB_TEST_SEED=<base>`` (a failing test's report says
    both its seed and the base)."""
    base = request.config.ds4lab_seed
    seed = derive_seed(base, request.node.nodeid)
    request.node.user_properties.append(("rng seed", f"{seed} ({SEED_ENV}={base} reproduces it)"))
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that drew random inputs names its seed in its report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for name, value in item.user_properties:
            if name == "rng seed":
                rep.sections.append(("random inputs", f"rng seed {value}"))


@pytest.fixture(scope="session")
def cupy_backend():
    from ds4lab.backends.cupy_backend import CupyBackend

    return CupyBackend(seed=1234)


@pytest.fixture(scope="session")
def numpy_backend():
    from ds4lab.executor.numpy_backend import NumpyBackend

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

