"""Packaging: every package folder configured (setuptools warned that ``ds4lab.data.audit`` was not);
one extra per CUDA major for each CUDA library, so that each documented combination installs
together (``nvrtc`` pinned cuda-bindings 12 while ``cupti`` took cupti-python 13, which needs
cuda-bindings 13); CUDA 13 bounded to what a 13.0 driver runs. Resolving the combinations with pip
needs the package index: ``scripts/check_extras.py``, run by ``.ci/run``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PROJECT["project"]["optional-dependencies"]
sys.path.insert(0, str(ROOT / "scripts"))
import check_extras  # noqa: E402


def test_every_package_folder_is_configured():
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    dirs = {".".join(p.relative_to(ROOT).parts) for p in (ROOT / "ds4lab").rglob("*")
            if p.is_dir() and p.name != "__pycache__" and any(f.is_file() for f in p.iterdir())}
    assert dirs | {"ds4lab"} <= listed, f"folders setuptools would warn about: {sorted(dirs - listed)}"


def _pins(extra: str) -> dict[str, Requirement]:
    return {Requirement(r).name: Requirement(r) for r in EXTRAS[extra]}


@pytest.mark.parametrize("major", [12, 13])
def test_one_extra_per_cuda_major_and_they_agree(major):
    for lib in ("nvrtc", "cupti", "cuda"):
        assert f"{lib}{major}" in EXTRAS
    for name in ("nvrtc", "cupti"):
        assert name not in EXTRAS, f"the extra {name!r} names no CUDA major: it cannot install beside the other"
    for extra in (f"nvrtc{major}", f"cupti{major}"):
        for req in _pins(extra).values():
            if req.name in ("cuda-bindings", "cupti-python"):
                assert req.specifier.contains(f"{major}.0.0") or req.specifier.contains(f"{major}.6.0"), req
                assert not req.specifier.contains(f"{major + 1}.0.0"), f"{extra}: {req} lets the next major in"


def test_cuda_13_stays_within_what_a_13_0_driver_runs():
    cupti = _pins("cupti13")
    for name in check_extras.CUDA13_BOUND:
        assert not cupti[name].specifier.contains("13.1.0") and cupti[name].specifier.contains("13.0.1"), cupti[name]


def test_the_documented_combinations_name_extras_that_exist():
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "install.md").read_text()
    for combo in check_extras.COMBINATIONS:
        assert set(combo.split(",")) <= set(EXTRAS), combo
        majors = set(re.findall(r"(?:nvrtc|cupti|cuda)(1[23])", combo))
        assert len(majors) == 1, f"{combo}: one CUDA major per combination"
    documented = set(re.findall(r'\.\[([a-z0-9,]+)\]', readme))
    assert documented <= set(check_extras.COMBINATIONS), documented - set(check_extras.COMBINATIONS)
    venv = (ROOT / "scripts" / "venv.sh").read_text()
    assert 'extras="test,nvrtc$major"' in venv and "cupti$major,cuda$major" in venv
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "python scripts/check_extras.py" in (ROOT / ".ci" / "run").read_text()


def test_ci_runs_every_test_the_default_command_leaves_the_slow_ones():
    """``scripts/test.sh`` runs all but the tests marked ``slow`` (the README's command stays short);
    ``.ci/run`` runs it and then the slow ones in a step of their own, so CI runs every test."""
    import subprocess

    ci = (ROOT / ".ci" / "run").read_text()
    assert 'tests "tests"\n' in ci and 'tests "slow tests" -m slow' in ci
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'marker=(-m "not slow")' in script
    # a -m given replaces the default: run the script's own argument handling, pytest replaced by echo
    body = script.replace('source "$(dirname "$0")/venv.sh"', "").replace("exec python -m pytest", "echo")
    # the machine decided: pytest-xdist importable, no GPU
    body = body.replace('python -c "import xdist"', "true").replace("command -v nvidia-smi", "false")

    def args(*argv, **env):
        import os

        return subprocess.run(["bash", "-c", body, "test.sh", *argv], capture_output=True, text=True,
                              env={**os.environ, **env}).stdout.split()

    assert args("-m", "slow", "-x") == ["-q", "-n", "2", "--dist", "loadfile", "-m", "slow", "-x"]
    assert args("-x") == ["-q", "-m", "not", "slow", "-n", "2", "--dist", "loadfile", "-x"]
    # workers: a -n given replaces them, DS4LAB_TEST_WORKERS sets them, 0 runs one process
    assert args("-n", "4") == ["-q", "-m", "not", "slow", "-n", "4"]
    assert args("-x", DS4LAB_TEST_WORKERS="3") == ["-q", "-m", "not", "slow", "-n", "3", "--dist", "loadfile", "-x"]
    assert args("-x", DS4LAB_TEST_WORKERS="0") == ["-q", "-m", "not", "slow", "-x"]
    # with a GPU, one process: GPU timings never share the device
    gpu = body.replace("{ false", "{ true").replace("nvidia-smi -L", "true")
    out = subprocess.run(["bash", "-c", gpu, "test.sh", "-x"], capture_output=True, text=True).stdout.split()
    assert out == ["-q", "-m", "not", "slow", "-x"]
