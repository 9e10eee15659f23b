#!/usr/bin/env bash
# Ground truth of every decode-step family: `--truth` for each family x cache x dtype, one JSON each.
#
# usage: run_all.sh OUT_DIR [FAMILY ...]
#   OUT_DIR   folder for <family>__<cache>__<dtype>.json (made if missing)
#   FAMILY    only these families (script names without .py); default: every family script here
# env: PYTHON (default python3), TIMEOUT per run in seconds (default 120), FORCE=1 to redo runs whose
#      JSON already exists (by default they are kept and skipped, so a split or interrupted run resumes).
#
# Needs a CUDA GPU. One run failing or timing out does not stop the others; its stderr is kept in
# OUT_DIR/<family>__<cache>__<dtype>.log. Prints one line per run, then a table of all results.
set -u
if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [FAMILY ...]" >&2
    exit 2
fi
out=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
limit=${TIMEOUT:-120}
mkdir -p "$out" || exit 2

if [ $# -gt 0 ]; then
    families=("$@")
else
    families=()
    for f in "$here"/*.py; do
        name=$(basename "$f" .py)
        case $name in _*) continue ;; esac
        families+=("$name")
    done
fi

start_all=$SECONDS
for fam in "${families[@]}"; do
    script="$here/$fam.py"
    if [ ! -f "$script" ]; then
        echo "$fam: no such family script ($script)" >&2
        continue
    fi
    listing=$("$py" "$script" --list) || { echo "$fam: --list failed" >&2; continue; }
    read -r -a caches < <(echo "$listing" | "$py" -c 'import json,sys; print(" ".join(json.load(sys.stdin)["caches"]))')
    read -r -a dtypes < <(echo "$listing" | "$py" -c 'import json,sys; print(" ".join(json.load(sys.stdin)["dtypes"]))')
    for cache in "${caches[@]}"; do
        for dtype in "${dtypes[@]}"; do
            json="$out/${fam}__${cache}__${dtype}.json"
            if [ -f "$json" ] && [ "${FORCE:-0}" != 1 ]; then
                echo "$fam $cache $dtype: kept $json"
                continue
            fi
            t0=$SECONDS
            timeout -k 10 "$limit" "$py" "$script" --cache "$cache" --dtype "$dtype" --truth "$json" \
                >"$out/${fam}__${cache}__${dtype}.log" 2>&1
            rc=$?
            echo "$fam $cache $dtype: rc $rc, $((SECONDS - t0)) s"
        done
    done
done
echo "all runs: $((SECONDS - start_all)) s"

"$py" - "$out" <<'EOF'
import glob, json, os, sys

rows = [("family", "cache", "dtype", "outcome", "first wrong", "eager us", "replay us", "kernels")]
runs = sorted({os.path.splitext(p)[0] for p in glob.glob(os.path.join(sys.argv[1], "*__*__*.json"))}
              | {os.path.splitext(p)[0] for p in glob.glob(os.path.join(sys.argv[1], "*__*__*.log"))})
for run in runs:
    if not os.path.exists(run + ".json"):
        rows.append((*os.path.basename(run).split("__"), "no result: see .log", "", "", "", ""))
        continue
    with open(run + ".json", encoding="utf-8") as f:
        r = json.load(f)
    rows.append((r["family"], r["cache"], r["dtype"], r["outcome"], str(r["first_wrong_position"]),
                 str(r["eager_us"]), str(r["replay_us"]), str(r["graph_kernels"])))
widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
for row in rows:
    print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
EOF
