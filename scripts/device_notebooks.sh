#!/usr/bin/env bash
# On the lent GPU: the four notebooks top to bottom with their defaults (ds4-flash), after an A/B
# of the same ladder from the command line and from a Jupyter kernel (stages 0 and 3, alternated).
# Carry .whl (nbclient, ipykernel and their needs; nvtx). Everything lands in $OUT/notebooks.tgz.
source scripts/device_env.sh
R=/tmp/nbrun; rm -rf $R; mkdir -p $R
step() { echo; echo "=== $1"; shift; timeout 300 "$@" 2>&1 | grep -v IPKernelApp; }
for i in 1 2; do
  step "ab-cli-$i" python3 -m ds4lab.cli ladder --stages 0,3 --out $R/ab/cli-$i
  step "ab-nb-$i" python3 -m ds4lab.cli notebooks 03 --set STAGES=0,3 --out $R/ab/nb-$i
done
step notebooks python3 -m ds4lab.cli notebooks --timeout 280 --out $R/notebooks
tar czf $OUT/notebooks.tgz -C /tmp nbrun
