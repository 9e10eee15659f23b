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
# # Audit an engine's decode step: what a CUDA-graph capture would refuse, break or get wrong
#
# `ds4lab audit` reads a trace of an engine's decode loop (a PyTorch profiler JSON, an Nsight Systems
# SQLite export, ds4lab's own `trace.json`, or a recording made in-process) and, for every API call
# and launch of a decode token, says what stream capture would do with it in each capture mode: allowed,
# refused, invalidates the capture, not in the graph (host work a replay would skip), or frozen (a grid,
# launch count or by-value argument that changes between tokens). It then proposes the capturable spans
# and models what each capture plan would save (MODELED, from the trace's measured kernel times and the
# H200 calibration).
#
# The engine here is a transformers model built from its config with random weights (no download):
# recorded live on a GPU with PyTorch (into `OUT/engine`), otherwise one of the decode loops bundled
# with ds4lab (recorded on an H200, with what `torch.cuda.graph` did with the same step on that GPU).
# Set `TRACE` to audit your own engine's trace instead. The audit's results go to `OUT/audit`.
# Parameters in the next cell.

# %% tags=["parameters"]
BACKEND = "auto"  # auto: record live where torch sees a GPU, else the bundled recording; cupy: live; sim: bundled
ENGINE = "llama"  # llama, deepseek-v3, qwen2-moe (bundled: llama, deepseek-v3)
CACHE = "dynamic"  # dynamic (DynamicCache), static (StaticCache)
TRACE = None  # a trace file of your own engine: audited instead of ENGINE
TOKEN_RANGE = "decode_step"  # the NVTX range around one decode token (None: found by period)
OUT = "results/nb-audit"

# %%
from pathlib import Path

from ds4lab import Lab

lab = Lab(BACKEND, out=OUT)
source = lab.engine(ENGINE, CACHE, TRACE)
print(source.note)

# %% [markdown]
# ## The audit
#
# The terminal summary below is what `ds4lab audit TRACE --token-range decode_step` prints; the result
# folder holds every table (`audit.csv`, `tokens.csv`, `spans.csv`, `plans.csv`) and the figure.

# %%
reports = lab.audit(files=(str(source.trace),), token_range=TOKEN_RANGE, out=Path(OUT) / "audit").value
rep = reports[0]

# %% [markdown]
# ## Findings: each call and launch a capture would not take as it is
#
# One row per finding (the same call at the same place counts once, over the tokens it occurs in);
# `verdict_<mode>` per capture mode, `where` the Python line or NVTX range it comes from, `fix` what
# would make it capturable.

# %%
f = rep.findings
cols = ["kind", "call_class", "verdict_global", "verdict_relaxed", "tokens", "count", "where", "fix"]
f[cols].assign(name=f["name"].str.slice(0, 60)).set_index("name") if not f.empty else "no findings: every call is allowed"

# %% [markdown]
# ## Tokens, spans and plans
#
# `tokens`: each decode token as measured in the trace (µs from its first call to the next token's, GPU
# busy µs, launches, its launch-list shape). `plans`: µs per token of each capture plan, **MODELED**
# (the trace's measured kernel times, the H200 calibration's launch and replay costs), the saving a
# paired difference against the measured eager tokens with its 95 % interval.

# %%
rep.token_table[["token", "eager_us", "gpu_busy_us", "kernels", "api_calls", "shape"]].round(1)

# %%
rep.plans[["plan", "mode", "graphs_per_token", "predicted_us", "eager_measured_us", "saving_us", "saving_lo",
           "saving_hi", "measurable", "calibration"]].round(1)

# %%
lab.audit_figure(rep)

# %% [markdown]
# ## Against what torch.cuda.graph did
#
# For the engines ds4lab builds, the same decode step was captured with `torch.cuda.graph` (capture
# mode global) and replayed against the eager step (`ds4lab audit validate`): the audit's verdict on
# the whole token should name the outcome (`verdict_agrees`), and the whole-token plan's µs (MODELED)
# the measured replay within 20 % (`time_agrees`). The audit says a step *replays right* only when its
# tokens' kernel arguments were compared (`ds4lab audit run` records them in a second, untimed pass);
# a recording without them, such as the bundled ones, gets *captures; replay correctness unknown from
# this trace* with the command that records what is missing, and `verdict_agrees` is then False.

# %%
lab.against_torch(rep, source)
