"""The reductions between ranks at ``(layer, point)``, ``"attn"`` (``[E]``) and ``"ffn"`` (``[2, E]``):
:class:`NcclReducer` (``ncclAllReduce`` on the accessor's stream), :class:`PeerReducer` (ds4's ``cudaMemcpyPeer``,
host barrier, ``tp_add2``: between graphs only) and, on the sim, :class:`OracleReducer` (the single-GPU values).
Against the single-GPU token the sum's order changes by at most :func:`reduction_bound`; ``docs/tensor-parallel.md``."""

from __future__ import annotations

import threading

import numpy as np

from ..errors import CollectiveError
from ..token import reference as R
from . import ops as tp_ops

#: The reduction points of a layer, in the order the token meets them.
POINTS = ("attn", "ffn")
#: Unit roundoff of float32 (round to nearest): 2^-24.
U32 = 2.0 ** -24
#: Unit roundoff of float64: 2^-53.
U64 = 2.0 ** -53


def reduction_bound(partials: list[np.ndarray], single: np.ndarray, terms: int, abs_sum: np.ndarray) -> np.ndarray:
    """The bound on ``|tp - single|`` per element of a two-rank reduction (``tp = fl32(p0 + p1)``, ``single`` the
    single-GPU token's float64 sum of all ``terms`` products rounded once, ``A = sum |w_i x_i|``): ``B = (1 + 2^-20)
    (2^-23 (|p0| + |p1|) + 2^-24 |single|) + terms 2^-51 A``; the derivation: ``docs/tensor-parallel.md``. float32
    ``[E]`` in, float64 out."""
    p = sum(np.abs(np.asarray(x, dtype=np.float64)) for x in partials)
    return ((1.0 + 2.0 ** -20) * (2 * U32 * p + U32 * np.abs(np.asarray(single, dtype=np.float64)))
            + terms * 4 * U64 * np.asarray(abs_sum, dtype=np.float64))


class Exchange:
    """Host-side exchange between rank threads (verification only): every rank offers a value under a key and gets
    every rank's, in rank order. Raises CollectiveError ``nccl:timeout`` when a rank never comes."""

    def __init__(self, world: int, timeout_s: float) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=timeout_s)
        self.slots: dict = {}
        self.lock = threading.Lock()

    def __call__(self, rank: int, key, value):
        with self.lock:
            self.slots.setdefault(key, [None] * self.world)[rank] = value
        self._wait(key)
        with self.lock:
            out = list(self.slots[key])
        self._wait(key)
        with self.lock:
            self.slots.pop(key, None)
        return out

    def _wait(self, key) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise CollectiveError("nccl:timeout", "exchange", f"a rank never reached the exchange of {key!r}") from None


class NcclReducer:
    """``ncclAllReduce`` (sum) of ``send`` into ``recv`` on the calling thread's accessor stream."""

    kind = "nccl"

    def __init__(self, comm) -> None:
        self.comm = comm

    def reduce(self, model, layer: int, point: str, send, recv) -> None:
        """``recv`` = the ranks' sum of ``send`` (``ncclAllReduce`` on the accessor's stream; counted in the census as
        a ``collective``; nothing issued while the launcher only plans)."""
        L = model.L
        if L.issues("collective", f"tp.allreduce.{point}"):
            self.comm.all_reduce(send, recv, L.stream())


class PeerReducer:
    """ds4's peer copies (see module docstring), two ranks only. ``inboxes[rank][point]``: two buffers per point and
    rank, alternating per use, so the copy of use k + 1 (after the barrier of use k) never overwrites what the peer
    has still to read."""

    kind = "peer"

    def __init__(self, node, rank: int, barrier: threading.Barrier) -> None:
        self.node, self.rank, self.barrier = node, rank, barrier
        self.inboxes: list[dict] | None = None  # set by the group once every rank's model exists
        self.uses = {p: 0 for p in POINTS}

    def reduce(self, model, layer: int, point: str, send, recv) -> None:
        """ds4's reduction of ``send`` into ``recv`` (class docstring). Raises RuntimeError when the group set no
        inboxes, CollectiveError ``nccl:timeout`` when the peer never reaches the barrier, and what
        ``cudaMemcpyPeer`` raises during a capture (rules memcpy_peer_*)."""
        L = model.L
        if not L.issues("collective", f"tp.peer.{point}"):
            return
        if self.inboxes is None:
            raise RuntimeError("PeerReducer: the group did not set the ranks' inboxes")
        me, peer = self.rank, 1 - self.rank
        slot = self.uses[point] % 2
        self.uses[point] += 1
        self.node.memcpy_peer(self.inboxes[peer][point][slot], peer, send, me)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise CollectiveError("nccl:timeout", "cudaMemcpyPeer",
                                  f"rank {me}: the peer never reached the exchange of {point}@{layer}") from None
        mine = self.inboxes[me][point][slot]
        a, b = (send, mine) if me == 0 else (mine, send)
        with L.cluster("tp.reduce"):
            tp_ops.tp_add2(L, f"tp.peer_add.{point}", a, b, recv, int(np.prod(send.shape)))


class OracleReducer:
    """Verification only (the sim): ``recv`` becomes the single-GPU token's values from the same inputs
    (:func:`single_gpu_values`); it needs the whole routed bank and the unsplit ``o_b``, ``sh_down`` on every rank."""

    kind = "oracle"

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def reduce(self, model, layer: int, point: str, send, recv) -> None:
        """``recv`` = the single-GPU values (:func:`single_gpu_values`). Raises RuntimeError while capturing."""
        if not model.L.issues("collective", f"tp.oracle.{point}"):
            return
        if model.L.capturing:
            raise RuntimeError("the oracle reduction computes on the host: it cannot be captured")
        vals = single_gpu_values(model, self.exchange, layer, point)
        recv[...] = vals["single"].reshape(recv.shape)


def single_gpu_values(model, exchange: Exchange, layer: int, point: str) -> dict:
    """What the single-GPU token computes at reduction ``(layer, point)`` from every rank's inputs, as the NumPy
    reference does; every rank must call it at the same point (a host exchange). Returns ``{"single": float32 like
    recv, "partials": [every rank's send], "terms": n, "abs_sum": A}`` (for ``"ffn"`` ``[2, E]``: shared, routed)."""
    from ..token.reference import dequant, dequant_q8k, quantize_q8k_ds4

    rank, full = model.plan.rank, model.full
    if point == "attn":
        send = np.array(model.be.to_host(model.tp_attn_send), copy=True)
        oa = np.array(model.be.to_host(model.oa), copy=True).reshape(-1)
        got = exchange(rank, (layer, "attn"), (send, oa))
        oa_full = np.concatenate([g[1] for g in got])
        W = full.o_b(layer)
        single = R.q8_matvec(W, oa_full)
        abs_sum = np.abs(dequant(W)) @ np.abs(oa_full.astype(np.float64))
        return {"single": single, "partials": [g[0] for g in got], "terms": W.cols, "abs_sum": abs_sum}
    cfg = model.full_cfg
    k, F = cfg.n_used, cfg.expert_ffn
    send = np.array(model.be.to_host(model.tp_ffn_send), copy=True)
    mid = np.array(model.be.to_host(model.sh_mid), copy=True).reshape(-1)
    moe_mid = np.array(model.be.to_host(model.moe_buf.mid), copy=True)[:k]
    ids = np.array(model.be.to_host(model.moe_buf.ids), copy=True).reshape(-1)[:k]
    got = exchange(rank, (layer, "ffn"), (send, mid, moe_mid))
    sh_mid = np.concatenate([g[1] for g in got])
    Wd = full.sh_down(layer)
    y_sh = R.q8_matvec(Wd, sh_mid)
    abs_sh = np.abs(dequant(Wd)) @ np.abs(sh_mid.astype(np.float64))
    # the routed experts' middles, each slot from the rank that holds its expert (the others wrote zeros)
    mids = np.stack([got[model.plan.owner_of_expert(e)][2][s] for s, e in enumerate(ids)])
    qq, dd, _ = quantize_q8k_ds4(mids.reshape(k, F))
    mq, md = qq.astype(np.int8), dd.astype(np.float32)
    bank_dn = full.bank(layer)["down"]
    downs = [bank_dn[int(e)] for e in ids]
    y_moe = R.moe_down_sum(downs, mq, md)
    abs_moe = sum(np.abs(dequant(w)) @ np.abs(dequant_q8k(mq[s][None], md[s][None])[0]) for s, w in enumerate(downs))
    return {"single": np.stack([y_sh, y_moe]).astype(np.float32), "partials": [g[0] for g in got],
            "terms": np.array([[Wd.cols], [k * F]]), "abs_sum": np.stack([abs_sh, abs_moe])}


__all__ = ["Exchange", "NcclReducer", "OracleReducer", "POINTS", "PeerReducer", "reduction_bound",
           "single_gpu_values"]
