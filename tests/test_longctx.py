"""Long-context decode on the CPU: configuration, NumPy references, host decisions, the token.

The references are checked on hand-computable cases; the token's numpy and sim runs are checked
against each other and against the references composed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4lab import weights as W
from ds4lab.config import ConfigError, get_preset


# ----------------------------------------------------------------------------- configuration
def test_layer_rule_follows_ds4():
    cfg = get_preset("ds4-flash", long_context=True)
    ratios = [cfg.compress_ratio(layer) for layer in range(cfg.n_layers)]
    assert ratios[:6] == [0, 0, 4, 128, 4, 128]
    assert ratios[-1] == 4  # layer 42
    assert ratios.count(4) == 21 and ratios.count(128) == 20


def test_long_context_off_means_no_compression():
    cfg = get_preset("ds4-flash")
    assert not cfg.long_context
    assert all(cfg.compress_ratio(layer) == 0 for layer in range(cfg.n_layers))
    assert W.compress_specs(cfg, 2) == {}


@pytest.mark.parametrize("name", ["small", "tiny"])
def test_small_presets_same_structure(name):
    cfg = get_preset(name, long_context=True, n_layers=4)
    assert [cfg.compress_ratio(layer) for layer in range(4)] == [0, 0, 4, 128]
    flash = get_preset("ds4-flash")
    assert cfg.index_top_k < flash.index_top_k and cfg.index_head_dim <= flash.index_head_dim


def test_ds4_flash_long_context_dimensions():
    cfg = get_preset("ds4-flash", long_context=True)
    assert (cfg.index_heads, cfg.index_head_dim, cfg.index_top_k) == (64, 128, 512)
    assert cfg.compress_rope_theta == 160000.0
    assert cfg.max_context > 131072
    s = W.compress_specs(cfg, 2)
    assert (s["comp_kvgate"].rows, s["comp_kvgate"].cols) == (2 * 1024, 4096)  # kv + gate, 2 lanes of 512
    assert (s["index_comp_kvgate"].rows, s["index_q_b"].rows, s["index_q_b"].cols) == (2 * 256, 64 * 128, 1024)
    assert s["comp_ape"].cols == 4 * 1024
    s = W.compress_specs(cfg, 3)
    assert set(s) == {"comp_kvgate", "comp_ape", "comp_norm"}
    assert s["comp_kvgate"].rows == 2 * 512 and s["comp_ape"].cols == 128 * 512


def test_cache_layout_and_bytes():
    cfg = get_preset("ds4-flash", long_context=True, max_context=131072)
    lay = W.cache_layout(cfg, 2)
    assert lay["comp"] == (32768, 512) and lay["index"] == (32768, 128)
    assert lay["comp_state_kv"] == (8, 1024) and lay["index_state_kv"] == (8, 256)
    assert W.cache_layout(cfg, 3)["comp"] == (1024, 512)
    assert W.cache_layout(cfg, 3)["comp_state_kv"] == (128, 512)
    assert set(W.cache_layout(cfg, 0)) == {"kv"}
    total = W.cache_bytes(cfg)
    assert total == sum(4 * r * c for layer in range(43) for r, c in W.cache_layout(cfg, layer).values())
    assert 1.5e9 < total < 2.5e9  # 21 x (64 + 16) MiB + 20 x 2 MiB + windows
    off = W.cache_bytes(get_preset("ds4-flash"))
    assert off == 43 * 128 * 512 * 4


@pytest.mark.parametrize("override,needle", [
    ({"max_context": 1000}, "max_context=1000"),
    ({"max_context": 0}, "max_context=0"),
    ({"start_pos": 4096}, "start_pos=4096"),
    ({"start_pos": -1}, "start_pos=-1"),
    ({"index_top_k": 12}, "index_top_k=12"),
    ({"index_top_k": 1024}, "index_top_k=1024"),
    ({"index_head_dim": 48}, "index_head_dim=48"),
    ({"rope_dims": 48}, "rope_dims=48"),
    ({"compress_rope_theta": 0.0}, "compress_rope_theta"),
    ({"long_context": 1}, "long_context=1"),
])
def test_long_context_config_errors_name_the_value(override, needle):
    with pytest.raises(ConfigError) as e:
        get_preset("tiny", **override)
    assert needle in str(e.value) and str(e.value).startswith("tiny:")


def test_compress_ratio_layer_out_of_range():
    with pytest.raises(ConfigError, match="layer=3"):
        get_preset("tiny", long_context=True).compress_ratio(3)
