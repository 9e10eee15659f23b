#!/usr/bin/env python3
"""Eager long-context decode at a few positions: µs per token, launches, and a reference check.

For each start position: a model with ``long_context`` on decodes ``--tokens`` tokens from that
position eagerly (the first is a warm-up) on the chosen backend and reports the median µs per
token, the kernel launches of each token (emit and non-emit tokens differ), and the host
decisions of the first one. The reference check runs a partial model (``--check-layers``
layers: 4 covers both compression ratios) at the same position on that backend and on the
``numpy`` backend and reports the hidden state's relative error (limit 1e-4).

Writes ``eager.csv`` (one row per position) and ``eager.json`` under ``--out``. Exit status 1
when a reference check fails. Usage (GPU machine, repo root)::

    python scripts/longctx_eager.py --preset ds4-flash --positions 1024,4096,65536,131071 --out DIR
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="ds4-flash")
    ap.add_argument("--backend", default="cupy", choices=["cupy", "sim", "numpy"])
    ap.add_argument("--positions", default="1024,4096,65536,131071")
    ap.add_argument("--tokens", type=int, default=9, help="tokens per position (the first is a warm-up)")
    ap.add_argument("--scalars", default="device", choices=["value", "device"])
    ap.add_argument("--check-layers", type=int, default=4, help="layers of the reference-checked model (0: none)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)

    from ds4lab.backends import make_backend
    from ds4lab.token.config import get_preset
    from ds4lab.token.model import DecodeModel, TokenOptions

    positions = [int(p) for p in a.positions.split(",") if p]
    cfg = get_preset(a.preset, long_context=True)
    be = make_backend(a.backend, seed=cfg.seed)
    opts = TokenOptions(scalars=a.scalars, counts_clear="async")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    m = DecodeModel(cfg, be, opts)
    build_s = time.perf_counter() - t0
    mem = m.memory_bytes()
    print(f"{cfg.name} long context on {be.name}: weights {mem['weights'] / 2**30:.2f} GiB, caches "
          f"{mem['caches'] / 2**30:.2f} GiB (max_context {cfg.max_context}), built in {build_s:.1f} s", flush=True)
    rows, failed = [], False
    check = []
    if a.check_layers:
        from ds4lab.backends.numpy_backend import NumpyBackend

        # Built once: both decode the same positions in the same order, so their states agree.
        check = [DecodeModel(cfg, b, opts, n_layers=a.check_layers) for b in (be, NumpyBackend(seed=cfg.seed))]
    for p0 in positions:
        us, launches = [], []
        for i in range(a.tokens):
            pos = p0 + i
            m.L.census.reset()
            be.synchronize()
            t = time.perf_counter()
            m.token(pos, pos % cfg.vocab)
            be.synchronize()
            if i:
                us.append((time.perf_counter() - t) * 1e6)
            launches.append((pos, m.L.census.total("kernel")))
        row = {"position": p0, "tokens": a.tokens - 1, "us_median": round(statistics.median(us), 1) if us else None,
               "launches": " ".join(f"{p}:{n}" for p, n in launches),
               "decisions": repr(m.longctx_decisions(p0, by_value=a.scalars == "value"))}
        if check:
            t = time.perf_counter()
            hs = []
            for mm in check:
                mm.token(p0, p0 % cfg.vocab)
                hs.append(np.asarray(mm.hidden(), np.float64))
            err = float(np.linalg.norm(hs[0] - hs[1]) / np.linalg.norm(hs[1]))
            row.update(check_layers=a.check_layers, hidden_rel_err=err, check_ok=bool(np.isfinite(err) and err < 1e-4),
                       check_s=round(time.perf_counter() - t, 1))
            failed |= not row["check_ok"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(a.out / "eager.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    (a.out / "eager.json").write_text(json.dumps({"preset": cfg.summary(), "backend": be.name, "scalars": a.scalars,
                                                  "memory_bytes": mem, "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
