"""Result folders (``ds4lab.report.results``): written aside and swapped in only on success, the
earlier results kept until then and never destroyed by a stopped run, files ds4lab did not write
refused or kept, SIGTERM and SIGHUP handled like Ctrl-C, a full disk named with no temporary and no
``running`` status left behind, a run killed outright recovered by the next one."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ds4lab.cli import main
from ds4lab.errors import CheckFailed, Terminated
from ds4lab.report import results
from ds4lab.report.results import OutputError, WriteFailed, job_folder, lock_path, read_meta
from ds4lab.report.folder_io import STAGING_SUFFIX

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def meta_of(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text())


def rows(rng) -> str:
    """A small ladder-like CSV with random values (a run's results, told apart by their numbers)."""
    return "stage,us_median\n" + "".join(f"{s},{v:.6f}\n" for s, v in zip("0123", rng.uniform(1, 1e4, 4)))


def finished(out: Path, text: str, job: str = "t") -> None:
    with job_folder(out, {"job": job}, ("ladder.csv", "ladder.png"), say=lambda m: None) as f:
        (f / "ladder.csv").write_text(text)


def leftovers(parent: Path) -> list[str]:
    """Staging folders, locks and temporaries left beside the result folders."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp"))


# ----------------------------------------------------------------------------- staged, swapped in on success
def test_a_rerun_keeps_the_earlier_results_until_it_succeeds(tmp_path, rng):
    out = tmp_path / "ladder"
    v1, v2 = rows(rng), rows(rng)
    finished(out, v1)
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
        assert f != out and f.parent == out.parent
        (f / "ladder.csv").write_text(v2)
        assert (out / "ladder.csv").read_text() == v1, "the earlier results stay until the run succeeds"
        assert meta_of(out)["status"] == "complete" and meta_of(f)["status"] == "running"
        assert lock_path(out).exists()
    assert (out / "ladder.csv").read_text() == v2
    m = meta_of(out)
    assert m["status"] == "complete" and m["files"] == ["ladder.csv"] and m["run"]["lock"] == str(lock_path(out))
    assert leftovers(tmp_path) == []  # no staging folder, no lock, no temporary
    assert any("replaced" in s and str(out) in s for s in said)


@pytest.mark.parametrize("exc, status, tag", [
    (KeyboardInterrupt(), "interrupted", "interrupted"),
    (Terminated(signal.SIGTERM), "interrupted (SIGTERM)", "interrupted"),
    (Terminated(signal.SIGHUP), "interrupted (SIGHUP)", "interrupted"),
    (RuntimeError("out of memory"), "failed: RuntimeError: out of memory", "failed"),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), "failed: BrokenPipeError: [Errno 32] Broken pipe", "failed"),
])
def test_a_stopped_rerun_keeps_the_earlier_results_and_names_its_partial_folder(tmp_path, rng, exc, status, tag):
    out = tmp_path / "ladder"
    v1 = rows(rng)
    finished(out, v1)
    said = []
    with pytest.raises(type(exc)):
        with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
            (f / "ladder.csv").write_text("stage,us_median\n0,")  # half a row
            (f / "meta.json.tmp").write_text("")  # an atomic write cut short
            raise exc
    assert (out / "ladder.csv").read_text() == v1 and meta_of(out)["status"] == "complete"
    partial = sorted(tmp_path.glob(f"ladder.{tag}-*"))
    assert len(partial) == 1, sorted(p.name for p in tmp_path.iterdir())
    p = partial[0]
    assert (p / "ladder.csv").read_text() == "stage,us_median\n0,"
    assert meta_of(p)["status"] == status and meta_of(p)["kept_in"] == str(p)
    assert not list(p.glob("*.tmp"))
    assert any(str(p) in s and "unchanged" in s and status.split(":")[0] in s for s in said), said
    assert leftovers(tmp_path) == []


def test_a_first_run_that_stops_becomes_the_folder(tmp_path):
    out = tmp_path / "fresh"
    meta = {"job": "t"}
    with pytest.raises(KeyboardInterrupt):
        with job_folder(out, meta, say=lambda m: None) as f:
            (f / "ladder.csv").write_text("stage\n0\n")
            raise KeyboardInterrupt
    assert meta_of(out)["status"] == "interrupted" and (out / "ladder.csv").exists()
    assert meta["kept_in"] == str(out) and leftovers(tmp_path) == []


def test_a_finished_run_whose_check_failed_replaces_the_earlier_results(tmp_path, rng):
    out = tmp_path / "ladder"
    finished(out, rows(rng))
    v2 = rows(rng)
    with pytest.raises(CheckFailed):
        with job_folder(out, {"job": "t"}, ("ladder.csv",), say=lambda m: None) as f:
            (f / "ladder.csv").write_text(v2)
            raise CheckFailed("stage 3: not bit-identical")
    assert (out / "ladder.csv").read_text() == v2
    assert meta_of(out)["status"] == "failed: CheckFailed: stage 3: not bit-identical"


def test_files_ds4lab_did_not_write_are_kept_across_a_rerun(tmp_path, rng):
    out = tmp_path / "ladder"
    finished(out, rows(rng))
    (out / "notes.md").write_text("my notes on this run\n")
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
        (f / "ladder.csv").write_text(rows(rng))
    assert (out / "notes.md").read_text() == "my notes on this run\n"
    assert "notes.md" not in meta_of(out)["files"]  # not ds4lab's: carried again next time
    assert any("notes.md" in s and "not written by ds4lab" in s for s in said)


def test_a_folder_whose_meta_json_lists_no_files_keeps_its_outputs_beside(tmp_path, rng):
    """A meta.json with a "job" key but nothing showing which files ds4lab wrote (an older ds4lab, or written by
    hand): files named like the job's outputs are kept beside, never replaced."""
    out = tmp_path / "old"
    out.mkdir()
    results.write_meta(out / "meta.json", {"ds4lab": "0.0", "job": "t", "status": "complete"})  # no "files"
    png = rng.bytes(64)
    (out / "ladder.png").write_bytes(png)
    (out / "mine.txt").write_text("keep")
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv", "ladder.png"), say=said.append) as f:
        (f / "ladder.csv").write_text(rows(rng))
    # ladder.png is not this run's to replace: carried into the new folder like the user's notes
    assert (out / "ladder.png").read_bytes() == png and (out / "mine.txt").read_text() == "keep"
    assert "ladder.png" not in meta_of(out)["files"]
    assert any("ladder.png" in s and "no SHA-256" in s for s in said)


def test_a_user_file_named_like_an_output_is_kept_beside(tmp_path, rng):
    out = tmp_path / "ladder"
    finished(out, rows(rng))
    (out / "extra.csv").write_text("the user's table\n")  # not in the earlier run's files
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
        (f / "extra.csv").write_text("this run's table\n")
    kept = list(tmp_path.glob("ladder.replaced-*"))
    assert len(kept) == 1 and (kept[0] / "extra.csv").read_text() == "the user's table\n"
    assert (out / "extra.csv").read_text() == "this run's table\n"
    assert any("extra.csv" in s and kept[0].name in s for s in said)


def sha256(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_an_edited_file_ds4lab_wrote_is_kept_beside_like_a_users_file(tmp_path, rng):
    out = tmp_path / "ladder"
    finished(out, rows(rng))
    assert meta_of(out)["file_sha256"] == {"ladder.csv": sha256(out / "ladder.csv")}
    edited = (out / "ladder.csv").read_text() + "# stage 3 ran with the fan at full speed\n"
    (out / "ladder.csv").write_text(edited)  # the user annotates the table ds4lab wrote
    said, v2 = [], rows(rng)
    with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
        (f / "ladder.csv").write_text(v2)
    (kept,) = tmp_path.glob("ladder.replaced-*")  # as for a user's file named like an output
    assert (kept / "ladder.csv").read_text() == edited
    assert (out / "ladder.csv").read_text() == v2
    assert any("ladder.csv (changed since ds4lab wrote it)" in s and kept.name in s for s in said), said


def test_an_edited_file_the_rerun_does_not_write_is_carried_into_the_new_folder(tmp_path, rng):
    out = tmp_path / "ladder"
    with job_folder(out, {"job": "t"}, ("ladder.csv", "ladder.png"), say=lambda m: None) as f:
        (f / "ladder.csv").write_text(rows(rng))
        (f / "ladder.png").write_bytes(rng.bytes(64))
    mine = rng.bytes(80)
    (out / "ladder.png").write_bytes(mine)  # the user replaces the figure
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv", "ladder.png"), say=said.append) as f:
        (f / "ladder.csv").write_text(rows(rng))
    assert (out / "ladder.png").read_bytes() == mine and not list(tmp_path.glob("ladder.replaced-*"))
    assert meta_of(out)["files"] == ["ladder.csv"]  # the user's now: not hashed, carried again next time
    assert any("kept ladder.png (changed since ds4lab wrote it)" in s for s in said), said


def test_unedited_files_ds4lab_wrote_are_replaced_as_before(tmp_path, rng):
    out = tmp_path / "ladder"
    with job_folder(out, {"job": "t"}, ("ladder.csv", "ladder.png"), say=lambda m: None) as f:
        (f / "ladder.csv").write_text(rows(rng))
        (f / "ladder.png").write_bytes(rng.bytes(64))
    m = meta_of(out)
    assert m["files"] == ["ladder.csv", "ladder.png"]
    assert m["file_sha256"] == {n: sha256(out / n) for n in m["files"]}
    v2 = rows(rng)
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv", "ladder.png"), say=said.append) as f:
        (f / "ladder.csv").write_text(v2)
    assert (out / "ladder.csv").read_text() == v2 and not (out / "ladder.png").exists()
    assert not list(tmp_path.glob("ladder.replaced-*")) and not any("kept" in s for s in said), said


def test_a_folder_whose_meta_json_has_no_hashes_keeps_its_files_beside(tmp_path, rng):
    """meta.json names the files but holds no SHA-256 for them: nothing shows ds4lab wrote what is there now (a
    hand-written meta.json with a "job" key), so the earlier files are kept beside, whole."""
    out = tmp_path / "old"
    out.mkdir()
    results.write_meta(out / "meta.json", {"ds4lab": "0.1", "job": "t", "status": "complete",
                                           "files": ["ladder.csv", "ladder.png"]})  # no "file_sha256"
    annotated = "stage,us_median\n0,1.0  # annotated, but nothing says so\n"
    (out / "ladder.csv").write_text(annotated)
    (out / "ladder.png").write_bytes(rng.bytes(64))
    v2 = rows(rng)
    with job_folder(out, {"job": "t"}, ("ladder.csv", "ladder.png"), say=lambda m: None) as f:
        (f / "ladder.csv").write_text(v2)
    assert (out / "ladder.csv").read_text() == v2 and (out / "ladder.png").exists()  # the png carried
    kept = list(tmp_path.glob("old.replaced-*"))  # the csv, named like this run's, kept with its folder
    assert len(kept) == 1 and (kept[0] / "ladder.csv").read_text() == annotated
    assert meta_of(out)["file_sha256"] == {"ladder.csv": sha256(out / "ladder.csv")}  # recorded from now on


# ----------------------------------------------------------------------------- what ds4lab never replaces
@pytest.mark.parametrize("files, needle", [
    ({"meta.json": '{"experiment": "mine"}', "ladder.csv": "stage\n0\n"}, "meta.json was not written by ds4lab"),
    ({"meta.json": "not json at all", "ladder.csv": "stage\n0\n"}, "meta.json was not written by ds4lab"),
    ({"ladder.csv": "stage\n0\n"}, "ladder.csv"),
    ({"thesis.tex": "x", "data.bin": "y"}, "data.bin, thesis.tex"),
])
def test_a_folder_ds4lab_did_not_write_is_refused_naming_it(tmp_path, files, needle):
    out = tmp_path / "mine"
    out.mkdir()
    for n, text in files.items():
        (out / n).write_text(text)
    with pytest.raises(OutputError, match="never replaces files it did not write") as ei:
        with job_folder(out, {"job": "ladder"}, ("ladder.csv",)):
            pytest.fail("must not start")
    assert needle in str(ei.value)
    assert {p.name: p.read_text() for p in out.iterdir()} == files
    assert leftovers(tmp_path) == []


def test_ladder_into_a_users_folder_exits_2_and_touches_nothing(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "meta.json").write_text('{"experiment": "mine"}\n')
    (out / "ladder.csv").write_text("stage,us_median\n0,1.0\n")
    r = subprocess.run([sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny",
                        "--stages", "0", "--tokens", "2", "--repeats", "1", "--exact-tokens", "0", "--out", str(out)],
                       capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "meta.json was not written by ds4lab" in r.stderr
    assert (out / "meta.json").read_text() == '{"experiment": "mine"}\n'
    assert (out / "ladder.csv").read_text() == "stage,us_median\n0,1.0\n"


def test_the_folder_holding_the_current_directory_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "res"
    finished(out, "stage\n0\n")
    (out / "sub").mkdir()
    monkeypatch.chdir(out / "sub")
    with pytest.raises(OutputError, match="holds the current directory"):
        with job_folder(out, {"job": "t"}):
            pass


@pytest.mark.parametrize("job", ["audit", "ladder"])
def test_a_job_inside_a_staged_folder_names_where_its_results_will_be(tmp_path, monkeypatch, job):
    """A notebook run by `ds4lab notebooks` writes inside that command's staging folder, with the
    environment the runner gives its kernel (staged_env): each job writes there, and its lines say
    where the results will be once that folder is swapped in, never the staging folder."""
    from rich.console import Console

    from ds4lab.jobs import execute
    from ds4lab.report.results import final_path, staged_env

    final = tmp_path / "notebooks"
    with job_folder(final, {"job": "notebooks"}) as staging:  # what `ds4lab notebooks` runs the kernels in
        monkeypatch.setenv(*staged_env(staging / "nb", final / "nb").popitem())
        con = Console(record=True, width=400)
        if job == "audit":
            from ds4lab.jobs.audit import AuditConfig

            trace = REPO / "tests" / "data" / "audit" / "kineto_stack.json"
            execute("audit", AuditConfig(files=(trace,), out=staging / "nb" / job), console=con)
            wrote = f"audit.pdf in {final / 'nb' / job}"
        else:
            from ds4lab.jobs.ladder import LadderConfig

            execute("ladder", LadderConfig(stages="0,3", preset="tiny", tokens=2, warmup=1, exact_tokens=0, rounds=1,
                                           out=staging / "nb" / job), backend="sim", console=con)
            wrote = f"wrote {final / 'nb' / job / 'ladder.csv'}, {final / 'nb' / job / 'meta.json'}, "
        assert (staging / "nb" / job / "meta.json").is_file() and not final.exists(), "written where it runs"
        text = con.export_text()
        assert wrote in text and f"results in {final / 'nb' / job}/" in text, text
        assert STAGING_SUFFIX not in text
        assert final_path(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    assert meta_of(final / "nb" / job)["status"] == "complete"


# ----------------------------------------------------------------------------- signals
_JOB = """
import sys, time
from pathlib import Path
from ds4lab.report.results import job_folder
with job_folder(Path(sys.argv[1]), {"job": "t"}, ("ladder.csv",)) as f:
    (f / "ladder.csv").write_text("stage\\n0\\n")
    print("started", flush=True)
    time.sleep(120)
"""


def wait_for(cond, timeout=120.0):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")])
def test_sigterm_and_sighup_stop_a_command_like_ctrl_c(tmp_path, sig, code, name):
    out = tmp_path / "ladder"
    p = subprocess.Popen([sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny",
                          "--stages", "0,3", "--tokens", "200000", "--repeats", "1", "--exact-tokens", "0",
                          "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV, cwd=tmp_path)
    staging = tmp_path / ".ladder.ds4lab-staging" / "meta.json"
    try:
        wait_for(staging.exists)
        time.sleep(1.0)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == code, err[-3000:]
    assert f"interrupted ({name})" in err and str(out) in err
    m = meta_of(out)
    assert m["status"] == f"interrupted ({name})"
    assert leftovers(tmp_path) == []


def test_a_rerun_piped_into_head_keeps_the_earlier_results(tmp_path):
    """``ds4lab ladder | head -1``: the console's pipe closes under the run. It stops as a SIGPIPE
    would (exit 141, status interrupted (SIGPIPE)), says so on stderr, and destroys nothing."""
    args = [sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0,3",
            "--repeats", "1", "--exact-tokens", "0", "--out", "lad"]
    assert subprocess.run([*args, "--tokens", "4"], capture_output=True, env=ENV, cwd=tmp_path,
                          timeout=300).returncode == 0
    before = (tmp_path / "lad" / "ladder.csv").read_text()
    # stage 0 takes seconds, so its line is written after the close (see the test below)
    p = subprocess.Popen([*args, "--tokens", "3000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV, cwd=tmp_path)
    try:
        p.stdout.readline()  # `head -1`
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 141, err[-2000:]
    (partial,) = tmp_path.glob("lad.interrupted-*")
    assert "interrupted (SIGPIPE)" in err and partial.name in err
    assert meta_of(partial)["status"] == "interrupted (SIGPIPE)"
    assert (tmp_path / "lad" / "ladder.csv").read_text() == before and meta_of(tmp_path / "lad")["status"] == "complete"


@pytest.mark.slow
def test_stderr_in_the_same_closed_pipe_still_exits_141(tmp_path):
    """``ds4lab ladder 2>&1 | head -1``: the error message has nowhere to go; the status stays 141.
    The run is seconds long and writes a line after each stage, so a write always comes after the
    close (with a stage of minutes, the lines printed before it could all be in the pipe before the
    close, and the next write came only after the wait's timeout)."""
    args = [sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny", "--stages", "0,3",
            "--repeats", "1", "--exact-tokens", "0", "--tokens", "3000", "--out", "lad"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, cwd=tmp_path)
    try:
        p.stdout.readline()
        p.stdout.close()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 141


def test_a_sigterm_outside_a_job_exits_143_with_a_message(tmp_path, monkeypatch):
    from ds4lab.jobs import compare as C

    def stop(*a, **k):
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(C, "compare", stop)
    r = CliRunner().invoke(main, ["compare", str(tmp_path), "--out", str(tmp_path / "c")])
    assert r.exit_code == 143 and "interrupted (SIGTERM)" in r.output


def test_a_run_killed_outright_reads_as_died_and_the_next_run_keeps_its_results(tmp_path, rng):
    out = tmp_path / "ladder"
    v1 = rows(rng)
    finished(out, v1)
    p = subprocess.Popen([sys.executable, "-c", _JOB, str(out)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert p.stdout.readline().strip() == "started"
    staging = tmp_path / ".ladder.ds4lab-staging"
    assert read_meta(staging)["status"] == "running"  # alive
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert meta_of(staging)["status"] == "running"  # the file says running ...
    m = read_meta(staging)
    assert m["status"] == "died" and m["status_recorded"] == "running"  # ... the reader knows better
    assert (out / "ladder.csv").read_text() == v1  # the earlier results were never touched
    said = []
    v3 = rows(rng)
    with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
        (f / "ladder.csv").write_text(v3)
    died = list(tmp_path.glob("ladder.died-*"))
    assert len(died) == 1 and meta_of(died[0])["status"] == "died"
    assert (died[0] / "ladder.csv").read_text() == "stage\n0\n"
    assert any("killed" in s and died[0].name in s for s in said), said
    assert (out / "ladder.csv").read_text() == v3


def test_a_lock_held_by_another_process_means_died_when_the_pid_differs(tmp_path):
    out = tmp_path / "x"
    lock = results.Lock(lock_path(out), out)
    tmp_path.joinpath("x").mkdir()
    lock.acquire()
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout
        results.write_meta(out / "meta.json", {"status": "running", "run": {
            "pid": int(dead), "host": os.uname().nodename, "lock": str(lock_path(out))}})
        assert read_meta(out)["status"] == "died"  # the lock is this process's, not the recorded run's
        results.write_meta(out / "meta.json", {"status": "running", "run": {
            "pid": os.getpid(), "host": os.uname().nodename, "lock": str(lock_path(out))}})
        assert read_meta(out)["status"] == "running"
    finally:
        lock.release()


# ----------------------------------------------------------------------------- a full disk, any OSError
def test_a_full_disk_while_the_job_writes_is_named_and_leaves_no_tmp_and_no_running(tmp_path, rng):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    out = tmp_path / "ladder"
    v1 = rows(rng)
    finished(out, v1)
    with pytest.raises(WriteFailed) as ei:
        with job_folder(out, {"job": "t"}, ("ladder.csv",), say=lambda m: None) as f:
            os.symlink("/dev/full", f / "ladder.csv")  # every write to it fails with ENOSPC
            (f / "trace.json.tmp").write_text("{")
            import pandas as pd

            pd.DataFrame({"us": rng.uniform(size=1000)}).to_csv(f / "ladder.csv")
    assert ei.value.errno == errno.ENOSPC
    assert "No space left on device (ENOSPC)" in str(ei.value) and ".ladder.ds4lab-staging" in str(ei.value)
    (failed,) = tmp_path.glob("ladder.failed-*")
    m = meta_of(failed)
    assert m["status"].startswith("failed: WriteFailed: cannot write") and "ENOSPC" in m["status"]
    assert not list(tmp_path.rglob("*.tmp"))
    assert (out / "ladder.csv").read_text() == v1


def test_meta_json_that_cannot_be_written_still_does_not_say_running(tmp_path, monkeypatch):
    out = tmp_path / "job"
    real = results.write_text_atomic
    calls = []

    def full_after_first(path, text):
        calls.append(path)
        if len(calls) > 1:
            raise WriteFailed(f"cannot write {path}: No space left on device (ENOSPC)", errno.ENOSPC)
        real(path, text)

    monkeypatch.setattr(results, "write_text_atomic", full_after_first)
    with pytest.raises(WriteFailed, match=r"meta\.json: No space left on device"):
        with job_folder(out, {"job": "t"}, say=lambda m: None) as f:
            (f / "ladder.csv").write_text("stage\n0\n")
    m = meta_of(out)  # cut down to its status, in place
    assert m["status"].startswith("failed: WriteFailed") and m["job"] == "t"
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_real_write_limit_fails_the_ladder_cleanly(tmp_path):
    """The kernel refuses the write (RLIMIT_FSIZE: EFBIG, as a full disk refuses with ENOSPC)."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (12_000, 12_000))

    out = tmp_path / "ladder"
    r = subprocess.run([sys.executable, "-m", "ds4lab.cli", "ladder", "--backend", "sim", "--preset", "tiny",
                        "--stages", "0", "--tokens", "2", "--repeats", "1", "--exact-tokens", "0", "--out", str(out)],
                       capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300, preexec_fn=limit)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "File too large (EFBIG)" in r.stderr and str(tmp_path) in r.stderr, r.stderr[-3000:]
    m = meta_of(out)
    assert m["status"].startswith("failed: WriteFailed: cannot write") and "EFBIG" in m["status"]
    assert not list(tmp_path.rglob("*.tmp")) and leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- the swap without renameat2
def test_two_renames_where_renameat2_is_missing_and_a_crash_between_them(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(results, "exchange_paths", lambda a, b: False)
    out = tmp_path / "ladder"
    v1, v2 = rows(rng), rows(rng)
    finished(out, v1)
    finished(out, v2)
    assert (out / "ladder.csv").read_text() == v2 and leftovers(tmp_path) == []
    # a crash after the first rename: the earlier results at .old, the new ones complete in staging
    os.rename(out, tmp_path / ".ladder.ds4lab-old")
    new = tmp_path / ".ladder.ds4lab-staging"
    new.mkdir()
    (new / "ladder.csv").write_text(v1)
    results.write_meta(new / "meta.json", {"ds4lab": "x", "job": "t", "status": "complete", "files": ["ladder.csv"]})
    said = []
    with job_folder(out, {"job": "t"}, ("ladder.csv",), say=said.append) as f:
        assert (out / "ladder.csv").read_text() == v2, "the earlier results are put back first"
        (f / "ladder.csv").write_text("stage\n3\n")
    (rec,) = tmp_path.glob("ladder.recovered-*")
    assert (rec / "ladder.csv").read_text() == v1 and meta_of(rec)["status"] == "complete"
    assert (out / "ladder.csv").read_text() == "stage\n3\n" and leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- one file (calibrate)
def test_output_file_replaces_only_on_success_and_refuses_what_it_may_not_replace(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text('{"old": 1}')
    with pytest.raises(KeyboardInterrupt):
        with results.output_file(p, "calibration") as tmp:
            tmp.write_text('{"half')
            raise KeyboardInterrupt
    assert p.read_text() == '{"old": 1}' and sorted(x.name for x in tmp_path.iterdir()) == ["cal.json"]
    with results.output_file(p, "calibration") as tmp:
        tmp.write_text('{"new": 2}')
    assert p.read_text() == '{"new": 2}'
    with pytest.raises(OutputError, match="not mine; ds4lab never replaces"):
        with results.output_file(p, "calibration", accept=lambda q: "not mine"):
            pytest.fail("must not start")
    held = results.Lock(lock_path(p), p).acquire()
    try:
        with pytest.raises(OutputError, match=f"PID {os.getpid()}"):
            with results.output_file(p, "calibration"):
                pytest.fail("must not start")
    finally:
        held.release()
