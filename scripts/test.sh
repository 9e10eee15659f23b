#!/usr/bin/env bash
# The test command: set up .venv on first use, then the suite without the tests marked `slow` (GPU tests
# skip without a GPU). `bash scripts/test.sh -m slow` runs the slow ones (CI runs both, in steps of their
# own: .ci/run); a -m given here replaces the default, other pytest options pass through.
source "$(dirname "$0")/venv.sh"
marker=(-m "not slow")
for a in "$@"; do
  case $a in -m|-m*|--markexpr|--markexpr=*) marker=() ;; esac
done
exec python -m pytest -q "${marker[@]}" "$@"
