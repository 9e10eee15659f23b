#!/usr/bin/env bash
# The test command: set up .venv on first use, then the whole suite (GPU tests skip without a GPU).
source "$(dirname "$0")/venv.sh"
exec python -m pytest -q "$@"
