"""The long-context part of the decode token (``cfg.long_context``; docs/model.md): the
compressed layers' caches and scratch (:class:`LongContext`, :class:`TopkScratch`), and
:class:`LongContextLayers`, the :class:`~ds4lab.token.model.DecodeModel` methods that take the host's
long-context decisions from the position and launch the compressors, the indexer and the
compressed attention.
"""

from __future__ import annotations

import numpy as np

from . import longctx_reference as LR
from . import ops, ops_longctx
from . import weights as W


class TopkScratch:
    """Scratch of the indexer's chunked top-k (candidate sets and tree levels), int32 words.

    ``prealloc``: sized once for the largest n_comp ``max_context`` allows. ``on-demand``: ds4's
    grow-on-demand allocator (``cuda_tmp_alloc``): a fresh ``cudaMalloc`` whenever a token needs
    more than it holds, which can happen while a stream captures (a capture hazard).
    """

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
    """Caches and scratch of the compressed layers (``cfg.long_context``; docs/model.md).

    Per compressed layer (``layers[l]``, None for an uncompressed one): the compressed rows
    ``comp``, the compressor state ``comp_state_kv`` / ``comp_state_score``, and for ratio 4 the
    indexer keys ``index`` and the indexer compressor's state (``weights.cache_layout``), all
    prefilled with seeded random rows, as if every position before the first decoded one had been
    processed. Shared scratch: the stacked kv/score projection, the pooled and normed row, the
    indexer query and head weights, the scores, the selection and the chunked top-k scratch.
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
        self.kvsc = be.empty((4 * D,), f)
        self.pooled = be.empty((D,), f)
        self.normed = be.empty((D,), f)
        self.ikvsc = be.empty((4 * Di,), f)
        self.ipooled = be.empty((Di,), f)
        self.inormed = be.empty((Di,), f)
        self.iq = be.empty((cfg.index_q_dim,), f)
        self.iw = be.empty((cfg.index_heads,), f)
        cap4 = cfg.comp_capacity(4)
        self.scores = be.empty((cap4,), f)
        self.sel = be.empty((cfg.index_top_k,), np.int32)
        self.topk = TopkScratch(model, LR.topk_plan(cap4, cfg.index_top_k)[1])

    def fill(self) -> None:
        """(Re)fill every cache and state with its seeded prefill rows."""
        cfg, be = self.model.cfg, self.model.be
        for layer, bufs in enumerate(self.layers):
            for name, buf in (bufs or {}).items():
                be.fill_f32(buf, f"{name}_prefill@{layer}", 1.0, 0.0, cfg.seed)


class LongContextLayers:
    """The compressed layers of :class:`~ds4lab.token.model.DecodeModel` (a base class of it): host
    decisions from the position, compressors, indexer and compressed attention, in ds4's order.
    They use the model's configuration, options, launcher, weights and buffers."""

    @staticmethod
    def score_blocks(n_comp: int) -> int:
        """Grid of the indexer's score kernel for ``n_comp`` rows: ``ceil(n_comp / 32)`` blocks.
        A host decision, as in ds4 (ds4_cuda.cu scores one row per block: grid n_comp); stage 3c
        sizes it for the largest n_comp and blocks past n_comp exit."""
        return max(1, -(-n_comp // ops_longctx.INDEX_ROWS))

    def compressed_ratios(self) -> list[int]:
        """The compression ratios present among this model's layers (sorted; empty without long context)."""
        return sorted({self.cfg.compress_ratio(layer) for layer in range(self.n_layers)} - {0})

    def longctx_decisions(self, pos: int, by_value: bool = True) -> tuple:
        """The long-context host decisions of a token at ``pos`` (what its launch list depends on):

        * ``compressor.emit.r4`` / ``.r128``: whether the compressors emit (3-4 launches more);
        * ``indexer.regime`` and ``indexer.topk_plan`` (kernel, blocks, sets per top-k launch):
          the top-k variant chosen from n_comp, and the chunked path's grids; ``indexer.score_blocks``:
          the score kernel's grid (it grows with n_comp: every 32 rows here, every row in ds4);
        * ``attention.comp_rows.r4`` / ``.r128``: compressed rows attended, only when the
          position goes to the kernels by value (with device scalars the kernels derive it).
        The top-k scratch's growth shows in the buffer generation (the graph key), not here.
        """
        cfg, d = self.cfg, []
        if self.opts.longctx == "device":
            # One launch list for every position: nothing position-dependent is chosen on the host.
            d.append(("longctx.launch", "device"))
            if by_value:
                d.append(("longctx.position", pos))  # by value, every kernel would see a stale position
            return tuple(d)
        for ratio in self.compressed_ratios():
            n = LR.comp_count(pos, ratio)
            d.append((f"compressor.emit.r{ratio}", LR.is_emit(pos, ratio)))
            if ratio == 4:
                steps, _ = LR.topk_plan(n, cfg.index_top_k)
                d.append(("indexer.regime", LR.topk_regime(n, cfg.index_top_k)))
                d.append(("indexer.topk_plan", tuple((st.kernel, st.blocks, st.sets) for st in steps)))
                d.append(("indexer.score_blocks", self.score_blocks(n) if steps else 0))
            if by_value:
                d.append((f"attention.comp_rows.r{ratio}", len(LR.attended_rows(pos, ratio, cfg.index_top_k,
                                                                                 np.zeros(cfg.index_top_k)))))
        return tuple(d)

    def _compressor(self, layer: int, ratio: int, ts, lane: str) -> None:
        """One compressor (``lane`` ``"comp"``: the attention's, ``"index"``: the indexer's) of a
        compressed layer: projection and store every token; on an emit token pool, norm, rotate
        and store the compressed row, and (ratio 4) shift the state (ds4.c ``compressor_decode_one``)."""
        cfg, L, w, lc = self.cfg, self.L, self.layers[layer], self.lc
        bufs = lc.layers[layer]
        if lane == "comp":
            D, pre, kvsc, pooled, normed, rows = cfg.head_dim, "comp", lc.kvsc, lc.pooled, lc.normed, bufs["comp"]
        else:
            D, pre, kvsc, pooled, normed, rows = (cfg.index_head_dim, "index_comp", lc.ikvsc, lc.ipooled,
                                                  lc.inormed, bufs["index"])
        skv, ssc = bufs[f"{lane}_state_kv"], bufs[f"{lane}_state_score"]
        width = (2 if ratio == 4 else 1) * D
        ops.q8_matvec(L, f"{pre}_kvgate", w[f"{pre}_kvgate"], self.x, kvsc)
        ops_longctx.comp_store(L, f"{pre}_store", kvsc, w[f"{pre}_ape"], skv, ssc, width, ratio, ts)
        # ds4's path asks on the host whether this token emits; stage 3c launches the same four
        # kernels on every token and lets the device decide: pool and norm write scratch rows only,
        # and the rotate-store and the shift exit at once off an emit position. The same kernels
        # with the same geometry give the same bits as ds4's path (a fused emit kernel did not: its
        # reduction order differs from rms_norm_rows', measured on the H200).
        if self.opts.longctx == "device" or LR.is_emit(ts.pos, ratio):
            ops_longctx.comp_pool(L, f"{pre}_pool", skv, ssc, pooled, D, ratio)
            ops.rms_norm_rows(L, f"{pre}_norm", pooled, w[f"{pre}_norm"], normed, 1, D, cfg.rms_eps)
            ops_longctx.comp_rope_store(L, f"{pre}_rope_store", normed, rows, D, ratio, cfg, ts)
            if ratio == 4:
                ops_longctx.comp_shift(L, f"{pre}_shift", skv, ssc, width, ratio, ts)

    def _compressed_attention(self, layer: int, ratio: int, ts) -> None:
        """Compressors, indexer (ratio 4, past top-k rows) and attention over the raw window plus
        compressed rows, in ds4's order (ds4.c, the compressed branch of the decode layer).

        Host decisions from the position (``longctx_decisions``): emit or not, the top-k regime
        and its launch plan; the kernels read the position itself from the token's scalars. With
        ``longctx="device"`` (stage 3c) the launch list is the same at every position.
        """
        cfg, L, lc = self.cfg, self.L, self.lc
        bufs = lc.layers[layer]
        k = cfg.index_top_k
        with L.cluster("compressor"):
            self._compressor(layer, ratio, ts, "comp")
            if ratio == 4:
                self._compressor(layer, ratio, ts, "index")
        n = LR.comp_count(ts.pos, ratio)
        device = self.opts.longctx == "device"
        # Host: the regime from this position's n_comp. Device (3c): the plan for the largest
        # n_comp max_context allows, every block reading n_comp from the position on the device.
        n_plan = cfg.comp_capacity(ratio) if device else n
        use_sel = ratio == 4 and LR.topk_regime(n_plan, k) != "all"
        if use_sel:
            self._indexer(layer, ratio, n_plan, ts)
        mode = ("device" if device else True) if use_sel else False
        with L.cluster("attention"):
            ops_longctx.attention_comp(L, "attention", self.q, self.cache[layer], bufs["comp"], lc.sel if use_sel else None,
                               self.o, cfg, ratio, mode, ts, n_rows=min(n, k) if use_sel else n)

    def _indexer(self, layer: int, ratio: int, n_plan: int, ts) -> None:
        """The indexer of a ratio-4 layer: query, its RoPE, head weights, scores, top-k (ds4.c
        ``indexer_allowed_decode_one``), with the top-k launches planned for ``n_plan`` rows."""
        cfg, L, w, lc = self.cfg, self.L, self.layers[layer], self.lc
        k = cfg.index_top_k
        steps, words = LR.topk_plan(n_plan, k)
        # Stage 3c runs the indexer at every position; while n_comp <= top-k (every row attended)
        # its kernels skip their work on the device (min_comp).
        device = self.opts.longctx == "device"
        min_comp = k if device else 0
        with L.cluster("indexer"):
            H, Di = cfg.index_heads, cfg.index_head_dim
            if device:
                ops_longctx.q8_matvec_when(L, "index_q", w["index_q_b"], self.qan, lc.iq, ratio, min_comp, ts)
            else:
                ops.q8_matvec(L, "index_q", w["index_q_b"], self.qan, lc.iq)
            ops_longctx.rope_heads(L, "index_q_rope", lc.iq, H, Di, cfg, ts, cfg.compress_rope_theta)
            if device:
                ops_longctx.q8_matvec_when(L, "index_weights", w["index_proj"], self.x, lc.iw, ratio, min_comp, ts)
            else:
                ops.q8_matvec(L, "index_weights", w["index_proj"], self.x, lc.iw)
            ops_longctx.indexer_score(L, "index_score", lc.iq, lc.iw, lc.layers[layer]["index"], lc.scores,
                              self.score_blocks(n_plan), cfg, ratio, ts, min_comp=min_comp)
            scratch = lc.topk.ensure(words) if words else None
            for st in steps:
                if st.kernel == "indexer_topk":
                    ops_longctx.indexer_topk(L, "index_topk", lc.scores, lc.sel, st.sort_n, cfg, ratio, ts)
                elif st.kernel == "indexer_topk_chunk":
                    ops_longctx.indexer_topk_chunk(L, "index_topk_chunk", lc.scores, scratch, st.blocks, st.sort_n, cfg,
                                           ratio, ts, min_comp=min_comp)
                else:
                    final = st.dst_off < 0
                    ops_longctx.indexer_topk_merge(L, "index_topk_merge", lc.scores, scratch, st.src_off,
                                           lc.sel if final else scratch, 0 if final else st.dst_off,
                                           st.blocks, st.sets, st.sort_n, cfg)
