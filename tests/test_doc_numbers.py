"""The numbers the README and the docs quote, held to the records they come from.

One table, :data:`CLAIMS`: each row names a document, the text it quotes with the numbers left as
``{fields}``, the record the numbers come from, and how they are computed from it. The test formats
the text with the computed numbers (as the docs write them: a space between thousands) and finds it
in the document, so a number that drifts from its record, or a record that changes under a quoted
number, fails CI. ``docs/figures.md`` as a whole is written from its records by ``scripts/figures.py``
and held to them by ``tests/test_figures.py``; the launch census of ``docs/model.md`` by
``tests/test_census_doc.py``. Adding a claim: one row here (a new ``compute`` function where none fits).
"""

from __future__ import annotations

import csv
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
REC = ROOT / "docs" / "measurements"


def num(x, digits: int = 0) -> str:
    """A number as the docs write it: a space between thousands (``1 056``, ``0.91``)."""
    return f"{float(x):,.{digits}f}".replace(",", " ")


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- how each number is computed
@functools.lru_cache(maxsize=None)
def census(preset: str, long_context: bool, position: int) -> int:
    """ds4lab's launches per token, counted on the timing-only sim (vocabulary on, as ``run`` counts)."""
    from ds4lab.backends import make_backend
    from ds4lab.token.config import get_preset
    from ds4lab.token.model import DecodeModel, TokenOptions

    model = DecodeModel(get_preset(preset, long_context=long_context), make_backend("sim", timing_only=True),
                        TokenOptions(vocab=True))
    model.token(position, 7)
    return model.L.census.total()


def launches() -> dict:
    """ds4lab's token (``ds4-flash``: short, and long-context at 1k) and ds4's at 1k (islands off,
    kernels per recorded token, median: ``h200-2026-12-02b/ds4/census.csv``)."""
    ds4 = [float(r["kernels"]) for r in rows(REC / "h200-2026-12-02b/ds4/census.csv")
           if r["config"] == "islands-off" and r["context"] == "1024"]
    return {"short": num(census("ds4-flash", False, 1024)), "long": num(census("ds4-flash", True, 1024)),
            "ds4": num(np.median(ds4))}


def capture_bound() -> dict:
    """What more capture could buy ds4 (the islands-on token less the median kernel-busy time of its
    recorded tokens) at 1k (``h200-2026-12-02b/ds4``) and 16k (``h200-2026-12-02-ds4/ds4-long``), µs."""
    out = {}
    for key, folder, ctx in (("k1", "h200-2026-12-02b/ds4", "1024"), ("k16", "h200-2026-12-02-ds4/ds4-long", "16384")):
        on = next(float(r["us_per_token"]) for r in rows(REC / folder / "summary.csv")
                  if r["config"] == "islands-on" and r["context"] == ctx)
        busy = [float(r["busy_us"]) for r in rows(REC / folder / "census.csv")
                if r["config"] == "islands-on" and r["context"] == ctx]
        out[key] = num(on - np.median(busy))
    return out


def folded_in() -> dict:
    """ds4's launches at 1k that ds4lab's rebuild folds into its own kernels (activation quantization,
    F32→F16, cuBLAS split-K and its reduction), ``q8_K_quantize`` left out (both launch it): per token
    and ms per token (``h200-2026-12-02-ds4/ds4/kernels-islands-off-1024.csv``)."""
    folded = re.compile(r"quantize_q8_0_f32|f32_to_f16|splitKreduce|nvjet_sm90|quantize_q8_0_group_slice_rows")
    k = [r for r in rows(REC / "h200-2026-12-02-ds4/ds4/kernels-islands-off-1024.csv") if folded.search(r["name"])]
    return {"n": num(sum(float(r["per_token"]) for r in k)),
            "ms": num(sum(float(r["us_per_token"]) for r in k) / 1e3, 2)}


def islands_ladder() -> dict:
    """The README's current figure: ``h200-2026-12-01/round3/islands/ladder.csv``."""
    r = {x["stage"]: x for x in rows(REC / "h200-2026-12-01/round3/islands/ladder.csv")}
    return {"s0": num(r["0"]["us_median"]), "si": num(r["i"]["us_median"]), "s3": num(r["3"]["us_median"]),
            "xi": num(r["i"]["speedup"], 2), "x3": num(r["3"]["speedup"], 2)}


def ds4_ladder() -> dict:
    """The README's current figure: ds4's own ladder per context (ds4 as shipped, stages 0, i, 3u measured,
    3u MODELED), the islands' gain over stage 0 (range, %) and what 3u loses (range, ms)
    (``h200-2026-12-04-ds4/ladder/ladder-modeled.csv``)."""
    t = rows(REC / "h200-2026-12-04-ds4/ladder/ladder-modeled.csv")
    by = {(r["context"], r["stage"]): r for r in t}
    ctxs = sorted({r["context"] for r in t}, key=int)
    us = lambda c, s: float(by[(c, s)]["us_per_token"])  # noqa: E731
    table = "\n".join(f"| {num(c)} | {num(us(c, 'shipped'))} | {num(us(c, '0'))} | {num(us(c, 'i'))} | "
                      f"{num(us(c, '3u'))} | {num(by[(c, '3u')]['modeled_us'])} |" for c in ctxs)
    paired = lambda c, s: float(by[(c, s)]["gain_over_0_us"])  # noqa: E731  (median of per-position differences)
    gain = [100 * paired(c, "i") / us(c, "0") for c in ctxs]
    loss = [-paired(c, "3u") / 1e3 for c in ctxs]
    return {"table": table, "glo": num(min(gain)), "ghi": num(max(gain)),
            "llo": num(min(loss), 1), "lhi": num(max(loss), 1)}


def ds4_table() -> dict:
    """docs/ds4.md's table of ds4's token: per context islands off and on, the paired gain with its interval,
    the MoE profile's µs and its paired cost over islands on (``summary.csv``, ``gains.csv`` of both records)."""
    out = {}
    for folder in ("h200-2026-12-02b/ds4", "h200-2026-12-02-ds4/ds4-long"):
        summ = {(r["config"], r["context"]): r for r in rows(REC / folder / "summary.csv")}
        gains = {(r["other"], r["context"]): r for r in rows(REC / folder / "gains.csv")}
        for ctx in sorted({c for _, c in summ}, key=int):
            g, cost = gains[("islands-on", ctx)], gains[("moe-profile", ctx)]
            out[ctx] = (f"| {num(ctx)} | {num(summ[('islands-off', ctx)]['us_per_token'])} | "
                        f"{num(summ[('islands-on', ctx)]['us_per_token'])} | {num(g['gain_us'])} "
                        f"({num(g['gain_lo'])}…{num(g['gain_hi'])}) | {num(summ[('moe-profile', ctx)]['us_per_token'])} | "
                        f"{num(-float(cost['gain_us']))} ({num(-float(cost['gain_hi']))}…{num(-float(cost['gain_lo']))}) |")
    return {f"c{k}": v for k, v in out.items()}


def capture_stages() -> dict:
    """3cc against 3 (largest ratio, %) and 3p's gain over 3 (range, µs) at every context
    (``h200-2026-12-02b/capture-stages/context.csv``)."""
    t = rows(REC / "h200-2026-12-02b/capture-stages/context.csv")
    s3 = {r["context"]: float(r["us_median"]) for r in t if r["stage"] == "3"}
    cc = max(float(r["us_median"]) / s3[r["context"]] for r in t if r["stage"] == "3cc")
    p = [float(r["gain_us"]) for r in t if r["stage"] == "3p"]
    return {"cc": num(100 * (cc - 1), 1), "lo": num(min(p)), "hi": num(max(p))}


def audit_validate() -> dict:
    """``audit validate``'s 22 runs: verdicts agreeing, whole-token plans over the replay for the runs
    that captured (``h200-2026-12-03/audit-validate/validate.csv``)."""
    t = rows(REC / "h200-2026-12-03/audit-validate/validate.csv")
    ratios = [float(r["predicted_over_measured"]) for r in t if r["predicted_over_measured"]]
    return {"agree": num(sum(r["verdict_agrees"] == "True" for r in t)), "n": num(len(t)),
            "lo": num(min(ratios), 2), "hi": num(max(ratios), 2), "captured": num(len(ratios))}


def user_path() -> dict:
    """``audit validate`` on step scripts recorded as a user's (``h200-2026-12-04/audit-validate/validate.csv``):
    verdicts agreeing, runs, and whether every wrong replay with a named cause led with it."""
    t = rows(REC / "h200-2026-12-04/audit-validate/validate.csv")
    wrong = [r for r in t if r["audit_verdict"] == "replays wrong"]
    assert wrong and all(r["cause_first"] == "True" for r in wrong)
    ratios = [float(r["predicted_over_measured"]) for r in t if r["predicted_over_measured"]]
    return {"agree": num(sum(r["verdict_agrees"] == "True" for r in t)), "n": num(len(t)),
            "lo": num(min(ratios), 1), "hi": num(max(ratios), 1), "held": num(sum(r["time_agrees"] == "True" for r in t))}


def from_ds4_check() -> dict:
    """The sim at ds4's fitted costs against ds4's islands off and on at 4k, the context held out
    (``h200-2026-12-02b/calibration-from-ds4-check.csv``)."""
    t = {(r["context"], r["stage"]): r for r in rows(REC / "h200-2026-12-02b/calibration-from-ds4-check.csv")}
    return {"off": num(t[("4096", "0")]["ratio"], 2), "on": num(t[("4096", "i")]["ratio"], 3)}


def conformance() -> dict:
    """The conformance record of 2026-12-02: scenarios compared and skipped, steps compared,
    disagreements (``h200-2026-12-02-ds4/conformance/conformance.csv``)."""
    t = rows(REC / "h200-2026-12-02-ds4/conformance/conformance.csv")
    ran = [r for r in t if r["step"] != "<skipped>"]
    return {"all": num(len({r["scenario"] for r in t})), "compared": num(len({r["scenario"] for r in ran})),
            "steps": num(len(ran)), "skipped": num(len({r["scenario"] for r in t}) - len({r["scenario"] for r in ran})),
            "disagree": num(sum(r["agree"] == "False" for r in ran))}


def exclusion_cells() -> dict:
    """Cells of the profiling × capture matrix where the H200 and the sim agree, island column included
    (``h200-2026-12-02b/notebooks/02_profiling_vs_capture/exclusion/exclusion-agreement.csv``)."""
    t = rows(REC / "h200-2026-12-02b/notebooks/02_profiling_vs_capture/exclusion/exclusion-agreement.csv")
    return {"agree": num(sum(r["agree"] == "True" for r in t)), "n": num(len(t)),
            "island": num(sum(r["column"] == "island" for r in t))}


def tracer_cost() -> dict:
    """The tracer's cost per launch the audit says (``ds4lab.audit.plans.tracer_cost`` over the record)."""
    from ds4lab.audit.plans import TRACER_COST, tracer_cost as compute

    c = compute(ROOT / TRACER_COST["record"])
    return {"median": num(c["median_us"]), "lo": num(c["min_us"]).replace("-", "−"), "hi": num(c["max_us"]),
            "runs": num(c["runs"])}


@functools.lru_cache(maxsize=None)
def untraced_saving() -> dict:
    """The bundled llama/dynamic recording's whole-token plan against its untraced and its traced eager
    step (the audit of ``ds4lab/data/audit/torch-llama-dynamic.csv.gz`` with its outcome beside it)."""
    from ds4lab.audit.analysis import analyze
    from ds4lab.audit.engines import TOKEN_RANGE, recorded, recorded_outcome
    from ds4lab.audit.plans import against_untraced
    from ds4lab.trace.sources import read_events

    rep = analyze([read_events(recorded("llama", "dynamic"))], token_range=TOKEN_RANGE)[0]
    eager = recorded_outcome("llama", "dynamic")["eager_us"]
    w = against_untraced(rep.plans, eager, "outcome").set_index("plan").loc["whole token"]
    return {"pred": num(w["predicted_us"]), "saved": num(w["saving_untraced_us"]),
            "pct": num(w["saving_untraced_pct"]), "untraced": num(eager), "traced": num(w["eager_measured_us"]),
            "traced_saved": num(w["saving_us"])}


def ds4_paired_gains() -> dict:
    """docs/ds4.md's paired differences from stage 0 (stage i and 3u, µs, with their 95 % intervals) per context,
    as ``h200-2026-12-04-ds4/ladder/gains.csv`` holds them: ``{i1024: "−664, 624…818", u1024: "+3 652, …"}``."""
    out = {}
    for r in rows(REC / "h200-2026-12-04-ds4/ladder/gains.csv"):
        if r["base"] != "stage-0" or r["other"] not in ("stage-i", "stage-3u"):
            continue
        g, lo, hi = (float(r[k]) for k in ("gain_us", "gain_lo", "gain_hi"))
        key = ("i" if r["other"] == "stage-i" else "u") + r["context"]
        # a gain is shown as the change in µs per token (−: faster), its interval as magnitudes
        out[key] = (f"−{num(g)}, {num(lo)}…{num(hi)}" if g > 0 else f"+{num(-g)}, {num(-hi)}…{num(-lo)}")
    return out


def twice_timed() -> dict:
    """The bundled llama/static outcome's two untraced timings of its eager step (eager twin, argument cost's plain
    step), µs, and their ratio."""
    from ds4lab.audit.engines import recorded_outcome

    o = recorded_outcome("llama", "static")
    a, b = o["eager_us"], o["overhead"]["baseline_us"]
    return {"twin": num(a), "plain": num(b), "ratio": f"{max(a, b) / min(a, b):.2f}"}


def kernel_span() -> dict:
    """ds4's kernel span per token (first kernel's start to the last one's end inside each recorded NVTX token,
    CUPTI; the median of the recorded tokens), µs, from the workers' recordings of ``h200-2026-12-04-ds4``:
    ``{configuration}_{context}`` keys (census.csv's ``span_us`` is the NVTX range, host work included)."""
    import pandas as pd

    out = {}
    for key, rec in (("off1", "ladder-1k/worker-islands-off/trace-1024"), ("s01", "ladder-1k/worker-stage-0/trace-1024"),
                     ("i1", "ladder-1k/worker-stage-i/trace-1024"), ("u1", "ladder-1k/worker-stage-3u/trace-1024"),
                     ("u16", "trace-3u-16k/worker-stage-3u/trace-16384")):
        t = pd.read_csv(REC / "h200-2026-12-04-ds4" / rec / "recording.csv.gz", skiprows=1, low_memory=False)
        k = t[t.kind == "kernel"]
        spans = []
        for r in t[t.kind == "nvtx"].itertuples():
            inside = k[(k.start_ns >= r.start_ns) & (k.start_ns <= r.end_ns)]
            spans.append((inside.end_ns.max() - inside.start_ns.min()) / 1e3)
        out[key] = num(np.median(spans))
    return out


# ----------------------------------------------------------------------------- the claims
@dataclass(frozen=True)
class Claim:
    doc: str  #: the document, from the repository's root
    quote: str  #: the text as the document has it, the numbers as ``{fields}`` of ``compute``'s dict
    record: str  #: where the numbers come from (for the reader: ``compute`` reads it)
    compute: Callable[[], dict]


CLAIMS = [
    Claim("README.md", "{short} launches per token, {long} at 1k of context with its compressors, where\nds4 "
          "itself makes {ds4}", "the sim's census; h200-2026-12-02b/ds4/census.csv", launches),
    Claim("README.md", "the same island plan takes {s0} → {si} µs per token ({xi}×), the whole token as one\n"
          "graph {s3} µs ({x3}×)", "h200-2026-12-01/round3/islands/ladder.csv", islands_ladder),
    Claim("README.md", "| context | ds4 as shipped | stage 0 | stage i | stage 3u | MODELED 3u |\n|---|---|---|---|---|---|\n"
          "{table}\n\nStage 0 costs nothing measurable; ds4's islands buy {glo}–{ghi} %; re-capturing and updating the "
          "whole token every\ntoken loses {llo}–{lhi} ms", "h200-2026-12-04-ds4/ladder/ladder-modeled.csv", ds4_ladder),
    Claim("README.md", "while the replay alone takes {u1} µs at 1k", "h200-2026-12-04-ds4/*/worker-*/recording.csv.gz",
          kernel_span),
    Claim("docs/measurements/h200-2026-12-04-ds4/README.md", "(kernel span {u1} µs at 1k against {off1} eager and {i1} "
          "with\n  islands; {u16} µs at 16k", "h200-2026-12-04-ds4/*/worker-*/recording.csv.gz", kernel_span),
    Claim("docs/ds4.md", "{c1024}\n{c4096}\n{c16384}\n{c65536}", "h200-2026-12-02b/ds4, h200-2026-12-02-ds4/ds4-long",
          ds4_table),
    Claim("README.md", "3cc within {cc} % of 3 with one graph, PDL saves {lo}–{hi} µs per token",
          "h200-2026-12-02b/capture-stages/context.csv", capture_stages),
    Claim("README.md", "its verdict torch.cuda.graph's in {agree} of {n}\nsteps, its whole-token plan ×{lo}–{hi} of "
          "the replay for all {captured} that captured", "h200-2026-12-03/audit-validate/validate.csv",
          audit_validate),
    Claim("README.md", "on scripts written apart from it and recorded as a user\nrecords them, {agree} of {n} so far, each "
          "wrong replay led by its true cause, its whole-token plan ×{lo}–{hi} of the replay there (held in\n{held}: the "
          "loop's work between steps priced at its traced cost", "h200-2026-12-04/audit-validate/validate.csv", user_path),
    Claim("docs/ds4.md", "Within ±10 % at every context but one: islands\non at 4k, {on}.",
          "h200-2026-12-02b/calibration-from-ds4-check.csv", from_ds4_check),
    Claim("README.md", "{all} capture-rule scenarios on the sim and the GPU: {disagree} disagreements on the H200 "
          "(the {skipped} two-GPU ones wait for two GPUs)", "h200-2026-12-02-ds4/conformance", conformance),
    Claim("docs/ds4.md", "can add at most {k1} µs (1k) to {k16} µs (16k)", "ds4 summary.csv, census.csv",
          capture_bound),
    Claim("docs/ds4.md", "measured bound where it was measured ({k1} µs at 1k, {k16} µs at 16k", "ds4 records",
          capture_bound),
    Claim("docs/capture-stages.md", "measured (the islands-on token less its kernel-busy time: {k1} µs at 1k, {k16} µs "
          "at 16k)", "ds4 records", capture_bound),
    Claim("docs/measurements/h200-2026-12-02b/README.md", "({k1} µs at 1k: this record's `ds4/`", "ds4 records",
          capture_bound),
    Claim("docs/measurements/h200-2026-12-02-ds4/README.md", "Together {n} launches and {ms} ms of kernel time",
          "h200-2026-12-02-ds4/ds4/kernels-islands-off-1024.csv", folded_in),
    Claim("docs/sim.md", "0\ndisagreements in the {steps} steps of the {compared} compared, the {skipped} two-GPU ones "
          "skipped", "h200-2026-12-02-ds4/conformance", conformance),
    Claim("docs/sim.md", "in all {agree} on 2026-12-02", "the exclusion record of 2026-12-02", exclusion_cells),
    Claim("docs/commands.md", "on the H200 the {compared} that ran there agree with the sim in all {steps} steps, the "
          "{skipped} two-GPU ones skipped", "h200-2026-12-02-ds4/conformance", conformance),
    Claim("docs/audit.md", "a median {median} µs, {lo}…{hi} over the {runs} runs of `h200-2026-12-03`",
          "h200-2026-12-03/audit-validate", tracer_cost),
    Claim("docs/audit.md", "whole token {pred} µs predicted, {saved} µs ({pct} %) saved against its\n  untraced "
          "{untraced} µs, where the traced {traced} µs gave {traced_saved}",
          "ds4lab/data/audit/torch-llama-dynamic.*", untraced_saving),
    Claim("docs/ds4.md", "| 1 024 | 16 465 | 16 312 | 15 683 ({i1024}) | 20 073 ({u1024}) |",
          "h200-2026-12-04-ds4/ladder/gains.csv", ds4_paired_gains),
    Claim("docs/ds4.md", "| 4 096 | 23 595 | 23 597 | 23 037 ({i4096}) | 31 779 ({u4096}) |",
          "h200-2026-12-04-ds4/ladder/gains.csv", ds4_paired_gains),
    Claim("docs/ds4.md", "| 16 384 | 24 217 | 24 251 | 23 689 ({i16384}) | 32 428 ({u16384}) |",
          "h200-2026-12-04-ds4/ladder/gains.csv", ds4_paired_gains),
    Claim("docs/audit.md", "timings more than 10 % apart are said (the bundled `llama/static`: {twin} and {plain} µs, "
          "×{ratio};", "ds4lab/data/audit/torch-llama-static.json", twice_timed),
]


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c.doc}:{c.quote[:40]}")
def test_a_quoted_number_is_its_records(claim):
    text = (ROOT / claim.doc).read_text()
    want = claim.quote.format(**claim.compute())
    flat = " ".join(text.split())
    assert " ".join(want.split()) in flat, (
        f"{claim.doc} does not say {want!r} (computed from {claim.record}); the document or the record changed")


def test_a_number_off_its_record_fails(tmp_path, monkeypatch):
    """The check can fail: the README with one figure off by one is caught."""
    readme = (ROOT / "README.md").read_text()
    claim = next(c for c in CLAIMS if "the same island plan" in c.quote)
    want = " ".join(claim.quote.format(**claim.compute()).split())
    s0 = claim.compute()["s0"]
    bad = readme.replace(s0, num(float(s0.replace(" ", "")) + 1), 1)
    assert want in " ".join(readme.split()) and want not in " ".join(bad.split())
