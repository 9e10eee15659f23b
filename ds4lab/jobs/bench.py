"""``ds4lab bench`` (GPU only): launch-layer host cost against bare CuPy, routed-MoE decode
bandwidth, graph replay cost per node (:mod:`ds4lab.measure.bench`); ``bench.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from ..measure.bench import run_bench
from ..token.config import get_preset
from ..report.results import check_out
from .common import default_preset


@dataclass
class BenchConfig:
    """Arguments of ``ds4lab bench``: the preset (None: the job's default), the folder for
    ``bench.json`` (None: print only) and whether to add the per-op roofline."""

    preset: str | None = None
    out: Path | str | None = None
    #: Add the per-launch-site roofline of one token (:mod:`ds4lab.measure.perop`; CSV and figure in ``out``).
    per_op: bool = False


def run(cfg: BenchConfig, be, console) -> dict:
    """Run the benchmarks on ``be`` (a GPU). Returns what ``bench.json`` holds.

    Raises:
        ds4lab.report.results.OutputError: ``out`` cannot be written (checked before any work).
    """
    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        check_out(out, ("bench.json",))
    res = run_bench(be, get_preset(cfg.preset or default_preset("bench", be)), console, per_op=cfg.per_op, out=out)
    if out is not None:
        def enc(o):
            return asdict(o) if is_dataclass(o) else str(o)

        (out / "bench.json").write_text(json.dumps(res, indent=2, default=enc) + "\n")
        console.print(f"wrote {out / 'bench.json'}")
    return res
