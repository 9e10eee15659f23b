#!/usr/bin/env bash
# The test command: set up .venv on first use, then the suite without the tests marked `slow` (GPU tests
# skip without a GPU). `bash scripts/test.sh -m slow` runs the slow ones (CI runs both, in steps of their
# own: .ci/run); a -m given here replaces the default, other pytest options pass through.
# Without a GPU the tests run in DS4LAB_TEST_WORKERS processes (default 2; pytest-xdist, a test file's tests
# kept in one process and in order); with one they run in one process, so GPU timings never share the device.
source "$(dirname "$0")/venv.sh"
marker=(-m "not slow")
workers=(-n "${DS4LAB_TEST_WORKERS:-2}" --dist loadfile)
if [ "${DS4LAB_TEST_WORKERS:-2}" = "0" ] || ! python -c "import xdist" 2>/dev/null \
   || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  workers=()
fi
for a in "$@"; do
  case $a in
    -m|-m*|--markexpr|--markexpr=*) marker=() ;;
    -n|-n*|--numprocesses|--numprocesses=*|--collect-only|--co) workers=() ;;
  esac
done
exec python -m pytest -q "${marker[@]}" "${workers[@]}" "$@"
