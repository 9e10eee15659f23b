"""Model configurations: the ds4-flash shape, the reduced presets, and every ConfigError path.

Every error test asserts that the message names the offending field *and* value, which is
what :class:`ds4lab.token.config.ConfigError` promises.
"""

from __future__ import annotations

import dataclasses

import pytest

from ds4lab.token.config import MAX_EXPERTS, PRESETS, Q8_0_BLOCK, Q8_K_BLOCK, ConfigError, ModelConfig, get_preset

# The DeepSeek V4 Flash shape as fixed in ds4 (shared/context/ds4-decode.md, "Model shape").
DS4_FLASH = dict(
    n_layers=43, embed=4096, n_heads=64, head_dim=512, n_kv_heads=1, value_dim=512, rope_dims=64,
    q_lora=1024, out_groups=8, out_lora=1024, n_experts=256, n_used=6, n_shared=1,
    expert_ffn=2048, n_hash_layers=3, window=128, hc_streams=4, vocab=129280,
)


def test_presets_exist():
    assert {"ds4-flash", "small", "tiny"} <= set(PRESETS)
    for name, cfg in PRESETS.items():
        assert cfg.name == name
        assert get_preset(name) is cfg


@pytest.mark.parametrize("field,value", sorted(DS4_FLASH.items()))
def test_ds4_flash_dimensions(field, value):
    assert getattr(get_preset("ds4-flash"), field) == value


def test_ds4_flash_derived_sizes():
    cfg = get_preset("ds4-flash")
    assert cfg.q_dim == 64 * 512
    assert cfg.group_in == (64 // 8) * 512
    assert cfg.n_routed_banks == 1
    assert cfg.replace(per_layer_experts=True).n_routed_banks == 43
    assert [cfg.is_hash_layer(layer) for layer in range(5)] == [True, True, True, False, False]


def test_tiny_exercises_hash_topk_and_ring_wrap():
    cfg = get_preset("tiny")
    assert 0 < cfg.n_hash_layers < cfg.n_layers  # both router kinds are exercised
    assert cfg.window < cfg.max_tokens  # positions past the window wrap the ring buffer


def test_unknown_preset_lists_known():
    with pytest.raises(ConfigError) as e:
        get_preset("ds5-huge")
    msg = str(e.value)
    assert "'ds5-huge'" in msg
    for name in PRESETS:
        assert name in msg


def test_override_applies_and_validates():
    cfg = get_preset("tiny", n_layers=5, window=16)
    assert (cfg.n_layers, cfg.window) == (5, 16)
    assert cfg.embed == PRESETS["tiny"].embed
    # The preset itself is untouched.
    assert PRESETS["tiny"].n_layers == 3


def test_unknown_override_field_named():
    with pytest.raises(ConfigError, match="n_lairs"):
        get_preset("tiny", n_lairs=4)
    with pytest.raises(ConfigError, match="bogus"):
        get_preset("tiny").replace(bogus=1)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


# ----------------------------------------------------------------------------- every error path
# (override, strings the message must contain). Each override breaks exactly one constraint of
# the otherwise valid tiny preset.
BAD = [
    # positive integers
    (dict(n_layers=0), ["n_layers=0"]),
    (dict(embed=-256), ["embed=-256"]),
    (dict(vocab=0), ["vocab=0"]),
    (dict(max_tokens=0), ["max_tokens=0"]),
    (dict(window=2.0), ["window=2.0"]),
    (dict(n_used=True), ["n_used=True"]),
    # block divisibility: the field and the value are named
    (dict(embed=300), ["embed=300", str(Q8_K_BLOCK)]),
    (dict(embed=288), ["embed=288", str(Q8_K_BLOCK)]),  # a multiple of 32 but not of 256
    (dict(q_lora=48), ["q_lora=48", str(Q8_0_BLOCK)]),
    (dict(expert_ffn=320), ["expert_ffn=320", str(Q8_K_BLOCK)]),
    (dict(head_dim=48, value_dim=48), ["head_dim=48", "64"]),  # float2 lanes of the attention kernel
    (dict(out_lora=3, out_groups=2), ["out_groups*out_lora=6", str(Q8_0_BLOCK)]),
    (dict(n_heads=2, out_groups=2, head_dim=16, value_dim=16, rope_dims=16),
     ["group input", "=16 ", str(Q8_0_BLOCK)]),
    # rope
    (dict(rope_dims=15), ["rope_dims=15"]),
    (dict(rope_dims=66), ["rope_dims=66", "head_dim=64"]),
    # experts
    (dict(n_used=17), ["n_used=17", "n_experts=16"]),
    (dict(n_used=33, n_experts=64), ["n_used=33", "32"]),
    (dict(n_experts=MAX_EXPERTS + 1), [f"n_experts={MAX_EXPERTS + 1}", str(MAX_EXPERTS)]),
    (dict(n_shared=2), ["n_shared=2"]),
    (dict(n_shared=0), ["n_shared=0"]),
    # attention
    (dict(n_kv_heads=2), ["n_kv_heads=2"]),
    (dict(n_kv_heads=0), ["n_kv_heads=0"]),
    (dict(value_dim=128), ["value_dim=128", "head_dim=64"]),
    (dict(window=1025), ["window=1025", "1024"]),
    (dict(head_dim=2048, value_dim=2048), ["head_dim=2048"]),
    (dict(embed=65536 + 256), [f"embed={65536 + 256}"]),
    # streams, hash layers, swiglu
    (dict(hc_streams=9), ["hc_streams=9", "8"]),
    (dict(n_hash_layers=4), ["n_hash_layers=4", "n_layers=3"]),
    (dict(n_hash_layers=-1), ["n_hash_layers=-1"]),
    (dict(swiglu_limit=0.0), ["swiglu_limit=0.0"]),
    (dict(swiglu_limit=-1.0), ["swiglu_limit=-1.0"]),
    (dict(swiglu_limit=float("nan")), ["swiglu_limit=nan"]),
]


@pytest.mark.parametrize("override,needles", BAD, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o, _ in BAD])
def test_config_error_names_bad_value(override, needles):
    with pytest.raises(ConfigError) as e:
        get_preset("tiny", **override)
    msg = str(e.value)
    assert msg.startswith("tiny:"), msg  # the configuration is named too
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def test_direct_construction_validates():
    base = {f.name: getattr(PRESETS["tiny"], f.name) for f in dataclasses.fields(ModelConfig)
            if f.name not in ("extra", "value_dim")}
    ModelConfig(**base)  # valid
    with pytest.raises(ConfigError, match="n_used=20"):
        ModelConfig(**{**base, "name": "direct", "n_used": 20})


def test_value_dim_defaults_to_head_dim():
    base = {f.name: getattr(PRESETS["tiny"], f.name) for f in dataclasses.fields(ModelConfig)
            if f.name not in ("extra", "value_dim")}
    cfg = ModelConfig(**{**base, "head_dim": 128})
    assert cfg.value_dim == 128


def test_n_hash_layers_bounds_accepted():
    assert get_preset("tiny", n_hash_layers=0).n_hash_layers == 0
    assert get_preset("tiny", n_hash_layers=3).n_hash_layers == 3


def test_summary_flat_and_complete():
    s = get_preset("ds4-flash").summary()
    assert "extra" not in s
    for k, v in DS4_FLASH.items():
        assert s[k] == v


def test_head_dim_override_moves_value_dim():
    cfg = get_preset("tiny", head_dim=128)
    assert cfg.head_dim == 128 and cfg.value_dim == 128


def test_heads_not_multiple_of_groups_names_values():
    with pytest.raises(ConfigError) as e:
        get_preset("tiny", n_heads=6, out_groups=4)
    assert "n_heads=6" in str(e.value) and "out_groups=4" in str(e.value)


@pytest.mark.parametrize("field,value", [("rope_theta", 0.0), ("rms_eps", -1.0), ("rms_eps", float("nan")),
                                         ("swiglu_limit", float("inf")), ("seed", -1), ("seed", 2**32),
                                         ("seed", "x")])
def test_numeric_fields_are_checked(field, value):
    from ds4lab.token.config import ConfigError, get_preset

    with pytest.raises(ConfigError, match=field):
        get_preset("tiny", **{field: value})
