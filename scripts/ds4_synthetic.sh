#!/usr/bin/env bash
# The synthetic Flash-shaped model ds4 opens (docs/model.md, "The synthetic model ds4 opens"), in the
# project's environment, from any folder:
#   bash scripts/ds4_synthetic.sh write PATH [--preset ds4-flash] [--seed 0] [--dense random|holes]
#   bash scripts/ds4_synthetic.sh check PATH [inspect|cpu] [--tokens N] [--ctx C] [--threads T]
# `write` writes the sparse GGUF (ds4-flash: 80.8 GiB apparent, 8.2 GiB written, about a minute);
# `check` builds ds4's CPU loader from ../shared/ds4 in $TMPDIR/ds4lab-ds4-cpu-<sha> (once, ~10 s)
# and asks ds4 to open PATH; `cpu --tokens 3` also decodes 3 tokens on ds4's CPU backend
# (ds4-flash: ~30 s for the first token, 5-10 s for the next ones on 2 cores).
caller="$PWD"
source "$(dirname "$0")/venv.sh"
cd "$caller"
cmd="${1:-}"
shift || true
case "$cmd" in
  write) exec "$ROOT/.venv/bin/python" -m ds4lab.ds4.gguf_writer "$@" ;;
  check) exec "$ROOT/.venv/bin/python" -m ds4lab.ds4.open_check "$@" ;;
  *) echo "usage: $0 write PATH [options] | check PATH [inspect|cpu] [options]" >&2; exit 2 ;;
esac
