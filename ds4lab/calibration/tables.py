"""The calibration's tables as a console shows them (rich renderables, nothing printed): :func:`record_check`,
:func:`ds4_check`, :func:`stages_fit`, :func:`changes`."""

from __future__ import annotations

from .record import TOLERANCE


def _table(title: str, caption: str, columns, left=()):
    from rich.table import Table

    t = Table(title=title, caption=caption)
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right")
    return t


def _preset_note(changed: dict, what: str) -> list[str]:
    if not changed:
        return []
    return [f"[yellow]{what} is not today's (" + "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in changed.items())
            + "): the sim models today's token[/]"]


def record_check(folder, d) -> list:
    """The sim with a calibration against one measured folder, stage by stage (``d``: ``modeled_vs_measured``'s)."""
    out = _preset_note(d.attrs.get("preset_changes") or {}, f"{folder}: its {d['preset'].iloc[0]}")
    if out:
        out[0] = out[0].replace("[/]", ", so the ratios below compare two tokens[/]")
    t = _table(str(folder), "modeled (sim, this calibration) / measured, stage by stage",
               ("context", "stage", "measured µs", "modeled µs", "ratio", f"within ±{TOLERANCE:.0%}"),
               left=("stage",))
    for r in d.itertuples():
        t.add_row(str(r.context), r.stage, f"{r.measured_us:,.0f}", f"{r.modeled_us:,.0f}", f"{r.ratio:.3f}",
                  "yes" if r.agrees else f"OUTSIDE ±{TOLERANCE:.0%}")
    return out + [t]


def ds4_check(check) -> list:
    """The ``--from-ds4`` check: modeled / measured per context and stage, factor, fitted or held out."""
    folders = "folder" in check and check.folder[check.folder != ""].nunique() > 1
    cols = ("context", "context is", "kernel factor", "stage", "ds4", "measured µs", "modeled µs", "ratio",
            "within ±10 %", "gain over i µs")
    t = _table("the sim at ds4's costs against ds4 itself",
               "stage 0 ↔ islands off, i ↔ islands on (measured); 3, 3cc, 3ccp: MODELED, what ds4 does not ship; "
               "held out: a context whose kernel time factor was not fitted there",
               (("folder",) if folders else ()) + cols, left=("folder", "context is", "stage", "ds4"))
    for r in check.to_dict("records"):
        meas = r["measured_us"] == r["measured_us"]  # not NaN
        gain = r.get("gain_over_i_us")
        t.add_row(*((str(r.get("folder") or ""),) if folders else ()), str(r["context"]), str(r.get("sample", "")),
                  f"{r['kernel_time_scale']:.4f}" if "kernel_time_scale" in r else "",
                  r["stage"], r["ds4"] or "—", f"{r['measured_us']:,.0f}" if meas else "—",
                  f"{r['modeled_us']:,.0f}", f"{r['ratio']:.3f}" if meas else "—",
                  ("yes" if r["agrees"] else "OUTSIDE") if meas else "MODELED",
                  f"{gain:,.0f}" if gain is not None and gain == gain else "")
    return [t]


def stages_fit(table, base: dict, cal: dict) -> list:
    """:func:`~ds4lab.calibration.from_context.fit_capture_stages`'s table and each constant's change."""
    from ..sim.costmodel import OPTIONAL, guessed
    from .from_context import FITTED

    out = _preset_note(table.attrs.get("preset_changes") or {}, "the folder's preset")
    t = _table("pdl_edge_us and graph_conditional_us fitted to the measured paired gains over stage 3",
               "value: where the sim's gain equals the measured one; interval: from the measured gain's 95 % "
               "interval; calibration: max(0, median) over the measurable contexts",
               ("constant", "stage", "context", "measured gain µs (95 % CI)", "sim µs/µs", "value µs",
                "interval µs", "linear", "status", "sim gain at calibration µs"),
               left=("constant", "stage", "status", "linear"))
    for r in table.to_dict("records"):
        fit = r["value"] == r["value"]
        at = r["sim_gain_at_calibration_us"]
        t.add_row(r["figure"], r["stage"], str(r["context"]),
                  f"{r['measured_gain_us']:+.1f} ({r['measured_gain_lo_us']:+.1f}…{r['measured_gain_hi_us']:+.1f})",
                  f"{r['slope_us_per_us']:.1f}", f"{r['value']:.3f}" if fit else "—",
                  f"{r['value_lo']:.3f}…{r['value_hi']:.3f}" if fit else "—",
                  "" if r["linear"] is None else "yes" if r["linear"] else "NO", r["status"],
                  f"{at:+.1f}" if at == at else "—")
    out.append(t)
    before, after = guessed(base), guessed(cal)
    for f in FITTED:
        old = base.get(f, OPTIONAL[f])
        n = int(table[(table.figure == f) & table.value.notna()].shape[0])
        out.append(f"{f}: {old} ({'GUESS' if f in before else 'MEASURED'}) → {cal.get(f, old)} "
                   f"({'GUESS' if f in after else 'MEASURED'}"
                   + (f", median of {n} measurable context{'s' if n != 1 else ''})" if n
                      else ": no context measurable, kept)"))
    return out


def changes(base: dict, cal: dict, keys, how: str) -> list[str]:
    """One line per key of ``keys``: its value in ``base`` and in ``cal`` (``how``: what the new value is)."""
    return [f"{k}: {base.get(k)} → {cal.get(k)} ({how})" for k in keys]
