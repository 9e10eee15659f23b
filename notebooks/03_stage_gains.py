# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # What each stage of the capture plan buys
#
# The stage ladder on this machine (measured on a GPU, modeled on the simulated runtime), the
# exactness of every stage against stage 0, the GPU-busy floor, and a what-if sweep on the
# simulated runtime: how the gain of capture moves with the number of layers, the host cost of a
# launch and the tokens per step. Parameters in the next cell.

# %% tags=["parameters"]
BACKEND = "auto"
PRESET = None
STAGES = "0,0s,i,i+,1,2,3,3u"
TOKENS = 200
OUT = "results/nb-stage-gains"
SWEEP_LAYERS = [4, 8, 16, 43]
SWEEP_LAUNCH_US = [2.0, 5.0, 9.4, 15.0]
SWEEP_TOKENS = [1, 2, 3, 16, 64, 512]

# %%
from pathlib import Path

from ds4lab import Lab

lab = Lab(BACKEND, preset=PRESET)
ladder = lab.ladder(stages=STAGES, tokens=TOKENS, out=OUT)
ladder.table()[["stage", "description", "us_median", "speedup", "efficiency", "exact", "captures", "replays",
                "retirements"]]

# %% [markdown]
# ## Which hazard fixes each stage needs

# %%
lab.stages()

# %%
ladder.figure("ladder")

# %% [markdown]
# ## What-if sweeps (simulated runtime, modeled)
#
# Eager (stage 0) against whole-token capture (stage 3) on the timing-only simulated runtime with
# the shipped H200 calibration: over the number of layers at `ds4-flash` dimensions, and over the
# host cost of one eager launch (what a faster or slower launch path would change); then one
# routed-MoE call, eager against a replayed graph, over the tokens per step (1: decode; 2–3: MTP
# verification; more: batches on the sorted path). Every number here is modeled, whatever machine
# runs the notebook.

# %%
whatif = lab.whatif(layers=SWEEP_LAYERS, launch_us=SWEEP_LAUNCH_US, tokens_per_step=SWEEP_TOKENS)
whatif.table("layers")

# %%
whatif.table("launch")

# %%
whatif.table("tokens")

# %%
lab.save(whatif.figure("whatif"), Path(OUT) / "whatif")
