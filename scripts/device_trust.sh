#!/usr/bin/env bash
# Issue 14 checks on the lent GPU, from the repository root, after `source scripts/device_env.sh`:
# the conformance suite on cupy and sim (every disagreement, and every step that differs from a
# scenario's documented expectation), then the new GPU tests. Each step has its own timeout; a
# failing step is reported and the next one still runs. Results under $OUT/trust/.
# TRUST_FULL=1 adds the hazard demonstrations (small) and the exclusion matrix (a few minutes more),
# to show their verdicts unchanged by the query and graph-rule fixes.
set -u
OUT=${OUT:-/tmp/out}
T=$OUT/trust
mkdir -p "$T"
export COLUMNS=200
status=0
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "=== $name"
  timeout "$secs" "$@" > "$T/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$T/$name.log"
  if [ $rc -ne 0 ]; then echo "!!! $name: exit $rc (124: timed out); log $T/$name.log"; status=1; fi
}
step conformance 150 python3 -m ds4lab.cli conformance --backend cupy --out "$T/conf"
echo "=== summary"
timeout 30 python3 - "$T/conf" <<'PY' || { echo "!!! summary failed"; status=1; }
import csv, json, sys
from pathlib import Path
d = Path(sys.argv[1])
if not (d / "conformance.csv").is_file():
    sys.exit("no conformance.csv: the conformance step did not finish")
rows = list(csv.DictReader(open(d / "conformance.csv")))
bad = [r for r in rows if r["agree"] != "True"]
print(f"{len({r['scenario'] for r in rows})} scenarios, {len(rows)} steps, {len(bad)} GPU/sim disagreements")
for r in bad:
    print(f"  DIFF {r['scenario']} / {r['step']}: cupy={r.get('cupy')} sim={r.get('sim')}")
exp = list(csv.DictReader(open(d / "expectations.csv"))) if (d / "expectations.csv").is_file() else []
print(f"{len(exp)} steps differ from the documented expectation")
for r in exp:
    print(f"  DOC {r['backend']} {r['scenario']} / {r['step']}: expected {r['expected']}, got {r['got']}")
raised = [r for r in rows if r["step"] in ("<exception>", "<unhandled>", "<left capturing>")]
for r in raised:
    print(f"  RAISED {r['scenario']} {r['step']}: cupy={r.get('cupy')} sim={r.get('sim')}")
PY
step gpu-tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_capture_scope.py tests/test_trust_gpu.py
if [ "${TRUST_FULL:-0}" = 1 ]; then
  step hazards 240 python3 -m ds4lab.cli ladder --backend cupy --preset small --hazard all --out "$T/hazards"
  step exclusion 300 python3 -m ds4lab.cli exclusion --backend cupy --out "$T/exclusion"
fi
exit $status
