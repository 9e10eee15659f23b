"""The source of the workbench notebooks: ``notebooks/*.ipynb`` are written by this script, committed
without outputs. Edit the cells here, run ``python scripts/make_notebooks.py``, commit both; never edit
the ``.ipynb`` files by hand (``tests/test_notebooks.py`` checks that the committed notebooks are what
this script writes). ``--out DIR`` writes them elsewhere.
"""

import argparse
from pathlib import Path

import nbformat as nbf

_args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_args.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "notebooks",
                   help="the folder to write the notebooks into (default: notebooks/)")
HERE = _args.parse_args().out
HERE.mkdir(parents=True, exist_ok=True)


def md(s):
    return nbf.v4.new_markdown_cell(s.strip())


def code(s, params=False):
    c = nbf.v4.new_code_cell(s.strip())
    if params:
        c.metadata["tags"] = ["parameters"]
    return c


def write(name, cells):
    nb = nbf.v4.new_notebook()
    for i, c in enumerate(cells):
        c.id = f"cell-{i:02d}"  # stable ids: regenerating leaves unchanged notebooks unchanged
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbf.write(nb, HERE / name)


write("00_quickstart.ipynb", [
    md("""
# ds4lab quickstart: one ds4-shaped decode token

One decode token of the ds4 engine's CUDA back end, rebuilt from ds4lab's own kernels: its launch
census, its NVTX structure, and a first stage ladder. Runs on a GPU (measured) and on a laptop
(the simulated runtime: every figure is **modeled**, and says so). Parameters are in the next
cell; run headlessly with other values by replacing that cell.
"""),
    code("""
BACKEND = "auto"        # "cupy" (GPU), "sim" (simulated runtime), or "auto"
PRESET = None           # "ds4-flash", "small", "tiny"; None: ds4-flash on a GPU, small on the sim
STAGES = "0,0s,i,i+,1,2,3,3u"
TOKENS = 200            # timed tokens per stage
OUT = "results/nb-quickstart"
""", params=True),
    code("""
from pathlib import Path
from ds4lab.backends import make_backend
from ds4lab.token.config import get_preset
from ds4lab.jobs import default_preset, execute
from ds4lab.token.model import DecodeModel, TokenOptions
from ds4lab.report import provenance

be = make_backend(BACKEND, allowed=("auto", "cupy", "sim"), timing_only=True, compile_kernels=True)
preset = PRESET or default_preset("ladder", be)
cfg = get_preset(preset)
meta = provenance.base_meta(be)
print(f"backend {be.name} · preset {preset} · " + ("MODELED (simulated runtime)" if be.models_time else provenance.label(meta)))
"""),
    md("## One token and its launch census\nEvery launch goes through the stream accessor; the census counts launches by cluster and kind."),
    code("""
model = DecodeModel(cfg, be, TokenOptions(vocab=True))
model.token(1000, 7)
be.synchronize()
model.L.census.by_kind()
"""),
    code("model.L.census.by_cluster()"),
    md("""
## NVTX structure

With `nvtx=True`, each token is a range in the `ds4lab` domain (payload: position), each layer a
range (payload: layer), each cluster a range in its own category, each op a range. Under Nsight
Systems (`nsys profile -t cuda,nvtx`) these group the timeline; here we list the nesting the
launch layer produces for one layer.
"""),
    code("""
from ds4lab.capture.annotate import CLUSTERS
import pandas as pd
with model.L.recording() as trace:
    model.token(1001, 8)
layer0 = [(r.cluster, r.site, r.kernel) for r in trace if r.layer == 0]
pd.DataFrame(layer0, columns=["cluster (NVTX category)", "op range", "kernel"])
"""),
    md("## A first stage ladder"),
    code("""
from ds4lab.jobs.ladder import LadderConfig
df = execute("ladder", LadderConfig(stages=STAGES, preset=preset, tokens=TOKENS, out=OUT), backend=be.name).table()
df[["stage", "short", "us_median", "us_p25", "us_p75", "speedup", "efficiency", "kernel_launches", "graph_launches", "exact"]]
"""),
    code("""
from IPython.display import Image
Image(filename=str(Path(OUT) / "ladder.png"))
"""),
    md("""
## One token on a timeline: eager against replayed

`ds4lab trace`: one token of stage 0 (eager) and one of stage 3 (the whole token replayed as one
graph), each kernel named by its launch site, under ds4lab's NVTX ranges (CUPTI records on a GPU;
the simulated runtime's modeled schedule, labelled MODELED, on the sim). In the figure, look at the
GPU lanes: the eager token's kernels sit apart, each waiting for the host to launch the next
(the launch gaps, host-bound: busy a fraction of its span), while the replayed token's kernels run
back to back (busy close to 100 % of a much shorter span); its host lane holds the scalars' write
and one graph launch instead of one range per op. Open `trace.json` in ui.perfetto.dev or chrome://tracing for the
whole token.
"""),
    code("""
from ds4lab.report import results
from ds4lab.jobs.trace import TraceConfig, TraceError

try:
    tr = execute("trace", TraceConfig(preset=PRESET or default_preset("trace", be), stages="0,3", tokens=2,
                                      out=Path(OUT) / "trace"), backend=be.name)
    print(f"open {results.final_path(tr.out / 'trace.json')} in ui.perfetto.dev or chrome://tracing")
except TraceError as e:  # a GPU without CUPTI (pip install cupti-python): no kernel timeline here
    tr = None
    print(f"no trace: {e}")
tr.figure("trace") if tr is not None else None
"""),
])

write("03_stage_gains.ipynb", [
    md("""
# What each stage of the capture plan buys

The stage ladder on this machine (measured on a GPU, modeled on the simulated runtime), the
exactness of every stage against stage 0, the GPU-busy floor, and a what-if sweep on the
simulated runtime: how the gain of capture moves with the number of layers, the host cost of a
launch and the tokens per step. Parameters in the next cell.
"""),
    code("""
BACKEND = "auto"
PRESET = None
STAGES = "0,0s,i,i+,1,2,3,3u"
TOKENS = 200
OUT = "results/nb-stage-gains"
SWEEP_LAYERS = [4, 8, 16, 43]
SWEEP_LAUNCH_US = [2.0, 5.0, 9.4, 15.0]
SWEEP_TOKENS = [1, 2, 3, 16, 64, 512]
""", params=True),
    code("""
from pathlib import Path
import pandas as pd
from ds4lab.jobs import execute
from ds4lab.jobs.ladder import LadderConfig
from ds4lab.experiments.stages import fixes_table
df = execute("ladder", LadderConfig(stages=STAGES, preset=PRESET, tokens=TOKENS, out=OUT), backend=BACKEND).table()
df[["stage", "description", "us_median", "speedup", "efficiency", "exact", "captures", "replays", "retirements"]]
"""),
    md("## Which hazard fixes each stage needs"),
    code("fixes_table()"),
    code("""
from IPython.display import Image
Image(filename=str(Path(OUT) / "ladder.png"))
"""),
    md("""
## What-if sweeps (simulated runtime, modeled)

Eager (stage 0) against whole-token capture (stage 3) on the timing-only simulated runtime with
the shipped H200 calibration: over the number of layers at `ds4-flash` dimensions, and over the
host cost of one eager launch (what a faster or slower launch path would change); then one
routed-MoE call, eager against a replayed graph, over the tokens per step (1: decode; 2–3: MTP
verification; more: batches on the sorted path). Every number here is modeled, whatever machine
runs the notebook.
"""),
    code("""
from ds4lab.experiments import whatif
layers = whatif.sweep_layers(SWEEP_LAYERS); layers
"""),
    code("""
launch = whatif.sweep_launch_cost(SWEEP_LAUNCH_US); launch
"""),
    code("""
tokens = whatif.sweep_moe_tokens(SWEEP_TOKENS); tokens
"""),
    code("""
from ds4lab.report import plots
fig = plots.whatif_figure(layers, launch, tokens)
plots.save(fig, Path(OUT) / "whatif")
fig
"""),
])
write("01_moe_timing.ipynb", [
    md("""
# Where routed-MoE time goes

ds4's routed MoE in six stages (`xq`, `sort`, `gateup`, `midq`, `down`, `sum`), timed by stage,
token count (1 decode, 2–3 MTP verification, batches) and routing pattern (uniform, Zipf-skewed,
hash-routed layers, worst case), and its share of a whole decode token. On a GPU the times are
measured (CUDA events read after each step, no mid-token synchronization); on the simulated
runtime they are modeled and every figure says so. Parameters in the next cell.
"""),
    code("""
BACKEND = "auto"
PRESET = None                 # None: ds4-flash on a GPU, small on the sim
TOKENS_PER_STEP = "1,2,3,64,512"
ROUTINGS = "all"
MODES = "deferred"
STEPS = 10
OUT = "results/nb-moe"
""", params=True),
    code("""
from pathlib import Path
import json
import pandas as pd
from ds4lab.backends import resolve
from ds4lab.token.config import get_preset
from ds4lab.jobs import execute
from ds4lab.jobs.common import DEFAULT_PRESETS
from ds4lab.jobs.moe import MoeConfig
from ds4lab.moeprof import MODES as ALL_MODES, ROUTINGS as ALL_ROUTINGS
# Token counts above the preset's max_tokens are refused by `ds4lab moe`: keep the ones it takes.
preset = PRESET or DEFAULT_PRESETS["moe"][0 if resolve(BACKEND) == "cupy" else 1]
limit = get_preset(preset).max_tokens
counts = [int(t) for t in TOKENS_PER_STEP.split(",") if int(t) <= limit]
if len(counts) < len(TOKENS_PER_STEP.split(",")):
    print(f"note: {preset} takes at most {limit} tokens per step: profiling {counts}")
pick = lambda text, every: list(every) if text == "all" else text.split(",")
execute("moe", MoeConfig(modes=pick(MODES, ALL_MODES), tokens_per_step=counts, routings=pick(ROUTINGS, ALL_ROUTINGS),
                         preset=preset, steps=STEPS, out=OUT, overhead=False), backend=BACKEND)
meta = json.loads((Path(OUT) / "meta.json").read_text())
print("MODELED (simulated runtime)" if meta.get("modeled") else f"measured on {meta.get('device')}")
"""),
    md("## Median µs per routed-MoE call and stage, by token count and routing"),
    code("""
moe = pd.read_csv(Path(OUT) / "moe.csv")
stages = ["xq", "sort", "gateup", "midq", "down", "sum", "total"]
moe["µs"] = moe["ms"] * 1e3
t = moe[moe.stage.isin(stages)].pivot_table(index=["tokens", "routing"], columns="stage", values="µs", aggfunc="median")
print(("MODELED (simulated runtime)" if meta.get("modeled") else f"measured on {meta.get('device')}") + ", µs per call")
t[[s for s in stages if s in t.columns]].round(1)
"""),
    code("""
from IPython.display import Image, display
for f in ("moe-stages.png", "moe-distribution.png", "moe-share.png"):
    if (Path(OUT) / f).exists():
        display(Image(filename=str(Path(OUT) / f)))
"""),
    md("""
## The same numbers in ds4's own format

`ds4lab ingest` reads these lines (and a real ds4 run's `DS4_CUDA_MOE_PROFILE` stderr) back into
the same table, so a real engine run and this workbench can be compared side by side.
"""),
    code("""
# ds4's own profile lines (DS4_CUDA_MOE_PROFILE format), one file per mode and routing
log = sorted(Path(OUT).glob("moe-ds4-*.log"))[0]
print(log.name)
for line in log.read_text().splitlines()[:8]:
    print(line)
"""),
])

write("02_profiling_vs_capture.ipynb", [
    md("""
# Profiling and capture: which measurements survive, and what each hazard does

Part 1: the profiling × capture matrix, computed by running every combination: each MoE profiling
mode eagerly (legacy and non-blocking stream), under capture in each mode, and on replay. Part 2:
each ds4-today code path re-introduced into a captured stage: a refused capture with its CUDA
error and the eager fallback, or a capture that succeeds and replays wrong. Part 3: the
capture-compatible ways to measure, side by side. Parameters in the next cell.
"""),
    code("""
BACKEND = "auto"
PRESET = None
HAZARD_PRESET = None          # None: small
OUT = "results/nb-capture"
""", params=True),
    code("""
from pathlib import Path
import json
import pandas as pd
from ds4lab.jobs import execute
from ds4lab.jobs.exclusion import ExclusionConfig
from ds4lab.jobs.hazards import HazardsConfig
from ds4lab.jobs.moe import MoeConfig
execute("exclusion", ExclusionConfig(preset=PRESET, out=OUT + "/exclusion"), backend=BACKEND)
m = pd.read_csv(Path(OUT) / "exclusion" / "exclusion.csv")
m.pivot(index="mode", columns="column", values="outcome")
"""),
    code("""
from IPython.display import Image
Image(filename=str(Path(OUT) / "exclusion" / "exclusion.png"))
"""),
    md("## Each hazard, demonstrated"),
    code("""
execute("hazards", HazardsConfig(hazard="all", preset=HAZARD_PRESET, out=OUT + "/hazards"), backend=BACKEND)
h = pd.read_csv(Path(OUT) / "hazards" / "hazards.csv")
h[["hazard", "outcome", "errors", "exact", "first_mismatch", "expected"]]
"""),
    md("""
## Capture-compatible measurement

`host-timed` (ds4's way) cannot run inside a capture. What can: `deferred` events eagerly,
`graph-boundary` events between replays (total only), `in-graph` timestamps written by a kernel
inside the graph, and per-kernel activity records (CUPTI on a GPU; the modeled timeline on the
sim). Overhead of each on a whole token, eager and replayed:
"""),
    code("""
execute("moe", MoeConfig(modes=["deferred", "in-graph", "graph-boundary", "cupti"], tokens_per_step=[1],
                         routings=["uniform"], steps=5, share_tokens=0, preset=PRESET, out=OUT + "/modes"),
        backend=BACKEND)
o = Path(OUT) / "modes" / "overhead.csv"
pd.read_csv(o) if o.exists() else "no overhead table"
"""),
    code("""
moe = pd.read_csv(Path(OUT) / "modes" / "moe.csv")
moe["µs"] = moe["ms"] * 1e3
print("MODELED (simulated runtime)" if moe["modeled"].any() else "measured", "· median µs per call and stage, by mode")
moe[moe.stage != "total"].pivot_table(index="stage", columns="mode", values="µs", aggfunc="median").round(2)
"""),
])

write("04_long_context.ipynb", [
    md("""
# Long context: where the launch list changes with the position, and what capture does about it

At long context the ds4 decode token is no longer one fixed launch list: the compressors emit a
compressed row on every 4th and every 128th token, and the indexer's top-k kernels change with the
number of compressed rows (docs/model.md, "Long context"). This notebook shows where the launch
list changes with the position (the launch census, counted), µs per token against context for
stages 0, i, i+, 2, 3 and 3c (measured on a GPU, **modeled** on the simulated runtime), how many
graphs stage 3 (one graph per token shape) needs against stage 3c (one graph for every position),
and each long-context capture hazard demonstrated. Stages i and i+ are ds4's shipped decode islands
(docs/model.md, "ds4's decode islands"): small graphs around the hyper-connection mixes and the
output/shared-expert tail, the attention and the routed MoE eager between them; i+ adds ds4's
attention span, its position-dependent arguments written into the graph's kernel nodes before each
replay. Parameters in the next cell.
"""),
    code("""
BACKEND = "auto"        # "cupy" (GPU), "sim" (simulated runtime), or "auto"
PRESET = None           # "ds4-flash", "small", "tiny"; None: ds4-flash on a GPU, small on the sim
CONTEXTS = "1024,4096,16384,65536"   # start positions of the context ladder
STAGES = "0,i,i+,2,3,3c"  # of the ladder's stages; 3c only with long context
TOKENS = 64             # timed tokens per stage and context
HAZARD_PRESET = None    # None: the hazards job's default (ds4-flash on a GPU, small on the sim)
OUT = "results/nb-long-context"
""", params=True),
    code("""
from pathlib import Path
import json
import pandas as pd
from IPython.display import Image, display
from ds4lab.report import plots
from ds4lab.token import reference as LR
from ds4lab.backends import make_backend, resolve
from ds4lab.token.config import get_preset
from ds4lab.jobs import execute
from ds4lab.jobs.common import DEFAULT_PRESETS
from ds4lab.jobs.context import ContextConfig
from ds4lab.jobs.hazards import HazardsConfig
from ds4lab.token.model import DecodeModel, TokenOptions

# default_preset("context", be) without opening a backend: ds4-flash on a GPU, small on the sim
preset = PRESET or DEFAULT_PRESETS["context"][0 if resolve(BACKEND) == "cupy" else 1]
stages = [s.strip() for s in STAGES.split(",") if s.strip()]
print(f"backend {resolve(BACKEND)} · preset {preset} · stages {', '.join(stages)} · contexts {CONTEXTS}")
"""),
    md("""
## Where the launch list changes with the position

Every launch of one token, counted by the launcher's census on a timing-only model of the
simulated runtime with `long_context` on: these are counts of the launch list, the same on every
backend (nothing here is timed). A ratio-4 compressor emits when `(pos + 1) % 4 == 0`, a
ratio-128 one when `(pos + 1) % 128 == 0` (3–4 launches more each, per compressed layer); the
indexer starts once a ratio-4 layer has more than top-k compressed rows, and its top-k kernels
change at 2, 4, 8 and 16 × top-k rows (the chunked tree merge above). Each is a host decision
(`DecodeModel.longctx_decisions`) that a captured graph freezes.
"""),
    code("""
sim = make_backend("sim", timing_only=True)  # counts only: the launch list does not depend on the backend
cfg = get_preset(preset, long_context=True)  # max_context: the preset's (tiny 4 096; small, ds4-flash 262 144)
model = DecodeModel(cfg, sim, TokenOptions(vocab=True))
k, ratios = cfg.index_top_k, model.compressed_ratios()


def census(pos):
    \"\"\"Kernel launches of the token at ``pos``, its emits and its ratio-4 layers' top-k regime.\"\"\"
    model.L.census.reset()
    model.token(pos, 7)
    d = dict(model.longctx_decisions(pos, by_value=False))
    emits = [r for r in ratios if d[f"compressor.emit.r{r}"]]
    n = LR.comp_count(pos, 4)
    return {"position": pos, "n_comp (ratio 4)": n, "regime": d.get("indexer.regime", "-"),
            "top-k launches": len(d.get("indexer.topk_plan", ())),
            "token": " + ".join(f"emit r{r}" for r in emits) or "no emit",
            "kernels": model.L.census.total("kernel"), "launches": model.L.census.total()}


# The positions where the ratio-4 layers' launch shape (regime, top-k launches) changes: scan n_comp.
shape = lambda n: (LR.topk_regime(n, k), len(LR.topk_plan(n, k)[0]))
last_n = LR.comp_count(cfg.max_context - 1, 4)
bounds = [n for n in range(1, last_n) if shape(n) != shape(n + 1)]  # the last n_comp of each regime
P = max(ratios)  # positions a ≡ P - 1 (mod P) emit at every ratio; a - 1 emits none, a - 4 only ratio 4
kinds = lambda a: [a - 1, a] + ([a - 4] if P > 4 else [])
nc = lambda a: [LR.comp_count(q, 4) for q in kinds(a)]
anchors = {P * (2 ** i // P) - 1 for i in range(2, 40) if P <= 2 ** i < cfg.max_context}
for nb in bounds:  # the last anchor before each change and the first after it
    a = P * (4 * nb // P) - 1
    if a >= P - 1:
        anchors.add(a)
    while min(nc(a)) <= nb:
        a += P
    if a < cfg.max_context:
        anchors.add(a)
rows = [census(q) for a in sorted(anchors) for q in kinds(a) if 4 <= q < cfg.max_context]
launches = pd.DataFrame(rows).drop_duplicates("position").sort_values("position")
start = P * -(-4 * 5 * k // (2 * P))  # a window of consecutive tokens inside one regime (n_comp ≈ 2.5 top-k)
window = pd.DataFrame([census(q) for q in range(start, start + 2 * max(P, 16) + 8)])
print(f"{preset}, long context: top-k {k}, compressed layers of ratio {', '.join(map(str, ratios))}; "
      f"max_context {cfg.max_context}; counted by the launch census (no timing)")
launches.pivot_table(index=["regime", "top-k launches"], columns="token", values="kernels",
                     aggfunc=lambda v: "–".join(map(str, sorted({v.min(), v.max()})))).sort_index(
    key=lambda i: i.map({r: j for j, r in enumerate(LR.TOPK_REGIMES)}) if i.name == "regime" else i)
"""),
    code("""
import matplotlib.pyplot as plt

colors = {t: plots.COLORS[i] for i, t in enumerate(sorted(set(launches.token) | set(window.token)))}
with plt.rc_context(plots.STYLE):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.5]})
    for t, g in window.groupby("token"):
        a1.scatter(g.position, g.kernels, s=10, color=colors[t], label=t)
    a1.set_xlabel("position (consecutive tokens)")
    a1.set_ylabel("kernel launches per token")
    a1.set_title(f"{len(window)} consecutive tokens (n_comp {window['n_comp (ratio 4)'].min()}–"
                 f"{window['n_comp (ratio 4)'].max()})", fontsize=9)
    for t, g in launches.groupby("token"):
        a2.plot(g.position, g.kernels, marker="o", ms=3, drawstyle="steps-post", color=colors[t], label=t)
    for nb in bounds:
        x = 4 * nb + 3  # the first position with n_comp = nb + 1
        if x < cfg.max_context:
            a2.axvline(x, color="0.6", linestyle=":", linewidth=0.8)
            (r0, _), (r1, n1) = shape(nb), shape(nb + 1)
            a2.text(x, 1.0, " " + (r1 if r1 != r0 else f"{n1} top-k launches"), transform=a2.get_xaxis_transform(),
                    rotation=90, va="top", ha="left", fontsize=7, color="0.35")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("position (log; dotted: top-k regime changes of the ratio-4 layers)")
    a2.set_title("across the top-k regimes", fontsize=9)
    a2.legend(loc="lower right", fontsize=8, frameon=False)
    fig.suptitle(f"launches per token by position — counted by the launch census (the launch list, the same on "
                 f"every backend; not timed) · {preset}, long context", fontsize=10)
    fig.tight_layout()
plots.save(fig, Path(OUT) / "launches")
fig
"""),
    md("""
What stage 3 keys its graphs on at two positions on either side of a regime change (with device
scalars the attended row counts are not host decisions: `by_value=False`):
"""),
    code("""
nb = next((n for n in bounds if 4 * n + 4 < cfg.max_context), None)
if nb is not None:
    for q in (4 * nb - 1, 4 * nb + 3):
        print(q, model.longctx_decisions(q, by_value=False))
"""),
    md("""
## µs per token against context, per stage

The context ladder (`ds4lab context`): at each context, every stage bit for bit against stage 0
over a span that crosses an emit of both compressors (and a top-k regime change where one lies
there), then µs per token (median, IQR) over `TOKENS` tokens. Measured on a GPU; on the simulated
runtime every number is **modeled** (the long-context kernels priced by their H200 fits, stage 3c's
worst-case grids included).
"""),
    code("""
ctx_out = Path(OUT) / "context"
df = execute("context", ContextConfig(stages=",".join(stages), preset=preset, contexts=CONTEXTS, tokens=TOKENS,
                                      out=str(ctx_out)), backend=BACKEND).table()
meta = json.loads((ctx_out / "meta.json").read_text())
cal = meta.get("calibration")
print(f"MODELED (simulated runtime, calibration {cal.get('name') if isinstance(cal, dict) else cal})"
      if meta.get("modeled") else f"measured on {meta.get('device')}")
df[["stage", "context", "us_median", "us_p25", "us_p75", "kernel_launches", "graph_launches", "exact",
    "first_mismatch"]].round(1)
"""),
    code("display(Image(filename=str(ctx_out / \"context.png\")))"),
    md("""
## How many graphs: stage 3 against stage 3c

`graphs`: graphs captured so far by that stage's cache (counted, cumulative over the contexts in
order). Stage 3 captures one graph per token shape it meets (emit or not per ratio, top-k regime
and plan, score grid); stage 3c one graph, replayed at every position. `× stage 3`: stage 3c's µs
per token over stage 3's (what deciding on the device costs; modeled on the sim).
"""),
    code("""
g = df.pivot_table(index="context", columns="stage", values="graphs", aggfunc="first")
g = g[[s for s in stages if s in g.columns]]
g.columns = [f"graphs, stage {s}" for s in g.columns]
if {"3", "3c"} <= set(df.stage):
    us = df.pivot_table(index="context", columns="stage", values="us_median", aggfunc="first")
    g["stage 3c µs × stage 3"] = (us["3c"] / us["3"]).round(3)
print(("MODELED" if meta.get("modeled") else "measured") + " µs; graph counts are counted")
g.join(df[df.stage == "3"].set_index("context")[["recaptures", "retirements"]].add_prefix("stage 3 "))
"""),
    md("""
## Each long-context hazard, demonstrated

Each re-introduces one position-dependent host decision into a captured token (stage 3) and
decodes the same tokens eagerly, with the hazard, and with stage 3c, comparing every tensor bit
for bit: `outcome` is what CUDA (or the simulated runtime's capture rules, checked against the
H200 by `ds4lab conformance`) did with the hazard, `exact_3c` and `graphs_3c` what stage 3c did.
"""),
    code("""
rows = execute("hazards", HazardsConfig(hazard="all-longctx", preset=HAZARD_PRESET, out=str(Path(OUT) / "hazards")),
               backend=BACKEND).value
h = pd.DataFrame(rows)
print(f"backend {h.backend.iloc[0]}: " + ("simulated runtime (capture rules modeled)" if h.backend.iloc[0] == "sim"
                                          else "measured on the GPU"))
h[["hazard", "positions", "outcome", "errors", "captures", "replays", "eager_runs", "exact", "first_mismatch",
   "exact_3c", "graphs_3c"]]
"""),
    code("""
for r in rows:
    print(f"{r['hazard']}: {r['what']}\\n    expected: {r['expected']}\\n    got: {r['outcome']}\\n")
"""),
])

write("05_audit.ipynb", [
    md("""
# Audit an engine's decode step: what a CUDA-graph capture would refuse, break or get wrong

`ds4lab audit` reads a trace of an engine's decode loop (a PyTorch profiler JSON, an Nsight Systems
SQLite export, ds4lab's own `trace.json`, or a recording made in-process) and, for every API call
and launch of a decode token, says what stream capture would do with it in each capture mode: allowed,
refused, invalidates the capture, not in the graph (host work a replay would skip), or frozen (a grid,
launch count or by-value argument that changes between tokens). It then proposes the capturable spans
and models what each capture plan would save (MODELED, from the trace's measured kernel times and the
H200 calibration).

The engine here is a transformers model built from its config with random weights (no download):
recorded live on a GPU with PyTorch, otherwise one of the decode loops bundled with ds4lab (recorded
on an H200, with what `torch.cuda.graph` did with the same step on that GPU). Set `TRACE` to audit
your own engine's trace instead. Parameters in the next cell.
"""),
    code("""
BACKEND = "auto"        # "auto": record live where torch sees a GPU, else the bundled recording;
                        # "torch"/"cupy": record live; "sim"/"recorded": the bundled recording
ENGINE = "llama"        # llama, deepseek-v3, qwen2-moe (bundled: llama, deepseek-v3)
CACHE = "dynamic"       # dynamic (DynamicCache), static (StaticCache)
TRACE = None            # a trace file of your own engine: audited instead of ENGINE
TOKEN_RANGE = "decode_step"   # the NVTX range around one decode token (None: found by period)
OUT = "results/nb-audit"
""", params=True),
    code("""
from pathlib import Path
import json
import pandas as pd
from IPython.display import Image, display
from ds4lab.audit import engines
from ds4lab.audit.validate import OUTCOMES, predicted_outcome
from ds4lab.jobs import execute
from ds4lab.jobs.audit import AuditConfig

live_ok, why = engines.available()
live = TRACE is None and (BACKEND in ("torch", "cupy") or (BACKEND == "auto" and live_ok))
torch_run = None  # what torch.cuda.graph did with the same step, when known
if TRACE is not None:
    trace = Path(TRACE)
    print(f"auditing {trace}")
elif live:
    if not live_ok:
        raise RuntimeError(f"BACKEND={BACKEND!r} records live, but {why}")
    torch_run = engines.run_isolated(ENGINE, CACHE, Path(OUT) / "engine")
    if torch_run.get("error"):
        raise RuntimeError(f"{ENGINE}/{CACHE}: {torch_run['error']}")
    trace = Path(torch_run["recording"])
    print(f"recorded {ENGINE} with a {CACHE} cache on {torch_run['device'].get('device')} (measured)")
else:
    trace = engines.recorded(ENGINE, CACHE)
    torch_run = engines.recorded_outcome(ENGINE, CACHE)
    print(f"the bundled recording of {ENGINE} with a {CACHE} cache, recorded on "
          f"{torch_run['device'].get('device', 'an H200')} (driver {torch_run['device'].get('driver', '?')}, "
          f"torch {torch_run['config'].get('torch')}){'' if live_ok else f'; live recording off: {why}'}")
"""),
    md("""
## The audit

The terminal summary below is what `ds4lab audit TRACE --token-range decode_step` prints; the result
folder holds every table (`audit.csv`, `tokens.csv`, `spans.csv`, `plans.csv`) and the figure.
"""),
    code("""
reports = execute("audit", AuditConfig(files=(str(trace),), token_range=TOKEN_RANGE, out=OUT)).value
rep = reports[0]
"""),
    md("""
## Findings: each call and launch a capture would not take as it is

One row per finding (the same call at the same place counts once, over the tokens it occurs in);
`verdict_<mode>` per capture mode, `where` the Python line or NVTX range it comes from, `fix` what
would make it capturable.
"""),
    code("""
f = rep.findings
cols = ["kind", "call_class", "verdict_global", "verdict_relaxed", "tokens", "count", "where", "fix"]
(f[cols].assign(name=f["name"].str.slice(0, 60)).set_index("name") if not f.empty else "no findings: every call is allowed")
"""),
    md("""
## Tokens, spans and plans

`tokens`: each decode token as measured in the trace (µs from its first call to the next token's, GPU
busy µs, launches, its launch-list shape). `plans`: µs per token of each capture plan, **MODELED**
(the trace's measured kernel times, the H200 calibration's launch and replay costs), the saving a
paired difference against the measured eager tokens with its 95 % interval.
"""),
    code("""
rep.token_table[["token", "eager_us", "gpu_busy_us", "kernels", "api_calls", "shape"]].round(1)
"""),
    code("""
rep.plans[["plan", "mode", "graphs_per_token", "predicted_us", "eager_measured_us", "saving_us", "saving_lo",
           "saving_hi", "measurable", "calibration"]].round(1)
"""),
    code("""
for png in sorted(Path(OUT).glob("audit*.png")):
    display(Image(filename=str(png)))
"""),
    md("""
## Against what torch.cuda.graph did

For the engines ds4lab builds, the same decode step was captured with `torch.cuda.graph` (capture
mode global) and replayed against the eager step (`ds4lab audit validate`): the audit's verdict on
the whole token should name the outcome, and the whole-token plan's µs the measured replay (within
20 %).
"""),
    code("""
if torch_run is None:
    print("your own trace: no torch.cuda.graph outcome to compare with (`ds4lab audit validate` checks the "
          "audit against torch on the engines ds4lab builds)")
else:
    verdict, because = predicted_outcome(rep)
    whole = rep.plans.set_index("plan")["predicted_us"].get("whole token")
    replay = torch_run.get("replay_us")
    print(f"torch.cuda.graph: {torch_run['outcome']} — {torch_run['detail']}")
    print(f"audit: {verdict}" + (f" — {because}" if because else "")
          + f"  ({'agrees' if OUTCOMES.get(torch_run['outcome']) == verdict else 'DISAGREES'})")
    if replay and whole:
        print(f"replay: {replay:.0f} µs per step measured (CUDA events) · {whole:.0f} µs predicted (MODELED), "
              f"×{whole / replay:.2f}")
"""),
])

print("wrote", sorted(p.name for p in HERE.glob("*.ipynb")))
