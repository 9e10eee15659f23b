"""Random weights from a seed, identical on every backend: each element a pure function of ``(seed, tensor name,
sub-tensor, element index)`` through ``mix32`` (mirrored bit for bit in ``kernels/common.cuh``), so the GPU fills its
banks in place and the NumPy reference regenerates any slice. Formats (``q8_0``, ``q4``, the super-blocks ``q4_k``,
``q2_k``, ``iq2_xxs``, ``f32``): :class:`QTensor`, :data:`SUPERBLOCKS`, ``docs/model.md``, "Formats"."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .config import BYTES_PER_WEIGHT, Q4_BLOCK, Q8_0_BLOCK, QK_K, SUPERBLOCK_BYTES, ModelConfig

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
    """A block-quantized matrix (or a stack of them), on any backend: ``fmt`` (``"q8_0"``, ``"q4"``, ``"q4_k"``,
    ``"q2_k"``, ``"iq2_xxs"``), ``rows`` × ``cols``; ``qs``: int8 ``[..., rows, cols]`` (q8_0), uint8 ``[..., rows,
    cols/2]`` (q4), uint8 ``[..., rows, cols / 256 * block bytes]`` (super-blocks); ``d``: fp16 ``[..., rows,
    cols/32]``, None for the super-block formats."""

    fmt: str
    rows: int
    cols: int
    qs: Any
    d: Any

    @property
    def nbytes(self) -> int:
        """Bytes of ``qs`` plus ``d`` (all sub-tensors)."""
        return int(self.qs.nbytes + (0 if self.d is None else self.d.nbytes))

    def row_bytes(self) -> float:
        """Bytes one row of one sub-tensor occupies (``cols x BYTES_PER_WEIGHT[fmt]``)."""
        return self.cols * BYTES_PER_WEIGHT[self.fmt]

    def __getitem__(self, i) -> "QTensor":
        """Sub-tensor ``i`` of a stack (an expert of a bank)."""
        return QTensor(self.fmt, self.rows, self.cols, self.qs[i], None if self.d is None else self.d[i])


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


# ----------------------------------------------------------------------------- super-block formats
#: The IQ2_XXS codebook: 256 grid points, each 8 magnitudes from {8, 25, 43} packed little-endian into
#: a uint64 (byte j is weight j of the group of 8). Data of the format's definition, as published in
#: ggml's ``ggml-common.h`` (``iq2xxs_grid``) and carried by ds4 (``ds4_iq2_tables_cuda.inc``,
#: ``cuda/mmq/ggml-common.h`` at b0309611, identical there). The kernels receive it as a device buffer
#: (``ops``), so this is its only copy in ds4lab.
IQ2XXS_GRID = np.array([
    0x0808080808080808, 0x080808080808082b, 0x0808080808081919, 0x0808080808082b08,
    0x0808080808082b2b, 0x0808080808190819, 0x0808080808191908, 0x08080808082b0808,
    0x08080808082b082b, 0x08080808082b2b08, 0x08080808082b2b2b, 0x0808080819080819,
    0x0808080819081908, 0x0808080819190808, 0x0808080819192b08, 0x08080808192b0819,
    0x08080808192b1908, 0x080808082b080808, 0x080808082b08082b, 0x080808082b082b2b,
    0x080808082b2b082b, 0x0808081908080819, 0x0808081908081908, 0x0808081908190808,
    0x0808081908191919, 0x0808081919080808, 0x080808192b081908, 0x080808192b192b08,
    0x0808082b08080808, 0x0808082b0808082b, 0x0808082b082b082b, 0x0808082b2b08082b,
    0x0808190808080819, 0x0808190808081908, 0x0808190808190808, 0x08081908082b0819,
    0x08081908082b1908, 0x0808190819080808, 0x080819081908082b, 0x0808190819082b08,
    0x08081908192b0808, 0x080819082b080819, 0x080819082b081908, 0x080819082b190808,
    0x080819082b2b1908, 0x0808191908080808, 0x080819190808082b, 0x0808191908082b08,
    0x08081919082b0808, 0x080819191908192b, 0x08081919192b2b19, 0x080819192b080808,
    0x080819192b190819, 0x0808192b08082b19, 0x0808192b08190808, 0x0808192b19080808,
    0x0808192b2b081908, 0x0808192b2b2b1908, 0x08082b0808080808, 0x08082b0808081919,
    0x08082b0808082b08, 0x08082b0808191908, 0x08082b08082b2b08, 0x08082b0819080819,
    0x08082b0819081908, 0x08082b0819190808, 0x08082b081919082b, 0x08082b082b082b08,
    0x08082b1908081908, 0x08082b1919080808, 0x08082b2b0808082b, 0x08082b2b08191908,
    0x0819080808080819, 0x0819080808081908, 0x0819080808190808, 0x08190808082b0819,
    0x0819080819080808, 0x08190808192b0808, 0x081908082b081908, 0x081908082b190808,
    0x081908082b191919, 0x0819081908080808, 0x0819081908082b08, 0x08190819082b0808,
    0x0819081919190808, 0x0819081919192b2b, 0x081908192b080808, 0x0819082b082b1908,
    0x0819082b19081919, 0x0819190808080808, 0x0819190808082b08, 0x08191908082b0808,
    0x08191908082b1919, 0x0819190819082b19, 0x081919082b080808, 0x0819191908192b08,
    0x08191919192b082b, 0x0819192b08080808, 0x0819192b0819192b, 0x08192b0808080819,
    0x08192b0808081908, 0x08192b0808190808, 0x08192b0819080808, 0x08192b082b080819,
    0x08192b1908080808, 0x08192b1908081919, 0x08192b192b2b0808, 0x08192b2b19190819,
    0x082b080808080808, 0x082b08080808082b, 0x082b080808082b2b, 0x082b080819081908,
    0x082b0808192b0819, 0x082b08082b080808, 0x082b08082b08082b, 0x082b0819082b2b19,
    0x082b081919082b08, 0x082b082b08080808, 0x082b082b0808082b, 0x082b190808080819,
    0x082b190808081908, 0x082b190808190808, 0x082b190819080808, 0x082b19081919192b,
    0x082b191908080808, 0x082b191919080819, 0x082b1919192b1908, 0x082b192b2b190808,
    0x082b2b0808082b08, 0x082b2b08082b0808, 0x082b2b082b191908, 0x082b2b2b19081908,
    0x1908080808080819, 0x1908080808081908, 0x1908080808190808, 0x1908080808192b08,
    0x19080808082b0819, 0x19080808082b1908, 0x1908080819080808, 0x1908080819082b08,
    0x190808081919192b, 0x19080808192b0808, 0x190808082b080819, 0x190808082b081908,
    0x190808082b190808, 0x1908081908080808, 0x19080819082b0808, 0x19080819192b0819,
    0x190808192b080808, 0x190808192b081919, 0x1908082b08080819, 0x1908082b08190808,
    0x1908082b19082b08, 0x1908082b1919192b, 0x1908082b192b2b08, 0x1908190808080808,
    0x1908190808082b08, 0x19081908082b0808, 0x190819082b080808, 0x190819082b192b19,
    0x190819190819082b, 0x19081919082b1908, 0x1908192b08080808, 0x19082b0808080819,
    0x19082b0808081908, 0x19082b0808190808, 0x19082b0819080808, 0x19082b0819081919,
    0x19082b1908080808, 0x19082b1919192b08, 0x19082b19192b0819, 0x19082b192b08082b,
    0x19082b2b19081919, 0x19082b2b2b190808, 0x1919080808080808, 0x1919080808082b08,
    0x1919080808190819, 0x1919080808192b19, 0x19190808082b0808, 0x191908082b080808,
    0x191908082b082b08, 0x1919081908081908, 0x191908191908082b, 0x191908192b2b1908,
    0x1919082b2b190819, 0x191919082b190808, 0x191919082b19082b, 0x1919191908082b2b,
    0x1919192b08080819, 0x1919192b19191908, 0x19192b0808080808, 0x19192b0808190819,
    0x19192b0808192b19, 0x19192b08192b1908, 0x19192b1919080808, 0x19192b2b08082b08,
    0x192b080808081908, 0x192b080808190808, 0x192b080819080808, 0x192b0808192b2b08,
    0x192b081908080808, 0x192b081919191919, 0x192b082b08192b08, 0x192b082b192b0808,
    0x192b190808080808, 0x192b190808081919, 0x192b191908190808, 0x192b19190819082b,
    0x192b19192b081908, 0x192b2b081908082b, 0x2b08080808080808, 0x2b0808080808082b,
    0x2b08080808082b2b, 0x2b08080819080819, 0x2b0808082b08082b, 0x2b08081908081908,
    0x2b08081908192b08, 0x2b08081919080808, 0x2b08082b08190819, 0x2b08190808080819,
    0x2b08190808081908, 0x2b08190808190808, 0x2b08190808191919, 0x2b08190819080808,
    0x2b081908192b0808, 0x2b08191908080808, 0x2b0819191908192b, 0x2b0819192b191908,
    0x2b08192b08082b19, 0x2b08192b19080808, 0x2b08192b192b0808, 0x2b082b080808082b,
    0x2b082b1908081908, 0x2b082b2b08190819, 0x2b19080808081908, 0x2b19080808190808,
    0x2b190808082b1908, 0x2b19080819080808, 0x2b1908082b2b0819, 0x2b1908190819192b,
    0x2b1908192b080808, 0x2b19082b19081919, 0x2b19190808080808, 0x2b191908082b082b,
    0x2b19190819081908, 0x2b19191919190819, 0x2b192b082b080819, 0x2b192b19082b0808,
    0x2b2b08080808082b, 0x2b2b080819190808, 0x2b2b08082b081919, 0x2b2b081908082b19,
    0x2b2b082b08080808, 0x2b2b190808192b08, 0x2b2b2b0819190808, 0x2b2b2b1908081908,
], dtype=np.uint64)


def iq2_sign_byte(idx: np.ndarray | int) -> np.ndarray:
    """The IQ2 sign byte of a 7-bit sign index (ggml ``ksigns_iq2xs``): the 7 bits, and as bit 7 their parity, so every
    group of 8 has an even number of negative weights. Bit ``j`` set: weight ``j`` of the group is negated (ggml
    ``kmask_iq2xs[j] = 1 << j``). uint8."""
    i = np.asarray(idx, dtype=np.uint32) & np.uint32(127)
    parity = np.zeros_like(i)
    for b in range(7):
        parity ^= (i >> np.uint32(b)) & np.uint32(1)
    return (i | (parity << np.uint32(7))).astype(np.uint8)


@dataclass(frozen=True)
class SuperBlockFormat:
    """One packed super-block format of 256 weights (ggml's): ``name``, ``nbytes`` (144, 84, 66), ``scale_fields``
    (``(byte offset, multiple of the base scale, hash salt)`` each), ``layout`` (``(name, offset, bytes)``, for the
    docs)."""

    name: str
    nbytes: int
    scale_fields: tuple
    layout: tuple

    def unit_std(self) -> float:
        """Standard deviation of a generated weight per unit of base scale (:func:`superblock_base_scale`), from the
        format's definition with every free byte uniform and scale fields ``multiple x base x (0.75 + 0.5 U)``."""
        return _UNIT_STD[self.name]


_SCALE_SALT_MIN = 0x27D4EB2F
#: ggml ``block_q4_K``: fp16 ``d``, fp16 ``dmin``, 12 bytes of 6-bit scales and mins for the 8
#: sub-blocks of 32, 128 bytes of 4-bit quants; ``w = d * sc_j * q - dmin * m_j`` (``get_scale_min_k4``).
#: ggml ``block_q2_K``: 16 bytes of 4-bit scale (low nibble) and min (high nibble) for the 16 groups
#: of 16, 64 bytes of 2-bit quants, fp16 ``d``, fp16 ``dmin``; ``w = d * (sc & 15) * q - dmin * (sc >> 4)``.
#: ggml ``block_iq2_xxs``: fp16 ``d``, then per sub-block of 32 two uint32: 4 grid indices (bytes) and
#: 4 x 7-bit sign indices with a 4-bit scale ``s`` on top; ``w = d * (0.5 + s) / 4 * grid * sign``.
SUPERBLOCKS = {
    "q4_k": SuperBlockFormat("q4_k", SUPERBLOCK_BYTES["q4_k"], ((0, 1.0, _SCALE_SALT), (2, 7.5, _SCALE_SALT_MIN)),
                             (("d", 0, 2), ("dmin", 2, 2), ("scales", 4, 12), ("qs", 16, 128))),
    "q2_k": SuperBlockFormat("q2_k", SUPERBLOCK_BYTES["q2_k"], ((80, 1.0, _SCALE_SALT), (82, 1.5, _SCALE_SALT_MIN)),
                             (("scales", 0, 16), ("qs", 16, 64), ("d", 80, 2), ("dmin", 82, 2))),
    "iq2_xxs": SuperBlockFormat("iq2_xxs", SUPERBLOCK_BYTES["iq2_xxs"], ((0, 1.0, _SCALE_SALT),),
                                (("d", 0, 2), ("qs", 2, 64))),
}


def _uniform_moments(n: int) -> tuple[float, float]:
    """Mean and second moment of an integer uniform on ``0 .. n - 1``."""
    return (n - 1) / 2, (n - 1) * (2 * n - 1) / 6


def _unit_stds() -> dict[str, float]:
    j2 = 49 / 48
    e6, e6s = _uniform_moments(64)
    e4, e4s = _uniform_moments(16)
    e2, e2s = _uniform_moments(4)
    q4k = j2 * e6s * e4s - 2 * 7.5 * e6 * e4 * e6 + 7.5 ** 2 * j2 * e6s
    q2k = j2 * e4s * e2s - 2 * 1.5 * e4 * e2 * e4 + 1.5 ** 2 * j2 * e4s
    g = IQ2XXS_GRID.view(np.uint8).astype(np.float64)
    ls2 = np.mean((2 * np.arange(16) + 1.0) ** 2) / 64  # ((0.5 + s) / 4)^2 = (2s + 1)^2 / 64
    iq2 = j2 * ls2 * np.mean(g * g)
    return {"q4_k": float(np.sqrt(q4k)), "q2_k": float(np.sqrt(q2k)), "iq2_xxs": float(np.sqrt(iq2))}


_UNIT_STD = _unit_stds()


def superblock_base_scale(fmt: str, cols: int) -> np.float32:
    """Mean ``d`` of a generated super-block tensor: dequantized weights get a std of about ``1/sqrt(cols)``, as the
    other formats' (:meth:`SuperBlockFormat.unit_std`)."""
    return np.float32(1.0 / (SUPERBLOCKS[fmt].unit_std() * np.sqrt(cols)))


def superblock_fields(fmt: str, cols: int) -> list[tuple[int, np.float32, int]]:
    """The scale fields of a generated ``fmt`` tensor with ``cols`` columns: ``(byte offset, mean value, salt)`` each,
    the mean as the float32 the init kernel receives."""
    base = float(superblock_base_scale(fmt, cols))
    return [(off, np.float32(base * mult), salt) for off, mult, salt in SUPERBLOCKS[fmt].scale_fields]


def gen_superblocks(fmt: str, key: int, sub: int, rows: int, cols: int) -> QTensor:
    """NumPy super-block sub-tensor ``sub`` of the tensor with ``key`` (mirrors ``init_superblocks`` in
    ``kernels/moe_ds4.cu``; ``docs/model.md``, "Generated weights"): hash bytes, fp16 scale fields
    ``mean * (0.75 + 0.5 * U)``. Raises ValueError: ``cols`` not a multiple of 256, or an unknown format."""
    if fmt not in SUPERBLOCKS:
        raise ValueError(f"unknown super-block format {fmt!r}; known: {', '.join(SUPERBLOCKS)}")
    if cols % QK_K:
        raise ValueError(f"{fmt}: cols={cols} is not a multiple of {QK_K} (whole super-blocks per row)")
    f = SUPERBLOCKS[fmt]
    nb = rows * cols // QK_K
    h = element_hash(key, sub, np.arange(nb * f.nbytes, dtype=np.uint32))
    b = (h >> np.uint32(24)).astype(np.uint8).reshape(nb, f.nbytes)
    blocks = np.arange(nb, dtype=np.uint32)
    for off, mean, salt in superblock_fields(fmt, cols):
        u = unit_float(element_hash(key ^ salt, sub, blocks))
        v = (mean * (np.float32(0.75) + np.float32(0.5) * u)).astype(np.float16)
        b[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return QTensor(fmt, rows, cols, b.reshape(rows, cols // QK_K * f.nbytes), None)


def qtensor_arrays(fmt: str, rows: int, cols: int) -> dict[str, tuple[tuple, Any] | None]:
    """Shapes and dtypes of one sub-tensor's ``qs`` and ``d`` in format ``fmt`` (``d``: None for the super-block
    formats). Raises ValueError for an unknown format."""
    if fmt == "q8_0":
        return {"qs": ((rows, cols), np.int8), "d": ((rows, cols // Q8_0_BLOCK), np.float16)}
    if fmt == "q4":
        return {"qs": ((rows, cols // 2), np.uint8), "d": ((rows, cols // Q4_BLOCK), np.float16)}
    if fmt in SUPERBLOCKS:
        return {"qs": ((rows, cols // QK_K * SUPERBLOCKS[fmt].nbytes), np.uint8), "d": None}
    raise ValueError(f"unknown quant format {fmt!r}")


def gen_qtensor(fmt: str, key: int, sub: int, rows: int, cols: int) -> QTensor:
    """NumPy sub-tensor ``sub`` of a quantized tensor in any format (the generator of ``fmt``)."""
    if fmt == "q8_0":
        return gen_q8_0(key, sub, rows, cols)
    if fmt == "q4":
        return gen_q4(key, sub, rows, cols)
    return gen_superblocks(fmt, key, sub, rows, cols)


def gen_f32(key: int, n: int, scale: float, offset: float) -> np.ndarray:
    """NumPy fp32 vector ``offset + scale * U(-1, 1)`` (mirrors ``init_f32``)."""
    u = unit_float(element_hash(key, 0, np.arange(n, dtype=np.uint32)))
    return np.float32(offset) + np.float32(scale) * (u * np.float32(2.0) - np.float32(1.0))


@dataclass(frozen=True)
class WeightSpec:
    """One weight tensor: name (hash key), format, shape, init parameters; ``subs`` > 1 marks a stack (expert bank)."""

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


def _f32_spec(sfx: str):
    """The maker of a layer's fp32 vectors: ``f32(name, n, scale, offset=0.0)``, named ``name + sfx``."""
    return lambda name, n, scale, offset=0.0: WeightSpec(name + sfx, "f32", 1, n, scale=scale, offset=offset)


def layer_specs(cfg: ModelConfig, layer: int) -> dict[str, WeightSpec]:
    """The per-layer weight tensors (attention, hyper-connections, router, shared expert)."""
    E, S, F = cfg.embed, cfg.hc_streams, cfg.expert_ffn
    sfx = f"@{layer}"
    f32 = _f32_spec(sfx)
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
    """Long-context weights of ``layer`` (empty for a layer without compression), as ds4.c binds them and ds4lab keeps
    them: kv and gate projections stacked into one Q8_0 ``[2 * width, E]`` (kv rows first; width 2 x head dim for
    ratio 4, else head dim), ape fp32 ``[ratio, width]``, norm fp32 ``[head dim]``; ratio 4 adds the indexer query
    Q8_0 ``[index_heads * index_head_dim, q_lora]``, the head weights Q8_0 ``[index_heads, E]`` and its compressor."""
    ratio = cfg.compress_ratio(layer)
    if ratio == 0:
        return {}
    E, D, sfx = cfg.embed, cfg.head_dim, f"@{layer}"
    coff = 2 if ratio == 4 else 1
    f32 = _f32_spec(sfx)
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
    """The fp32 cache buffers of ``layer``: name → (rows, cols), as ds4.c ``kv_cache_init`` sizes them: ``kv``
    ``[window, head_dim]``; ratio r adds ``comp`` ``[max_context / r, head_dim]`` and ``comp_state_kv`` /
    ``comp_state_score`` ``[coff * r, coff * head_dim]`` (coff 2 for ratio 4, else 1); ratio 4 adds ``index``
    ``[max_context / 4, index_head_dim]`` and its compressor state."""
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
    """The routed-expert bank ``bank``: gate/up stacked ``[experts, 2F, E]`` (gate rows first), down ``[experts, E,
    F]``, in the formats of ``cfg.expert_format`` (``cfg.expert_formats``)."""
    E, F, N = cfg.embed, cfg.expert_ffn, cfg.n_experts
    gu, dn = cfg.expert_formats
    return {
        "gate_up": WeightSpec(f"experts.gate_up@{bank}", gu, 2 * F, E, subs=N),
        "down": WeightSpec(f"experts.down@{bank}", dn, E, F, subs=N),
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
    """Bytes the tensor occupies on the device (``n_weights x BYTES_PER_WEIGHT[fmt]``: exact for every format, whose
    blocks divide the rows)."""
    if spec.fmt == "f32":
        return 4 * spec.n_weights
    if spec.fmt in SUPERBLOCKS:
        return spec.n_weights // QK_K * SUPERBLOCKS[spec.fmt].nbytes
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
    """Experts of a hash-routed layer for ``token_id``: ``n_used`` distinct int32 ids, draw ``a`` being
    ``mix32(key(layer) + token_id * 0x9E3779B9 + a * 0x85EBCA6B) % n_experts`` kept when new, the lowest unused ids
    after :data:`HASH_ROUTE_MAX_ATTEMPTS` draws. Mirrors ``router_hash`` in ``kernels/router.cu`` bit for bit."""
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
