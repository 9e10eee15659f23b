"""GPU time and bandwidth of each routed-MoE decode kernel, per expert format (GPU only).

Usage: ``python scripts/time_moe_decode.py [out_dir] [preset ...]`` (default presets: ``ds4-flash``,
``ds4-flash-q4k``, ``ds4-flash-q4blk``).

For each preset: one layer's model (the shared expert bank of 256 experts), ``ROUTINGS`` decode steps
(one token each, random inputs, ``n_used`` distinct random experts, random router weights) captured
into one graph and replayed ``REPLAYS`` times; each kernel's duration from CUPTI kernel records
(``cupti-python``) of the replays, median per kernel. The steps touch ~140 of the 256 experts per
replay (far more than the 50 MB L2 holds), as a token's layers do. Bytes per launch: the launch
sites' own counts (each expert matrix in its format, plus activations), so GB/s and the fraction of
the measured device-to-device copy bandwidth (``timing.copy_bandwidth``) are the per-op roofline's.
Prints one line per kernel; with ``out_dir``, writes ``moe_decode_kernels.csv`` and ``meta.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ds4lab.report import provenance
from ds4lab.backends import make_backend
from ds4lab.capture import stream as S
from ds4lab.capture.scope import capture_scope
from ds4lab.trace.live import CuptiTimeline
from ds4lab.timing import copy_bandwidth, event_ms
from ds4lab.token.config import PRESETS, get_preset
from ds4lab.token.model import DecodeModel, TokenOptions

ROUTINGS, REPLAYS = 32, 10


def time_preset(be, name: str, copy_gbps: float, seed: int = 11) -> list[dict]:
    """Per-kernel rows of one preset (see the module docstring)."""
    import cupy

    cfg = get_preset(name)
    m = DecodeModel(cfg, be, TokenOptions(counts_clear="async"), n_layers=1)
    rng = np.random.default_rng(seed)
    k, E = cfg.n_used, cfg.embed
    xs = be.from_host(rng.standard_normal((ROUTINGS, E)).astype(np.float32))
    ids = be.from_host(np.stack([rng.choice(cfg.n_experts, k, replace=False) for _ in range(ROUTINGS)]).astype(np.int32))
    wts = be.from_host(rng.dirichlet(np.ones(k), ROUTINGS).astype(np.float32))
    bank = m.banks[0]
    st = cupy.cuda.Stream(non_blocking=True)
    was = S.graphs_enabled()
    S.set_graphs_enabled(True)
    try:
        with S.stream_override(st):
            with m.L.recording() as rec:
                m.moe_launches(bank, xs[0], ids[0], wts[0], 1)
            for i in range(ROUTINGS):
                m.moe_launches(bank, xs[i], ids[i], wts[i], 1)
            st.synchronize()
            with capture_scope(None, st, "thread_local") as cap:
                for i in range(ROUTINGS):
                    m.moe_launches(bank, xs[i], ids[i], wts[i], 1)
        g = cap.graph
        g.launch(st)
        st.synchronize()
        cu = CuptiTimeline()
        cu.start()
        cu.take()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        steps = []
        for _ in range(REPLAYS):
            e0.record(st)
            g.launch(st)
            e1.record(st)
            st.synchronize()
            steps.append(event_ms(e0, e1) * 1e3 / ROUTINGS)
        recs = [r for r in cu.take() if r.kind == "kernel"]
        cu.stop()
    finally:
        S.set_graphs_enabled(was)
    rows = []
    step_us = float(np.median(steps))
    for r in rec:
        us = np.array([k.dur_ns * 1e-3 for k in recs if k.name == r.kernel])
        if not us.size:
            raise RuntimeError(f"{name}: no CUPTI record of kernel {r.kernel}")
        med = float(np.median(us))
        gbps = r.nbytes / (med * 1e-6) / 1e9
        rows.append({"preset": name, "expert_format": cfg.expert_format, "site": r.site, "kernel": r.kernel,
                     "grid": "x".join(map(str, r.grid)), "shared_bytes": r.shared, "bytes": r.nbytes,
                     "us_median": round(med, 3), "us_p10": round(float(np.percentile(us, 10)), 3),
                     "us_p90": round(float(np.percentile(us, 90)), 3), "records": int(us.size),
                     "GBps": round(gbps, 1), "copy_fraction": round(gbps / copy_gbps, 3),
                     "step_us_events": round(step_us, 2)})
    return rows


def main(argv: list[str]) -> int:
    import pandas as pd

    presets = [a for a in argv if a in PRESETS] or ["ds4-flash", "ds4-flash-q4k", "ds4-flash-q4blk"]
    dirs = [a for a in argv if a not in PRESETS]
    out = Path(dirs[0]) if dirs else None
    be = make_backend("cupy")
    be.compile_all()
    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw.median:.0f} GB/s (median of 20, 2 GiB)")
    rows = []
    for p in presets:
        rows += time_preset(be, p, bw.median)
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df[["preset", "site", "kernel", "grid", "bytes", "us_median", "us_p10", "us_p90", "GBps",
                  "copy_fraction", "step_us_events"]].to_string(index=False))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "moe_decode_kernels.csv", index=False)
        meta = {"command": "python scripts/time_moe_decode.py " + " ".join(argv), "copy_GBps": bw.median,
                "routings": ROUTINGS, "replays": REPLAYS, **provenance.base_meta(be)}
        (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
