"""Stage ``3cc``'s long-context token (``TokenOptions.longctx="conditional"``): per compressed layer a kernel
(``kernels/graph_cond.cu:cond_set_longctx``) sets conditional handles from the position; the compressors' emit
kernels are an IF body, the indexer a SWITCH with one body per top-k regime. Outside a capture the host takes the same
branches. How and why: ``docs/capture-stages.md``, "Stage 3cc"."""

from __future__ import annotations

import numpy as np

from ..executor.device_graphs import DeviceGraphApi
from ..capture.conditional import conditional_node, in_device_graph
from . import reference as R
from .config import TOPK_MERGE_GROUP

#: The SWITCH's first bodies, in ``cond_set_longctx``'s numbering; the chunked path's bodies follow, one
#: per number of merge launches (``chunked/1``, ``chunked/2``, ...).
SORT_REGIMES = ("sort2k", "sort4k", "sort8k", "sort16k")
#: The SWITCH value that runs no body (n_comp <= top-k: every compressed row attended).
NO_BODY = 0xFFFFFFFF
#: The upper bound of n_comp of each sort regime, as a multiple of top-k (``reference.topk_regime``).
_UPPER = {"sort2k": 2, "sort4k": 4, "sort8k": 8, "sort16k": 16}
#: cond_set_longctx's mask bits: the attention's compressor, the indexer's compressor, the regime.
_BITS = {"comp": 1, "index": 2, "regime": 4}


def _merges(n_comp: int, top_k: int) -> int:
    """Merge launches of the chunked top-k for ``n_comp`` rows (``reference.topk_plan``)."""
    return sum(st.kernel == "indexer_topk_merge" for st in R.topk_plan(n_comp, top_k)[0])


def regime_value(n_comp: int, top_k: int) -> int:
    """The SWITCH value ``cond_set_longctx`` sets for ``n_comp`` rows: the index of the body (a sort regime of
    :data:`SORT_REGIMES`, then the chunked path by its number of merge launches), or :data:`NO_BODY` while ``n_comp
    <= top_k``."""
    reg = R.topk_regime(n_comp, top_k)
    if reg == "all":
        return NO_BODY
    if reg != "chunked":
        return SORT_REGIMES.index(reg)
    return len(SORT_REGIMES) + _merges(n_comp, top_k) - 1


def regime_plans(cfg, ratio: int) -> list[tuple[str, int]]:
    """``[(body, n_plan)]``: the SWITCH bodies of a ratio-``ratio`` layer (numbered as :func:`regime_value`), each
    planned for the largest n_comp it serves within the compressed capacity; unreachable bodies left out; empty for a
    ratio other than 4."""
    if ratio != 4:
        return []
    k, cap = cfg.index_top_k, cfg.comp_capacity(ratio)
    out = []
    for reg in SORT_REGIMES:
        n_plan = min(_UPPER[reg] * k, cap)
        if R.topk_regime(n_plan, k) != reg:
            return out  # the capacity ends below this regime
        out.append((reg, n_plan))
    chunk, group = 8 * k, TOPK_MERGE_GROUP
    lower, sets = 16 * k, group  # body j serves up to group ** (j + 1) chunks
    while lower < cap:
        n_plan = min(chunk * sets, cap)
        out.append((f"chunked/{_merges(n_plan, k)}", n_plan))
        lower, sets = chunk * sets, sets * group
    return out


class LongctxBranches:
    """The conditional nodes of ``model``'s compressed layers (``longctx="conditional"``); outside a stream capture
    every branch is taken on the host."""

    def __init__(self, model) -> None:
        self.m, self.L, self.be = model, model.L, model.be
        #: the stream whose captures fill the conditional nodes' bodies (created here: never in a capture)
        self.body_stream = self.be.new_stream(non_blocking=True)
        #: the current capture's handles of each compressed layer: ``{layer: {"comp", "index", "regime"}}``
        self.handles: dict[int, dict] = {}
        self.prepare(programmatic=model.opts.pdl)

    def prepare(self, programmatic: bool = False) -> None:
        """Load every kernel now (both builds when ``programmatic``): the condition-setting kernel and every body's,
        which the eager warm-up never reaches (a module loaded while a stream captures invalidates the capture)."""
        if isinstance(self.be, DeviceGraphApi):
            self.be.prepare_device_kernels(None, programmatic=programmatic)

    @property
    def in_graph(self) -> bool:
        """Whether the launches now go into a capture that can hold conditional nodes."""
        return in_device_graph(self.L)

    def start_layer(self, layer: int, ratio: int, ts) -> None:
        """Before a compressed layer's compressors: in a capture, create the layer's handles on the capture's graph
        (``cudaGraphCondAssignDefault``, default 0) and launch ``cond_set_longctx``, which sets them from the
        position at every replay. Eagerly: nothing (the host decides)."""
        self.handles.pop(layer, None)
        if not self.in_graph:
            return
        be, cfg = self.be, self.m.cfg
        graph, _ = be.capture_dependencies(self.L.stream())
        # every handle gets its node (RT cudaGraphConditionalHandleCreate: a handle without one may make
        # the instantiation fail): no regime handle where no SWITCH body is reachable
        names = (("comp", "index", "regime") if regime_plans(cfg, ratio) else ("comp", "index")) if ratio == 4 \
            else ("comp",)
        hs = {n: be.conditional_handle_create(graph, 0, True) for n in names}
        self.handles[layer] = hs
        mask = sum(_BITS[n] for n in names)
        k = cfg.index_top_k
        zero = np.uint64(0)
        args = (hs["comp"].arg, hs["index"].arg if "index" in hs else zero,
                hs["regime"].arg if "regime" in hs else zero, np.int32(mask), np.int32(ratio), np.int32(k),
                np.int32(TOPK_MERGE_GROUP))

        def ref():  # what the kernel does at each replay (the sim's handles)
            pos = ts.resolve()[0]
            emit = int(R.is_emit(pos, ratio))
            hs["comp"].set(emit)
            if "index" in hs:
                hs["index"].set(emit)
            if "regime" in hs:
                hs["regime"].set(regime_value(R.comp_count(pos, ratio), k))

        ref.always = True  # also in timing-only mode: the modeled replay takes the position's branches
        with self.L.cluster("compressor"):
            self.L.kernel("cond_longctx", "cond_set_longctx", (1,), (32,), args + ts.args(), ref, nbytes=16)

    def emit(self, layer: int, lane: str, body, host_emits: bool) -> None:
        """A compressor's emit kernels (``body``): an IF node on the layer's ``lane`` handle (``"comp"``, ``"index"``)
        in a capture, else run when the host says the token emits."""
        if self.in_graph:
            conditional_node(self.L, self.body_stream, self.handles[layer][lane], "if", [body])
        elif host_emits:
            body()

    def indexer(self, layer: int, ratio: int, ts) -> bool:
        """The indexer of a compressed layer: a SWITCH node with one body per reachable top-k regime in a capture, else
        the body of this position's regime (none while every row is attended). Returns whether a selection can be in
        use (attention then picks it on the device)."""
        plans = regime_plans(self.m.cfg, ratio)
        if not plans:
            return False
        m = self.m
        if self.in_graph:
            bodies = [lambda n_plan=n_plan: m._indexer(layer, ratio, n_plan, ts) for _, n_plan in plans]
            conditional_node(self.L, self.body_stream, self.handles[layer]["regime"], "switch", bodies)
        else:
            v = regime_value(R.comp_count(ts.pos, ratio), m.cfg.index_top_k)
            if v != NO_BODY:
                m._indexer(layer, ratio, plans[v][1], ts)
        return True


__all__ = ["LongctxBranches", "NO_BODY", "SORT_REGIMES", "regime_plans", "regime_value"]
