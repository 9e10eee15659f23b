"""The experiment as one object: a :class:`StageRun` is one stage on a shared
:class:`~ds4lab.token.model.DecodeModel` (its options, stream, graph cache, an optional hazard patch) that records a
span's tensors (:meth:`StageRun.record`) or times it (:meth:`StageRun.time`). :func:`first_difference` and
:func:`outcome` then serve the ladder, the context ladder and every hazard demonstration."""

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
    """One stage on a shared model; runs switch options and executor with :meth:`activate`, so stages time in
    interleaved rounds.

    Args:
        model: the model (its ``cfg`` decides the long-context token).
        stage: the stage.
        base: the token options every stage starts from.
        mode: the capture mode, unless the policy fixes its own.
        policy: the capture policy; None: :attr:`Stage.policy` (tune one with ``stage.policy.with_(...)``).
        patch: a :class:`ModelPatch` applied on every :meth:`activate` and undone after.
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
        """Decode ``span`` from the prefilled state; after each token a host copy of every snapshot tensor."""
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
        """µs per token over ``span`` after ``warmup`` tokens (events on the stage's stream), host enqueue µs,
        launches per token by kind; inside :func:`ds4lab.timing.profiler_range`."""
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
    """Graph keys a stage never captures: ds4 keeps island 1 eager on hash-routed layers (ds4 ``e50104f6``)."""
    if "island1" not in stage.capture:
        return frozenset()
    return frozenset(("island1", layer) for layer in range(model.n_layers) if model.cfg.is_hash_layer(layer))


class ModelPatch:
    """A hazard the token options cannot express, applied to a model and removed again.

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
    """``None`` when every tensor of every token is bit-identical, else the first difference ``"token <i>:
    <tensor>"`` (caches before hidden state and logits); a count or tensor on one side only differs."""
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
    """What a captured run did against its eager reference: ``"captured, exact"``, ``"refused → eager fallback"`` (a
    capture failed, ran eagerly, bit-identical), ``"captured, replays wrong"``, ``"broke capture"``; without a graph
    cache ``"eager, exact"`` / ``"eager, differs"``."""
    if not stats:
        return "eager, exact" if diff is None else "eager, differs"
    failed = sum(stats.get("failures", {}).values()) + stats.get("aborts", 0)
    if failed:
        return "refused → eager fallback" if diff is None else "broke capture"
    return "captured, exact" if diff is None else "captured, replays wrong"


def compare_runs(reference: StageRun, runs: list[StageRun], span: Span,
                 on_result: Callable[[StageRun, str | None], None] | None = None,
                 on_reference: Callable[[], None] | None = None) -> dict[str, str | None]:
    """Record ``reference`` and every run over ``span``: ``{run name: first difference or None}``."""
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
