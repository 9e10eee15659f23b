"""Resolve every documented combination of ds4lab's extras with pip, as a fresh machine would
install them (``pip install --dry-run --ignore-installed``, dependencies included), and build the
wheel once to see setuptools configure every package.

A combination fails when pip cannot resolve it, when pip says ds4lab has no such extra, or when a
CUDA 13 combination would take CUPTI 13.1 or later, which the CUDA 13.0 driver of the lent H200
does not run. Run by ``.ci/run`` before the tests; needs the package index. Exit 0 when every
combination resolves, 1 otherwise.

    python scripts/check_extras.py            # every combination in COMBINATIONS
    python scripts/check_extras.py cupti13    # the combinations that name this extra
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _said(r: subprocess.CompletedProcess) -> str:
    """pip's output without its notes on index locations that do not exist on this machine."""
    return "\n".join(line for line in (r.stdout + r.stderr).splitlines() if not line.startswith("WARNING: Location"))

#: The combinations docs/install.md documents, one CUDA major each.
COMBINATIONS = (
    "test,nvrtc12",                        # CI, scripts/venv.sh without a GPU
    "test,nvrtc12,cupti12,cuda12",         # scripts/venv.sh on a CUDA 12 GPU
    "test,nvrtc13,cupti13,cuda13",         # scripts/venv.sh with DS4LAB_CUPY_EXTRA=cuda13
    "nvrtc12,cupti12,cuda12,notebooks",
    "nvrtc13,cupti13,cuda13,notebooks",
)

#: What a CUDA 13.0 driver runs: distributions whose version must stay below 13.1.
CUDA13_BOUND = ("cupti-python", "nvidia-cuda-cupti")


def resolve(combo: str) -> tuple[bool, str]:
    """Whether ``.[combo]`` resolves, and what it would install (or why not)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                            "--report", str(report), f".[{combo}]"], cwd=ROOT, capture_output=True, text=True)
        said = _said(r)
        if r.returncode != 0:
            return False, "pip cannot resolve it: " + " ".join(said.split())[-600:]
        if "does not provide the extra" in said:
            return False, " ".join(line for line in said.splitlines() if "does not provide the extra" in line)
        installs = json.loads(report.read_text())["install"]
        got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    if "13" in combo:
        late = [f"{n} {got[n]}" for n in CUDA13_BOUND if n in got and tuple(map(int, got[n].split(".")[:2])) >= (13, 1)]
        if late:
            return False, f"takes {', '.join(late)}: newer than a CUDA 13.0 driver runs"
    cuda = sorted(f"{n} {v}" for n, v in got.items() if n.startswith(("cuda-", "cupti", "cupy", "nvidia-")))
    return True, ", ".join(cuda) or "no CUDA package"


def setuptools_warnings() -> list[str]:
    """The warnings setuptools prints while building ds4lab's wheel about packages it was not told of."""
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp, "."], cwd=ROOT,
                           capture_output=True, text=True)
    said = _said(r)
    if r.returncode != 0:
        return ["the wheel does not build: " + " ".join(said.split())[-600:]]
    return [line.strip() for line in said.splitlines() if "absent from the `packages` configuration" in line]


def main(argv: list[str]) -> int:
    """Check the combinations (those naming an extra of ``argv``, or all); print one line each."""
    combos = [c for c in COMBINATIONS if not argv or any(a in c.split(",") for a in argv)]
    bad = 0
    for c in combos:
        ok, what = resolve(c)
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} .[{c}]: {what}", flush=True)
    warned = setuptools_warnings()
    for w in warned:
        print(f"FAIL setuptools: {w}")
    if not warned:
        print("ok   setuptools: every package configured")
    return 1 if bad or warned else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
