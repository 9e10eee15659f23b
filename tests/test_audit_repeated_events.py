"""A trace whose events were written twice (every event repeated exactly: same kind, name, thread, stream, start,
end and correlation) is read with each kept once and a note saying how many repeated; its tokens are found as
in the trace written once."""

from __future__ import annotations

import json

from audit_fixtures import write_kineto
from ds4lab.audit import analyze
from ds4lab.trace.sources import read_events


def test_events_written_twice_are_kept_once_and_said(tmp_path):
    once = read_events(write_kineto(tmp_path / "once.json", tokens=3))
    doc = json.loads((tmp_path / "once.json").read_text())
    doc["traceEvents"] = doc["traceEvents"] + [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    (tmp_path / "twice.json").write_text(json.dumps(doc))
    twice = read_events(tmp_path / "twice.json")
    assert len(twice.frame) == len(once.frame)
    assert any("repeat another exactly" in n and "12 kernel" in n for n in twice.notes)
    (r,) = analyze([twice])
    (r1,) = analyze([once])
    assert r.tokens.n == r1.tokens.n == 3 and r.tokens.range_name == "decode_step"
    assert not any("repeat another" in n for n in once.notes)
