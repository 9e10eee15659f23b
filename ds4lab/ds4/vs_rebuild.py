"""ds4 itself beside ds4lab's rebuild of it (notebook ``06_ds4_itself``, ``docs/ds4.md``): :class:`Beside` holds the
tables for one ds4 record, each naming where every figure came from. Nothing here measures anything."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

#: ds4lab's records of its own token on the H200 that the side-by-side tables read by default (the
#: newest measured ladder with ds4's islands, and the newest context ladder), relative to the checkout.
_ROOT = Path(__file__).resolve().parents[2]
LAB_LADDER_RECORD = _ROOT / "docs/measurements/h200-2026-12-01/round3/islands"
LAB_CONTEXT_RECORD = _ROOT / "docs/measurements/h200-2026-12-01/round3/context"

#: Kernel kinds by name (first match wins), for ds4's and ds4lab's kernels alike: a coarse map, since
#: the two engines' kernels are different code (ds4's names are its own).
KINDS = (("routed MoE", r"moe|expert|iq2|q2_k|q2k|mmid|mmvq"),
         ("attention", r"attn|attention|score|softmax|flash|kv_|sink"),
         ("router", r"router|gate_inp|route|hash"),
         ("compressor / indexer / top-k", r"compress|indexer|topk|top_k|sort|select"),
         ("f16 matmul (cuBLAS, ds4's f16 pair)", r"nvjet|matmul_f16|f16_pair"),
         ("matvec (Q8_0)", r"q8|matvec|gemv|mul_mat|gemm|cublas|sgemm|hgemm"),
         ("norm / RoPE / hyper-connections", r"norm|rope|hc_|mix|split|expand|swiglu|silu"),
         ("other", r"."))


def kernel_kind(name: str) -> str:
    """The :data:`KINDS` label of a kernel name (case-insensitive regex, first match)."""
    low = str(name).lower()
    for label, pat in KINDS:
        if re.search(pat, low):
            return label
    return "other"


@dataclass
class Ds4Record:
    """A ``ds4lab ds4`` result folder, read: ``meta`` and its tables (absent ones empty)."""

    folder: Path
    meta: dict
    summary: pd.DataFrame
    gains: pd.DataFrame
    census: pd.DataFrame
    islands: pd.DataFrame
    kernels: dict = field(default_factory=dict)  # (config, context) -> per-kernel table
    #: ds4's own capture ladder (``ladder.csv`` of a ``--stages`` run), empty otherwise
    ladder: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def label(self) -> str:
        """``ds4 <commit> · <GPU> · driver <driver>``: how each ds4 figure is named."""
        m = self.meta
        return f"ds4 {m.get('ds4_commit') or '?'} · {m.get('gpu', '?')} · driver {m.get('driver', '?')}"


def read_ds4(folder) -> Ds4Record:
    """Read a ``ds4lab ds4`` folder. Raises ValueError when ``folder`` has no ``meta.json`` of job ``ds4`` (named)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder (a ds4lab ds4 result folder, e.g. results/ds4-b0309611)")
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    if meta.get("job") != "ds4":
        raise ValueError(f"{folder}: not a ds4lab ds4 result folder (no meta.json of job ds4)")

    def table(name):
        p = folder / name
        return pd.read_csv(p) if p.is_file() else pd.DataFrame()

    kernels = {}
    for p in sorted(folder.glob("kernels-*-*.csv")):
        cfg, ctx = p.stem[len("kernels-"):].rsplit("-", 1)
        kernels[(cfg, int(ctx))] = pd.read_csv(p)
    return Ds4Record(folder, meta, table("summary.csv"), table("gains.csv"), table("census.csv"),
                     table("islands.csv"), kernels, table("ladder.csv"))


def _lab_record(folder) -> tuple[dict, pd.DataFrame]:
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    name = "context.csv" if (folder / "context.csv").is_file() else "ladder.csv"
    return meta, pd.read_csv(folder / name, dtype={"stage": str})


def _rel(folder: Path) -> str:
    """``folder`` relative to the checkout where it lies inside it (records are named so in docs)."""
    try:
        return str(Path(folder).resolve().relative_to(_ROOT))
    except ValueError:
        return str(folder)


def _lab_label(meta: dict) -> str:
    return (f"ds4lab {meta.get('source_digest', meta.get('git_revision', '?'))} · {meta.get('device', '?')} · "
            f"driver {meta.get('driver', '?')} · CuPy {meta.get('cupy', '?')}")


def lab_census(contexts=(1024,), preset: str = "ds4-flash") -> pd.DataFrame:
    """ds4lab's launch census of its ``preset`` token (long context) at each position in ``contexts``, by cluster,
    counted on a timing-only sim (:func:`ds4lab.experiments.launch_list.census`)."""
    from ..backends import make_backend
    from ..experiments.launch_list import census
    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions

    model = DecodeModel(get_preset(preset, long_context=True), make_backend("sim", timing_only=True),
                        TokenOptions(vocab=True))
    rows = []
    for c in contexts:
        r = census(model, int(c))
        by = model.L.census.frame()
        kern = by[by["kind"] == "kernel"] if "kind" in by.columns else by
        per_cluster = kern.groupby("cluster")["launches"].sum().to_dict() if "cluster" in kern.columns else {}
        rows.append({"context": int(c), "kernels": r["kernels"], "launches": r["launches"],
                     **{f"cluster {k}": v for k, v in sorted(per_cluster.items())}})
    return pd.DataFrame(rows)


def census_table(rec: Ds4Record | None, lab_ladder=LAB_LADDER_RECORD, contexts=(1024,)) -> pd.DataFrame:
    """Launches per token, ds4 beside ds4lab: eager kernel launches and graph launches with the islands off and on, and
    the kernels that ran (ds4: CUPTI records of its recorded tokens; ds4lab: its ladder record's stages 0 and i, and
    its model's census at ``contexts``). ``source`` names each row's origin."""
    rows = []
    if rec is not None and not rec.census.empty:
        for (cfg, ctx), g in rec.census.groupby(["config", "context"]):
            rows.append({"engine": "ds4", "configuration": cfg, "context": ctx,
                         "kernel launches": float(g.launch_calls.median()),
                         "graph launches": float(g.graph_launches.median()), "kernels run": float(g.kernels.median()),
                         "source": f"{rec.label} (CUPTI, {len(g)} tokens)"})
    lab_ladder = Path(lab_ladder)
    if (lab_ladder / "meta.json").is_file():
        meta, t = _lab_record(lab_ladder)
        for st, cfg in (("0", "stage 0 (islands off)"), ("i", "stage i (islands on)")):
            r = t[t.stage == st]
            if len(r):
                r = r.iloc[0]
                rows.append({"engine": "ds4lab", "configuration": cfg, "context": int(r.context),
                             "kernel launches": float(r.kernel_launches), "graph launches": float(r.graph_launches),
                             "kernels run": float("nan"), "source": f"{_lab_label(meta)} ({_rel(lab_ladder)})"})
    for r in lab_census(contexts).to_dict("records"):
        rows.append({"engine": "ds4lab", "configuration": "stage 0, long-context token (counted)",
                     "context": r["context"], "kernel launches": float(r["kernels"]), "graph launches": 0.0,
                     "kernels run": float(r["kernels"]), "source": "ds4lab's model of the token (launch census)"})
    return pd.DataFrame(rows)


def host_table(rec: Ds4Record | None, calibration=None) -> pd.DataFrame:
    """Host µs per eager launch: ds4 (C, its host span per token to its last launch over its launch calls, and CUPTI's
    median launch call, islands off) beside ds4lab (Python: the calibration's ``host_launch_us``, fitted from a
    measured ladder; the calibration's name and source on the row)."""
    from ..sim.costmodel import Calibration

    rows = []
    if rec is not None and not rec.census.empty:
        off = rec.census[rec.census.config == "islands-off"]
        if len(off):
            rows.append({"engine": "ds4 (C)", "µs per launch": float((off.enqueue_us / off.launch_calls).median()),
                         "what": "host span to the last launch / launch calls, per token (CUPTI on)",
                         "source": rec.label})
            rows.append({"engine": "ds4 (C)", "µs per launch": float(off.launch_call_us.median()),
                         "what": "one launch call (CUPTI runtime record)", "source": rec.label})
    cal = Calibration.load(calibration)
    rows.append({"engine": "ds4lab (Python)", "µs per launch": float(cal.host_launch_us),
                 "what": "host_launch_us of the calibration (fitted from a measured ladder)",
                 "source": f"{cal.name} ({cal.path or 'shipped'})"})
    return pd.DataFrame(rows)


def gain_table(rec: Ds4Record | None, lab_context=LAB_CONTEXT_RECORD, lab_ladder=LAB_LADDER_RECORD) -> pd.DataFrame:
    """What capture buys, per context: ds4's islands on against off (µs per token, the ratio, the gain paired by
    position with its 95 % interval) beside ds4lab's stage i against stage 0 (its measured ladder and context
    records). ``source`` names each row's origin; ``pair`` says whether the other engine ran the same context
    (``both engines``), or which did not (a context is a position: ds4lab's ladder at 1 000 is not ds4's 1 024)."""
    rows = []
    if rec is not None and not rec.gains.empty:
        g = rec.gains
        # islands on against off (ds4 as it ships); where a context has none, ds4's capture ladder's stage i
        # against stage 0 (the rewritten build, accessor unset): the same plan, the like of ds4lab's stage i over 0
        shipped = g[(g.base == "islands-off") & (g.other == "islands-on")] if "base" in g else g[g.other == "islands-on"]
        ladder = g[(g.base == "stage-0") & (g.other == "stage-i")] if "base" in g else g.iloc[:0]
        ladder = ladder[~ladder.context.isin(shipped.context)]
        for r in pd.concat([shipped, ladder]).to_dict("records"):
            via = "" if r["other"] == "islands-on" else ", stage i against stage 0"
            rows.append({"engine": "ds4", "context": int(r["context"]), "eager µs": r["base_us"],
                         "islands µs": r["other_us"], "× faster": r["ratio"],
                         "gain µs (95 % CI)": (f"{r['gain_us']:.0f} ({r['gain_lo']:.0f}…{r['gain_hi']:.0f})"
                                               if r["measurable"] else
                                               f"not measurable ({r['gain_lo']:.0f}…{r['gain_hi']:.0f})"),
                         "source": rec.label + via})
    for folder in (Path(lab_ladder), Path(lab_context)):
        if not (folder / "meta.json").is_file():
            continue
        meta, t = _lab_record(folder)
        for ctx, g in t.groupby("context"):
            s = g.set_index("stage")
            if "0" in s.index and "i" in s.index:
                gain = (f"{s.loc['i', 'gain_us']:.0f} ({s.loc['i', 'gain_lo']:.0f}…{s.loc['i', 'gain_hi']:.0f})"
                        if "gain_us" in s.columns and s.loc["i", "gain_us"] == s.loc["i", "gain_us"] else "—")
                rows.append({"engine": "ds4lab", "context": int(ctx), "eager µs": float(s.loc["0", "us_median"]),
                             "islands µs": float(s.loc["i", "us_median"]),
                             "× faster": float(s.loc["0", "us_median"] / s.loc["i", "us_median"]),
                             "gain µs (95 % CI)": gain, "source": f"{_lab_label(meta)} ({_rel(folder)})"})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows).drop_duplicates(["engine", "context"])  # one ds4lab row a context (the ladder's first)
    engines = df.groupby("context")["engine"].agg(set)
    df["pair"] = [("both engines" if len(engines[c]) > 1 else
                   f"no pair: {'ds4lab' if e == 'ds4' else 'ds4'} ran no {c}") for e, c in zip(df.engine, df.context)]
    return df.sort_values(["context", "engine"], ignore_index=True)


def kernel_kinds(rec: Ds4Record, config: str = "islands-off") -> pd.DataFrame:
    """ds4's kernel µs per token by :data:`KINDS` (its recorded tokens, ``config``, every context recorded), with the
    launches per token of each kind."""
    rows = []
    for (cfg, ctx), k in rec.kernels.items():
        if cfg != config or k.empty:
            continue
        k = k.assign(kind=k["name"].map(kernel_kind))
        g = k.groupby("kind").agg(launches=("per_token", "sum"), us=("us_per_token", "sum")).reset_index()
        rows.append(g.assign(context=ctx))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["kind", "launches", "us", "context"])


#: ds4lab's rebuild's per-op record of its ds4-flash token at 1k on the H200 (the one per-launch-site record
#: of the rebuild: ``ds4lab bench --per-op``), for the census by kind.
LAB_PER_OP_RECORD = _ROOT / "docs/measurements/h200-2026-12-01/kernels/call2/per_op.csv"

#: Work in ds4's token that ds4lab's rebuild leaves out (docs/model.md, "The differences, by kind"): label,
#: the ds4 kernel names (regex), and how much of those kernels' µs is that work. Read from ds4's recorded
#: kernels; ``share`` < 1 where one ds4 kernel serves two purposes (``rope_tail_kernel``: the inverse RoPE
#: of the attention output is 43 of its launches a token, the rest compressor and indexer rows).
OMISSIONS = (
    ("compressor (absent from the rebuild's short token)", r"^(matmul_f16_pair_ordered_chunks|compressor_store|"
     r"compressor_update_pool|compressor_shift_ratio4|rms_norm_weight)_kernel", None),
    ("activation quantization before each Q8_0 matvec", r"^quantize_q8_0_(f32|group_slice_rows)_kernel", None),
    ("f16 conversion for ds4's cuBLAS calls", r"^f32_to_f16_kernel", None),
    ("cuBLAS split-K reduction", r"splitKreduce", None),
    ("FP8 round trip of compressed rows", r"^fp8_kv_quantize_kernel", None),
    ("QAT Hadamard rotations (indexer)", r"^indexer_hadamard_fp4_kernel", None),
    ("inverse RoPE of the attention output (43 rope_tail launches a token)", r"^rope_tail_kernel", 43),
)


def kind_census(ds4_kernels: dict, lab_per_op=LAB_PER_OP_RECORD) -> pd.DataFrame:
    """Launches and kernel µs per token by :data:`KINDS`, ds4 (``ds4_kernels``: context → its
    ``kernels-islands-off-<context>.csv``) against the rebuild (``lab_per_op``, at 1k). One row per kind and context:
    ``ds4_launches``, ``ds4_us``, ``rebuild_launches``, ``rebuild_us`` (blank without a record),
    ``ds4_minus_rebuild_us``."""
    lab = pd.read_csv(lab_per_op) if lab_per_op is not None and Path(lab_per_op).is_file() else pd.DataFrame()
    if len(lab):
        lab = lab.assign(kind=[kernel_kind(f"{k} {c}") for k, c in zip(lab.kernel, lab.cluster)])
        lab_by = lab.groupby("kind").agg(rebuild_launches=("launches", "sum"), rebuild_us=("us", "sum"))
    rows = []
    for ctx, k in sorted(ds4_kernels.items()):
        g = k.assign(kind=k["name"].map(kernel_kind)).groupby("kind").agg(
            ds4_launches=("per_token", "sum"), ds4_us=("us_per_token", "sum"))
        kinds = sorted(set(g.index) | (set(lab_by.index) if len(lab) and ctx == 1024 else set()))
        for kind in kinds:
            r = {"context": int(ctx), "kind": kind,
                 "ds4_launches": float(g.ds4_launches.get(kind, 0.0)), "ds4_us": float(g.ds4_us.get(kind, 0.0))}
            has_lab = len(lab) and int(ctx) == 1024  # the rebuild's per-op record is its 1k token
            r["rebuild_launches"] = float(lab_by.rebuild_launches.get(kind, 0.0)) if has_lab else float("nan")
            r["rebuild_us"] = float(lab_by.rebuild_us.get(kind, 0.0)) if has_lab else float("nan")
            r["ds4_minus_rebuild_us"] = r["ds4_us"] - r["rebuild_us"]
            rows.append(r)
    return pd.DataFrame(rows)


def omissions(ds4_kernels: dict) -> pd.DataFrame:
    """Each piece of :data:`OMISSIONS` with its launches and µs per token in ds4's recorded tokens per context of
    ``ds4_kernels``; a kernel serving two purposes counts the omitted work's share of its launches."""
    import re as _re

    rows = []
    for ctx, k in sorted(ds4_kernels.items()):
        base = k["name"].str.replace(r"^void ", "", regex=True)
        for label, pat, launches in OMISSIONS:
            sel = k[base.map(lambda n: bool(_re.search(pat, n)))]
            n, us = float(sel.per_token.sum()), float(sel.us_per_token.sum())
            if launches is not None and n:
                us, n = us * min(1.0, launches / n), min(float(launches), n)
            rows.append({"context": int(ctx), "omitted in the rebuild": label, "ds4_launches": n, "ds4_us": us})
    return pd.DataFrame(rows)


def gain_figure(gains: pd.DataFrame):
    """µs per token eager and with islands, ds4 beside ds4lab, at the contexts both engines ran (bars,
    :func:`ds4lab.report.plots.grouped_bars_figure`; :func:`gain_table`'s ``pair``); what has no pair is named under
    the title, not drawn. ``None`` for an empty table. The title names where each engine's figures came from."""
    if gains is None or gains.empty:
        return None
    from ..report import plots

    both = gains[gains["pair"] == "both engines"] if "pair" in gains else gains
    alone = gains.drop(both.index)
    xs = [f"{r['engine']} @{r['context']}" for r in both.to_dict("records")]
    series = {"islands off / stage 0": dict(zip(xs, both["eager µs"])),
              "islands on / stage i": dict(zip(xs, both["islands µs"]))}
    title = ("What ds4's decode islands buy: ds4 itself against ds4lab's rebuild, at the contexts both ran\n"
             + "\n".join(sorted({re.sub(r" \(.*\)$", "", s) for s in gains["source"]})))
    if len(alone):
        title += "\nno pair, not drawn: " + ", ".join(f"{e} @{c}" for e, c in zip(alone.engine, alone.context))
    if both.empty:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 2.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "no context that both engines ran", ha="center", va="center")
        ax.set_title(title, fontsize=9)
        return fig
    return plots.grouped_bars_figure(series, xs, "µs per decode token (median, CUDA events)", title, rotate=True)


#: The rungs set side by side: ds4's (``ladder.csv`` stage) and ds4lab's rebuild's (its ladder record's stage).
LADDER_RUNGS = (("0", "0"), ("i", "i"), ("3u", "3u"), ("3", "3"))


def ladder_table(rec: Ds4Record | None, lab_ladder=LAB_LADDER_RECORD) -> pd.DataFrame:
    """ds4's own capture ladder (a ``ds4lab ds4 --stages`` folder) beside the rebuild's measured ladder (stages 0, i,
    3u, 3), one row per engine, context and stage, ``source`` naming each; stage 3 is the rebuild's alone."""
    rows = []
    lad = rec.ladder if rec is not None else pd.DataFrame()
    for r in lad.to_dict("records") if len(lad) else ():
        rows.append({"engine": "ds4", "context": int(r["context"]), "stage": str(r["stage"]),
                     "µs per token": float(r["us_per_token"]),
                     "exact": (f"{int(r['exact_tokens'])} / {int(r['compared_tokens'])}"
                               if r["exact_tokens"] == r["exact_tokens"] else "reference"),
                     "source": rec.label})
    lab_ladder = Path(lab_ladder)
    if (lab_ladder / "meta.json").is_file():
        meta, t = _lab_record(lab_ladder)
        for _, stage in LADDER_RUNGS:
            r = t[t.stage == stage]
            if len(r):
                r = r.iloc[0]
                rows.append({"engine": "ds4lab rebuild", "context": int(r.context), "stage": stage,
                             "µs per token": float(r.us_median), "exact": "exact" if bool(r.exact) else "NOT exact",
                             "source": f"{_lab_label(meta)} ({_rel(lab_ladder)})"})
    return pd.DataFrame(rows, columns=["engine", "context", "stage", "µs per token", "exact", "source"])


def ladder_figure(table: pd.DataFrame):
    """µs per token by stage, ds4 beside ds4lab's rebuild (:func:`ds4lab.report.plots.grouped_bars_figure`), the title
    naming each engine's source; ``None`` for an empty table."""
    if table is None or table.empty:
        return None
    from ..report import plots

    stages = [s for s in ("shipped", "0", "i", "3u", "3") if s in set(table.stage)]
    series = {f"{e} @{c}": dict(zip(g.stage, g["µs per token"]))
              for (e, c), g in table.groupby(["engine", "context"], sort=True)}
    title = ("The capture ladder: ds4 itself (stages on ds4 rewritten by ds4lab) beside ds4lab's rebuild\n"
             + "\n".join(sorted({re.sub(r" \(.*\)$", "", s) for s in table["source"]})))
    return plots.grouped_bars_figure(series, stages, "µs per decode token (median, CUDA events)", title)


@dataclass
class Beside:
    """ds4 beside ds4lab's rebuild for one ds4 record (``record``: a :func:`read_ds4` folder, or None: the rebuild's
    side alone), each table and figure of this module one method away."""

    record: Ds4Record | None

    @property
    def label(self) -> str:
        """The record's :attr:`Ds4Record.label`, or what there is without one."""
        return self.record.label if self.record is not None else "no ds4 record: ds4lab's side only"

    @property
    def islands(self) -> pd.DataFrame:
        """What ds4's log says its islands captured and retired, per configuration (``islands.csv``)."""
        return self.record.islands if self.record is not None else pd.DataFrame()

    def ladder(self) -> pd.DataFrame:
        """:func:`ladder_table`."""
        return ladder_table(self.record)

    def ladder_figure(self):
        """:func:`ladder_figure` of :meth:`ladder` (None where it is empty)."""
        return ladder_figure(self.ladder())

    def census(self, contexts=(1024,)) -> pd.DataFrame:
        """:func:`census_table` (ds4lab's model counted at ``contexts``)."""
        return census_table(self.record, contexts=contexts)

    def host(self) -> pd.DataFrame:
        """:func:`host_table`."""
        return host_table(self.record)

    def gains(self) -> pd.DataFrame:
        """:func:`gain_table`."""
        return gain_table(self.record)

    def gain_figure(self):
        """:func:`gain_figure` of :meth:`gains` (None where it is empty)."""
        return gain_figure(self.gains())

    def kernel_kinds(self, config: str = "islands-off") -> pd.DataFrame:
        """:func:`kernel_kinds` (empty without a record)."""
        return kernel_kinds(self.record, config) if self.record is not None else pd.DataFrame()

    def by_kind(self) -> pd.DataFrame:
        """:func:`kind_census` of the record's islands-off kernels at each recorded context."""
        return kind_census(self._off_kernels())

    def omissions(self) -> pd.DataFrame:
        """:func:`omissions` of the record's islands-off kernels at each recorded context."""
        return omissions(self._off_kernels())

    def _off_kernels(self) -> dict:
        kernels = self.record.kernels if self.record is not None else {}
        return {ctx: k for (cfg, ctx), k in kernels.items() if cfg == "islands-off"}

