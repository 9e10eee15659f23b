"""The launch layer (:class:`Launcher`): the one place ds4lab issues device work. Each launch takes the accessor's
stream (:func:`ds4lab.capture.stream.current_stream`; two ds4-today hazard paths bypass it), is counted in the
:class:`Census`, wrapped in an NVTX range when annotation is on, and handed to the backend."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator, NamedTuple

from ..executor.base import ModeledTime
from .annotate import make_annotator
from .stream import LEGACY_STREAM, current_stream

#: Launch-site kinds, as the seed counts them (kernels, memsets, cuBLAS GEMMs, event records),
#: plus host-to-device copies of per-token scalars, graph launches (replays) and kernel-node
#: parameter sets before a replay (``cudaGraphExecKernelNodeSetParams``).
KINDS = ("kernel", "memset", "gemm", "event", "memcpy", "graph", "node_update")


class LaunchRecord(NamedTuple):
    """One traced kernel launch: where it came from and everything needed to issue it again."""

    cluster: str
    layer: int
    site: str
    kernel: str
    grid: tuple
    block: tuple
    args: tuple
    shared: int
    nbytes: int
    #: the NumPy reference of this launch (what the ``numpy`` and ``sim`` backends compute)
    ref: Any = None


class Census:
    """Counts of launches by (cluster, kind, site), ``kind`` one of :data:`KINDS`, ``site`` the launch site
    (``"q_a"``, ``"moe.counts"``); tokens counted by :meth:`token_done` for per-token figures."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.tokens = 0

    def reset(self) -> None:
        self.counts.clear()
        self.tokens = 0

    def token_done(self) -> None:
        self.tokens += 1

    def total(self, kind: str | None = None) -> int:
        """Launches counted so far (of one ``kind`` when given)."""
        return sum(n for (c, k, s), n in self.counts.items() if kind is None or k == kind)

    def frame(self, per_token: bool = True):
        """A DataFrame: one row per (cluster, kind, site) with ``launches`` and ``sites``; ``per_token`` divides by the
        tokens counted (must be > 0)."""
        import pandas as pd

        rows = [{"cluster": c, "kind": k, "site": s, "launches": n} for (c, k, s), n in self.counts.items()]
        df = pd.DataFrame(rows, columns=["cluster", "kind", "site", "launches"])
        if per_token and self.tokens:
            df["launches"] = df["launches"] / self.tokens
        return df

    def by_kind(self, per_token: bool = True):
        """Launches and distinct launch sites per kind (the seed's 156 / 3 / 9 / 7 view)."""
        df = self.frame(per_token)
        g = df.groupby("kind").agg(launches=("launches", "sum"), sites=("site", "nunique"))
        return g.reindex(list(KINDS), fill_value=0).reset_index()

    def by_cluster(self, per_token: bool = True):
        """Launches per cluster and kind (columns: kinds)."""
        df = self.frame(per_token)
        return df.pivot_table(index="cluster", columns="kind", values="launches",
                              aggfunc="sum", fill_value=0)


class Launcher:
    """Routes every launch through the stream accessor, the census and NVTX, to a backend.

    ``nvtx``: NVTX ranges on (chosen once). ``routed=False``: everything on the legacy stream, bypassing the accessor
    (the unrouted path of the stage-0 bit-identity test)."""

    def __init__(self, backend, *, nvtx: bool = False, routed: bool = True) -> None:
        self.backend = backend
        # the sim prices ds4lab's own host work around graph launches and node updates; a GPU spends it
        self._host_work = backend.model_host_work if isinstance(backend, ModeledTime) else None
        self.census = Census()
        self.annotator = make_annotator(nvtx)
        self.routed = routed
        self.cluster_name = "token"
        self.layer = -1
        #: When a list, every kernel launch is appended as a :class:`LaunchRecord` (analysis
        #: tools replay them one by one to time each op; off on the hot path).
        self.trace: list | None = None
        #: The census counts what reaches the device: launches issued while a stream captures
        #: go to ``captured`` instead (they run only as graph nodes). Set by :meth:`capturing_launches`.
        self._capturing = False
        self.captured: Counter = Counter()
        #: While :meth:`planning`, launches are recorded and not issued.
        self._planning = False
        #: Sites launched on the legacy stream regardless of the accessor (hazard demos).
        self.legacy_sites: frozenset = frozenset()
        #: Kernels issued while a stream captures go through ``backend.launch_programmatic``
        #: (programmatic dependent launch: stages 3p, 3cp, 3ccp); set by the model from its options.
        self.programmatic = False
        #: Op-owned scratch buffers (split partials, tickets), by key; see :meth:`scratch`.
        self._scratch: dict = {}

    # ------------------------------------------------------------------ scratch
    def scratch(self, key, shape, dtype) -> Any:
        """The scratch buffer ``key``: allocated zeroed on the first call, the same buffer (fixed address, so captured
        graphs stay valid) on every later one. Raises ValueError when ``key`` exists with another shape or dtype."""
        buf = self._scratch.get(key)
        if buf is None:
            buf = self.backend.zeros(shape, dtype)
            self._scratch[key] = buf
        elif tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            raise ValueError(f"scratch {key!r}: asked for {tuple(shape)} {dtype}, have {tuple(buf.shape)} {buf.dtype}")
        return buf

    @contextlib.contextmanager
    def recording(self) -> Iterator[list]:
        """Record every kernel launch of the block as a :class:`LaunchRecord` into the list it yields; nested
        recordings each get their own block's launches, and the previous recorder is restored on exit."""
        prev, self.trace = self.trace, []
        rec = self.trace
        try:
            yield rec
        finally:
            if prev is not None:
                prev.extend(rec)
            self.trace = prev

    @property
    def capturing(self) -> bool:
        """Whether the launches now issued go into a stream capture (:meth:`capturing_launches`)."""
        return self._capturing

    def capturing_launches(self) -> contextlib.AbstractContextManager:
        """Count the block's launches as captured (``captured``, not the census): a stream captures them into a graph,
        they reach the device only when it replays."""
        return self._set(_capturing=True)

    def planning(self) -> contextlib.AbstractContextManager:
        """Record the block's launches as :class:`LaunchRecord` objects, into the list it yields, without issuing any
        (the launch list of a graph whose kernel nodes are set before its replay); a non-kernel operation is recorded
        under its kind's name (``"memset"``, ``"memcpy"``, ``"event"``), so it never matches a kernel-only graph."""
        return self._set(trace=[], _planning=True)

    def count_node_update(self, site: str) -> None:
        """Count one kernel-node parameter set before a replay (census kind ``node_update``)."""
        self.census.counts[(self.cluster_name, "node_update", site)] += 1

    def annotating(self, annotator) -> contextlib.AbstractContextManager:
        """Send every NVTX range of the block to ``annotator`` (``push``, ``pop``); the previous one is back on exit."""
        return self._set(annotator=annotator)

    @contextlib.contextmanager
    def _set(self, **values) -> Iterator[Any]:
        """Set attributes for the block (yielding the first value), the previous ones back on exit."""
        prev = {k: getattr(self, k) for k in values}
        self.__dict__.update(values)
        try:
            yield next(iter(values.values()))
        finally:
            self.__dict__.update(prev)

    # ------------------------------------------------------------------ stream choice
    def stream(self) -> Any:
        """The stream the next routed launch goes to (the accessor's answer, or legacy when unrouted)."""
        return current_stream() if self.routed else LEGACY_STREAM

    # ------------------------------------------------------------------ scopes
    @contextlib.contextmanager
    def cluster(self, name: str, layer: int | None = None) -> Iterator[None]:
        """Scope launches to cluster ``name`` (census key, NVTX category), payload = layer."""
        prev, self.cluster_name = self.cluster_name, name
        try:
            with self.range(name, name, self.layer if layer is None else layer):
                yield
        finally:
            self.cluster_name = prev

    @contextlib.contextmanager
    def range(self, message: str, category: str, payload: int | None = None) -> Iterator[None]:
        """A plain NVTX range (token, layer) that is not a census cluster."""
        ann = self.annotator
        ann.push(message, category, payload)
        try:
            yield
        finally:
            ann.pop()

    # ------------------------------------------------------------------ launch sites
    def kernel(self, site: str, name: str, grid: tuple, block: tuple, args: tuple,
               ref: Callable[[], None], *, nbytes: int = 0, shared: int = 0, legacy: bool = False) -> None:
        """Launch kernel ``name`` from launch site ``site``: ``args`` (backend arrays and NumPy scalars) in parameter
        order; ``ref`` computes the same result with the NumPy reference (the ``numpy`` backend calls it); ``legacy``:
        the hazard path on the legacy stream, bypassing the accessor."""
        cluster = self.cluster_name
        if self.trace is not None:
            self.trace.append(LaunchRecord(cluster, self.layer, site, name, grid, block, args, shared, nbytes, ref))
            if self._planning:
                return
        (self.captured if self._capturing else self.census.counts)[(cluster, "kernel", site)] += 1
        # The accessor unless this launch is pinned to the legacy stream (hazard paths, unrouted).
        if legacy or not self.routed or (self.legacy_sites and site in self.legacy_sites):
            stream = LEGACY_STREAM
        else:
            stream = current_stream()
        launch = self.backend.launch_programmatic if self.programmatic and self._capturing else self.backend.launch
        ann = self.annotator
        ann.push(site, cluster, self.layer)
        try:
            launch(stream, name, grid, block, args, shared, ref, nbytes)
        finally:
            ann.pop()

    def memset(self, site: str, buf: Any, value: int, *, sync: bool = False) -> None:
        """Fill ``buf`` with byte ``value``: ``cudaMemsetAsync`` on the accessor's stream, or with ``sync`` (ds4 today)
        a synchronous ``cudaMemset`` on the legacy stream."""
        if not self.issues("memset", site):
            return
        with self._op(site):
            if sync:
                self.backend.memset_sync(buf, value)
            else:
                self.backend.memset_async(self.stream(), buf, value)

    def copy_h2d(self, site: str, dst: Any, src) -> None:
        """Copy host array ``src`` into device buffer ``dst`` on the accessor's stream."""
        if not self.issues("memcpy", site):
            return
        with self._op(site):
            self.backend.copy_h2d(self.stream(), dst, src)

    def event_record(self, site: str, event: Any) -> None:
        """Record ``event`` on the accessor's stream, or on the legacy stream for a site in :attr:`legacy_sites` (ds4
        as shipped: ``cudaEventRecord(ev, 0)``)."""
        if not self.issues("event", site):
            return
        legacy = self.legacy_sites and site in self.legacy_sites
        self.backend.event_record(LEGACY_STREAM if legacy else self.stream(), event)

    def graph_launch(self, site: str, graph_exec: Any) -> None:
        """Replay an executable graph on the accessor's stream (``cudaGraphLaunch``)."""
        self.census.counts[(self.cluster_name, "graph", site)] += 1
        with self._op(site):
            self.model_host_work("graph_call")
            self.backend.graph_launch(graph_exec, self.stream())

    def model_host_work(self, kind: str) -> None:
        """On a modeled backend (the sim), price ds4lab's own host work of ``kind`` around a runtime call
        (:meth:`ds4lab.executor.base.ModeledTime.model_host_work`); a GPU spends it for real."""
        if self._host_work is not None:
            self._host_work(kind)

    def issues(self, kind: str, site: str) -> bool:
        """Whether to issue a non-kernel operation of ``kind`` (``memset``, ``collective``, ...): False while planning
        (recorded instead); else counted (census, or ``captured`` in a capture)."""
        if self._planning:
            self.trace.append(LaunchRecord(self.cluster_name, self.layer, site, kind, (), (), (), 0, 0))
            return False
        (self.captured if self._capturing else self.census.counts)[(self.cluster_name, kind, site)] += 1
        return True

    def _op(self, site: str) -> contextlib.AbstractContextManager:
        return self.range(site, self.cluster_name, self.layer)
