"""What ds4 asks of a DeepSeek V4 Flash GGUF, as data (:func:`ds4_tensors`, :func:`ds4_metadata`,
:func:`synthetic_vocab`), read from ds4's loader (``ds4.c`` at ``b0309611``; line numbers are that file's) in ds4lab's
own words. ``docs/model.md``, "The synthetic model ds4 opens"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import BadInput
from ..token.config import ConfigError, ModelConfig, get_preset

#: The ds4 commit whose loader this module follows.
DS4_COMMIT = "b0309611"
#: GGUF tensor data alignment: ds4's default when ``general.alignment`` is absent (ds4.c:2372), and
#: the ``gguf`` package's; written explicitly.
ALIGNMENT = 32
#: The ``general.architecture`` ds4 runs as DeepSeek4 (anything but ``glm-dsa``, ds4.c:5809); the
#: prefix of every model key.
ARCH = "deepseek4"

# Constants of DS4_SHAPE_FLASH (ds4.c:541-577) and the DS4_DEFAULT_* defines (375-383) that are not
# ModelConfig fields; ds4 compares the metadata against them.
HC_SINKHORN_ITERS = 20
HC_EPS = 1.0e-6
EXPERT_WEIGHTS_SCALE = 1.5
ROPE_SCALE_FACTOR = 16.0
ROPE_YARN_BETA_FAST = 32.0
ROPE_YARN_BETA_SLOW = 1.0
ROPE_ORIG_CTX = 65536
#: ``deepseek4.context_length``: printed by ``model_summary`` (2682) only; DeepSeek V4's 1M context.
CONTEXT_LENGTH = 1048576

#: Tokens ``vocab_load`` (ds4.c:36797-36810) looks up by text, with the ids the synthetic vocabulary
#: gives them (begin/end of sentence first, the chat markers last, as DeepSeek's added tokens are).
SPECIAL_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                  "<think>", "</think>", "｜DSML｜")

#: ds4's GGML types for the routed experts of each ds4lab expert format: (gate/up, down).
EXPERT_GGML_TYPES = {"iq2_xxs+q2_k": ("IQ2_XXS", "Q2_K"), "q4_k": ("Q4_K", "Q4_K")}
#: The GGML types this module declares (names as in ``gguf.GGMLQuantizationType``).
GGML_TYPES = ("F32", "F16", "I32", "Q8_0", "Q4_K", "Q2_K", "IQ2_XXS")
#: What a tensor's bytes are in the synthetic file: random values, or a hole (zero bytes, no disk).
FILLS = ("random", "hole")
#: ``dense`` choices of :func:`ds4_tensors`: the large Q8_0 matrices random, or holes too.
DENSE_CHOICES = ("random", "holes")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor ds4 asks for: ``name`` (as ds4 binds it), ``ggml_type`` (:data:`GGML_TYPES`), ``shape`` (GGUF order:
    ``shape[0]`` is ``ne0``, the contiguous one), ``fill`` (:data:`FILLS`), ``init`` (how the random values are drawn:
    :func:`ds4lab.ds4.gguf_writer.tensor_bytes`), ``layer`` (None for embedding and output head), ``check`` (the ds4.c
    check that fixes its type and shape)."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    fill: str
    init: str
    layer: int | None
    check: str

    @property
    def role(self) -> str:
        """The name without the ``blk.N.`` prefix (``attn_q_a.weight``)."""
        return self.name.split(".", 2)[2] if self.layer is not None else self.name

    @property
    def n_elements(self) -> int:
        """Number of elements (product of :attr:`shape`)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data, from the ``gguf`` package's block table (``GGML_QUANT_SIZES``). Raises BadInput:
        the contiguous dimension is not a whole number of the type's blocks."""
        import gguf

        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.ggml_type]]
        if self.shape[0] % block:
            raise BadInput(f"tensor {self.name}: dim[0]={self.shape[0]} is not a multiple of the "
                           f"{self.ggml_type} block of {block}")
        return self.n_elements // block * size


@dataclass(frozen=True)
class MetaKV:
    """One metadata key: ``key``, ``vtype`` (GGUF value type name), ``value`` (a list for arrays, element type as the
    ``gguf`` package infers it), ``check`` (the ds4.c function that reads it, or ``ds4lab``)."""

    key: str
    vtype: str
    value: object
    check: str


def synthetic_config(preset: str | ModelConfig) -> ModelConfig:
    """The ds4lab configuration of ``preset`` (a name or a :class:`ModelConfig`), checked for a GGUF. Raises BadInput:
    unknown preset (the message lists the known ones), or an expert format ds4 has no GGML type for (``q4blk`` is
    ds4lab's own; ds4 knows ``iq2_xxs+q2_k`` and ``q4_k``)."""
    if isinstance(preset, ModelConfig):
        cfg = preset
    else:
        try:
            cfg = get_preset(preset)
        except ConfigError as e:
            raise BadInput(str(e)) from None
    if cfg.expert_format not in EXPERT_GGML_TYPES:
        raise BadInput(f"preset {cfg.name!r}: expert_format={cfg.expert_format!r} has no ds4 GGML type; "
                       f"choose a preset with one of {', '.join(EXPERT_GGML_TYPES)}")
    return cfg


def layer_compress_ratio(cfg: ModelConfig, layer: int) -> int:
    """Compression ratio of ``layer`` in the file (0, 4 or 128) whatever ``cfg.long_context`` says: ds4 always loads
    the compressed-attention tensors (ds4.c ``ds4_expected_layer_compress_ratio``, 1079)."""
    return cfg.replace(long_context=True).compress_ratio(layer)


#: Bytes per 256-weight super-block of each routed-expert type, and the byte offsets of its fp16 scale
#: fields (ggml's ``block_iq2_xxs``: ``d`` then 32 ``uint16`` grid indices; ``block_q2_K``: 16 scale
#: bytes, 64 quant bytes, then ``d`` and ``dmin``; ``block_q4_K``: ``d``, ``dmin``, 12 scale bytes,
#: 128 quant bytes): what random expert data must hold so that every weight stays finite and small.
EXPERT_BLOCKS = {"IQ2_XXS": (66, (0,)), "Q2_K": (84, (80, 82)), "Q4_K": (144, (0, 2))}


def ds4_tensors(preset: str | ModelConfig = "ds4-flash", *, dense: str = "random",
                random_expert_layers=()) -> list[TensorSpec]:
    """Every tensor ds4 binds for ``preset``, in file order (``weights_bind_output``, ds4.c:5819;
    ``weights_bind_layer``, 5895), typed and shaped as ``weights_validate_layout`` (5045-5110) checks them. ``dense``:
    the large Q8_0 matrices ``"random"`` or ``"holes"``; ``random_expert_layers``: layers whose routed experts hold
    random blocks instead of holes. Returns the :class:`TensorSpec` list. Raises BadInput: bad ``preset``, ``dense`` or
    ``random_expert_layers``."""
    if dense not in DENSE_CHOICES:
        raise BadInput(f"dense={dense!r}; choose one of: {', '.join(DENSE_CHOICES)}")
    cfg = synthetic_config(preset)
    bad = [il for il in random_expert_layers if not 0 <= int(il) < cfg.n_layers]
    if bad:
        raise BadInput(f"random_expert_layers={list(random_expert_layers)!r}: {cfg.name} has layers 0..{cfg.n_layers - 1}")
    out: list[TensorSpec] = []
    q8_fill = "random" if dense == "random" else "hole"

    def add(name, t, shape, init, layer, check=None, fill="random"):
        check = check or f"{_VL}: tensor_expect_layout {t}"
        out.append(TensorSpec(name, t, tuple(int(d) for d in shape), fill, init, layer, check))

    def q8(name, shape, layer):
        add(name, "Q8_0", shape, "q8_0", layer, _DQ, q8_fill)

    E, S = cfg.embed, cfg.hc_streams
    add("token_embd.weight", "F16", (E, cfg.vocab), "embedding", None)
    random_layers = {int(x) for x in random_expert_layers}
    for il in range(cfg.n_layers):
        _layer_tensors(cfg, il, add, q8, "random" if il in random_layers else "hole")
    add("output_hc_base.weight", "F32", (S,), "hc_base", None)
    add("output_hc_fn.weight", "F16", (S * E, S), "f16_matrix", None)
    add("output_hc_scale.weight", "F32", (1,), "hc_scale", None)
    add("output_norm.weight", "F32", (E,), "norm", None)
    q8("output.weight", (E, cfg.vocab), None)
    return out


_VL = "weights_validate_layout (ds4.c:5012)"
_DQ = f"{_VL}: tensor_expect_dense_quant_layout (Q8_0, Q4_K or Q4_0; Q8_0 as ds4's Flash files)"


def _layer_tensors(cfg: ModelConfig, il: int, add, q8, expert_fill: str) -> None:
    """Layer ``il``'s tensors in ds4's binding order, through :func:`ds4_tensors`' ``add`` and ``q8``."""
    E, H, D, Q = cfg.embed, cfg.n_heads, cfg.head_dim, cfg.q_lora
    G, O, X, F, S = cfg.out_groups, cfg.out_lora, cfg.n_experts, cfg.expert_ffn, cfg.hc_streams
    M, Hi, Di = 2 * S + S * S, cfg.index_heads, cfg.index_head_dim
    p, ratio = f"blk.{il}.", layer_compress_ratio(cfg, il)

    def hc(which):
        add(f"{p}hc_{which}_fn.weight", "F16", (S * E, M), "f16_matrix", il)
        add(f"{p}hc_{which}_scale.weight", "F32", (3,), "hc_scale", il)
        add(f"{p}hc_{which}_base.weight", "F32", (M,), "hc_base", il)

    def compressor(prefix, width, r, norm):
        add(f"{p}{prefix}_ape.weight", "F16", (width, r), "ape", il)
        add(f"{p}{prefix}_kv.weight", "F16", (E, width), "f16_matrix", il)
        add(f"{p}{prefix}_gate.weight", "F16", (E, width), "f16_matrix", il)
        add(f"{p}{prefix}_norm.weight", "F32", (norm,), "norm", il)

    hc("attn")
    add(p + "attn_norm.weight", "F32", (E,), "norm", il)
    q8(p + "attn_q_a.weight", (E, Q), il)
    add(p + "attn_q_a_norm.weight", "F32", (Q,), "norm", il)
    q8(p + "attn_q_b.weight", (Q, H * D), il)
    q8(p + "attn_kv.weight", (E, D), il)
    add(p + "attn_kv_a_norm.weight", "F32", (D,), "norm", il)
    add(p + "attn_sinks.weight", "F32", (H,), "sinks", il)
    q8(p + "attn_output_a.weight", (D * (H // G), G * O), il)
    q8(p + "attn_output_b.weight", (G * O, E), il)
    if ratio:
        compressor("attn_compressor", (2 if ratio == 4 else 1) * D, ratio, D)
    if ratio == 4:
        add(p + "indexer.attn_q_b.weight", "F16", (Q, Hi * Di), "f16_matrix", il,
            f"{_VL}: tensor_expect_f16_or_q8_0_layout (F16 as ds4's Flash files)")
        add(p + "indexer.proj.weight", "F16", (E, Hi), "f16_matrix", il)
        compressor("indexer_compressor", 2 * Di, 4, Di)
    hc("ffn")
    add(p + "ffn_norm.weight", "F32", (E,), "norm", il)
    add(p + "ffn_gate_inp.weight", "F16", (E, X), "f16_matrix", il)
    if not cfg.is_hash_layer(il):
        add(p + "exp_probs_b.bias", "F32", (X,), "bias", il, f"{_VL}: tensor_expect_optional F32")
    ex = f"{_VL}: tensor_expect_routed_expert (gate and up of one type)"
    gate_up_t, down_t = EXPERT_GGML_TYPES[cfg.expert_format]
    add(p + "ffn_gate_exps.weight", gate_up_t, (E, F, X), "experts", il, ex, expert_fill)
    add(p + "ffn_up_exps.weight", gate_up_t, (E, F, X), "experts", il, ex, expert_fill)
    add(p + "ffn_down_exps.weight", down_t, (F, E, X), "experts", il, ex, expert_fill)
    q8(p + "ffn_gate_shexp.weight", (E, F), il)
    q8(p + "ffn_up_shexp.weight", (E, F), il)
    q8(p + "ffn_down_shexp.weight", (F, E), il)
    if cfg.is_hash_layer(il):
        add(p + "ffn_gate_tid2eid.weight", "I32", (cfg.n_used, cfg.vocab), "tid2eid", il)


def _bytes_to_unicode() -> list[str]:
    """The byte-level BPE alphabet: byte b → one printable character (the GPT-2 convention that ``tokenizer.ggml.model
    = gpt2`` vocabularies use: printable bytes stand for themselves, the others are shifted past U+0100)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, shift = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + shift))
            shift += 1
    return chars


@lru_cache(maxsize=4)
def synthetic_vocab(n_vocab: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A byte-level BPE vocabulary of exactly ``n_vocab`` distinct tokens and its merges: 0 and 1 begin/end of sentence,
    the 256 byte tokens, merged tokens (merge ``i`` makes token ``258 + i``), the :data:`SPECIAL_TOKENS` last. Returns
    ``(tokens, merges)``, tuples of strings (merges as ``"left right"``). Raises BadInput: ``n_vocab`` too small for the
    specials, the byte tokens and one merge (264)."""
    n_merges = n_vocab - len(SPECIAL_TOKENS) - 256
    if n_merges < 1:
        raise BadInput(f"vocab={n_vocab}: a synthetic vocabulary needs at least "
                       f"{len(SPECIAL_TOKENS) + 257} tokens (specials, 256 bytes, one merge)")
    chars = _bytes_to_unicode()
    merged: list[str] = []
    merges: list[str] = []
    for a in chars:  # pairs
        for b in chars:
            if len(merges) == n_merges:
                break
            merged.append(a + b)
            merges.append(f"{a} {b}")
    i = 0
    while len(merges) < n_merges:  # pair + byte
        pair = merged[i // 256]
        c = chars[i % 256]
        merged.append(pair + c)
        merges.append(f"{pair} {c}")
        i += 1
    tokens = list(SPECIAL_TOKENS[:2]) + chars + merged + list(SPECIAL_TOKENS[2:])
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    return tuple(tokens), tuple(merges)


def ds4_metadata(preset: str | ModelConfig = "ds4-flash", *, seed: int = 0,
                 dense: str = "random") -> list[MetaKV]:
    """Every metadata key of the synthetic file, in file order: ``general.architecture``, ds4lab's marker keys, the keys
    ``config_validate_deepseek4_model`` (ds4.c:5629) reads (``DS4_SHAPE_FLASH``'s values for ds4-flash), the tokenizer
    keys (:func:`synthetic_vocab`) and the bos/eos ids. Raises BadInput: bad ``preset``, ``dense`` or ``seed``."""
    cfg = synthetic_config(preset)
    if dense not in DENSE_CHOICES:
        raise BadInput(f"dense={dense!r}; choose one of: {', '.join(DENSE_CHOICES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise BadInput(f"seed={seed!r} must be an integer in 0..2**32-1")
    tokens, merges = synthetic_vocab(cfg.vocab)
    c = "config_validate_deepseek4_model (ds4.c:5629)"
    k = f"{ARCH}."
    u32 = lambda key, v, who=c: MetaKV(k + key, "UINT32", int(v), who)  # noqa: E731
    f32 = lambda key, v, who=c: MetaKV(k + key, "FLOAT32", float(v), who)  # noqa: E731
    n = cfg.n_layers
    return [
        MetaKV("general.architecture", "STRING", ARCH, "config_validate_model (ds4.c:5809)"),
        MetaKV("ds4lab.synthetic", "STRING", "synthetic weights written by ds4lab; not a trained model", "ds4lab"),
        MetaKV("ds4lab.preset", "STRING", cfg.name, "ds4lab"),
        MetaKV("ds4lab.seed", "UINT32", seed, "ds4lab"),
        MetaKV("ds4lab.dense", "STRING", dense, "ds4lab"),
        MetaKV("ds4lab.ds4_commit", "STRING", DS4_COMMIT, "ds4lab"),
        MetaKV("general.name", "STRING", f"ds4lab synthetic {cfg.name} (seed {seed})", "model_summary (ds4.c:2682)"),
        MetaKV("general.alignment", "UINT32", ALIGNMENT, "parse_metadata (ds4.c:2376)"),
        u32("block_count", n),
        u32("context_length", CONTEXT_LENGTH, "model_summary (ds4.c:2706)"),
        u32("embedding_length", cfg.embed),
        u32("vocab_size", cfg.vocab),
        u32("attention.head_count", cfg.n_heads),
        u32("attention.head_count_kv", cfg.n_kv_heads),
        u32("attention.key_length", cfg.head_dim),
        u32("attention.value_length", cfg.value_dim),
        u32("rope.dimension_count", cfg.rope_dims),
        u32("attention.q_lora_rank", cfg.q_lora),
        u32("attention.output_lora_rank", cfg.out_lora),
        u32("attention.output_group_count", cfg.out_groups),
        u32("expert_count", cfg.n_experts),
        u32("expert_used_count", cfg.n_used),
        u32("expert_feed_forward_length", cfg.expert_ffn),
        u32("expert_shared_count", cfg.n_shared),
        u32("hash_layer_count", cfg.n_hash_layers),
        u32("attention.sliding_window", cfg.window),
        u32("attention.indexer.head_count", cfg.index_heads),
        u32("attention.indexer.key_length", cfg.index_head_dim),
        u32("attention.indexer.top_k", cfg.index_top_k),
        u32("hyper_connection.count", cfg.hc_streams),
        u32("hyper_connection.sinkhorn_iterations", HC_SINKHORN_ITERS),
        MetaKV(k + "attention.compress_ratios", "ARRAY", [layer_compress_ratio(cfg, il) for il in range(n)],
               "validate_compress_ratio_metadata (ds4.c:5530)"),
        MetaKV(k + "swiglu_clamp_exp", "ARRAY", [float(cfg.swiglu_limit)] * n,
               "validate_swiglu_clamp_metadata (ds4.c:5568)"),
        u32("rope.scaling.original_context_length", ROPE_ORIG_CTX),
        f32("rope.freq_base", cfg.rope_theta),
        f32("rope.scaling.factor", ROPE_SCALE_FACTOR),
        f32("rope.scaling.yarn_beta_fast", ROPE_YARN_BETA_FAST),
        f32("rope.scaling.yarn_beta_slow", ROPE_YARN_BETA_SLOW),
        f32("attention.compress_rope_freq_base", cfg.compress_rope_theta),
        f32("expert_weights_scale", EXPERT_WEIGHTS_SCALE),
        f32("attention.layer_norm_rms_epsilon", cfg.rms_eps),
        f32("hyper_connection.epsilon", HC_EPS),
        MetaKV(k + "expert_weights_norm", "BOOL", True, c),
        MetaKV("tokenizer.ggml.model", "STRING", "gpt2", "vocab_load (ds4.c:36750): not read"),
        MetaKV("tokenizer.ggml.pre", "STRING", "joyai-llm", "bpe_tokenize_text (ds4.c:36641): Flash's pre-tokenizer"),
        MetaKV("tokenizer.ggml.tokens", "ARRAY", list(tokens), "vocab_load (ds4.c:36755)"),
        MetaKV("tokenizer.ggml.merges", "ARRAY", list(merges), "vocab_load (ds4.c:36760)"),
        MetaKV("tokenizer.ggml.bos_token_id", "UINT32", 0, "vocab_load: GLM only; DeepSeek4 finds the text"),
        MetaKV("tokenizer.ggml.eos_token_id", "UINT32", 1, "vocab_load: GLM only; DeepSeek4 finds the text"),
    ]


def plan_totals(specs: list[TensorSpec]) -> dict:
    """Byte totals of a tensor list: ``tensor_bytes`` (all data, unpadded), ``random_bytes`` (what the writer writes),
    ``hole_bytes``, and the same split by GGML type (``by_type``)."""
    by_type: dict[str, dict[str, int]] = {}
    rnd = hole = 0
    for s in specs:
        b = s.nbytes
        t = by_type.setdefault(s.ggml_type, {"random": 0, "hole": 0, "tensors": 0})
        t[s.fill] += b
        t["tensors"] += 1
        if s.fill == "random":
            rnd += b
        else:
            hole += b
    return {"tensor_bytes": rnd + hole, "random_bytes": rnd, "hole_bytes": hole, "by_type": by_type}
