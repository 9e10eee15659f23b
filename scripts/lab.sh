#!/usr/bin/env bash
# Open the notebooks in JupyterLab, in the project's own environment (adds the notebooks extra once).
#
# - Installs ds4lab's "notebooks" extra only when JupyterLab is missing or pyproject.toml changed
#   since the last install (stamp: .venv/.ds4lab-notebooks-installed), not on every start.
# - Runs as root too (containers): JupyterLab refuses root unless told, so --allow-root is added.
# - The notebooks' kernels start in the checkout's root (DS4LAB_LAB_CWD overrides it), so a
#   notebook's OUT = "results/nb-..." lands in results/ beside the command line's results, as the
#   README says, whichever folder the notebook sits in; done by an IPython start-up file in a
#   profile of this environment's own (IPYTHONDIR=.venv/ipython), not the user's.
# - DS4LAB_NOTEBOOKS picks the folder JupyterLab opens (default: notebooks/).
# Extra arguments go to jupyter lab (e.g. --no-browser --port 8899).
source "$(dirname "$0")/venv.sh"
stamp=.venv/.ds4lab-notebooks-installed
if [ ! -x .venv/bin/jupyter-lab ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "ds4lab: installing the notebooks extra (JupyterLab) into .venv" >&2
  python -m pip install -q -e ".[notebooks]"
  touch "$stamp"
fi
export DS4LAB_LAB_CWD="${DS4LAB_LAB_CWD:-$ROOT}"
export IPYTHONDIR="$ROOT/.venv/ipython"
mkdir -p "$IPYTHONDIR/profile_default/startup"
cat > "$IPYTHONDIR/profile_default/startup/00-ds4lab-cwd.py" <<'PY'
# Written by scripts/lab.sh: kernels start in the ds4lab checkout, so relative OUT folders land in results/.
import os as _os

_d = _os.environ.get("DS4LAB_LAB_CWD")
if _d and _os.path.isdir(_d):
    _os.chdir(_d)
del _os, _d
PY
args=()
if [ "$(id -u)" = "0" ]; then
  args+=(--allow-root)
fi
exec jupyter lab ${args[@]+"${args[@]}"} "${DS4LAB_NOTEBOOKS:-notebooks/}" "$@"  # (bash 3.2: no empty-array expansion under set -u)
