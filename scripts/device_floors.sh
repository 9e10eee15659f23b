# On the lent GPU machine, from the repository root, with PYTHONPATH set (scripts/device_env.sh):
# the checks and measurements of the floors and kernels work in one call, inside a time budget
# (BUDGET seconds, default 160; a step that would start with less than 10 s left is skipped):
#   pytest    GPU tests of the kernels and launch sites that changed, and of the floors;
#   kernels   scripts/bench_kernels.py: every kernel variant checked and timed (BASELINE=DIR: an older
#             kernels/ folder timed beside it, same run);
#   bench     ds4lab bench --per-op: floors, replayed token's busy time, per-site roofline;
#   moe       ds4lab moe --mode in-graph: the in-graph profile's cost on replayed and eager tokens;
#   ncu       Nsight Compute (clocks left alone) on attention and hc_premix launches of the variant
#             bench: throughput, warp stall reasons, occupancy.
# STEPS=pytest,kernels,bench,moe,ncu picks the steps. Results in $OUT/res, packed into $OUT/res.tgz.
set -u
R=${OUT:-/tmp/out}/res
mkdir -p "$R"
T0=$SECONDS
BUDGET=${BUDGET:-160}
STEPS=${STEPS:-pytest,kernels,bench}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import cupy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'runtime', cupy.cuda.runtime.runtimeGetVersion())"
  echo "steps $STEPS budget $BUDGET"; } > "$R/env.txt" 2>&1
step() {
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",${name%%_*},"*) ;; *) return ;; esac
  local left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 10 ]; then echo "$name skipped (budget)" | tee -a "$R/steps.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s" | tee -a "$R/steps.txt"
}
step pytest_kernels 60 python3 -m pytest -q -p no:cacheprovider -m gpu --maxfail=20 tests/test_kernels_gpu.py \
  tests/test_floors.py -k "q8 or attention or router_topk or hc_ or floors"
step pytest_tokens 45 python3 -m pytest -q -p no:cacheprovider -m "gpu and not slow" --maxfail=10 \
  "tests/test_kernels_gpu.py::test_routed_moe_stagewise[1]" "tests/test_kernels_gpu.py::test_routed_moe_stagewise[2]" \
  tests/test_token_gpu.py tests/test_longctx_gpu.py -k "stagewise or token or q8_matvec_when"
step kernels 50 python3 scripts/bench_kernels.py --out "$R/kernels" ${BASELINE:+--baseline "$BASELINE"} ${KERNELS_ARGS:-}
step bench 70 python3 -m ds4lab.cli bench --preset ds4-flash --per-op --out "$R/bench"
step moe 90 python3 -m ds4lab.cli moe --backend cupy --preset ds4-flash --mode in-graph --tokens-per-step 1 \
  --routing uniform --steps 2 --share-tokens 0 --out "$R/moe"
step ncu 45 ncu --clock-control none -k "regex:attention_decode|hc_premix" --launch-count 14 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --csv \
  --log-file "$R/ncu.csv" python3 scripts/bench_kernels.py --only small --out "$R/ncu-run" ${BASELINE:+--baseline "$BASELINE"}
rm -f "$R"/bench/*.svg "$R"/bench/*.pdf "$R"/moe/*.svg "$R"/moe/*.pdf
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
for f in pytest_kernels pytest_tokens; do [ -f "$R/$f.txt" ] && { echo "== $f"; grep -E "passed|failed|error" "$R/$f.txt" | tail -n 3; grep -E "^(FAILED|ERROR)" "$R/$f.txt" | head -n 12; }; done
[ -f "$R/kernels.txt" ] && { echo "== kernels"; sed -n '/configurations in/,$p' "$R/kernels.txt"; grep -E "FAIL|WRONG" "$R/kernels.txt" | head -n 8; }
[ -f "$R/bench/bench.json" ] && python3 - "$R/bench/bench.json" <<'EOF'
import json, sys
b = json.load(open(sys.argv[1]))
keys = ("token_busy_us", "token_replay_us", "bytes_floor_us", "launch_floor_us", "t_min_us", "t_min_kernel_us",
        "large_kernel_copy_fraction", "moe_decode_copy_fraction", "attention_us_per_layer", "copy_GBps")
print("== bench", {k: (round(b[k], 3) if isinstance(b.get(k), float) else b.get(k)) for k in keys})
for k in ("busy_vs_bytes_floor", "busy_vs_launch_floor", "replay_vs_launch_floor"):
    print("  ", k, b.get(k))
po = b.get("per_op") or {}
print("   per-op method", po.get("method"))
for s in (po.get("sites") or [])[:14]:
    print(f"   {s['cluster']}/{s['site']:18s} {s['kernel']:18s} x{s['launches']:3d} {s['us']:8.1f} us {s['copy_fraction']:5.0%}")
EOF
[ -f "$R/moe.txt" ] && { echo "== moe"; grep -iE "overhead|in-graph|none|not measurable" "$R/moe.txt" | tail -n 8; }
[ -f "$R/ncu.csv" ] && { echo "== ncu"; grep -c attention_decode "$R/ncu.csv"; }
cat "$R/steps.txt"
