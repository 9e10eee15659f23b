"""Tokens of a trace cut short or with ranges that never close (:func:`ds4lab.audit.tokens.find_tokens`): a last
token cut by the end of the trace is left out and said, never a token shape of its own nor a kernel "present in
some tokens only"; a range with no end, or one that runs past the trace while later ranges start inside it, is
dropped and said with its count (never a token of no kernel, never swallowing the ranges after it); Chrome
``B``/``E`` pairs are read as ranges; a header's claim to hold N steps is not repeated where fewer were found."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from audit_fixtures import kineto_events, write_kineto
from ds4lab.audit import analyze
from ds4lab.cli import main
from ds4lab.trace.sources import read_events

LLAMA = Path(__file__).parents[1] / "ds4lab" / "data" / "audit" / "torch-llama-static.csv.gz"


def _rows(path: Path) -> tuple[list[str], list[str]]:
    lines = gzip.open(path, "rt").read().splitlines()
    return lines[:2], lines[2:]


def _write(path: Path, head: list[str], rows: list[str]) -> Path:
    with gzip.open(path, "wt") as f:
        f.write("\n".join(head + rows) + "\n")
    return path


def _audit_text(path: Path, out: Path) -> str:
    r = CliRunner().invoke(main, ["audit", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


def test_a_recording_cut_at_half_its_rows_leaves_its_last_token_out_and_claims_no_eight_steps(tmp_path):
    head, rows = _rows(LLAMA)
    cut = _write(tmp_path / "half.csv.gz", head, rows[: len(rows) // 2 - 1])  # the last row: a kernel of token 4
    text = _audit_text(cut, tmp_path / "a")
    assert "present in some tokens only" not in text and "replays wrong" not in text
    assert "cut by the end of the trace" in text and "1 token shape(s)" in text
    assert "note: trimmed to the first 8 decode steps" not in text
    assert "its header says trimmed to the first 8 decode steps, but 3 complete token(s)" in text


def test_the_whole_recording_keeps_its_eight_tokens_and_its_claim():
    (r,) = analyze([read_events(LLAMA)])
    assert r.tokens.n == 8 and not any("cut by the end" in n for n in r.notes)
    assert any(n.startswith("trimmed to the first 8 decode steps") for n in r.notes)


def _edit_nvtx(tmp_path: Path, which: int, end) -> Path:
    """The llama recording with its ``which``-th decode_step range given end ``end`` (ns, or a function of it)."""
    head, rows = _rows(LLAMA)
    cols = head[1].split(",")
    k = 0
    for i, line in enumerate(rows):
        if line.startswith("nvtx,decode_step,"):
            if k == which:
                f = line.split(",")
                e = cols.index("end_ns")
                f[e] = str(end(int(f[e])) if callable(end) else end)
                rows[i] = ",".join(f)
            k += 1
    return _write(tmp_path / "edited.csv.gz", head, rows)


def test_a_range_with_no_end_in_the_middle_is_dropped_and_said_not_taken_as_a_cut_last_token(tmp_path):
    (r,) = analyze([read_events(_edit_nvtx(tmp_path, 3, -1))])
    assert r.tokens.n == 7
    assert any("1 range(s) 'decode_step' never closed" in n and "dropped" in n for n in r.notes)
    assert not any("cut by the end" in n for n in r.notes)


def test_a_range_that_runs_past_the_trace_swallows_none_after_it(tmp_path):
    (r,) = analyze([read_events(_edit_nvtx(tmp_path, 0, lambda e: e + 10**15))])
    assert r.tokens.n == 7 and r.tokens.range_name == "decode_step"
    assert any("1 range(s) 'decode_step' never closed" in n for n in r.notes)


def _kineto(tmp_path: Path, edit) -> Path:
    doc = json.loads(write_kineto(tmp_path / "k.json", tokens=3).read_text())
    doc["traceEvents"] = edit(doc["traceEvents"])
    (tmp_path / "k.json").write_text(json.dumps(doc))
    return tmp_path / "k.json"


def _ranges(evs):
    return [e for e in evs if e.get("cat") == "user_annotation"]


def test_chrome_begin_end_pairs_are_read_as_ranges(tmp_path):
    def to_be(evs):
        out = []
        for e in evs:
            if e.get("cat") == "user_annotation":
                b = {k: v for k, v in e.items() if k != "dur"}
                out += [{**b, "ph": "B"}, {**b, "ph": "E", "ts": e["ts"] + e["dur"]}]
            else:
                out.append(e)
        return out

    t = read_events(_kineto(tmp_path, to_be))
    assert not any("phase 'B'" in n or "phase 'E'" in n for n in t.notes)
    (r,) = analyze([t])
    assert r.tokens.n == 3 and r.tokens.range_name == "decode_step"


def test_a_range_with_no_dur_never_makes_a_token_of_no_kernel(tmp_path):
    def no_dur(evs):
        _ranges(evs)[-1].pop("dur")
        return evs

    t = read_events(_kineto(tmp_path, no_dur))
    assert any("1 range(s) that never close" in n for n in t.notes)
    (r,) = analyze([t])
    assert r.tokens.n == 2 and r.n_shapes == 1
    assert any("cut by the end of the trace" in n for n in r.notes)


def test_a_kineto_trace_stopped_mid_step_leaves_that_step_out(tmp_path):
    def stop(evs):
        last = _ranges(evs)[-1]
        mid = last["ts"] + last["dur"] / 3
        return [e for e in evs if e.get("cat") == "user_annotation" or e.get("ts", 0) < mid]

    (r,) = analyze([read_events(_kineto(tmp_path, stop))])
    assert r.tokens.n == 2 and r.n_shapes == 1
    assert any("cut by the end of the trace" in n for n in r.notes)
    f = r.findings
    assert f is None or not len(f) or not (f["call_class"] == "present in some tokens only").any()
