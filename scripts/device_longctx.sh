#!/usr/bin/env bash
# Long-context decode on the lent GPU (run from the repo root; about 2 minutes, at most 4 by the timeouts):
#   1. the long-context kernels against their NumPy references (tests/test_longctx_gpu.py,
#      the slow ds4-flash partial token included);
#   2. eager ds4-flash tokens with long context at 1024, 4096, 65536 and 131071 (8 timed tokens
#      each, launches per token, a 4-layer reference check against the numpy backend);
#   3. the same on small at 512 .. 8192 (every top-k regime, chunked at 8192).
# Outputs under $OUT/longctx/: pytest.txt, flash/eager.{csv,json}, small/eager.{csv,json}, steps.txt.
source scripts/device_env.sh
O=$OUT/longctx; mkdir -p $O
step() { local t=$1 name=$2; shift 2; echo "=== $name" | tee -a $O/steps.txt
         timeout $t "$@"; local rc=$?; echo "--- $name rc=$rc" | tee -a $O/steps.txt; }
step 90 gpu-tests python3 -m pytest -q -rs tests/test_longctx_gpu.py > $O/pytest.txt 2>&1
tail -5 $O/pytest.txt
step 120 eager-flash python3 scripts/longctx_eager.py --preset ds4-flash --positions 1024,4096,65536,131071 \
     --tokens 9 --out $O/flash
step 40 eager-small python3 scripts/longctx_eager.py --preset small --positions 512,1024,2048,4096,8192 \
     --tokens 9 --out $O/small
