"""Hazard demonstrations: one ds4-today code path re-introduced into a captured stage, run eagerly and under the
stage from the same state, compared bit for bit and classified (:func:`~ds4lab.experiments.stage_run.outcome`); on
the long-context token stage ``3c`` runs them too. What each should do is what the conformance suite measured
(``ds4lab/sim/rules.py``). Sets: ``all`` (token hazards), ``all-longctx``; ``moe-profile-island`` is ds4's
``DS4_CUDA_MOE_PROFILE`` inside its islands (ds4 ``b0309611``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..capture import stream as S
from ..token.model import DecodeModel, TokenOptions
from .stage_run import ModelPatch, Span, StageRun, first_difference, outcome
from .stages import STAGES

#: The profiling points of ds4's MoE profile, each an event recorded on the legacy stream (ds4 b0309611).
PROFILE_SITES = ("profile.xq", "profile.sort", "profile.gateup", "profile.midq", "profile.down", "profile.sum",
                 "profile.end")


@dataclass(frozen=True)
class Hazard:
    """A ds4-today path, the stage it breaks, and what CUDA does with it.

    Attributes:
        steps: ``"token"``, ``"moe"`` (routed-MoE steps of 2 tokens, first top-k layer) or ``"longctx"`` (with stage 3c
            beside).
        stage: the stage the path runs under.
        options: the token options that re-introduce the path.
        patch: a hazard the options cannot express (:class:`ModelPatch`).
        key_decisions: one graph per answer of the host decisions.
        span: ``(cfg) -> Span`` (None: 6 tokens or steps from 1000).
        expect / expect_relaxed: what CUDA does under global/thread-local and under relaxed capture."""

    name: str
    what: str
    steps: str
    stage: str
    options: dict = field(default_factory=dict)
    warmup: int = 1
    patch: ModelPatch | None = None
    key_decisions: bool = False
    span: Callable | None = None
    expect: str = ""
    expect_relaxed: str = ""

    def expected(self, mode: str) -> str:
        """The expected outcome under capture ``mode`` (global, thread_local, relaxed)."""
        return self.expect_relaxed if mode == "relaxed" and self.expect_relaxed else self.expect


def _mid_regime(cfg) -> Span:
    # n_comp in the middle of a regime, two ratio-4 emits, and off a multiple of the score kernel's rows
    # per block (32): at 3k the emit would also grow the score grid, a decision the guard still asks,
    # and the recapture would hide the forgotten emit
    return Span(4 * (3 * cfg.index_top_k + 4), 8)


_STAGE3 = dict(counts_clear="async")

HAZARDS: dict[str, Hazard] = {h.name: h for h in (
    Hazard("sync-memset", "routed-MoE counts cleared with a synchronous cudaMemset (legacy stream)", "moe", "2",
           dict(counts_clear="sync"), expect="capture succeeds; the memset ran once at capture and is not in the "
           "graph, so replays count on top of stale counts: wrong results"),
    Hazard("host-scalars", "position, KV row, window length, token id passed by value", "token", "3",
           dict(scalars="value", **_STAGE3), expect="capture succeeds; replays reuse the captured position: the KV "
           "row written and the RoPE angle are stale: wrong results"),
    Hazard("legacy-launch", "the shared-expert down projection launched on the legacy stream, bypassing the "
           "accessor", "token", "1", dict(legacy_sites=("sh_down_expand",)),
           expect="capture succeeds; that kernel ran once at capture time, outside the graph: replays skip it"),
    Hazard("alloc-in-capture", "routed-MoE scratch allocated on demand with cudaMalloc, first growth inside the "
           "capture", "moe", "2", dict(scratch="on-demand", **_STAGE3), warmup=0,
           expect="global and thread-local capture refuse cudaMalloc (cudaErrorStreamCaptureUnsupported): the "
           "graph is retired and the cluster runs eagerly, with identical results",
           expect_relaxed="relaxed capture permits cudaMalloc: the buffer is allocated once, at capture, and the "
           "graph replays with it: captured, exact"),
    Hazard("host-timed-profile", "ds4's MoE profile: events around the stages, cudaEventSynchronize on the last "
           "one and elapsed times read on the host, every call", "moe", "2",
           dict(moe_profile=True, moe_host_timed=True, **_STAGE3),
           expect="cudaErrorCapturedEvent, the capture is invalidated: retired, eager fallback, identical results"),
    Hazard("device-sync", "cudaDeviceSynchronize inside the captured token body", "token", "3",
           dict(sync_in_body=True, **_STAGE3),
           expect="cudaErrorStreamCaptureUnsupported, invalidated: retired, eager fallback, identical results"),
    Hazard("moe-profile-island", "ds4's DS4_CUDA_MOE_PROFILE inside its decode islands: the seven events recorded "
           "on the legacy stream (cudaEventRecord(ev, 0)), the last synchronized and the elapsed times read on "
           "the host, while island 1 captures on a blocking stream in global mode", "token", "i",
           dict(moe_profile=True, moe_host_timed=True, legacy_sites=PROFILE_SITES),
           expect="the first event record on the legacy stream while a blocking stream captures is refused "
           "(cudaErrorStreamCaptureImplicit) and invalidates the capture: island 1 retires on every top-k layer "
           "and runs eagerly from then on, profiled by the eager events; identical results; island 0 unaffected"),
    Hazard("compressor-emit", "the compressors' emit decision ((pos + 1) % ratio == 0) not re-asked before "
           "replay", "longctx", "3", patch=ModelPatch(forget=("compressor.emit",)), span=_mid_regime,
           expect="captured on a non-emit token, replayed across an emit: the emit launches are not in the "
           "graph (no row emitted, no shift): wrong from the emit on"),
    Hazard("indexer-regime", "the indexer's top-k regime not re-asked before replay (graphs kept one per emit "
           "answer)", "longctx", "3", patch=ModelPatch(forget=("indexer.",)), key_decisions=True,
           span=lambda cfg: Span(4 * cfg.index_top_k - 4, 10),  # n_comp crosses top-k at 4k + 3
           expect="the graph captured while n_comp <= top-k (every row attended, no indexer) replayed past it: "
           "the indexer never runs, attention over every row: wrong (hidden state)"),
    Hazard("comp-row-by-value", "the compressed row index and state slot passed to the compressor's kernels by "
           "value", "longctx", "3", patch=ModelPatch(comp_row_by_value=True), key_decisions=True, span=_mid_regime,
           expect="a graph replayed at a later position stores into the captured position's state slot and, on "
           "an emit, writes the captured row: wrong (the compressor state first)"),
    Hazard("topk-alloc", "the chunked top-k's scratch allocated on demand with cudaMalloc, first growth inside "
           "the capture", "longctx", "3", dict(scratch="on-demand"), warmup=0,
           span=lambda cfg: Span(4 * (16 * cfg.index_top_k + 8), 6),  # the chunked path from the first token
           expect="global and thread-local capture refuse cudaMalloc (cudaErrorStreamCaptureUnsupported): the "
           "graph is retired and the token runs eagerly, with identical results",
           expect_relaxed="relaxed capture permits cudaMalloc: the scratch is allocated once, at capture, and "
           "the graph replays with it: captured, exact"),
)}

#: The hazard sets ``--hazard`` names besides single hazards.
HAZARD_SETS = {"all": tuple(n for n, h in HAZARDS.items() if h.steps != "longctx"),
               "all-longctx": tuple(n for n, h in HAZARDS.items() if h.steps == "longctx")}


def register(hazards: dict, set_name: str) -> None:
    """Add ``hazards`` (``{name: hazard}``) to :data:`HAZARDS` as set ``set_name``, so a package above this one adds
    its own. Raises ValueError for a name or set already there."""
    taken = sorted(set(hazards) & set(HAZARDS)) + ([set_name] if set_name in HAZARD_SETS else [])
    if taken:
        raise ValueError(f"hazard {', '.join(taken)} is in the table already")
    HAZARDS.update(hazards)
    HAZARD_SETS[set_name] = tuple(hazards)


def hazard_names(text: str) -> list[str]:
    """``"all"``, ``"all-longctx"`` or one hazard name → the names. Raises ValueError listing the known ones."""
    if text in HAZARD_SETS:
        return list(HAZARD_SETS[text])
    if text not in HAZARDS:
        raise ValueError(f"unknown hazard {text!r}; choose one of: {', '.join(HAZARDS)} (or {', '.join(HAZARD_SETS)})")
    return [text]


def _record_moe(run: StageRun, steps: int, seed: int = 11) -> list[dict]:
    """Routed-MoE steps of 2 tokens on the first top-k layer; after each, the expert counts and the MoE output."""
    model, be = run.model, run.be
    cfg = model.cfg
    run.activate()
    layer = min(cfg.n_hash_layers, model.n_layers - 1)
    rng = np.random.default_rng(seed)
    x = be.zeros((2, cfg.embed), np.float32)  # the step's input, always at the same address

    def cluster():  # router (expert selection stays on the device) + routed MoE, 2 tokens
        model.router(layer, x, 2)
        model.routed_moe(layer, x, 2)

    out = []
    with S.stream_override(run.stream):
        for _ in range(steps):
            be.copy_h2d(S.current_stream(), x, rng.standard_normal((2, cfg.embed)).astype(np.float32))
            model.run_cluster("moe", layer, 2, None, cluster, inputs=(x,))
            be.synchronize()
            out.append({"moe.counts": be.to_host(model.moe_buf.counts).copy(),
                        "hidden": be.to_host(model.moe_buf.y)[:2].copy()})
    return out


def _model_cfg(hz: Hazard, cfg, span: Span):
    if hz.steps == "longctx":
        need = -(-(span.start + span.tokens + 1) // 128) * 128
        return cfg.replace(long_context=True, max_context=max(need, 128 * 4))
    return cfg


def demonstrate(name: str, be, cfg, mode: str = "thread_local") -> dict:
    """Run hazard ``name`` on ``be`` (which computes) for ``cfg``, eagerly against its stage: the outcome as a dict
    (also ``exact_3c``, ``graphs_3c`` at long context). ValueError lists the known names."""
    try:
        hz = HAZARDS[name]
    except KeyError:
        raise ValueError(f"unknown hazard {name!r}; choose one of: {', '.join(HAZARDS)}") from None
    if hz.steps == "tp":  # two ranks: the tensor-parallel hazard runs itself
        return hz.demonstrate(be, cfg, mode)
    span = hz.span(cfg) if hz.span is not None else Span(1000, 6)
    mcfg = _model_cfg(hz, cfg, span)
    stage = STAGES[hz.stage]
    n_layers = None if hz.steps == "longctx" else min(mcfg.n_layers, mcfg.n_hash_layers + 1)

    def record(st, *, patch=None, options=None, key_decisions=None, warmup=1):
        # A model per run, built with the run's options: they may need other buffers (on-demand scratch).
        base = TokenOptions(vocab=True)
        model = DecodeModel(mcfg, be, TokenOptions(**{**base.summary(), **st.options, **(options or {})}),
                            n_layers=n_layers)
        policy = st.policy.with_(warmup=warmup, **({} if key_decisions is None else {"key_decisions": key_decisions}))
        run = StageRun(model, st, base, mode=mode, policy=policy, patch=patch, options=options)
        rec = _record_moe(run, span.tokens) if hz.steps == "moe" else run.record(span)
        return rec, run

    eager = _eager_twin(stage)
    with S.graphs_enabled():
        ref, _ = record(eager, options=hz.options)
        got, run = record(stage, patch=hz.patch, options=hz.options, key_decisions=hz.key_decisions,
                          warmup=hz.warmup)
        extra = {}
        if hz.steps == "longctx":
            got3c, run3c = record(STAGES["3c"])
            extra = {"exact_3c": first_difference(ref, got3c) is None, "graphs_3c": run3c.stats()["captures"]}
    diff = first_difference(ref, got)
    st = run.stats()
    return {"hazard": name, "what": hz.what, "stage": stage.name, "capture_mode": run.mode,
            "positions": f"{span.start}..{span.start + span.tokens - 1}", "outcome": outcome(diff, st),
            "errors": ";".join(f"{k}={v}" for k, v in st["failures"].items()) or "none",
            "retired": "; ".join(e.reason for e in run.cache.retired()), "captures": st["captures"],
            "replays": st["replays"], "eager_runs": st["eager_runs"], "retirements": st["retirements"],
            "exact": diff is None, "first_mismatch": diff or "", "expected": hz.expected(run.mode),
            "profile_lines": len(run.model.moe_profile_log), **extra, "backend": be.name}


def _eager_twin(stage):
    """The reference of a stage's hazard: the same stream and options, nothing captured."""
    from dataclasses import replace

    from ..capture.cache import EAGER

    return replace(stage, name=f"{stage.name} (eager)", policy=EAGER)


__all__ = ["HAZARDS", "HAZARD_SETS", "Hazard", "PROFILE_SITES", "demonstrate", "hazard_names", "register"]
