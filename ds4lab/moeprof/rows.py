"""The profiler's vocabulary: stages, row columns, the record of one routed-MoE call, and its rows.

Every profiling mode (:mod:`ds4lab.moeprof.modes`) reports tidy rows with the columns :data:`ROW_COLUMNS`, one per call
and stage, built here (:class:`RowBuilder`); :func:`summarize` reduces them to median and IQR per mode, routing, token
count and stage."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import RuntimeApiError
from ..token.model import MOE_STAGES
from ..trace.sources.ds4log import STAGES  # ds4's profile stages plus their sum: the fields of its line
#: Decode, MTP verification, batches.
TOKENS_DEFAULT = (1, 2, 3, 16, 64, 256, 512)
REGIMES = ("eager", "replayed")
#: Columns of every profile row (``moe.csv``).
ROW_COLUMNS = ("token", "layer", "tokens", "pairs", "stage", "ms", "mode", "backend", "routing", "modeled",
               "phase", "note")


#: Kernel name (prefix when it ends in ``_``) → stage, for trace records (CUPTI or the sim timeline).
KERNEL_STAGE = (("xq_quantize", "xq"), ("moe_count", "sort"), ("moe_prefix", "sort"), ("moe_scatter", "sort"),
                ("moe_tiles", "sort"), ("memset", "sort"), ("moe_gateup_", "gateup"), ("moe_midq", "midq"),
                ("moe_down_", "down"), ("moe_sum", "sum"),
                # ds4's path (kernels/moe_ds4.cu); its gate/up and down kernels match the prefixes above.
                ("xq_quantize_q8k", "xq"), ("moe_midq_q8k", "midq"), ("moe_sum_slots", "sum"))


def kernel_stage(name: str) -> str | None:
    """The MoE stage a kernel (or the counts-clear ``memset``) belongs to; None for any other kernel."""
    for prefix, stage in KERNEL_STAGE:
        if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
            return stage
    return None


def record_stage(rec) -> str | None:
    """The MoE stage of a device record of the trace model (:mod:`ds4lab.trace.records`): a kernel's by its name, a
    memset's as the counts-clear ``memset``'s (:func:`kernel_stage`); None for others."""
    if rec.kind == "kernel":
        return kernel_stage(rec.name)
    return kernel_stage("memset") if rec.kind == "memset" else None


def capture_status(be, stream) -> str:
    """``be.capture_status(stream)``; ``"unknown"`` when the query itself fails (treated as capturing)."""
    try:
        return be.capture_status(stream)
    except RuntimeApiError:
        return "unknown"


def is_modeled(be) -> bool:
    """Whether ``be``'s times are modeled (the ``sim`` backend's ``models_time``), not measured."""
    return be.models_time


def join_notes(a: str, b: str) -> str:
    """Two notes as one (``"a; b"``), either may be empty."""
    return f"{a}; {b}" if a and b else (a or b)


@dataclass
class Probe:
    """The instrumentation of one routed-MoE call (or of the graph it was captured into): ``mode``, the mode that
    placed the points and reads them back; ``points``, what the model fires at its 7 profiling points (empty: none)."""

    kind: str  # host, events, stamps, nvtx, none
    layer: int
    tokens: int
    phase: str  # eager or capture (where the instrumentation was issued)
    mode: object = None
    points: list = field(default_factory=list)
    reads_on_host: bool = False  # the model itself synchronizes and reads (ds4's host-timed path)
    events: list | None = None
    slot: int = -1  # first of 7 stamp slots
    host: dict | None = None  # host-timed: the model's moe_profile_log entry
    note: str = ""
    error: str = ""
    status_after: str = ""
    nvtx_ranges: int = 0
    nvtx_capturing: bool = False


@dataclass
class Call:
    """One call of the ``moe`` cluster as the profiler saw it, waiting to be read."""

    token: int
    layer: int
    tokens: int
    phase: str  # eager, capture (outer capture: nothing ran), replay, capture+replay
    probe: Probe | None
    bracket: tuple | None = None
    note: str = ""


class RowBuilder:
    """Rows (:data:`ROW_COLUMNS`) of one profiler: its mode, backend, routing and ``modeled`` flag on every row;
    ``pairs`` = tokens × ``n_used``; times in ms (NaN where nothing was timed)."""

    def __init__(self, mode: str, backend: str, routing: str, modeled: bool, n_used: int) -> None:
        self.mode, self.backend, self.routing, self.modeled, self.k = mode, backend, routing, modeled, n_used

    def base(self, c: Call) -> dict:
        """The columns every row of call ``c`` shares (all but ``stage`` and ``ms``)."""
        return {"token": c.token, "layer": c.layer, "tokens": c.tokens, "pairs": c.tokens * self.k,
                "mode": self.mode, "backend": self.backend, "routing": self.routing, "modeled": self.modeled,
                "phase": c.phase, "note": c.note}

    def stages(self, c: Call, ms: dict, note: str = "") -> list[dict]:
        """One row per stage of :data:`STAGES`, ``ms[stage]`` (NaN when missing); ``note`` joined to the call's."""
        base = self.base(c)
        if note:
            base["note"] = join_notes(base["note"], note)
        return [{**base, "stage": s, "ms": float(ms.get(s, math.nan))} for s in STAGES]

    def nan(self, c: Call, note: str, stages=STAGES) -> list[dict]:
        """One NaN row per stage of ``stages``, saying why (``note``)."""
        base = self.base(c)
        base["note"] = join_notes(base["note"], note)
        return [{**base, "stage": s, "ms": math.nan} for s in stages]


def summarize(df):
    """Median and IQR (ms) of profile rows ``df`` per mode, backend, routing, token count and stage (finite values):
    ``n``, ``median_ms``, ``p25_ms``, ``p75_ms``, ``iqr_ms``, ``modeled``, stages in :data:`STAGES` order."""
    import pandas as pd

    keys = ["mode", "backend", "routing", "tokens", "stage"]
    d = df[np.isfinite(df["ms"].astype(float))]
    if d.empty:
        return pd.DataFrame(columns=keys + ["n", "median_ms", "p25_ms", "p75_ms", "iqr_ms", "modeled"])
    g = d.groupby(keys, sort=False)
    out = g["ms"].agg(n="count", median_ms="median", p25_ms=lambda s: s.quantile(0.25),
                      p75_ms=lambda s: s.quantile(0.75)).reset_index()
    out["iqr_ms"] = out["p75_ms"] - out["p25_ms"]
    out["modeled"] = g["modeled"].first().to_numpy()
    out["_o"] = out["stage"].map({s: i for i, s in enumerate(STAGES)})
    return out.sort_values(["mode", "routing", "tokens", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)
