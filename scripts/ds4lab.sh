#!/usr/bin/env bash
# Run any ds4lab command in the project's own environment (set up on first use), from any folder:
#   bash scripts/ds4lab.sh ladder         # the main job (the stage ladder) on its embedded default
# The command runs in the caller's working directory (relative paths such as `ingest run.log` and
# the default results/ folder are the caller's); only the set-up runs in the checkout.
caller="$PWD"
source "$(dirname "$0")/venv.sh"
cd "$caller"
exec "$ROOT/.venv/bin/ds4lab" "$@"
