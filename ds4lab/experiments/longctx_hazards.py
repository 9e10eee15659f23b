"""Long-context capture hazards: a position-dependent host decision frozen in a captured graph.

Each demonstration decodes the same tokens of a long-context model three ways from the same
prefilled state and compares every token's tensors bit for bit (hidden state, logits, raw windows,
compressor states, the compressed and indexer rows the span writes):

1. eagerly, host decisions re-made every token (the reference, ds4 today without graphs);
2. the whole token captured (stage 3: device scalars) with the hazard: a decision the graph
   guard does not re-ask, the compressed-row index passed by value, or the top-k scratch growing
   inside the capture;
3. stage 3c (``TokenOptions.longctx="device"``): one graph, decisions on the device.

Hazards (``LONGCTX_HAZARDS``):

* ``compressor-emit``: the emit decision frozen: a graph captured on a non-emit token is replayed
  across an emit (the pool, rotate-store and shift never run): wrong from the emit on.
* ``indexer-regime``: the top-k regime frozen: graphs kept one per emit answer (the cache keyed
  by the remaining decisions), replayed across the n_comp = top-k threshold, where ds4 starts
  selecting: the stale graph attends every row instead of the selected ones.
* ``comp-row-by-value``: the compressed row index (and slot) passed to the compressor's kernels
  by value: an emit graph replayed at a later emit rewrites the captured row.
* ``topk-alloc``: the chunked top-k's scratch allocated on demand (ds4's grow-on-demand
  ``cudaMalloc``), first growth inside the capture: refused in global and thread-local capture
  (``cudaErrorStreamCaptureUnsupported``, retired, eager fallback, exact); relaxed capture
  permits it (captured, exact: the buffer is kept, and a later growth is a new buffer generation,
  so a graph holding the old one is never replayed).

The guard that re-asks every decision (``DecodeModel.longctx_decisions``) turns the first two into
recaptures (exact); stage 3c is exact for all four with one graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..token import ops
from ..capture import stream as S
from ..capture.cache import GraphCache
from .context import first_difference_all, state_record
from .ladder import STAGES, StageRun
from ..token.model import DecodeModel, TokenOptions


class _HazardModel(DecodeModel):
    """A long-context model with one hazard re-introduced: ``forget`` (decision-name prefixes the
    guard is not told about) or ``row_by_value`` (the compressor's kernels get the position by
    value, whatever ``scalars`` says)."""

    forget: tuple = ()
    row_by_value: bool = False

    def longctx_decisions(self, pos: int, by_value: bool = True) -> tuple:
        d = super().longctx_decisions(pos, by_value)
        return tuple(x for x in d if not x[0].startswith(self.forget)) if self.forget else d

    def _compressor(self, layer: int, ratio: int, ts, lane: str) -> None:
        if self.row_by_value and ts.buf is not None:
            ts = ops.TokenScalars(ts.pos, ts.kv_row, ts.n_valid, ts.token_id, None)
        super()._compressor(layer, ratio, ts, lane)


@dataclass(frozen=True)
class LongctxHazard:
    """One long-context hazard: what it re-introduces, how it is captured, and the expected outcome."""

    name: str
    what: str
    forget: tuple = ()
    row_by_value: bool = False
    key_decisions: bool = False
    options: dict = None
    warmup: int = 1
    expect: str = ""
    expect_relaxed: str = ""

    def expected(self, mode: str) -> str:
        return self.expect_relaxed if mode == "relaxed" and self.expect_relaxed else self.expect

    def span(self, cfg) -> tuple[int, int]:
        """(first position, tokens) of the demonstration for ``cfg``."""
        k = cfg.index_top_k
        if self.name == "indexer-regime":  # n_comp crosses top-k (all rows → selection) at 4k + 3
            return 4 * k - 4, 10
        if self.name == "topk-alloc":  # the chunked path (n_comp > 16 k) from the first token
            return 4 * (16 * k + 8), 6
        # n_comp in the middle of a regime, two ratio-4 emits, and off a multiple of the score
        # kernel's rows per block (32): at 3k the emit would also grow the score grid, a decision
        # the guard still asks, and the recapture would hide the forgotten emit
        n = 3 * k + 4
        return 4 * n, 8


LONGCTX_HAZARDS: dict[str, LongctxHazard] = {h.name: h for h in (
    LongctxHazard("compressor-emit", "the compressors' emit decision ((pos + 1) % ratio == 0) not re-asked before "
                  "replay", forget=("compressor.emit",),
                  expect="captured on a non-emit token, replayed across an emit: the emit launches are not in the "
                  "graph (no row emitted, no shift): wrong from the emit on"),
    LongctxHazard("indexer-regime", "the indexer's top-k regime not re-asked before replay (graphs kept one per "
                  "emit answer)", forget=("indexer.",), key_decisions=True,
                  expect="the graph captured while n_comp <= top-k (every row attended, no indexer) replayed past "
                  "it: the indexer never runs, attention over every row: wrong (hidden state)"),
    LongctxHazard("comp-row-by-value", "the compressed row index and state slot passed to the compressor's kernels "
                  "by value", row_by_value=True, key_decisions=True,
                  expect="a graph replayed at a later position stores into the captured position's state slot and, "
                  "on an emit, writes the captured row: wrong (the compressor state first)"),
    LongctxHazard("topk-alloc", "the chunked top-k's scratch allocated on demand with cudaMalloc, first growth "
                  "inside the capture", options=dict(scratch="on-demand"), warmup=0,
                  expect="global and thread-local capture refuse cudaMalloc (cudaErrorStreamCaptureUnsupported): the "
                  "graph is retired and the token runs eagerly, with identical results",
                  expect_relaxed="relaxed capture permits cudaMalloc: the scratch is allocated once, at capture, and "
                  "the graph replays with it: captured, exact"),
)}


def _opts(**kw) -> TokenOptions:
    base = dict(STAGES["3"].options)
    base.update(kw)
    return TokenOptions(vocab=True, **base)


def demonstrate_longctx(name: str, be, cfg, mode: str = "thread_local") -> dict:
    """Run long-context hazard ``name`` on ``be`` with ``cfg`` (``long_context`` is switched on).

    Returns the outcome (as :func:`ds4lab.experiments.hazards.demonstrate`, plus ``exact_3c`` and
    ``graphs_3c``: stage 3c over the same tokens). Raises ValueError for an unknown name.
    """
    try:
        hz = LONGCTX_HAZARDS[name]
    except KeyError:
        raise ValueError(f"unknown long-context hazard {name!r}; choose one of: {', '.join(LONGCTX_HAZARDS)}") from None
    start, steps = hz.span(cfg)
    need = -(-(start + steps + 1) // 128) * 128
    cfg = cfg.replace(long_context=True, max_context=max(need, 128 * 4))
    opts = _opts(**(hz.options or {}))
    was = S.graphs_enabled()
    S.set_graphs_enabled(True)
    try:
        def record(model_cls, o, cache_kw):
            m = model_cls(cfg, be, o)
            if model_cls is _HazardModel:
                m.forget, m.row_by_value = hz.forget, hz.row_by_value
            run = StageRun(m, STAGES["3"], o, mode=mode)
            run.opts = o
            run.cache = GraphCache(be, ("token",), mode=mode, **cache_kw) if cache_kw is not None else None
            rec = state_record(run, start, steps)
            return rec, run.cache

        ref, _ = record(DecodeModel, opts, None)
        got, cache = record(_HazardModel, opts, dict(warmup=hz.warmup, key_decisions=hz.key_decisions))
        got3c, cache3c = record(DecodeModel, _opts(longctx="device"), dict())
    finally:
        S.set_graphs_enabled(was)
    diff = first_difference_all(ref, got)
    diff3c = first_difference_all(ref, got3c)
    st, st3c = cache.stats.as_dict(), cache3c.stats.as_dict()
    outcome = ("refused → eager fallback" if st["failures"] and diff is None else
               "captured, replays wrong" if diff else "captured, exact")
    return {"hazard": name, "what": hz.what, "capture_mode": mode, "positions": f"{start}..{start + steps - 1}",
            "outcome": outcome, "errors": ";".join(f"{k}={v}" for k, v in st["failures"].items()) or "none",
            "retired": "; ".join(e.reason for e in cache.retired()), "captures": st["captures"],
            "replays": st["replays"], "eager_runs": st["eager_runs"], "exact": diff is None,
            "first_mismatch": diff or "", "expected": hz.expected(mode), "exact_3c": diff3c is None,
            "graphs_3c": st3c["captures"], "backend": be.name}

