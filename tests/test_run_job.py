"""``ds4lab run`` on the CPU (numpy and sim backends): interrupted and failed runs, ``--out`` checks,
the CPU-cost guard, the sim's modeled timing, position limits, and option notes."""

from __future__ import annotations

import csv
import json
import os
import time

import pytest
from click.testing import CliRunner

from ds4lab.report import results as results_mod
from ds4lab.jobs import execute
from ds4lab.jobs import run as run_mod
from ds4lab.executor.numpy_backend import NumpyBackend
from ds4lab.cli import main
from ds4lab.token.model import DecodeModel, TokenOptions
from ds4lab.sim.backend import SimBackend

#: Launches of one tiny token with the vocabulary projection (the CLI's default).
TINY_LAUNCHES = 78


def invoke(*args):
    """``ds4lab run ARGS``, on ``tiny`` unless ARGS name a preset (the default, ``small``, computes
    for minutes on the numpy backend)."""
    args = tuple(map(str, args))
    return CliRunner().invoke(main, ["run", *(args if "--preset" in args else ("--preset", "tiny", *args))])


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def meta_of(d):
    return json.loads((d / "meta.json").read_text())


def rows_of(d):
    with open(d / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def census_total(d) -> float:
    with open(d / "census.csv", newline="") as f:
        return sum(float(r["launches"]) for r in csv.DictReader(f))


def census_labels(d) -> set:
    """``(backend, preset, modeled)`` over census.csv's rows."""
    with open(d / "census.csv", newline="") as f:
        return {(r["backend"], r["preset"], r["modeled"]) for r in csv.DictReader(f)}


@pytest.fixture
def stop_after(monkeypatch):
    """``stop_after(n, exc)``: DecodeModel.token raises ``exc`` on its call number ``n + 1``."""

    def arm(n: int, exc: BaseException):
        orig = DecodeModel.token
        calls = {"n": 0}

        def token(self, pos, token_id, write_scalars=True):
            if calls["n"] == n:
                raise exc
            calls["n"] += 1
            return orig(self, pos, token_id, write_scalars)

        monkeypatch.setattr(DecodeModel, "token", token)

    return arm


def _modeled(be_name="sim") -> str:
    return f"modeled ({be_name}, calibration {SimBackend().calibration['name']})"


# ---------------------------------------------------------------------- 1. interrupted / failed runs
@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_interrupt_records_status_tokens_census_and_exits_130(tmp_path, stop_after, backend):
    out = tmp_path / "r"
    stop_after(2 + 3, KeyboardInterrupt())  # 2 warm-up tokens, 3 timed tokens, then Ctrl-C
    r = invoke("--backend", backend, "--tokens", 10, "--warmup", 2, "--out", out)
    assert r.exit_code == 130, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("ds4lab: ")]
    assert len(lines) == 1 and "interrupted after 3 of 10 timed tokens" in lines[0] and str(out) in lines[0]
    m = meta_of(out)
    assert m["status"] == "interrupted"
    assert m["tokens_completed"] == 3 and m["warmup_completed"] == 2 and m["census_tokens"] == 3
    assert census_total(out) == pytest.approx(TINY_LAUNCHES)  # the 3 completed tokens, per token
    assert census_labels(out) == {(backend, "tiny", str(backend == "sim"))}
    assert "census.csv" in m["files"] and "census.csv" in m["file_sha256"]  # written at the stop, listed
    rows = rows_of(out)  # what was written stays (numpy writes no timing row: header only)
    if backend == "sim":
        assert [int(x["token"]) for x in rows if x["metric"] == "token_us"] == [0, 1, 2]
        assert m["summary_partial"]["token_us"]["n"] == 3


def test_interrupt_during_warmup_says_so(tmp_path, stop_after):
    out = tmp_path / "r"
    stop_after(1, KeyboardInterrupt())
    r = invoke("--backend", "numpy", "--tokens", 4, "--warmup", 3, "--out", out)
    assert r.exit_code == 130
    assert "0 of 4 timed tokens (1 of 3 warm-up tokens)" in flat(r.output)
    m = meta_of(out)
    assert (m["status"], m["tokens_completed"], m["warmup_completed"]) == ("interrupted", 0, 1)
    assert "warm-up" in m["census_covers"]
    assert census_total(out) == pytest.approx(TINY_LAUNCHES)


def test_failure_records_reason_and_exits_1(tmp_path, stop_after):
    out = tmp_path / "r"
    stop_after(2, RuntimeError("boom\nmore detail"))
    r = invoke("--backend", "sim", "--tokens", 5, "--warmup", 0, "--out", out)
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("ds4lab: ")]
    assert len(lines) == 1 and lines[0].startswith("ds4lab: error: run failed after 2 of 5 timed tokens")
    m = meta_of(out)
    assert m["status"] == "failed: RuntimeError: boom"
    assert m["tokens_completed"] == 2 and "boom" in m["traceback"]
    assert census_total(out) == pytest.approx(TINY_LAUNCHES)
    assert len([x for x in rows_of(out) if x["metric"] == "token_us"]) == 2


def test_failure_in_setup_still_records(tmp_path, monkeypatch):
    def broken(self):
        raise MemoryError("no room")

    monkeypatch.setattr(DecodeModel, "_alloc_buffers", broken)
    out = tmp_path / "r"
    r = invoke("--backend", "numpy", "--out", out)
    assert r.exit_code == 1
    m = meta_of(out)
    assert m["status"] == "failed: MemoryError: no room" and m["tokens_completed"] == 0
    assert (out / "census.csv").read_text().startswith("cluster,kind,site,launches")


def test_run_function_raises_run_interrupted(tmp_path, stop_after):
    stop_after(1, KeyboardInterrupt())
    rc = run_mod.RunConfig(backend="numpy", preset="tiny", tokens=3, warmup=0, out=tmp_path / "r")
    with pytest.raises(run_mod.RunInterrupted) as ei:
        execute("run", rc, backend=rc.backend)
    assert isinstance(ei.value, KeyboardInterrupt)
    assert ei.value.meta["status"] == "interrupted" and ei.value.meta["tokens_completed"] == 1


# ---------------------------------------------------------------------- 2. --out
def _assert_out_error(r, path):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    assert f"ds4lab: error: cannot write results to {path}: " in r.output


def test_out_existing_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("keep me")
    r = invoke("--backend", "numpy", "--out", f)
    _assert_out_error(r, f)
    assert "not a folder" in r.output and f.read_text() == "keep me"


def test_out_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = invoke("--backend", "numpy", "--out", f / "sub" / "deeper")
    _assert_out_error(r, f / "sub" / "deeper")
    assert f"{f} is a file" in r.output


def test_out_census_csv_is_a_folder(tmp_path):
    (tmp_path / "r" / "census.csv").mkdir(parents=True)
    r = invoke("--backend", "numpy", "--out", tmp_path / "r")
    _assert_out_error(r, tmp_path / "r")
    assert "census.csv is a folder" in r.output
    assert not (tmp_path / "r" / "meta.json").exists()  # nothing run, nothing written


def test_out_empty_string_rejected(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("--backend", "numpy", "--out", "")
    assert r.exit_code == 2
    assert "ds4lab: error: --out '' names no result folder" in r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes read-only folders")
def test_out_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = invoke("--backend", "numpy", "--out", ro / "r")
        _assert_out_error(r, ro / "r")
        r = invoke("--backend", "numpy", "--out", ro)
        _assert_out_error(r, ro)
    finally:
        ro.chmod(0o755)


def test_out_probe_failure_is_reported_and_cleaned_up(tmp_path, monkeypatch):
    """A location that refuses the probe file (read-only file system; works as root too)."""

    def refuse(folder):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(results_mod, "probe_write", refuse)
    out = tmp_path / "new" / "deep"
    r = invoke("--backend", "numpy", "--out", out)
    _assert_out_error(r, out)
    assert "Read-only file system" in r.output
    assert not (tmp_path / "new").exists()  # the folders it made are gone again


# ---------------------------------------------------------------------- 3. the CPU-cost guard
def test_numpy_ds4_flash_refused_without_force(tmp_path):
    out = tmp_path / "r"
    t0 = time.perf_counter()
    r = invoke("--backend", "numpy", "--preset", "ds4-flash", "--out", out)
    assert time.perf_counter() - t0 < 60
    assert r.exit_code == 2, r.output
    msg = flat(r.output)
    for s in ("8.6 GB", "1078 launches per token", "--force", "--backend sim", "--preset small"):
        assert s in msg
    assert not out.exists()


def test_sim_compute_ds4_flash_refused_without_force(tmp_path):
    r = invoke("--backend", "sim", "--preset", "ds4-flash", "--compute", "--out", tmp_path / "r")
    assert r.exit_code == 2 and "--timing-only" in flat(r.output) and "--force" in flat(r.output)


def test_force_lets_numpy_ds4_flash_through(tmp_path, monkeypatch):
    orig = DecodeModel._alloc_weights

    def stop_on_numpy(self):  # stop before allocating 10 GB: the guard has been passed
        if isinstance(self.be, NumpyBackend):
            raise KeyboardInterrupt
        return orig(self)

    monkeypatch.setattr(DecodeModel, "_alloc_weights", stop_on_numpy)
    out = tmp_path / "r"
    r = invoke("--backend", "numpy", "--preset", "ds4-flash", "--force", "--out", out)
    assert r.exit_code == 130, r.output
    m = meta_of(out)
    assert m["forced_cpu_run"]["launches_per_token"] == 1078 and m["status"] == "interrupted"


def test_small_presets_need_no_force():
    be = NumpyBackend()
    from ds4lab.token.config import get_preset

    rc = run_mod.RunConfig(backend="numpy", options=TokenOptions(vocab=True))
    for p in ("tiny", "small"):
        assert run_mod.check_cpu_cost(rc, be, get_preset(p)) is None


# ---------------------------------------------------------------------- 4. the sim backend
def test_sim_run_is_modeled_and_labelled(tmp_path):
    out = tmp_path / "r"
    r = invoke("--backend", "sim", "--tokens", 4, "--warmup", 1, "--out", out)
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    be = SimBackend()
    name = be.calibration["name"]
    assert f"every figure below is MODELED (calibration {name})" in text
    assert "numpy backend: the CPU reference executor" not in text and "cupy-memory-pool" not in r.output
    rows = rows_of(out)
    assert rows and {x["source"] for x in rows} == {_modeled()}
    assert len([x for x in rows if x["metric"] == "token_us"]) == 4
    host = [float(x["value"]) for x in rows if x["metric"] == "host_enqueue_us"]
    assert len(host) == 4 and len(set(host)) == 1  # the sim's modeled host clock, not a wall clock
    m = meta_of(out)
    assert m["status"] == "complete" and m["timing_only"] is False
    assert m["reference_check"].startswith("skipped: the sim computes with the reference ops")
    tb = sum(m["bytes_per_token"].values())
    assert m["summary"]["bytes_floor_us"] == pytest.approx(tb / (be.cal.copy_GBps * 1e9) * 1e6)
    bw = [float(x["value"]) for x in rows if x["metric"] == "copy_bandwidth_median"]
    assert bw == [pytest.approx(be.cal.copy_GBps)]


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_census_rows_say_backend_preset_and_modeled(tmp_path, backend):
    """census.csv keeps its provenance when copied: backend, preset and modeled on every row, after
    its own columns (as ladder.csv)."""
    out = tmp_path / "r"
    r = invoke("--backend", backend, "--tokens", 1, "--warmup", 0, "--out", out)
    assert r.exit_code == 0, r.output
    assert (out / "census.csv").read_text().startswith("cluster,kind,site,launches,backend,preset,modeled\n")
    assert census_labels(out) == {(backend, "tiny", str(backend == "sim"))}
    assert census_total(out) == pytest.approx(TINY_LAUNCHES)


def test_a_run_names_its_result_folder_once(tmp_path):
    out = tmp_path / "r"
    for said in (f"results in {out}/", f"results in {out}/ (the earlier results there replaced)"):
        r = invoke("--backend", "sim", "--preset", "tiny", "--tokens", 2, "--warmup", 0, "--out", out)
        assert r.exit_code == 0, r.output
        assert flat(r.output).count("results in") == 1 and said in flat(r.output), r.output


def test_sim_ds4_flash_defaults_to_timing_only_and_is_fast(tmp_path):
    out = tmp_path / "r"
    t0 = time.perf_counter()
    r = invoke("--backend", "sim", "--preset", "ds4-flash", "--tokens", 4, "--warmup", 1, "--out", out)
    assert time.perf_counter() - t0 < 60
    assert r.exit_code == 0, r.output
    m = meta_of(out)
    assert m["timing_only"] is True and m["census_per_token"]["kernel"]["launches"] == 1078
    assert m["summary"]["token_us"]["median"] > 0


@pytest.mark.parametrize("flag, want", [("--timing-only", True), ("--compute", False)])
def test_sim_timing_only_option(tmp_path, flag, want):
    r = invoke("--backend", "sim", "--tokens", 1, "--warmup", 0, flag, "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert meta_of(tmp_path / "r")["timing_only"] is want


def test_timing_only_refused_off_the_sim(tmp_path):
    r = invoke("--backend", "numpy", "--timing-only", "--out", tmp_path / "r")
    assert r.exit_code == 2 and "sim backend only" in r.output
    assert not (tmp_path / "r").exists()


def test_numpy_run_makes_no_timing_claim_and_says_so_once(tmp_path):
    out = tmp_path / "r"
    r = invoke("--backend", "numpy", "--tokens", 2, "--warmup", 1, "--out", out)
    assert r.exit_code == 0, r.output
    assert flat(r.output).count("no timing claims") == 1
    assert {x["metric"] for x in rows_of(out)} == {"bytes_per_token"}
    assert meta_of(out)["summary"] == {}


# ---------------------------------------------------------------------- 5. positions, NVTX
def test_start_pos_past_int32_refused_before_writing(tmp_path):
    out = tmp_path / "r"
    r = invoke("--backend", "numpy", "--start-pos", 2**31 - 10, "--warmup", 8, "--tokens", 64, "--out", out)
    assert r.exit_code == 2
    assert "int32" in flat(r.output) and "Traceback" not in r.output
    assert not out.exists()


def test_start_pos_at_the_int32_limit_runs(tmp_path):
    r = invoke("--backend", "numpy", "--start-pos", 2**31 - 2, "--warmup", 0, "--tokens", 1,
               "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output


def test_nvtx_off_gpu_is_accepted_with_a_note(tmp_path):
    r = invoke("--backend", "numpy", "--nvtx", "--tokens", 1, "--warmup", 0, "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert "NVTX ranges only matter to a profiler" in flat(r.output)


# ---------------------------------------------------------------------- 6. decode-inert options
def test_counts_clear_and_scratch_help_says_decode_never_uses_them():
    text = flat(CliRunner().invoke(main, ["run", "--help"]).output)
    for opt in ("--counts-clear", "--scratch"):
        part = text[text.index(opt + " ["):]
        part = part[:part.index(" --", 3)]
        assert "tokens > 1" in part and "decode token never" in part, part


@pytest.mark.parametrize("args, shown", [
    ((), None),
    (("--counts-clear", "async"), "--counts-clear async"),
    (("--scratch", "on-demand"), "--scratch on-demand"),
])
def test_header_notes_decode_inert_options(tmp_path, args, shown):
    r = invoke("--backend", "numpy", "--tokens", 1, "--warmup", 0, *args, "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    if shown is None:
        assert "batched routed-MoE path" not in text
    else:
        assert f"{shown} only affects the batched routed-MoE path (tokens > 1 per step)" in text
        assert "decode token never takes" in meta_of(tmp_path / "r")["option_note"]
