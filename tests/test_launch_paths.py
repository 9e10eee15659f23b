"""CPU tests of the launch-path pieces the kernels rely on: op-owned scratch, the Q8_0 matvec
geometry, the NVTX annotator's cached fast path, and the per-op roofline arithmetic."""

from __future__ import annotations

import sys
import types

import numpy as np
import pandas as pd
import pytest

from ds4lab.capture import annotate
from ds4lab.token import ops
from ds4lab.executor.numpy_backend import NumpyBackend
from ds4lab.measure.bench import SUMMARY_KEYS, summary
from ds4lab.token.config import get_preset
from ds4lab.capture.launch import Launcher
from ds4lab.measure.perop import SITE_COLUMNS, site_table, token_summary
from ds4lab.timing import Stats


@pytest.fixture
def L():
    return Launcher(NumpyBackend(seed=1))


def test_scratch_is_allocated_once_and_zeroed(L):
    a = L.scratch("k", (8,), np.int32)
    assert a.shape == (8,) and a.dtype == np.int32 and not a.any()
    a[3] = 5
    assert L.scratch("k", (8,), np.int32) is a
    with pytest.raises(ValueError, match="scratch 'k'"):
        L.scratch("k", (9,), np.int32)


def test_alloc_scratch_covers_attention(L):
    cfg = get_preset("ds4-flash")
    ops.alloc_scratch(L, cfg)
    n = len(L._scratch)
    part_o, part_ml, counter = ops.attention_scratch(L, cfg)
    assert len(L._scratch) == n  # nothing new: build time allocated all of it
    NS = ops.attention_splits(cfg)
    assert NS == 8 and part_o.size == cfg.n_heads * NS * cfg.head_dim and part_ml.size == cfg.n_heads * NS * 2
    assert counter.size == cfg.n_heads // ops.ATTN_HPB and not counter.any()


@pytest.mark.parametrize("preset", ["tiny", "small", "ds4-flash"])
def test_q8_launch_covers_every_row(preset):
    cfg = get_preset(preset)
    shapes = [(cfg.q_lora, cfg.embed, None), (cfg.q_dim, cfg.q_lora, None), (cfg.head_dim, cfg.embed, None),
              (cfg.out_groups * cfg.out_lora, cfg.group_in, cfg.out_lora),
              (cfg.embed, cfg.out_groups * cfg.out_lora, None), (2 * cfg.expert_ffn, cfg.embed, None),
              (cfg.embed, cfg.expert_ffn, None), (cfg.vocab, cfg.embed, None)]
    for rows, cols, rpg in shapes:
        g = ops.q8_launch(-(-rows // ops.Q8_ROWS), cols, rpg)
        (blocks,), (tpr, groups) = g.grid, g.block
        assert tpr * groups == 256 and tpr in (32, 64, 128, 256)
        assert tpr == 32 or tpr <= cols // 16  # never more threads than 16-byte chunks in a row
        per = groups * ops.Q8_ROWS
        assert blocks * per >= rows > (blocks - 1) * per  # every row, no empty block
        if g.smx:  # x staged: it fits, and a block's rows never straddle two x groups
            assert g.shared == cols * ops.Q8_SMEM_PER_COL <= ops.Q8_SMEM_MAX
            assert rpg is None or rpg % per == 0
        else:
            assert g.shared == 0


def test_q8_launch_fills_the_gpu_at_ds4_flash():
    for rows, cols in [(1024, 4096), (512, 4096), (32768, 1024), (8192, 4096), (4096, 8192), (4096, 2048)]:
        g = ops.q8_launch(rows // ops.Q8_ROWS, cols)
        assert g.grid[0] >= min(ops.FILL_BLOCKS, rows // ops.Q8_ROWS), (rows, cols, g.grid)
        assert g.smx == (g.block[1] * ops.Q8_ROWS >= ops.Q8_STAGE_ROWS)


def _kernel_define(path: str, name: str) -> int:
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "kernels" / path).read_text()
    return int(re.search(rf"#define {name} (\d+)", src).group(1))


def test_launch_constants_match_the_kernels():
    """The geometry in ops.py assumes the kernels' compile-time constants."""
    assert ops.Q8_ROWS == _kernel_define("q8.cuh", "Q8_NR")
    assert ops.MOE_GU_RPW == _kernel_define("moe.cu", "MOE_GU_RPW")
    assert ops.MOE_DN_RPW == _kernel_define("moe.cu", "MOE_DN_RPW")
    assert ops.ATTN_HPB == _kernel_define("attention.cu", "ATTN_HPB")
    assert ops.ATTN_NS == _kernel_define("attention.cu", "ATTN_NS")
    assert ops.HC_MIX_SPLIT == _kernel_define("dense.cu", "HC_MIX_SPLIT")


@pytest.mark.parametrize("preset", ["tiny", "small", "ds4-flash"])
def test_attention_launch_fits_shared_memory(preset):
    cfg = get_preset(preset)
    grid, kc, shared = ops.attention_launch(cfg)
    assert grid == (-(-cfg.n_heads // ops.ATTN_HPB), ops.ATTN_NS)
    assert 1 <= kc <= -(-cfg.window // ops.ATTN_NS) and shared <= ops.ATTN_SMEM
    if preset == "ds4-flash":
        assert kc == 16  # a split's 16 keys staged at once


class _FakeDomain:
    def __init__(self, enabled):
        self.calls = 0
        if enabled:
            self.handle = object()

    def get_category_id(self, name):
        return hash(name) % 97

    def get_event_attributes(self, **kw):
        self.calls += 1
        return ("attrs", kw["message"], kw["payload"]) if hasattr(self, "handle") else None


def _fake_nvtx(monkeypatch, enabled):
    dom = _FakeDomain(enabled)
    log = []
    lib = types.SimpleNamespace(push_range=lambda a, h: log.append(("push", a, h)),
                                pop_range=lambda h: log.append(("pop", h)))
    mod = types.ModuleType("nvtx")
    mod.get_domain = lambda name: dom
    libpkg = types.ModuleType("nvtx._lib")
    libpkg.lib = lib
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    monkeypatch.setitem(sys.modules, "nvtx._lib", libpkg)
    return dom, log


def test_nvtx_annotator_caches_attributes_and_calls_the_module_functions(monkeypatch):
    dom, log = _fake_nvtx(monkeypatch, enabled=True)
    a = annotate.NvtxAnnotator()
    assert a.recording
    for _ in range(3):
        a.push("q_a", "query", 5)
        a.pop()
    assert dom.calls == 1  # built once, reused
    assert log[0] == ("push", ("attrs", "q_a", 5), dom.handle) and log[1] == ("pop", dom.handle)
    assert len(log) == 6


def test_nvtx_annotator_disabled_domain_builds_nothing_twice(monkeypatch):
    dom, log = _fake_nvtx(monkeypatch, enabled=False)
    a = annotate.NvtxAnnotator()
    assert not a.recording
    for _ in range(3):
        a.push("q_a", "query", 5)
        a.pop()
    assert dom.calls == 1  # a None attribute is cached too (it used to be rebuilt on every push)
    assert log == []


def _launches():
    rows = []
    for layer in range(2):
        rows.append({"cluster": "query", "layer": layer, "site": "q_a", "kernel": "q8_matvec",
                     "nbytes": 4_000_000, "us": 2.0, "us_p25": 1.9, "us_p75": 2.1})
        rows.append({"cluster": "attention", "layer": layer, "site": "attention", "kernel": "attention_decode",
                     "nbytes": 400_000, "us": 5.0, "us_p25": 4.0, "us_p75": 6.0})
    return pd.DataFrame(rows)


def test_site_table_roofline_arithmetic():
    t = site_table(_launches(), copy_GBps=4000.0)
    assert list(t.columns) == list(SITE_COLUMNS)
    assert list(t["site"]) == ["attention", "q_a"]  # sorted by time lost
    q = t[t.site == "q_a"].iloc[0]
    assert q.launches == 2 and q.bytes == 8_000_000 and q.us == pytest.approx(4.0)
    assert q.GBps == pytest.approx(2000.0) and q.copy_fraction == pytest.approx(0.5)
    assert q.floor_us == pytest.approx(2.0) and q.lost_us == pytest.approx(2.0)


def test_token_summary():
    s = token_summary(_launches(), copy_GBps=4000.0)
    assert s["token_busy_us"] == pytest.approx(14.0) and s["token_bytes"] == 8_800_000
    assert s["bytes_floor_us"] == pytest.approx(2.2) and s["busy_over_floor"] == pytest.approx(14.0 / 2.2)
    assert s["launches"] == 4


def test_bench_summary_fields():
    st = Stats.of([1.0, 2.0, 3.0])
    names = ["cupy RawKernel (bare)", "ds4lab launcher, override stream", "ds4lab launcher, NVTX on",
             "ds4lab launcher, NVTX off"]
    lo = {n: {"host_us": Stats.of([5.0 + i])} for i, n in enumerate(names)}
    mb = {"copy_GBps": st, "fraction_of_copy": 0.6}
    s = summary(lo, mb, {"token_busy_us": 4000.0, "bytes_floor_us": 2500.0, "busy_over_floor": 1.6})
    assert set(SUMMARY_KEYS) <= set(s)
    assert s["launch_us_bare"] == 5.0 and s["launch_us_override"] == 6.0 and s["launch_us_nvtx"] == 7.0
    assert s["copy_GBps"] == 2.0 and s["moe_decode_copy_fraction"] == 0.6 and s["token_busy_us"] == 4000.0
    assert summary(lo, mb, None)["token_busy_us"] is None
