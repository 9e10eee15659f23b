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
# # Profiling and capture: which measurements survive, and what each hazard does
#
# Part 1: the profiling × capture matrix, computed by running every combination: each MoE profiling
# mode eagerly (legacy and non-blocking stream), under capture in each mode, and on replay. Part 2:
# each ds4-today code path re-introduced into a captured stage: a refused capture with its CUDA
# error and the eager fallback, or a capture that succeeds and replays wrong. Part 3: the
# capture-compatible ways to measure, side by side. Parameters in the next cell.

# %% tags=["parameters"]
BACKEND = "auto"
PRESET = None
HAZARD_PRESET = None  # None: the hazards job's default (ds4-flash on a GPU, small on the sim)
OUT = "results/nb-capture"

# %%
from pathlib import Path

from ds4lab import Lab

lab = Lab(BACKEND)
exclusion = lab.exclusion(preset=PRESET, out=Path(OUT) / "exclusion")
exclusion.table().pivot(index="mode", columns="column", values="outcome")

# %%
exclusion.figure("exclusion")

# %% [markdown]
# ## Each hazard, demonstrated

# %%
h = lab.hazards(hazard="all", preset=HAZARD_PRESET, out=Path(OUT) / "hazards").table("hazards")
h[["hazard", "outcome", "errors", "exact", "first_mismatch", "expected"]]

# %% [markdown]
# ## Capture-compatible measurement
#
# `host-timed` (ds4's way) cannot run inside a capture. What can: `deferred` events eagerly,
# `graph-boundary` events between replays (total only), `in-graph` timestamps written by a kernel
# inside the graph, and per-kernel activity records (CUPTI on a GPU; the modeled timeline on the
# sim). Overhead of each on a whole token, eager and replayed:

# %%
modes = lab.moe(modes=["deferred", "in-graph", "graph-boundary", "cupti"], tokens_per_step=[1], routings=["uniform"],
                steps=5, share_tokens=0, preset=PRESET, out=Path(OUT) / "modes")
modes.tables.get("overhead", "no overhead table")

# %%
print(modes.label(), "· median µs per call and stage, by mode")
lab.moe_stages(modes).round(2)
