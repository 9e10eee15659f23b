"""ds4's own capture ladder (``ds4lab ds4 --stages``) beside ds4lab's MODELED figure for the same stage
(:func:`ladder_table`, :func:`modeled_stages`). Nothing here measures.

    python -m ds4lab.ds4.ladder RESULT (--modeled-from DIR [--modeled-from DIR] [--base CAL] | --modeled CSV) --out FILE
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from . import readout as R
from .configs import REFERENCE, VARIANTS

#: The rungs in order, and the configuration of each (the reference first: ds4 as it ships, eager).
ORDER = (("shipped", REFERENCE), ("0", "stage-0"), ("i", "stage-i"), ("3u", "stage-3u"), ("3", "stage-3"))

LADDER_COLUMNS = ("context", "stage", "config", "build", "tokens", "us_per_token", "iqr_us",
                  "gain_over_0_us", "gain_over_0_lo", "gain_over_0_hi", "gain_over_0_measurable",
                  "vs_shipped_us", "vs_shipped_lo", "vs_shipped_hi", "vs_shipped_measurable",
                  "exact_tokens", "compared_tokens", "first_difference", "launch_calls", "graph_launches",
                  "kernels", "graphs_per_token", "node_updates_per_token", "splits_per_token", "split_calls",
                  "captures_timed", "slot_bytes_per_token")


def _paired(tokens: pd.DataFrame, base: str, other: str, ctx: int) -> dict:
    """base − other per position at ``ctx`` (the gain of ``other``), with its 95 % interval."""
    t = tokens[tokens.context == ctx]
    if base == other or not {base, other} <= set(t.config):
        return {}
    g = R.paired_gain(t, base, other)
    if g.empty:
        return {}
    r = g.iloc[0]
    return {"us": float(r.gain_us), "lo": float(r.gain_lo), "hi": float(r.gain_hi), "measurable": bool(r.measurable)}


def ladder_table(tables: dict) -> pd.DataFrame:
    """The ladder from a ``ds4lab ds4`` folder's tables (:func:`ds4lab.ds4.measure.collect`'s dict): per context and
    stage (``shipped``, ``0``, ``i``, ``3u``, ``3``) µs per token and IQR; ``gain_over_0`` and ``vs_shipped`` (paired
    medians with 95 % intervals); ``exact_tokens`` of ``compared_tokens`` and the first difference; launch calls,
    graph launches and kernels per token (``census``); graphs, node updates and splits per token, graphs made
    during the timed tokens (``captures_timed``: 0 when every timed token replayed a graph made before) and
    argument-slot bytes per token (``capture``)."""
    tokens, summary = tables["tokens"], tables["summary"]
    exact = tables.get("exact", pd.DataFrame())
    capture = tables.get("capture", pd.DataFrame())
    census = tables.get("census", pd.DataFrame())
    rows = []
    for ctx in sorted(int(c) for c in set(summary.context)):
        for stage, cfg in ORDER:
            s = summary[(summary.config == cfg) & (summary.context == ctx)]
            if s.empty:
                continue
            row = {"context": ctx, "stage": stage, "config": cfg, "build": VARIANTS[cfg].build,
                   "tokens": int(s.tokens.iloc[0]), "us_per_token": float(s.us_per_token.iloc[0]),
                   "iqr_us": float(s.iqr_us.iloc[0])}
            for key, base in (("gain_over_0", "stage-0"), ("vs_shipped", REFERENCE)):
                d = _paired(tokens, base, cfg, ctx)
                row.update({f"{key}_us": d.get("us", np.nan), f"{key}_lo": d.get("lo", np.nan),
                            f"{key}_hi": d.get("hi", np.nan), f"{key}_measurable": d.get("measurable")})
            e = exact[(exact.config == cfg) & (exact.context == ctx)] if len(exact) else exact
            if cfg == REFERENCE:
                row.update(exact_tokens=np.nan, compared_tokens=np.nan, first_difference="reference")
            else:
                row.update(exact_tokens=int(e.identical.sum()) if len(e) else np.nan,
                           compared_tokens=len(e) if len(e) else np.nan, first_difference=_first_difference(e))
            c = census[(census.config == cfg) & (census.context == ctx)] if len(census) else census
            for k in ("launch_calls", "graph_launches", "kernels"):
                row[k] = float(c[k].median()) if len(c) else np.nan
            k = capture[(capture.config == cfg) & (capture.context == ctx)] if len(capture) else capture
            if len(k):
                row.update(graphs_per_token=float(k.segments.median()),
                           node_updates_per_token=float(k.nodes_changed.median()),
                           splits_per_token=float(k.splits.median()),
                           split_calls=" ".join(sorted({b for v in k.breaks for b in str(v).split() if b})),
                           captures_timed=int(pd.to_numeric(k.instantiated, errors="coerce").fillna(0).sum()),
                           slot_bytes_per_token=float(pd.to_numeric(k.slot_bytes, errors="coerce").median())
                           if "slot_bytes" in k else np.nan)
            else:
                row.update(graphs_per_token=row["graph_launches"], node_updates_per_token=np.nan,
                           splits_per_token=np.nan, split_calls="", captures_timed=np.nan,
                           slot_bytes_per_token=np.nan)
            rows.append(row)
    return pd.DataFrame(rows, columns=list(LADDER_COLUMNS))


def _first_difference(e: pd.DataFrame) -> str:
    if not len(e):
        return "not compared"
    bad = e[~e.identical.astype(bool)].sort_values("pos")
    if bad.empty:
        return ""
    r = bad.iloc[0]
    return (f"pos {int(r.pos)}: logit {int(r.first_diff)} {r.reference_value!r} → {r.value!r} "
            f"({int(r.n_diff)} differ, max |Δ| {r.max_abs_diff:.3g}, argmax {'same' if r.argmax_same else 'differs'})")


#: ds4lab's stage of the sim for each rung of ds4's ladder (``shipped`` is ds4 eager: the sim's stage 0).
SIM_STAGE = {"shipped": "0", "0": "0", "i": "i", "3u": "3u", "3": "3"}


def modeled_stages(folders, *, base=None, stages=("0", "i", "3u", "3"), tokens: int = 32) -> pd.DataFrame:
    """ds4lab's MODELED µs per token of ``stages`` at every context of the ``ds4lab ds4`` ``folders``, the sim priced
    at ds4's costs fitted from them (:func:`ds4lab.calibration.from_ds4.fit_from_ds4`) on top of ``base``. Columns
    ``context``, ``stage``, ``modeled_us``, ``kernel_time_scale``, ``sample`` (fitted / held out)."""
    from ..calibration.from_ds4 import fit_from_ds4
    from ..sim.calibration import read
    from ..sim.costmodel import default_calibration_path

    cal = read(Path(base) if base else default_calibration_path())
    _, _, check = fit_from_ds4(cal, [Path(f) for f in folders], stages=",".join(stages), tokens=tokens)
    m = check[["context", "stage", "modeled_us", "kernel_time_scale", "sample"]].drop_duplicates(["context", "stage"])
    return m.reset_index(drop=True)


def with_modeled(ladder: pd.DataFrame, modeled: pd.DataFrame, tolerance: float = 0.10) -> pd.DataFrame:
    """``ladder`` with each rung's MODELED µs per token (:data:`SIM_STAGE`), ``modeled / measured`` and ``agrees``
    (within ``tolerance``); a context the model was not run at is left blank."""
    m = modeled.set_index(["context", "stage"])["modeled_us"]
    out = ladder.copy()
    out["sim_stage"] = out.stage.map(SIM_STAGE)
    out["modeled_us"] = [m.get((int(c), s), np.nan) for c, s in zip(out.context, out.sim_stage)]
    out["modeled_over_measured"] = out.modeled_us / out.us_per_token
    out["agrees"] = [None if m != m else bool(abs(r - 1) <= tolerance)
                     for m, r in zip(out.modeled_us, out.modeled_over_measured)]
    return out


def main(argv=None) -> int:
    """``python -m ds4lab.ds4.ladder RESULT --modeled-from DIR ... --out FILE``: a measured folder's ladder with the
    MODELED column (no GPU)."""
    import click

    @click.command()
    @click.argument("result", type=click.Path(exists=True, file_okay=False))
    @click.option("--modeled-from", "modeled_from", multiple=True, type=click.Path(exists=True),
                  help="measured ds4lab ds4 folders the sim's ds4 costs are fitted from (calibrate --from-ds4)")
    @click.option("--base", type=click.Path(exists=True), default=None, help="calibration the fit starts from")
    @click.option("--modeled", type=click.Path(exists=True, dir_okay=False), default=None,
                  help="a table modeled_stages wrote before (context, stage, modeled_us), instead of --modeled-from")
    @click.option("--out", type=click.Path(), required=True, help="CSV to write (refused if it exists)")
    def cli(result, modeled_from, base, modeled, out):
        if Path(out).exists():
            raise click.BadParameter(f"{out} exists: give a new file", param_hint="--out")
        if bool(modeled) == bool(modeled_from):
            raise click.UsageError("give either --modeled FILE or --modeled-from DIR (one or more)")
        ladder = pd.read_csv(Path(result) / "ladder.csv", keep_default_na=False, na_values=[""])
        m = pd.read_csv(modeled, dtype={"stage": str}) if modeled else modeled_stages(modeled_from, base=base)
        table = with_modeled(ladder, m)
        table.to_csv(out, index=False)
        click.echo(table[["context", "stage", "us_per_token", "modeled_us", "modeled_over_measured",
                          "exact_tokens", "compared_tokens"]].to_string(index=False))

    return cli.main(args=argv, standalone_mode=False) or 0


if __name__ == "__main__":
    raise SystemExit(main())
