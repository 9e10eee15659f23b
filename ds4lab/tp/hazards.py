"""Tensor-parallel hazards (:class:`TPHazard`) on a two-rank sim group under a TP stage, beside the same span run
eagerly. Importing this module registers them in :data:`ds4lab.experiments.hazards.HAZARDS` (the set ``all-tp``);
expected outcomes are the sim's ``nccl_*`` and ``memcpy_peer_*`` rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CollectiveError, RuntimeApiError
from ..experiments.hazards import register
from ..experiments.stage_run import Span, first_difference, outcome
from ..token.model import TokenOptions
from .ranks import run_ranks
from .stages import TP_STAGES

#: The outcome of a run in which a collective never completed (on a GPU: a hang).
NEVER = "never completes"


@dataclass(frozen=True)
class TPHazard:
    """One tensor-parallel hazard: ``stage`` (:data:`~ds4lab.tp.stages.TP_STAGES`), ``reduce`` (``"nccl"`` or
    ``"peer"``), ``per_rank`` (each rank's :class:`~ds4lab.experiments.stage_run.StageRun` keyword arguments),
    ``patch`` (attributes set on each rank's model), ``expect`` (what the sim's rules say)."""

    name: str
    what: str
    stage: str
    expect: str
    reduce: str = "nccl"
    per_rank: tuple = ({}, {})
    patch: tuple = ({}, {})
    steps: str = "tp"
    options: dict = field(default_factory=dict)
    expect_relaxed: str = ""

    def expected(self, mode: str) -> str:
        """The expected outcome (tensor-parallel stages capture in thread-local mode whatever ``mode`` says)."""
        return self.expect

    def demonstrate(self, be, cfg, mode: str = "thread_local", span: Span | None = None,
                    timeout_s: float = 2.0) -> dict:
        """Run the hazard on two simulated ranks beside the eager reference; returns the columns of
        :func:`ds4lab.experiments.hazards.demonstrate` plus ``rank_errors``. Raises ValueError: a backend other than the
        sim (a two-GPU host runs ``ds4lab tp``)."""
        if getattr(be, "name", "sim") != "sim":
            raise ValueError("tensor-parallel hazards run on the sim (where a GPU would hang, the sim raises)")
        from ..capture import stream as S
        from .group import TPGroup
        from .ranks import make_node

        span = span or Span(1000, 4)
        base = TokenOptions(vocab=True)
        tps = TP_STAGES[self.stage]
        with S.graphs_enabled():
            ref_group = TPGroup(cfg, node=make_node("sim", 2, seed=getattr(be, "seed", 1234),
                                                    collective_timeout_s=timeout_s), reduce=self.reduce, opts=base)
            ref = ref_group.record(ref_group.stage_runs(TP_STAGES["0"].stage, base), span)
            g = TPGroup(cfg, node=make_node("sim", 2, seed=getattr(be, "seed", 1234), collective_timeout_s=timeout_s),
                        reduce=self.reduce, opts=base, placement=tps.placement)
            for m, attrs in zip(g.models, self.patch):
                for k, v in attrs.items():
                    setattr(m, k, v)
            runs = g.stage_runs(tps.stage, base, per_rank=[dict(d) for d in self.per_rank])
            got = run_ranks(g.node, lambda r: runs[r].record(span), timeout_s=g.timeout_s)
        errs = [v for v in got if isinstance(v, BaseException)]
        st = [r.stats() for r in runs]
        coll = [e for e in errs if isinstance(e, CollectiveError)]
        if coll:
            res, diff = f"{NEVER} ({', '.join(sorted({e.name for e in coll}))})", "never completed"
        elif errs:
            raise errs[0]
        else:
            diff = first_difference(ref[0], got[0]) or first_difference(ref[1], got[1])
            res = outcome(diff, st[0] if st[0] else st[1])
        failures = {}
        for s in st:
            for k, v in (s.get("failures") or {}).items():
                failures[k] = failures.get(k, 0) + v
        def total(key):
            return sum(s.get(key, 0) for s in st)

        return {"hazard": self.name, "what": self.what, "stage": tps.name, "capture_mode": tps.stage.policy.mode
                or "thread_local", "positions": f"{span.start}..{span.start + span.tokens - 1}", "outcome": res,
                "errors": ";".join(f"{k}={v}" for k, v in failures.items()) or "none",
                "retired": "; ".join(e.reason for r in runs if r.cache for e in r.cache.retired()),
                "captures": total("captures"), "replays": total("replays"), "eager_runs": total("eager_runs"),
                "retirements": total("retirements"), "exact": diff is None,
                "first_mismatch": diff if isinstance(diff, str) else "", "expected": self.expect,
                "profile_lines": 0, "backend": "sim (2 devices)",
                "rank_errors": "; ".join(f"rank {r}: {v.name if isinstance(v, RuntimeApiError) else type(v).__name__}"
                                         for r, v in enumerate(got) if isinstance(v, BaseException)) or "none"}


TP_HAZARDS: dict[str, TPHazard] = {h.name: h for h in (
    TPHazard("tp-ranks-out-of-step", "the ranks capture out of step: rank 1 warms each graph up one token longer, so "
             "rank 0 captures (and replays) a token that rank 1 runs eagerly", "3:in",
             "the first all-reduce of that token is launched from a graph on rank 0 and eagerly on rank 1; NCCL "
             "requires graph capture to be uniform over the ranks: the collective never completes (the sim: "
             "nccl:nonuniform-capture on both ranks; on a GPU a hang, GUESS)",
             per_rank=({"warmup": 1}, {"warmup": 2})),
    TPHazard("tp-collective-order", "rank 1 issues one collective rank 0 does not (an all-reduce of its first "
             "hidden stream, as a debug check might, before layer 0's attention reduction)", "0",
             "rank 1's extra all-reduce meets rank 0's attention reduction (the same size: wrong data, silently) and "
             "every later collective meets the wrong partner: the next pair differs in size and never completes "
             "(the sim: nccl:mismatch; on a GPU a hang or wrong data, GUESS)",
             patch=({}, {"extra_collective": (0, "attn")})),
    TPHazard("tp-host-sync-one-rank", "a cudaDeviceSynchronize in rank 0's token body, not in rank 1's (stage 3 "
             "captures the whole token)", "3:in",
             "rank 0's capture is invalidated (cudaErrorStreamCaptureUnsupported): its graph retires and it runs the "
             "token eagerly while rank 1 replays its graph: the collective never completes (the sim: "
             "nccl:nonuniform-capture)", per_rank=({"options": {"sync_in_body": True}}, {})),
    TPHazard("tp-peer-copy-island", "ds4's reduction (cudaMemcpyPeer) inside island 1, captured on a blocking "
             "stream as ds4 captures its islands", "i:in",
             "cudaMemcpyPeer while a blocking stream captures is refused (cudaErrorStreamCaptureImplicit, GUESS) "
             "and the capture invalidated: island 1 retires on every layer and runs eagerly, identical results "
             "(ds4 keeps its islands off under TP)", reduce="peer"),
    TPHazard("tp-peer-copy-token", "ds4's reduction (cudaMemcpyPeer) inside the whole-token graph (a non-blocking "
             "capture stream)", "3:in",
             "cudaMemcpyPeer runs once, at capture, and is in no graph (GUESS): every replay adds an inbox the peer "
             "never wrote again: wrong results", reduce="peer"),
)}


register(TP_HAZARDS, "all-tp")

__all__ = ["NEVER", "TPHazard", "TP_HAZARDS"]
