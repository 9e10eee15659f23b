#!/usr/bin/env bash
# One batched session on the lent GPU (from the repository root): every GPU test, the conformance
# suite (GPU vs sim), the stage ladder on ds4-flash, the ladder across context on the long-context
# token, the long-context hazards, and the benchmarks with the per-op roofline. Each step has its
# own time limit and a failing step does not stop the others. Everything lands in $OUT/round.tgz.
set -u
source scripts/device_env.sh
export COLUMNS=200
R=/tmp/round; rm -rf $R; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__)"; } > $R/env.txt 2>&1
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $((SECONDS - t0))s" | tee -a $R/steps.txt; tail -n "${TAIL:-12}" "$R/$name.log" | cut -c1-230; }
step gpu-tests 260 python3 -m pytest -q -m gpu -x --maxfail=10 tests/
step conformance 90 python3 -m ds4lab.cli conformance --backend cupy --out $R/conformance
TAIL=30 step context 220 python3 -m ds4lab.cli context --backend cupy --preset ds4-flash \
  --contexts 1024,4096,16384,65536 --tokens 32 --out $R/context
step hazards-longctx 120 python3 -m ds4lab.cli ladder --backend cupy --preset small --hazard all-longctx --out $R/hazards-longctx
TAIL=10 step ladder 150 python3 -m ds4lab.cli ladder --backend cupy --preset ds4-flash --out $R/ladder
TAIL=30 step bench 150 python3 -m ds4lab.cli bench --preset ds4-flash --per-op --out $R/bench
find $R -name "*.svg" -o -name "*.pdf" | xargs rm -f
tar czf $OUT/round.tgz -C /tmp round
cat $R/steps.txt
