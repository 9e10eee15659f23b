"""The routed-MoE workloads (:class:`MoeWorkbench`): 1, 2, 3 tokens and batches (16..512), routings ``uniform``,
``zipf``, ``hash`` (the model's own hash layers) and ``worst``; except for ``hash``, the chosen ids and weights are
written into the router's output buffers on the device after the router ran, so sort, tiles and expert load really
change. :func:`iter_profile` / :func:`profile` run steps with a :class:`~ds4lab.moeprof.MoeProfiler` attached."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import numpy as np

from ..capture import stream as S
from ..capture.cache import CapturePolicy, GraphCache
from ..token.model import DecodeModel, TokenOptions
from .modes import auto_regime
from ..timing import gc_paused
from .profiler import MoeProfiler
from .rows import REGIMES, ROW_COLUMNS, is_modeled

ROUTINGS = ("uniform", "zipf", "hash", "worst")
#: Zipf exponent of the skewed expert popularity (expert of rank r chosen with weight r^-s).
ZIPF_S = 1.2



class MoeWorkbench:
    """A model, its inputs and the routing patterns for routed-MoE steps (see the module docstring).

    ``be``: ``cupy`` or ``sim`` (``numpy`` has no clock); ``cfg``'s ``max_tokens`` is raised to ``max_tokens``;
    ``stream``: ``"non-blocking"`` (default, needed for capture) or ``"legacy"``; ``counts_clear`` default ``"async"``;
    ``vocab``: build the vocabulary projection; ``seed``: routing and input seed. Raises ValueError: a backend without
    timing (``numpy``), or an unknown ``stream``."""

    def __init__(self, be, cfg, *, max_tokens: int = 512, n_layers: int | None = None, stream: str = "non-blocking",
                 counts_clear: str = "async", vocab: bool = False, seed: int = 0) -> None:
        if not (be.measures_time or is_modeled(be)):
            raise ValueError(f"the {be.name} backend makes no timing claims: profile on cupy or sim")
        if stream not in ("non-blocking", "legacy"):
            raise ValueError(f"stream={stream!r}: choose 'non-blocking' or 'legacy'")
        self.be = be
        self.cfg = cfg.replace(max_tokens=max(max_tokens, 1)) if cfg.max_tokens < max_tokens else cfg
        self.model = DecodeModel(self.cfg, be, TokenOptions(counts_clear=counts_clear, scratch="prealloc", vocab=vocab),
                                 n_layers=n_layers)
        self.stream = be.new_stream(non_blocking=True) if stream == "non-blocking" else S.LEGACY_STREAM
        self.legacy = S.LEGACY_STREAM
        c = self.cfg
        self.x = be.empty((c.max_tokens, c.embed), np.float32)
        be.fill_f32(self.x, "moeprof.x", 1.0, 0.0, c.seed + seed)
        self.tok = be.zeros((c.max_tokens,), np.int32)
        self.rng = np.random.default_rng(seed)
        N, k = c.n_experts, c.n_used
        ranks = self.rng.permutation(N)
        p = (ranks + 1.0) ** -ZIPF_S
        self.zipf_p = p / p.sum()
        self.worst_experts = np.sort(self.rng.choice(N, k, replace=False)).astype(np.int32)
        be.synchronize()

    # ------------------------------------------------------------------ routing
    def layers_for(self, routing: str, layers=None) -> list[int]:
        """The layers a routing pattern runs on: ``hash`` only on the model's hash-routed layers."""
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; choose one of: {', '.join(ROUTINGS)}")
        ls = list(range(self.model.n_layers)) if layers is None else list(layers)
        if routing == "hash":
            ls = [l for l in ls if self.cfg.is_hash_layer(l)]
            if not ls:
                raise ValueError(f"{self.cfg.name}: no hash-routed layer among {layers} "
                                 f"(the first {self.cfg.n_hash_layers} layers are hash-routed)")
        return ls

    def pattern(self, routing: str, T: int) -> tuple[np.ndarray, np.ndarray]:
        """Host expert ids ``[T, k]`` (int32, distinct per token) and weights ``[T, k]`` (float32, summing to 1 per
        token) for ``uniform``, ``zipf`` or ``worst``."""
        N, k = self.cfg.n_experts, self.cfg.n_used
        if routing == "worst":
            ids = np.broadcast_to(self.worst_experts, (T, k)).copy()
        elif routing in ("uniform", "zipf"):
            logp = np.zeros(N) if routing == "uniform" else np.log(self.zipf_p)
            keys = logp[None, :] + self.rng.gumbel(size=(T, N))  # Gumbel top-k: k draws without replacement
            ids = np.argpartition(-keys, k - 1, axis=1)[:, :k].astype(np.int32)
        else:
            raise ValueError(f"routing {routing!r} has no injected pattern")
        w = self.rng.random((T, k)) + 0.1
        return ids.astype(np.int32), (w / w.sum(axis=1, keepdims=True)).astype(np.float32)

    def prepare(self, layer: int, T: int, routing: str) -> None:
        """Before the MoE stages: new token ids, the router (outside the timed stages), and for the non-hash patterns
        the chosen ids and weights written over the router's outputs on the device."""
        m = self.model
        L = m.L
        with L.cluster("router"):
            L.copy_h2d("profile.token_ids", self.tok[:T], self.rng.integers(0, self.cfg.vocab, T, dtype=np.int32))
        m.router(layer, self.x, T, token_ids=self.tok)
        if routing != "hash":
            ids, wts = self.pattern(routing, T)
            b = m.moe_buf
            with L.cluster("router"):
                L.copy_h2d("profile.route_ids", b.ids[:T], ids)
                L.copy_h2d("profile.route_wts", b.wts[:T], wts)

    def moe_call(self, layer: int, T: int) -> None:
        """One routed-MoE call through the model's cluster runner (eager, or the executor's graph)."""
        m = self.model
        m.run_cluster("moe", layer, T, None, lambda: m.routed_moe(layer, self.x, T), inputs=(self.x,))

    def step(self, prof: MoeProfiler | None, token: int, T: int, routing: str, layers: list[int],
             brackets: list | None = None) -> list[dict]:
        """One step: for each layer, prepare then the MoE call. Returns the profiler's rows (read after the step).
        ``brackets``: a list to append ``(e0, e1)`` events recorded around each MoE call."""
        be = self.be
        if prof is not None:
            prof.begin_step(token)
        for layer in layers:
            self.prepare(layer, T, routing)
            if brackets is not None:
                e0, e1 = be.new_event(), be.new_event()
                be.event_record(self.model.L.stream(), e0)
            self.moe_call(layer, T)
            if brackets is not None:
                be.event_record(self.model.L.stream(), e1)
                brackets.append((e0, e1))
        return prof.end_step() if prof is not None else []

    @contextlib.contextmanager
    def session(self, executor=None, stream=None) -> Iterator[None]:
        """``DS4_CUDA_GRAPHS`` on, the workbench's stream as the accessor's override, ``executor`` installed."""
        m = self.model
        prev_exec, m.executor = m.executor, executor
        try:
            with S.graphs_enabled(), S.stream_override(self.stream if stream is None else stream):
                yield
        finally:
            m.executor = prev_exec

    # ------------------------------------------------------------------ routing check
    def expert_load(self, layer: int, T: int, routing: str) -> dict:
        """Run one eager MoE call with ``routing`` and report the work it routed: experts hit, the largest expert load,
        the tiles built (T > 1) and the pairs. Synchronizes (not for timing)."""
        m, be = self.model, self.be
        with self.session():
            self.prepare(layer, T, routing)
            m.routed_moe(layer, self.x, T)
            be.synchronize()
            ids = np.asarray(be.to_host(m.moe_buf.ids))[:T].reshape(-1)
            out = {"routing": routing, "tokens": T, "pairs": T * self.cfg.n_used}
            if np.isnan(np.asarray(ids, dtype=np.float64)).any():
                return {**out, "experts_hit": math.nan, "max_load": math.nan, "n_tiles": math.nan}
            counts = np.bincount(ids.astype(np.int64), minlength=self.cfg.n_experts)
            out.update(experts_hit=int((counts > 0).sum()), max_load=int(counts.max()))
            if T > 1:
                dev_counts = np.asarray(be.to_host(m.moe_buf.counts)).astype(np.int64)
                out["counts_match"] = bool(np.array_equal(dev_counts, counts))
                out["n_tiles"] = int(np.asarray(be.to_host(m.moe_buf.n_tiles))[0])
            else:
                out["n_tiles"] = 0
        return out


# ----------------------------------------------------------------------------- runs
def iter_profile(wb: MoeWorkbench, mode: str, tokens: int, routing: str, steps: int, *, layers=None,
                 regime: str = "auto", capture_mode: str = "thread_local", warmup: int | None = None,
                 fallback: bool | str = False, guard: bool = True, read_every: int | None = None,
                 raw: bool = False) -> Iterator[list[dict]]:
    """Profile ``steps`` steps of ``tokens`` tokens with ``routing``; yields each step's rows (:data:`ROW_COLUMNS`,
    ``ms``). ``regime``: ``eager``, ``replayed`` or ``auto`` (the mode's ``auto_regime``); ``warmup`` steps are not
    reported (default 1 eager, 2 replayed). Afterwards ``wb.last_profiler`` and ``wb.last_cache`` hold the profiler and
    the graph cache (None eagerly). Raises ValueError: an unknown regime, routing or mode, ``tokens`` outside
    ``1..max_tokens``, a bad fallback."""
    if regime == "auto":
        regime = auto_regime(mode)
    if regime not in REGIMES:
        raise ValueError(f"regime={regime!r}: choose eager, replayed or auto")
    if not 1 <= tokens <= wb.cfg.max_tokens:
        raise ValueError(f"tokens={tokens} outside 1..{wb.cfg.max_tokens} (the workbench's max_tokens)")
    ls = wb.layers_for(routing, layers)
    warm = (2 if regime == "replayed" else 1) if warmup is None else warmup
    cache = None
    if regime == "replayed":
        cache = GraphCache(wb.be, CapturePolicy(("moe",), mode=capture_mode, warmup=1))
    prof = MoeProfiler(wb.model, mode, routing=routing, guard=guard, fallback=fallback, read_every=read_every,
                       raw=raw)
    with wb.session(cache), prof.attached(calls_per_read=len(ls)), gc_paused():
        for i in range(warm + steps):
            rows = wb.step(prof, i - warm, tokens, routing, ls)
            if i >= warm:
                yield rows
        rest = prof.read()
        if rest:
            yield rest
    wb.last_profiler, wb.last_cache = prof, cache


def profile(wb: MoeWorkbench, mode: str, tokens: int, routing: str = "uniform", steps: int = 10, **kw):
    """All rows of :func:`iter_profile` as a DataFrame (columns :data:`ROW_COLUMNS`)."""
    import pandas as pd

    rows = [r for step in iter_profile(wb, mode, tokens, routing, steps, **kw) for r in step]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))
