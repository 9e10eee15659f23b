#!/usr/bin/env bash
# Open the notebooks in JupyterLab, in the project's own environment (adds the notebooks extra).
source "$(dirname "$0")/venv.sh"
python -m pip install -q -e ".[notebooks]"
exec jupyter lab notebooks/ "$@"
