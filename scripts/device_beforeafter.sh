#!/usr/bin/env bash
# One device session: the same ladder, exclusion matrix and conformance suite on an earlier tree
# (.before/, carried) and on this one, alternated, so a structural change can be shown to leave the
# verdicts and figures unchanged. Results: $OUT/beforeafter.tgz.
set -u
source scripts/device_env.sh
export COLUMNS=160
R=/tmp/ba; rm -rf $R; mkdir -p $R
SITE=/tmp/site
step() { local tree=$1 tag=$2; shift 2; echo; echo "=== $tag ($tree)";
  (cd "$tree" && PYTHONPATH=$SITE:$PWD timeout 400 python3 -m ds4lab.cli "$@") > $R/$tag.log 2>&1; echo "exit $?" >> $R/$tag.log; tail -n 25 $R/$tag.log; }
step .before ladder-before ladder --backend cupy --preset ds4-flash --out $R/ladder-before
step .       ladder-after  ladder --backend cupy --preset ds4-flash --out $R/ladder-after
step .before excl-before exclusion --backend cupy --out $R/excl-before
step .       excl-after  exclusion --backend cupy --out $R/excl-after
step .before conf-before conformance --backend cupy --out $R/conf-before
step .       conf-after  conformance --backend cupy --out $R/conf-after
tar czf $OUT/beforeafter.tgz -C /tmp ba
