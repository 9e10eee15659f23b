# Sourced by scripts/ds4lab.sh and scripts/test.sh: make .venv once, install ds4lab into it,
# and add CuPy when an NVIDIA GPU is visible (cuda12 wheels unless DS4LAB_CUPY_EXTRA says cuda13).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
extras="test,nvrtc"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="$extras,${DS4LAB_CUPY_EXTRA:-cuda12}"
fi
stamp=.venv/.ds4lab-installed
# Reinstall when pyproject.toml changed or the extras did (a GPU appeared, another CuPy wheel).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$(cat "$stamp")" != "$extras" ]; then
  echo "ds4lab: installing into .venv with extras [$extras] (first use: about a minute, needs the package index)" >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q -e ".[$extras]"
  echo "$extras" > "$stamp"
fi
