#!/usr/bin/env bash
# Long-context decode on the lent GPU (run from the repo root; about 2-3 minutes, at most 5 by
# the timeouts):
#   1. the long-context kernels against their NumPy references (tests/test_longctx_gpu.py,
#      the slow ds4-flash partial token included);
#   2. eager ds4-flash tokens with long context at 1024, 4096, 65536 and 131071 (8 timed tokens
#      each, launches per token, a 4-layer reference check against the numpy backend);
#   3. the ladder across context (ds4lab.experiments.context.run_context) on ds4-flash: stages 0, 2, 3, 3c at
#      1024, 4096, 16384, 65536, exactness over 8 tokens around each, 32 timed tokens per stage.
# Outputs under $OUT/longctx/: pytest.txt, flash/eager.{csv,json}, context/context.{csv,png,svg,pdf},
# context/meta.json, context.txt, steps.txt.
source scripts/device_env.sh
O=$OUT/longctx; mkdir -p $O
step() { local t=$1 name=$2; shift 2; echo "=== $name" | tee -a $O/steps.txt
         timeout $t "$@"; local rc=$?; echo "--- $name rc=$rc" | tee -a $O/steps.txt; }
step 90 gpu-tests python3 -m pytest -q -rs tests/test_longctx_gpu.py > $O/pytest.txt 2>&1
tail -5 $O/pytest.txt
step 100 eager-flash python3 scripts/longctx_eager.py --preset ds4-flash --positions 1024,4096,65536,131071 \
     --tokens 9 --out $O/flash
step 120 context-flash python3 -c "
from ds4lab.experiments.context import run_context
run_context('cupy', 'ds4-flash', contexts=[1024, 4096, 16384, 65536], span=8, tokens=32, out='$O/context')
" > $O/context.txt 2>&1
tail -20 $O/context.txt
