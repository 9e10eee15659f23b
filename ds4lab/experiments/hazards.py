"""Hazard demonstrations: one ds4-today code path re-introduced into a captured stage.

Each demonstration runs the same steps twice from the same state: eagerly (the reference) and
through a :class:`~ds4lab.capture.cache.GraphCache`, then compares every step's tensors bit for bit.
The outcome is either a refused capture (the CUDA error, the retired graph, the eager fallback,
identical results) or a capture that succeeded and replays wrong (the first differing tensor).
What each should do is what the conformance suite measured on the H200 (NOTES.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..capture import stream as S
from ..capture.cache import GraphCache
from .ladder import first_difference, token_id_at
from ..token.model import DecodeModel, TokenOptions


@dataclass(frozen=True)
class Hazard:
    """A ds4-today path, the stage it breaks, and what CUDA does with it."""

    name: str
    what: str
    kind: str  # "token": whole decode tokens; "moe": routed-MoE steps of 2 tokens (MTP verification)
    capture: tuple
    options: dict = field(default_factory=dict)
    warmup: int = 1
    expect: str = ""
    #: What relaxed capture mode does instead, where it differs (it permits "unsafe" calls such as
    #: cudaMalloc: CUDA Runtime API, cudaStreamCaptureModeRelaxed).
    expect_relaxed: str = ""

    def expected(self, mode: str) -> str:
        """The expected outcome under capture ``mode`` (global, thread_local, relaxed)."""
        return self.expect_relaxed if mode == "relaxed" and self.expect_relaxed else self.expect


HAZARDS: dict[str, Hazard] = {h.name: h for h in (
    Hazard("sync-memset", "routed-MoE counts cleared with a synchronous cudaMemset (legacy stream)", "moe", ("moe",),
           dict(counts_clear="sync"), expect="capture succeeds; the memset ran once at capture and is not in the "
           "graph, so replays count on top of stale counts: wrong results"),
    Hazard("host-scalars", "position, KV row, window length, token id passed by value", "token", ("token",),
           dict(scalars="value", counts_clear="async"), expect="capture succeeds; replays reuse the captured "
           "position: the KV row written and the RoPE angle are stale: wrong results"),
    Hazard("legacy-launch", "the shared-expert down projection launched on the legacy stream, bypassing the "
           "accessor", "token", ("shared",), dict(legacy_sites=("sh_down_expand",)),
           expect="capture succeeds; that kernel ran once at capture time, outside the graph: replays skip it"),
    Hazard("alloc-in-capture", "routed-MoE scratch allocated on demand with cudaMalloc, first growth inside the "
           "capture", "moe", ("moe",), dict(scratch="on-demand", counts_clear="async"), warmup=0,
           expect="global and thread-local capture refuse cudaMalloc (cudaErrorStreamCaptureUnsupported): the "
           "graph is retired and the cluster runs eagerly, with identical results",
           expect_relaxed="relaxed capture permits cudaMalloc: the buffer is allocated once, at capture, and the "
           "graph replays with it: captured, exact"),
    Hazard("host-timed-profile", "ds4's MoE profile: events around the stages, cudaEventSynchronize on the last "
           "one and elapsed times read on the host, every call", "moe", ("moe",),
           dict(moe_profile=True, moe_host_timed=True, counts_clear="async"),
           expect="cudaErrorCapturedEvent, the capture is invalidated: retired, eager fallback, identical results"),
    Hazard("device-sync", "cudaDeviceSynchronize inside the captured token body", "token", ("token",),
           dict(sync_in_body=True, scalars="device", counts_clear="async"),
           expect="cudaErrorStreamCaptureUnsupported, invalidated: retired, eager fallback, identical results"),
)}


def _moe_steps(model: DecodeModel, steps: int, seed: int = 11) -> list[dict]:
    """Routed-MoE steps of 2 tokens each (MTP verification) on the first top-k layer."""
    be, cfg = model.be, model.cfg
    layer = min(cfg.n_hash_layers, model.n_layers - 1)
    rng = np.random.default_rng(seed)
    x = be.zeros((2, cfg.embed), np.float32)  # the step's input, always at the same address

    def cluster():  # router (expert selection stays on the device) + routed MoE, 2 tokens
        model.router(layer, x, 2)
        model.routed_moe(layer, x, 2)

    out = []
    for i in range(steps):
        be.copy_h2d(S.current_stream(), x, rng.standard_normal((2, cfg.embed)).astype(np.float32))
        model.run_cluster("moe", layer, 2, None, cluster, inputs=(x,))
        be.synchronize()
        out.append({"moe.counts": be.to_host(model.moe_buf.counts).copy(),
                    "hidden": be.to_host(model.moe_buf.y)[:2].copy()})
    return out


def _token_steps(model: DecodeModel, steps: int, start: int = 1000) -> list[dict]:
    be = model.be
    out = []
    for i in range(steps):
        pos = start + i
        model.token(pos, token_id_at(pos, model.cfg.vocab))
        be.synchronize()
        out.append({"hidden": model.hidden().copy(), "logits": model.output_logits(),
                    **{f"kv_cache[{layer}]": be.to_host(c).copy() for layer, c in enumerate(model.cache)}})
    return out


def demonstrate(name: str, be, cfg, steps: int = 6, mode: str = "thread_local") -> dict:
    """Run hazard ``name`` on ``be``: eager reference vs captured. Returns the outcome as a dict.

    Raises:
        ValueError: unknown hazard name (the message lists the known ones).
    """
    try:
        hz = HAZARDS[name]
    except KeyError:
        raise ValueError(f"unknown hazard {name!r}; choose one of: {', '.join(HAZARDS)}") from None
    opts = TokenOptions(vocab=True, **hz.options)
    was = S.graphs_enabled()
    S.set_graphs_enabled(True)
    try:
        results = []
        for captured in (False, True):
            model = DecodeModel(cfg, be, opts, n_layers=min(cfg.n_layers, cfg.n_hash_layers + 1))
            cache = GraphCache(be, hz.capture, mode=mode, warmup=hz.warmup) if captured else None
            model.executor = cache
            stream = be.new_stream(non_blocking=True)
            with S.stream_override(stream):
                rec = (_moe_steps if hz.kind == "moe" else _token_steps)(model, steps)
            results.append((rec, cache))
            del model
    finally:
        S.set_graphs_enabled(was)
    (ref, _), (got, cache) = results
    diff = first_difference(ref, got)
    st = cache.stats.as_dict()
    reasons = [e.reason for e in cache.retired()]
    outcome = ("refused → eager fallback" if st["retirements"] and diff is None else
               "captured, replays wrong" if diff else "captured, exact")
    return {"hazard": name, "what": hz.what, "capture_mode": mode, "outcome": outcome,
            "errors": ";".join(f"{k}={v}" for k, v in st["failures"].items()) or "none",
            "retired": "; ".join(reasons), "replays": st["replays"], "eager_runs": st["eager_runs"],
            "exact": diff is None, "first_mismatch": diff or "", "expected": hz.expected(mode), "backend": be.name}
