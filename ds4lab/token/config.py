"""Model configurations: the DeepSeek V4 Flash dimensions ds4 fixes, and reduced presets.

Every dimension that a kernel tiles by a block size is checked here, once, so a bad configuration fails before any
memory is allocated, with the offending value named. Source of the ``ds4-flash`` numbers:
``shared/context/ds4-decode.md`` ("Model shape")."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

#: Q8_0 block: 32 int8 values sharing one fp16 scale (attention and shared-expert weights).
Q8_0_BLOCK = 32
#: ds4lab's 4-bit block ("Q4_0"): 32 4-bit values in 16 bytes sharing one fp16 scale.
Q4_BLOCK = 32
#: Q8_K block: 256 int8 activation values sharing one fp32 scale (routed-MoE ``xq``/``midq``).
Q8_K_BLOCK = 256
#: Weights per super-block of the k-quant and i-quant formats (ggml ``QK_K``): Q4_K, Q2_K, IQ2_XXS.
QK_K = 256
#: Pairs of (token, expert) per expert tile in the sorted routed-MoE path.
MOE_TILE = 8
#: Largest position a token may take: positions are int32 kernel arguments (``DecodeModel.scalars``).
MAX_POS = 2**31 - 2
#: The router's top-k kernel runs one block of at most this many threads per token.
MAX_EXPERTS = 1024
#: Compression ratios of the long-context layers (ds4.c ``ds4_layer_compress_ratio``): even
#: layers from 2 on compress keys 4:1 and have an indexer; odd layers from 3 on compress 128:1.
COMPRESS_RATIOS = (4, 128)
#: The first layer with compressed attention (layers 0 and 1 attend over the raw window only).
FIRST_COMPRESSED_LAYER = 2
#: Keys the indexer's top-k kernels sort in one block (packed 64-bit keys: 32 KiB of shared
#: memory); the chunk of the chunked path is ``8 * index_top_k``, which must fit.
TOPK_SORT_MAX = 4096
#: Candidate sets merged per block by the chunked top-k's tree merge (ds4_cuda.cu
#: ``DS4_CUDA_TOPK_MERGE_GROUP``).
TOPK_MERGE_GROUP = 8

#: Bytes of one super-block of 256 weights (ggml ``block_q4_K``, ``block_q2_K``, ``block_iq2_xxs``;
#: ds4.c "GGUF Quant Block Formats"; layouts in :mod:`ds4lab.token.weights`).
SUPERBLOCK_BYTES = {"q4_k": 144, "q2_k": 84, "iq2_xxs": 66}

BYTES_PER_WEIGHT = {
    "q8_0": 1 + 2 / Q8_0_BLOCK,  # 1.0625: int8 + fp16 scale per 32
    "q4": 0.5 + 2 / Q4_BLOCK,  # 0.5625: 4 bits + fp16 scale per 32
    "q4_k": SUPERBLOCK_BYTES["q4_k"] / QK_K,  # 0.5625: 4.5 bits
    "q2_k": SUPERBLOCK_BYTES["q2_k"] / QK_K,  # 0.328125: 2.625 bits
    "iq2_xxs": SUPERBLOCK_BYTES["iq2_xxs"] / QK_K,  # 0.2578125: 2.0625 bits
    "f32": 4.0,
}

#: Routed-expert formats: name -> (gate/up weight format, down weight format, decode path). ``"ds4"``: ds4's
#: four-launch decode MoE at ``b0309611``; ``"five"``: ds4lab's earlier five launches (``docs/model.md``).
EXPERT_FORMATS = {
    "iq2_xxs+q2_k": ("iq2_xxs", "q2_k", "ds4"),  # ds4's default "q2" model
    "q4_k": ("q4_k", "q4_k", "ds4"),  # ds4's high-memory variant (its MoE decode graph's format)
    "q4blk": ("q4", "q4", "five"),  # ds4lab's own 4-bit block format
}
#: The expert format of the presets that follow ds4 as shipped (public mirror at ``b0309611``).
DS4_EXPERT_FORMAT = "iq2_xxs+q2_k"
#: The ds4 commit whose routed-MoE decode path and expert formats the default presets follow.
DS4_COMMIT = "b0309611"


class ConfigError(ValueError):
    """A model configuration that ds4lab cannot build; the message names the bad value."""


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of one ds4-shaped decoder (element counts), plus the workbench's own choices; weight formats:
    ``docs/model.md``, "Formats". Raises ConfigError: from :meth:`validate` (called on construction) for any dimension
    that does not divide its block size, more experts used than exist, and the like."""

    name: str
    n_layers: int
    embed: int
    n_heads: int
    head_dim: int
    rope_dims: int
    q_lora: int
    out_groups: int
    out_lora: int
    n_experts: int
    n_used: int
    expert_ffn: int
    n_hash_layers: int
    window: int
    hc_streams: int
    vocab: int
    n_kv_heads: int = 1
    value_dim: int | None = None
    n_shared: int = 1
    # Workbench choices (not part of the model's shape).
    per_layer_experts: bool = False
    max_tokens: int = 512
    swiglu_limit: float = 10.0
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    seed: int = 1234
    #: Routed-expert format and, with it, the routed-MoE path (:data:`EXPERT_FORMATS`).
    expert_format: str = DS4_EXPERT_FORMAT
    # Long context (ds4.c: compressed and indexed attention; docs/model.md, "Long context").
    #: On: layers from 2 compress (ratio 4 with an indexer on even layers, 128 on odd ones).
    long_context: bool = False
    #: Positions a model can decode: 0 .. max_context - 1 (sizes the compressed caches).
    max_context: int = 262144
    #: Position of the first decoded token: caches hold seeded random rows for every earlier
    #: position, so a token at 65 536 costs one token, not a prefill.
    start_pos: int = 0
    index_heads: int = 64
    index_head_dim: int = 128
    index_top_k: int = 512
    #: RoPE base of the compressed layers (ds4.c ``DS4_COMPRESS_ROPE_FREQ_BASE``).
    compress_rope_theta: float = 160000.0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.value_dim is None:
            object.__setattr__(self, "value_dim", self.head_dim)
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def q_dim(self) -> int:
        """Query width: heads × head dim (32768 for ds4-flash)."""
        return self.n_heads * self.head_dim

    @property
    def group_in(self) -> int:
        """Input width of one output group: (heads / groups) × head dim."""
        return self.n_heads // self.out_groups * self.head_dim

    @property
    def expert_formats(self) -> tuple[str, str]:
        """Weight formats of the routed experts' ``(gate/up, down)`` matrices."""
        gu, dn, _ = EXPERT_FORMATS[self.expert_format]
        return gu, dn

    @property
    def moe_path(self) -> str:
        """The routed-MoE decode path: ``"ds4"`` (four launches) or ``"five"`` (:data:`EXPERT_FORMATS`)."""
        return EXPERT_FORMATS[self.expert_format][2]

    @property
    def n_routed_banks(self) -> int:
        """How many routed-expert banks are allocated: 1 shared, or one per layer."""
        return self.n_layers if self.per_layer_experts else 1

    def compress_ratio(self, layer: int) -> int:
        """Compression ratio of ``layer`` (ds4.c ``ds4_layer_compress_ratio``): 0 for layers 0 and 1 or without
        ``long_context``, then 4 (even, with an indexer) or 128 (odd). Raises ConfigError for a layer out of range."""
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"{self.name}: layer={layer} outside 0..{self.n_layers - 1}")
        if not self.long_context or layer < FIRST_COMPRESSED_LAYER:
            return 0
        return COMPRESS_RATIOS[0] if layer % 2 == 0 else COMPRESS_RATIOS[1]

    def comp_capacity(self, ratio: int) -> int:
        """Rows of the compressed cache of a ratio-``ratio`` layer: ``max_context / ratio``."""
        return self.max_context // ratio

    @property
    def index_q_dim(self) -> int:
        """Indexer query width: index heads × index head dim (8192 for ds4-flash)."""
        return self.index_heads * self.index_head_dim

    def is_hash_layer(self, layer: int) -> bool:
        """True for the first ``n_hash_layers`` layers, whose experts come from the token id."""
        return layer < self.n_hash_layers

    def replace(self, **changes) -> "ModelConfig":
        """A copy with ``changes`` applied and validated (raises :class:`ConfigError`)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown configuration field(s): {', '.join(sorted(unknown))}")
        if "head_dim" in changes and "value_dim" not in changes and self.value_dim == self.head_dim:
            changes["value_dim"] = None  # value_dim follows head_dim unless set on its own
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check every constraint the kernels rely on. Raises :class:`ConfigError`."""
        self._positive_ints("n_layers", "embed", "n_heads", "head_dim", "rope_dims", "q_lora", "out_groups",
                            "out_lora", "n_experts", "n_used", "expert_ffn", "window", "hc_streams", "vocab",
                            "max_tokens")

        def divides(what: str, value: int, block: int, why: str) -> None:
            self._refuse(value % block, f"{what}={value} is not a multiple of {block} ({why})")

        divides("embed", self.embed, Q8_K_BLOCK, "Q8_K activation blocks in the routed MoE")
        divides("q_lora", self.q_lora, Q8_0_BLOCK, "Q8_0 blocks of the query up-projection")
        divides("expert_ffn", self.expert_ffn, Q8_K_BLOCK, "Q8_K blocks of the MoE middle")
        divides("heads*head_dim", self.q_dim, Q8_0_BLOCK, "Q8_0 rows")
        self._refuse(self.n_heads % self.out_groups,
                     f"n_heads={self.n_heads} is not a multiple of out_groups={self.out_groups}")
        divides("group input (heads/groups*head_dim)", self.group_in, Q8_0_BLOCK,
                "Q8_0 blocks of the grouped output projection")
        divides("out_groups*out_lora", self.out_groups * self.out_lora, Q8_0_BLOCK,
                "Q8_0 blocks of the output projection")
        divides("head_dim", self.head_dim, 64, "float2 lanes of the attention kernel")
        self._refuse(self.rope_dims % 2 or self.rope_dims > self.head_dim,
                     f"rope_dims={self.rope_dims} must be even and at most head_dim={self.head_dim}")
        self._refuse(self.n_used > self.n_experts,
                     f"n_used={self.n_used} experts per token, but only n_experts={self.n_experts} exist")
        self._refuse(self.n_used > 32, f"n_used={self.n_used} exceeds 32 (router kernels keep the choice in registers)")
        self._refuse(self.hc_streams > 8, f"hc_streams={self.hc_streams} exceeds 8 (pre-mix weights kept in registers)")
        self._refuse(self.n_experts > MAX_EXPERTS, f"n_experts={self.n_experts} exceeds {MAX_EXPERTS} "
                     "(one router block per token)")
        self._refuse(self.n_kv_heads != 1, f"n_kv_heads={self.n_kv_heads}: ds4's attention has exactly 1 KV head")
        self._refuse(self.value_dim != self.head_dim, f"value_dim={self.value_dim} must equal head_dim={self.head_dim} "
                     "(keys and values share one cached row)")
        self._refuse(self.n_shared != 1, f"n_shared={self.n_shared}: ds4 has exactly 1 shared expert")
        self._refuse(not 0 <= self.n_hash_layers <= self.n_layers,
                     f"n_hash_layers={self.n_hash_layers} must be in 0..n_layers={self.n_layers}")
        self._refuse(self.window > 1024, f"window={self.window} exceeds 1024 (scores kept in shared memory)")
        self._refuse(self.head_dim > 1024 or self.embed > 65536,
                     f"head_dim={self.head_dim} or embed={self.embed} too large for the kernels")
        self._positive_numbers("swiglu_limit", "rms_eps", "rope_theta")
        self._refuse(self.expert_format not in EXPERT_FORMATS, f"expert_format={self.expert_format!r}; choose one of: "
                     f"{', '.join(EXPERT_FORMATS)}")
        self._refuse(isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32,
                     f"seed={self.seed!r} must be an integer in 0..2**32-1 (weights are hashed from a 32-bit seed)")
        self._validate_long_context()

    def _validate_long_context(self) -> None:
        """The long-context fields (checked whether or not ``long_context`` is on)."""
        self._refuse(not isinstance(self.long_context, bool),
                     f"long_context={self.long_context!r} must be True or False")
        self._positive_ints("max_context", "index_heads", "index_head_dim", "index_top_k")
        ratio = max(COMPRESS_RATIOS)
        self._refuse(self.max_context % ratio, f"max_context={self.max_context} is not a multiple of {ratio} "
                     "(whole compressed rows of the ratio-128 layers)")
        self._refuse(self.max_context > MAX_POS + 1, f"max_context={self.max_context} exceeds {MAX_POS + 1} "
                     "(positions are int32 kernel arguments)")
        self._refuse(self.max_context < self.window, f"max_context={self.max_context} is shorter than the "
                     f"window={self.window}")
        s = self.start_pos
        self._refuse(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < self.max_context,
                     f"start_pos={s!r} must be an integer in 0..max_context-1={self.max_context - 1}")
        k = self.index_top_k
        self._refuse(k & (k - 1) or k < 2, f"index_top_k={k} must be a power of two >= 2 "
                     "(bitonic sort in the top-k kernels)")
        self._refuse(8 * k > TOPK_SORT_MAX, f"index_top_k={k}: 8 x top-k = {8 * k} keys exceed the "
                     f"{TOPK_SORT_MAX} one block sorts in shared memory")
        self._refuse(self.index_heads % 2, f"index_heads={self.index_heads} is odd (the Q8_0 matvec of the "
                     "indexer's head weights computes rows in pairs)")
        self._refuse(self.index_head_dim % 32, f"index_head_dim={self.index_head_dim} is not a multiple of 32 "
                     "(one warp per indexer key row)")
        self._refuse(self.index_head_dim > 256 or self.index_q_dim > 8192,
                     f"index_head_dim={self.index_head_dim} (max 256) or index heads x dim="
                     f"{self.index_q_dim} (max 8192) too large for the indexer kernel's shared query")
        self._refuse(self.rope_dims > self.index_head_dim, f"rope_dims={self.rope_dims} exceeds index_head_dim="
                     f"{self.index_head_dim} (the indexer query and keys are rotated too)")
        self._refuse(self.index_q_dim % Q8_0_BLOCK, f"index heads x dim={self.index_q_dim} is not a multiple of "
                     f"{Q8_0_BLOCK} (Q8_0 rows)")
        self._positive_numbers("compress_rope_theta")

    def _refuse(self, bad, problem: str) -> None:
        if bad:
            raise ConfigError(f"{self.name}: {problem}")

    def _positive_ints(self, *fields: str) -> None:
        for f in fields:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{self.name}: {f}={v!r} must be a positive integer")

    def _positive_numbers(self, *fields: str) -> None:
        for f in fields:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
                raise ConfigError(f"{self.name}: {f}={v!r} must be a finite number > 0")

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict:
        """A flat dict of the configuration, for ``meta.json`` and tables: every field, and ``routed_moe``, a line
        saying where the routed experts and their decode path come from (:meth:`routed_moe_source`)."""
        d = dataclasses.asdict(self)
        d.pop("extra")
        d["routed_moe"] = self.routed_moe_source()
        return d

    def routed_moe_source(self) -> str:
        """Where the routed experts' formats and decode MoE come from: ds4 and its commit, or ds4lab."""
        gu, dn, path = EXPERT_FORMATS[self.expert_format]
        names = {"q4": "4-bit block (one fp16 scale per 32)", "q4_k": "Q4_K", "q2_k": "Q2_K", "iq2_xxs": "IQ2_XXS"}
        if path == "ds4":
            return (f"as ds4 {DS4_COMMIT} ships it: {names[gu]} gate/up, {names[dn]} down; "
                    "decode MoE in 4 launches (xq, fused gate/up/SwiGLU, midq, down + sum)")
        return (f"ds4lab's own: {names[gu]} experts; decode MoE in 5 launches (xq, gate/up, midq + SwiGLU, "
                "down, weighted sum)")


_DS4_FLASH = dict(
    n_layers=43, embed=4096, n_heads=64, head_dim=512, rope_dims=64, q_lora=1024, out_groups=8, out_lora=1024,
    n_experts=256, n_used=6, expert_ffn=2048, n_hash_layers=3, window=128, hc_streams=4, vocab=129280)

_SMALL = dict(
    n_layers=8, embed=1024, n_heads=16, head_dim=128, rope_dims=32, q_lora=256, out_groups=4, out_lora=256,
    n_experts=64, n_used=6, expert_ffn=512, n_hash_layers=3, window=128, hc_streams=4, vocab=8192,
    # Indexer scaled down with the widths; top-k 64 puts the n_comp regimes (2, 4, 8, 16 x top-k) at
    # positions 512 .. 4096 of a ratio-4 layer.
    index_heads=16, index_head_dim=64, index_top_k=64)

PRESETS: dict[str, ModelConfig] = {
    # DeepSeek V4 Flash as fixed in ds4 (context file, "Model shape"), its routed experts and routed-MoE
    # decode path as ds4 ships them at b0309611 (IQ2_XXS gate/up, Q2_K down; four launches).
    "ds4-flash": ModelConfig(name="ds4-flash", **_DS4_FLASH),
    # The same with ds4's Q4_K experts (the format of ds4's opt-in routed-MoE decode graph).
    "ds4-flash-q4k": ModelConfig(name="ds4-flash-q4k", expert_format="q4_k", **_DS4_FLASH),
    # ds4lab's earlier token: its own 4-bit block experts, five MoE launches (results measured
    # before the ds4 formats compare with this one).
    "ds4-flash-q4blk": ModelConfig(name="ds4-flash-q4blk", expert_format="q4blk", **_DS4_FLASH),
    # Same structure and launch sequence, reduced widths: seconds on a GPU.
    "small": ModelConfig(name="small", **_SMALL),
    # small with ds4lab's earlier 4-bit block experts and five MoE launches (older sim results).
    "small-q4blk": ModelConfig(name="small-q4blk", expert_format="q4blk", **_SMALL),
    # For tests on the CPU: every path (hash and top-k layers, ring-buffer wrap) in milliseconds.
    "tiny": ModelConfig(
        name="tiny", n_layers=3, embed=256, n_heads=4, head_dim=64, rope_dims=16,
        q_lora=64, out_groups=2, out_lora=64, n_experts=16, n_used=6, expert_ffn=256,
        n_hash_layers=1, window=8, hc_streams=4, vocab=512, max_tokens=64,
        # Long context: every n_comp regime below position 600 (top-k 8), caches of 4096 positions.
        max_context=4096, index_heads=4, index_head_dim=32, index_top_k=8),
}


def is_ds4_flash(name: str | None) -> bool:
    """True for ``ds4-flash`` and its expert-format variants: the full-size model the CPU backends only time. False
    for None (a job's default preset, chosen later)."""
    return name is not None and (name == "ds4-flash" or name.startswith("ds4-flash-"))


def token_id_at(pos: int, vocab: int) -> int:
    """The token id every experiment decodes at position ``pos`` (a fixed pseudo-random sequence, so every stage and
    every backend decodes the same tokens)."""
    return (pos * 7919 + 13) % vocab


def get_preset(name: str, **overrides) -> ModelConfig:
    """The preset called ``name`` with optional field overrides. Raises ConfigError: unknown preset (the message lists
    the known ones), unknown field, or an override that breaks a constraint."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None
    return base.replace(**overrides) if overrides else base
