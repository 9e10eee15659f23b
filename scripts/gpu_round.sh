#!/usr/bin/env bash
# The one GPU-round script (run from the repository root on the lent GPU machine, through the
# device tool; carry .whl, made by scripts/gpu_wheels.sh, and .ds4src for the ds4 step):
#
#   bash scripts/gpu_round.sh STEP [STEP...]
#
# Each STEP is one ds4lab command with its own time limit (seconds, after the colon; the default in
# the table below); a failing or timed-out step does not stop the others. Everything lands in
# $OUT/round-1.tgz, round-2.tgz, ... (scripts/pack_round.py; figures as PNG only: SVG and PDF are dropped to
# stay within the transfer limit), repacked after every step, so a round cut short keeps what finished. Steps:
#
#   env          GPU, driver, Python, CuPy, torch versions
#   tests        every GPU test (pytest -m gpu); TESTS_ARGS narrows it (default tests/: e.g. a file and -k NAME)
#   conformance  ds4lab conformance --backend cupy (GPU and sim, every disagreement)
#   ladder       ds4lab ladder on ds4-flash (stages 0,0s,i,i+,1,2,3,3u)
#   islands      a short ladder of ds4's islands on ds4-flash (stages 0,i,i+,3; 40 tokens)
#   context      ds4lab context on ds4-flash at 1k, 4k, 16k, 64k (stages 0,i,i+,2,3,3c)
#   capture-stages  the device-side stages (docs/capture-stages.md) on ds4-flash in one run: ds4lab context of
#                3, 3c, 3cc, 3p, 3cp, 3ccp at 1k, 4k, 16k, 64k (64 tokens in 4 interleaved rounds: gains paired per
#                token, with 95 % intervals, against stage 3; CS_TOKENS, default 64), then ds4lab ladder of 0, 3, 3p
#                (the short token; CS_LADDER=0 leaves it out)
#   hazards      every hazard (small), and moe-profile-island on ds4-flash
#   exclusion    ds4lab exclusion (ds4-flash, first layers; with the island column)
#   moe          the MoE profiler's overhead per mode, eager and replayed (ds4-flash)
#   bench        ds4lab bench --per-op (ds4-flash): launch cost, roofline, floors
#   kernels      scripts/bench_kernels.py: every compile-time variant of the heavy kernels checked and timed
#   calibrate    ds4lab calibrate (ds4-flash), --long-context on top of it (three positions), then
#                --from-ladder on the islands step's folder when this round has one (run islands first)
#   torch-rules  the conformance scenarios of the audit's PyTorch-level rules (ds4lab.audit.torch_rules)
#   replay-kernels  scripts/replay_kernels.py: a replayed graph's kernel records against the eager token's, per launch
#                (RK_RUNS, default llama/dynamic llama/static; RK_DTYPE, default bfloat16)
#   audit        ds4lab audit validate: every step script of ds4lab/data/steps (or --steps DIR) run as a user's
#                (audit run's passes, its --truth, check_replay on its make_step) and held to torch.cuda.graph;
#                AUDIT_ARGS its arguments (FAMILY or CACHE names, --dtype, --steps, --no-capture-cost), several sets
#                separated by ';' (each into its own folder, each with the step's limit; join them on the CPU with
#                --runs-from); a FAMILY/CACHE mix filters every family by the cache: give each family its own set.
#                Each run's engine.json says the seconds of each part (passes, truth, check_replay)
#   steps-truth  ds4lab/data/steps/run_all.sh: the CUDA-graph ground truth of every decode-step family x cache x dtype
#                into $R/steps-truth (one JSON and one log each, 120 s a run); STEPS_FAMILIES names a subset, so a
#                full run (about 50 runs) can be split over two calls
#   fixtures     scripts/make_audit_fixtures.py (FIXTURE_ARGS: FAMILY/CACHE runs of the step scripts, --dtype,
#                --steps) into $R/audit_args: put under tests/data/audit_args/ for the CPU tests of the audit's
#                argument verdicts (tests/test_audit_args_fixtures.py takes whichever fixtures are there)
#   audit-ds4    ds4lab trace of stages 0 and 3 (ds4-flash, 8 tokens each), audited: stage 0's whole-token
#                plan (MODELED) against stage 3's measured tokens
#   notebooks    every notebook top to bottom with its defaults
#   ds4          ds4lab ds4: ds4 itself built from .ds4src/ (carry it: a copy of shared/ds4's archive) and
#                run on the synthetic Flash-shaped model; DS4_ARGS adds options (--contexts, --configs, ...),
#                DS4_NAME names its folder (default ds4); the build and the model are cached in /tmp, and the
#                build comes back as $OUT/ds4build-{lib,obj}.tar.xz (put both into .ds4build/ and carry it;
#                DS4_PACK_BUILD=0 sends none back). ds4's capture ladder: DS4_ARGS="--stages 0,i,3u,3 ..." (builds
#                ds4 as it ships and rewritten by ds4lab; a build made on another machine: --host-march x86-64-v3,
#                with CC naming the compiler path that build recorded, and --no-build so nothing is built there)
#   nb06         notebook 06 on this GPU, reading the ds4 step's folder (DS4_NAME; NB06_CONTEXTS, default 1024,4096)
#   nsight       the Nsight Compute command of docs/nsight.md on one ds4-flash token, ingested and joined to the
#                launch sites, and ds4lab trace (CUPTI) of stages 0 and 3
#   arguments-cost  scripts/arguments_cost.py: the argument pass's cost per launch and per step, paired and
#                interleaved with 95 % intervals, on a 2-layer transformers Llama (bf16) and a loop of 300 small torch
#                operators: the launch handler through CUPTI's C API and through cupti-python's wrapper, and the whole
#                pass (operator log, allocator history); then a short pass through each path, every launch read;
#                then the recording's GPU tests (tests/test_audit_record_gpu.py: an argument pass through each path)
#
# Example: bash scripts/gpu_round.sh env conformance ladder:200 hazards
set -u
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 COLUMNS=200
R=/tmp/round; rm -rf $R; mkdir -p $R
D="python3 -m ds4lab.cli"
# scripts/pack_round.py: archives of at most 15 MiB each (the tool returns 8 files of 16 MiB), rewritten after every step
pack() { python3 scripts/pack_round.py $R "$OUT"; }
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -s INT -k 20 "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?  # INT: pytest and ds4lab keep what finished
  echo "=== $name rc=$rc $((SECONDS - t0))s" | tee -a $R/steps.txt; tail -n "${TAIL:-12}" "$R/$name.log" | cut -c1-230
  pack; }
for arg in "$@"; do
  name=${arg%%:*}; limit=${arg#*:}; [ "$limit" = "$arg" ] && limit=""
  case $name in
    env) step env ${limit:-30} bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
         python3 -c "import sys, cupy, torch; print(sys.version.split()[0], \"cupy\", cupy.__version__, \"torch\", torch.__version__)"' ;;
    tests) step tests ${limit:-300} python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS_ARGS:-tests/} ;;
    conformance) step conformance ${limit:-90} $D conformance --backend cupy --out $R/conformance ;;
    ladder) TAIL=24 step ladder ${limit:-200} $D ladder --backend cupy --preset ds4-flash --stages 0,0s,i,i+,1,2,3,3u \
         --out $R/ladder ;;
    islands) TAIL=16 step islands ${limit:-120} $D ladder --backend cupy --preset ds4-flash --stages 0,i,i+,3 \
         --tokens 40 --repeats 2 --out $R/islands ;;
    context) TAIL=34 step context ${limit:-300} $D context --backend cupy --preset ds4-flash --stages 0,i,i+,2,3,3c \
         --contexts 1024,4096,16384,65536 --tokens 32 --out $R/context ;;
    capture-stages) TAIL=40 step capture-stages ${limit:-540} bash -c "$D context --backend cupy --preset ds4-flash \
         --stages 3,3c,3cc,3p,3cp,3ccp --contexts 1024,4096,16384,65536 --tokens ${CS_TOKENS:-64} --repeats 4 \
         --out $R/capture-stages && if [ ${CS_LADDER:-1} = 1 ]; then $D ladder --backend cupy --preset ds4-flash \
         --stages 0,3,3p --tokens 96 --repeats 4 --out $R/capture-stages-ladder; fi" ;;
    hazards) TAIL=30 step hazards ${limit:-200} bash -c "$D hazards all --backend cupy --preset small --out $R/hazards &&
         $D hazards all-longctx --backend cupy --preset small --out $R/hazards-longctx &&
         $D hazards moe-profile-island --backend cupy --preset ds4-flash --out $R/hazards-island" ;;
    exclusion) step exclusion ${limit:-200} $D exclusion --backend cupy --out $R/exclusion ;;
    moe) TAIL=20 step moe ${limit:-150} $D moe --backend cupy --preset ds4-flash --mode host-timed,deferred,in-graph,nvtx \
         --tokens-per-step 1 --routing uniform --steps 3 --share-tokens 0 --out $R/moe ;;
    bench) TAIL=30 step bench ${limit:-200} $D bench --preset ds4-flash --per-op --out $R/bench ;;
    kernels) step kernels ${limit:-120} python3 scripts/bench_kernels.py --out $R/kernels ;;
    calibrate) step calibrate ${limit:-200} bash -c "$D calibrate --preset ds4-flash --out $R/calibration/h200.json &&
         $D calibrate --long-context --base $R/calibration/h200.json --out $R/calibration/h200-long.json &&
         if [ -d $R/islands ]; then $D calibrate --from-ladder $R/islands --base $R/calibration/h200-long.json \
         --out $R/calibration/h200-host.json; fi" ;;
    torch-rules) TAIL=20 step torch-rules ${limit:-120} python3 -m ds4lab.audit.torch_rules --out $R/torch-rules ;;
    replay-kernels) TAIL=20 step replay-kernels ${limit:-150} python3 scripts/replay_kernels.py --out $R/replay-kernels \
         --dtype ${RK_DTYPE:-bfloat16} ${RK_RUNS:-llama/dynamic llama/static} ;;
    audit) # AUDIT_ARGS: one or more argument sets separated by ';', each its own run of audit validate (and
         # folder: audit, audit-2, ...; each with the step's limit), to be joined on the CPU with --runs-from
         IFS=';' read -ra sets <<< "${AUDIT_ARGS:-}"; [ ${#sets[@]} -eq 0 ] && sets=("")
         i=0; for a in "${sets[@]}"; do i=$((i + 1)); n=audit; [ $i -gt 1 ] && n=audit-$i
           # shellcheck disable=SC2086 # each set is words
           TAIL=30 step $n ${limit:-300} $D audit validate $a --out $R/$n; done ;;
    steps-truth) # shellcheck disable=SC2086 # STEPS_FAMILIES is words
         TAIL=70 step steps-truth ${limit:-540} bash ds4lab/data/steps/run_all.sh $R/steps-truth ${STEPS_FAMILIES:-} ;;
    arguments-cost) TAIL=30 step arguments-cost ${limit:-240} bash -c "python3 scripts/arguments_cost.py --out \
         $R/arguments-cost; python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_audit_record_gpu.py" ;;
    fixtures) step fixtures ${limit:-300} python3 scripts/make_audit_fixtures.py ${FIXTURE_ARGS:-} --out $R/audit_args ;;
    audit-ds4) TAIL=40 step audit-ds4 ${limit:-120} bash -c "$D trace --backend cupy --preset ds4-flash --stages 0,3 \
         --tokens 8 --out $R/trace-audit && $D audit $R/trace-audit/trace.json --out $R/audit-ds4" ;;
    notebooks) step notebooks ${limit:-400} $D notebooks --out $R/notebooks ;;
    nb06) # notebook 06 on this GPU, reading the ds4 step's folder (this call's, or one kept by an earlier call)
         src=$R/${DS4_NAME:-ds4}; [ -f $src/meta.json ] || src=/tmp/ds4lab-cache/results/${DS4_NAME:-ds4}
         step nb06 ${limit:-120} $D notebooks 06 --set DS4_RESULTS=$src --set CONTEXTS=${NB06_CONTEXTS:-1024,4096} \
           --set BACKEND=cupy --out $R/nb06 ;;
    nsight) step nsight ${limit:-300} bash -c "ncu --nvtx --nvtx-include 'ds4lab@token/' --launch-count 300 \
           --section SpeedOfLight --section LaunchStats --csv $D run --backend cupy --preset ds4-flash --tokens 1 \
           --warmup 0 --nvtx --no-check --out $R/ncu-run > $R/ncu.csv 2> $R/ncu.stderr;
         $D ingest $R/ncu.csv --sites ds4-flash --out $R/ncu && $D compare $R/ncu --out $R/ncu-compare &&
         $D trace --backend cupy --preset ds4-flash --stages 0,3 --out $R/trace" ;;
    ds4) # a build made on an earlier machine of this kind comes back as $OUT/ds4build-{lib,obj}.tar.xz (the
         # library, and ds4's objects and headers for relinking a new driver); put into .ds4build/ and
         # carried, it is ds4lab's cached build here (ds4's own build takes minutes)
         mkdir -p /tmp/ds4lab-cache/ds4
         for t in .ds4build/ds4build-*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C /tmp/ds4lab-cache/ds4; done
         TAIL=40 step ds4 ${limit:-540} $D ds4 --source ${DS4_SOURCE:-.ds4src/ds4-b0309611.tar.gz} \
         --cache /tmp/ds4lab-cache ${DS4_ARGS:-} --out $R/${DS4_NAME:-ds4}
         # kept for a later call's nb06 on the same machine ($R is emptied at each call's start)
         grep -q '"status": "complete"' $R/${DS4_NAME:-ds4}/meta.json 2>/dev/null && rm -rf /tmp/ds4lab-cache/results/${DS4_NAME:-ds4} &&
           mkdir -p /tmp/ds4lab-cache/results && cp -r $R/${DS4_NAME:-ds4} /tmp/ds4lab-cache/results/
         # DS4_PACK_BUILD=0: the builds came with the call (.ds4build/) and need not go back
         [ "${DS4_PACK_BUILD:-1}" = 1 ] && (cd /tmp/ds4lab-cache/ds4 && ls build-*/build.json >/dev/null 2>&1 &&
          XZ_OPT=-T0 tar cJf "$OUT/ds4build-lib.tar.xz" --exclude='*/src' build-*/build.json build-*/build.log \
            build-*/libds4lab_ds4.so &&
          find build-*/src \( -name '*.o' -o -name '*.h' \) -print0 | XZ_OPT=-T0 tar cJf "$OUT/ds4build-obj.tar.xz" \
            --null -T -) ;;
    *) echo "unknown step $name" | tee -a $R/steps.txt; pack ;;
  esac
done
cat $R/steps.txt 2>/dev/null || echo "no steps named: bash scripts/gpu_round.sh STEP[:SECONDS] ..."
