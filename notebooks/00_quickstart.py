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
# # ds4lab quickstart: one ds4-shaped decode token
#
# One decode token of the ds4 engine's CUDA back end, rebuilt from ds4lab's own kernels: its launch
# census, its NVTX structure, a first stage ladder and one token on a timeline. Runs on a GPU
# (measured) and on a laptop (the simulated runtime: every figure is **modeled**, and says so).
# Parameters are in the next cell; `ds4lab notebooks 00 --set NAME=VALUE` runs it headlessly with
# other values.

# %% tags=["parameters"]
BACKEND = "auto"  # "cupy" (GPU), "sim" (simulated runtime), or "auto"
PRESET = None  # "ds4-flash", "small", "tiny"; None: ds4-flash on a GPU, small on the sim
STAGES = "0,0s,i,i+,1,2,3,3u"  # the ladder's stages
TOKENS = 200  # timed tokens per stage
TRACE_LAYERS = 2  # layers of the timeline shown (a dropdown in JupyterLab)
OUT = "results/nb-quickstart"

# %%
from pathlib import Path

from ds4lab import Lab

lab = Lab(BACKEND, preset=PRESET)
tok = lab.token()
print(tok.label)

# %% [markdown]
# ## One token and its launch census
# Every launch goes through the stream accessor; the census counts launches by cluster and kind.

# %%
tok.by_kind

# %%
tok.by_cluster

# %% [markdown]
# ## NVTX structure
#
# With `nvtx=True`, each token is a range in the `ds4lab` domain (payload: position), each layer a
# range (payload: layer), each cluster a range in its own category, each op a range. Under Nsight
# Systems (`nsys profile -t cuda,nvtx`) these group the timeline; here we list the nesting the
# launch layer produces for one layer.

# %%
tok.ranges(layer=0)

# %% [markdown]
# ## A first stage ladder

# %%
ladder = lab.ladder(stages=STAGES, tokens=TOKENS, out=OUT)
ladder.table()[["stage", "short", "us_median", "us_p25", "us_p75", "speedup", "efficiency", "kernel_launches",
                "graph_launches", "exact"]]

# %%
ladder.figure("ladder")

# %% [markdown]
# ## One token on a timeline: eager against replayed
#
# `ds4lab trace`: one token of stage 0 (eager) and one of stage 3 (the whole token replayed as one
# graph), each kernel named by its launch site, under ds4lab's NVTX ranges (CUPTI records on a GPU;
# the simulated runtime's modeled schedule, labelled MODELED, on the sim). In the figure, look at the
# GPU lanes: the eager token's kernels sit apart, each waiting for the host to launch the next
# (the launch gaps, host-bound: busy a fraction of its span), while the replayed token's kernels run
# back to back (busy close to 100 % of a much shorter span); its host lane holds the scalars' write
# and one graph launch instead of one range per op. Open `trace.json` in ui.perfetto.dev or
# chrome://tracing for the whole token. `TRACE_LAYERS` sets how many layers the figure shows.

# %%
try:
    tr = lab.trace(stages="0,3", tokens=2, out=Path(OUT) / "trace")
    print(f"open {tr.where('trace.json')} in ui.perfetto.dev or chrome://tracing")
except lab.TraceError as e:  # a GPU without CUPTI (pip install cupti-python): no kernel timeline here
    tr = None
    print(f"no trace: {e}")

# %%
lab.timeline(tr, first_layers=TRACE_LAYERS) if tr is not None else None
