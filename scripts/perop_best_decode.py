"""Per-op roofline (``scripts/profile_ops.py``) of a preset with the faster of ds4's decode kernel
families, as measured by ``scripts/time_moe_decode.py`` (GPU only).

Usage: ``python scripts/perop_best_decode.py TIMING_CSV PRESET OUT_DIR``: reads the per-kernel CSV,
takes the family (``ops.DS4_DECODE_KERNELS``) whose gate/up plus down median µs is lower for PRESET,
and writes the per-op tables of one eager ds4-flash-sized token with it into OUT_DIR.
"""
import runpy
import sys

import pandas as pd

from ds4lab.token import ops

csv, preset, out = sys.argv[1:4]
df = pd.read_csv(csv)
d = df[(df["preset"] == preset) & df["site"].isin(["gateup", "down"])].groupby("decode")["us_median"].sum()
ops.DS4_DECODE_KERNELS = str(d.idxmin()) if len(d) else ops.DS4_DECODE_KERNELS
print(f"{preset}: decode kernels {ops.DS4_DECODE_KERNELS} (gate/up + down µs: {d.round(2).to_dict()})")
sys.argv = ["profile_ops.py", preset, out]
runpy.run_path(str(__import__("pathlib").Path(__file__).with_name("profile_ops.py")), run_name="__main__")
