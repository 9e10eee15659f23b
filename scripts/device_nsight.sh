#!/usr/bin/env bash
# Nsight sessions end to end on the lent GPU machine (issue 13). Run from the checkout's root after
#   source scripts/device_env.sh        (carried wheels: nvtx, cupti-python)
# Writes everything under $OUT/nsight/ (OUT defaults to ./out). Every step runs under `timeout`,
# prints its own failure and exit status, and never stops the steps after it; the script's exit
# status is the number of failed steps. About 3-4 minutes of GPU time.
#
#   1. the README's ncu command on one ds4-flash token  → nsight/ncu.csv (+ ncu.stderr)
#   2. ds4lab ingest of it, joined to ds4-flash's launch sites → nsight/ncu/ (ncu_kernels.csv, ncu_sites.csv)
#   3. ds4lab compare of the ingested table → nsight/compare/compare_ncu_sites.png
#   4. ds4lab trace --backend cupy --preset ds4-flash --stages 0,3 → nsight/trace/ (trace.json, trace.png)
#   5. the trace read back as Trace Event JSON, and a short summary of both → nsight/summary.txt
set -u
OUT="${OUT:-$PWD/out}"
N="$OUT/nsight"
mkdir -p "$N"
PY="${PYTHON:-python3}"
failed=0

step() {  # step NAME SECONDS COMMAND...: run it, report, never stop
  local name="$1" secs="$2"
  shift 2
  echo "=== $name (timeout ${secs}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$secs" "$@"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    echo "!!! $name FAILED with exit status $rc after $((SECONDS - t0))s" $([ "$rc" -eq 124 ] && echo "(timed out)")
  else
    echo "--- $name ok in $((SECONDS - t0))s"
  fi
  return 0
}

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; ncu --version | tail -1; "$PY" -c \
  "import cupy, cupti; print('cupy', cupy.__version__, 'cupti-python ok')"; } > "$N/versions.txt" 2>&1
cat "$N/versions.txt"

# 1. the README's command (Nsight Compute), exactly, with its output redirected to a file
ncu_run() {
  ncu --nvtx --nvtx-include "ds4lab@token/" --launch-count 300 --section SpeedOfLight --section LaunchStats --csv \
    "$PY" -m ds4lab.cli run --backend cupy --preset ds4-flash --tokens 1 --warmup 0 --nvtx --no-check \
    --out "$N/ncu-run" > "$N/ncu.csv" 2> "$N/ncu.stderr"
}
export N PY
export -f ncu_run
step "ncu (README command)" 240 bash -c ncu_run
echo "ncu.csv: $(wc -l < "$N/ncu.csv" 2>/dev/null || echo 0) lines; stderr tail:"; tail -3 "$N/ncu.stderr" 2>/dev/null

# 2-3. ingest (joined to the ds4-flash launch sites) and draw
step "ingest" 90 "$PY" -m ds4lab.cli ingest "$N/ncu.csv" --sites ds4-flash --out "$N/ncu"
step "compare" 60 "$PY" -m ds4lab.cli compare "$N/ncu" --out "$N/compare"

# 4. the timeline: CUPTI kernel records + ds4lab's NVTX ranges, stage 0 eager against stage 3 replayed
step "trace" 150 "$PY" -m ds4lab.cli trace --backend cupy --preset ds4-flash --stages 0,3 --out "$N/trace"

# 5. read both back
step "summary" 60 "$PY" - "$N" <<'PY'
import sys
from pathlib import Path

import pandas as pd

from ds4lab.report.trace_export import load_trace

n = Path(sys.argv[1])
lines = []
try:
    s = pd.read_csv(n / "ncu" / "ncu_sites.csv")
    k = pd.read_csv(n / "ncu" / "ncu_kernels.csv")
    lines.append(f"ncu: {len(k)} kernels, {k['op'].notna().sum()} with a ds4lab op, "
                 f"{int(k.get('site_known', pd.Series([], dtype=bool)).sum())} joined to a launch site")
    lines.append(s.head(12).to_string())
except Exception as e:  # noqa: BLE001 - report and go on
    lines.append(f"ncu tables: {type(e).__name__}: {e}")
try:
    d = load_trace(n / "trace")
    ev = d["traceEvents"]
    lines.append(f"trace.json: {len(ev)} events, provenance: {d['otherData'].get('provenance')}, "
                 f"sites matched: {d['otherData'].get('sites_matched')}")
    kern = pd.read_csv(n / "trace" / "trace_kernels.csv")
    for st, g in kern[kern.kind == "kernel"].groupby("stage"):
        one = g[g.token == g.token.min()] if g.token.notna().any() else g
        busy = (one.end_us - one.start_us).sum()
        span = one.end_us.max() - one.start_us.min()
        lines.append(f"stage {st}: {len(one)} kernels in one token, busy {busy:.0f} us of a {span:.0f} us span, "
                     f"graph ids {sorted(one.graph_id.unique())[:4]}, node ids {one.graph_node_id.min()}..{one.graph_node_id.max()}")
except Exception as e:  # noqa: BLE001
    lines.append(f"trace: {type(e).__name__}: {e}")
text = "\n".join(lines)
(n / "summary.txt").write_text(text + "\n")
print(text)
PY

echo "=== done: $failed step(s) failed; files:"
find "$N" -maxdepth 2 -type f | sort | head -40
exit "$failed"
