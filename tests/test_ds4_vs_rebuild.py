"""ds4 beside ds4lab (notebook 06): a ds4lab ds4 folder read, and each side-by-side table naming where
its figures came from. The ds4 folder is made here from the workers' table formats; ds4lab's side is
its measured H200 records in docs/measurements."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ds4lab.ds4 import vs_rebuild as C


@pytest.fixture
def record(tmp_path):
    meta = {"job": "ds4", "status": "complete", "ds4_commit": "b0309611", "gpu": "NVIDIA H200", "driver": "580.159.04"}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    census = [{"config": cfg, "context": 1024, "token": t, "launch_calls": n, "graph_launches": g, "kernels": 900,
               "kernels_in_graphs": 0 if g == 0 else 500, "busy_us": 5000.0, "span_us": 9000.0, "enqueue_us": e,
               "launch_call_us": 2.5}
              for cfg, n, g, e in (("islands-off", 900, 0, 2700.0), ("islands-on", 400, 80, 1500.0)) for t in range(3)]
    pd.DataFrame(census).to_csv(tmp_path / "census.csv", index=False)
    pd.DataFrame([{"context": 1024, "base": "islands-off", "other": "islands-on", "pairs": 24, "base_us": 6000.0,
                   "other_us": 5800.0, "gain_us": 200.0, "gain_lo": 150.0, "gain_hi": 240.0, "measurable": True,
                   "ratio": 6000 / 5800}]).to_csv(tmp_path / "gains.csv", index=False)
    pd.DataFrame([{"name": "moe_gate_up_mid_decode_lut_iq2", "per_token": 43, "us_per_token": 700.0},
                  {"name": "kernel_q8_0_matvec", "per_token": 300, "us_per_token": 2000.0},
                  {"name": "rms_norm_f32", "per_token": 200, "us_per_token": 300.0}]).to_csv(
        tmp_path / "kernels-islands-off-1024.csv", index=False)
    return C.read_ds4(tmp_path)


def test_read_ds4_refuses_other_folders(tmp_path):
    with pytest.raises(ValueError, match="not a ds4lab ds4 result folder"):
        C.read_ds4(tmp_path)


def test_census_table_sets_ds4s_counts_beside_ds4labs(record):
    t = C.census_table(record, contexts=(1024,))
    ds4 = t[t.engine == "ds4"].set_index("configuration")
    assert ds4.loc["islands-off", "kernel launches"] == 900 and ds4.loc["islands-on", "graph launches"] == 80
    assert "b0309611" in ds4.loc["islands-off", "source"] and "CUPTI, 3 tokens" in ds4.loc["islands-off", "source"]
    lab = t[t.engine == "ds4lab"]
    assert (lab["kernel launches"] > 0).all() and lab.source.str.len().gt(0).all()
    assert lab.configuration.str.contains("counted").any()


def test_host_table_gives_ds4s_span_per_launch_and_ds4labs_calibration(record):
    t = C.host_table(record).set_index("what")
    span = t.loc["host span to the last launch / launch calls, per token (CUPTI on)"]
    assert span["µs per launch"] == pytest.approx(3.0) and span.engine == "ds4 (C)"
    lab = t[t.engine == "ds4lab (Python)"].iloc[0]
    assert lab["µs per launch"] > 5 and "H200" in lab.source


def test_gain_table_names_a_measurable_gain_and_ds4labs_records(record):
    g = C.gain_table(record)
    ds4 = g[g.engine == "ds4"].iloc[0]
    assert ds4["gain µs (95 % CI)"] == "200 (150…240)" and ds4["× faster"] == pytest.approx(6000 / 5800)
    lab = g[g.engine == "ds4lab"]
    assert len(lab) >= 1 and lab["× faster"].gt(1).all() and lab.source.str.contains("docs/measurements").all()
    fig = C.gain_figure(g)
    assert fig is not None and "ds4 b0309611" in fig.axes[0].get_title()


def test_the_gain_figure_pairs_like_contexts_only(record):
    """ds4 at 1 024 pairs with ds4lab's context record at 1 024, never with its ladder at 1 000; a
    context one engine ran alone is named, not drawn (notebook 06's islands-gain.png)."""
    g = C.gain_table(record)
    pairs = dict(zip(g.engine + " @" + g.context.astype(str), g["pair"]))
    assert pairs["ds4 @1024"] == pairs["ds4lab @1024"] == "both engines"
    assert pairs["ds4lab @1000"] == "no pair: ds4 ran no 1000" and pairs["ds4lab @16384"].startswith("no pair")
    fig = C.gain_figure(g)
    drawn = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert sorted(drawn) == ["ds4 @1024", "ds4lab @1024"], drawn
    assert "no pair, not drawn: ds4lab @1000, ds4lab @16384" in fig.axes[0].get_title()


def test_a_capture_ladder_record_gives_ds4s_stage_i_gain_where_islands_on_did_not_run():
    """ds4's capture-ladder record (ds4 as shipped, stages 0, i, 3u: no islands-on configuration) pairs its stage i
    against stage 0 with ds4lab's, each gain the record's paired one with its interval (notebook 06 said "ds4 ran no
    1024" beside a table showing it)."""
    from pathlib import Path

    import pandas as pd

    folder = Path(__file__).parents[1] / "docs/measurements/h200-2026-12-04-ds4/ladder"
    gains = pd.read_csv(folder / "gains.csv")
    g = C.gain_table(C.read_ds4(folder))
    ds4 = g[g.engine == "ds4"].set_index("context")
    assert list(ds4.index) == [1024, 4096, 16384] and ds4.source.str.endswith("stage i against stage 0").all()
    want = gains[(gains.base == "stage-0") & (gains.other == "stage-i")].set_index("context")
    for ctx, r in want.iterrows():
        assert ds4.loc[ctx, "gain µs (95 % CI)"] == f"{r.gain_us:.0f} ({r.gain_lo:.0f}…{r.gain_hi:.0f})"
    assert ds4.loc[1024, "pair"] == "both engines"


def test_kernel_kinds_sum_ds4s_kernels_by_kind(record):
    k = C.kernel_kinds(record).set_index("kind")
    assert k.loc["routed MoE", "us"] == 700 and k.loc["matvec (Q8_0)", "launches"] == 300
    assert k.loc["norm / RoPE / hyper-connections", "us"] == 300


@pytest.mark.parametrize("name, kind", [("moe_down_q2k_sum", "routed MoE"), ("attn_score_split", "attention"),
                                        ("indexer_topk_1024", "compressor / indexer / top-k"),
                                        ("q8_0_matvec_f32", "matvec (Q8_0)"), ("something_else", "other")])
def test_kernel_kind(name, kind):
    assert C.kernel_kind(name) == kind


def test_compare_names_a_ds4_folder_instead_of_misreading_its_summary(tmp_path):
    from click.testing import CliRunner

    from ds4lab.cli import main

    run = tmp_path / "ds4-run"
    run.mkdir()
    (run / "meta.json").write_text('{"job": "ds4", "status": "complete"}')
    (run / "summary.csv").write_text("config,context,tokens,us_per_token,host_us,iqr_us\nislands-on,1024,4,1,1,0\n")
    r = CliRunner().invoke(main, ["compare", str(run), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "a ds4lab ds4 folder" in r.output and "06_ds4_itself" in r.output, r.output


def test_ladder_table_sets_ds4s_own_ladder_beside_the_rebuilds(record, tmp_path):
    """ds4's rungs from its ladder.csv (exact counts, the reference named), the rebuild's from its
    measured record, each row's source named; the figure has one bar series per engine and context."""
    pd.DataFrame([{"context": 1024, "stage": s, "us_per_token": us, "exact_tokens": ex, "compared_tokens": cmp}
                  for s, us, ex, cmp in (("shipped", 16465.0, float("nan"), float("nan")), ("0", 16312.0, 32, 32),
                                         ("i", 15683.0, 32, 32), ("3u", 20073.0, 31, 32))]).to_csv(
        tmp_path / "ladder.csv", index=False)
    rec = C.read_ds4(tmp_path)
    t = C.ladder_table(rec)
    ds4 = t[t.engine == "ds4"].set_index("stage")
    assert list(ds4.index) == ["shipped", "0", "i", "3u"] and ds4.loc["3u", "exact"] == "31 / 32"
    assert ds4.loc["shipped", "exact"] == "reference" and ds4.loc["0", "µs per token"] == 16312.0
    lab = t[t.engine == "ds4lab rebuild"]
    assert set(lab.stage) >= {"0", "i", "3"} and lab.source.str.contains("round3/islands").all()
    assert (ds4.source == rec.label).all()
    fig = C.ladder_figure(t)
    assert fig is not None and len(fig.axes[0].get_legend().get_texts()) == 2
    assert C.ladder_table(None).engine.eq("ds4lab rebuild").all() and C.ladder_figure(pd.DataFrame()) is None


def test_kind_census_and_omissions_read_ds4s_kernels_beside_the_rebuilds_per_op(tmp_path):
    """Per kind, ds4's recorded kernels against the rebuild's per-op record (its 1k token only); the
    omissions priced from ds4's kernels, a kernel serving two purposes by its share of launches."""
    ds4 = pd.DataFrame([{"name": "matmul_f16_pair_ordered_chunks_kernel(float*)", "per_token": 62, "us_per_token": 2145.0},
                        {"name": "quantize_q8_0_f32_kernel(signed char*)", "per_token": 216, "us_per_token": 278.0},
                        {"name": "rope_tail_kernel(float*)", "per_token": 86, "us_per_token": 100.0},
                        {"name": "router_select_warp_topk_kernel(int*)", "per_token": 43, "us_per_token": 256.0},
                        {"name": "moe_down_sum6_qwarp32_kernel(float*)", "per_token": 43, "us_per_token": 725.0}])
    per_op = tmp_path / "per_op.csv"
    pd.DataFrame([{"cluster": "router", "site": "router_topk", "kernel": "router_topk", "launches": 40, "us": 94.0},
                  {"cluster": "moe", "site": "down", "kernel": "moe_down_decode", "launches": 43, "us": 423.0}]).to_csv(
        per_op, index=False)
    kc = C.kind_census({1024: ds4, 16384: ds4}, lab_per_op=per_op).set_index(["context", "kind"])
    assert kc.loc[(1024, "router"), "ds4_us"] == 256.0 and kc.loc[(1024, "router"), "rebuild_us"] == 94.0
    assert kc.loc[(1024, "routed MoE"), "ds4_minus_rebuild_us"] == 725.0 - 423.0
    assert kc.loc[(1024, "f16 matmul (cuBLAS, ds4's f16 pair)"), "rebuild_us"] == 0.0
    assert kc.loc[(16384, "router"), "rebuild_us"] != kc.loc[(16384, "router"), "rebuild_us"]  # no record at 16k
    om = C.omissions({1024: ds4}).set_index("omitted in the rebuild")
    assert om.filter(like="compressor", axis=0).ds4_us.iloc[0] == 2145.0
    assert om.filter(like="activation quantization", axis=0).ds4_launches.iloc[0] == 216
    inv = om.filter(like="inverse RoPE", axis=0).iloc[0]
    assert inv.ds4_launches == 43 and inv.ds4_us == pytest.approx(100.0 * 43 / 86)
