"""Per-launch-site roofline of one decode token (``ds4lab.measure.perop``; GPU only).

Usage: ``python scripts/profile_ops.py [preset] [out_dir] [--events]``

Prints the per-site table (sorted by µs lost against the copy bandwidth) and the token's
GPU-busy time against its bytes-moved floor; with ``out_dir``, writes ``per_op.csv``,
``per_op_launches.csv``, ``per_op.png/.svg/.pdf`` and ``per_op.json`` (the token summary).
Kernel time from CUPTI kernel records when ``cupti-python`` works, else (or with ``--events``)
from CUDA events around back-to-back re-issues of each launch.
"""
import json
import sys
from pathlib import Path

from rich.console import Console

from ds4lab.backends import make_backend
from ds4lab.token.config import get_preset
from ds4lab.measure.perop import run_per_op

args = [a for a in sys.argv[1:] if not a.startswith("--")]
preset = args[0] if args else "ds4-flash"
out = Path(args[1]) if len(args) > 1 else None
be = make_backend("cupy")
be.compile_all()
res = run_per_op(be, get_preset(preset), Console(width=160), out,
                 method="events" if "--events" in sys.argv else "auto")
if out:
    (out / "per_op.json").write_text(json.dumps(res, indent=2) + "\n")
