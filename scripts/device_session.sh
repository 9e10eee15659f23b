#!/usr/bin/env bash
# One batched session on the lent GPU: conformance (GPU vs sim), calibration, eager runs, the
# ladder on ds4-flash and small, the hazard demonstrations, the benchmarks. Everything lands in
# one archive under $OUT (the device tool brings back at most 8 files).
source scripts/device_env.sh
export COLUMNS=160
R=/tmp/res; rm -rf $R; mkdir -p $R
step() { echo; echo "=== $1"; shift; "$@" || echo "!!! step failed: $?"; }
step conformance python3 -m ds4lab.cli conformance --backend cupy --out $R/conf
step calibrate python3 -m ds4lab.cli calibrate --preset ds4-flash --out $R/h200.json
step run-small python3 -m ds4lab.cli run --preset small --tokens 64 --no-check --out $R/run-small
step ladder-flash python3 -m ds4lab.cli ladder --backend cupy --preset ds4-flash --out $R/ladder-flash
step ladder-small python3 -m ds4lab.cli ladder --backend cupy --preset small --out $R/ladder-small
step hazards python3 -m ds4lab.cli ladder --backend cupy --preset small --hazard all --out $R/haz
step bench python3 -m ds4lab.cli bench --preset ds4-flash --out $R/bench
tar czf $OUT/res.tgz -C /tmp res
