"""Per-cluster CUDA-graph capture with a graph cache, eager fallback and a host-decision guard.

A :class:`GraphCache` is installed as a :class:`~ds4lab.token.model.DecodeModel`'s executor. For the
clusters it is told to capture (``"shared"``, ``"moe"``, ``"token"``), each call:

1. builds the cache key: cluster, layer, token count, and the buffer-alias key (the model's
   buffer generation, bumped whenever ds4lab reallocates a buffer, with the addresses of every
   buffer the cluster touched recorded at capture);
2. runs eagerly while the key is warming up (first call: kernels compiled, scratch allocated);
3. captures on the accessor's stream (which must be a non-blocking stream: the legacy stream
   cannot be captured), instantiates once, then replays with ``cudaGraphLaunch``;
4. before each replay re-asks the cluster's host decisions (:meth:`DecodeModel.host_decisions`);
   a changed answer retires the graph and captures again, never replaying stale;
5. on any capture failure records the CUDA (or CuPy) error, retires the entry, and runs that
   cluster eagerly from then on: the same results, without the graph;
6. on anything else raised while capturing (``KeyboardInterrupt``, a ``KeyError`` in a cluster:
   any ``BaseException``) ends the capture through :func:`capture_scope` (the partial graph is
   discarded, the stream leaves capture mode, the thread's stream override is restored), leaves
   the key uncaptured with the reason in :attr:`GraphCache.log`, and lets the exception go on.

With ``update=True`` (stage ``3u``) a cached graph is not replayed as captured: every call
captures the cluster again with this call's by-value arguments and updates the executable graph
in place (``cudaGraphExecUpdate``) before launching it. A refused update
(``cudaErrorGraphExecUpdateFailure``, with CUDA's ``cudaGraphExecUpdateResult`` and the failing
node's type) instantiates the new graph instead, as engines that update graphs do; only a failed
re-instantiation retires the entry.
Sources: CUDA Programming Guide, "CUDA Graphs" (stream capture, graph instantiation, updating
instantiated graphs); ds4's staged plan (context file); the measured rules in NOTES.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import GraphExecUpdateError, RuntimeApiError
from .scope import capture_scope
from .stream import LEGACY_STREAM


@dataclass
class CacheEntry:
    """One cached graph: where it came from, what it assumed, and what happened to it."""

    key: tuple
    graph_exec: Any = None
    decisions: tuple = ()
    addresses: tuple = ()
    nodes: int = 0
    replays: int = 0
    retired: bool = False
    reason: str = ""


@dataclass
class CacheStats:
    """Counts reported with every stage (``ds4lab ladder``'s cache columns)."""

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
    failures: Counter = field(default_factory=Counter)
    #: refused updates by ``cudaGraphExecUpdateResult`` name and failing node type ("result/node")
    update_results: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("captures", "replays", "updates", "reinstantiations", "fallbacks",
                                           "retirements", "recaptures", "eager_runs", "aborts")}
        d["failures"] = dict(self.failures)
        d["update_results"] = dict(self.update_results)
        return d


class GraphCache:
    """Captures the named clusters of a model and replays them (see module docstring).

    Args:
        backend: the model's backend (``cupy`` or ``sim``).
        clusters: cluster names to capture (others run eagerly).
        mode: capture mode, ``"global"``, ``"thread_local"`` (default) or ``"relaxed"``.
        warmup: eager calls per key before its capture.
        update: re-capture every call and update the executable graph (stage ``3u``).
        guard: re-ask host decisions before each replay (on by default).
        key_decisions: make the host decisions part of the cache key, so each answer keeps its
            own graph (long context: emit and non-emit tokens, each top-k regime) instead of a
            changed answer retiring the graph and capturing again. Off by default.
    """

    def __init__(self, backend, clusters, mode: str = "thread_local", warmup: int = 1,
                 update: bool = False, guard: bool = True, key_decisions: bool = False) -> None:
        self.be = backend
        self.clusters = frozenset(clusters)
        self.mode = mode
        self.warmup = warmup
        self.update = update
        self.guard = guard
        self.key_decisions = key_decisions
        self.entries: dict[tuple, CacheEntry] = {}
        self.warm: Counter = Counter()
        self.stats = CacheStats()
        self.log: list[dict] = []

    # ------------------------------------------------------------------ the executor hook
    def run(self, model, cluster: str, layer: int, T: int, ts, fn: Callable[[], None], inputs: tuple = ()) -> None:
        """Run one cluster: eagerly, by capture then replay, or by replay."""
        if cluster not in self.clusters or model.L.capturing:
            fn()
            return
        key = (cluster, layer, T, model.generation, tuple(_addr(a) for a in inputs))
        if self.key_decisions:
            key += (model.host_decisions(cluster, layer, T, ts),)
        e = self.entries.get(key)
        if e is not None and e.retired:
            self.stats.eager_runs += 1
            fn()
            return
        decisions = model.host_decisions(cluster, layer, T, ts) if self.guard else ()
        if e is not None and e.decisions != decisions:
            changed = [f"{a[0]}: {a[1]} → {b[1]}" for a, b in zip(e.decisions, decisions) if a != b]
            self._retire(e, "host decision changed: " + "; ".join(changed))
            del self.entries[key]
            self.stats.recaptures += 1
            e = None
        if e is None:
            if self.warm[key] < self.warmup:
                self.warm[key] += 1
                fn()
                return
            e = self._capture(model, key, fn, decisions)
            if e.retired:
                self.stats.eager_runs += 1
                fn()
                return
        elif self.update:
            if not self._update(model, e, fn):
                self.stats.eager_runs += 1
                fn()
                return
        model.L.graph_launch(f"graph.{cluster}", e.graph_exec)
        e.replays += 1
        self.stats.replays += 1

    # ------------------------------------------------------------------ capture, update, retire
    def _captured(self, model, fn, key=None) -> tuple[Any, RuntimeApiError | None]:
        """Capture ``fn`` on the accessor's stream; returns (graph or None, first error).

        A CUDA/CuPy error is returned; anything else (``BaseException``) ends the capture
        (:func:`capture_scope`), is logged as an abort for ``key`` and propagates.
        """
        L, be = model.L, self.be
        stream = L.stream()
        err = None
        scope = None
        try:
            with capture_scope(be, stream, self.mode) as scope, L.recording() as trace:
                L.capturing = True
                try:
                    fn()
                except RuntimeApiError as e:
                    err = e
                finally:
                    L.capturing = False
        except RuntimeApiError as e:  # begin or end refused
            return None, err or e
        except BaseException:
            self.stats.aborts += 1
            self.log.append({"event": "abort", "key": key, "reason": f"capture aborted by {scope.aborted_by}"
                             + (f"; ending it: {scope.end_error}" if scope.end_error else ""),
                             "status_after": scope.status_after})
            raise
        if err is not None:
            return None, err
        self._last_addresses = tuple(sorted({_addr(a) for r in trace for a in r.args if _addr(a)}))
        self._last_nodes = len(trace)
        return scope.graph, None

    def _capture(self, model, key, fn, decisions) -> CacheEntry:
        if model.L.stream() is LEGACY_STREAM:
            e = CacheEntry(key, decisions=decisions, retired=True,
                           reason="the legacy stream cannot be captured: set a non-blocking stream")
            self.stats.failures["legacy stream"] += 1
            self.entries[key] = e
            return e
        g, err = self._captured(model, fn, key)
        e = CacheEntry(key, decisions=decisions)
        self.entries[key] = e
        if err is not None:
            self.stats.failures[err.name] += 1
            self._retire(e, f"capture failed: {err}")
            return e
        try:
            e.graph_exec = self.be.graph_instantiate(g)
        except RuntimeApiError as ex:
            self.stats.failures[ex.name] += 1
            self._retire(e, f"instantiate failed: {ex}")
            return e
        e.addresses, e.nodes = self._last_addresses, self._last_nodes
        self.stats.captures += 1
        self.log.append({"event": "capture", "key": key, "nodes": e.nodes})
        return e

    def _update(self, model, e: CacheEntry, fn) -> bool:
        """Stage 3u: capture again with this call's arguments, update the executable in place.

        A refused update (:class:`~ds4lab.errors.GraphExecUpdateError`: CUDA's update result and
        the failing node's type, counted in ``stats.update_results``) instantiates the new graph
        instead and replaces the entry's executable (``stats.reinstantiations``). Returns False
        (the call runs eagerly, ``stats.fallbacks``) only when the re-capture or that
        instantiation fails; then the entry retires.
        """
        g, err = self._captured(model, fn, e.key)
        if err is not None:
            self.stats.failures[err.name] += 1
            self.stats.fallbacks += 1
            self._retire(e, f"re-capture for update failed: {err}")
            return False
        try:
            self.be.graph_exec_update(e.graph_exec, g)
        except GraphExecUpdateError as ex:
            self.stats.update_results[f"{ex.result}/{ex.node_type or '-'}"] += 1
            self.log.append({"event": "update refused", "key": e.key, "result": ex.result, "node_type": ex.node_type})
            try:
                new_exec = self.be.graph_instantiate(g)
            except RuntimeApiError as ex2:
                self.stats.failures[ex2.name] += 1
                self.stats.fallbacks += 1
                self._retire(e, f"update refused ({ex.result}) and re-instantiation failed: {ex2}")
                return False
            e.graph_exec = new_exec
            e.nodes = self._last_nodes
            self.stats.reinstantiations += 1
            return True
        except RuntimeApiError as ex:
            self.stats.failures[ex.name] += 1
            self.stats.fallbacks += 1
            self._retire(e, f"executable-graph update failed: {ex}")
            return False
        self.stats.updates += 1
        return True

    def _retire(self, e: CacheEntry, reason: str) -> None:
        e.retired = True
        e.reason = reason
        e.graph_exec = None
        self.stats.retirements += 1
        self.log.append({"event": "retire", "key": e.key, "reason": reason})

    def retired(self) -> list[CacheEntry]:
        return [e for e in self.entries.values() if e.retired]


def _addr(a) -> int:
    """Device address of a backend array argument (0 for scalars)."""
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    ai = getattr(a, "__array_interface__", None)
    return ai["data"][0] if ai else 0
