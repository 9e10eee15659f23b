"""The ranks of a tensor-parallel token together (:class:`TPGroup`: a node, one rank model per device built in its
own thread, the shared reduction) and the token held to the single-GPU token (:func:`compare_with_single`,
:func:`compare_on_gpus`)."""

from __future__ import annotations

import threading

import numpy as np

from ..token.config import ModelConfig
from ..token.model import DecodeModel, TokenOptions
from .model import TPRankModel
from .ranks import RankTimeout, enable_peer_access, make_node, raise_first_failure, run_ranks
from .reduce import Exchange, NcclReducer, OracleReducer, PeerReducer, reduction_bound, single_gpu_values
from .shard import ShardPlan

REDUCES = ("nccl", "peer", "oracle")


class TPGroup:
    """``world`` ranks of one token (see module docstring).

    ``node``: default a new one on ``backend`` (``"sim"`` or ``"cupy"``); ``world``: 2 (ds4's peer path is for two);
    ``reduce``: ``"nccl"``, ``"peer"`` or ``"oracle"`` (sim); ``placement``: ``"inside"`` / ``"outside"``; ``opts``,
    ``n_layers``, ``nvtx``: as :class:`~ds4lab.token.model.DecodeModel`; ``check``: compare every eager reduction
    with the single-GPU values into :attr:`checks` (sim); ``timeout_s``: per :meth:`run` (default 120 s on the sim,
    600 on a GPU); after a timeout every communicator is aborted.

    Raises:
        ValueError: an unknown reduce, peer with world != 2, the oracle or checks off the sim.
        ConfigError: a model that does not split over ``world`` ranks."""

    def __init__(self, cfg: ModelConfig, *, node=None, backend: str = "sim", world: int = 2, reduce: str = "nccl",
                 placement: str = "inside", opts: TokenOptions | None = None, n_layers: int | None = None,
                 nvtx: bool = False, check: bool = False, timeout_s: float | None = None, seed: int = 1234) -> None:
        if reduce not in REDUCES:
            raise ValueError(f"reduce={reduce!r}; choose one of: {', '.join(REDUCES)}")
        if reduce == "peer" and world != 2:
            raise ValueError("ds4's peer path reduces between two ranks (world=2)")
        for r in range(world):
            ShardPlan.for_rank(cfg, r, world)
        self.node = node if node is not None else make_node(backend, world, seed=seed)
        if self.node.n_devices < world:
            raise ValueError(f"world={world} ranks on a node of {self.node.n_devices} devices")
        on_sim = self.node.name == "sim"
        if (reduce == "oracle" or check) and not on_sim:
            raise ValueError("the oracle reduction and the reduction checks compute on the host: the sim only")
        self.cfg, self.world, self.reduce, self.placement = cfg, world, reduce, placement
        self.timeout_s = float(timeout_s if timeout_s is not None else (120.0 if on_sim else 600.0))
        wait = getattr(self.node, "collective_timeout_s", 5.0)
        self.exchange = Exchange(world, 4 * wait + 5)
        if reduce == "nccl":
            reducers = [NcclReducer(c) for c in self.node.comm_init_all(list(range(world)))]
        elif reduce == "peer":
            self.peer_access = enable_peer_access(self.node)
            barrier = threading.Barrier(world, timeout=4 * wait + 5)
            reducers = [PeerReducer(self.node, r, barrier) for r in range(world)]
        else:
            reducers = [OracleReducer(self.exchange) for _ in range(world)]
        self.reducers = reducers
        #: ``(layer, point, rank, worst |tp - single| / bound, elements that differ, elements)`` per checked
        #: reduction (``check=True``).
        self.checks: list[tuple] = []
        self._lock = threading.Lock()
        chk = self._check if check else None
        self.models: list[TPRankModel] = self.run(
            lambda r: TPRankModel(cfg, self.node.backend(r), ShardPlan.for_rank(cfg, r, world), reducers[r], opts,
                                  placement=placement, nvtx=nvtx, n_layers=n_layers, check=chk))
        if reduce == "peer":
            for red in reducers:
                red.inboxes = [m.tp_inbox for m in self.models]

    # ------------------------------------------------------------------ running
    def run(self, fn, timeout_s: float | None = None) -> list:
        """``fn(rank)`` on one thread per rank; returns the results in rank order. Raises the first rank's exception;
        :class:`~ds4lab.tp.ranks.RankTimeout` when a rank is still running after the timeout (every communicator
        aborted first, so a GPU's stuck collectives end)."""
        out = run_ranks(self.node, fn, timeout_s=self.timeout_s if timeout_s is None else timeout_s)
        if any(isinstance(v, RankTimeout) for v in out):
            self.node.abort_all()
        raise_first_failure(out)
        return out

    def stage_runs(self, stage, base: TokenOptions, *, mode: str = "thread_local", per_rank: list | None = None,
                   **kw) -> list:
        """One :class:`~ds4lab.experiments.stage_run.StageRun` of ``stage`` per rank, made on the rank's thread;
        ``per_rank[r]``: rank ``r``'s own keyword arguments. With the collectives outside, island 1 stays eager on the
        hash-routed layers too (as ds4 keeps it)."""
        from ..experiments.stage_run import StageRun

        def make(r: int):
            args = {**kw, **((per_rank or [{}] * self.world)[r])}
            tune = {k: args.pop(k) for k in ("guard", "warmup", "key_decisions") if k in args}
            if tune:  # the capture policy's fields (ds4lab.capture.cache.CapturePolicy), tuned for this rank
                args["policy"] = (args.get("policy") or stage.policy).with_(**tune)
            run = StageRun(self.models[r], stage, base, mode=mode, **args)
            if run.cache is not None and any(c.startswith("island1.") for c in stage.capture):
                m = self.models[r]
                run.cache.skip = frozenset(run.cache.skip) | {
                    (c, layer) for c in ("island1.out", "island1.ffn", "island1.post")
                    for layer in range(m.n_layers) if m.cfg.is_hash_layer(layer)}
            return run

        return self.run(make)

    def record(self, runs: list, span) -> list[list[dict]]:
        """Every rank's :meth:`StageRun.record` over ``span``, together (returns per rank the snapshots)."""
        return self.run(lambda r: runs[r].record(span))

    # ------------------------------------------------------------------ the reduction check
    def _check(self, model: TPRankModel, layer: int, point: str) -> None:
        vals = single_gpu_values(model, self.exchange, layer, point)
        recv = model.tp_attn_recv if point == "attn" else model.tp_ffn_recv
        got = np.asarray(model.be.to_host(recv), dtype=np.float64).reshape(vals["single"].shape)
        single = np.asarray(vals["single"], dtype=np.float64)
        bound = reduction_bound(vals["partials"], vals["single"], vals["terms"], vals["abs_sum"])
        diff = np.abs(got - single)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, diff / bound, np.where(diff > 0, np.inf, 0.0))
        with self._lock:
            self.checks.append((layer, point, model.plan.rank, float(ratio.max()), int((diff > 0).sum()), diff.size))

    def info(self) -> dict:
        """What ``meta.json`` says of the group: world, reduction, placement, the node, each rank's plan."""
        return {"world": self.world, "reduce": self.reduce, "placement": self.placement, "node": self.node.info(),
                "plans": [m.plan.summary() for m in self.models],
                "peer_access": getattr(self, "peer_access", None)}


def compare_with_single(cfg: ModelConfig, span, *, reduce: str = "nccl", placement: str = "inside",
                        n_layers: int | None = None, opts: TokenOptions | None = None, check: bool = True,
                        seed: int = 1234, group: TPGroup | None = None) -> dict:
    """The TP token (stage 0, eager) against the single-GPU token over ``span`` on the sim. Returns
    ``{"ranks_identical", "first_difference", "max_abs_hidden", "max_rel_hidden", "checks", "worst_bound_ratio",
    "elements_differing"}``."""
    from ..experiments.stage_run import StageRun, first_difference
    from ..experiments.stages import STAGES
    from ..sim.backend import SimBackend

    base = opts or TokenOptions(vocab=True)
    single = DecodeModel(cfg, SimBackend(seed=seed), base, n_layers=n_layers)
    ref = StageRun(single, STAGES["0"], base).record(span)
    g = group or TPGroup(cfg, reduce=reduce, placement=placement, opts=base, n_layers=n_layers, check=check, seed=seed)
    got = g.record(g.stage_runs(STAGES["0"], base), span)
    h_ref = np.stack([t["hidden"] for t in ref]).astype(np.float64)
    h_tp = np.stack([t["hidden"] for t in got[0]]).astype(np.float64)
    return {"ranks_identical": all(first_difference(got[0], got[r]) is None for r in range(1, g.world)),
            "first_difference": first_difference(ref, got[0]), "max_abs_hidden": float(np.abs(h_tp - h_ref).max()),
            "max_rel_hidden": float(np.abs(h_tp - h_ref).max() / np.abs(h_ref).max()), "checks": list(g.checks),
            "worst_bound_ratio": max((c[3] for c in g.checks), default=0.0),
            "elements_differing": sum(c[4] for c in g.checks), "snapshots": got, "reference": ref}


def compare_on_gpus(cfg: ModelConfig, node, span, opts: TokenOptions | None = None) -> dict:
    """On a host's GPUs: the TP token with NCCL and with peer copies against each other and the single-GPU token on
    device 0 (the largest difference reported, not held to the sim's bound). Returns ``{"ranks_identical": {reduce:
    bool}, "nccl_equals_peer", "first_difference_vs_single", "max_rel_hidden_vs_single"}``."""
    from ..experiments.stage_run import StageRun, first_difference
    from ..experiments.stages import STAGES

    base = opts or TokenOptions(vocab=True)
    ref = StageRun(DecodeModel(cfg, node.backend(0), base), STAGES["0"], base).record(span)
    got = {}
    for red in ("nccl", "peer"):
        g = TPGroup(cfg, node=node, reduce=red, opts=base)
        got[red] = g.record(g.stage_runs(STAGES["0"], base), span)

    def hidden(recs):
        return np.stack([t["hidden"] for t in recs]).astype(np.float64)

    return {"ranks_identical": {k: first_difference(v[0], v[1]) is None for k, v in got.items()},
            "nccl_equals_peer": first_difference(got["nccl"][0], got["peer"][0]) is None,
            "first_difference_vs_single": first_difference(ref, got["nccl"][0]),
            "max_rel_hidden_vs_single": float(np.abs(hidden(got["nccl"][0]) - hidden(ref)).max()
                                              / np.abs(hidden(ref)).max())}


__all__ = ["REDUCES", "TPGroup", "compare_on_gpus", "compare_with_single"]
