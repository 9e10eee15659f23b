"""Traces whose host calls are missing or unlinked: a Kineto trace whose device rows carry no correlation id is
paired with its process's calls (in order, per stream and kind), so the calls that refuse capture are seen; a
trace with no API call at all gets no "captures" nor "no finding" headline, and no "replays wrong" from device
start times alone: the capture verdict is unknown, with what was missing and the command that records it; its
plans say one thing about their host (MODELED at the calibration's host_launch_us)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from audit_fixtures import write_kineto
from ds4lab.audit import analyze
from ds4lab.audit import frozen as F
from ds4lab.audit.plans import MODELED_HOST
from ds4lab.cli import main
from ds4lab.trace.sources import read_events

LLAMA = Path(__file__).parents[1] / "ds4lab" / "data" / "audit" / "torch-llama-static.csv.gz"


def _kineto(tmp_path: Path, edit) -> Path:
    doc = json.loads(write_kineto(tmp_path / "k.json", tokens=3).read_text())
    doc["traceEvents"] = edit(doc["traceEvents"])
    (tmp_path / "k.json").write_text(json.dumps(doc))
    return tmp_path / "k.json"


def _text(path: Path, out: Path, *extra) -> str:
    r = CliRunner().invoke(main, ["audit", str(path), "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


def test_device_rows_without_correlation_are_paired_with_their_process_calls(tmp_path):
    def drop(evs):
        for e in evs:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                e.get("args", {}).pop("correlation", None)
        return evs

    path = _kineto(tmp_path, drop)
    (r,) = analyze([read_events(path)])
    assert r.pid >= 0 and r.tokens.range_name == "decode_step" and r.tokens.n == 3
    assert not r.host_blind and not any("holds no API calls" in n for n in r.notes)
    assert F.verdict(r).verdict == F.REFUSED and "cudaStreamSynchronize" in F.verdict(r).why
    text = _text(path, tmp_path / "a", "--token-range", "decode_step")
    assert "process not recorded" not in text and "refused — call cudaStreamSynchronize" in text


def test_a_trace_of_device_work_alone_says_the_capture_verdict_is_unknown(tmp_path):
    path = _kineto(tmp_path, lambda evs: [e for e in evs if e.get("cat") not in ("cuda_runtime", "cuda_driver")])
    text = _text(path, tmp_path / "a")
    assert "no finding" not in text and "captures;" not in text
    assert "capture verdict unknown from this trace" in text and "ProfilerActivity.CPU" in text
    assert "traced) host times" not in text and "MODELED at the calibration's host_launch_us" in text
    plans = pd.read_csv(tmp_path / "a" / "plans.csv")
    assert set(plans.loc[~plans["plan"].str.startswith("eager"), "host_times"]) == {MODELED_HOST}
    replay = json.loads((tmp_path / "a" / "meta.json").read_text())["units"][0]["replay"]
    assert replay["verdict"] == F.BLIND and replay["command"]


def test_a_recording_without_its_api_rows_is_not_said_to_replay_wrong(tmp_path):
    lines = gzip.open(LLAMA, "rt").read().splitlines()
    path = tmp_path / "no_api.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines[:2] + [x for x in lines[2:] if not x.startswith("api,")]) + "\n")
    (r,) = analyze([read_events(path)])
    v = F.verdict(r)
    assert r.host_blind and v.verdict == F.BLIND and "device start times alone" in v.why
