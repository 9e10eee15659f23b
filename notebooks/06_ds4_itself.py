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
# # ds4 itself beside ds4lab's rebuild of it
#
# Every other notebook measures ds4lab's rebuild of ds4's decode token: its own CuPy kernels, launched
# from Python. This one holds those figures to ds4 itself: `ds4lab ds4` builds ds4 from its source
# (ds4's own Makefile objects, with ds4lab's driver), writes a Flash-shaped GGUF with synthetic weights
# that ds4's loader opens (docs/model.md, "The synthetic model ds4 opens"), and runs ds4's decode token
# at each context with its decode islands off and on and with its MoE profile (docs/ds4.md).
#
# Side by side: the launch census per token, host µs per launch (ds4's C against ds4lab's Python),
# what the islands buy ds4 against what ds4lab's stage i says they buy, ds4's kernel time by kind, and
# what ds4's log says its islands captured and retired. Then the question the rebuild alone cannot
# answer, MODELED: ds4lab's token with its launches priced at a C program's host cost.
#
# On a GPU with `DS4_SOURCE` set, ds4 is built and run live into `OUT/ds4` (minutes: the build is
# cached). Elsewhere, `DS4_RESULTS` names a `ds4lab ds4` folder measured on a GPU; with neither,
# only ds4lab's side is shown. Parameters in the next cell.

# %% tags=["parameters"]
BACKEND = "auto"  # auto/cupy: run ds4 live when DS4_SOURCE is set and a GPU is usable; sim: never
DS4_SOURCE = None  # a ds4 checkout (folder or .tar.gz), e.g. "../shared/ds4/ds4-b0309611.tar.gz"
DS4_RESULTS = None  # a ds4lab ds4 result folder to read (one measured elsewhere), used when not run live
CONTEXTS = "1024"  # contexts of the live run and of the modeled comparison
TOKENS = 16  # decode tokens timed per configuration and context (live run)
PRESET = "ds4-flash"  # ds4lab's token for the modeled comparison
C_HOST_US = 3.2  # µs per eager launch from C (3.0–3.3 measured on the H200: shared/context/gpu-facts.md)
OUT = "results/nb-ds4-itself"

# %%
from pathlib import Path

from ds4lab import Lab

lab = Lab(BACKEND)
contexts = lab.contexts(CONTEXTS, preset=PRESET, name="CONTEXTS")  # checked before anything runs
out = Path(OUT)
folder = DS4_RESULTS
if DS4_SOURCE and lab.on_gpu:
    folder = lab.ds4(source=DS4_SOURCE, contexts=contexts, tokens=TOKENS, trace_contexts=contexts[:1],
                     out=out / "ds4").out
ds4 = lab.beside_ds4(folder)
print(f"ds4: {ds4.label} ({folder})" if folder else
      "ds4: no record (set DS4_SOURCE on a GPU, or DS4_RESULTS to a ds4lab ds4 folder): ds4lab's side only")

# %% [markdown]
# ## ds4's own capture ladder, beside the rebuild's
#
# From a `ds4lab ds4 --stages 0,i,3u` folder (docs/ds4.md, "ds4's own capture ladder"): ds4 as shipped,
# then the stages on ds4 rewritten by ds4lab (stage 0 in ds4's source; its islands; the whole token
# captured and its graph updated every token), every token's logits held to ds4 as shipped bit for bit;
# beside them ds4lab's rebuild's measured ladder. µs per token, medians of CUDA-event timed tokens. A
# ds4 folder without `--stages` shows the rebuild's rungs alone.

# %%
ds4.ladder()

# %%
lab.save(ds4.ladder_figure(), out / "ladder", formats=("png",))

# %% [markdown]
# ## Launches per token
#
# ds4's rows count its CUPTI records of the recorded tokens (kernel launch calls, graph launches,
# kernels that ran, inside graphs included); ds4lab's come from its measured ladder record (stages 0
# and i) and from its model's launch census at each context (long-context token: compressors and
# indexer included).

# %%
ds4.census(contexts)

# %% [markdown]
# ## Host µs per eager launch: C against Python

# %%
ds4.host()

# %% [markdown]
# ## What capture buys: ds4's islands against ds4lab's stage i
#
# µs per token (median, CUDA events around each token on the legacy stream). ds4's gain is paired by
# decode position (islands off and on decode the same token at the same position, one process each:
# ds4 reads its switches once), with its 95 % interval; ds4lab's rows are its measured records. The
# figure sets the two engines side by side at the contexts both ran only (a context is a position:
# ds4lab's ladder at 1 000 is not ds4's 1 024); the table's `pair` names what has no pair.

# %%
ds4.gains()

# %%
lab.save(ds4.gain_figure(), out / "islands-gain", formats=("png",))

# %% [markdown]
# ## ds4's kernels by kind, and what its islands did
#
# Kernel µs per token by kind (a coarse map of kernel names: the two engines' kernels are different
# code), and, per configuration, the islands ds4's log says it captured and the ones it retired (with
# `DS4_CUDA_MOE_PROFILE=1`, ds4's profile records events on the legacy stream inside island 1).

# %%
ds4.kernel_kinds(), ds4.islands

# %% [markdown]
# ## MODELED: ds4lab's token with C's launch cost
#
# The same launch list on the simulated runtime, its eager launches priced at ds4lab's Python launch
# layer (the shipped calibration) and at `C_HOST_US` per launch. Where the host is cheaper than the
# kernels, the eager token is GPU-bound and, in this what-if, a graph has little left to buy: it prices
# no device idle between eager kernels (the shipped calibration's `eager_gap_us` is 0). ds4 on the H200
# showed that idle (1.7–2.5 µs per boundary) and islands that buy ×1.05–1.07 from C
# (`docs/measurements/h200-2026-12-02-ds4`). With a ds4 record, its own costs, that idle included, are
# fitted instead (`ds4lab calibrate --from-ds4`) and the sim's stages 0 and i are held to ds4's islands
# off and on.
#
# Stage 3 keeps one graph per token shape, and the long-context token's launch list changes with the
# position: past 1 024 of context a new graph is captured every few tokens, each capture costing the
# token's launches issued once more plus the instantiation, so its median over a few tokens mixes
# captures and replays and can lose to stage 0 (the figure's note counts them). Stage 3c is the
# long-context token as one graph for every position.

# %%
whatif = lab.host_whatif(contexts, C_HOST_US, preset=PRESET, stages="0,i,3,3c", tokens=8)
print("every figure below is MODELED (sim, timing only)")
whatif.table()[["host", "context", "stage", "us_median", "host_us_median", "floor_us", "kernel_launches", "captures",
                "speedup"]]

# %%
lab.save(whatif.figure(), out / "host-whatif", formats=("png",))

# %%
if folder and not ds4.record.census.empty:
    fit = lab.calibrate(from_ds4=str(folder), preset=PRESET, out=out / "calibration-from-ds4.json")
    print({k: fit.value.get(k) for k in ("host_launch_us", "host_graph_call_us", "eager_gap_us", "kernel_time_scale")})
    display(fit.table("check"))  # noqa: F821 - IPython's display
