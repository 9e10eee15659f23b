"""``ds4lab calibrate``: the sim's cost-model parameters measured on this GPU
(:func:`ds4lab.measure.calibrate.calibrate`), or, with no GPU, the tiled MoE kernels fitted from a
measured ``ds4lab moe`` folder (:func:`ds4lab.measure.calibrate.fit_tiled_moe`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..measure.calibrate import calibrate, calibrate_long_context, fit_tiled_moe, write_calibration
from ..sim.costmodel import default_calibration_path
from ..report.results import check_out
from .common import BadInput, default_preset


@dataclass
class CalibrateConfig:
    """Arguments of ``ds4lab calibrate``: ``preset`` whose eager tokens and kernels are measured;
    ``out`` the calibration file to write; ``moe_profile`` a ``ds4lab moe`` folder (no GPU: add
    tiled-kernel fits to ``base``, default the shipped calibration)."""

    preset: str | None = None
    out: Path | str = "results/calibration.json"
    moe_profile: Path | str | None = None
    base: Path | str | None = None
    #: GPU: add fits for the long-context token's kernels to ``base`` (measured at position 65 535).
    long_context: bool = False


def run(cfg: CalibrateConfig, be, console) -> dict:
    """Measure on ``be`` (a GPU) and write ``cfg.out``; with ``moe_profile``, ``be`` is unused
    (None is fine) and the fits are added to ``base``. Returns the calibration dict written.

    Raises:
        BadInput: ``base`` unreadable or not a calibration, ``out`` a folder, a bad profile folder.
        ds4lab.report.results.OutputError: ``out``'s folder is not writable.
    """
    out = Path(cfg.out)
    if cfg.long_context:
        from ..sim.calibration import read

        base = read(Path(cfg.base) if cfg.base else default_calibration_path())
        check_out(out.parent)
        cal = calibrate_long_context(be, base, cfg.preset or "ds4-flash", console=console)
        write_calibration(cal, out)
        console.print(f"calibration written to {out}")
        return cal
    if cfg.moe_profile is None:
        cal = calibrate(be, cfg.preset or default_preset("calibrate", be), console=console)
        write_calibration(cal, out)
        console.print(f"calibration written to {out}")
        return cal
    base = Path(cfg.base or default_calibration_path())
    try:
        fits = fit_tiled_moe(Path(cfg.moe_profile))
    except ValueError as e:
        raise BadInput(str(e)) from None
    try:
        cal = json.loads(base.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"--base {base}: cannot be read as JSON ({e})") from None
    if not isinstance(cal, dict) or not isinstance(cal.get("kernels", {}), dict):
        raise BadInput(f"--base {base}: not a calibration (a JSON object with a kernels object)")
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder: name the calibration file to write")
    check_out(out.parent)
    cal.setdefault("kernels", {}).update(fits)
    cal["source"] = f"{cal.get('source', '')}; tiled MoE kernels fitted from {cfg.moe_profile}"
    write_calibration(cal, out)
    for kern, f in fits.items():
        console.print(f"{kern}: {f['fixed_us']} µs + bytes / {f['bandwidth_GBps']} GB/s ({f['samples']} points)")
    console.print(f"calibration written to {out}")
    return cal
