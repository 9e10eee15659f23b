"""The one entry the ``calibrate`` job calls: :func:`fit` makes a calibration from one source (:data:`SOURCES`) with
its tables (:class:`Fitted`); :func:`write_calibration` writes it. A new fit is a module here and a row of
:data:`SOURCES` (``docs/calibration.md``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Each source of a calibration: what it is fitted from.
SOURCES = {
    "gpu": "this GPU: every constant measured (ds4lab.calibration.gpu.calibrate)",
    "long-context": "this GPU: the long-context token's kernels refitted over several positions",
    "moe": "a measured ds4lab moe folder: the tiled routed-MoE kernels",
    "ladder": "measured ds4lab ladder or context folders: the host constants, then checked against each",
    "ds4": "measured ds4lab ds4 folders: ds4's host and kernel costs, checked against ds4 itself",
    "context": "a measured ds4lab context folder of stages 3, 3p, 3cc: pdl_edge_us and graph_conditional_us",
}


@dataclass
class Fitted:
    """A calibration made by :func:`fit`.

    Attributes:
        calibration: the calibration dict (validate it before use).
        tables: its tables by name (pandas): its inputs and checks.
        lines: what a console shows of it (rich markup strings and tables), in order.
        value: the fit's own object where it has one (the tiled MoE fits)."""

    calibration: dict
    tables: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    value: Any = None


def fit(source: str, *, base: dict | None = None, inputs=None, be=None, preset: str | None = None,
        say=None) -> Fitted:
    """A calibration from ``source`` (a key of :data:`SOURCES`).

    Args:
        base: the calibration the fits extend (every source but ``gpu``; parsed, valid).
        inputs: the measured folder(s): ``moe`` and ``context`` one path, ``ladder`` and ``ds4`` several.
        be: the GPU backend (``gpu``, ``long-context``).
        preset: the model (None: each source's default).
        say: a callable given progress lines (None: quiet).

    Raises:
        ValueError: a bad folder or value (named); KeyError: an unknown source."""
    if source not in SOURCES:
        raise KeyError(f"unknown calibration source {source!r}; sources: {', '.join(SOURCES)}")
    return _FITS[source](base=base, inputs=inputs, be=be, preset=preset, say=say)


def _gpu(*, be, preset, say, **_) -> Fitted:
    from .gpu import calibrate

    return Fitted(calibrate(be, preset or "small", console=_Say(say)))


def _long_context(*, base, be, preset, say, **_) -> Fitted:
    from .gpu import calibrate_long_context

    return Fitted(calibrate_long_context(be, base, preset or "ds4-flash", console=_Say(say)))


def _moe(*, base, inputs, **_) -> Fitted:
    from .from_moe import fit_tiled_moe

    fits = fit_tiled_moe(Path(inputs))
    cal = {**base, "kernels": {**base.get("kernels", {}), **fits}}
    cal["source"] = f"{base.get('source', '')}; tiled MoE kernels fitted from {inputs}"
    return Fitted(cal, lines=[f"{k}: {f['fixed_us']} µs + bytes / {f['bandwidth_GBps']} GB/s ({f['samples']} points)"
                              for k, f in fits.items()], value=fits)


def _ladder(*, base, inputs, **_) -> Fitted:
    from . import tables
    from .check import modeled_vs_measured
    from .from_ladder import fit_host_from_ladder

    cal, table = fit_host_from_ladder(base, inputs)
    out = Fitted(cal, {"host_fit": table})
    out.lines = [f"{r.figure}: {r.value:.3f} µs ({r.folder}, context {r.context})" for r in table.itertuples()]
    out.lines += tables.changes(base, cal, ("host_launch_us", "host_graph_call_us", "host_node_update_us"),
                                "the median")
    for i, folder in enumerate(inputs):
        d = modeled_vs_measured(folder, cal)
        out.tables[f"check-{i}"] = d
        out.lines += tables.record_check(folder, d)
    return out


def _ds4(*, base, inputs, preset, **_) -> Fitted:
    from ..report.results import read_meta
    from . import tables
    from .from_ds4 import as_folders, fit_from_ds4

    cal, table, check = fit_from_ds4(base, inputs, preset=preset or "ds4-flash")
    out = Fitted(cal, {"ds4_fit": table, "check": check})
    unfinished = [str(f) for f in as_folders(inputs) if (read_meta(Path(f)) or {}).get("status") != "complete"]
    if unfinished:
        out.lines.append(f"[yellow]note: fitted from a ds4 run that did not finish ({', '.join(unfinished)}: its "
                         "recorded tokens are there; the calibration's source says so)[/]")
    for k in ("host_launch_us", "host_graph_call_us", "eager_gap_us", "kernel_time_scale"):
        out.lines.append(f"{k}: {base.get(k, 1.0 if k == 'kernel_time_scale' else None)} → {cal.get(k)} (median of "
                         f"{int((table.figure == k).sum())} "
                         f"{'recorded contexts' if k == 'kernel_time_scale' else 'recorded tokens'})")
    if cal.get("kernel_time_scale_by_context"):
        out.lines.append("kernel_time_scale_by_context: " + ", ".join(
            f"{c}: {s}" for c, s in cal["kernel_time_scale_by_context"]) + " (log2-linear between these contexts, "
                         "constant outside)")
    out.lines += tables.ds4_check(check)
    return out


def _context(*, base, inputs, preset, say, **_) -> Fitted:
    from . import tables
    from .from_context import fit_capture_stages

    cal, table = fit_capture_stages(base, inputs, preset=preset, say=say)
    return Fitted(cal, {"stages_fit": table}, tables.stages_fit(table, base, cal))


_FITS = {"gpu": _gpu, "long-context": _long_context, "moe": _moe, "ladder": _ladder, "ds4": _ds4, "context": _context}


class _Say:
    """A console for the GPU fits, which print through ``console.print``: the lines go to ``say``."""

    def __init__(self, say) -> None:
        self.say = say

    def print(self, *a, **k) -> None:
        if self.say is not None:
            self.say(*a)


def write_calibration(cal: dict, path: Path) -> None:
    """Write a calibration file (atomically). Raises :class:`ds4lab.errors.CalibrationError` for a path in ds4lab's own
    data folder (:func:`ds4lab.sim.calibration.refuse_shipped`)."""
    from ..report import results
    from ..sim.calibration import refuse_shipped

    path = Path(path)
    refuse_shipped(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    results.write_meta(path, cal)
