"""The stages of ds4's CUDA-graph plan and how one is run and timed (the job: :mod:`ds4lab.jobs.ladder`).

Each stage is one configuration of the same decode token (``shared/context/ds4-decode.md``,
"The staged plan"). Per stage: exactness against stage 0 over K tokens (final hidden state and
logits, bit for bit), then µs per token over N tokens after warm-up (CUDA events on the stage's
stream; each token ended with a device synchronize as ds4 does), host enqueue time, kernel and
graph launches per token, the graph cache's statistics, speedup over stage 0, and efficiency
against the GPU-busy floor (the sum of one token's kernel durations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..capture import stream as S
from ..capture.cache import GraphCache
from ..errors import BadInput
from ..token.model import DecodeModel, TokenOptions
from ..timing import Stats, profiler_range, time_steps

#: The hazard fixes a stage can require (context file, "Capture hazards").
FIXES = ("launches through the accessor", "non-blocking stream", "async counts clear",
         "expert selection on the device", "preallocated scratch", "no host-timed profiling",
         "scalars from device buffers", "node parameters updated before replay",
         "no device sync in the body", "warm-up before capture")


@dataclass(frozen=True)
class Stage:
    """One rung of the ladder: which stream, which clusters are captured, which fixes apply."""

    name: str
    short: str
    description: str
    nonblocking: bool = True
    capture: tuple = ()
    options: dict = field(default_factory=dict)
    update: bool = False
    fixes: tuple = ()


#: The first decoded position (the KV window is full from the start) and what a ladder writes.
START_POS = 1000
LADDER_OUTPUTS = ("ladder.csv", "ladder.png", "ladder.svg", "ladder.pdf")

STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("0", "eager, legacy", "stage 0: every launch through the accessor, no override: legacy stream, eager",
          nonblocking=False, fixes=("launches through the accessor",)),
    Stage("0s", "eager, stream", "eager on a non-blocking stream set with capture_set_stream (the stream "
          "change alone, no capture)", fixes=("launches through the accessor", "non-blocking stream")),
    Stage("1", "shared FFN", "shared-expert FFN cluster of every layer captured once, replayed (one graph per layer)",
          capture=("shared",), fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture")),
    Stage("2", "+ routed MoE", "stage 1 plus the routed-MoE cluster captured (experts read on the device, counts "
          "clear async, scratch preallocated, no host-timed profiling)", capture=("shared", "moe"),
          options=dict(counts_clear="async", scratch="prealloc", moe_profile=False),
          fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture", "async counts clear",
                 "expert selection on the device", "preallocated scratch", "no host-timed profiling")),
    Stage("3", "whole token", "the whole token body captured, per-token scalars read from device buffers "
          "written before each replay (one graph per token shape)", capture=("token",),
          options=dict(counts_clear="async", scratch="prealloc", moe_profile=False, scalars="device"),
          fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture", "async counts clear",
                 "expert selection on the device", "preallocated scratch", "no host-timed profiling",
                 "scalars from device buffers", "no device sync in the body")),
    Stage("3u", "token + update", "as 3, scalars passed by value; the executable graph's kernel parameters "
          "updated before each replay (re-capture + cudaGraphExecUpdate)", capture=("token",), update=True,
          options=dict(counts_clear="async", scratch="prealloc", moe_profile=False, scalars="value"),
          fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture", "async counts clear",
                 "expert selection on the device", "preallocated scratch", "no host-timed profiling",
                 "node parameters updated before replay", "no device sync in the body")),
)}


def fixes_table():
    """Which hazard fixes each stage requires: a DataFrame, stages × fixes (``required`` / ``—``)."""
    import pandas as pd

    return pd.DataFrame({s.name: ["required" if f in s.fixes else "—" for f in FIXES] for s in STAGES.values()},
                        index=list(FIXES))


class LadderInputError(BadInput):
    """A ladder request that cannot run (the command line exits 2); nothing was measured."""


def parse_stages(text: str) -> list[Stage]:
    """``"0,0s,1"`` → stages. Raises :class:`LadderInputError` naming an unknown or repeated stage."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in STAGES]
    if bad or not names:
        raise LadderInputError(f"unknown stage(s) {', '.join(bad) or repr(text)}; choose from: {', '.join(STAGES)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LadderInputError(f"stage(s) {', '.join(twice)} listed more than once in {text!r}")
    return [STAGES[n] for n in names]


class StageRun:
    """One stage on a shared model: its options, its stream and its graph cache.

    All stages of a ladder share one :class:`DecodeModel` (one set of weights), switching
    options and executor with :meth:`activate`, so the stages can be timed in interleaved rounds
    and host noise falls on all of them alike.
    """

    def __init__(self, model: DecodeModel, stage: Stage, base_opts: TokenOptions, mode: str = "thread_local",
                 guard: bool = True, warmup: int = 1) -> None:
        self.stage, self.model, self.be = stage, model, model.be
        self.opts = TokenOptions(**{**base_opts.summary(), **stage.options})
        self.stream = self.be.new_stream(non_blocking=True) if stage.nonblocking else S.LEGACY_STREAM
        self.cache = GraphCache(self.be, stage.capture, mode=mode, update=stage.update, guard=guard,
                                warmup=warmup) if stage.capture else None

    def activate(self) -> None:
        self.model.set_options(self.opts)
        self.model.executor = self.cache

    def token(self, pos: int, tok: int) -> None:
        if self.stage.nonblocking:
            with S.stream_override(self.stream):
                self.model.token(pos, tok)
        else:
            self.model.token(pos, tok)


def token_id_at(pos: int, vocab: int) -> int:
    return (pos * 7919 + 13) % vocab


def exactness_record(run: StageRun, start: int, k: int) -> list[dict]:
    """From the prefilled state, decode ``k`` tokens from ``start`` with ``run``'s stage; after each:
    hidden state, logits, per-layer KV caches (host copies)."""
    be, m = run.be, run.model
    run.activate()
    m.reset_state()
    out = []
    for i in range(k):
        pos = start + i
        run.token(pos, token_id_at(pos, m.cfg.vocab))
        be.synchronize()
        out.append({"hidden": m.hidden().copy(),
                    "logits": None if m.logits is None else m.output_logits().copy(),
                    **{f"kv_cache[{layer}]": be.to_host(c).copy() for layer, c in enumerate(m.cache)}})
    return out


def first_difference(ref: list[dict], got: list[dict]) -> str | None:
    """``None`` when every tensor of every token is bit-identical, else the first that differs
    (token index and tensor name; caches before the hidden state, in layer order)."""
    for t, (a, b) in enumerate(zip(ref, got)):
        names = [n for n in a if n.startswith("kv_cache")] + ["hidden", "logits"]
        for n in names:
            x, y = a.get(n), b.get(n)
            if x is None and y is None:
                continue
            if x is None or y is None or x.shape != y.shape or not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
                return f"token {t}: {n}"
    return None


def gpu_busy_floor(be, model, pos: int) -> float | None:
    """µs: the sum of one token's kernel durations (per-op CUDA events on a GPU; the cost model's
    kernel times on the sim). The token runs eagerly, whatever the stage captures."""
    executor, model.executor = model.executor, None
    try:
        return _floor(be, model, pos)
    finally:
        model.executor = executor


def _floor(be, model, pos: int) -> float | None:
    if be.is_gpu:
        from ..measure.perop import per_op_times

        return float(per_op_times(be, model, pos=pos, token_id=token_id_at(pos, model.cfg.vocab)).us.sum())
    if be.models_time:
        with model.L.recording() as trace:
            model.token(pos, token_id_at(pos, model.cfg.vocab))
        return float(sum(be.modeled_kernel_us(r.kernel, r.nbytes) for r in trace))
    return None


def time_stage(run: StageRun, start: int, tokens: int, warmup: int, progress=None) -> dict:
    """µs per token (events on the stage's stream), host enqueue µs, launches per token, through
    :func:`ds4lab.timing.time_steps`; nsys ``--capture-range=cudaProfilerApi`` records only the
    timed tokens (:func:`ds4lab.timing.profiler_range`)."""
    m = run.model
    vocab = m.cfg.vocab

    def step(i: int) -> None:
        run.token(start + i, token_id_at(start + i, vocab))

    with profiler_range(run.be):
        smp = time_steps(run.be, step, tokens, stream=run.stream, warmup=warmup, on_warm=m.L.census.reset,
                         progress=progress)
    kinds = m.L.census.by_kind()
    per = {r.kind: float(r.launches) for r in kinds.itertuples()}
    return {"us": Stats.of(smp.device_us), "host_us": Stats.of(smp.host_us), "us_samples": smp.device_us,
            "host_samples": smp.host_us, "kernel_launches": per.get("kernel", 0.0),
            "graph_launches": per.get("graph", 0.0), "memsets": per.get("memset", 0.0),
            "memcpys": per.get("memcpy", 0.0)}
