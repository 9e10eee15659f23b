"""``--out`` at a mount point (a disk or a container volume of its own): refused before any work,
naming why and a folder inside it, instead of failing with ``EBUSY`` after the whole run and leaving
a staging folder beside it; a read-only mount point the same way. The mount points are real: a
tmpfs mounted in a private mount namespace (``unshare``), where the system allows one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ds4lab.report.folder_io import is_mount_point

REPO = Path(__file__).resolve().parents[1]

LADDER = [sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0",
          "--tokens", "2", "--repeats", "1", "--exact-tokens", "0", "--out"]


def _in_mount_namespace(tmp_path: Path, mount_opts: str, argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` with a fresh tmpfs mounted (``mount_opts``) at ``tmp_path/vol`` in a private mount
    namespace; skip where the system allows none."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    vol = tmp_path / "vol"
    vol.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs {mount_opts} none {vol}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")
    script = f"mount -t tmpfs {mount_opts} none {vol} && exec \"$@\""
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *argv], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)


@pytest.mark.parametrize("mount_opts", ["", "-o ro"], ids=["writable", "read-only"])
def test_a_mount_point_as_out_is_refused_before_any_work(tmp_path, mount_opts):
    vol = tmp_path / "vol"
    r = _in_mount_namespace(tmp_path, mount_opts, LADDER + [str(vol)])
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "is a mount point" in err[0] and str(vol) in err[0], r.stderr
    assert f"{vol}/ladder" in err[0], "the message names a folder inside it"
    assert "wrote" not in r.stdout and "stage 0" not in r.stdout, "refused before any work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vol"], "nothing left beside it"


def test_a_folder_inside_a_mount_point_works(tmp_path):
    vol = tmp_path / "vol"
    shell = (f"{' '.join(LADDER)} {vol}/ladder && test -f {vol}/ladder/ladder.csv && ls -a {vol}")
    r = _in_mount_namespace(tmp_path, "", ["sh", "-c", shell])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.split()[-3:] == [".", "..", "ladder"], "the results in place, no staging folder or lock left"


def test_mount_points_are_told_apart(tmp_path):
    assert not is_mount_point(tmp_path) and not is_mount_point(tmp_path / "missing")
    assert is_mount_point(Path("/")) and is_mount_point(Path("/proc"))
