#!/bin/bash
# Run from .wt39 on the H200 (a copy of ds4lab's tree with .whl, .ds4src and .ds4build beside it):
# checks that ds4lab finds both carried builds of ds4 in its cache (no build on the GPU machine), then
# runs gpu_round.sh's env and ds4 steps with DS4_ARGS.
set -u
export CC=/usr/bin/cc  # the compiler path the carried builds recorded: part of their cache key
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/ds4lab-cache/ds4 && tar xJf .ds4build/ds4build-lib.tar.xz -C /tmp/ds4lab-cache/ds4
grep -m1 'model name' /proc/cpuinfo; grep -c processor /proc/cpuinfo
python3 - <<'PY' || { echo "preflight: a carried build is not where ds4lab looks: stopping before any build"; exit 3; }
import sys
from pathlib import Path
from ds4lab.ds4 import build as B
from ds4lab.ds4.source import locate
src = locate(".ds4src/ds4-b0309611.tar.gz")
ok = True
for rw in (False, True):
    plan = B.build_plan("sm_90", rewrite=rw, host_march="x86-64-v3")
    f = Path("/tmp/ds4lab-cache/ds4") / B.folder_name(src, plan)
    print(f.name, (f / "libds4lab_ds4.so").is_file(), plan.driver_digest)
    ok = ok and (f / "libds4lab_ds4.so").is_file()
sys.exit(0 if ok else 1)
PY
DS4_PACK_BUILD=0 bash scripts/gpu_round.sh env ds4:${DS4_LIMIT:-240}
