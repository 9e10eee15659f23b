"""``ds4lab calibrate``: the sim's cost-model parameters measured on this GPU
(:func:`ds4lab.measure.calibrate.calibrate`), or, with no GPU, the tiled MoE kernels fitted from a
measured ``ds4lab moe`` folder (:func:`ds4lab.measure.calibrate.fit_tiled_moe`) or the host
constants from measured ladders (:func:`ds4lab.measure.calibrate.fit_host_from_ladder`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..measure.calibrate import (calibrate, calibrate_long_context, fit_host_from_ladder, fit_tiled_moe,
                                 write_calibration)
from ..sim.costmodel import default_calibration_path
from .common import BadInput, default_preset
from .result import JobResult, no_folder


@dataclass
class CalibrateConfig:
    """Arguments of ``ds4lab calibrate``: ``preset`` whose eager tokens and kernels are measured;
    ``out`` the calibration file to write; ``moe_profile`` a ``ds4lab moe`` folder (no GPU: add
    tiled-kernel fits to ``base``, default the shipped calibration)."""

    preset: str | None = None
    out: Path | str = "results/calibration.json"
    moe_profile: Path | str | None = None
    base: Path | str | None = None
    #: GPU: refit the long-context token's kernels in ``base`` (lines over positions 4 095, 16 383 and
    #: 65 535: :data:`ds4lab.measure.calibrate.LONG_CONTEXT_POSITIONS`).
    long_context: bool = False
    #: No GPU: measured ``ds4lab ladder``/``context`` folders whose host times refit ``base``'s
    #: ``host_launch_us`` and ``host_node_update_us``.
    from_ladder: tuple = ()


def check_config(cfg: CalibrateConfig) -> None:
    """Checks that need no GPU, before any work: ``out`` is not a shipped calibration (nor any file
    in ds4lab's data folder), not a folder; ``base`` (with ``moe_profile`` or ``long_context``) is a
    valid calibration (:func:`ds4lab.sim.calibration.read`: every key against the schema).

    Raises:
        ds4lab.errors.CalibrationError: a shipped ``out``, or an invalid ``base`` (names the file
            and every bad key; exit 2).
        BadInput: ``out`` is a folder.
    """
    from ..sim.calibration import read, refuse_shipped

    out = Path(cfg.out)
    refuse_shipped(out)
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder: name the calibration file to write")
    modes = [m for m, on in (("--moe-profile", cfg.moe_profile is not None), ("--long-context", cfg.long_context),
                             ("--from-ladder", bool(cfg.from_ladder))) if on]
    if len(modes) > 1:
        raise BadInput(f"{' and '.join(modes)}: choose one way to extend --base per run")
    if modes:
        read(Path(cfg.base) if cfg.base else default_calibration_path())


def _replaceable(path: Path) -> str | None:
    """None when the file at ``path`` is a calibration (ds4lab may replace it), else why not."""
    import json

    try:
        d = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return f"{path} is not a calibration file (not JSON)"
    if not (isinstance(d, dict) and "name" in d and "host_launch_us" in d):
        return f"{path} is not a calibration file (no name and host_launch_us keys)"
    return None


def _check_against(cal: dict, folders, console) -> list:
    """Print the sim's modeled stages with ``cal`` against each measured folder
    (:func:`ds4lab.jobs.sim_check.modeled_vs_measured`); returns the tables, one per folder."""
    from rich.table import Table

    from .sim_check import TOLERANCE, modeled_vs_measured

    found = []
    for folder in folders:
        d = modeled_vs_measured(folder, cal)
        found.append(d)
        changed = d.attrs.get("preset_changes") or {}
        if changed:
            console.print(f"[yellow]{folder}: its {d['preset'].iloc[0]} is not today's (" +
                          "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in changed.items()) +
                          "): the sim models today's token, so the ratios below compare two tokens[/]")
        t = Table(title=str(folder), caption="modeled (sim, this calibration) / measured, stage by stage")
        for c in ("context", "stage", "measured µs", "modeled µs", "ratio", f"within ±{TOLERANCE:.0%}"):
            t.add_column(c, justify="left" if c in ("stage", "") else "right")
        for r in d.itertuples():
            t.add_row(str(r.context), r.stage, f"{r.measured_us:,.0f}", f"{r.modeled_us:,.0f}", f"{r.ratio:.3f}",
                      "yes" if r.agrees else f"OUTSIDE ±{TOLERANCE:.0%}")
        console.print(t)
    return found


def run(cfg: CalibrateConfig, be, console) -> JobResult:
    """Measure on ``be`` (a GPU) and write ``cfg.out``; with ``moe_profile`` or ``from_ladder``,
    ``be`` is unused (None is fine) and the fits are added to ``base`` (``from_ladder``: then the
    sim with the new file is compared with each folder, stage by stage). Returns the
    :class:`~ds4lab.jobs.result.JobResult`: the calibration written is its ``value`` and its one
    file; ``from_ladder`` adds the tables ``host_fit`` and, per folder, ``check-<n>`` (modeled against
    measured).

    ``out`` is checked before any measurement (:func:`check_config`), locked for the whole run
    (:func:`ds4lab.report.results.output_file`: a second calibration into the same file is
    refused), and written only when complete and valid against the schema; an interrupted or
    failed run leaves the file as it was.

    Raises:
        ds4lab.errors.CalibrationError: ``out`` a shipped calibration, ``base`` invalid, or the
            result not a valid calibration.
        BadInput: ``out`` a folder, a bad profile folder.
        ds4lab.report.results.OutputError: ``out``'s folder is not writable, ``out`` holds a file that
            is not a calibration, or another run is writing it.
    """
    from ..report.results import final_path, output_file
    from ..sim.calibration import read, refuse_shipped, validate

    check_config(cfg)
    out = Path(cfg.out)
    o = no_folder("calibrate", {"job": "calibrate", "calibration": str(out)})
    fits = None
    with output_file(out, "calibration", accept=_replaceable, refuse=refuse_shipped) as tmp:
        if cfg.long_context:
            base = read(Path(cfg.base) if cfg.base else default_calibration_path())
            cal = calibrate_long_context(be, base, cfg.preset or "ds4-flash", console=console)
        elif cfg.from_ladder:
            base = read(Path(cfg.base) if cfg.base else default_calibration_path())
            try:
                cal, table = fit_host_from_ladder(base, cfg.from_ladder)
            except ValueError as e:
                raise BadInput(str(e)) from None
            o.table("host_fit", table)
            for r in table.itertuples():
                console.print(f"{r.figure}: {r.value:.3f} µs ({r.folder}, context {r.context})")
            for k in ("host_launch_us", "host_graph_call_us", "host_node_update_us"):
                console.print(f"{k}: {base.get(k)} → {cal.get(k)} (the median)")
        elif cfg.moe_profile is None:
            cal = calibrate(be, cfg.preset or default_preset("calibrate", be), console=console)
        else:
            base = Path(cfg.base or default_calibration_path())
            cal = read(base)  # every key checked: an invalid base is refused before anything is written
            try:
                fits = fit_tiled_moe(Path(cfg.moe_profile))
            except ValueError as e:
                raise BadInput(str(e)) from None
            cal.setdefault("kernels", {}).update(fits)
            cal["source"] = f"{cal.get('source', '')}; tiled MoE kernels fitted from {cfg.moe_profile}"
        validate(cal, str(out))
        write_calibration(cal, tmp)
        if cfg.from_ladder:
            for i, d in enumerate(_check_against(cal, cfg.from_ladder, console)):
                o.table(f"check-{i}", d)
    for kern, f in (fits or {}).items():
        console.print(f"{kern}: {f['fixed_us']} µs + bytes / {f['bandwidth_GBps']} GB/s ({f['samples']} points)")
    console.print(f"calibration written to {final_path(out)}")
    o.result.files.append(out)
    return o.done(cal)
