"""A large ds4 log is streamed: ``ds4lab ingest`` holds one chunk of it, not the file, and says how far
it got. Measured as the peak resident memory (``ru_maxrss``) of a process that ingests a generated
log of about 4 MB and one of about 16 MB (ds4's stderr: profile lines among other output; 7 rows
per profile line). The peak does not grow with the file: the larger log peaks within a few MB of
the smaller one. From that, a 1 GB log peaks at the same level, a few hundred MB at most with
Python, pandas and NumPy loaded, under 1 GB (the scaled claim; the test does not write 1 GB). The
ingest before streaming (the whole file as text, a dict per row, one DataFrame) peaked at 1.2 GB
for a 24 MB log of this kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

STAGES = ("xq", "sort", "gateup", "midq", "down", "sum")
REPO = Path(__file__).resolve().parents[1]
# VmHWM, the peak of this process's own memory: getrusage's ru_maxrss carries the parent's peak
# across fork and exec on Linux, so a child of a large pytest process would report the parent's size.
_PEAK = """
import sys
from ds4lab.jobs.ingest import ingest_all
ingest_all([sys.argv[1]], sys.argv[2])
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")))  # KiB
"""


def make_log(path, target_bytes: int, rng) -> int:
    """A ds4 stderr log of about ``target_bytes``: profile lines with random stage times (ms, 3
    decimals, ``total`` their sum as ds4 prints it) among other output. Returns its profile lines."""
    n, size = 0, 0
    with open(path, "w") as f:
        while size < target_bytes:
            ms = rng.uniform(0.001, 0.2, (2000, len(STAGES))).round(3)
            toks = rng.integers(1, 64, 2000)
            block = []
            for k in range(2000):
                t = int(toks[k])
                vals = " ".join(f"{s}={v:.3f}" for s, v in zip(STAGES, ms[k]))
                block.append(f"ds4: CUDA MoE profile tokens={t} pairs={6 * t} {vals} total={ms[k].sum():.3f} ms")
                if k % 50 == 0:
                    block.append(f"ds4: layer {k % 43} done, pos {rng.integers(0, 1 << 20)}")
            text = "\n".join(block) + "\n"
            f.write(text)
            size += len(text)
            n += 2000
    return n


def peak_kib(log: Path, out: Path) -> int:
    r = subprocess.run([sys.executable, "-c", _PEAK, str(log), str(out)], capture_output=True, text=True,
                       cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.split()[-1])


@pytest.mark.slow
def test_a_large_log_is_streamed_in_bounded_memory(tmp_path, rng):
    peaks, lines = {}, {}
    for label, mb in (("small", 4), ("large", 16)):
        log = tmp_path / f"{label}.log"
        lines[label] = make_log(log, mb << 20, rng)
        peaks[label] = peak_kib(log, tmp_path / f"o-{label}")
        rows = sum(len(c) for c in pd.read_csv(tmp_path / f"o-{label}" / "ds4_moe.csv", usecols=["stage"],
                                               chunksize=1 << 20))
        assert rows == 7 * lines[label]  # every profile line, every stage: nothing lost to the chunking
    print({k: f"{v / 1024:.0f} MiB" for k, v in peaks.items()}, lines)
    assert peaks["large"] - peaks["small"] < 24 << 10, "the peak does not grow with the file (4x the lines)"
    assert peaks["large"] < 512 << 10


def test_progress_is_told_as_the_input_is_read(tmp_path, rng):
    from ds4lab.jobs.ingest import ingest_all

    log = tmp_path / "a.log"
    make_log(log, 3 << 20, rng)
    seen = []
    ingest_all([log], tmp_path / "o", progress=lambda done, total: seen.append((done, total)))
    size = log.stat().st_size
    assert len(seen) >= 3 and seen[-1] == (size, size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and {t for _, t in seen} == {size}
