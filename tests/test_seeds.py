"""The ``rng`` fixture: fresh inputs every session, reproducible from the base seed, and the seed
named in a failing test's report (tests/conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
HELPERS = (Path(__file__).parent / "helpers.py").read_text()  # the conftest derives each test's seed there
PROBE = """
def test_draws(rng):
    v = rng.standard_normal(3)
    print("DRAWN", repr(v.tolist()))
    assert False, "fails on purpose"
"""


def _run(pytester, monkeypatch, seed):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_probe=PROBE, helpers=HELPERS)
    monkeypatch.setenv("DS4LAB_TEST_SEED", str(seed))
    # in a subprocess: an in-process run shares sys.stdout and its capture with the outer session
    r = pytester.runpytest_subprocess("-q", "-s", "-p", "no:cacheprovider")
    out = r.stdout.str()
    drawn = re.search(r"DRAWN (\[.*?\])", out).group(1)
    return out, drawn


def test_the_base_seed_reproduces_and_the_failure_names_it(pytester, monkeypatch):
    out1, a = _run(pytester, monkeypatch, 12345)
    out2, b = _run(pytester, monkeypatch, 12345)
    _, c = _run(pytester, monkeypatch, 54321)
    assert a == b and a != c  # the same base seed draws the same inputs; another draws others
    assert "DS4LAB_TEST_SEED=12345" in out1  # the header, and the failing test's report
    assert re.search(r"rng seed \d+ \(DS4LAB_TEST_SEED=12345 reproduces it\)", out1)
