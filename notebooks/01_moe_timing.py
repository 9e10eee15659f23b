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
# # Where routed-MoE time goes
#
# ds4's routed MoE in six stages (`xq`, `sort`, `gateup`, `midq`, `down`, `sum`), timed by stage,
# token count (1 decode, 2–3 MTP verification, batches) and routing pattern (uniform, Zipf-skewed,
# hash-routed layers, worst case), and its share of a whole decode token. On a GPU the times are
# measured (CUDA events read after each step, no mid-token synchronization); on the simulated
# runtime they are modeled and every figure says so. Parameters in the next cell.

# %% tags=["parameters"]
BACKEND = "auto"
PRESET = None  # None: ds4-flash on a GPU, small on the sim
TOKENS_PER_STEP = "1,2,3,64,512"  # counts above the preset's max_tokens are left out
ROUTINGS = "all"
MODES = "deferred"
STEPS = 10
ROUTING_SHOWN = None  # the routing whose distribution is drawn (None: the first profiled; a dropdown in JupyterLab)
OUT = "results/nb-moe"

# %%
from pathlib import Path

from ds4lab import Lab

lab = Lab(BACKEND, preset=PRESET)
moe = lab.moe(tokens_per_step=TOKENS_PER_STEP, routings=ROUTINGS, modes=MODES, steps=STEPS, out=OUT, overhead=False)
print(moe.label())

# %% [markdown]
# ## Median µs per routed-MoE call and stage, by token count and routing

# %%
print(f"{moe.label()}; µs per call")
lab.moe_stages(moe).round(1)

# %%
moe.figure("moe-stages")

# %%
lab.moe_distribution(moe, routing=ROUTING_SHOWN)

# %%
moe.figures.get("moe-share", "no share figure: the job ran without share tokens")

# %% [markdown]
# ## The same numbers in ds4's own format
#
# `ds4lab ingest` reads these lines (and a real ds4 run's `DS4_CUDA_MOE_PROFILE` stderr) back into
# the same table, so a real engine run and this workbench can be compared side by side.

# %%
# ds4's own profile lines (DS4_CUDA_MOE_PROFILE format), one file per mode and routing
log = sorted(Path(OUT).glob("moe-ds4-*.log"))[0]
print(log.name)
for line in log.read_text().splitlines()[:8]:
    print(line)
