"""``ds4lab bench`` (GPU only): launch-layer host cost against bare CuPy, routed-MoE decode
bandwidth, graph replay cost per node (:mod:`ds4lab.measure.bench`); ``bench.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from ..measure.bench import run_bench
from ..token.config import get_preset
from .common import default_preset


@dataclass
class BenchConfig:
    """Arguments of ``ds4lab bench``: the preset (None: the job's default), the folder for
    ``bench.json`` (None: print only) and whether to add the per-op roofline."""

    preset: str | None = None
    out: Path | str | None = None
    #: Add the per-launch-site roofline of one token (:mod:`ds4lab.measure.perop`; CSV and figure in ``out``).
    per_op: bool = False


#: What ``ds4lab bench`` writes in its folder (``bench.json``; with ``--per-op`` the roofline table and figure).
BENCH_OUTPUTS = ("bench.json", "per_op*")


def run(cfg: BenchConfig, be, console) -> dict:
    """Run the benchmarks on ``be`` (a GPU). Returns what ``bench.json`` holds. With ``cfg.out``,
    everything is written inside :func:`ds4lab.report.results.job_folder` (staged, swapped in on
    success; ``meta.json`` records the status and provenance).

    Raises:
        ds4lab.report.results.OutputError: ``out`` cannot be written, or holds what ds4lab did not
            write (checked before any work).
    """
    from ..report import provenance, results

    preset = get_preset(cfg.preset or default_preset("bench", be))
    if not cfg.out:
        return run_bench(be, preset, console, per_op=cfg.per_op, out=None)
    out = Path(cfg.out)
    meta = provenance.base_meta(be)
    meta.update(job="bench", preset=preset.summary(), per_op=cfg.per_op)
    with results.job_folder(out, meta, BENCH_OUTPUTS, say=console.print) as folder:
        res = run_bench(be, preset, console, per_op=cfg.per_op, out=folder)

        def enc(o):
            return asdict(o) if is_dataclass(o) else str(o)

        results.write_text_atomic(folder / "bench.json", json.dumps(res, indent=2, default=enc) + "\n")
    console.print(f"wrote {results.final_path(out) / 'bench.json'}")
    return res
