"""What-if sweeps of the stage ladder on the simulated runtime: how the gain of a captured token (stage 3) over the
eager one (stage 0) moves with the number of layers and the host's cost per eager launch. Every number here is
MODELED by the sim's cost model (``ds4lab/data/h200.json`` by default, measured on the H200; see ``docs/model.md``),
never measured."""

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
    """Modeled µs per token of ``stage`` (a ladder stage name) for config ``cfg``, and the calibration's provenance
    (``name``, ``source``, ``measured``).

    ``calibration``: a path, a dict in the calibration schema, or None for the shipped one. Raises ``KeyError`` for an
    unknown stage and the sim's ``CalibrationError`` for a bad calibration."""
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
    """Stage ``low`` and ``high`` µs per token and their ratio for each layer count in ``layers`` (the preset's other
    dimensions kept; at most 3 hash-routed layers, as in ds4). One row per count, with a ``source`` column naming
    the calibration.

    Raises ``ConfigError`` for a layer count the preset cannot take (0, negative)."""
    rows = []
    for n in layers:
        cfg = get_preset(preset, n_layers=int(n), n_hash_layers=min(3, int(n)))
        rows.append(_row(cfg, None, low, high, layers=int(n)))
    return pd.DataFrame(rows)


def sweep_launch_cost(host_launch_us, preset: str = "ds4-flash", low: str = "0", high: str = "3",
                      calibration=None) -> pd.DataFrame:
    """As :func:`sweep_layers`, over the host's µs per eager kernel launch (the calibration's ``host_launch_us``; the
    H200 measured 9.36 µs in a real token), everything else from ``calibration`` (default: the shipped one).

    Raises ``ValueError`` for a negative launch cost."""
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
    """Modeled µs per routed-MoE call, eager against one replayed graph (stage 2's capture of the ``moe`` cluster), for
    each token count in ``tokens`` (1: the decode path; 2–3: MTP verification; more: batched steps on the sorted
    path). Each call is bracketed by events on its stream; the router and the routing pattern are written before the
    bracket. The gain of capture falls as the kernels' work grows against the launches it saves.

    Timing-only caveat: the sorted path is priced at a fixed byte count per token count, so the routing pattern changes
    no modeled time (``docs/model.md``). Raises ``ValueError`` for a token count < 1 or an unknown routing."""
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
