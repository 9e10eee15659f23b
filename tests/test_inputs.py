"""Inputs validated at any depth: calibration files against one schema, ``--out``, the result
folder's lock, ``meta.json``'s run record and strict JSON, a dead run told apart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ds4lab.backends import make_backend
from ds4lab.sim import calibration as C
from ds4lab.errors import BadInput, CalibrationError
from ds4lab.report.results import FolderLock, OutputError, check_out, job_folder, lock_path, read_meta, write_meta
from ds4lab.sim.costmodel import Calibration, default_calibration_path

REPO = Path(__file__).resolve().parents[1]


def shipped() -> dict:
    return json.loads(default_calibration_path().read_text())


def write_cal(tmp_path, d, name="cal.json", raw: str | None = None) -> Path:
    p = tmp_path / name
    p.write_text(raw if raw is not None else json.dumps(d))
    return p


# ----------------------------------------------------------------------------- calibration schema
def test_shipped_calibrations_are_valid():
    for p in C.shipped_files():
        C.read(p)  # raises on any problem


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e308"])
def test_non_finite_or_huge_kernel_fit_is_refused_with_file_and_key(tmp_path, token):
    d = shipped()
    kern = sorted(d["kernels"])[0]
    d["kernels"][kern]["fixed_us"] = 1.0
    raw = json.dumps(d).replace(f'"{kern}": {{"fixed_us": 1.0', f'"{kern}": {{"fixed_us": {token}')
    p = write_cal(tmp_path, None, raw=raw)
    with pytest.raises(CalibrationError) as ei:
        Calibration.load(p)
    e = ei.value
    assert isinstance(e, ValueError) and isinstance(e, BadInput)
    assert str(p) in str(e) and f"kernels.{kern}.fixed_us" in str(e)
    assert [k for k, _ in e.problems] == [f"kernels.{kern}.fixed_us"]


def test_string_value_names_file_and_key(tmp_path):
    d = shipped()
    d["host_launch_us"] = "fast"
    p = write_cal(tmp_path, d)
    with pytest.raises(CalibrationError, match=r"host_launch_us: 'fast' is not of type 'number'") as ei:
        Calibration.load(p)
    assert str(p) in str(ei.value)


def test_every_problem_is_reported_unknown_keys_included(tmp_path):
    d = shipped()
    d["host_lanch_us"] = 3.0  # a typo: unknown
    del d["memset_us"]
    d["measured"] = "yes"
    d["bandwidth_GBps"] = 0
    kern = sorted(d["kernels"])[0]
    d["kernels"][kern]["fixd_us"] = 1.0
    d["kernels"]["new_kernel"] = {"samples": 3}  # neither fixed_us nor bandwidth_GBps
    with pytest.raises(CalibrationError) as ei:
        Calibration.load(write_cal(tmp_path, d))
    keys = dict(ei.value.problems)
    assert keys["host_lanch_us"] == "unknown key"
    assert keys[f"kernels.{kern}.fixd_us"] == "unknown key"
    assert "memset_us" in keys[""] and "required" in keys[""]
    assert "boolean" in keys["measured"]
    assert "bandwidth_GBps" in keys and "kernels.new_kernel" in keys


def test_bad_json_and_missing_file_name_the_file(tmp_path, monkeypatch):
    p = write_cal(tmp_path, None, raw='{"name": "x",')
    with pytest.raises(CalibrationError, match=r"cal\.json.*not JSON"):
        Calibration.load(p)
    monkeypatch.setenv("DS4LAB_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(CalibrationError, match="missing.json: no such calibration file"):
        default_calibration_path()


def test_ladder_with_a_nan_calibration_exits_2_naming_the_key(tmp_path):
    d = shipped()
    kern = sorted(d["kernels"])[0]
    raw = json.dumps(d).replace(f'"{kern}": {{"fixed_us": {json.dumps(d["kernels"][kern]["fixed_us"])}',
                                f'"{kern}": {{"fixed_us": NaN')
    assert "NaN" in raw
    p = write_cal(tmp_path, None, raw=raw)
    env = dict(os.environ, DS4LAB_CALIBRATION=str(p))
    r = subprocess.run([sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny",
                        "--stages", "0", "--tokens", "2", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"kernels.{kern}.fixed_us" in r.stderr and str(p) in r.stderr


def test_calibration_info_tells_an_edited_copy_from_the_shipped_file(tmp_path):
    ref = C.calibration_info(default_calibration_path())
    assert ref["shipped"] is True and len(ref["sha256"]) == 64 and ref["path"] == str(default_calibration_path())
    d = shipped()
    d["host_launch_us"] += 0.001  # same name, edited
    info = C.calibration_info(write_cal(tmp_path, d))
    assert info["name"] == ref["name"] and info["shipped"] is False and info["sha256"] != ref["sha256"]
    assert info["path"] in C.title_label(info) and info["sha256"][:12] in C.title_label(info)
    assert C.title_label(ref) == ref["name"]


# ----------------------------------------------------------------------------- --out and the folder life cycle
@pytest.mark.parametrize("bad", ["", "  ", None])
def test_empty_out_is_refused(bad):
    with pytest.raises(OutputError, match="names no folder"):
        check_out(bad)


def test_job_folder_refuses_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ladder.csv").write_text("someone else's\n")
    with pytest.raises(OutputError, match="current directory"):
        with job_folder(Path(""), {}, ("ladder.csv",)):
            pass
    assert (tmp_path / "ladder.csv").read_text() == "someone else's\n"  # nothing lost


def test_meta_records_run_calibration_and_is_strict_json(tmp_path):
    out = tmp_path / "job"
    meta = {"job": "t", "calibration": {"name": "x", "path": str(default_calibration_path())},
            "backends": {"sim": {"calibration": {"name": "x", "path": str(default_calibration_path())}}}}
    with job_folder(out, meta, ()) as folder:
        running = json.loads((folder / "meta.json").read_text())
        assert running["status"] == "running"
        assert running["run"] == {"pid": os.getpid(), "host": socket.gethostname(), "lock": str(lock_path(out))}
        assert lock_path(out).exists()
        meta["efficiency"] = float("nan")
        meta["rows"] = [1.0, float("inf")]
    text = (out / "meta.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    done = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert done["status"] == "complete" and done["efficiency"] is None and done["rows"] == [1.0, None]
    sha = C.calibration_info(default_calibration_path())["sha256"]
    assert done["calibration"]["sha256"] == sha and done["calibration"]["shipped"] is True
    assert done["backends"]["sim"]["calibration"]["sha256"] == sha
    assert not lock_path(out).exists()


def test_write_meta_maps_numpy_nan_too(tmp_path):
    import numpy as np

    write_meta(tmp_path / "m.json", {"a": np.float32("nan"), "b": np.float64(2.5), "c": (np.int64(3),)})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": None, "b": 2.5, "c": [3]}


_HOLDER = """
import sys, time
from pathlib import Path
from ds4lab.report.results import job_folder
with job_folder(Path(sys.argv[1]), {"job": "holder"}, ("ladder.csv",)) as f:
    (f / "ladder.csv").write_text("the holder's rows\\n")
    print("holding", flush=True)
    time.sleep(120)
"""


def _start_holder(out: Path):
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "holding"
    return p


def test_second_run_into_the_same_folder_is_refused_with_the_pid(tmp_path):
    out = tmp_path / "shared"
    with job_folder(out, {"job": "holder"}, ("ladder.csv",)) as f:  # an earlier, finished run
        (f / "ladder.csv").write_text("the earlier rows\n")
    holder = _start_holder(out)
    try:
        with pytest.raises(OutputError, match=rf"in use by another ds4lab run \(PID {holder.pid} on "):
            with job_folder(out, {"job": "holder"}, ("ladder.csv",)):
                pytest.fail("the second run must not start")
        assert (out / "ladder.csv").read_text() == "the earlier rows\n"  # nothing removed
        staging = tmp_path / ".shared.ds4lab-staging"
        assert (staging / "ladder.csv").read_text() == "the holder's rows\n"  # the holder's work untouched
        assert read_meta(staging)["status"] == "running"  # alive: not died
        assert read_meta(out)["status"] == "complete"
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_run_reads_as_died_and_its_folder_is_usable_again(tmp_path):
    out = tmp_path / "killed"
    holder = _start_holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    staging = tmp_path / ".killed.ds4lab-staging"
    assert json.loads((staging / "meta.json").read_text())["status"] == "running"  # the file says running ...
    m = read_meta(staging)
    assert m["status"] == "died" and m["status_recorded"] == "running"  # ... the reader knows better
    with job_folder(out, {"job": "holder"}, ()):  # the kernel dropped the dead run's lock
        pass
    assert read_meta(out)["status"] == "complete"
    (died,) = tmp_path.glob("killed.died-*")  # the dead run's partial results, kept and named
    assert read_meta(died)["status"] == "died"


def test_read_meta_without_lock_file_uses_the_pid(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    write_meta(tmp_path / "meta.json", {"status": "running", "run": {"pid": pid, "host": socket.gethostname()}})
    assert read_meta(tmp_path)["status"] == "died"
    write_meta(tmp_path / "meta.json", {"status": "running", "run": {"pid": os.getpid(), "host": socket.gethostname()}})
    assert read_meta(tmp_path)["status"] == "running"
    write_meta(tmp_path / "meta.json", {"status": "running", "run": {"pid": pid, "host": "elsewhere"}})
    m = read_meta(tmp_path)
    assert m["status"] == "running" and "elsewhere" in m["status_note"]
    assert read_meta(tmp_path / "nothing") is None


def test_folder_lock_is_exclusive_within_a_process_too(tmp_path):
    a = FolderLock(tmp_path).acquire()
    try:
        with pytest.raises(OutputError, match=str(os.getpid())):
            FolderLock(tmp_path).acquire()
    finally:
        a.release()
    FolderLock(tmp_path).acquire().release()


def test_ladder_out_empty_string_exits_2_and_writes_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny",
                        "--stages", "0", "--tokens", "2", "--out", ""],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--out" in r.stderr and "current directory" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_backend_calibration_names_the_file_a_sim_backend_loaded(tmp_path):
    from ds4lab.sim.backend import SimBackend

    d = shipped()
    d["name"] = "edited copy"
    p = write_cal(tmp_path, d)
    info = C.backend_calibration(SimBackend(calibration=p, timing_only=True))
    assert info == C.calibration_info(p) and info["shipped"] is False and info["path"] == str(p.resolve())
    assert C.backend_calibration(SimBackend(timing_only=True))["shipped"] is True
    assert C.backend_calibration(make_backend("numpy")) is None  # a backend that models no time


# ----------------------------------------------------------------------------- what ships, exactly
def test_the_manifest_names_every_shipped_file_with_its_bytes():
    """ds4lab/data/SHA256SUMS (sha256sum format) holds the hash of every calibration that ships;
    after re-measuring h200.json, run `sha256sum *.json > SHA256SUMS` there."""
    import hashlib

    want = C.shipped_hashes()
    assert set(want) == {p.name for p in C.DATA_DIR.glob("*.json")}, "every shipped JSON file is in the manifest"
    for name, digest in want.items():
        assert hashlib.sha256((C.DATA_DIR / name).read_bytes()).hexdigest() == digest, name
    assert C.MEASURED_FILE.resolve() in C.shipped_files()


def test_shipped_is_true_only_for_the_bytes_that_ship(tmp_path, monkeypatch, rng):
    data = tmp_path / "data"
    data.mkdir()
    good = data / "h200.json"
    good.write_bytes(C.MEASURED_FILE.read_bytes())
    import hashlib

    (data / "SHA256SUMS").write_text(f"{hashlib.sha256(good.read_bytes()).hexdigest()}  h200.json\n")
    monkeypatch.setattr(C, "DATA_DIR", data)
    monkeypatch.setattr(C, "MANIFEST", data / "SHA256SUMS")
    assert C.calibration_info(good)["shipped"] is True
    other = data / "mine.json"  # any other file put in the data folder
    other.write_bytes(C.MEASURED_FILE.read_bytes())
    assert C.calibration_info(other)["shipped"] is False
    d = json.loads(good.read_text())
    d["host_launch_us"] = float(rng.uniform(1, 20))  # edited in place: same path, other bytes
    good.write_text(json.dumps(d))
    info = C.calibration_info(good)
    assert info["shipped"] is False and str(good) in C.title_label(info) and info["sha256"][:12] in C.title_label(info)


def test_a_binary_calibration_file_is_a_calibration_error_naming_it(tmp_path, rng):
    p = tmp_path / "cal.bin"
    p.write_bytes(b"\xff\xfe" + rng.bytes(256))  # 0xff never starts a UTF-8 sequence
    with pytest.raises(CalibrationError, match=r"cal\.bin: 1 problem\(s\): \(top level\): not a calibration: not "
                                               r"UTF-8 text \(byte 0xff at offset 0\)"):
        C.read(p)
    env = dict(os.environ, DS4LAB_CALIBRATION=str(p))
    r = subprocess.run([sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny",
                        "--stages", "0", "--tokens", "2", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert str(p) in r.stderr and "not UTF-8 text" in r.stderr and "Traceback" not in r.stderr
