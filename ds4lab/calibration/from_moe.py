"""Fits for the tiled (tokens > 1) routed-MoE kernels from a ``ds4lab moe`` folder measured on a GPU (``calibrate
--moe-profile``, no GPU): :func:`fit_tiled_moe`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .kernels import linear_fit


#: The tiled (tokens > 1) expert kernels of ds4lab's five-launch path, their ds4 profile stage, and
#: their matrix (ds4's path: :func:`tiled_kernels`).
TILED_KERNELS = {"moe_gateup_tiled": ("gateup", "gate_up"), "moe_down_tiled": ("down", "down")}


def tiled_kernels(cfg) -> dict[str, tuple[str, str]]:
    """The tiled expert kernels of ``cfg``'s routed-MoE path: :data:`TILED_KERNELS`, or on ds4's path
    ``moe_gateup_mid_tiled_<gate/up format>`` and ``moe_down_tiled_<down format>``."""
    if cfg.moe_path != "ds4":
        return TILED_KERNELS
    gu, dn = cfg.expert_formats
    return {f"moe_gateup_mid_tiled_{gu}": ("gateup", "gate_up"), f"moe_down_tiled_{dn}": ("down", "down")}


def fit_tiled_moe(moe_dir: Path, max_tokens: int = 64) -> dict:
    """Per-kernel fits for the tiled routed-MoE kernels from a GPU-measured ``ds4lab moe`` folder: the ``in-graph``
    stage medians under ``uniform`` routing for 2 to ``max_tokens`` tokens against the bytes the cost model charges
    (:func:`ds4lab.token.reference.expected_tiles`). Returns ``{kernel: {fixed_us, bandwidth_GBps, samples,
    source}}``. Raises ``ValueError`` naming a modeled folder, one without in-graph uniform rows for two token
    counts, or without a preset."""
    import pandas as pd

    from ..token.config import BYTES_PER_WEIGHT, get_preset
    from ..token.reference import expected_tiles

    moe_dir = Path(moe_dir)
    try:
        meta = json.loads((moe_dir / "meta.json").read_text())
        summary = pd.read_csv(moe_dir / "summary.csv")
    except (OSError, ValueError) as e:
        raise ValueError(f"{moe_dir}: not a ds4lab moe result folder ({e})") from None
    if meta.get("modeled") or not meta.get("measured", True):
        raise ValueError(f"{moe_dir}: modeled on the simulated runtime; fit from a GPU measurement")
    if not isinstance(meta, dict):
        raise ValueError(f"{moe_dir}/meta.json: a JSON object expected")
    preset = meta.get("preset", {})
    if isinstance(preset, str):
        preset = {"name": preset}
    if not isinstance(preset, dict) or "name" not in preset:
        raise ValueError(f"{moe_dir}/meta.json names no preset")
    # A folder written before ModelConfig.expert_format existed measured ds4lab's 4-bit block experts.
    cfg = get_preset(preset["name"], expert_format=preset.get("expert_format", "q4blk"))
    F, E, k, N = cfg.expert_ffn, cfg.embed, cfg.n_used, cfg.n_experts
    shapes = {"gate_up": (2 * F, E, cfg.expert_formats[0]), "down": (E, F, cfg.expert_formats[1])}
    missing = [c for c in ("mode", "routing", "tokens", "stage", "median_ms") if c not in summary.columns]
    if missing:
        raise ValueError(f"{moe_dir}/summary.csv lacks the column(s) {', '.join(missing)}")
    d = summary[(summary["mode"] == "in-graph") & (summary["routing"] == "uniform")
                & summary["tokens"].between(2, max_tokens)]
    fits = {}
    for kernel, (stage, bank) in tiled_kernels(cfg).items():
        g = d[d["stage"] == stage].sort_values("tokens")
        if g["tokens"].nunique() < 2:
            raise ValueError(f"{moe_dir}: {stage} needs in-graph uniform times for two token counts "
                             f"in 2..{max_tokens}, found {sorted(g['tokens'].unique())}")
        rows, cols, fmt = shapes[bank]
        per_tile = int(rows * cols * BYTES_PER_WEIGHT[fmt])
        nbytes = np.array([expected_tiles(int(t), k, N) * per_tile for t in g["tokens"]])
        a, bw = linear_fit(nbytes, g["median_ms"].to_numpy() * 1e3)
        fits[kernel] = {"fixed_us": round(a, 3), "bandwidth_GBps": round(bw, 1), "samples": int(len(g)),
                        "source": f"ds4lab moe in-graph, uniform, tokens {list(map(int, g['tokens']))}, "
                                  f"{meta.get('device')} {meta.get('timestamp', '')}"}
    return fits
