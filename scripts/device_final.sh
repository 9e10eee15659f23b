#!/usr/bin/env bash
# The closing device round (from the repository root): the long-context GPU tests and the ladder
# across context on ds4-flash, the conformance suite, the Nsight session (ncu, ingest, compare,
# trace), the MoE overhead table, the per-op roofline. Results are packed into $OUT/final.tgz after
# every step, so a round cut short keeps what finished.
set -u
source scripts/device_env.sh
export COLUMNS=200
R=/tmp/final; rm -rf $R; mkdir -p $R
pack() { find $R -name "*.svg" -o -name "*.pdf" | xargs rm -f; tar czf $OUT/final.tgz -C /tmp final; }
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $((SECONDS - t0))s" | tee -a $R/steps.txt; tail -n "${TAIL:-8}" "$R/$name.log" | cut -c1-200; pack; }
step longctx-gpu 90 python3 -m pytest -q -m gpu -x tests/test_longctx_gpu.py tests/test_kernels_compile.py
TAIL=20 step context 80 python3 -m ds4lab.cli context --backend cupy --preset ds4-flash \
  --contexts 1024,4096,16384,65536 --tokens 32 --out $R/context
step conformance 30 python3 -m ds4lab.cli conformance --backend cupy --out $R/conformance
OUT=$R TAIL=14 step nsight 230 bash scripts/device_nsight.sh
TAIL=16 step moe 70 python3 -m ds4lab.cli moe --backend cupy --preset ds4-flash --mode host-timed,deferred,in-graph,nvtx \
  --tokens-per-step 1 --routing uniform --steps 3 --share-tokens 0 --out $R/moe
TAIL=6 step bench 70 python3 -m ds4lab.cli bench --preset ds4-flash --per-op --out $R/bench
cat $R/steps.txt
