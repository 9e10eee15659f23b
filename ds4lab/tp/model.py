"""One rank of a tensor-parallel decode token (:class:`TPRankModel`): its share of the weights (:mod:`.shard`), two
reductions per layer (:mod:`.reduce`: "attn" and "ffn"), every launch through the calling thread's accessor.
``placement``: the collectives ``"inside"`` the token's clusters or ``"outside"`` (cluster ``tp_seg`` between them,
every reduction eager). The layer launch by launch: ``docs/tensor-parallel.md``."""

from __future__ import annotations

import numpy as np

from ..token import ops
from ..token import weights as W
from ..token.config import ModelConfig
from ..token.model import DecodeModel, TokenOptions
from . import ops as tp_ops
from .shard import ShardPlan, col_slice, expert_slice, row_slice

PLACEMENTS = ("inside", "outside")


class FullWeights:
    """The unsplit weights a verification needs (``o_b``, ``sh_down``, the whole routed bank), generated on the host by
    the NumPy reference backend with the model's seed (the same tensors the single-GPU token holds), one layer at a
    time, cached."""

    def __init__(self, cfg: ModelConfig, seed: int) -> None:
        from ..executor.numpy_backend import NumpyBackend

        self.cfg, self.np = cfg, NumpyBackend(seed=seed)
        self._cache: dict = {}

    def _get(self, key, spec):
        if key not in self._cache:
            self._cache[key] = self.np.make_weight(spec)
        return self._cache[key]

    def o_b(self, layer: int):
        """Layer ``layer``'s whole ``o_b`` (Q8_0 ``[E, G * out_lora]``)."""
        return self._get(("o_b", layer), W.layer_specs(self.cfg, layer)["o_b"])

    def sh_down(self, layer: int):
        """Layer ``layer``'s whole shared-expert down projection (Q8_0 ``[E, F]``)."""
        return self._get(("sh_down", layer), W.layer_specs(self.cfg, layer)["sh_down"])

    def bank(self, layer: int) -> dict:
        """The whole routed bank layer ``layer`` reads (``{"gate_up", "down"}``, every expert)."""
        b = W.bank_of_layer(self.cfg, layer)
        return {k: self._get(("bank", b, k), s) for k, s in W.bank_specs(self.cfg, b).items()}


class TPRankModel(DecodeModel):
    """Rank ``plan.rank`` of a tensor-parallel token (see module docstring).

    ``plan``: the rank's :class:`~ds4lab.tp.shard.ShardPlan` of ``cfg``; ``reducer``: :mod:`ds4lab.tp.reduce`;
    ``opts``, ``nvtx``, ``n_layers``: as :class:`~ds4lab.token.model.DecodeModel`; ``check(model, layer, point)``:
    called after every eager reduction (verification).

    Raises:
        ConfigError: a model that does not split (:meth:`ShardPlan.validate`).
        ValueError: an unknown placement; on-demand scratch (a token of one rank reallocating alone would give the
            ranks different graphs)."""

    def __init__(self, cfg: ModelConfig, backend, plan: ShardPlan, reducer, opts: TokenOptions | None = None, *,
                 placement: str = "inside", nvtx: bool = False, n_layers: int | None = None, check=None) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement={placement!r}; choose one of: {', '.join(PLACEMENTS)}")
        plan.validate()
        if plan.cfg != cfg:
            raise ValueError("the shard plan is for another model configuration")
        opts = opts or TokenOptions()
        if opts.scratch != "prealloc":
            raise ValueError("tensor parallel: scratch must be preallocated (scratch='prealloc')")
        self.full_cfg, self.plan, self.reducer, self.placement, self.check = cfg, plan, reducer, placement, check
        #: ``(layer, point)`` where this rank issues one collective more (hazard tp-collective-order), or None
        self.extra_collective: tuple | None = None
        self.full = FullWeights(cfg, getattr(backend, "seed", 1234))
        super().__init__(plan.local_config(), backend, opts, nvtx=nvtx, n_layers=n_layers)

    # ------------------------------------------------------------------ weights and buffers
    def _alloc_weights(self, cfg=None) -> None:
        super()._alloc_weights(self.full_cfg)  # the whole model's weights, each cut to this rank's share

    def _layer_weight(self, key: str, spec):
        cut = {"q_b": (row_slice, self.plan.q_b_rows), "o_a": (row_slice, self.plan.o_a_rows),
               "o_b": (col_slice, self.plan.o_b_cols), "sh_gateup": (row_slice, self.plan.sh_gateup_rows),
               "sh_down": (col_slice, self.plan.sh_down_cols)}.get(key)
        t = self.be.make_weight(spec)
        return cut[0](t, cut[1](), self.be.xp) if cut else t

    def _bank_weight(self, spec):
        return expert_slice(self.be.make_weight(spec), self.plan, is_gpu=self.be.is_gpu)

    def _alloc_buffers(self) -> None:
        super()._alloc_buffers()
        be, cfg = self.be, self.full_cfg
        E = cfg.embed
        f = np.float32
        self.sh_mid = be.empty((len(self.plan.ffn),), f)
        self.tp_attn_send, self.tp_attn_recv = be.zeros((E,), f), be.zeros((E,), f)
        self.tp_ffn_send, self.tp_ffn_recv = be.zeros((2, E), f), be.zeros((2, E), f)
        # the routed experts' partial sum lands in row 1 of the send buffer (decode: one token)
        self.moe_buf.y = self.tp_ffn_send[1:2]
        self.tp_ids = be.zeros((cfg.n_used,), np.int32)
        self.tp_extra = be.zeros((E,), f)
        # ds4's peer path: two inbox buffers per reduction point (PeerReducer alternates them)
        self.tp_inbox = {"attn": [be.zeros((E,), f) for _ in range(2)], "ffn": [be.zeros((2, E), f) for _ in range(2)]}

    def memory_bytes(self) -> dict:
        """As :meth:`DecodeModel.memory_bytes` for the rank's dimensions (an over-estimate: it counts the whole routed
        bank, of which the rank holds ``1 / world``)."""
        return super().memory_bytes()

    # ------------------------------------------------------------------ the token
    def host_decisions(self, cluster: str, layer: int, T: int, ts) -> tuple:
        """As :meth:`DecodeModel.host_decisions`; a segment (``tp_seg``) depends on what the whole token does."""
        return super().host_decisions("token" if cluster == "tp_seg" else cluster, layer, T, ts)

    def _token_body(self, ts: ops.TokenScalars) -> None:
        if self.placement == "inside":
            super()._token_body(ts)
            return
        L = self.L
        k = 0
        for item in self._segments(ts):
            if item[0] == "reduce":
                self._reduce(item[1], item[2])
                continue
            parts = item[1]
            self.run_cluster("tp_seg", k, 1, ts, lambda parts=parts: [f() for f in parts])
            k += 1
        L.layer = -1
        if self.opts.sync_in_body:
            self.be.synchronize()

    def _segments(self, ts) -> list:
        """The token body as segments between reductions: ``("launch", [parts])`` and ``("reduce", layer, point)``, in
        order (placement ``"outside"``)."""
        out, cur = [], [lambda: self._embed(ts)]
        for layer in range(self.n_layers):
            cur.append(lambda layer=layer: self._part_pre(layer, ts))
            out += [("launch", cur), ("reduce", layer, "attn")]
            out += [("launch", [lambda layer=layer: self._part_ffn(layer, ts)]), ("reduce", layer, "ffn")]
            cur = [lambda layer=layer: self._part_post(layer, ts)]
        cur.append(self._final)
        out.append(("launch", cur))
        return out

    def _part_pre(self, layer: int, ts) -> None:
        self.L.layer = layer
        w = self.layers[layer]
        self.run_cluster("island0", layer, 1, ts,
                         lambda: self._hc_pre("hc_attn", w["hc_attn_mix"], w["hc_attn_norm"], self.mix_attn))
        self._layer_middle(layer, ts)
        self.run_cluster("island1.out", layer, 1, ts, lambda: self._tp_out(layer))

    def _part_ffn(self, layer: int, ts) -> None:
        self.L.layer = layer
        self.run_cluster("island1.ffn", layer, 1, ts, lambda: self._tp_ffn(layer, ts))

    def _part_post(self, layer: int, ts) -> None:
        self.L.layer = layer
        self.run_cluster("island1.post", layer, 1, ts, lambda: self._tp_post(layer))

    def _layer_tail(self, layer: int, ts) -> None:
        """Island 1 with both reductions inside (placement ``"inside"``)."""
        self._tp_out(layer)
        self._reduce(layer, "attn")
        self._tp_ffn(layer, ts)
        self._reduce(layer, "ffn")
        self._tp_post(layer)

    def _tp_out(self, layer: int) -> None:
        cfg, L, w = self.cfg, self.L, self.layers[layer]
        with L.cluster("output"):
            ops.q8_matvec(L, "o_a", w["o_a"], self.o, self.oa, rows_per_group=cfg.out_lora, group_stride=cfg.group_in)
            ops.q8_matvec(L, "o_b_partial", w["o_b"], self.oa, self.tp_attn_send)

    def _tp_ffn(self, layer: int, ts) -> None:
        cfg, L, w = self.cfg, self.L, self.layers[layer]
        with L.cluster("output"):
            tp_ops.tp_expand(L, "o_b_expand", self.h, self.mix_attn, self.tp_attn_recv, None, cfg.hc_streams, cfg.embed)
        self._hc_pre("hc_ffn", w["hc_ffn_mix"], w["hc_ffn_norm"], self.mix_ffn)
        self.router(layer, self.x, 1, ts=ts)
        self.run_cluster("moe", layer, 1, ts, lambda: self.routed_moe(layer, self.x, 1))
        self.run_cluster("shared", layer, 1, ts, lambda: self._shared(layer, None))

    def _shared(self, layer: int, y) -> None:
        """The rank's half of the shared expert: gate/up rows and SwiGLU, then its partial sum of the down projection
        into row 0 of the FFN send buffer (the expand waits for the reduction)."""
        cfg, L, w = self.cfg, self.L, self.layers[layer]
        with L.cluster("shared"):
            ops.q8_matvec_swiglu(L, "sh_gateup_swiglu", w["sh_gateup"], self.x, self.sh_mid, cfg.swiglu_limit)
            ops.q8_matvec(L, "sh_down_partial", w["sh_down"], self.sh_mid, self.tp_ffn_send[0])

    def _tp_post(self, layer: int) -> None:
        cfg, L = self.cfg, self.L
        with L.cluster("shared"):
            tp_ops.tp_expand(L, "sh_down_expand", self.h, self.mix_ffn, self.tp_ffn_recv[0], self.tp_ffn_recv[1],
                             cfg.hc_streams, cfg.embed)

    def _layer(self, layer: int, ts) -> None:
        if self.placement == "inside":
            super()._layer(layer, ts)  # island 1 is _layer_tail: both reductions inside
            return
        raise RuntimeError("placement 'outside' runs the token as segments (_token_body)")

    def _reduce(self, layer: int, point: str) -> None:
        if point == "attn":
            send, recv = self.tp_attn_send, self.tp_attn_recv
        else:
            send, recv = self.tp_ffn_send, self.tp_ffn_recv
        with self.L.cluster("tp.reduce"):
            if self.extra_collective == (layer, point):  # a collective the other ranks do not issue (hazard)
                self.reducer.reduce(self, layer, "extra", self.h[0], self.tp_extra)
            self.reducer.reduce(self, layer, point, send, recv)
        if self.check is not None and not self.L.capturing:
            self.check(self, layer, point)

    # ------------------------------------------------------------------ routed experts
    def _routed_moe(self, layer: int, x, T: int):
        """The rank's routed experts for one token: ids made local (``tp_localize_ids``), then ds4's four launches on
        the rank's bank; the partial sum lands in the FFN send buffer."""
        if T != 1:
            raise ValueError(f"tensor parallel: decode only (one token per call), not T={T}")
        self.moe_buf.ensure(T)
        b, cfg, p = self.moe_buf, self.cfg, self.plan
        with self.L.cluster("moe"):
            tp_ops.tp_localize_ids(self.L, "tp_expert_ids", b.ids, self.tp_ids, p.experts.start, len(p.experts),
                                   cfg.n_used)
            self.moe_launches(self.banks[W.bank_of_layer(cfg, layer)], x, self.tp_ids, b.wts, 1, ())
        return b.y


__all__ = ["FullWeights", "PLACEMENTS", "TPRankModel"]
