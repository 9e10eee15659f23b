"""ds4's MoE profile line: written by ``ds4lab.moeprof.ds4log``, read by the one grammar
(``ds4lab.trace.sources.ds4log``): the format round-trips, ``nan`` included, and the grammar's validity
rules are ``ds4lab ingest``'s reading of the same lines."""

from __future__ import annotations

import math

import pytest

from ds4lab import moeprof as M
from ds4lab.trace.sources import ds4log as D

OK = ("ds4: CUDA MoE profile tokens=1 pairs=6 xq=0.004 sort=0.000 gateup=0.021 midq=0.003 down=0.011 sum=0.002 "
      "total=0.041 ms")


def line(**f):
    """``OK`` with some fields' text replaced."""
    out = OK
    for k, v in f.items():
        head, rest = out.split(f" {k}=", 1)
        out = f"{head} {k}={v} {rest.split(' ', 1)[1]}" if " " in rest else f"{head} {k}={v}"
    return out


def test_nan_and_inf_round_trip():
    """``nan`` is how ds4lab writes a stage it could not time: it parses back to NaN, and ±inf to ±inf."""
    a = M.format_ds4_line(1, {"xq": 1.0})
    assert "sort=nan" in a and "total=nan" in a
    d = D.parse_ds4_line(a)
    assert d["xq"] == 1.0 and all(math.isnan(d[s]) for s in M.STAGES if s != "xq")
    assert M.format_ds4_line(d["tokens"], d, pairs=d["pairs"]) == a
    b = M.format_ds4_line(2, {"xq": math.inf, "sort": -math.inf, "total": math.inf})
    d = D.parse_ds4_line("noise " + b)
    assert d["xq"] == math.inf and d["sort"] == -math.inf and d["total"] == math.inf
    assert M.format_ds4_line(d["tokens"], d, pairs=d["pairs"]) == b
    assert D.parse_ds4_line(line(xq="-nan"))["xq"] != D.parse_ds4_line(line(xq="-nan"))["xq"]  # glibc's -nan


def test_parse_and_problem_share_one_grammar():
    assert D.parse_ds4_line(line(xq=".5"))["xq"] == 0.5
    assert D.parse_ds4_line(line(xq="1e-3"))["xq"] == 0.001
    assert D.parse_ds4_line(OK + "  ")["tokens"] == 1  # trailing whitespace only
    for bad in (OK + " extra", line(xq="."), line(xq="e"), line(xq="NaN"), line(xq="abc"), "ds4: something else",
                OK.replace(" sum=0.002", "")):
        assert D.parse_ds4_line(bad) is None, bad
        assert D.ds4_line_problem(bad) is not None, bad
    assert D.ds4_line_problem(OK) is None


@pytest.mark.parametrize("text,why", [
    (line(xq="nan", total="nan"), "xq=nan is not a finite time"),  # not timed: no real call
    (line(xq="inf"), "xq=inf is not a finite time"),
    (line(xq="1e999"), "xq=1e999 is not a finite time"),  # the same value spelled as ingest's test does
    (line(down="-0.5"), "down=-0.5 is a negative time"),
    (line(tokens="0", pairs="0"), "tokens=0: a MoE call has at least one token"),
    (line(tokens="4", pairs="7"), "pairs=7 is not a positive multiple of tokens=4"),
    (line(total="0.049"), "total=0.049 is not the sum of the stages (0.041 ms)"),
    (line(xq="."), "xq='.' is not a number"),
    (OK + " extra", "fields out of order, or extra text"),
])
def test_problems_name_the_field(text, why):
    assert why in D.ds4_line_problem(text)


def test_cupti_totals_are_spans():
    span = line(total="0.090")
    assert "not the sum" in D.ds4_line_problem(span)
    assert D.ds4_line_problem(span, total_is_sum=False) is None
    assert D.TOTAL_NOT_SUM_MODES == ("cupti",)


LINES = [OK, line(xq=".5", total="0.537"), line(xq="nan"), line(xq="inf"), line(sort="-inf"), line(xq="+nan"),
         line(xq="1e999"), line(down="-0.5", total="0.5"), line(tokens="0", pairs="0"), line(tokens="4", pairs="7"),
         line(total="0.049"), line(total="0.048"), line(xq="."), line(xq="e"), line(xq="abc"), OK + " extra",
         OK.replace(" sum=0.002", ""), line(tokens="-1"), "noise " + OK]


@pytest.mark.parametrize("text", LINES)
def test_ingest_reads_each_line_as_the_shared_parser_does(tmp_path, text):
    """One verdict for every line: ingest keeps it iff :func:`ds4_line_problem` finds nothing, with the
    same values; the reason is the same text (ingest once called a literal nan/inf "not a number")."""
    from ds4lab.jobs import ingest

    p = tmp_path / "run.log"
    p.write_text(text + "\n")
    res = ingest.ingest(p, lenient=True)
    why = D.ds4_line_problem(text)
    if why is None:
        assert not res.problems
        got = dict(zip(res.tables["ds4_moe"]["stage"], res.tables["ds4_moe"]["ms"]))
        d = D.parse_ds4_line(text)
        assert got == {s: d[s] for s in M.STAGES}
    else:
        assert [q["line"] for q in res.problems] == [1]
        literal = any(f"={v} " in text + " " for v in ("nan", "+nan", "-nan", "inf", "+inf", "-inf"))
        if not literal:
            assert res.problems[0]["problem"] == f"malformed ds4 MoE profile line ({why})"


def test_the_header_fields():
    assert D.ds4lab_header("# ds4lab moe · mode=in-graph · routing=zipf · MODELED by the sim") == (
        "ds4lab moe · mode=in-graph · routing=zipf · MODELED by the sim", True)
    assert D.ds4lab_header("  #ds4lab x") == ("ds4lab x", False)
    assert D.ds4lab_header("# ds4labs") is None and D.ds4lab_header("ds4lab moe") is None
    f = D.ds4lab_header_fields("ds4lab moe · mode=in-graph · routing=zipf · MODELED by the sim")
    assert (f["mode"], f["routing"], f["modes"]) == ("in-graph", "zipf", ("in-graph",))
    assert f["provenance"] == "ds4lab moe · MODELED by the sim"


def test_the_profilers_rows_are_what_the_one_reader_keeps(tmp_path):
    """``moeprof.profile_rows`` reads a log through the one reader: a line it calls malformed (a stage not
    timed, extra text) is left out; ds4's other lines are not profile rows."""
    p = tmp_path / "ds4.log"
    p.write_text("\n".join([OK, line(xq="nan"), OK + " extra", "ds4: decode graph captured il=0 island=0", OK]) + "\n")
    df = M.profile_rows(p, n_layers=2)
    assert len(df) == 2 * len(M.STAGES) and df.drop_duplicates(["token", "layer"])[["token", "layer"]].values.tolist() == [[0, 0], [0, 1]]
    assert not df.modeled.any() and (df.note == "ds4 DS4_CUDA_MOE_PROFILE line").all()


def test_stages_are_defined_once():
    from ds4lab.token.model import MOE_STAGES

    assert M.STAGES == MOE_STAGES + ("total",) and M.MOE_STAGES is MOE_STAGES
    assert D.STAGES is M.STAGES and D.TOTAL_SLACK_MS == pytest.approx(0.007)


LONG_MALFORMED = {  # each shape once took time quadratic in its length (20 KB: seconds; 400 KB: minutes)
    "a long word": D.DS4_PREFIX + " " + "a" * 20_000,
    "a long number cut by a letter": D.DS4_PREFIX + " tokens=1 pairs=6 xq=" + "1" * 20_000 + "x",
    "digits, a point, digits, a letter": D.DS4_PREFIX + " tokens=1 pairs=6 xq=" + "1" * 10_000 + "." + "1" * 10_000
                                         + "q sort=0 gateup=0 midq=0 down=0 sum=0 total=0 ms",
}


@pytest.mark.parametrize("text", list(LONG_MALFORMED.values()), ids=list(LONG_MALFORMED))
def test_a_long_malformed_line_is_rejected_in_linear_time(text):
    import time

    t0 = time.perf_counter()
    assert D.parse_ds4_line(text) is None and D.ds4_line_problem(text)
    assert time.perf_counter() - t0 < 0.2, "a 20 KB line must be judged in milliseconds"


def test_ingest_names_a_400_kb_malformed_line_at_once(tmp_path):
    import time

    from click.testing import CliRunner

    from ds4lab.cli import main

    log = tmp_path / "prof.log"
    log.write_text(OK + "\n" + D.DS4_PREFIX + " tokens=1 pairs=6 xq=" + "7" * 400_000 + "x\n")
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, ["ingest", str(log), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "prof.log:2" in r.stderr and "xq=" in r.stderr, r.output
    assert len(r.stderr) < 2_000, "the message does not repeat the whole line"
    assert time.perf_counter() - t0 < 5
