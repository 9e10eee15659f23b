#!/usr/bin/env bash
# The wheels scripts/gpu_round.sh installs on the lent GPU machine (it reaches no package index):
# what ds4lab needs there that the machine's image lacks, for its Python 3.12 on x86_64, in .whl/
# (carry it: `carry: [".whl", ...]`). The image's own packages (numpy, pandas, torch, requests, pyyaml,
# ... : the device tool's KINDS.md lists them) are left out, so a carried wheel never shadows one of them.
#
#   bash scripts/gpu_wheels.sh        # then .whl/ holds about 15 MB
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
plat=(--python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux_2_28_x86_64)
# cupti-python pins nvidia-cuda-cupti, which the image carries: no dependencies for it and nvtx
python3 -m pip download -q "${plat[@]}" --no-deps -d .whl "nvtx==0.2.17" "cupti-python==13.0.1"
python3 -m pip download -q "${plat[@]}" -d .whl "gguf>=0.17,<0.20" ijson jsonschema papermill jupytext ipykernel \
  nbclient nbformat
# in the image already (KINDS.md, "Python packages already there")
for name in numpy attrs certifi charset_normalizer click idna markdown_it_py mdurl packaging psutil pygments \
            python_dateutil pyyaml PyYAML requests tqdm typing_extensions urllib3 six; do
  rm -f .whl/"$name"-*.whl
done
ls .whl
