#!/usr/bin/env bash
# On the lent GPU: the GPU tests, the routed-MoE profile over token counts, then the four
# notebooks top to bottom with their defaults (ds4-flash). Carry .whl (nbclient, ipykernel and
# their needs; nvtx). Everything lands in $OUT/notebooks.tgz and $OUT/pytest-gpu.txt.
source scripts/device_env.sh
R=/tmp/nbrun; rm -rf $R; mkdir -p $R
step() { echo; echo "=== $1"; shift; timeout 300 "$@" 2>&1 | grep -v IPKernelApp; }
step gpu-tests python3 -m pytest -q tests/ -m gpu -p no:cacheprovider
step moe python3 -m ds4lab.cli moe --mode in-graph,deferred --tokens-per-step 1,2,3,16,64,512 \
    --routing uniform,worst --steps 4 --out $R/moe
step notebooks python3 -m ds4lab.cli notebooks --timeout 280 --out $R/notebooks
tar czf $OUT/notebooks.tgz -C /tmp nbrun
