"""``ds4lab bench`` (GPU only): launch-layer host cost against bare CuPy, routed-MoE decode bandwidth, graph replay
cost per node (:mod:`ds4lab.measure.bench`); ``bench.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from ..measure.bench import run_bench
from ..token.config import get_preset
from .common import default_preset
from .result import JobResult, no_folder, result_folder


@dataclass
class BenchConfig:
    """Arguments of ``ds4lab bench``: preset, folder for ``bench.json`` (None: print only), per-op roofline."""

    preset: str | None = None
    out: Path | str | None = None
    #: Add the per-launch-site roofline of one token (:mod:`ds4lab.measure.perop`; CSV and figure in ``out``).
    per_op: bool = False


#: What ``ds4lab bench`` writes in its folder (``bench.json``; with ``--per-op`` the roofline table and figure).
BENCH_OUTPUTS = ("bench.json", "per_op*")


def run(cfg: BenchConfig, be, console) -> JobResult:
    """Run the benchmarks on ``be`` (a GPU), in ``cfg.out``'s result folder where given. Returns the
    :class:`~ds4lab.jobs.result.JobResult`: ``value`` as ``bench.json``; with ``per_op`` tables ``per_op``,
    ``per_op_launches`` and figure ``per_op``. Raises OutputError for an ``out`` that cannot be written (before any
    work)."""
    from ..report import provenance

    preset = get_preset(cfg.preset or default_preset("bench", be))
    meta = provenance.base_meta(be)
    meta.update(job="bench", preset=preset.summary(), per_op=cfg.per_op)
    if not cfg.out:
        return no_folder("bench", meta).done(run_bench(be, preset, console, per_op=cfg.per_op))
    with result_folder("bench", Path(cfg.out), meta, BENCH_OUTPUTS, say=console.print) as o:
        kept: dict = {}
        res = run_bench(be, preset, console, per_op=cfg.per_op, outputs=kept)
        for name, df in kept.get("tables", {}).items():
            o.table(name, df)
        for name, fig in kept.get("figures", {}).items():
            o.figure(name, fig)

        def enc(v):
            return asdict(v) if is_dataclass(v) else str(v)

        o.text("bench.json", json.dumps(res, indent=2, default=enc) + "\n")
    console.print(f"wrote {o.where('bench.json')}")
    return o.done(res)
