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
# # Long context: where the launch list changes with the position, and what capture does about it
#
# At long context the ds4 decode token is no longer one fixed launch list: the compressors emit a
# compressed row on every 4th and every 128th token, and the indexer's top-k kernels change with the
# number of compressed rows (docs/model.md, "Long context"). This notebook shows where the launch
# list changes with the position (the launch census, counted), µs per token against context for
# stages 0, i, i+, 2, 3 and 3c (measured on a GPU, **modeled** on the simulated runtime), how many
# graphs stage 3 (one graph per token shape) needs against stage 3c (one graph for every position),
# and each long-context capture hazard demonstrated. Stages i and i+ are ds4's shipped decode islands
# (docs/model.md, "ds4's decode islands"): small graphs around the hyper-connection mixes and the
# output/shared-expert tail, the attention and the routed MoE eager between them; i+ adds ds4's
# attention span, its position-dependent arguments written into the graph's kernel nodes before each
# replay. Parameters in the next cell.

# %% tags=["parameters"]
BACKEND = "auto"  # "cupy" (GPU), "sim" (simulated runtime), or "auto"
PRESET = None  # "ds4-flash", "small", "tiny"; None: ds4-flash on a GPU, small on the sim
CONTEXTS = "1024,4096,16384,65536"  # start positions of the context ladder
STAGES = "0,i,i+,2,3,3c"  # of the ladder's stages; 3c only with long context
TOKENS = 64  # timed tokens per stage and context
HAZARD_PRESET = None  # None: the hazards job's default (ds4-flash on a GPU, small on the sim)
REGIME_CHANGE = None  # the n_comp whose launch-shape change is shown (None: the first; a dropdown in JupyterLab)
CAPTURE_STAGES = "record"  # a `ds4lab context` folder of stages 3, 3cc, 3p, ...; "record": the H200 one in this checkout; None: skip
OUT = "results/nb-long-context"

# %%
from pathlib import Path

import pandas as pd

from ds4lab import Lab

lab = Lab(BACKEND)
preset = PRESET or lab.preset_for("context")  # the context job's default, decided without opening a backend
print(f"backend {'cupy' if lab.on_gpu else 'sim'} · preset {preset} · stages {STAGES} · contexts {CONTEXTS}")

# %% [markdown]
# ## Where the launch list changes with the position
#
# Every launch of one token, counted by the launcher's census on a timing-only model of the
# simulated runtime with `long_context` on (`ds4lab.experiments.launch_list.scan`): these are counts
# of the launch list, the same on every backend (nothing here is timed). A ratio-4 compressor emits
# when `(pos + 1) % 4 == 0`, a ratio-128 one when `(pos + 1) % 128 == 0` (3–4 launches more each, per
# compressed layer); the indexer starts once a ratio-4 layer has more than top-k compressed rows, and
# its top-k kernels change at 2, 4, 8 and 16 × top-k rows (the chunked tree merge above). Each is a
# host decision (`DecodeModel.longctx_decisions`) that a captured graph freezes.

# %%
scan = lab.launch_scan(preset)
print(scan.title())
scan.table()

# %%
lab.save(lab.launches_figure(scan), Path(OUT) / "launches")

# %% [markdown]
# What stage 3 keys its graphs on at the last token before a launch-shape change and the first one
# after it (with device scalars the attended row counts are not host decisions: `by_value=False`).
# `REGIME_CHANGE` picks the change (the n_comp of its last token).

# %%
lab.regime_change(scan, change=REGIME_CHANGE)

# %% [markdown]
# ## µs per token against context, per stage
#
# The context ladder (`ds4lab context`): at each context, every stage bit for bit against stage 0
# over a span that crosses an emit of both compressors (and a top-k regime change where one lies
# there), then µs per token (median, IQR) over `TOKENS` tokens. Measured on a GPU; on the simulated
# runtime every number is **modeled** (the long-context kernels priced by their H200 fits, stage 3c's
# worst-case grids included).

# %%
ctx = lab.context(stages=STAGES, preset=preset, contexts=CONTEXTS, tokens=TOKENS, out=Path(OUT) / "context")
print(ctx.label())
ctx.table()[["stage", "context", "us_median", "us_p25", "us_p75", "kernel_launches", "graph_launches", "exact",
             "first_mismatch"]].round(1)

# %%
ctx.figure("context")

# %% [markdown]
# ## How many graphs: stage 3 against stage 3c
#
# `graphs`: graphs captured so far by that stage's cache (counted, cumulative over the contexts in
# order). Stage 3 captures one graph per token shape it meets (emit or not per ratio, top-k regime
# and plan, score grid); stage 3c one graph, replayed at every position. `× stage 3`: stage 3c's µs
# per token over stage 3's (what deciding on the device costs; modeled on the sim).

# %%
print(("MODELED" if ctx.meta.get("modeled") else "measured") + " µs; graph counts are counted")
lab.context_graphs(ctx)

# %% [markdown]
# ## One graph for every position, and programmatic launch: stages 3cc, 3p, 3cp, 3ccp
#
# Stage 3c pays for its worst case on every token; 3cc keeps stage 3's kernels and lets conditional
# nodes choose, on the device, whether the compressors emit and which top-k regime runs (one graph for
# every position); `p` adds programmatic dependent launch inside the graph (docs/capture-stages.md).
# `CAPTURE_STAGES` names a `ds4lab context` folder that ran them (`--stages 3,3c,3cc,3p,3cp,3ccp`);
# `"record"` reads the H200 record shipped in this checkout. Each stage's µs per token over stage 3's,
# and its gain over stage 3 paired per token with its 95 % interval ("not measurable" when it
# includes zero).

# %%
cs, where = lab.capture_stages(CAPTURE_STAGES)
print(where)
if cs is not None:
    print("µs per token over stage 3's, per context and stage:")
    print(cs.pivot(index="context", columns="stage", values="x_stage_3").round(3).to_string())
cs[["stage", "context", "us_median", "x_stage_3", "gain over 3", "graphs", "exact"]] if cs is not None else None

# %% [markdown]
# ## Each long-context hazard, demonstrated
#
# Each re-introduces one position-dependent host decision into a captured token (stage 3) and
# decodes the same tokens eagerly, with the hazard, and with stage 3c, comparing every tensor bit
# for bit: `outcome` is what CUDA (or the simulated runtime's capture rules, checked against the
# H200 by `ds4lab conformance`) did with the hazard, `exact_3c` and `graphs_3c` what stage 3c did.

# %%
rows = lab.hazards(hazard="all-longctx", preset=HAZARD_PRESET, out=Path(OUT) / "hazards").value
h = pd.DataFrame(rows)
print(f"backend {h.backend.iloc[0]}: " + ("simulated runtime (capture rules modeled)" if h.backend.iloc[0] == "sim"
                                          else "measured on the GPU"))
h[["hazard", "positions", "outcome", "errors", "captures", "replays", "eager_runs", "exact", "first_mismatch",
   "exact_3c", "graphs_3c"]]

# %%
for r in rows:
    print(f"{r['hazard']}: {r['what']}\n    expected: {r['expected']}\n    got: {r['outcome']}\n")
