"""The stage ladder across context length (library): long-context decode, stages ``0``, ``2``, ``3``, ``3c``.

At each context (a start position), every stage decodes the same tokens of a model with
``long_context`` on (docs/model.md, "Long context"):

* **exactness** against stage 0 over a span of ``span`` tokens from ``context - 4``: with a
  context that is a multiple of 128 the span holds position ``context - 1`` (both compressors
  emit) and ``context + 3`` (where n_comp of a ratio-4 layer crosses ``m * top_k`` when the
  context is ``4 * m * top_k``: a top-k regime boundary). Every token's hidden state, logits,
  raw windows and compressed caches are compared bit for bit;
* **µs per token** over ``tokens`` tokens from the context (median, IQR; events on the stage's
  stream, a device synchronize after each token as ds4 does), kernel and graph launches per token,
  and the graph cache's counts so far (graphs captured, recaptures, retirements).

Stages: ``0`` eager on the legacy stream; ``2`` shared-expert and routed-MoE clusters captured;
``3`` the whole token captured with the host making the long-context decisions, one graph per
token shape (the graph cache keyed by the host decisions: emit or not per ratio, top-k regime and
plan); ``3c`` the whole token captured once with the decisions made on the device
(``TokenOptions.longctx="device"``), valid at every position.

The model's ``max_context`` is set to the smallest multiple of 128 past the last position
decoded (the caches' prefill rows do not depend on their size; stage 3c's worst-case top-k plan
does). Writes ``context.csv`` (one row per stage and context), ``meta.json`` and
``context.png/.svg/.pdf``. The job is :mod:`ds4lab.jobs.context` (``ds4lab context``).
"""

from __future__ import annotations

import numpy as np

from ..capture.cache import GraphCache
from ..errors import BadInput
from .ladder import STAGES, Stage, StageRun, first_difference, token_id_at
from ..token.model import DecodeModel, TokenOptions

CONTEXT_OUTPUTS = ("context.csv", "context.png", "context.svg", "context.pdf")
DEFAULT_CONTEXTS = (1024, 4096, 16384, 65536)

STAGE_3C = Stage(
    "3c", "one graph", "the whole token captured once; emit, top-k regime and attention length decided on the "
    "device (emit kernels exit off an emit token, worst-case top-k grids, rows past n_comp skipped)",
    capture=("token",),
    options=dict(counts_clear="async", scratch="prealloc", moe_profile=False, scalars="device", longctx="device"),
    fixes=STAGES["3"].fixes)
CONTEXT_STAGES: dict[str, Stage] = {"0": STAGES["0"], "2": STAGES["2"], "3": STAGES["3"], "3c": STAGE_3C}


class ContextInputError(BadInput):
    """A request that cannot run (unknown stage, a context past what the model allows); nothing ran."""


def parse_contexts(text: str) -> list[int]:
    """``"1024,4096"`` → ``[1024, 4096]``. Raises :class:`ContextInputError` naming a bad value."""
    out = []
    for t in (t.strip() for t in str(text).split(",")):
        if not t:
            continue
        try:
            v = int(t)
        except ValueError:
            raise ContextInputError(f"context {t!r} is not an integer") from None
        if v < 4:
            raise ContextInputError(f"context {v} must be at least 4 (the exactness span starts at context - 4)")
        if v in out:
            raise ContextInputError(f"context {v} given more than once in {text!r}")
        out.append(v)
    if not out:
        raise ContextInputError(f"no context in {text!r}")
    return out


def parse_context_stages(text: str) -> list[Stage]:
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    bad = [n for n in names if n not in CONTEXT_STAGES]
    if bad or not names:
        raise ContextInputError(f"unknown stage(s) {', '.join(bad) or repr(text)}; choose from: "
                                f"{', '.join(CONTEXT_STAGES)}")
    return [CONTEXT_STAGES[n] for n in dict.fromkeys(names)]


def stage_run(model: DecodeModel, stage: Stage, base: TokenOptions, mode: str) -> StageRun:
    """A :class:`~ds4lab.experiments.ladder.StageRun` of ``stage`` on ``model``; stage 3's graph cache keyed by
    the long-context host decisions (one graph per token shape: emit or not, top-k regime)."""
    run = StageRun(model, stage, base, mode=mode)
    if stage.name == "3":  # one graph per token shape: the host decisions join the cache key
        run.cache = GraphCache(model.be, stage.capture, mode=mode, key_decisions=True)
    return run


def state_record(run: StageRun, start: int, k: int) -> list[dict]:
    """From the prefilled state, ``k`` tokens from ``start`` with ``run``'s stage; after each: hidden
    state, logits, raw windows, compressor states, and the compressed and indexer rows that a token
    of ``start - 128 .. start + k`` writes (a stale row index lands there; host copies: the whole
    caches of ds4-flash would be gigabytes per token)."""
    be, m = run.be, run.model
    run.activate()
    m.reset_state()
    windows = {}
    for layer, bufs in enumerate(m.lc.layers):
        ratio = m.cfg.compress_ratio(layer)
        if bufs:
            lo = max(0, (start - 128) // ratio)
            windows[layer] = slice(lo, min(m.cfg.comp_capacity(ratio), (start + k) // ratio + 2))
    out = []
    for i in range(k):
        pos = start + i
        run.token(pos, token_id_at(pos, m.cfg.vocab))
        be.synchronize()
        rec = {"hidden": m.hidden().copy(), "logits": None if m.logits is None else m.output_logits().copy()}
        for layer, c in enumerate(m.cache):  # layer by layer: the raw window, then the compressed caches
            rec[f"kv_cache[{layer}]"] = be.to_host(c).copy()
            for name, b in (m.lc.layers[layer] or {}).items():
                rows = windows[layer] if name in ("comp", "index") else slice(None)
                rec[f"kv_cache[{layer}].{name}"] = np.array(be.to_host(b[rows]), copy=True)
        out.append(rec)
    return out


def first_difference_all(ref: list[dict], got: list[dict]) -> str | None:
    """:func:`ds4lab.experiments.ladder.first_difference` over every recorded tensor, long-context caches included."""
    for t, (a, b) in enumerate(zip(ref, got)):
        for n in [n for n in a if n.startswith("kv_cache")] + ["hidden", "logits"]:  # caches first, as the ladder
            x, y = a.get(n), b.get(n)
            if x is None and y is None:
                continue
            if x is None or y is None or x.shape != y.shape or not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
                return f"token {t}: {n}"
    return first_difference(ref, got)


def context_figure(df, meta: dict):
    """µs per token against context (log scale), one line per stage, IQR as a band."""
    import matplotlib.pyplot as plt

    from ..report.plots import COLORS, STYLE, provenance_title

    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(8.0, 4.4))
        for i, (stage, g) in enumerate(df.groupby("stage", sort=False)):
            g = g.sort_values("context")
            col = COLORS[i % len(COLORS)]
            ax.plot(g.context, g.us_median, marker="o", color=col, label=f"stage {stage}")
            ax.fill_between(g.context, g.us_p25, g.us_p75, color=col, alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (start position)")
        ax.set_ylabel("µs per token (median, IQR)")
        ax.set_title(provenance_title(meta, "long-context decode: µs per token by stage"))
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig
