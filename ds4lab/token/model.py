"""The decode token: ds4's launch order for one token, on any backend (:class:`DecodeModel`), each cluster in its own
census/NVTX scope; the capture hazards' paths are :class:`TokenOptions`. Launch order and simplifications:
``docs/model.md``."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import numpy as np

from ..capture.launch import Launcher
from . import ops
from . import reference as R
from . import weights as W
from .config import MOE_TILE, ModelConfig
from .reference import max_tiles

COUNTS_CLEAR = ("sync", "async")
SCALARS = ("value", "device")
SCRATCH = ("on-demand", "prealloc")
LONGCTX = ("host", "device", "conditional")
#: ds4's MoE profile stages, between 7 events (context file, "The routed MoE kernel sequence").
MOE_STAGES = ("xq", "sort", "gateup", "midq", "down", "sum")


@dataclass(frozen=True)
class TokenOptions:
    """Which code path each capture hazard takes (ds4 today first; ``docs/model.md``, ``docs/capture-stages.md``).

    ``counts_clear``: ``"sync"`` (``cudaMemset``, legacy stream) or ``"async"``; ``scalars``: ``"value"`` (kernel
    arguments) or ``"device"`` (a device buffer written before each token); ``scratch``: ``"on-demand"`` or
    ``"prealloc"``; ``vocab``: final norm and vocabulary projection; ``moe_profile``: ds4's 7 profiling events;
    ``moe_host_timed``, ``legacy_sites``, ``sync_in_body``: ds4-today paths that break capture; ``longctx``:
    ``"host"`` (ds4), ``"device"`` (stage 3c) or ``"conditional"`` (stage 3cc); ``pdl``: programmatic stream
    serialization inside captures (stages 3p, 3cp, 3ccp)."""

    counts_clear: str = "sync"
    scalars: str = "value"
    scratch: str = "prealloc"
    vocab: bool = False
    moe_profile: bool = False
    #: ds4's way of reading the MoE profile: synchronize on the last event and read the elapsed
    #: times on the host, every call (a capture hazard).
    moe_host_timed: bool = False
    #: Launch sites sent to the legacy stream, bypassing the accessor (a capture hazard).
    legacy_sites: tuple = ()
    #: End the token body with a device synchronize (ds4's cudaDeviceSynchronize inside what
    #: stage 3 captures: a capture hazard).
    sync_in_body: bool = False
    longctx: str = "host"
    pdl: bool = False

    def __post_init__(self):
        for field, allowed in (("counts_clear", COUNTS_CLEAR), ("scalars", SCALARS), ("scratch", SCRATCH),
                               ("longctx", LONGCTX)):
            v = getattr(self, field)
            if v not in allowed:
                raise ValueError(f"TokenOptions.{field}={v!r}; choose one of: {', '.join(allowed)}")

    def summary(self) -> dict:
        return asdict(self)


class MoeScratch:
    """Routed-MoE buffers sized for ``capacity`` tokens; grows on demand unless preallocated. ``cfg.moe_path``
    ``"ds4"`` has ``xb``, ``mb``, ``mid`` (``gate``, ``up`` None); ``"five"`` the reverse."""

    def __init__(self, model: "DecodeModel", capacity: int) -> None:
        self.model = model
        self.capacity = 0
        self.allocations = 0
        self._alloc(capacity)

    def _alloc(self, T: int) -> None:
        cfg, be = self.model.cfg, self.model.be
        E, F, k, N = cfg.embed, cfg.expert_ffn, cfg.n_used, cfg.n_experts
        P = T * k
        # On demand: a real cudaMalloc whenever the scratch grows (ds4's growing scratch);
        # preallocated: from the backend's pool, once, before anything is captured.
        mk = be.malloc if self.model.opts.scratch == "on-demand" else be.empty
        ds4 = cfg.moe_path == "ds4"
        f32, i32, i8, i16 = np.float32, np.int32, np.int8, np.int16
        self.max_tiles = max_tiles(P, N, MOE_TILE)
        # In allocation order; None: not on this path. Q8_K input (xq, xd) and middle (mq, md): quants and scales,
        # on ds4's path also the int16 sums of 16 (xb, mb); ds4's path has the weighted SwiGLU middle (mid), the
        # five-launch path gate and up.
        for name, spec in (("logits", ((T, N), f32)), ("ids", ((T, k), i32)), ("wts", ((T, k), f32)),
                           ("xq", ((T, E), i8)), ("xd", ((T, E // 256), f32)), ("xb", ds4 and ((T, E // 16), i16)),
                           ("mid", ds4 and ((P, F), f32)), ("gate", not ds4 and ((P, F), f32)),
                           ("up", not ds4 and ((P, F), f32)), ("mq", ((P, F), i8)), ("md", ((P, F // 256), f32)),
                           ("mb", ds4 and ((P, F // 16), i16)), ("out", ((P, E), f32)), ("y", ((T, E), f32)),
                           ("counts", ((N,), i32)), ("offsets", ((N,), i32)), ("cursor", ((N,), i32)),
                           ("sorted", ((P,), i32)), ("tiles", ((self.max_tiles, 3), i32)), ("n_tiles", ((1,), i32))):
            setattr(self, name, mk(*spec) if spec else None)
        self.capacity = T
        self.allocations += 1
        self.model.generation += 1

    def ensure(self, T: int) -> None:
        """Make room for ``T`` tokens: a no-op when preallocated large enough, else (re)allocate."""
        if T > self.capacity:
            if self.model.opts.scratch == "prealloc":
                raise ValueError(f"T={T} tokens exceed the preallocated MoE scratch "
                                 f"(max_tokens={self.capacity}); raise max_tokens")
            self._alloc(T)


class TopkScratch:
    """Scratch of the indexer's chunked top-k, int32 words: ``prealloc`` sized for ``max_context``, or ``on-demand``
    (ds4's ``cuda_tmp_alloc``: a fresh ``cudaMalloc`` when a token needs more, a capture hazard)."""

    def __init__(self, model: "DecodeModel", words: int) -> None:
        self.model = model
        self.words = 0
        self.allocations = 0
        self.buf = None
        if model.opts.scratch == "prealloc":
            self._alloc(max(1, words))

    def _alloc(self, words: int) -> None:
        be = self.model.be
        mk = be.malloc if self.model.opts.scratch == "on-demand" else be.empty
        self.buf = mk((words,), np.int32)
        self.words = words
        self.allocations += 1
        self.model.generation += 1

    def ensure(self, words: int):
        """The scratch buffer, holding at least ``words`` words (grown on demand)."""
        if words > self.words:
            if self.model.opts.scratch == "prealloc":
                raise ValueError(f"top-k scratch of {words} words exceeds the preallocated {self.words}")
            self._alloc(words)
        return self.buf


class LongContext:
    """Caches and scratch of the compressed layers (``layers[l]``, None for an uncompressed one;
    ``weights.cache_layout``), prefilled with seeded random rows, and the compressors', indexer's and top-k's scratch.
    """

    def __init__(self, model: "DecodeModel") -> None:
        cfg, be = model.cfg, model.be
        f = np.float32
        self.model = model
        self.layers: list[dict | None] = []
        for layer in range(model.n_layers):
            if not cfg.compress_ratio(layer):
                self.layers.append(None)
                continue
            bufs = {name: be.empty(shape, f) for name, shape in W.cache_layout(cfg, layer).items() if name != "kv"}
            self.layers.append(bufs)
        self.fill()
        D, Di = cfg.head_dim, cfg.index_head_dim
        for name, n in (("kvsc", 4 * D), ("pooled", D), ("normed", D), ("ikvsc", 4 * Di), ("ipooled", Di),
                        ("inormed", Di), ("iq", cfg.index_q_dim), ("iw", cfg.index_heads)):
            setattr(self, name, be.empty((n,), f))  # the compressors' (i: the indexer's) rows, query, head weights
        cap4 = cfg.comp_capacity(4)
        self.scores = be.empty((cap4,), f)
        self.sel = be.empty((cfg.index_top_k,), np.int32)
        self.topk = TopkScratch(model, R.topk_plan(cap4, cfg.index_top_k)[1])

    def fill(self) -> None:
        """(Re)fill every cache and state with its seeded prefill rows."""
        cfg, be = self.model.cfg, self.model.be
        for layer, bufs in enumerate(self.layers):
            for name, buf in (bufs or {}).items():
                be.fill_f32(buf, f"{name}_prefill@{layer}", 1.0, 0.0, cfg.seed)


class ProfileMarker:
    """Stands in for one of the 7 profiling events in ``DecodeModel.profile_events``: at that point of the routed MoE
    the model calls :meth:`fire` instead of recording a CUDA event (an in-graph timestamp kernel, an NVTX mark)."""

    def fire(self, site: str) -> None:
        """Mark profiling point ``site`` (``profile.xq`` … ``profile.end``) on the current stream."""
        raise NotImplementedError

    def fold(self) -> "ops.KernelStamp | None":
        """The stamp the stage kernel that follows this point may write instead of :meth:`fire` (one slot, ``n`` = 1),
        or None (the default: the point is fired). Points folded into the same kernel must have consecutive slots of
        one buffer."""
        return None

    def folded_into(self, kernel: str) -> None:
        """Told which kernel carries this folded point (trace-based readers match it by name)."""


class MoeObserver:
    """What a routed-MoE profiler attached to a model sees (``DecodeModel.moe_observer``): each hook gets ``run`` and
    must call it exactly once; it may record around it, swap ``profile_events``, or raise before it."""

    def around_moe_cluster(self, layer: int, T: int, run) -> None:
        """Around one ``moe`` cluster run of ``layer`` for ``T`` tokens (eager, capture or replay)."""
        run()

    def around_routed_moe(self, layer: int, T: int, run):
        """Around one routed-MoE call; returns what ``run()`` returns (the output buffer)."""
        return run()


class DecodeModel:
    """Weights, buffers and the launch sequence of one decode token: ``backend`` (:func:`ds4lab.backends.make_backend`),
    ``opts`` (:class:`TokenOptions`), ``nvtx``, ``routed`` (False: the unrouted reference path), ``n_layers`` (only
    the first layers, same weights). Raises MemoryError when the weights do not fit (the message gives the bytes)."""

    def __init__(self, cfg: ModelConfig, backend, opts: TokenOptions | None = None, *,
                 nvtx: bool = False, routed: bool = True, n_layers: int | None = None) -> None:
        self.cfg = cfg
        self.be = backend
        self.opts = opts or TokenOptions()
        self.n_layers = cfg.n_layers if n_layers is None else n_layers
        if not 1 <= self.n_layers <= cfg.n_layers:
            raise ValueError(f"n_layers={n_layers} must be in 1..{cfg.n_layers}")
        self.L = Launcher(backend, nvtx=nvtx, routed=routed)
        self.L.legacy_sites = frozenset(self.opts.legacy_sites)
        #: Host-timed MoE profile lines (ds4's DS4_CUDA_MOE_PROFILE), one dict per call.
        self.moe_profile_log: list[dict] = []
        #: The routed-MoE profiler attached to this model, or None (:class:`MoeObserver`;
        #: ``ds4lab.moeprof.MoeProfiler.attach`` sets it). It sees every ``moe`` cluster run and
        #: every routed-MoE call, and may put :class:`ProfileMarker` objects in ``profile_events``.
        self.moe_observer: MoeObserver | None = None
        #: Folded profiling points waiting for the next routed-MoE stage kernel (:meth:`_stamp`).
        self._folded: list[ProfileMarker] = []
        #: Bumped whenever a buffer is (re)allocated: part of every graph's buffer-alias key.
        self.generation = 0
        #: None runs every cluster eagerly; a ds4lab.capture.cache.GraphCache captures and replays some.
        self.executor = None
        #: A hazard the options cannot express, or None (``ds4lab.experiments.stage_run.ModelPatch``:
        #: ``forget``, decision prefixes the graph guard is not told; ``comp_row_by_value``).
        self.patch = None
        #: Stage 3cc's conditional nodes (``longctx="conditional"``), or None: ``_device_paths``.
        self.branches = None
        self._check_memory()
        self._alloc_weights()
        self._alloc_buffers()
        self._device_paths()
        # Weights and caches were filled on the legacy stream; a non-blocking stream does not
        # wait for it, so finish here before any stream may use them.
        self.be.synchronize()

    # ------------------------------------------------------------------ setup
    def memory_bytes(self) -> dict:
        """Device bytes of weights and caches (``weights.cache_bytes``, ``max_context`` positions), before allocating.
        """
        cfg = self.cfg
        return {"weights": W.model_bytes(cfg, self.opts.vocab, self.n_layers),
                "caches": W.cache_bytes(cfg, self.n_layers)}

    def _check_memory(self) -> None:
        mem = self.be.free_memory()
        if mem is None:  # host memory (numpy, sim): nothing to check against
            return
        free, total = mem
        mem = self.memory_bytes()
        need = mem["weights"] + mem["caches"]
        if need > free:
            caches = (f" + caches {mem['caches'] / 2**30:.1f} GiB (max_context={self.cfg.max_context}; "
                      "lower it to shrink the compressed caches)" if self.cfg.long_context else "")
            raise MemoryError(
                f"{self.cfg.name}: weights {mem['weights'] / 2**30:.1f} GiB{caches} need {need / 2**30:.1f} GiB "
                f"but the GPU has {free / 2**30:.1f} GiB "
                f"free of {total / 2**30:.1f} GiB" +
                (" (per_layer_experts=True allocates one routed bank per layer; use the shared bank)"
                 if self.cfg.per_layer_experts else ""))

    def _alloc_weights(self, cfg: ModelConfig | None = None) -> None:
        """The weights of ``cfg`` (default the model's; a tensor-parallel rank passes the whole model's), each made by
        :meth:`_layer_weight` and :meth:`_bank_weight` (a rank takes its share there)."""
        cfg, be = cfg or self.cfg, self.be
        self.layers = [{k: self._layer_weight(k, s) for k, s in
                        {**W.layer_specs(cfg, l), **W.compress_specs(cfg, l)}.items()}
                       for l in range(self.n_layers)]
        banks = sorted({W.bank_of_layer(cfg, l) for l in range(self.n_layers)})
        self.banks = {b: {k: self._bank_weight(s) for k, s in W.bank_specs(cfg, b).items()} for b in banks}
        #: The IQ2_XXS grid on the device (the gate/up kernels stage it), or None for other expert formats.
        self.expert_grid = be.from_host(W.IQ2XXS_GRID) if "iq2_xxs" in cfg.expert_formats else None
        g = W.global_specs(cfg)
        self.out_norm = be.make_weight(g["out_norm"])
        self.vocab = be.make_weight(g["vocab"]) if self.opts.vocab else None
        self.embed_key = W.tensor_key(cfg.seed, "embed")
        self.hash_keys = [W.tensor_key(cfg.seed, f"hash_route@{l}") for l in range(self.n_layers)]

    def _layer_weight(self, key: str, spec):
        return self.be.make_weight(spec)

    def _bank_weight(self, spec):
        return self.be.make_weight(spec)

    def _alloc_buffers(self) -> None:
        cfg, be = self.cfg, self.be
        S, E, D, H = cfg.hc_streams, cfg.embed, cfg.head_dim, cfg.n_heads
        f = np.float32
        # The token's activations, in allocation order; mix_final zeroed: zero logits, equal pre-mix weights.
        for name, shape in (("h", (S, E)), ("hn", (S, E)), ("mix_attn", (2 * S,)), ("mix_ffn", (2 * S,)),
                            ("mix_part", (2 * S * ops.HC_MIX_SPLIT,)), ("mix_final", (2 * S,)), ("x", (E,)),
                            ("qa", (cfg.q_lora,)), ("qan", (cfg.q_lora,)), ("q", (H, D)), ("kv", (D,)), ("kvn", (D,)),
                            ("o", (H, D)), ("oa", (cfg.out_groups * cfg.out_lora,)), ("sh_mid", (cfg.expert_ffn,)),
                            ("xf", (E,))):
            setattr(self, name, (be.zeros if name == "mix_final" else be.empty)(shape, f))
        self.logits = be.empty((cfg.vocab,), f) if self.opts.vocab else None
        # Always there (16 bytes), so a model can switch scalar modes between stages.
        self.scal = be.zeros((4,), np.int32)
        self.token_ids = be.zeros((cfg.max_tokens,), np.int32)
        # KV caches prefilled with hashed rows, as if a prompt had been processed.
        self.cache = []
        for l in range(self.n_layers):
            c = be.empty((cfg.window, D), f)
            be.fill_f32(c, f"kv_prefill@{l}", 1.0, 0.0, cfg.seed)
            self.cache.append(c)
        self.moe_buf = MoeScratch(self, 1 if self.opts.scratch == "on-demand" else cfg.max_tokens)
        ops.alloc_scratch(self.L, cfg)  # op-owned scratch (attention split partials), never in a capture
        #: Compressed-layer caches and scratch, or None without ``long_context``.
        self.lc = LongContext(self) if cfg.long_context else None
        self.profile_events = [be.new_event() for _ in range(7)] if self.opts.moe_profile else []

    @contextlib.contextmanager
    def observe(self, obs: "MoeObserver"):
        """Make ``obs`` the model's routed-MoE observer for the ``with`` block, the previous one back afterwards
        whatever the block raised (observers nest)."""
        prev, self.moe_observer = self.moe_observer, obs
        try:
            yield obs
        finally:
            self.moe_observer = prev

    def set_options(self, opts: TokenOptions) -> None:
        """Switch hazard paths and flags (a ladder stage) without reallocating weights. Raises ValueError for a change
        that needs other buffers (vocab, scratch mode)."""
        for f in ("vocab", "scratch"):
            if getattr(opts, f) != getattr(self.opts, f):
                raise ValueError(f"set_options cannot change {f} ({getattr(self.opts, f)!r} → {getattr(opts, f)!r}): "
                                 "build a new model")
        if opts.moe_profile and not self.profile_events:
            self.profile_events = [self.be.new_event() for _ in range(7)]
        self.opts = opts
        self.L.legacy_sites = frozenset(opts.legacy_sites)
        self._device_paths()

    def _device_paths(self) -> None:
        """Load the options' device-side paths now, never inside a capture (``pdl``'s build, stage 3cc's nodes).
        Raises ValueError for ``pdl`` on a backend that cannot launch programmatically."""
        from ..executor.device_graphs import DeviceGraphApi

        o = self.opts
        if o.pdl and not isinstance(self.be, DeviceGraphApi):
            raise ValueError(f"TokenOptions.pdl: backend {self.be.name!r} has no programmatic launch")
        self.L.programmatic = bool(o.pdl)
        if o.pdl:
            self.be.prepare_device_kernels(programmatic=True)
        if o.longctx == "conditional" and self.lc is not None:
            if self.branches is None:
                from .longctx_branches import LongctxBranches

                self.branches = LongctxBranches(self)
            else:
                self.branches.prepare(programmatic=o.pdl)

    def reset_state(self) -> None:
        """Refill the KV caches with their prefill rows: the state every stage's exactness run starts from (the streams
        are rewritten by every token's embedding)."""
        for layer, c in enumerate(self.cache):
            self.be.fill_f32(c, f"kv_prefill@{layer}", 1.0, 0.0, self.cfg.seed)
        if self.lc is not None:
            self.lc.fill()
        self.be.synchronize()

    # ------------------------------------------------------------------ the token
    def scalars(self, pos: int, token_id: int) -> ops.TokenScalars:
        """Per-token scalars for ``(pos, token_id)``; in device mode, written to the device first."""
        for what, v in (("position", pos), ("token id", token_id)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{what} {v!r} must be an integer")
        if not 0 <= pos < 2**31 - 1:
            raise ValueError(f"position {pos} must be in 0..{2**31 - 2} (an int32 kernel argument)")
        if self.cfg.long_context and pos >= self.cfg.max_context:
            raise ValueError(f"position {pos} is past the compressed caches: max_context={self.cfg.max_context} "
                             f"(positions 0..{self.cfg.max_context - 1})")
        if not 0 <= token_id < self.cfg.vocab:
            raise ValueError(f"token id {token_id} outside the vocabulary 0..{self.cfg.vocab - 1}")
        v = ops.host_scalars(self.cfg, pos, token_id)
        buf = self.scal if self.opts.scalars == "device" else None
        if buf is not None:
            with self.L.cluster("embed"):
                self.L.copy_h2d("scalars", buf, v)
        return ops.TokenScalars(int(v[0]), int(v[1]), int(v[2]), int(v[3]), buf)

    def _scalars_no_write(self, pos: int, token_id: int) -> ops.TokenScalars:
        v = ops.host_scalars(self.cfg, pos, token_id)
        return ops.TokenScalars(int(v[0]), int(v[1]), int(v[2]), int(v[3]),
                                self.scal if self.opts.scalars == "device" else None)

    def token(self, pos: int, token_id: int, write_scalars: bool = True) -> None:
        """Issue every launch of one decode token at position ``pos`` (asynchronous on a GPU). ``write_scalars=False``
        leaves writing the scalars' device buffer (``scalars="device"``) to the caller (a captured body must not copy
        from host memory)."""
        L = self.L
        with L.range("token", "token", pos):
            L.layer = -1
            ts = self.scalars(pos, token_id) if write_scalars else self._scalars_no_write(pos, token_id)
            self.run_cluster("token", -1, 1, ts, lambda: self._token_body(ts))
        L.census.token_done()

    def _token_body(self, ts: ops.TokenScalars) -> None:
        L = self.L
        self._embed(ts)
        for layer in range(self.n_layers):
            L.layer = layer
            with L.range("layer", "layer", layer):
                self._layer(layer, ts)
        self._final()
        if self.opts.sync_in_body:
            self.be.synchronize()

    def _embed(self, ts) -> None:
        with self.L.cluster("embed"):
            ops.embed_token(self.L, "embed", self.h, self.cfg, self.embed_key, ts)

    def _final(self) -> None:
        L, cfg = self.L, self.cfg
        L.layer = -1
        if self.opts.vocab:
            with L.cluster("final"):
                ops.hc_premix(L, "out_mix_norm", self.h, self.mix_final, None, self.out_norm, self.xf,
                              cfg.hc_streams, cfg.embed, cfg.rms_eps, nsplit=1)
                ops.q8_matvec(L, "vocab", self.vocab, self.xf, self.logits)

    # ------------------------------------------------------------------ clusters and host decisions
    def run_cluster(self, cluster: str, layer: int, T: int, ts, fn, inputs: tuple = ()) -> None:
        """Run one cluster's launches, eagerly or through the executor; ``inputs``' addresses join the graph's
        buffer-alias key."""
        if cluster == "moe" and self.moe_observer is not None:
            self.moe_observer.around_moe_cluster(layer, T, lambda: self._execute(cluster, layer, T, ts, fn, inputs))
        else:
            self._execute(cluster, layer, T, ts, fn, inputs)

    def _execute(self, cluster: str, layer: int, T: int, ts, fn, inputs: tuple) -> None:
        if self.executor is None:
            fn()
        else:
            self.executor.run(self, cluster, layer, T, ts, fn, inputs)

    def host_decisions(self, cluster: str, layer: int, T: int, ts) -> tuple:
        """The host-side choices a cluster's launches depend on, re-asked before every replay (MoE path and profile,
        attention regime, long-context decisions); a changed answer retires the graph
        (:class:`ds4lab.capture.cache.GraphCache`)."""
        d = []
        if cluster in ("moe", "island1", "token"):
            d.append(("moe.path", "sorted" if T > 1 else "decode"))
            d.append(("moe.profile", self.opts.moe_profile))
        if cluster in ("attn_span", "token") and ts is not None:
            if ts.buf is None:
                d.append(("attention.regime", "filling" if ts.n_valid < self.cfg.window else "full"))
            if self.lc is not None:
                d.extend(self.longctx_decisions(ts.pos, by_value=ts.buf is None))
        if cluster == "token":
            d.append(("vocab", self.opts.vocab))
        return tuple(d)

    def _hc_pre(self, name: str, wmix, wnorm, mix) -> None:
        cfg, L = self.cfg, self.L
        S, E = cfg.hc_streams, cfg.embed
        with L.cluster(name):
            ops.rms_norm_rows(L, "stream_norm", self.h, None, self.hn, S, E, cfg.rms_eps)
            ops.hc_mix(L, "mix", self.hn, wmix, self.mix_part, S, E)
            ops.hc_premix(L, "premix_norm", self.h, self.mix_part, mix, wnorm, self.x, S, E, cfg.rms_eps)

    def _layer(self, layer: int, ts: ops.TokenScalars) -> None:
        """One decode layer in ds4's three island parts (``island0``, the middle, ``island1``; ``docs/model.md``)."""
        w = self.layers[layer]
        self.run_cluster("island0", layer, 1, ts,
                         lambda: self._hc_pre("hc_attn", w["hc_attn_mix"], w["hc_attn_norm"], self.mix_attn))
        self._layer_middle(layer, ts)
        self.run_cluster("island1", layer, 1, ts, lambda: self._layer_tail(layer, ts))

    def _layer_middle(self, layer: int, ts: ops.TokenScalars) -> None:
        """The query and KV clusters, then the compressors and indexer of a compressed layer, and attention."""
        cfg, L, w = self.cfg, self.L, self.layers[layer]
        ratio = cfg.compress_ratio(layer)
        # ds4.c layer_rope_freq_base: compressed layers rotate q and kv with the compressed base.
        theta = cfg.compress_rope_theta if ratio else None
        with L.cluster("query"):
            ops.q8_matvec(L, "q_a", w["q_a"], self.x, self.qa)
            ops.rms_norm_rows(L, "q_a_norm", self.qa, w["q_a_norm"], self.qan, 1, cfg.q_lora, cfg.rms_eps)
            ops.q8_matvec(L, "q_b", w["q_b"], self.qan, self.q)
            ops.rms_norm_rows(L, "q_head_norm", self.q, w["q_head_norm"], self.q, cfg.n_heads, cfg.head_dim,
                              cfg.rms_eps)
            ops.rope_q(L, "q_rope", self.q, cfg, ts, theta=theta)
        with L.cluster("kv"):
            ops.q8_matvec(L, "kv", w["kv"], self.x, self.kv)
            ops.rms_norm_rows(L, "kv_norm", self.kv, w["kv_norm"], self.kvn, 1, cfg.head_dim, cfg.rms_eps)
            ops.rope_store_kv(L, "kv_rope_store", self.kvn, self.cache[layer], cfg, ts, theta=theta)
        if ratio:
            self._compressed_attention(layer, ratio, ts)
        else:
            def attention():
                with L.cluster("attention"):
                    ops.attention_decode(L, "attention", self.q, self.cache[layer], self.o, cfg, ts)

            self.run_cluster("attn_span", layer, 1, ts, attention)

    def _layer_tail(self, layer: int, ts: ops.TokenScalars) -> None:
        """Attention output projection and its expand into the streams, the FFN pre-mix, the router, the routed MoE and
        the shared expert."""
        cfg, L, w = self.cfg, self.L, self.layers[layer]
        with L.cluster("output"):
            ops.q8_matvec(L, "o_a", w["o_a"], self.o, self.oa, rows_per_group=cfg.out_lora,
                          group_stride=cfg.group_in)
            ops.q8_matvec_expand(L, "o_b_expand", w["o_b"], self.oa, self.h, self.mix_attn, None, cfg.hc_streams)
        self._hc_pre("hc_ffn", w["hc_ffn_mix"], w["hc_ffn_norm"], self.mix_ffn)
        self.router(layer, self.x, 1, ts=ts)
        self.run_cluster("moe", layer, 1, ts, lambda: self.routed_moe(layer, self.x, 1))
        self.run_cluster("shared", layer, 1, ts, lambda: self._shared(layer, self.moe_buf.y))

    def _shared(self, layer: int, y) -> None:
        cfg, L, w = self.cfg, self.L, self.layers[layer]
        with L.cluster("shared"):
            ops.q8_matvec_swiglu(L, "sh_gateup_swiglu", w["sh_gateup"], self.x, self.sh_mid, cfg.swiglu_limit)
            ops.q8_matvec_expand(L, "sh_down_expand", w["sh_down"], self.sh_mid, self.h, self.mix_ffn, y,
                                 cfg.hc_streams)

    # ------------------------------------------------------------------ router and routed MoE
    def router(self, layer: int, x, T: int, ts: ops.TokenScalars | None = None, token_ids=None) -> None:
        """Router for ``T`` tokens ``x [T, E]``: logits, then top-k, or hash routing (token ids from ``token_ids``,
        device ``[T]``, or for one token ``ts``) in the first layers."""
        cfg, L = self.cfg, self.L
        self.moe_buf.ensure(T)
        b = self.moe_buf
        with L.cluster("router"):
            ops.router_logits(L, "router_logits", self.layers[layer]["router"], x, b.logits, T, cfg)
            if cfg.is_hash_layer(layer):
                ops.router_hash(L, "router_hash", b.logits, b.ids, b.wts, T, cfg, layer, self.hash_keys[layer],
                                token_ids=token_ids, ts=ts)
            else:
                ops.router_topk(L, "router_topk", b.logits, b.ids, b.wts, T, cfg)

    def routed_moe(self, layer: int, x, T: int):
        """The routed MoE for ``T`` tokens after :meth:`router`; returns the output buffer ``[T, E]``. Stages as ds4's,
        with its 7 profiling events when ``moe_profile`` is on; an attached :attr:`moe_observer` wraps the call."""
        if self.moe_observer is not None:
            return self.moe_observer.around_routed_moe(layer, T, lambda: self._routed_moe(layer, x, T))
        return self._routed_moe(layer, x, T)

    def _mark(self, site: str, event, fold: bool = True) -> None:
        """One of ds4's 7 profiling points: a CUDA event record, or a profiler's marker. With ``fold`` (the next launch
        is a stage kernel that takes a stamp), a marker that can fold (:meth:`ProfileMarker.fold`) waits for that
        kernel instead of launching anything."""
        if isinstance(event, ProfileMarker):
            if fold and event.fold() is not None:
                self._folded.append(event)
                return
            self._flush_folded()
            event.fire(site)
        else:
            self.L.event_record(site, event)

    def _stamp(self, kernel: str) -> "ops.KernelStamp | None":
        """The stamp of the folded points waiting for the stage kernel ``kernel`` (launched next), or None: one kernel
        writes them all (consecutive slots)."""
        pts, self._folded = self._folded, []
        if not pts:
            return None
        fs = [p.fold() for p in pts]
        if [f.first for f in fs] != list(range(fs[0].first, fs[0].first + len(fs))):
            raise RuntimeError(f"folded profiling points need consecutive slots, got {[f.first for f in fs]}")
        for p in pts:
            p.folded_into(kernel)
        writes = [f.write for f in fs if f.write is not None]

        def write():
            for w in writes:
                w()

        return ops.KernelStamp(fs[0].slots, fs[0].first, len(fs), write if writes else None)

    def _flush_folded(self) -> None:
        """Fire the folded points no kernel took yet (before a point that cannot fold: order kept)."""
        pts, self._folded = self._folded, []
        for p in pts:
            p.fire("profile.folded")

    def _routed_moe(self, layer: int, x, T: int):
        self.moe_buf.ensure(T)
        b = self.moe_buf
        ev = self.profile_events
        with self.L.cluster("moe"):
            self.moe_launches(self.banks[W.bank_of_layer(self.cfg, layer)], x, b.ids, b.wts, T, ev)
            if ev and self.opts.moe_host_timed:
                # ds4: cudaEventSynchronize on the last event, elapsed times read on the host.
                self.be.event_synchronize(ev[6])
                ms = [self.be.event_elapsed_ms(ev[i], ev[i + 1]) for i in range(6)]
                self.moe_profile_log.append({"layer": layer, "tokens": T, "pairs": T * self.cfg.n_used,
                                             **dict(zip(MOE_STAGES, ms)), "total": sum(ms)})
        return b.y

    def moe_launches(self, bank: dict, x, ids, wts, T: int, ev=()) -> None:
        """Every launch of one routed-MoE call for ``x [T, E]`` routed to ``ids``/``wts`` (``[T, k]``) on ``bank``
        (``{"gate_up", "down"}``) into ``moe_buf.y``; ``ev``: the 7 profiling points or none. Stages by
        ``cfg.moe_path`` (``"ds4"`` or ``"five"``; ``docs/model.md``)."""
        cfg, L, b = self.cfg, self.L, self.moe_buf
        P, N, E = T * cfg.n_used, cfg.n_experts, cfg.embed
        ds4 = cfg.moe_path == "ds4"
        mt = max_tiles(P, N, MOE_TILE)  # this call's tile bound (docs/design-log.md: not the buffers' capacity)

        self._folded = []

        def mark(i: int, stage: str, fold: bool = True) -> None:
            # ds4lab's five-launch kernels take a stamp (a folded point, no launch of its own);
            # ds4's kernels do not, so their points are launched as they come
            if ev:
                self._mark(f"profile.{stage}", ev[i], fold=fold and not ds4)

        mark(0, "xq")
        if ds4:
            ops.xq_quantize_q8k(L, "xq", x, b.xq, b.xd, b.xb, T, E)
        else:
            ops.xq_quantize(L, "xq", x, b.xq, b.xd, T, E, stamp=self._stamp("xq_quantize"))
        mark(1, "sort", fold=T == 1)  # T > 1: a memset comes next
        if T > 1:
            L.memset("sort.counts_clear", b.counts, 0, sync=self.opts.counts_clear == "sync")
            ops.moe_count(L, "sort.count", ids, b.counts, P)
            ops.moe_prefix(L, "sort.prefix", b.counts, b.offsets, b.cursor, N)
            ops.moe_scatter(L, "sort.scatter", ids, b.cursor, b.sorted, P)
            ops.moe_tiles(L, "sort.tiles", b.counts, b.offsets, b.tiles, b.n_tiles, N)
        mark(2, "gateup")
        gu, dn = bank["gate_up"], bank["down"]
        tiles = (b.sorted, b.tiles, b.n_tiles)
        if ds4 and T > 1:
            ops.moe_gateup_mid_tiled(L, "gateup", gu, self.expert_grid, b.xq, b.xd, b.xb, *tiles, wts, b.mid, mt,
                                     P, cfg)
        elif ds4:
            ops.moe_gateup_mid(L, "gateup", gu, self.expert_grid, b.xq, b.xd, b.xb, ids, wts, b.mid, P, cfg)
        elif T > 1:
            ops.moe_gateup_tiled(L, "gateup", gu, b.xq, b.xd, *tiles, b.gate, b.up, mt, P, cfg,
                                 stamp=self._stamp("moe_gateup_tiled"))
        else:
            ops.moe_gateup_decode(L, "gateup", gu, b.xq, b.xd, ids, b.gate, b.up, P, cfg,
                                  stamp=self._stamp("moe_gateup_decode"))
        mark(3, "midq")
        if ds4:
            ops.moe_midq_q8k(L, "midq", b.mid, b.mq, b.md, b.mb, P, cfg)
        else:
            ops.moe_midq(L, "midq", b.gate, b.up, b.mq, b.md, P, cfg, stamp=self._stamp("moe_midq"))
        mark(4, "down")
        if ds4 and T > 1:
            ops.moe_down_tiled_ds4(L, "down", dn, b.mq, b.md, b.mb, *tiles, b.out, mt, P, cfg)
        elif ds4:
            ops.moe_down_sum(L, "down", dn, b.mq, b.md, b.mb, ids, b.y, T, cfg)
        elif T > 1:
            ops.moe_down_tiled(L, "down", dn, b.mq, b.md, *tiles, b.out, mt, P, cfg,
                               stamp=self._stamp("moe_down_tiled"))
        else:
            ops.moe_down_decode(L, "down", dn, b.mq, b.md, ids, b.out, P, cfg, stamp=self._stamp("moe_down_decode"))
        mark(5, "sum")
        if not ds4:
            ops.moe_sum(L, "sum", b.out, wts, b.y, T, cfg, stamp=self._stamp("moe_sum"))
        elif T > 1:
            ops.moe_sum_slots(L, "sum", b.out, b.y, T, cfg)
        mark(6, "end", fold=False)

    # ------------------------------------------------------------------ results
    def hidden(self) -> np.ndarray:
        """Host copy of the hyper-connection streams ``[S, E]`` (the final hidden state). Synchronizes."""
        return self.be.to_host(self.h)

    def output_logits(self) -> np.ndarray | None:
        """Host copy of the vocabulary logits ``[vocab]``, or None when ``vocab`` is off."""
        return None if self.logits is None else self.be.to_host(self.logits)

    def snapshot(self, start: int, end: int) -> dict:
        """Host copies of every tensor a decode error could land in after a token of ``start .. end`` (exclusive):
        ``hidden``, ``logits`` (or None), ``kv_cache[l]`` and, long context, the rows a token of ``start - 128 ..
        end`` writes (``kv_cache[l].<name>``). Synchronizes."""
        be = self.be
        rec = {"hidden": self.hidden().copy(), "logits": None if self.logits is None else self.output_logits().copy()}
        for layer, c in enumerate(self.cache):
            rec[f"kv_cache[{layer}]"] = be.to_host(c).copy()
            bufs = self.lc.layers[layer] if self.lc is not None else None
            if not bufs:
                continue
            ratio = self.cfg.compress_ratio(layer)
            rows = slice(max(0, (start - 128) // ratio), min(self.cfg.comp_capacity(ratio), end // ratio + 2))
            for name, b in bufs.items():
                rec[f"kv_cache[{layer}].{name}"] = np.array(be.to_host(b[rows] if name in ("comp", "index") else b),
                                                           copy=True)
        return rec

    def selected_experts(self) -> np.ndarray:
        """Host copy of the last router call's expert ids ``[T, k]`` (valid rows: the first T)."""
        return self.be.to_host(self.moe_buf.ids)

    # ------------------------------------------------------------------ long context: compressed layers

    @staticmethod
    def score_blocks(n_comp: int) -> int:
        """Grid of the indexer's score kernel for ``n_comp`` rows, ``ceil(n_comp / 32)`` blocks: a host decision as in
        ds4; stage 3c sizes it for the largest n_comp."""
        return max(1, -(-n_comp // ops.INDEX_ROWS))

    def compressed_ratios(self) -> list[int]:
        """The compression ratios present among this model's layers (sorted; empty without long context)."""
        return sorted({self.cfg.compress_ratio(layer) for layer in range(self.n_layers)} - {0})

    def longctx_decisions(self, pos: int, by_value: bool = True) -> tuple:
        """The long-context host decisions of a token at ``pos``: ``compressor.emit.r4`` / ``.r128``,
        ``indexer.regime``, ``indexer.topk_plan``, ``indexer.score_blocks`` and, with scalars by value,
        ``attention.comp_rows.r4`` / ``.r128``."""
        d = self._longctx_decisions(pos, by_value)
        forget = self.patch.forget if self.patch is not None else ()
        return tuple(x for x in d if not x[0].startswith(forget)) if forget else d

    def _longctx_decisions(self, pos: int, by_value: bool) -> tuple:
        cfg, d = self.cfg, []
        if self.opts.longctx in ("device", "conditional"):
            # One graph for every position: nothing position-dependent is chosen on the host.
            d.append(("longctx.launch", self.opts.longctx))
            if by_value:
                d.append(("longctx.position", pos))  # by value, every kernel would see a stale position
            return tuple(d)
        for ratio in self.compressed_ratios():
            n = R.comp_count(pos, ratio)
            d.append((f"compressor.emit.r{ratio}", R.is_emit(pos, ratio)))
            if ratio == 4:
                steps, _ = R.topk_plan(n, cfg.index_top_k)
                d.append(("indexer.regime", R.topk_regime(n, cfg.index_top_k)))
                d.append(("indexer.topk_plan", tuple((st.kernel, st.blocks, st.sets) for st in steps)))
                d.append(("indexer.score_blocks", self.score_blocks(n) if steps else 0))
            if by_value:
                d.append((f"attention.comp_rows.r{ratio}", len(R.attended_rows(pos, ratio, cfg.index_top_k,
                                                                                 np.zeros(cfg.index_top_k)))))
        return tuple(d)

    def _compressor(self, layer: int, ratio: int, ts, lane: str) -> None:
        """One compressor (``lane`` ``"comp"``: the attention's, ``"index"``: the indexer's) of a compressed layer:
        projection and store every token; on an emit token pool, norm, rotate and store the compressed row, and
        (ratio 4) shift the state (ds4.c ``compressor_decode_one``)."""
        cfg, L, w, lc = self.cfg, self.L, self.layers[layer], self.lc
        if self.patch is not None and self.patch.comp_row_by_value and ts.buf is not None:
            ts = ops.TokenScalars(ts.pos, ts.kv_row, ts.n_valid, ts.token_id, None)  # the hazard: by value
        bufs = lc.layers[layer]
        if lane == "comp":
            D, pre, kvsc, pooled, normed, rows = cfg.head_dim, "comp", lc.kvsc, lc.pooled, lc.normed, bufs["comp"]
        else:
            D, pre, kvsc, pooled, normed, rows = (cfg.index_head_dim, "index_comp", lc.ikvsc, lc.ipooled,
                                                  lc.inormed, bufs["index"])
        skv, ssc = bufs[f"{lane}_state_kv"], bufs[f"{lane}_state_score"]
        width = (2 if ratio == 4 else 1) * D
        ops.q8_matvec(L, f"{pre}_kvgate", w[f"{pre}_kvgate"], self.x, kvsc)
        ops.comp_store(L, f"{pre}_store", kvsc, w[f"{pre}_ape"], skv, ssc, width, ratio, ts)
        # ds4's path asks on the host whether this token emits; stage 3c launches the same four
        # kernels on every token and lets the device decide: pool and norm write scratch rows only,
        # and the rotate-store and the shift exit at once off an emit position. The same kernels
        # with the same geometry give the same bits as ds4's path (a fused emit kernel did not: its
        # reduction order differs from rms_norm_rows', measured on the H200).
        def emit():
            ops.comp_pool(L, f"{pre}_pool", skv, ssc, pooled, D, ratio)
            ops.rms_norm_rows(L, f"{pre}_norm", pooled, w[f"{pre}_norm"], normed, 1, D, cfg.rms_eps)
            ops.comp_rope_store(L, f"{pre}_rope_store", normed, rows, D, ratio, cfg, ts)
            if ratio == 4:
                ops.comp_shift(L, f"{pre}_shift", skv, ssc, width, ratio, ts)

        if self.opts.longctx == "conditional":  # stage 3cc: an IF node in a capture
            self.branches.emit(layer, lane, emit, R.is_emit(ts.pos, ratio))
        elif self.opts.longctx == "device" or R.is_emit(ts.pos, ratio):
            emit()

    def _compressed_attention(self, layer: int, ratio: int, ts) -> None:
        """Compressors, indexer (ratio 4, past top-k rows) and attention over window plus compressed rows, in ds4's
        order; the host decisions from :meth:`longctx_decisions` (one launch list with ``longctx="device"``)."""
        cfg, L, lc = self.cfg, self.L, self.lc
        bufs = lc.layers[layer]
        k = cfg.index_top_k
        cond = self.opts.longctx == "conditional"  # stage 3cc: conditional nodes (longctx_branches)
        if cond:
            self.branches.start_layer(layer, ratio, ts)
        with L.cluster("compressor"):
            self._compressor(layer, ratio, ts, "comp")
            if ratio == 4:
                self._compressor(layer, ratio, ts, "index")
        n = R.comp_count(ts.pos, ratio)
        device = self.opts.longctx == "device"
        # Host: the regime from this position's n_comp. Device (3c): the plan for the largest
        # n_comp max_context allows, every block reading n_comp from the position on the device.
        n_plan = cfg.comp_capacity(ratio) if device else n
        use_sel = ratio == 4 and R.topk_regime(n_plan, k) != "all"
        if cond:
            use_sel = ratio == 4 and self.branches.indexer(layer, ratio, ts)
        elif use_sel:
            self._indexer(layer, ratio, n_plan, ts)
        mode = ("device" if device or cond else True) if use_sel else False

        def attention():
            with L.cluster("attention"):
                ops.attention_comp(L, "attention", self.q, self.cache[layer], bufs["comp"],
                                   lc.sel if use_sel else None, self.o, cfg, ratio, mode, ts,
                                   n_rows=min(n, k) if use_sel else n)

        self.run_cluster("attn_span", layer, 1, ts, attention)

    def _indexer(self, layer: int, ratio: int, n_plan: int, ts) -> None:
        """The indexer of a ratio-4 layer: query, its RoPE, head weights, scores, top-k (ds4.c
        ``indexer_allowed_decode_one``), with the top-k launches planned for ``n_plan`` rows."""
        cfg, L, w, lc = self.cfg, self.L, self.layers[layer], self.lc
        k = cfg.index_top_k
        steps, words = R.topk_plan(n_plan, k)
        # Stage 3c runs the indexer at every position; while n_comp <= top-k (every row attended)
        # its kernels skip their work on the device (min_comp).
        device = self.opts.longctx == "device"
        min_comp = k if device else 0
        with L.cluster("indexer"):
            H, Di = cfg.index_heads, cfg.index_head_dim
            if device:
                ops.q8_matvec_when(L, "index_q", w["index_q_b"], self.qan, lc.iq, ratio, min_comp, ts)
            else:
                ops.q8_matvec(L, "index_q", w["index_q_b"], self.qan, lc.iq)
            ops.rope_heads(L, "index_q_rope", lc.iq, H, Di, cfg, ts, cfg.compress_rope_theta)
            if device:
                ops.q8_matvec_when(L, "index_weights", w["index_proj"], self.x, lc.iw, ratio, min_comp, ts)
            else:
                ops.q8_matvec(L, "index_weights", w["index_proj"], self.x, lc.iw)
            ops.indexer_score(L, "index_score", lc.iq, lc.iw, lc.layers[layer]["index"], lc.scores,
                              self.score_blocks(n_plan), cfg, ratio, ts, min_comp=min_comp)
            scratch = lc.topk.ensure(words) if words else None
            for st in steps:
                if st.kernel == "indexer_topk":
                    ops.indexer_topk(L, "index_topk", lc.scores, lc.sel, st.sort_n, cfg, ratio, ts)
                elif st.kernel == "indexer_topk_chunk":
                    ops.indexer_topk_chunk(L, "index_topk_chunk", lc.scores, scratch, st.blocks, st.sort_n, cfg,
                                           ratio, ts, min_comp=min_comp)
                else:
                    final = st.dst_off < 0
                    ops.indexer_topk_merge(L, "index_topk_merge", lc.scores, scratch, st.src_off,
                                           lc.sel if final else scratch, 0 if final else st.dst_off,
                                           st.blocks, st.sets, st.sort_n, cfg)
