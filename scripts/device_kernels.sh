# On the lent GPU machine, from the repository root, after `source scripts/device_env.sh`:
# correctness of every kernel and of whole tokens, `ds4lab bench --per-op`, and the ladder
# (stages 0 and 3). With a folder `before/` holding an older tree (its own kernels/ and
# ds4lab/, plus this tree's ds4lab/perop.py), the per-op roofline of that tree too, in the
# same call. Everything lands in $OUT/res and is packed into $OUT/k12.tgz.
set -u
R=${OUT:-/tmp/out}/res
mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import cupy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'runtime', cupy.cuda.runtime.runtimeGetVersion())"
  git log --oneline -1 2>/dev/null; } > "$R/env.txt" 2>&1
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$R/steps.txt"; }
step pytest 240 python3 -m pytest -q -m gpu --maxfail=5 tests/test_kernels_gpu.py tests/test_token_gpu.py
step bench 150 python3 -m ds4lab.cli bench --preset ds4-flash --per-op --out "$R/bench"
if [ -d before ]; then
  step perop_before 120 bash -c "cd before && PYTHONPATH=/tmp/site:\$PWD python3 ../scripts/profile_ops.py ds4-flash $R/before"
fi
step ladder 200 python3 -m ds4lab.cli ladder --backend cupy --preset ds4-flash --stages 0,3 --tokens 100 --out "$R/ladder"
rm -f "$R"/bench/*.svg "$R"/bench/*.pdf "$R"/before/*.svg "$R"/before/*.pdf
tar czf "${OUT:-/tmp/out}/k12.tgz" -C "$R" .
tail -n 3 "$R/pytest.txt"; cat "$R/steps.txt"
