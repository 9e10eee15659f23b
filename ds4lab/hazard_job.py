"""``ds4lab ladder --hazard``: run hazard demonstrations, print and write ``hazards.csv``."""

from __future__ import annotations

from pathlib import Path

from . import provenance, results
from .config import get_preset
from .hazards import HAZARDS, demonstrate


def run_hazards(backend: str, preset: str | None, which: str, mode: str, out, console):
    """Demonstrate ``which`` (or ``all``) on the exactness backend of ``backend``."""
    import pandas as pd

    from .ladder import make_backends

    _, be = make_backends(backend)
    cfg = get_preset(preset or ("small" if not be.is_gpu else "ds4-flash"))
    out = Path(out or f"results/hazards-{cfg.name}-{be.name}")
    results.check_out(out, ("hazards.csv", "meta.json"))
    names = list(HAZARDS) if which == "all" else [which]
    rows = []
    for n in names:
        r = demonstrate(n, be, cfg, mode=mode)
        rows.append(r)
        pd.DataFrame(rows).to_csv(out / "hazards.csv", index=False)
        console.print(f"[bold]{n}[/]: {r['outcome']} · errors {r['errors']} · exact {r['exact']}"
                      + (f" · first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
        console.print(f"   expected: {r['expected']}")
    meta = provenance.base_meta(be)
    meta.update(job="hazards", preset=cfg.summary(), capture_mode=mode, hazards=names)
    provenance.write_json(out / "meta.json", meta)
    console.print(f"wrote {out / 'hazards.csv'}")
    return rows
