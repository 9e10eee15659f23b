"""What-if sweeps of the stage ladder on the sim: how stage 3's gain over stage 0 moves with layers and host cost per
launch, and a captured routed-MoE call's with tokens per step. Every number MODELED (the shipped calibration by
default; ``docs/model.md``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..token.config import get_preset
from ..sim.costmodel import default_calibration_path

#: Tokens timed per point and untimed tokens first. The sim is deterministic in timing-only mode,
#: so a few tokens give the same median as many.
TOKENS, WARMUP = 20, 3


def stage_us(cfg, stage: str, calibration=None, start: int = 1000) -> tuple[float, dict]:
    """Modeled µs per token of ``stage`` for ``cfg``, and the calibration's provenance; ``calibration``: a path, a
    dict or None (shipped). Raises KeyError for an unknown stage, CalibrationError for a bad calibration."""
    from ..capture import stream as S
    from ..sim.backend import SimBackend
    from ..timing import Stats
    from ..token.model import DecodeModel, TokenOptions
    from .stage_run import Span, StageRun
    from .stages import STAGES

    be = SimBackend(timing_only=True, calibration=calibration)
    opts = TokenOptions(vocab=True)
    run = StageRun(DecodeModel(cfg, be, opts), STAGES[stage], opts)
    with S.graphs_enabled():
        got = run.time(Span(start + WARMUP, TOKENS), WARMUP)
    return float(Stats.of(got["us_samples"]).median), be.calibration


def _row(cfg, calibration, low: str, high: str, **key) -> dict:
    lo, cal = stage_us(cfg, low, calibration)
    hi, _ = stage_us(cfg, high, calibration)
    return {**key, f"stage {low} µs": lo, f"stage {high} µs": hi, "gain": lo / hi,
            "source": f"modeled (sim, calibration {cal.get('name', '?')})"}


def sweep_layers(layers, preset: str = "ds4-flash", low: str = "0", high: str = "3") -> pd.DataFrame:
    """Stage ``low`` and ``high`` µs per token and their ratio per layer count (at most 3 hash-routed layers), with
    ``source``. Raises ConfigError for a count the preset cannot take."""
    rows = []
    for n in layers:
        cfg = get_preset(preset, n_layers=int(n), n_hash_layers=min(3, int(n)))
        rows.append(_row(cfg, None, low, high, layers=int(n)))
    return pd.DataFrame(rows)


def sweep_launch_cost(host_launch_us, preset: str = "ds4-flash", low: str = "0", high: str = "3",
                      calibration=None) -> pd.DataFrame:
    """As :func:`sweep_layers`, over ``host_launch_us``. Raises ValueError for a negative cost."""
    path = Path(calibration) if calibration else default_calibration_path()
    base = json.loads(path.read_text())
    cfg = get_preset(preset)
    rows = []
    for us in host_launch_us:
        if us < 0:
            raise ValueError(f"host µs per launch must be ≥ 0, not {us}")
        cal = dict(base, host_launch_us=float(us), name=f"{base['name']} with host_launch_us={us}")
        row = _row(cfg, cal, low, high, host_launch_us=float(us))
        row["source"] = f"modeled (sim, calibration {base['name']}, host_launch_us set)"
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_moe_tokens(tokens, preset: str = "ds4-flash", routing: str = "uniform", calls: int = 8,
                     calibration=None) -> pd.DataFrame:
    """Modeled µs per routed-MoE call, eager against one replayed graph, per token count (routing changes no modeled
    time). Raises ValueError for a count < 1 or an unknown routing."""
    from ..capture.cache import CapturePolicy, GraphCache
    from ..moeprof import MoeWorkbench
    from ..sim.backend import SimBackend

    tokens = [int(t) for t in tokens]
    if not tokens or min(tokens) < 1:
        raise ValueError(f"token counts must be ≥ 1, not {tokens}")
    be = SimBackend(timing_only=True, calibration=calibration)
    wb = MoeWorkbench(be, get_preset(preset), max_tokens=max(tokens), n_layers=1)
    layers = wb.layers_for(routing, [0] if routing != "hash" else None)[:1]

    def per_call(T: int, executor) -> float:
        brackets: list = []
        with wb.session(executor=executor):
            for i in range(WARMUP + calls):
                wb.step(None, i, T, routing, layers, brackets)
        be.synchronize()
        times = [be.event_elapsed_ms(e0, e1) * 1e3 for e0, e1 in brackets[WARMUP:]]
        return float(pd.Series(times).median())

    rows = []
    for T in tokens:
        eager = per_call(T, None)
        graph = per_call(T, GraphCache(be, CapturePolicy(("moe",), warmup=1)))
        rows.append({"tokens": T, "eager µs": eager, "graph µs": graph, "gain": eager / graph,
                     "source": f"modeled (sim, calibration {be.calibration.get('name', '?')})"})
    return pd.DataFrame(rows)
