"""The synthetic model ds4 opens (ds4lab.ds4): declaration, writer, and ds4's own loader on the CPU."""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil

import numpy as np
import pytest

from ds4lab.ds4 import gguf_writer
from ds4lab.ds4.gguf_model import (SPECIAL_TOKENS, MetaKV, ds4_metadata, ds4_tensors, layer_compress_ratio,
                                   plan_totals, synthetic_vocab)
from ds4lab.ds4.gguf_writer import (read_marker, tensor_bytes, write_gguf, write_synthetic_model)
from ds4lab.errors import BadInput
from ds4lab.token.config import get_preset

gguf = pytest.importorskip("gguf")

GiB = 2**30


def _by_layer(specs):
    out: dict = {}
    for s in specs:
        out.setdefault(s.layer, {})[s.role] = s
    return out


# ----------------------------------------------------------------------------- the declaration
BASE_ROLES = {
    "hc_attn_fn.weight", "hc_attn_scale.weight", "hc_attn_base.weight", "attn_norm.weight", "attn_q_a.weight",
    "attn_q_a_norm.weight", "attn_q_b.weight", "attn_kv.weight", "attn_kv_a_norm.weight", "attn_sinks.weight",
    "attn_output_a.weight", "attn_output_b.weight", "hc_ffn_fn.weight", "hc_ffn_scale.weight",
    "hc_ffn_base.weight", "ffn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
    "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"}
COMPRESSOR = {f"attn_compressor_{k}.weight" for k in ("ape", "kv", "gate", "norm")}
INDEXER = {"indexer.attn_q_b.weight", "indexer.proj.weight"} | {
    f"indexer_compressor_{k}.weight" for k in ("ape", "kv", "gate", "norm")}


def test_flash_tensor_sets_follow_ds4lab_census():
    """Per layer: the base set; compressor tensors exactly on ds4lab's compressed layers (ratio 4 or
    128), the indexer exactly on ratio-4 layers, the hash table exactly on the hash layers (which
    carry no router bias); shapes from ds4lab's ds4-flash dimensions."""
    cfg = get_preset("ds4-flash")
    specs = ds4_tensors("ds4-flash")
    layers = _by_layer(specs)
    assert set(layers[None]) == {"token_embd.weight", "output_hc_base.weight", "output_hc_fn.weight",
                                 "output_hc_scale.weight", "output_norm.weight", "output.weight"}
    assert sorted(k for k in layers if k is not None) == list(range(cfg.n_layers))
    lc = cfg.replace(long_context=True)
    for il in range(cfg.n_layers):
        roles = set(layers[il])
        ratio = lc.compress_ratio(il)
        want = set(BASE_ROLES)
        want |= COMPRESSOR if ratio else set()
        want |= INDEXER if ratio == 4 else set()
        want |= {"ffn_gate_tid2eid.weight"} if cfg.is_hash_layer(il) else {"exp_probs_b.bias"}
        assert roles == want, il
        assert layer_compress_ratio(cfg, il) == ratio == (0 if il < 2 else 4 if il % 2 == 0 else 128)
        t = layers[il]
        assert t["attn_q_a.weight"].shape == (cfg.embed, cfg.q_lora)
        assert t["attn_q_b.weight"].shape == (cfg.q_lora, cfg.n_heads * cfg.head_dim)
        assert t["attn_output_a.weight"].shape == (cfg.group_in, cfg.out_groups * cfg.out_lora)
        assert t["hc_attn_fn.weight"].shape == (cfg.hc_streams * cfg.embed, 2 * cfg.hc_streams + cfg.hc_streams**2)
        assert t["ffn_gate_exps.weight"].shape == (cfg.embed, cfg.expert_ffn, cfg.n_experts)
        assert t["ffn_down_exps.weight"].shape == (cfg.expert_ffn, cfg.embed, cfg.n_experts)
        assert (t["ffn_gate_exps.weight"].ggml_type, t["ffn_down_exps.weight"].ggml_type) == ("IQ2_XXS", "Q2_K")
        if ratio:
            assert t["attn_compressor_ape.weight"].shape == ((2 if ratio == 4 else 1) * cfg.head_dim, ratio)
        if ratio == 4:
            assert t["indexer.attn_q_b.weight"].shape == (cfg.q_lora, cfg.index_q_dim)
        if cfg.is_hash_layer(il):
            assert t["ffn_gate_tid2eid.weight"].shape == (cfg.n_used, cfg.vocab)
            assert t["ffn_gate_tid2eid.weight"].ggml_type == "I32"
    assert len(specs) == 1328
    # ds4's smallest Flash file is ~81 GB (shared/ds4/README.md); ds4 reports 284.33 B parameters.
    tot = plan_totals(specs)
    assert 80.5 * GiB < tot["tensor_bytes"] < 81 * GiB
    assert sum(s.n_elements for s in specs) == pytest.approx(284.33e9, rel=1e-4)


def test_fills_experts_holes_path_deciding_random():
    specs = ds4_tensors("ds4-flash")
    for s in specs:
        if s.init == "experts":
            assert s.fill == "hole"
        elif s.ggml_type != "Q8_0":
            assert s.fill == "random", s.name  # norms, router, biases, HC, embedding, hash tables, sinks
    holes = ds4_tensors("ds4-flash", dense="holes")
    assert {s.fill for s in holes if s.ggml_type == "Q8_0"} == {"hole"}
    assert plan_totals(specs)["random_bytes"] == pytest.approx(8.197 * GiB, rel=1e-3)
    assert plan_totals(holes)["random_bytes"] == pytest.approx(2.051 * GiB, rel=1e-3)


def test_flash_metadata_is_ds4s_shape():
    meta = {kv.key: kv for kv in ds4_metadata("ds4-flash")}
    v = {k: kv.value for k, kv in meta.items()}
    assert v["general.architecture"] == "deepseek4" and list(meta)[0] == "general.architecture"
    expect = {"block_count": 43, "embedding_length": 4096, "vocab_size": 129280, "attention.head_count": 64,
              "attention.head_count_kv": 1, "attention.key_length": 512, "attention.value_length": 512,
              "rope.dimension_count": 64, "attention.q_lora_rank": 1024, "attention.output_lora_rank": 1024,
              "attention.output_group_count": 8, "expert_count": 256, "expert_used_count": 6,
              "expert_feed_forward_length": 2048, "expert_shared_count": 1, "hash_layer_count": 3,
              "attention.sliding_window": 128, "attention.indexer.head_count": 64,
              "attention.indexer.key_length": 128, "attention.indexer.top_k": 512, "hyper_connection.count": 4,
              "hyper_connection.sinkhorn_iterations": 20}
    for k, want in expect.items():
        assert v["deepseek4." + k] == want and meta["deepseek4." + k].vtype == "UINT32", k
    assert v["deepseek4.attention.compress_ratios"] == [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)]
    assert v["deepseek4.swiglu_clamp_exp"] == [10.0] * 43
    assert v["deepseek4.expert_weights_scale"] == 1.5 and v["deepseek4.expert_weights_norm"] is True
    assert v["deepseek4.rope.freq_base"] == 10000.0 and v["deepseek4.attention.compress_rope_freq_base"] == 160000.0
    assert "deepseek4.expert_group_count" not in v  # ds4 wants 0 or absent
    assert v["general.alignment"] == 32


def test_synthetic_vocab_is_a_consistent_bpe():
    tokens, merges = synthetic_vocab(129280)
    assert len(tokens) == len(set(tokens)) == 129280
    assert set(SPECIAL_TOKENS) <= set(tokens) and tokens[:2] == SPECIAL_TOKENS[:2]
    ids = {t: i for i, t in enumerate(tokens)}
    for m in merges[::997] + merges[-3:]:
        a, b = m.split(" ")
        assert a in ids and b in ids and a + b in ids
    assert len(merges) == 129280 - 256 - len(SPECIAL_TOKENS)
    with pytest.raises(BadInput, match="vocab=100"):
        synthetic_vocab(100)


def test_bad_inputs_are_named():
    with pytest.raises(BadInput, match="unknown preset 'nope'"):
        ds4_tensors("nope")
    with pytest.raises(BadInput, match="expert_format='q4blk'"):
        ds4_tensors("ds4-flash-q4blk")
    with pytest.raises(BadInput, match="dense='x'"):
        ds4_tensors("small", dense="x")
    with pytest.raises(BadInput, match="seed=-1"):
        ds4_metadata("small", seed=-1)


# ----------------------------------------------------------------------------- the writer
def test_small_round_trips_through_gguf_reader(tmp_path):
    path = tmp_path / "small.gguf"
    seen = []
    m = write_synthetic_model(path, preset="small", seed=7, progress=lambda *a: seen.append(a))
    specs = ds4_tensors("small")
    meta = ds4_metadata("small", seed=7)
    r = gguf.GGUFReader(path)
    assert [t.name for t in r.tensors] == [s.name for s in specs]
    for t, s in zip(r.tensors, specs):
        assert t.tensor_type.name == s.ggml_type and tuple(int(d) for d in t.shape) == s.shape
        assert int(t.n_bytes) == s.nbytes and int(t.data_offset) % 32 == 0
    for kv in meta:
        f = r.fields[kv.key]
        got = f.contents()
        if kv.vtype == "FLOAT32":
            assert got == pytest.approx(kv.value)
        elif kv.vtype == "ARRAY" and isinstance(kv.value[0], float):
            assert got == pytest.approx(kv.value)
        else:
            assert got == kv.value, kv.key
    assert m.n_tensors == len(specs) and m.preset == "small" and m.seed == 7
    assert m.apparent_bytes == os.stat(path).st_size
    assert seen and seen[-1][1] == seen[-1][2] == plan_totals(specs)["random_bytes"]
    assert m.metadata_sha256 and m.data_offset == int(r.tensors[0].data_offset)

    # data: random tensors are what tensor_bytes makes, finite; holes read as zeros
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    for t, s in zip(r.tensors, specs):
        off, n = int(t.data_offset), s.nbytes
        if s.fill == "hole":
            assert not raw[off:off + min(n, 1 << 16)].any()
            continue
        if s.nbytes <= 1 << 22:
            want = b"".join(b for _, b in tensor_bytes(s, 7, n_experts=64))
            assert raw[off:off + n].tobytes() == want, s.name
        if s.ggml_type in ("F16", "F32"):
            v = np.asarray(t.data, dtype=np.float32)
            assert np.isfinite(v).all() and np.abs(v).max() < 60000, s.name
        if s.ggml_type == "Q8_0":
            d = raw[off:off + n].reshape(-1, 34)[:, :2].copy().view("<f2").astype(np.float32)
            assert np.isfinite(d).all() and (d > 6.1e-5).all()  # a normal fp16 scale, not zero
        if s.init == "tid2eid":
            ids = np.asarray(t.data).reshape(-1, s.shape[0])
            assert ids.min() >= 0 and ids.max() < 64
            assert (np.diff(np.sort(ids, axis=1), axis=1) > 0).all()  # six distinct experts per token


def test_file_is_sparse(tmp_path):
    m = write_synthetic_model(tmp_path / "small.gguf", preset="small")
    st = os.stat(m.path)
    tot = plan_totals(ds4_tensors("small"))
    assert st.st_size == m.apparent_bytes > m.data_offset + tot["tensor_bytes"] - 1
    assert m.allocated_bytes == st.st_blocks * 512
    # holes take no disk: what is allocated is what was written, to the next blocks
    assert st.st_blocks * 512 < m.written_bytes + (4 << 20) < st.st_size - tot["hole_bytes"] // 2
    # written: the metadata (up to the aligned data offset) and the random tensors' bytes
    assert m.data_offset - 32 < m.written_bytes - tot["random_bytes"] <= m.data_offset


def test_routing_is_not_degenerate_on_embeddings(tmp_path):
    """With every attention and shared-expert weight zero (``dense="holes"``) the residual stream of
    a token is its embedding (HC streams stay equal copies), so each top-k layer routes
    ``ffn_norm(embedding)``: different tokens must pick different experts, with no tie at the 6th."""
    path = tmp_path / "h.gguf"
    write_synthetic_model(path, preset="small", dense="holes", seed=3)
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    cfg = get_preset("small")
    emb = np.asarray(t["token_embd.weight"].data, dtype=np.float32)  # [vocab, embed]
    il = cfg.n_hash_layers  # first top-k layer
    x = emb  # every token
    x = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * np.asarray(t[f"blk.{il}.ffn_norm.weight"].data)
    w = np.asarray(t[f"blk.{il}.ffn_gate_inp.weight"].data, dtype=np.float32)  # [experts, embed]
    logits = x @ w.T
    probs = np.sqrt(np.logaddexp(0, logits))  # DeepSeek V4's sqrt-softplus score
    sel = probs + np.asarray(t[f"blk.{il}.exp_probs_b.bias"].data)
    order = np.sort(sel, axis=1)[:, ::-1]
    assert np.isfinite(logits).all()
    assert (order[:, cfg.n_used - 1] > order[:, cfg.n_used]).all()  # no tie deciding the 6th expert
    chosen = {tuple(sorted(np.argsort(-row)[:cfg.n_used])) for row in sel}
    assert len(chosen) > 0.9 * len(sel)
    assert len({e for c in chosen for e in c}) == cfg.n_experts  # every expert gets tokens


def test_refuses_a_file_ds4lab_did_not_write(tmp_path):
    foreign = tmp_path / "model.gguf"
    foreign.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    with pytest.raises(BadInput, match="not written by ds4lab"):
        write_synthetic_model(foreign, preset="tiny")
    assert foreign.read_bytes()[:4] == b"GGUF" and foreign.stat().st_size == 72
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(BadInput, match="text.gguf"):
        write_synthetic_model(tmp_path / "text.gguf", preset="tiny")
    with pytest.raises(BadInput, match="is a directory"):
        write_synthetic_model(tmp_path, preset="tiny")
    with pytest.raises(BadInput, match="does not exist"):
        write_synthetic_model(tmp_path / "no" / "m.gguf", preset="tiny")
    # a file ds4lab wrote is replaced
    ours = tmp_path / "ours.gguf"
    a = write_synthetic_model(ours, preset="tiny", seed=1)
    assert read_marker(ours) == {"ds4lab.synthetic": read_marker(ours)["ds4lab.synthetic"], "ds4lab.preset": "tiny",
                                 "ds4lab.seed": 1, "ds4lab.dense": "random", "ds4lab.ds4_commit": "b0309611"}
    b = write_synthetic_model(ours, preset="tiny", seed=2)
    assert a.metadata_sha256 != b.metadata_sha256 and read_marker(ours)["ds4lab.seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "ours.gguf", "text.gguf"]


def test_no_half_written_file_on_error(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    old = write_synthetic_model(path, preset="tiny", seed=1)
    before = path.read_bytes()
    calls = {"n": 0}
    real = gguf_writer.tensor_bytes

    def failing(spec, seed, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device (simulated)")
        return real(spec, seed, **kw)

    monkeypatch.setattr(gguf_writer, "tensor_bytes", failing)
    with pytest.raises(OSError, match="simulated"):
        write_synthetic_model(path, preset="tiny", seed=2)
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no partial file beside it
    assert path.read_bytes() == before and read_marker(path)["ds4lab.seed"] == old.seed
    new = tmp_path / "new.gguf"
    with pytest.raises(OSError):
        calls["n"] = 0
        write_synthetic_model(new, preset="tiny")
    assert not new.exists() and [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_refuses_when_disk_is_too_small(tmp_path, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(gguf_writer.shutil, "disk_usage", lambda p: usage(10 << 30, 9 << 30, 1 << 30))
    msg = r"not enough free disk .* writes 8801[0-9]+ bytes \(8\.20 GiB.* 1073741824 bytes"
    with pytest.raises(BadInput, match=msg):
        write_synthetic_model(tmp_path / "f.gguf", preset="ds4-flash")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- ds4's own loader
def _all_holes(preset: str) -> list:
    return [dataclasses.replace(s, fill="hole") for s in ds4_tensors(preset)]


@pytest.mark.slow
def test_ds4_cpu_loader_opens_the_flash_file(tmp_path):
    """ds4's own loader (its CPU build, from the tarball in ../shared/ds4) opens the Flash-shaped file
    and refuses the same file with any one of its checks broken. Values do not matter to the loader,
    so the files here are all holes (a few MB written, 80.8 GiB apparent)."""
    from ds4lab.ds4.open_check import build_open_check, default_tarball, run_open_check

    if not default_tarball().is_file():
        pytest.skip(f"ds4's source tarball is not at {default_tarball()} (set DS4LAB_DS4_TARBALL)")
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler (gcc or cc) to build ds4's CPU loader")
    exe = build_open_check()
    meta = ds4_metadata("ds4-flash")
    path = tmp_path / "flash.gguf"
    try:
        write_gguf(path, _all_holes("ds4-flash"), meta, n_experts=256)
        ins = run_open_check(exe, path, "inspect", timeout=120)
        assert ins.rc == 0 and ins.opened, ins.stderr
        assert ins.info["layers"] == "43" and ins.info["routed_quant_bits"] == "2"
        assert ins.info["compress_ratios"].split(",") == [str(get_preset("ds4-flash").replace(
            long_context=True).compress_ratio(i)) for i in range(43)]
        cpu = run_open_check(exe, path, "cpu", timeout=120)  # adds vocab_load
        assert cpu.rc == 0 and cpu.opened and cpu.info["vocab"] == "129280", cpu.stderr

        def refused(specs, meta_, mode="inspect"):
            path.unlink()
            write_gguf(path, specs, meta_, n_experts=256)
            r = run_open_check(exe, path, mode, timeout=120)
            assert r.rc != 0 and not r.opened
            return r.refusal

        base = _all_holes("ds4-flash")
        assert refused([s for s in base if s.name != "blk.2.ffn_gate_tid2eid.weight"], meta) == \
            "ds4: required tensor is missing: blk.2.ffn_gate_tid2eid.weight"
        assert refused([dataclasses.replace(s, ggml_type="F32") if s.name == "blk.0.ffn_gate_inp.weight" else s
                        for s in base], meta) == "ds4: tensor blk.0.ffn_gate_inp.weight has type f32, expected f16"
        ratios = [0, 0, 128] + [4 if i % 2 == 0 else 128 for i in range(3, 43)]
        assert "compression ratio at layer 2" in refused(base, [
            dataclasses.replace(kv, value=ratios) if kv.key == "deepseek4.attention.compress_ratios" else kv
            for kv in meta])
        tokens = [t if t != "｜DSML｜" else "DSML" for t in synthetic_vocab(129280)[0]]
        assert refused(base, [MetaKV(kv.key, kv.vtype, tokens, kv.check) if kv.key == "tokenizer.ggml.tokens" else kv
                              for kv in meta], "cpu") == "ds4: required tokenizer token is missing: ｜DSML｜"
        small = tmp_path / "small.gguf"
        write_synthetic_model(small, preset="small", dense="holes")
        assert "unsupported DeepSeek4 shape: layers=8" in run_open_check(exe, small, "inspect", timeout=60).refusal
    finally:
        path.unlink(missing_ok=True)
