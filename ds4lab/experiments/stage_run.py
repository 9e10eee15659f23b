"""The experiment as one object: a stage run on a model, and what every experiment does with it.

A :class:`StageRun` is one stage (:mod:`ds4lab.experiments.stages`) on a shared
:class:`~ds4lab.token.model.DecodeModel`: its token options, its stream, its graph cache, an optional model patch (a
hazard re-introduced), and three things to do with it:

* :meth:`StageRun.record`: decode a span of tokens from the prefilled state and keep, after each token, every tensor an
  error could land in (:meth:`DecodeModel.snapshot`: hidden state, logits, every KV cache, on the long-context token
  the compressed caches and compressor states);
* :meth:`StageRun.time`: µs per token over a span (CUDA events on the stage's stream, each token ended with a device
  synchronize as ds4 does; :func:`ds4lab.timing.time_steps`);
* the graph cache's statistics.

Then one :func:`first_difference` (bit for bit, the first differing tensor named) and one :func:`outcome` classifier
(exact / refused → eager fallback / replays wrong / broke capture) serve the ladder, the context ladder and every
hazard demonstration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..capture import stream as S
from ..capture.cache import CapturePolicy, GraphCache
from ..timing import profiler_range, time_steps
from ..token.model import DecodeModel, TokenOptions
from ..token.config import token_id_at
from .stages import Stage

#: The outcomes :func:`outcome` gives.
OUTCOMES = ("captured, exact", "refused → eager fallback", "captured, replays wrong", "broke capture", "eager, exact",
            "eager, differs")


@dataclass(frozen=True)
class Span:
    """``tokens`` consecutive decode positions from ``start``."""

    start: int
    tokens: int

    def positions(self) -> range:
        return range(self.start, self.start + self.tokens)


class StageRun:
    """One stage on a shared model: its options, its stream, its capture policy and its graph cache.

    All runs of an experiment share one :class:`DecodeModel` (one set of weights) and switch options and executor with
    :meth:`activate`, so stages can be timed in interleaved rounds and host noise falls on all of them alike.

    Args:
        model: the model (its ``cfg`` decides the long-context token).
        stage: the stage.
        base: the token options every stage starts from (the stage's ``options`` go over them).
        mode: the capture mode, unless the policy fixes its own.
        policy: the capture policy (:class:`~ds4lab.capture.cache.CapturePolicy`); None: the stage's
            (:attr:`Stage.policy`). A caller that tunes one (a hazard's warm-up, one graph per token shape) passes
            ``stage.policy.with_(...)``: the policy goes whole to the graph cache.
        patch: called with the model on every :meth:`activate` and undone after (see :class:`ModelPatch`): a hazard the
            token options cannot express.
        options: token options over the stage's (a hazard's ds4-today path)."""

    def __init__(self, model: DecodeModel, stage: Stage, base: TokenOptions, *, mode: str = "thread_local",
                 policy: CapturePolicy | None = None, patch: "ModelPatch | None" = None,
                 options: dict | None = None) -> None:
        self.stage, self.model, self.be = stage, model, model.be
        self.opts = TokenOptions(**{**base.summary(), **stage.options, **(options or {})})
        self.policy = (policy or stage.policy).in_mode(mode)
        self.mode = self.policy.mode
        self.patch = patch
        self.stream = self.be.new_stream(non_blocking=True) if stage.nonblocking else S.LEGACY_STREAM
        self.cache = None
        if self.policy.captures:
            self.cache = GraphCache(
                self.be, self.policy, skip=_island_skips(model, stage),
                capture_stream=self.be.new_stream(non_blocking=False) if self.policy.blocking_capture_stream else None)

    @property
    def name(self) -> str:
        return self.stage.name

    def activate(self) -> None:
        """Make this run the model's configuration: options, executor, patch."""
        m = self.model
        if m.patch is not None and m.patch is not self.patch:
            m.patch.remove(m)
        m.set_options(self.opts)
        m.executor = self.cache
        if self.patch is not None and m.patch is not self.patch:
            self.patch.apply(m)

    def token(self, pos: int) -> None:
        """Issue one decode token at ``pos`` on the stage's stream (asynchronous on a GPU)."""
        tok = token_id_at(pos, self.model.cfg.vocab)
        if self.stage.nonblocking:
            with S.stream_override(self.stream):
                self.model.token(pos, tok)
        else:
            self.model.token(pos, tok)

    def record(self, span: Span) -> list[dict]:
        """From the prefilled state, decode ``span`` with this stage; after each token a host copy of every tensor
        :meth:`DecodeModel.snapshot` names (the same set for every stage)."""
        m = self.model
        self.activate()
        m.reset_state()
        out = []
        for pos in span.positions():
            self.token(pos)
            self.be.synchronize()
            out.append(m.snapshot(span.start, span.start + span.tokens))
        return out

    def time(self, span: Span, warmup: int, progress=None) -> dict:
        """µs per token over ``span`` after ``warmup`` untimed tokens before it (events on the stage's stream), host
        enqueue µs, launches per token by kind. nsys ``--capture-range=cudaProfilerApi`` records only the timed
        tokens (:func:`ds4lab.timing.profiler_range`)."""
        self.activate()
        m = self.model
        first = span.start - warmup

        def step(i: int) -> None:
            self.token(first + i)

        with profiler_range(self.be):
            smp = time_steps(self.be, step, span.tokens, stream=self.stream, warmup=warmup,
                             on_warm=m.L.census.reset, progress=progress)
        per = {r.kind: float(r.launches) for r in m.L.census.by_kind().itertuples()}
        return {"us_samples": smp.device_us, "host_samples": smp.host_us,
                "kernel_launches": per.get("kernel", 0.0), "graph_launches": per.get("graph", 0.0),
                "memsets": per.get("memset", 0.0), "memcpys": per.get("memcpy", 0.0),
                "node_updates": per.get("node_update", 0.0)}

    def stats(self) -> dict:
        """The graph cache's counts (:class:`~ds4lab.capture.cache.CacheStats`), ``{}`` for an eager stage."""
        return self.cache.stats.as_dict() if self.cache else {}


def _island_skips(model: DecodeModel, stage: Stage) -> frozenset:
    """Graph keys a stage never captures: ds4 keeps island 1 eager on the hash-routed layers (the token id is a kernel
    argument of their router; ds4 ``e50104f6``)."""
    if "island1" not in stage.capture:
        return frozenset()
    return frozenset(("island1", layer) for layer in range(model.n_layers) if model.cfg.is_hash_layer(layer))


class ModelPatch:
    """A hazard the token options cannot express, applied to a model instance and removed again (a guard told not to
    re-ask some host decisions, a kernel argument passed by value).

    Args:
        forget: prefixes of the long-context host decisions the graph guard is not told about.
        comp_row_by_value: the compressor's kernels get the position by value, whatever ``scalars`` says."""

    def __init__(self, forget: tuple = (), comp_row_by_value: bool = False) -> None:
        self.forget = tuple(forget)
        self.comp_row_by_value = comp_row_by_value

    def apply(self, model: DecodeModel) -> None:
        model.patch = self

    def remove(self, model: DecodeModel) -> None:
        if model.patch is self:
            model.patch = None


def first_difference(ref: list[dict], got: list[dict]) -> str | None:
    """``None`` when every tensor of every token is bit-identical, else the first that differs: ``"token <i>:
    <tensor>"``, tokens in order, within a token the caches before the hidden state and the logits (a wrong cache
    row is the cause, the hidden state its effect). A token count or a tensor that exists on one side only is a
    difference."""
    if len(ref) != len(got):
        return f"token count: {len(ref)} recorded against {len(got)}"
    for t, (a, b) in enumerate(zip(ref, got)):
        names = [n for n in a if n not in ("hidden", "logits")] + [n for n in ("hidden", "logits") if n in a]
        for n in names + [n for n in b if n not in a]:
            x, y = a.get(n), b.get(n)
            if x is None and y is None:
                continue
            if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype or \
                    not np.array_equal(np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8)):
                return f"token {t}: {n}"
    return None


def outcome(diff: str | None, stats: dict) -> str:
    """One classifier for every experiment: what a captured run did against its eager reference.

    ``"captured, exact"``: graphs replayed, every tensor bit-identical. ``"refused → eager fallback"``: a capture
    failed (a CUDA or CuPy error, or the legacy stream), the graph retired and the work ran eagerly, bit-identical.
    ``"captured, replays wrong"``: captures succeeded and a replay differs. ``"broke capture"``: a capture failed or
    was aborted and the results differ too. A run with no graph cache: ``"eager, exact"`` / ``"eager, differs"``.
    """
    if not stats:
        return "eager, exact" if diff is None else "eager, differs"
    failed = sum(stats.get("failures", {}).values()) + stats.get("aborts", 0)
    if failed:
        return "refused → eager fallback" if diff is None else "broke capture"
    return "captured, exact" if diff is None else "captured, replays wrong"


def compare_runs(reference: StageRun, runs: list[StageRun], span: Span,
                 on_result: Callable[[StageRun, str | None], None] | None = None,
                 on_reference: Callable[[], None] | None = None) -> dict[str, str | None]:
    """Record ``reference`` and every run over ``span`` from the same prefilled state; returns ``{run name: first
    difference or None}`` (:func:`first_difference`), calling ``on_reference`` once the reference is recorded and
    ``on_result`` as each run finishes."""
    ref = reference.record(span)
    if on_reference is not None:
        on_reference()
    out = {}
    for r in runs:
        out[r.name] = first_difference(ref, r.record(span))
        if on_result is not None:
            on_result(r, out[r.name])
    return out


__all__ = ["ModelPatch", "OUTCOMES", "Span", "StageRun", "compare_runs", "first_difference", "outcome"]
