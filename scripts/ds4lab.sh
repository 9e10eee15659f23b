#!/usr/bin/env bash
# Run any ds4lab command in the project's own environment (set up on first use):
#   bash scripts/ds4lab.sh ladder         # the main job (the stage ladder) on its embedded default
source "$(dirname "$0")/venv.sh"
exec ds4lab "$@"
