"""A full disk (or a file size limit) while a job writes: every file left under its final name is
whole (written under a temporary name and renamed when complete, or, for files that grow row by row,
cut back to their last whole row), ``meta.json`` lists those and names the files it could not write,
and every command exits 1 for it (``ingest`` exited 2, as for bad input)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO))
LADDER = [sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0",
          "--tokens", "2", "--repeats", "1", "--exact-tokens", "0"]
OK = ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.004 sort=0.000 gateup=0.021 midq=0.003 down=0.011 sum=0.002 "
      "total=0.041 ms")


def limited(size: int):
    """A ``preexec_fn``: no file may grow past ``size`` bytes (the kernel refuses: ``EFBIG``)."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def whole(path: Path) -> bool:
    """Whether ``path`` is a complete file of its kind."""
    data = path.read_bytes()
    if path.suffix == ".png":
        return data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82")
    if path.suffix == ".svg":
        return data.rstrip().endswith(b"</svg>")
    if path.suffix == ".pdf":
        return data.rstrip().endswith(b"%%EOF")
    if path.suffix == ".csv":
        import csv
        import io

        text = data.decode()
        width = {len(row) for row in csv.reader(io.StringIO(text))}
        return text.endswith("\n") and len(width) == 1
    if path.suffix == ".json":
        json.loads(data)
        return True
    return True


def check_whole(out: Path) -> dict:
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"].startswith("failed: WriteFailed"), meta["status"]
    left = sorted(p.name for p in out.iterdir() if p.name != "meta.json")
    assert left == sorted(meta["files"]), "meta.json lists every file left"
    for name in left:
        assert whole(out / name), f"{name} is cut ({(out / name).stat().st_size} bytes)"
    return meta


def test_a_file_size_limit_leaves_no_cut_figure(tmp_path):
    out = tmp_path / "ladder"
    r = subprocess.run(LADDER + ["--out", str(out)], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                       timeout=300, preexec_fn=limited(20_000))
    assert r.returncode == 1, r.stderr[-3000:]
    meta = check_whole(out)
    assert "ladder.csv" in meta["files"] and meta["files_not_written"], meta
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_full_disk_leaves_whole_files_only(tmp_path):
    """A real full disk: a 96 KiB tmpfs in a private mount namespace, where the system allows one."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    vol = tmp_path / "vol"
    vol.mkdir()
    script = f"mount -t tmpfs -o size=96k none {vol} && \"$@\"; rc=$?; cp -r {vol}/. {tmp_path}/copy; exit $rc"
    (tmp_path / "copy").mkdir()
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *LADDER, "--out", str(vol / "ladder")],
                       capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    if "mount" in r.stderr and "ds4lab" not in r.stderr:
        pytest.skip(f"no private mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in r.stderr
    meta = check_whole(tmp_path / "copy" / "ladder")
    assert meta["files_not_written"]


def test_ingest_exits_1_on_a_write_failure_and_keeps_whole_rows(tmp_path):
    log = tmp_path / "prof.log"
    log.write_text("\n".join([OK] * 500) + "\n")  # 60 kB in, about 400 kB of tables out
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-m", "ds4lab.cli", "ingest", str(log), "--out", str(out)],
                       capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300,
                       preexec_fn=limited(100_000))
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ds4lab: error: cannot write") and "File too large (EFBIG)" in last, r.stderr
    meta = check_whole(out)
    assert "ds4_moe.csv" in meta["files_not_written"] or len(pd.read_csv(out / "ds4_moe.csv")) > 0
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_git_revision_is_read_without_taking_the_index_lock(monkeypatch):
    """Under a file size limit a ``git status`` that refreshed the index left ``index.lock`` in the
    checkout; provenance only reads, with git's optional locks off."""
    import subprocess as sp

    from ds4lab.report import provenance

    seen = []
    real = sp.run

    def run(args, **kw):
        seen.append(kw.get("env") or {})
        return real(args, **kw)

    monkeypatch.setattr(sp, "run", run)
    provenance.git_revision()
    assert seen and all(e.get("GIT_OPTIONAL_LOCKS") == "0" for e in seen)
