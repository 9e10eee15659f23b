"""Stage ladder, graph cache, eager fallback and host-decision guard, on the simulated runtime."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from ds4lab.capture import stream as S
from ds4lab.capture.cache import CapturePolicy, GraphCache
from ds4lab.token.config import get_preset
from ds4lab.experiments.hazards import HAZARD_SETS, demonstrate
from ds4lab.jobs import execute
from ds4lab.jobs.ladder import LadderConfig
from ds4lab.experiments.stages import STAGES, fixes_table, parse_stages
from ds4lab.token.model import DecodeModel, TokenOptions

TINY = get_preset("tiny")
pytestmark = pytest.mark.usefixtures("graphs_on")
H200_HAZARDS = Path(__file__).resolve().parents[1] / "docs/measurements/h200-2026-11-29/hazards-small.csv"




from helpers import decode_hidden as tokens  # noqa: E402


def test_stage_table_and_fixes():
    assert list(STAGES) == ["0", "0s", "i", "i+", "1", "2", "3", "3u", "3c", "3cc", "3p", "3cp", "3ccp"]
    t = fixes_table()
    assert (t["0"] == "required").sum() == 1  # stage 0 only routes launches through the accessor
    assert t.loc["scalars from device buffers", "3"] == "required"
    assert t.loc["scalars from device buffers", "3u"] == "—"
    assert t.loc["node parameters updated before replay", "3u"] == "required"
    assert t.loc["async counts clear", "1"] == "—" and t.loc["async counts clear", "2"] == "required"
    assert t.loc["buffer-keyed graph variants", "i"] == "required" and t.loc["scalars from device buffers", "i"] == "—"
    with pytest.raises(ValueError, match="7"):
        parse_stages("0,7")
    with pytest.raises(ValueError, match="--long-context"):
        parse_stages("0,3c")
    assert [s.name for s in parse_stages("0,3c", long_context=True)] == ["0", "3c"]
    with pytest.raises(ValueError, match="empty stage"):
        parse_stages("0,,3")


def test_cache_warms_captures_then_replays(sim):
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True))
    cache = GraphCache(sim, CapturePolicy(("shared",), warmup=1))
    m.executor = cache
    s = sim.new_stream()
    tokens(m, s, [100, 101, 102])
    st = cache.stats
    # token 1: every layer warms (eager); token 2: captures and replays; token 3: replays
    assert st.captures == TINY.n_layers
    assert st.replays == 2 * TINY.n_layers
    assert st.retirements == 0
    keys = sorted(cache.entries)
    assert [k.site for k in keys] == [("shared", layer, 1) for layer in range(TINY.n_layers)]
    assert all(e.addresses for e in cache.entries.values())  # the buffers each graph touches, by address


def test_captured_stages_are_bit_identical_to_eager(sim):
    ref = tokens(DecodeModel(TINY, sim, TokenOptions(vocab=True)), S.LEGACY_STREAM, range(100, 105))
    for clusters, opts in ((("shared",), {}), (("shared", "moe"), dict(counts_clear="async")),
                           (("token",), dict(scalars="device", counts_clear="async"))):
        m = DecodeModel(TINY, sim, TokenOptions(vocab=True, **opts))
        m.executor = GraphCache(sim, CapturePolicy(clusters))
        got = tokens(m, sim.new_stream(), range(100, 105))
        assert m.executor.stats.replays > 0
        for a, b in zip(ref, got):
            assert np.array_equal(a, b), clusters


def test_capture_failure_retires_and_falls_back_exactly(sim):
    ref = tokens(DecodeModel(TINY, sim, TokenOptions(vocab=True, scalars="device")), S.LEGACY_STREAM, range(100, 104))
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True, scalars="device", sync_in_body=True))
    m.executor = cache = GraphCache(sim, CapturePolicy(("token",)))
    got = tokens(m, sim.new_stream(), range(100, 104))
    assert dict(cache.stats.failures) == {"cudaErrorStreamCaptureUnsupported": 1}
    # token 1 warms (eager), token 2 fails to capture (eager fallback), tokens 3-4 run eagerly
    assert cache.stats.retirements == 1 and cache.stats.replays == 0 and cache.stats.eager_runs == 3
    assert "capture failed" in cache.retired()[0].reason
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


def test_legacy_stream_cannot_be_captured(sim):
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True))
    m.executor = cache = GraphCache(sim, CapturePolicy(("shared",)))
    tokens(m, S.LEGACY_STREAM, [100, 101])
    assert cache.stats.failures["legacy stream"] == TINY.n_layers and cache.stats.replays == 0


def test_guard_retires_on_a_changed_host_decision(sim):
    # scalars by value: the attention regime (filling vs full window) is a host decision; crossing
    # the window boundary changes it, so the graph must be recaptured, never replayed stale.
    W = TINY.window
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True, scalars="value", counts_clear="async"))
    m.executor = cache = GraphCache(sim, CapturePolicy(("token",), update=True))
    ref_m = DecodeModel(TINY, sim, TokenOptions(vocab=True))
    positions = range(W - 4, W + 2)
    got = tokens(m, sim.new_stream(), positions)
    ref = tokens(ref_m, S.LEGACY_STREAM, positions)
    assert cache.stats.recaptures == 1
    assert any("attention.regime: filling → full" in e["reason"] for e in cache.log if e["event"] == "retire")
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


def test_guard_off_would_replay_stale(sim):
    """The same run without the guard and without updates replays the captured position: wrong."""
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True, scalars="value", counts_clear="async"))
    m.executor = GraphCache(sim, CapturePolicy(("token",), guard=False))
    ref = tokens(DecodeModel(TINY, sim, TokenOptions(vocab=True)), S.LEGACY_STREAM, range(100, 104))
    got = tokens(m, sim.new_stream(), range(100, 104))
    assert np.array_equal(ref[0], got[0]) and not np.array_equal(ref[-1], got[-1])


def test_buffer_generation_is_part_of_the_key(sim):
    m = DecodeModel(TINY, sim, TokenOptions(vocab=True, scratch="on-demand", counts_clear="async"))
    m.executor = cache = GraphCache(sim, CapturePolicy(("moe",)))
    tokens(m, sim.new_stream(), [100, 101, 102])
    g0 = m.generation
    m.moe_buf.ensure(4)  # the scratch grows: every buffer address may change
    assert m.generation == g0 + 1
    tokens(m, sim.new_stream(), [103, 104, 105])
    gens = {k.generation for k in cache.entries}
    assert gens == {g0, g0 + 1}


@pytest.mark.parametrize("name", [n for n in HAZARD_SETS["all"] if n != "moe-profile-island"])
def test_hazards_on_sim_match_the_h200(sim, name):
    rows = {r["hazard"]: r for r in csv.DictReader(H200_HAZARDS.open())}
    r = demonstrate(name, sim, get_preset("tiny"))
    want = rows[name]
    assert r["outcome"] == want["outcome"]
    assert r["errors"] == want["errors"]
    assert str(r["exact"]) == want["exact"]


def test_ladder_end_to_end_on_sim(tmp_path):
    cfg = LadderConfig(stages="0,0s,1,2,3,3u", preset="tiny", tokens=8, warmup=1, exact_tokens=3, out=tmp_path,
                       rounds=2)
    df = execute("ladder", cfg, backend="sim").table()
    assert list(df.stage) == ["0", "0s", "1", "2", "3", "3u"]
    assert df.exact.tolist() == [True] * 6
    assert df.loc[df.stage == "3", "graph_launches"].item() == 1
    assert df.loc[df.stage == "3", "kernel_launches"].item() == 0
    assert df.loc[df.stage == "0", "graph_launches"].item() == 0
    assert df.modeled.all()
    assert (tmp_path / "ladder.csv").exists() and (tmp_path / "ladder.png").exists() and (tmp_path / "ladder.svg").exists()
    # the modeled replayed token is faster than the modeled eager token (launch-bound)
    us = dict(zip(df.stage, df.us_median))
    assert us["3"] < us["0"]


def test_ladder_reports_updates_reinstantiations_and_fallbacks_apart(tmp_path):
    """Stage 3u updates the executable graph every token; the ladder's row counts updates,
    re-instantiations (a refused update instantiates again) and fallbacks separately."""
    import pandas as pd

    from ds4lab.jobs import execute
    from ds4lab.jobs.ladder import LadderConfig

    execute("ladder", LadderConfig(stages="0,3u", preset="tiny", tokens=6, warmup=1, exact_tokens=2, rounds=1,
                                   out=tmp_path), backend="sim")
    row = pd.read_csv(tmp_path / "ladder.csv").set_index("stage").loc["3u"]
    # every call re-captures (each capture counted) and updates the one executable: one graph
    assert row["updates"] > 0 and row["captures"] == row["updates"] + 1 and row["graphs"] == 1
    assert row["reinstantiations"] == 0 and row["fallbacks"] == 0 and row["retirements"] == 0
    for col in ("reinstantiations", "fallbacks", "aborts", "update_results"):
        assert col in row.index


H200_ISLAND = Path(__file__).resolve().parents[1] / "docs/measurements/h200-2026-12-01/round1/hazards-island/hazards-small.csv"


@pytest.mark.slow
def test_moe_profile_inside_islands_on_sim_matches_the_h200(sim):
    """ds4's DS4_CUDA_MOE_PROFILE inside its decode islands (events on the legacy stream while island 1
    captures on a blocking stream in global mode): the H200 refused the first legacy record
    (cudaErrorStreamCaptureImplicit), island 1 retired and ran eagerly, every MoE call still gave its
    profile line, results bit-identical. The sim must say the same."""
    want = next(csv.DictReader(H200_ISLAND.open()))
    r = demonstrate("moe-profile-island", sim, get_preset("small"))
    assert (r["outcome"], r["errors"], str(r["exact"]), r["capture_mode"], r["stage"]) == \
        (want["outcome"], want["errors"], want["exact"], want["capture_mode"], want["stage"])
    assert r["profile_lines"] == int(want["profile_lines"]) > 0


def test_the_capture_policy_goes_whole_from_the_stage_to_its_cache(sim):
    """One frozen policy: a stage holds it, its run fills in the run's capture mode where the stage
    fixes none, and the graph cache gets that very object; keys are named."""
    import dataclasses

    from ds4lab.experiments.stage_run import StageRun

    m = DecodeModel(TINY, sim, TokenOptions(vocab=True))
    islands = StageRun(m, STAGES["i"], TokenOptions(vocab=True), mode="relaxed")
    assert islands.cache.policy is islands.policy == STAGES["i"].policy  # ds4's islands keep global mode
    assert islands.mode == "global" and islands.cache.capture_stream is not None  # their own blocking stream
    whole = StageRun(m, STAGES["3"], TokenOptions(vocab=True), mode="relaxed")
    assert whole.cache.policy == STAGES["3"].policy.with_(mode="relaxed") and STAGES["3"].policy.mode is None
    assert StageRun(m, STAGES["0"], TokenOptions(vocab=True)).cache is None  # eager: nothing to capture
    tuned = StageRun(m, STAGES["3"], TokenOptions(vocab=True), policy=STAGES["3"].policy.with_(warmup=0))
    assert tuned.cache.policy.warmup == 0 and STAGES["3"].policy.warmup == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        STAGES["3"].policy.warmup = 2  # type: ignore[misc]
    whole.activate()
    for pos in (1000, 1001):  # warm, then capture
        whole.token(pos)
    (key,) = whole.cache.entries
    assert key.site == ("token", -1, 1) and key.decisions == () and key.generation == m.generation


# ----------------------------------------------------------------------------- ds4's decode islands
def _island_run(sim, name, cfg=TINY):
    from ds4lab.experiments.stage_run import StageRun

    m = DecodeModel(cfg, sim, TokenOptions(vocab=True))
    return m, StageRun(m, STAGES[name], TokenOptions(vocab=True), mode="thread_local")


@pytest.mark.parametrize("name", ["i", "i+"])
def test_islands_are_exact_and_captured_as_ds4_does(sim, name):
    """Stage i (ds4 e50104f6) and i+ (36ee8c14) against stage 0, token by token: first sight of each
    (layer, island) eager, the second captured, later ones replayed; island 1 never captured on the
    hash-routed layers; global capture on a blocking stream whatever the run's mode; i+ sets the
    attention span's kernel nodes before every replay."""
    from ds4lab.experiments.stage_run import Span, StageRun, first_difference

    m, run = _island_run(sim, name)
    ref = StageRun(m, STAGES["0"], TokenOptions(vocab=True)).record(Span(100, 4))
    got = run.record(Span(100, 4))
    assert first_difference(ref, got) is None
    st, L = run.stats(), TINY.n_layers
    islands = L + (L - TINY.n_hash_layers) + (L if name == "i+" else 0)
    assert st["captures"] == islands  # token 1 eager, token 2 captures
    # token 2 launches each new graph once (the capture executed nothing: ds4 launches the exec right
    # after instantiating it), tokens 3 and 4 replay
    assert st["replays"] == 3 * islands
    assert st["retirements"] == 0 and st["fallbacks"] == 0
    keys = {(k.cluster, k.layer) for k in run.cache.entries}
    assert not any(c == "island1" and TINY.is_hash_layer(layer) for c, layer in keys)
    assert run.mode == "global" and run.cache.capture_stream is not None
    assert (st["node_updates"] > 0) == (name == "i+")


def test_islands_drop_every_graph_when_a_buffer_is_reallocated(sim):
    """ds4 9f325617: scratch growth synchronizes, invalidates every decode graph, then frees; the next
    sights capture again, and the tokens stay exact."""
    from ds4lab.experiments.stage_run import Span, StageRun, first_difference

    m, run = _island_run(sim, "i")
    run.record(Span(100, 3))
    before = run.stats()["captures"]
    m.generation += 1  # what a reallocation does (MoeScratch/TopkScratch._alloc)
    got = run.record(Span(100, 4))
    st = run.stats()
    assert st["invalidations"] >= before and st["captures"] > before
    ref = StageRun(m, STAGES["0"], TokenOptions(vocab=True)).record(Span(100, 4))
    assert first_difference(ref, got) is None


@pytest.mark.slow
def test_island_ladder_and_context_on_sim_small(tmp_path):
    """The issue's CI runs: `ladder --backend sim --preset small --stages 0,i,3` and `context --backend
    sim --preset small --stages 0,i,3,3c`, every stage exact (few tokens: exactness, not timing)."""
    from ds4lab.jobs.context import ContextConfig

    df = execute("ladder", LadderConfig(stages="0,i,3", preset="small", tokens=4, warmup=1, exact_tokens=3, rounds=1,
                                        out=tmp_path / "l"), backend="sim").table()
    assert list(df.stage) == ["0", "i", "3"] and (df.exact == True).all()  # noqa: E712
    cf = execute("context", ContextConfig(stages="0,i,3,3c", preset="small", contexts="600", tokens=3, warmup=1,
                                          out=str(tmp_path / "c")), backend="sim").table()
    assert set(cf.stage) == {"0", "i", "3", "3c"} and (cf.exact == True).all()  # noqa: E712


def test_gains_are_paired_per_token_against_stage_0(tmp_path):
    """Each stage's gain over stage 0: token k of the stage paired with token k of stage 0 (same position,
    same round), median and 95 % interval; stage 0 against itself is not measurable."""
    df = execute("ladder", LadderConfig(stages="0,3", preset="tiny", tokens=12, warmup=1, exact_tokens=0, rounds=2,
                                        out=tmp_path), backend="sim").table()
    g = df.set_index("stage")
    assert not g.loc["0", "gain_measurable"] and g.loc["0", "gain_us"] == 0
    assert g.loc["3", "gain_measurable"] and g.loc["3", "gain_lo"] <= g.loc["3", "gain_us"] <= g.loc["3", "gain_hi"]
    # the sim's modeled tokens are alike within a stage: the paired gain is the difference of the medians
    assert g.loc["3", "gain_us"] == pytest.approx(g.loc["0", "us_median"] - g.loc["3", "us_median"])


def test_the_context_floor_bounds_every_stage_whichever_stage_ran_last(tmp_path):
    """The busy floor is taken over the timed positions with the ladder's base options: a stage list
    ending on 3c (whose worst-case grids cost more) does not lend stage 3 its floor."""
    from ds4lab.jobs.context import ContextConfig

    df = execute("context", ContextConfig(stages="0,3,3c", preset="tiny", contexts="64,512", tokens=4, span=4,
                                          out=str(tmp_path)), backend="sim").table()
    assert (df.efficiency <= 1 + 1e-9).all(), df[["stage", "context", "us_median", "floor_us"]]


def _stop_at_call(monkeypatch, method: str, n: int) -> None:
    """Ctrl-C during the ``n``-th call of ``StageRun.<method>`` (``record``: an exactness run, ``time``: a
    stage timed in a round)."""
    from ds4lab.experiments.stage_run import StageRun

    real, calls = getattr(StageRun, method), []

    def stopping(self, *a, **k):
        calls.append(self.name)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(StageRun, method, stopping)


def test_a_ladder_stopped_during_exactness_keeps_the_verdicts_so_far(tmp_path, monkeypatch):
    """Stopped after stage 0's exactness check (the reference, then stage 0, recorded; stopped while
    recording stage 0s): the folder keeps that verdict and names what is still to do."""
    import json

    import pandas as pd

    _stop_at_call(monkeypatch, "record", 3)
    with pytest.raises(KeyboardInterrupt):
        execute("ladder", LadderConfig(stages="0,0s,3", preset="tiny", tokens=4, warmup=1, exact_tokens=2, rounds=2,
                                       out=tmp_path), backend="sim")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["status"] == "interrupted" and meta["files"] == ["ladder.partial.csv"]
    assert "exactness checked for 1 of 3 stages" in meta["progress"]
    d = pd.read_csv(tmp_path / "ladder.partial.csv", dtype={"stage": str}).set_index("stage")
    assert list(d.index) == ["0", "0s", "3"] and (d.rounds_timed == 0).all() and d.us_median.isna().all()
    assert d.loc["0", "exact"] == True and d.loc["0", "state"] == "exactness checked; not timed yet"  # noqa: E712
    assert d.loc[["0s", "3"], "exact"].isna().all()
    assert (d.loc[["0s", "3"], "state"] == "exactness not checked yet; not timed yet").all()


def test_a_ladder_stopped_between_rounds_keeps_each_stage_over_its_own_rounds(tmp_path, monkeypatch):
    """Stopped in round 2 of 2 (odd rounds run in reverse: stage 3 timed again, stopped while timing
    stage 0): nothing is written as a finished row (no ladder.csv), and ladder.partial.csv holds every
    stage over the rounds it finished, its gain over the round it shares with stage 0."""
    import json

    import pandas as pd

    _stop_at_call(monkeypatch, "time", 4)
    with pytest.raises(KeyboardInterrupt):
        execute("ladder", LadderConfig(stages="0,3", preset="tiny", tokens=8, warmup=1, exact_tokens=2, rounds=2,
                                       out=tmp_path), backend="sim")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["status"] == "interrupted" and meta["files"] == ["ladder.partial.csv"]
    assert "stages timed in 1 to 2 of 2 rounds" in meta["progress"]
    d = pd.read_csv(tmp_path / "ladder.partial.csv", dtype={"stage": str}).set_index("stage")
    assert d.rounds_timed.to_dict() == {"0": 1, "3": 2} and d.n.to_dict() == {"0": 4, "3": 8}
    assert (d.exact == True).all() and (d.rounds == 2).all()  # noqa: E712
    assert d.loc["0", "state"] == "partial: timed in 1 of 2 rounds"
    assert d.loc["3", "state"] == "timed in all 2 rounds; ×, gain over the 1 round(s) stage 0 was timed in too"
    # the sim's modeled tokens are alike within a stage: the gain is the difference of the medians
    assert d.loc["3", "gain_us"] == pytest.approx(d.loc["0", "us_median"] - d.loc["3", "us_median"])
    assert d.loc["3", "speedup"] == pytest.approx(d.loc["0", "us_median"] / d.loc["3", "us_median"])


def test_a_context_run_stopped_at_its_second_context_keeps_the_first_as_finished(tmp_path, monkeypatch):
    """context.csv holds the finished contexts with a finished run's columns; the context in progress
    is in context.partial.csv."""
    import json

    import pandas as pd

    from ds4lab.jobs.context import ContextConfig

    full = execute("context", ContextConfig(stages="0,3", preset="tiny", contexts="64,128", tokens=4, span=4,
                                            warmup=1, out=str(tmp_path / "full")), backend="sim").table()
    assert not (tmp_path / "full" / "context.partial.csv").exists()
    _stop_at_call(monkeypatch, "time", 3)  # context 128, stage 0
    with pytest.raises(KeyboardInterrupt):
        execute("context", ContextConfig(stages="0,3", preset="tiny", contexts="64,128", tokens=4, span=4, warmup=1,
                                         out=str(tmp_path / "c")), backend="sim")
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["status"] == "interrupted" and meta["files"] == ["context.csv", "context.partial.csv"]
    assert meta["progress"].startswith("context.csv: context 64 finished; context.partial.csv: context 128")
    done = pd.read_csv(tmp_path / "c" / "context.csv", dtype={"stage": str})
    assert list(done.columns) == list(full.columns) and done.context.tolist() == [64, 64]
    assert done.us_median.tolist() == full[full.context == 64].us_median.tolist()
    d = pd.read_csv(tmp_path / "c" / "context.partial.csv", dtype={"stage": str})
    assert d.context.tolist() == [128, 128] and d.rounds_timed.tolist() == [0, 0]
    assert (d.exact == True).all() and (d.state == "exactness checked; not timed yet").all()  # noqa: E712


def test_launch_counts_per_token_keep_their_fraction():
    """A stage where one token in four ran eagerly has 0.75 graph launches per token: the line says
    0.75, not 1 (what :.0f printed)."""
    from ds4lab.jobs.ladder import per_token

    assert [per_token(x) for x in (24.0, 0.75, 1.0, 81.6875, 0.0)] == ["24", "0.75", "1", "81.69", "0"]
