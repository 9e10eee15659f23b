"""The stages of a capture plan: what each captures, on which stream, in which mode, and which hazard fixes it needs.
``0`` … ``3u`` are ds4's staged plan (``shared/context/ds4-decode.md``); ``3c``, ``3cc``, ``3p``, ``3cp``, ``3ccp``
the whole-token and device-side stages (``docs/capture-stages.md``); ``i`` and ``i+`` ds4's decode islands (ds4
``e50104f6``; ``docs/model.md``). Next: :class:`~ds4lab.experiments.stage_run.StageRun`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..capture.cache import EAGER, CapturePolicy
from ..errors import BadInput

#: The hazard fixes a stage can require (context file, "Capture hazards").
FIXES = ("launches through the accessor", "non-blocking stream", "async counts clear",
         "expert selection on the device", "preallocated scratch", "no host-timed profiling",
         "scalars from device buffers", "node parameters updated before replay",
         "no device sync in the body", "warm-up before capture", "device-side predicates",
         "buffer-keyed graph variants", "conditional nodes set on the device", "both halves of programmatic launch")

#: The first decoded position of a ladder (the KV window is full from the start).
START_POS = 1000


@dataclass(frozen=True)
class Stage:
    """One rung of a capture plan.

    Attributes:
        name: the stage's name on the command line (``"0"``, ``"3c"``, ``"i"``).
        short: a few words for tables and legends.
        description: what changes, one sentence.
        nonblocking: eager work on a non-blocking stream set with ``capture_set_stream`` (False: the legacy stream).
        policy: what the stage captures and how (:class:`~ds4lab.capture.cache.CapturePolicy`); :data:`EAGER`: none.
        options: :class:`~ds4lab.token.model.TokenOptions` fields the stage sets.
        fixes: the fixes of :data:`FIXES` the stage needs.
        long_context_only: exists on the long-context token only (``3c``)."""

    name: str
    short: str
    description: str
    nonblocking: bool = True
    policy: CapturePolicy = EAGER
    options: dict = field(default_factory=dict)
    fixes: tuple = ()
    long_context_only: bool = False

    @property
    def capture(self) -> frozenset:
        """The clusters the stage captures (its policy's); empty: eager."""
        return self.policy.clusters


_BASE = ("launches through the accessor", "non-blocking stream", "warm-up before capture")
_MOE = ("async counts clear", "expert selection on the device", "preallocated scratch", "no host-timed profiling")
_TOKEN_OPTS = dict(counts_clear="async", scratch="prealloc", moe_profile=False)
#: ds4's islands: captured in global mode on a blocking stream of their own, keyed by layer and buffers
#: (4 variants), every graph dropped when a buffer is reallocated.
_ISLANDS = CapturePolicy(("island0", "island1"), mode="global", blocking_capture_stream=True, variants=4,
                         invalidate_on_realloc=True)
_TOKEN = CapturePolicy(("token",))

#: Every stage, in ladder order.
STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("0", "eager, legacy", "stage 0: every launch through the accessor, no override: legacy stream, eager",
          nonblocking=False, fixes=("launches through the accessor",)),
    Stage("0s", "eager, stream", "eager on a non-blocking stream set with capture_set_stream (the stream "
          "change alone, no capture)", fixes=("launches through the accessor", "non-blocking stream")),
    Stage("i", "ds4 islands", "ds4's decode islands as shipped: per layer the attention's hyper-connection "
          "pre-mix (island 0) and the attention output through the FFN tail (island 1) captured on a blocking "
          "stream in global mode, keyed by layer and buffers (4 variants), the middle (query and KV projections, "
          "RoPE, KV store, compressor, indexer, top-k, attention) eager on the legacy stream; island 1 eager on "
          "the hash-routed layers",
          nonblocking=False, policy=_ISLANDS, options=dict(_TOKEN_OPTS),
          fixes=("launches through the accessor", "warm-up before capture", *_MOE, "buffer-keyed graph variants")),
    Stage("i+", "islands + span", "stage i plus the attention of the eager middle as a graph whose kernel-node "
          "parameters are set every token (cudaGraphExecKernelNodeSetParams), as ds4's opt-in hand-built attention "
          "score graph (36ee8c14)",
          nonblocking=False, options=dict(_TOKEN_OPTS),
          policy=_ISLANDS.with_(clusters=("island0", "island1", "attn_span"), node_updates=("attn_span",)),
          fixes=("launches through the accessor", "warm-up before capture", *_MOE, "buffer-keyed graph variants",
                 "node parameters updated before replay")),
    Stage("1", "shared FFN", "shared-expert FFN cluster of every layer captured once, replayed (one graph per layer)",
          policy=CapturePolicy(("shared",)), fixes=_BASE),
    Stage("2", "+ routed MoE", "stage 1 plus the routed-MoE cluster captured (experts read on the device, counts "
          "clear async, scratch preallocated, no host-timed profiling)", policy=CapturePolicy(("shared", "moe")),
          options=dict(_TOKEN_OPTS), fixes=(*_BASE, *_MOE)),
    Stage("3", "whole token", "the whole token body captured, per-token scalars read from device buffers "
          "written before each replay (one graph per token shape)", policy=_TOKEN,
          options=dict(_TOKEN_OPTS, scalars="device"),
          fixes=(*_BASE, *_MOE, "scalars from device buffers", "no device sync in the body")),
    Stage("3u", "token + update", "as 3, scalars passed by value; the executable graph's kernel parameters "
          "updated before each replay (re-capture + cudaGraphExecUpdate)", policy=_TOKEN.with_(update=True),
          options=dict(_TOKEN_OPTS, scalars="value"),
          fixes=(*_BASE, *_MOE, "node parameters updated before replay", "no device sync in the body")),
    Stage("3c", "one graph", "the whole token captured once; emit, top-k regime and attention length decided on the "
          "device (emit kernels exit off an emit token, worst-case top-k grids, rows past n_comp skipped)",
          policy=_TOKEN, options=dict(_TOKEN_OPTS, scalars="device", longctx="device"), long_context_only=True,
          fixes=(*_BASE, *_MOE, "scalars from device buffers", "no device sync in the body", "device-side predicates")),
)}

# The device-side stages (docs/capture-stages.md): conditional nodes (3cc) and programmatic dependent
# launch (3p, and on top of 3c / 3cc: 3cp, 3ccp), each built from the stage it changes.
_WHOLE = (*_BASE, *_MOE, "scalars from device buffers", "no device sync in the body")
_PDL = "both halves of programmatic launch"
STAGES.update({s.name: s for s in (
    Stage("3cc", "conditional", "the whole token captured once; each compressor's emit kernels the body of an IF "
          "node and the indexer a SWITCH node with one body per top-k regime, their conditions set from the "
          "position by a kernel of the graph (cudaGraphSetConditional): ds4's launches at each position",
          policy=_TOKEN, options=dict(_TOKEN_OPTS, scalars="device", longctx="conditional"),
          long_context_only=True, fixes=(*_WHOLE, "conditional nodes set on the device")),
    Stage("3p", "token + PDL", "as 3, every kernel of the capture launched with programmatic stream serialization "
          "(cuLaunchKernelEx) and waiting on the device for its predecessor (griddepcontrol.wait) before anything "
          "else: a programmatic edge between consecutive kernels", policy=_TOKEN.with_(key_decisions=True),
          options=dict(_TOKEN_OPTS, scalars="device", pdl=True), fixes=(*_WHOLE, _PDL)),
    Stage("3cp", "3c + PDL", "as 3c, with programmatic edges between consecutive kernels (as 3p)",
          policy=_TOKEN, options=dict(_TOKEN_OPTS, scalars="device", longctx="device", pdl=True),
          long_context_only=True, fixes=(*_WHOLE, "device-side predicates", _PDL)),
    Stage("3ccp", "3cc + PDL", "as 3cc, with programmatic edges between consecutive kernels (as 3p; not across a "
          "conditional node, whose dependents wait for it to complete)",
          policy=_TOKEN, options=dict(_TOKEN_OPTS, scalars="device", longctx="conditional", pdl=True),
          long_context_only=True, fixes=(*_WHOLE, "conditional nodes set on the device", _PDL)),
)})

#: What ``ds4lab ladder`` runs by default, and ``ds4lab context``.
LADDER_DEFAULT = "0,0s,i,i+,1,2,3,3u"
CONTEXT_DEFAULT = "0,i,i+,3,3c"


class StageInputError(BadInput):
    """A stage list that cannot run (the command line exits 2); nothing was measured."""


def parse_stages(text: str, *, long_context: bool = False) -> list[Stage]:
    """``"0,0s,1"`` → stages, in the order given.

    Raises:
        StageInputError: an empty list, an unknown or repeated stage, or ``3c`` without ``long_context`` (the message
            says to add ``--long-context``)."""
    names = [t.strip() for t in str(text).split(",")]
    if any(not n for n in names):
        raise StageInputError(f"empty stage name in {text!r}; choose from: {', '.join(STAGES)}")
    bad = [n for n in names if n not in STAGES]
    if bad:
        raise StageInputError(f"unknown stage(s) {', '.join(bad)}; choose from: {', '.join(STAGES)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StageInputError(f"stage(s) {', '.join(twice)} listed more than once in {text!r}")
    lc = [n for n in names if STAGES[n].long_context_only and not long_context]
    if lc:
        raise StageInputError(f"stage(s) {', '.join(lc)} exist on the long-context token only: add --long-context "
                              "(ds4lab ladder) or use ds4lab context")
    return [STAGES[n] for n in names]


def fixes_table(stages=None):
    """Which hazard fixes each stage requires: a DataFrame, fixes × stages (``required`` / ``—``)."""
    import pandas as pd

    sts = list(STAGES.values()) if stages is None else stages
    return pd.DataFrame({s.name: ["required" if f in s.fixes else "—" for f in FIXES] for s in sts},
                        index=list(FIXES))
