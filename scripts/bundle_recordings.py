"""Bundle recordings of ``ds4lab audit validate`` with ds4lab (``ds4lab/data/audit/``), for auditing
without a GPU: each engine and cache of ``ds4lab.audit.engines.RECORDED`` from a validate result folder,
trimmed to its first decode steps, without the host-only queries that are most of its rows, beside its
torch.cuda.graph outcome (``torch-<engine>-<cache>.json``: outcome, µs, GPU and driver).

    python scripts/bundle_recordings.py results/audit-validate [--dtype float32]
"""

import argparse
import json
from pathlib import Path

from ds4lab.audit.engines import RECORDED, TOKEN_RANGE
from ds4lab.trace.events import EventTable
from ds4lab.trace.sources import read_events
from ds4lab.trace.sources.saved import write_table

#: Decode steps kept: every recorded one (a 95 % interval of a saving needs 6 tokens or more).
STEPS = 8
#: Host-only queries, allowed in every capture mode: dropping them changes no verdict.
HOST_QUERIES = ("cudaGetDevice", "cuDevicePrimaryCtxGetState", "cudaGetLastError", "cuCtxGetCurrent",
                "cuGetProcAddress")
DATA = Path(__file__).resolve().parents[1] / "ds4lab" / "data" / "audit"

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("validate_out", type=Path, help="the result folder of ds4lab audit validate")
ap.add_argument("--dtype", default="float32", help="the runs' dtype (folders <engine>-<cache>-<dtype>)")
args = ap.parse_args()

for engine, cache in RECORDED:
    src = args.validate_out / f"{engine}-{cache}-{args.dtype}"
    if not src.is_dir():  # a validate folder of an earlier layout
        src = args.validate_out / f"{engine}-{cache}"
    table = read_events(src / "recording.csv.gz")
    f = table.frame
    steps = f[(f.kind == "nvtx") & (f.name == TOKEN_RANGE)].sort_values("start_ns")
    if len(steps) < STEPS:
        raise SystemExit(f"{src}: {len(steps)} {TOKEN_RANGE} ranges, {STEPS} needed")
    end = steps.end_ns.iloc[STEPS - 1]
    keep = (f.start_ns <= end) & ~((f.kind == "api") & f.name.isin(HOST_QUERIES))
    keep &= (f.kind != "nvtx") | (f.start_ns >= steps.start_ns.iloc[0])
    note = (f"trimmed to the first {STEPS} decode steps; the host queries {', '.join(HOST_QUERIES)} left out "
            "(host-only, allowed in every mode)")
    outcome = json.loads((src / "engine.json").read_text())
    dev = outcome.get("device", {})
    tool = table.tool if " on " in table.tool else f"{table.tool} on {dev.get('device', '?')}, driver {dev.get('driver', '?')}"
    trimmed = EventTable(frame=f[keep].reset_index(drop=True), source=f"{engine}/{cache} decode loop, recorded by "
                         "ds4lab audit validate", tool=tool,
                         notes=list(table.notes) + [note])
    out = write_table(trimmed, DATA / f"torch-{engine}-{cache}.csv.gz", engine=f"{engine}-{cache}")
    outcome.pop("recording", None)
    outcome.pop("arguments", None)  # the argument pass is not bundled
    (DATA / f"torch-{engine}-{cache}.json").write_text(json.dumps(outcome, indent=1) + "\n")
    print(f"{out.name}: {keep.sum()} of {len(f)} rows · {outcome['outcome']}")
