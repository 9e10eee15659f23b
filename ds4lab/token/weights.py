"""Random weights from a seed, identical on every backend.

Each weight element is a pure function of ``(seed, tensor name, sub-tensor, element index)``
through a 32-bit integer hash (``mix32``, mirrored bit for bit in ``kernels/common.cuh``).
So the GPU fills its multi-gigabyte banks in place in milliseconds, and the NumPy reference
regenerates exactly the slices it needs (one layer, the six selected experts) without any
device-to-host copy. Weight formats (bytes per weight in :data:`ds4lab.token.config.BYTES_PER_WEIGHT`):

* ``q8_0``: ``qs`` int8 ``[..., rows, cols]`` in [-127, 127], ``d`` fp16 ``[..., rows, cols/32]``.
* ``q4``: ``qs`` uint8 ``[..., rows, cols/2]``; in each block of 32 values, byte ``j`` holds value
  ``j`` in its low nibble and value ``j+16`` in its high nibble, stored as ``v + 8``;
  ``d`` fp16 ``[..., rows, cols/32]``. 4.5 bits (0.5625 bytes) per weight.
* ``f32``: float32, ``offset + scale * U(-1, 1)``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .config import Q4_BLOCK, Q8_0_BLOCK, ModelConfig

_M1 = np.uint32(0x7FEB352D)
_M2 = np.uint32(0x846CA68B)
_GOLDEN = 0x9E3779B9
_SCALE_SALT = 0x5BD1E995
# Standard deviation of a uniform integer in [-127, 127] and in [-8, 7].
_Q8_STD = 73.6
_Q4_STD = 4.61


def mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit bijective integer hash (xorshift-multiply, "lowbias32"). uint32 in, uint32 out."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * _M1
        x = x ^ (x >> np.uint32(15))
        x = x * _M2
        x = x ^ (x >> np.uint32(16))
    return x


def mix32_int(x: int) -> int:
    """:func:`mix32` on one Python int (host-side key derivation)."""
    return int(mix32(np.uint32(x & 0xFFFFFFFF)))


def tensor_key(seed: int, name: str) -> int:
    """The 32-bit key of one named tensor under ``seed`` (passed to the init kernels)."""
    return mix32_int((seed * _GOLDEN + zlib.crc32(name.encode())) & 0xFFFFFFFF)


def sub_key(key: int, sub: np.ndarray | int) -> np.ndarray:
    """Key of sub-tensor ``sub`` (an expert of a bank) of a tensor with key ``key``."""
    with np.errstate(over="ignore"):
        return mix32(np.uint32(key) + np.asarray(sub, dtype=np.uint32) * np.uint32(_GOLDEN))


def element_hash(key: int, sub: int, idx: np.ndarray) -> np.ndarray:
    """uint32 hash of element ``idx`` (flat, uint32) of sub-tensor ``sub``."""
    return mix32(np.asarray(idx, dtype=np.uint32) ^ sub_key(key, sub))


def unit_float(h: np.ndarray) -> np.ndarray:
    """Uniform float32 in [0, 1) from the top 24 bits of ``h`` (exact in float32)."""
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


@dataclass
class QTensor:
    """A block-quantized matrix (or a stack of them), on any backend.

    Attributes:
        fmt: ``"q8_0"`` or ``"q4"``.
        rows, cols: the matrix shape (output rows × input columns).
        qs: quantized values (int8 ``[..., rows, cols]`` or packed uint8 ``[..., rows, cols/2]``).
        d: fp16 block scales ``[..., rows, cols/32]``.
    """

    fmt: str
    rows: int
    cols: int
    qs: Any
    d: Any

    @property
    def nbytes(self) -> int:
        """Bytes of ``qs`` plus ``d`` (all sub-tensors)."""
        return int(self.qs.nbytes + self.d.nbytes)

    def row_bytes(self) -> float:
        """Bytes one row of one sub-tensor occupies."""
        return self.cols * (1.0 if self.fmt == "q8_0" else 0.5) + self.cols / 32 * 2

    def __getitem__(self, i) -> "QTensor":
        """Sub-tensor ``i`` of a stack (an expert of a bank)."""
        return QTensor(self.fmt, self.rows, self.cols, self.qs[i], self.d[i])


def q8_base_scale(cols: int) -> np.float32:
    """Mean Q8_0 block scale that gives dequantized weights a std of about 1/sqrt(cols)."""
    return np.float32(1.0 / (_Q8_STD * np.sqrt(cols)))


def q4_base_scale(cols: int) -> np.float32:
    """Mean 4-bit block scale that gives dequantized weights a std of about 1/sqrt(cols)."""
    return np.float32(1.0 / (_Q4_STD * np.sqrt(cols)))


def _scales(key: int, sub: int, rows: int, cols: int, base: np.float32) -> np.ndarray:
    nb = rows * (cols // 32)
    u = unit_float(element_hash(key ^ _SCALE_SALT, sub, np.arange(nb, dtype=np.uint32)))
    d = base * (np.float32(0.75) + np.float32(0.5) * u)
    return d.astype(np.float16).reshape(rows, cols // 32)


def gen_q8_0(key: int, sub: int, rows: int, cols: int) -> QTensor:
    """NumPy Q8_0 sub-tensor ``sub`` of the tensor with ``key`` (mirrors ``init_q8_0``)."""
    h = element_hash(key, sub, np.arange(rows * cols, dtype=np.uint32))
    q = ((h >> np.uint32(24)).astype(np.int16) - 128).clip(-127, 127).astype(np.int8)
    return QTensor("q8_0", rows, cols, q.reshape(rows, cols), _scales(key, sub, rows, cols, q8_base_scale(cols)))


def gen_q4(key: int, sub: int, rows: int, cols: int) -> QTensor:
    """NumPy 4-bit sub-tensor ``sub`` of the tensor with ``key`` (mirrors ``init_q4``)."""
    h = element_hash(key, sub, np.arange(rows * cols, dtype=np.uint32))
    nib = (h >> np.uint32(28)).astype(np.uint8).reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    packed = nib[:, :, :16] | (nib[:, :, 16:] << np.uint8(4))
    return QTensor("q4", rows, cols, packed.reshape(rows, cols // 2), _scales(key, sub, rows, cols, q4_base_scale(cols)))


def gen_f32(key: int, n: int, scale: float, offset: float) -> np.ndarray:
    """NumPy fp32 vector ``offset + scale * U(-1, 1)`` (mirrors ``init_f32``)."""
    u = unit_float(element_hash(key, 0, np.arange(n, dtype=np.uint32)))
    return np.float32(offset) + np.float32(scale) * (u * np.float32(2.0) - np.float32(1.0))


@dataclass(frozen=True)
class WeightSpec:
    """One weight tensor of the model: name (hash key), format, shape and init parameters.

    ``subs`` > 1 marks a stack (the routed-expert bank: one matrix per expert).
    """

    name: str
    fmt: str
    rows: int
    cols: int
    subs: int = 1
    scale: float = 0.0
    offset: float = 0.0

    @property
    def n_weights(self) -> int:
        return self.rows * self.cols * self.subs


def layer_specs(cfg: ModelConfig, layer: int) -> dict[str, WeightSpec]:
    """The per-layer weight tensors (attention, hyper-connections, router, shared expert)."""
    E, S, F = cfg.embed, cfg.hc_streams, cfg.expert_ffn
    sfx = f"@{layer}"

    def f32(name, n, scale, offset=0.0):
        return WeightSpec(name + sfx, "f32", 1, n, scale=scale, offset=offset)

    return {
        "hc_attn_mix": f32("hc_attn_mix", 2 * S * S * E, 1.0 / np.sqrt(S * E)),
        "hc_attn_norm": f32("hc_attn_norm", E, 0.1, 1.0),
        "q_a": WeightSpec("q_a" + sfx, "q8_0", cfg.q_lora, E),
        "q_a_norm": f32("q_a_norm", cfg.q_lora, 0.1, 1.0),
        "q_b": WeightSpec("q_b" + sfx, "q8_0", cfg.q_dim, cfg.q_lora),
        "q_head_norm": f32("q_head_norm", cfg.head_dim, 0.1, 1.0),
        "kv": WeightSpec("kv" + sfx, "q8_0", cfg.head_dim, E),
        "kv_norm": f32("kv_norm", cfg.head_dim, 0.1, 1.0),
        "o_a": WeightSpec("o_a" + sfx, "q8_0", cfg.out_groups * cfg.out_lora, cfg.group_in),
        "o_b": WeightSpec("o_b" + sfx, "q8_0", E, cfg.out_groups * cfg.out_lora),
        "hc_ffn_mix": f32("hc_ffn_mix", 2 * S * S * E, 1.0 / np.sqrt(S * E)),
        "hc_ffn_norm": f32("hc_ffn_norm", E, 0.1, 1.0),
        "router": f32("router", cfg.n_experts * E, 1.0 / np.sqrt(E)),
        "sh_gateup": WeightSpec("sh_gateup" + sfx, "q8_0", 2 * F, E),
        "sh_down": WeightSpec("sh_down" + sfx, "q8_0", E, F),
    }


def compress_specs(cfg: ModelConfig, layer: int) -> dict[str, WeightSpec]:
    """Long-context weights of ``layer`` (empty for a layer without compression).

    ds4.c binds, per compressed layer, ``attn_compressor_{kv,gate,ape,norm}`` and, for ratio 4,
    ``indexer.attn_q_b``, ``indexer.proj`` and ``indexer_compressor_{kv,gate,ape,norm}`` (f16 and
    f32 there). ds4lab keeps them as: the kv and gate projections stacked into one Q8_0 matrix
    ``[2 * width, E]`` (kv rows first; width = 2 x head dim for ratio 4, the two lanes, else head
    dim), the ape bias fp32 ``[ratio, width]``, the norm fp32 ``[head dim]``; the indexer query
    projection Q8_0 ``[index_heads * index_head_dim, q_lora]`` and the per-head weight
    projection Q8_0 ``[index_heads, E]``.
    """
    ratio = cfg.compress_ratio(layer)
    if ratio == 0:
        return {}
    E, D, sfx = cfg.embed, cfg.head_dim, f"@{layer}"
    coff = 2 if ratio == 4 else 1

    def f32(name, n, scale, offset=0.0):
        return WeightSpec(name + sfx, "f32", 1, n, scale=scale, offset=offset)

    out = {
        "comp_kvgate": WeightSpec("comp_kvgate" + sfx, "q8_0", 2 * coff * D, E),
        "comp_ape": f32("comp_ape", ratio * coff * D, 0.5),
        "comp_norm": f32("comp_norm", D, 0.1, 1.0),
    }
    if ratio == 4:
        Di = cfg.index_head_dim
        out.update({
            "index_comp_kvgate": WeightSpec("index_comp_kvgate" + sfx, "q8_0", 2 * coff * Di, E),
            "index_comp_ape": f32("index_comp_ape", ratio * coff * Di, 0.5),
            "index_comp_norm": f32("index_comp_norm", Di, 0.1, 1.0),
            "index_q_b": WeightSpec("index_q_b" + sfx, "q8_0", cfg.index_q_dim, cfg.q_lora),
            "index_proj": WeightSpec("index_proj" + sfx, "q8_0", cfg.index_heads, E),
        })
    return out


def cache_layout(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, int]]:
    """The fp32 cache buffers of ``layer``: name → (rows, cols).

    Every layer: the raw window ``kv`` ``[window, head_dim]``. A compressed layer of ratio r adds
    ``comp`` ``[max_context / r, head_dim]`` (compressed rows) and the compressor state
    ``comp_state_kv`` / ``comp_state_score`` ``[coff * r, coff * head_dim]`` (coff = 2 for ratio
    4: the previous and the current block, two lanes; 1 for ratio 128), as ds4.c
    ``kv_cache_init`` sizes them; ratio 4 adds the indexer's ``index`` ``[max_context / 4,
    index_head_dim]`` and its compressor state.
    """
    D, out = cfg.head_dim, {"kv": (cfg.window, cfg.head_dim)}
    ratio = cfg.compress_ratio(layer)
    if ratio:
        coff = 2 if ratio == 4 else 1
        out["comp"] = (cfg.comp_capacity(ratio), D)
        out["comp_state_kv"] = out["comp_state_score"] = (coff * ratio, coff * D)
        if ratio == 4:
            Di = cfg.index_head_dim
            out["index"] = (cfg.comp_capacity(ratio), Di)
            out["index_state_kv"] = out["index_state_score"] = (coff * ratio, coff * Di)
    return out


def cache_bytes(cfg: ModelConfig, n_layers: int | None = None) -> int:
    """Bytes of every layer's caches (:func:`cache_layout`) for the first ``n_layers`` layers."""
    n = cfg.n_layers if n_layers is None else n_layers
    return sum(4 * r * c for layer in range(n) for r, c in cache_layout(cfg, layer).values())


def bank_specs(cfg: ModelConfig, bank: int) -> dict[str, WeightSpec]:
    """The routed-expert bank ``bank``: gate/up stacked ``[experts, 2F, E]``, down ``[experts, E, F]``."""
    E, F, N = cfg.embed, cfg.expert_ffn, cfg.n_experts
    return {
        "gate_up": WeightSpec(f"experts.gate_up@{bank}", "q4", 2 * F, E, subs=N),
        "down": WeightSpec(f"experts.down@{bank}", "q4", E, F, subs=N),
    }


def global_specs(cfg: ModelConfig) -> dict[str, WeightSpec]:
    """Weights outside the layers: the output norm and the vocabulary projection."""
    return {
        "out_norm": WeightSpec("out_norm", "f32", 1, cfg.embed, scale=0.1, offset=1.0),
        "vocab": WeightSpec("vocab", "q8_0", cfg.vocab, cfg.embed),
    }


def bank_of_layer(cfg: ModelConfig, layer: int) -> int:
    """Which routed-expert bank layer ``layer`` reads (0 when one bank is shared)."""
    return layer if cfg.per_layer_experts else 0


def all_specs(cfg: ModelConfig, with_vocab: bool, n_layers: int | None = None) -> Iterator[WeightSpec]:
    """Every tensor a model of ``cfg`` allocates (for memory planning); ``n_layers``: a partial model."""
    n = cfg.n_layers if n_layers is None else n_layers
    for layer in range(n):
        yield from layer_specs(cfg, layer).values()
        yield from compress_specs(cfg, layer).values()
    for bank in sorted({bank_of_layer(cfg, layer) for layer in range(n)}):
        yield from bank_specs(cfg, bank).values()
    g = global_specs(cfg)
    yield g["out_norm"]
    if with_vocab:
        yield g["vocab"]


def spec_bytes(spec: WeightSpec) -> int:
    """Bytes the tensor occupies on the device."""
    if spec.fmt == "f32":
        return 4 * spec.n_weights
    q = spec.n_weights if spec.fmt == "q8_0" else spec.n_weights // 2
    return q + 2 * (spec.n_weights // Q8_0_BLOCK)


def model_bytes(cfg: ModelConfig, with_vocab: bool, n_layers: int | None = None) -> int:
    """Total weight bytes of ``cfg`` (used to refuse a model that cannot fit before allocating)."""
    return sum(spec_bytes(s) for s in all_specs(cfg, with_vocab, n_layers))


def embed_row(seed: int, token_id: int, embed: int) -> np.ndarray:
    """The fp32 input embedding of ``token_id``: U(-1, 1), hashed (mirrors ``embed_token``)."""
    key = tensor_key(seed, "embed")
    idx = np.arange(embed, dtype=np.uint64) + np.uint64(token_id) * np.uint64(embed)
    u = unit_float(element_hash(key, 0, (idx & np.uint64(0xFFFFFFFF)).astype(np.uint32)))
    return u * np.float32(2.0) - np.float32(1.0)


HASH_ROUTE_MAX_ATTEMPTS = 1024


def hash_experts(seed: int, token_id: int, layer: int, n_used: int, n_experts: int) -> np.ndarray:
    """Experts of a hash-routed layer for ``token_id``: ``n_used`` distinct ids, int32.

    Draw ``a`` is ``mix32(key(layer) + token_id * 0x9E3779B9 + a * 0x85EBCA6B) % n_experts``, kept
    when new; after :data:`HASH_ROUTE_MAX_ATTEMPTS` draws the lowest unused ids fill the rest.
    Mirrors ``router_hash`` in ``kernels/router.cu`` bit for bit.
    """
    key = tensor_key(seed, f"hash_route@{layer}")
    chosen: list[int] = []
    for attempt in range(HASH_ROUTE_MAX_ATTEMPTS):
        if len(chosen) == n_used:
            break
        e = mix32_int(key + token_id * _GOLDEN + attempt * 0x85EBCA6B) % n_experts
        if e not in chosen:
            chosen.append(e)
    e = 0
    while len(chosen) < n_used:
        if e not in chosen:
            chosen.append(e)
        e += 1
    return np.array(chosen, dtype=np.int32)
