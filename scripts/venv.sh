# Sourced by scripts/ds4lab.sh and scripts/test.sh: make .venv once, install ds4lab into it with the
# test and NVRTC extras, and add CuPy and CUPTI when an NVIDIA GPU is visible. One CUDA major for all
# of them: 12 unless DS4LAB_CUPY_EXTRA=cuda13 (extras test,nvrtc13[,cupti13,cuda13]; pyproject.toml).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
case "${DS4LAB_CUPY_EXTRA:-cuda12}" in
  cuda12) major=12 ;;
  cuda13) major=13 ;;
  *) echo "ds4lab: DS4LAB_CUPY_EXTRA=${DS4LAB_CUPY_EXTRA}: choose cuda12 or cuda13" >&2; return 2 2>/dev/null || exit 2 ;;
esac
extras="test,nvrtc$major"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="$extras,cupti$major,cuda$major"
fi
stamp=.venv/.ds4lab-installed
# Reinstall when pyproject.toml changed or the extras did (a GPU appeared, another CuPy wheel).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$(cat "$stamp")" != "$extras" ]; then
  echo "ds4lab: installing into .venv with extras [$extras] (first use: about a minute, needs the package index)" >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q -e ".[$extras]"
  echo "$extras" > "$stamp"
fi
