"""Per-cluster CUDA-graph capture with a graph cache, eager fallback and a host-decision guard (:class:`GraphCache`,
a model's executor, driven by one frozen :class:`CapturePolicy`). Per cluster: eager while the key (:class:`GraphKey`)
warms up, then capture, instantiate once, replay; a changed host decision retires the graph; a capture failure
leaves the cluster eager. The policy's options: ``docs/capture-stages.md``, "The graph cache's policy"."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import GraphExecUpdateError, RuntimeApiError
from .scope import capture_scope
from .stream import LEGACY_STREAM, stream_override


@dataclass(frozen=True)
class CapturePolicy:
    """How a graph cache captures, as one frozen value (module docstring): held by a stage
    (:attr:`ds4lab.experiments.stages.Stage.policy`) and passed whole to its run and its cache."""

    clusters: frozenset = frozenset()
    """The model's clusters to capture (others run eagerly); empty: nothing (eager)."""
    mode: str | None = None
    """The stream-capture mode, ``"global"``, ``"thread_local"`` or ``"relaxed"``; None: the run's
    (``--mode``), set by :meth:`in_mode`."""
    update: bool = False
    """Re-capture every call and update the executable graph (stage ``3u``)."""
    warmup: int = 1
    """Eager calls per key before its capture."""
    guard: bool = True
    """Re-ask the host decisions before each replay."""
    key_decisions: bool = False
    """Make the host decisions part of the key: one graph per answer (long context: emit and non-emit
    tokens, each top-k regime) instead of a changed answer capturing again."""
    variants: int = 0
    """Graphs per (cluster, layer, token count), told apart by the buffers they touch; 0: unbounded."""
    node_updates: frozenset = frozenset()
    """Clusters replayed after setting their kernel nodes' parameters."""
    invalidate_on_realloc: bool = False
    """Drop every graph when the model's buffer generation changes."""
    blocking_capture_stream: bool = False
    """Capture and replay on a dedicated blocking stream while the eager work stays where it is (ds4's
    islands), not on the accessor's stream."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "clusters", frozenset(self.clusters))
        object.__setattr__(self, "node_updates", frozenset(self.node_updates))

    @property
    def captures(self) -> bool:
        """Whether anything is captured."""
        return bool(self.clusters)

    def with_(self, **changes) -> "CapturePolicy":
        """This policy with ``changes`` (field names)."""
        return dataclasses.replace(self, **changes)

    def in_mode(self, mode: str) -> "CapturePolicy":
        """This policy with ``mode`` where it fixes none of its own."""
        return self if self.mode is not None else self.with_(mode=mode)


#: Eager: nothing captured.
EAGER = CapturePolicy()


@dataclass(frozen=True, order=True)
class GraphKey:
    """The cache key of one call: its site (``cluster``, ``layer``, ``tokens``: :attr:`site`), the buffers it touches
    (``generation``, ``addresses``) and, with ``key_decisions``, the host decisions. Keys order as their fields do."""

    cluster: str
    layer: int
    tokens: int
    generation: int
    addresses: tuple
    decisions: tuple = ()

    @property
    def site(self) -> tuple:
        """``(cluster, layer, tokens)``."""
        return self.cluster, self.layer, self.tokens


@dataclass
class CacheEntry:
    """One cached graph: where it came from, what it assumed, and what happened to it."""

    key: GraphKey
    graph_exec: Any = None
    decisions: tuple = ()
    addresses: tuple = ()
    nodes: int = 0
    #: the kernels captured, in launch order (node updates compare a call's plan against them)
    kernels: tuple = ()
    replays: int = 0
    retired: bool = False
    reason: str = ""


@dataclass
class CacheStats:
    """Counts reported with every stage (``ds4lab ladder``'s cache columns)."""

    #: stream captures made (stage 3u captures on every call)
    captures: int = 0
    replays: int = 0
    #: executable graphs updated in place (``cudaGraphExecUpdate`` succeeded; stage 3u)
    updates: int = 0
    #: refused updates answered by instantiating the new graph (the entry lives on)
    reinstantiations: int = 0
    #: updates that could not be answered (re-capture or re-instantiation failed): the call ran eagerly
    fallbacks: int = 0
    retirements: int = 0
    recaptures: int = 0
    eager_runs: int = 0
    #: captures ended by a non-CUDA exception (``KeyboardInterrupt``, ...); the key stays uncaptured
    aborts: int = 0
    #: graphs dropped because the model reallocated a buffer (``invalidate_on_realloc``)
    invalidations: int = 0
    #: calls that ran eagerly because their key already had ``variants`` graphs
    variant_overflows: int = 0
    #: kernel-node parameter sets before a replay (``node_updates`` clusters)
    node_updates: int = 0
    #: calls that run eagerly by design (``skip``)
    skipped: int = 0
    failures: Counter = field(default_factory=Counter)
    #: refused updates by ``cudaGraphExecUpdateResult`` name and failing node type ("result/node")
    update_results: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        """Every count, then ``failures`` and ``update_results`` as plain dicts."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**d, "failures": dict(self.failures), "update_results": dict(self.update_results)}


@dataclass
class _Captured:
    """What one capture produced: the graph, the addresses it touched, its launches."""

    graph: Any
    addresses: tuple
    records: list


class GraphCache:
    """Captures the clusters of a model its :class:`CapturePolicy` names and replays them (see module docstring).

    ``backend``: ``cupy`` or ``sim``; a policy without a mode captures in ``thread_local``; ``capture_stream``:
    capture and replay there instead of on the accessor's stream; ``skip``: ``(cluster, layer)`` pairs run eagerly."""

    def __init__(self, backend, policy: CapturePolicy, *, capture_stream=None, skip=frozenset()) -> None:
        self.be = backend
        self.policy = policy.in_mode("thread_local")
        self.capture_stream = capture_stream
        self.skip = frozenset(skip)
        self.entries: dict[GraphKey, CacheEntry] = {}
        self.warm: Counter = Counter()
        self.stats = CacheStats()
        self.log: list[dict] = []
        self._generation = None

    # ------------------------------------------------------------------ the executor hook
    def run(self, model, cluster: str, layer: int, T: int, ts, fn: Callable[[], None], inputs: tuple = ()) -> None:
        """Run one cluster: eagerly, by capture then replay, or by replay."""
        L = model.L
        if cluster not in self.policy.clusters or L.capturing:
            fn()
            return
        if (cluster, layer) in self.skip:
            self.stats.skipped += 1
            fn()
            return
        if self.policy.invalidate_on_realloc and model.generation != self._generation:
            if self._generation is not None:
                self.invalidate_all(f"buffer generation {self._generation} → {model.generation}")
            self._generation = model.generation
        updates = cluster in self.policy.node_updates
        key = GraphKey(cluster, layer, T, model.generation, tuple(_addr(a) for a in inputs),
                       model.host_decisions(cluster, layer, T, ts) if self.policy.key_decisions else ())
        e = self.entries.get(key)
        if e is not None and e.retired:
            self.stats.eager_runs += 1
            fn()
            return
        decisions = model.host_decisions(cluster, layer, T, ts) if self.policy.guard and not updates else ()
        if e is not None and e.decisions != decisions:
            changed = [f"{a[0]}: {a[1]} → {b[1]}" for a, b in zip(e.decisions, decisions) if a != b]
            self._replace(e, "host decision changed: " + "; ".join(changed))
            e = None
        plan = None
        if e is not None and updates:
            plan = self._plan(model, fn)
            if tuple(r.kernel for r in plan) != e.kernels:
                self._replace(e, "launch list changed: kernels differ from the captured graph's")
                e, plan = None, None
        if e is None:
            if self.policy.variants and key not in self.warm and self._n_variants(key) >= self.policy.variants:
                self.stats.variant_overflows += 1
                fn()
                return
            if self.warm[key] < self.policy.warmup:
                self.warm[key] += 1
                fn()
                return
            e = self._capture(model, key, fn, decisions)
            ready = not e.retired
        elif self.policy.update:
            ready = self._update(model, e, fn)
        else:
            ready = plan is None or self._set_nodes(model, e, plan)
        if ready:
            self._launch(model, cluster, e)
        else:
            self.stats.eager_runs += 1
            fn()

    def invalidate_all(self, why: str) -> None:
        """Drop every graph (ds4 ``9f325617``: scratch growth synchronizes the device and invalidates every decode
        graph before the old buffers are freed); their keys capture again on next sight."""
        self.be.synchronize()
        n = sum(1 for e in self.entries.values() if not e.retired)
        for e in self.entries.values():
            e.graph_exec = None
        self.entries.clear()
        self.warm.clear()
        self.stats.invalidations += n
        self.log.append({"event": "invalidate all", "graphs": n, "reason": why})

    def retired(self) -> list[CacheEntry]:
        return [e for e in self.entries.values() if e.retired]

    # ------------------------------------------------------------------ helpers
    def _n_variants(self, key: GraphKey) -> int:
        return sum(1 for k, e in self.entries.items() if k.site == key.site and not e.retired)

    def _replace(self, e: CacheEntry, reason: str) -> None:
        self._retire(e, reason)
        del self.entries[e.key]
        self.stats.recaptures += 1

    def _stream(self, model):
        return self.capture_stream if self.capture_stream is not None else model.L.stream()

    def _launch(self, model, cluster: str, e: CacheEntry) -> None:
        L = model.L
        if self.capture_stream is None:
            L.graph_launch(f"graph.{cluster}", e.graph_exec)
        else:
            with stream_override(self.capture_stream):
                L.graph_launch(f"graph.{cluster}", e.graph_exec)
        e.replays += 1
        self.stats.replays += 1

    @staticmethod
    def _plan(model, fn) -> list:
        """The launches ``fn`` would issue this call, without issuing them."""
        with model.L.planning() as plan:
            fn()
        return plan

    # ------------------------------------------------------------------ capture, update, retire
    def _captured(self, model, fn, key=None) -> tuple[_Captured | None, RuntimeApiError | None]:
        """Capture ``fn``: (what was captured or None, first CUDA/CuPy error); anything else ends the capture, is
        logged as an abort for ``key`` and propagates."""
        L, be = model.L, self.be
        stream = self._stream(model)
        err = None
        scope = None
        override = stream_override(stream) if self.capture_stream is not None else contextlib.nullcontext()
        try:
            with override, capture_scope(be, stream, self.policy.mode) as scope, L.recording() as trace:
                with L.capturing_launches():
                    try:
                        fn()
                    except RuntimeApiError as e:
                        err = e
        except RuntimeApiError as e:  # begin or end refused
            return None, err or e
        except BaseException as exc:
            self.stats.aborts += 1
            self.log.append({"event": "abort", "key": key, "reason": f"capture aborted by {type(exc).__name__}: {exc}"
                             + (f"; ending it: {scope.end_error}" if scope is not None and scope.end_error else ""),
                             "status_after": scope.status_after if scope is not None else "?"})
            raise
        self.stats.captures += 1
        if err is not None:
            return None, err
        addresses = tuple(sorted({_addr(a) for r in trace for a in r.args if _addr(a)}))
        return _Captured(scope.graph, addresses, list(trace)), None

    def _capture(self, model, key, fn, decisions) -> CacheEntry:
        e = CacheEntry(key, decisions=decisions)
        if self._stream(model) is LEGACY_STREAM:
            self.entries[key] = e
            self._retire(e, "the legacy stream cannot be captured: set a non-blocking stream", "legacy stream")
            return e
        got, err = self._captured(model, fn, key)  # an abort propagates: the key stays uncaptured
        self.entries[key] = e
        if err is not None:
            self._retire(e, f"capture failed: {err}", err.name)
            return e
        try:
            e.graph_exec = self.be.graph_instantiate(got.graph)
        except RuntimeApiError as ex:
            self._retire(e, f"instantiate failed: {ex}", ex.name)
            return e
        e.addresses, e.nodes = got.addresses, len(got.records)
        e.kernels = tuple(r.kernel for r in got.records)
        self.log.append({"event": "capture", "key": key, "nodes": e.nodes})
        return e

    def _update(self, model, e: CacheEntry, fn) -> bool:
        """Stage 3u: capture again and update the executable in place; a refused update instantiates the new graph
        instead (``stats.reinstantiations``). False (run eagerly) when that fails too; the entry then retires."""
        got, err = self._captured(model, fn, e.key)
        if err is not None:
            self._retire(e, f"re-capture for update failed: {err}", err.name, fallback=True)
            return False
        try:
            self.be.graph_exec_update(e.graph_exec, got.graph)
        except GraphExecUpdateError as ex:
            self.stats.update_results[f"{ex.result}/{ex.node_type or '-'}"] += 1
            self.log.append({"event": "update refused", "key": e.key, "result": ex.result, "node_type": ex.node_type})
            try:
                new_exec = self.be.graph_instantiate(got.graph)
            except RuntimeApiError as ex2:
                self._retire(e, f"update refused ({ex.result}) and re-instantiation failed: {ex2}", ex2.name,
                             fallback=True)
                return False
            e.graph_exec = new_exec
            e.nodes = len(got.records)
            self.stats.reinstantiations += 1
            return True
        except RuntimeApiError as ex:
            self._retire(e, f"executable-graph update failed: {ex}", ex.name, fallback=True)
            return False
        self.stats.updates += 1
        return True

    def _set_nodes(self, model, e: CacheEntry, plan: list) -> bool:
        """Stage i+: this call's arguments, grid and block into every kernel node of ``e``'s executable, in capture
        order; False (run eagerly, the entry retires) when the backend refuses one."""
        try:
            for i, rec in enumerate(plan):
                model.L.model_host_work("node_update")
                self.be.graph_exec_kernel_node_set_params(e.graph_exec, i, rec)
                model.L.count_node_update(rec.site)
        except RuntimeApiError as ex:
            self._retire(e, f"kernel-node parameter update failed: {ex}", ex.name)
            return False
        self.stats.node_updates += len(plan)
        return True

    def _retire(self, e: CacheEntry, reason: str, failure: str = "", fallback: bool = False) -> None:
        """Retire ``e`` for ``reason``, counting ``failure`` (an error name) and, with ``fallback``, a fallback."""
        if failure:
            self.stats.failures[failure] += 1
        if fallback:
            self.stats.fallbacks += 1
        e.retired = True
        e.reason = reason
        e.graph_exec = None
        self.stats.retirements += 1
        self.log.append({"event": "retire", "key": e.key, "reason": reason})


def _addr(a) -> int:
    """Device address of a backend array argument (0 for scalars)."""
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    ai = getattr(a, "__array_interface__", None)
    return ai["data"][0] if ai else 0
