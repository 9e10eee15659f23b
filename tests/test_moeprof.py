"""The routed-MoE profiler (``ds4lab.moeprof``) on the ``sim`` backend (CPU only, ``tiny``, few steps).

* every mode gives rows with ds4's stages and positive modeled times (nvtx: ranges, NaN times);
* in-graph stamps hold the modeled start time of each stamp kernel, eagerly and replayed;
* the capture guard refuses host-timed profiling while the stream captures (an invalidated capture
  too) before any synchronize, leaving the capture as it was; with ``fallback`` it times in-graph;
* the routing patterns change the expert counts and tiles the sort builds;
* ds4's stderr line round-trips.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from ds4lab import moeprof as M
from ds4lab.trace import live as traces
from ds4lab.trace.live import SimTimeline
from ds4lab.trace.sources.ds4log import parse_ds4_line
from ds4lab.token.config import get_preset
from ds4lab.errors import RuntimeApiError
from ds4lab.sim import SimBackend

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def wb():
    """A computing sim workbench (numbers and modeled times) on ``tiny``."""
    return M.MoeWorkbench(SimBackend(seed=TINY.seed), TINY, max_tokens=16)


@pytest.fixture(scope="module")
def wb_five():
    """A computing sim workbench on ``tiny`` with ds4lab's five-launch MoE (4-bit blocks): the path whose
    stage kernels take a stamp, so profiling points fold into them."""
    cfg = get_preset("tiny", expert_format="q4blk")
    return M.MoeWorkbench(SimBackend(seed=cfg.seed), cfg, max_tokens=16)


@pytest.fixture(scope="module")
def wb_fast():
    """A timing-only sim workbench (no numbers: fast)."""
    return M.MoeWorkbench(SimBackend(seed=TINY.seed, timing_only=True), TINY, max_tokens=16)


# ----------------------------------------------------------------------------- every mode
@pytest.mark.parametrize("timing_only", [False, True])
@pytest.mark.parametrize("mode", M.MODES)
@pytest.mark.parametrize("T", [1, 3])
def test_mode_rows_have_stages_and_positive_modeled_ms(wb, wb_fast, mode, T, timing_only, graphs_restored):
    w = wb_fast if timing_only else wb
    df = M.profile(w, mode, T, "uniform", steps=2)
    assert list(df.columns) == list(M.ROW_COLUMNS)
    layers = w.model.n_layers
    assert set(df["layer"]) == set(range(layers)) and set(df["token"]) == {0, 1}
    assert (df["backend"] == "sim").all() and df["modeled"].all() and (df["tokens"] == T).all()
    assert (df["pairs"] == T * TINY.n_used).all() and (df["mode"] == mode).all()
    calls = df.groupby(["token", "layer"])
    assert calls.ngroups == 2 * layers
    if mode == "nvtx":
        assert df["ms"].isna().all()
        assert df["note"].str.contains("no timing").all()
        return
    if mode == "graph-boundary":
        assert set(df["stage"]) == {"total"}
        assert (df["phase"] == "replay").all()
    else:
        assert all(list(g["stage"]) == list(M.STAGES) for _, g in calls)
        if mode == "in-graph":
            assert (df["phase"] == "replay").all()
    ms = df["ms"].to_numpy(dtype=float)
    assert np.isfinite(ms).all(), df[~np.isfinite(ms)]
    # At 1 token the sort stage is empty (ds4: no sort for decode), and on ds4's path the sum too (fused
    # into down): 0 ms from kernel records, exactly 0 from points folded into one kernel's stamp.
    empty = ["sort", "sum"] if w.model.cfg.moe_path == "ds4" else ["sort"]
    if T > 1:
        assert (ms > 0).all()
    else:
        e = df["stage"].isin(empty)
        assert (df[~e]["ms"] > 0).all() and (df[e]["ms"] >= 0).all()
    tot = df[df["stage"] == "total"]["ms"].to_numpy()
    if mode in ("host-timed", "deferred"):  # ds4's total is the sum of the six stages
        parts = df[df["stage"].isin(M.MOE_STAGES)].groupby(["token", "layer"])["ms"].sum().to_numpy()
        assert np.allclose(parts, tot)
    summ = M.summarize(df)
    assert {"median_ms", "p25_ms", "p75_ms", "iqr_ms", "n"} <= set(summ.columns)
    assert (summ["iqr_ms"] >= 0).all() and (summ["n"] > 0).all()


def test_in_graph_stamps_are_the_modeled_kernel_start_times(wb_five, graphs_restored):
    """Each slot holds the modeled device time at which the kernel that wrote it started: a stage
    kernel for a folded point, the stamp kernel for the others (two per call at two tokens: the
    point before the counts clear, and the end), eagerly and replayed."""
    wb = wb_five
    be = wb.be
    carriers = {"stamp_time", "xq_quantize", "moe_gateup_tiled", "moe_midq", "moe_down_tiled", "moe_sum"}
    for regime, phase in (("eager", "eager"), ("replayed", "replay")):
        tl = SimTimeline(be)
        df = M.profile(wb, "in-graph", 2, "worst", steps=1, regime=regime)
        assert (df["phase"] == phase).all()
        every = tl.take()
        recs = [r for r in every if r.name in carriers]
        prof = wb.last_profiler
        slots = np.asarray(be.to_host(prof.impl.slots), dtype=np.float64) / 1e3
        used = sorted(prof.impl.slot_of.values())
        got = np.concatenate([slots[b:b + 7] for b in used])
        starts = np.array([r.start_ns / 1e3 for r in recs])  # µs, as the slots above
        assert all(np.isclose(starts, v, atol=1e-6).any() for v in got), (regime, got)
        names = [r.name for r in every]
        assert names.count("stamp_time") == 2 * names.count("xq_quantize"), regime  # per MoE call


@pytest.mark.parametrize("path", ["five", "ds4"])
def test_folded_stamps_at_one_token_leave_one_stamp_node(wb, wb_five, path, graphs_restored, monkeypatch):
    """At one token on the five-launch path every point but the end folds into a stage kernel: one
    stamp kernel per call, the empty sort stage reads exactly 0, and fold=False puts back a stamp kernel
    at each point. ds4's kernels take no stamp: a stamp kernel at each point, folding or not."""
    from ds4lab.moeprof.modes.in_graph import InGraph

    wb, xq, empty = (wb_five, "xq_quantize", ["sort"]) if path == "five" else (wb, "xq_quantize_q8k", ["sort", "sum"])
    be = wb.be
    for fold, per_call in ((True, 1 if path == "five" else 7), (False, 7)):
        monkeypatch.setattr(InGraph, "FOLD", fold)
        tl = SimTimeline(be)
        df = M.profile(wb, "in-graph", 1, "uniform", steps=1, regime="eager")
        names = [r.name for r in tl.take()]
        assert names.count(xq) > 0
        assert names.count("stamp_time") == per_call * names.count(xq), fold  # per MoE call
        sort = df[df["stage"] == "sort"]["ms"].to_numpy(dtype=float)
        assert (sort == 0).all() if per_call == 1 else (sort > 0).all()
        assert (df[~df["stage"].isin(empty)]["ms"] > 0).all()


def test_deferred_reads_after_the_token_with_distinct_events(wb, graphs_restored, monkeypatch):
    be, m = wb.be, wb.model
    calls = []
    monkeypatch.setattr(be, "event_synchronize", lambda e, f=be.event_synchronize: (calls.append(e), f(e))[1])
    prof = M.MoeProfiler(m, "deferred", routing="uniform")
    with wb.session(), prof.attached():
        prof.begin_step(0)
        for layer in range(m.n_layers):
            wb.prepare(layer, 2, "uniform")
            wb.moe_call(layer, 2)
        assert calls == [] and len(prof._pending) == m.n_layers  # nothing synchronized mid-token
        events = [id(e) for c in prof._pending for e in c.probe.events]
        assert len(set(events)) == 7 * m.n_layers  # every call its own 7 events
        rows = prof.end_step()
    assert calls and len(rows) == 7 * m.n_layers
    assert all(np.isfinite(r["ms"]) and r["ms"] >= 0 for r in rows)


def test_host_timed_matches_the_models_own_profile_log(wb, graphs_restored):
    m = wb.model
    n0 = len(m.moe_profile_log)
    df = M.profile(wb, "host-timed", 2, "zipf", steps=1, warmup=0)
    log = m.moe_profile_log[n0:]
    assert len(log) == m.n_layers
    for entry, (_, g) in zip(log, df.groupby("layer")):
        ms = dict(zip(g["stage"], g["ms"]))
        assert all(ms[s] == pytest.approx(entry[s]) for s in M.STAGES)


# ----------------------------------------------------------------------------- the guard
def _captured_moe_call(wb, prof, mode="thread_local", invalidate=False, layer=1, T=2):
    be = wb.be
    s = wb.stream
    wb.prepare(layer, T, "uniform")
    be.begin_capture(s, mode)
    if invalidate:
        with pytest.raises(RuntimeApiError, match="cudaErrorStreamCaptureUnsupported"):
            be.stream_query(s)  # rule stream_query_capturing: refused, and the capture is invalidated
        assert be.capture_status(s) == "invalidated"
    status, err = None, None
    try:
        wb.moe_call(layer, T)
    except RuntimeApiError as e:
        err = e
    status = be.capture_status(s)
    try:
        g, end_err = be.end_capture(s), None
    except RuntimeApiError as e:
        g, end_err = None, e
    return err, status, g, end_err


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_guard_refuses_host_timed_during_capture_and_leaves_it_intact(wb_fast, mode, graphs_restored, monkeypatch):
    be = wb_fast.be
    syncs = []
    monkeypatch.setattr(be, "event_synchronize", lambda e, f=be.event_synchronize: (syncs.append(e), f(e))[1])
    prof = M.MoeProfiler(wb_fast.model, "host-timed")
    with wb_fast.session(), prof.attached():
        err, status, g, end_err = _captured_moe_call(wb_fast, prof, mode)
    assert isinstance(err, M.ProfilerCaptureError) and err.name == M.ProfilerCaptureError.NAME
    for alt in ("deferred", "in-graph", "graph-boundary", "cupti", "fallback"):
        assert alt in str(err)
    assert syncs == []  # refused before any event synchronize
    assert status == "active" and end_err is None and g is not None  # the capture is intact
    assert prof.errors[-1]["status_after"] == "active"


def test_guard_treats_an_invalidated_capture_as_capturing(wb_fast, graphs_restored, monkeypatch):
    be = wb_fast.be
    syncs = []
    monkeypatch.setattr(be, "event_synchronize", lambda e, f=be.event_synchronize: (syncs.append(e), f(e))[1])
    prof = M.MoeProfiler(wb_fast.model, "host-timed")
    with wb_fast.session(), prof.attached():
        err, status, g, end_err = _captured_moe_call(wb_fast, prof, invalidate=True)
    assert isinstance(err, M.ProfilerCaptureError) and err.status == "invalidated"
    assert syncs == [] and status == "invalidated"
    assert end_err is not None and end_err.name == "cudaErrorStreamCaptureInvalidated"  # the query's doing, not ours


def test_unguarded_host_timed_breaks_the_capture_as_on_the_h200(wb_fast, graphs_restored):
    prof = M.MoeProfiler(wb_fast.model, "host-timed", guard=False)
    with wb_fast.session(), prof.attached():
        err, status, g, end_err = _captured_moe_call(wb_fast, prof)
    assert err.name == "cudaErrorCapturedEvent" and status == "invalidated"
    assert end_err.name == "cudaErrorStreamCaptureInvalidated" and g is None


@pytest.mark.parametrize("fallback", [True, "deferred"])
def test_guard_fallback_inside_a_manual_capture(wb_fast, fallback, graphs_restored):
    prof = M.MoeProfiler(wb_fast.model, "host-timed", fallback=fallback)
    with wb_fast.session(), prof.attached(), pytest.warns(RuntimeWarning, match="host-timed refused"):
        err, status, g, end_err = _captured_moe_call(wb_fast, prof)
        rows = prof.read()
    assert err is None and status == "active" and end_err is None and g is not None
    assert rows and all(r["phase"] == "capture" and "timed" in r["note"] for r in rows)
    assert all(math.isnan(r["ms"]) for r in rows)  # captured, not run: nothing to report yet, and it says so


def test_guard_fallback_in_graph_times_the_replays(wb, graphs_restored):
    with pytest.warns(RuntimeWarning, match="in-graph"):
        df = M.profile(wb, "host-timed", 2, "uniform", steps=2, regime="replayed", fallback=True)
    cache = wb.last_cache
    assert cache.stats.captures == wb.model.n_layers and not cache.stats.failures and not cache.retired()
    assert (df["phase"] == "replay").all() and df["note"].str.contains("in-graph").all()
    assert np.isfinite(df["ms"]).all() and (df["ms"] > 0).all()


def test_guarded_host_timed_under_graph_cache_falls_back_to_eager(wb_fast, graphs_restored):
    df = M.profile(wb_fast, "host-timed", 2, "uniform", steps=2, regime="replayed")
    cache = wb_fast.last_cache
    assert dict(cache.stats.failures) == {M.ProfilerCaptureError.NAME: wb_fast.model.n_layers}
    assert cache.stats.replays == 0 and (df["phase"] == "eager").all() and np.isfinite(df["ms"]).all()


# ----------------------------------------------------------------------------- routing
@pytest.fixture(scope="module")
def wb64():
    cfg = TINY.replace(n_experts=64)
    return M.MoeWorkbench(SimBackend(seed=cfg.seed), cfg, max_tokens=16)


def test_routing_patterns_change_the_sort_and_tiles(wb64, graphs_restored):
    T, k = 16, wb64.cfg.n_used
    load = {r: wb64.expert_load(0 if r == "hash" else 1, T, r) for r in M.ROUTINGS}
    for r, d in load.items():
        assert d["pairs"] == T * k and d["counts_match"], d  # the device counted what was written
    w = load["worst"]
    assert w["experts_hit"] == k and w["max_load"] == T  # all pairs on k experts
    assert w["n_tiles"] == k * -(-T // 8)
    assert load["uniform"]["experts_hit"] > load["zipf"]["experts_hit"] > k
    assert load["zipf"]["max_load"] > load["uniform"]["max_load"]
    assert load["uniform"]["n_tiles"] > w["n_tiles"]


def test_injected_routing_is_written_on_the_device_over_the_router(wb64, graphs_restored):
    m, be = wb64.model, wb64.be
    with wb64.session():
        wb64.prepare(1, 3, "worst")
        ids = np.asarray(be.to_host(m.moe_buf.ids))[:3]
        wts = np.asarray(be.to_host(m.moe_buf.wts))[:3]
    assert (ids == wb64.worst_experts).all()
    assert np.allclose(wts.sum(axis=1), 1.0, atol=1e-6)
    for T in (1, 3, 16):
        ids, w = wb64.pattern("uniform", T)
        assert ids.shape == (T, wb64.cfg.n_used) and all(len(set(r)) == len(r) for r in ids)


def test_hash_routing_runs_only_on_hash_layers(wb, graphs_restored):
    assert wb.layers_for("hash") == list(range(TINY.n_hash_layers))
    df = M.profile(wb, "deferred", 2, "hash", steps=1)
    assert set(df["layer"]) == set(range(TINY.n_hash_layers))
    with pytest.raises(ValueError, match="hash-routed"):
        wb.layers_for("hash", layers=[2])
    with pytest.raises(ValueError, match="unknown routing"):
        wb.layers_for("random")


# ----------------------------------------------------------------------------- ds4's line
def test_ds4_line_round_trips():
    ms = {"xq": 0.0123, "sort": 0.0456, "gateup": 0.0191, "midq": 0.0026, "down": 0.0088, "sum": 0.0025}
    line = M.format_ds4_line(3, ms)
    assert line == ("ds4: CUDA MoE profile tokens=3 pairs=18 xq=0.012 sort=0.046 gateup=0.019 midq=0.003 "
                    "down=0.009 sum=0.003 total=0.091 ms")
    d = parse_ds4_line("stderr noise " + line)
    assert d["tokens"] == 3 and d["pairs"] == 18
    assert all(d[s] == pytest.approx(ms[s], abs=5e-4) for s in ms)
    assert d["total"] == pytest.approx(sum(ms.values()), abs=5e-4)
    assert M.format_ds4_line(d["tokens"], d, pairs=d["pairs"]) == line  # and back, exactly
    assert parse_ds4_line("ds4: something else") is None
    assert "nan" in M.format_ds4_line(1, {"xq": 1.0})


def test_ds4_lines_from_a_profile_and_read_back(wb_fast, graphs_restored, tmp_path):
    df = M.profile(wb_fast, "deferred", 2, "uniform", steps=2)
    lines = M.ds4_lines(df)
    assert len(lines) == 2 * wb_fast.model.n_layers
    (tmp_path / "ds4.log").write_text("\n".join(["unrelated"] + lines) + "\n")
    back = M.profile_rows(tmp_path / "ds4.log", n_layers=wb_fast.model.n_layers)
    assert list(back.columns) == list(M.ROW_COLUMNS) and len(back) == len(df)
    a = df.set_index(["token", "layer", "stage"])["ms"]
    b = back.set_index(["token", "layer", "stage"])["ms"]
    assert np.allclose(a.loc[b.index].to_numpy(), b.to_numpy(), atol=5e-4)


# ----------------------------------------------------------------------------- whole tokens, overhead
def test_token_share_and_overhead_table(wb_fast, graphs_restored):
    share = M.token_share(wb_fast, tokens=2, warmup=1)
    assert len(share) == 2 and ((share["share"] > 0) & (share["share"] < 1)).all()
    assert np.allclose(share["moe_us"] + share["rest_us"], share["token_us"])
    ov = M.overhead_table(wb_fast, modes=("host-timed", "deferred", "in-graph", "nvtx"), tokens=2, warmup=2)
    assert set(ov["regime"]) == {"eager", "replayed"} and len(ov) == 2 * 5
    eager = ov[ov["regime"] == "eager"].set_index("mode")
    assert eager.loc["host-timed", "overhead_us"] > 0 and eager.loc["in-graph", "overhead_us"] > 0
    rep = ov[ov["regime"] == "replayed"].set_index("mode")
    assert "eager fallback" in rep.loc["host-timed", "note"]  # the guard refused the capture
    assert rep.loc["host-timed", "overhead_us"] > rep.loc["in-graph", "overhead_us"]
    # what the sim does not price is said so, never a measured "not measurable (±0.0)"
    for regime, mode in (("eager", "nvtx"), ("replayed", "nvtx"), ("replayed", "deferred")):
        row = ov[(ov["regime"] == regime) & (ov["mode"] == mode)].iloc[0]
        assert row["overhead"] == M.NOT_MODELED and "the sim does not price" in row["note"], (regime, mode)
        assert np.isnan(row["overhead_us"]) and row["pairs"] == 0
    assert eager.loc["deferred", "overhead"] != M.NOT_MODELED  # its eager cost is modeled
    assert "CI" not in eager.loc["host-timed", "overhead"]  # a deterministic sim: no interval to show
    assert "the same in every pair" in eager.loc["host-timed", "overhead"]


def test_what_the_sim_prices_is_declared_per_mode():
    from ds4lab.moeprof.modes import MODE_CLASSES

    assert MODE_CLASSES["cupti"].sim_prices == () and MODE_CLASSES["nvtx"].sim_prices == ()
    assert MODE_CLASSES["deferred"].sim_prices == ("eager",)
    for name, cls in MODE_CLASSES.items():
        assert set(cls.sim_prices) <= {"eager", "replayed"}
        assert cls.sim_leaves_out or set(cls.sim_prices) == {"eager", "replayed"}, name


# ----------------------------------------------------------------------------- availability, errors
def test_cupti_unavailable_reports_the_reason(monkeypatch):
    class FakeGpu:  # a GPU backend as the contract describes it: no modeled timeline
        is_gpu, measures_time, models_time, name = True, True, False, "cupy"

        def trace_records(self, since=0):
            return None

    monkeypatch.setattr(traces, "cupti_available", lambda: (False, "cupti-python not importable (test)"))
    t = M.trace_source(FakeGpu())
    assert not t.available and "cupti-python" in t.reason
    assert t.take() == []
    assert M.globaltimer_resolution(SimBackend(timing_only=True)) is None


def test_kernel_stage_map():
    assert M.kernel_stage("xq_quantize") == "xq"
    assert {M.kernel_stage(k) for k in ("moe_count", "moe_prefix", "moe_scatter", "moe_tiles", "memset")} == {"sort"}
    assert M.kernel_stage("moe_gateup_tiled") == M.kernel_stage("moe_gateup_decode") == "gateup"
    assert M.kernel_stage("moe_down_tiled") == "down" and M.kernel_stage("moe_midq") == "midq"
    assert M.kernel_stage("moe_sum") == "sum"
    assert M.kernel_stage("router_topk") is None and M.kernel_stage("stamp_time") is None


def test_bad_arguments_are_named(wb_fast):
    with pytest.raises(ValueError, match="profiling mode"):
        M.MoeProfiler(wb_fast.model, "perf")
    with pytest.raises(ValueError, match="fallback"):
        M.MoeProfiler(wb_fast.model, "host-timed", fallback="cupti")
    with pytest.raises(ValueError, match="tokens=99"):
        next(M.iter_profile(wb_fast, "deferred", 99, "uniform", 1))
    from ds4lab.executor.numpy_backend import NumpyBackend

    with pytest.raises(ValueError, match="no timing claims"):
        M.MoeWorkbench(NumpyBackend(), TINY)


# ----------------------------------------------------------------------------- the command
def test_moe_command_writes_rows_meta_and_figures(tmp_path, graphs_restored):
    import click

    from ds4lab.cli.moe import register

    @click.group()
    def main():
        pass

    register(main)
    out = tmp_path / "moe"
    r = CliRunner().invoke(main, ["moe", "--backend", "sim", "--preset", "tiny", "--tokens-per-step", "1,2",
                                  "--routing", "uniform,hash", "--steps", "1", "--share-tokens", "1",
                                  "--no-overhead", "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "moe.csv")
    assert list(df.columns) == list(M.ROW_COLUMNS)
    assert set(df["mode"]) == set(M.MODES) and set(df["tokens"]) == {1, 2}
    import json

    meta = json.loads((out / "meta.json").read_text())
    assert meta["modeled"] is True and meta["status"] == "complete" and meta["backend"] == "sim"
    for stem in ("moe-stages", "moe-distribution", "moe-share"):
        for ext in ("png", "svg", "pdf"):
            assert (out / f"{stem}.{ext}").stat().st_size > 0
    # one ds4-format log per (mode, routing), its header naming both and the provenance
    pairs = [(m, r) for m in M.STAGE_MODES if m in set(df["mode"]) for r in sorted(set(df["routing"]))]
    assert sorted(p.name for p in out.glob("moe-ds4*.log")) == sorted(f"moe-ds4-{m}-{r}.log" for m, r in pairs)
    for m, r in pairs:
        log = (out / f"moe-ds4-{m}-{r}.log").read_text().splitlines()
        assert log[0].startswith(f"# ds4lab moe · mode={m} · routing={r} · MODELED"), log[0]
        assert len(log) > 1 and all(ln.startswith("ds4: CUDA MoE profile tokens=") for ln in log[1:])
    assert "exclusion" in main.commands


def test_ds4_lines_are_read_by_ds4lab_ingest(wb_fast, tmp_path, graphs_restored):
    """The log ``ds4lab moe`` writes (``moe-ds4.log``) is what ``ds4lab ingest`` reads as a ds4 log."""
    from ds4lab.jobs import ingest

    df = M.profile(wb_fast, "deferred", 3, "uniform", steps=1)
    p = tmp_path / "moe-ds4.log"
    p.write_text("\n".join(M.ds4_lines(df)) + "\n")
    res = ingest.ingest(p)
    got = res.tables["ds4_moe"]
    assert len(got) == len(df) and set(got["tokens"]) == {3} and set(got["pairs"]) == {18}


def test_profiler_attaches_through_the_model_hook_and_leaves_no_trace():
    """attach sets ``moe_observer`` (nothing of the model is replaced), a second profiler is
    refused, and detach restores the model's options and profiling events."""
    from ds4lab.token.config import get_preset
    from ds4lab.sim.backend import SimBackend

    wb = M.MoeWorkbench(SimBackend(timing_only=True), get_preset("tiny"), max_tokens=2, n_layers=1)
    m = wb.model
    opts, events = m.opts, m.profile_events
    p = M.MoeProfiler(m, "deferred")
    with p.attached():
        assert m.moe_observer is p
        assert "routed_moe" not in vars(m) and "event_record" not in vars(m.L)
        with pytest.raises(RuntimeError, match="another routed-MoE profiler"):
            M.MoeProfiler(m, "in-graph").attach()
    assert m.moe_observer is None and m.opts == opts and m.profile_events == events
