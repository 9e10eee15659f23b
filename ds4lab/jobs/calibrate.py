"""``ds4lab calibrate``: the sim's cost-model parameters (:func:`ds4lab.calibration.fit.fit`), measured on this GPU
or fitted from a measured folder, written as a calibration file with its table beside it. Next:
``docs/calibration.md``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..calibration.fit import fit, write_calibration
from ..sim.costmodel import default_calibration_path
from .common import BadInput, default_preset
from .result import JobResult, no_folder


@dataclass
class CalibrateConfig:
    """Arguments of ``ds4lab calibrate``: ``preset`` measured, ``out`` the file written, ``moe_profile`` a ``ds4lab
    moe`` folder whose tiled-kernel fits extend ``base`` (default: the shipped calibration)."""

    preset: str | None = None
    out: Path | str = "results/calibration.json"
    moe_profile: Path | str | None = None
    base: Path | str | None = None
    #: GPU: refit the long-context token's kernels in ``base`` (lines over positions 4 095, 16 383 and
    #: 65 535: :data:`ds4lab.calibration.gpu.LONG_CONTEXT_POSITIONS`).
    long_context: bool = False
    #: No GPU: measured ``ds4lab ladder``/``context`` folders whose host times refit ``base``'s
    #: ``host_launch_us`` and ``host_node_update_us``.
    from_ladder: tuple = ()
    #: No GPU: measured ``ds4lab ds4`` folders (one path, or a tuple of them) whose host and kernel
    #: costs price ds4lab's launch list (:func:`ds4lab.calibration.from_ds4.fit_from_ds4`: one kernel
    #: time factor per recorded context), checked against ds4's measured islands off and on.
    from_ds4: Path | str | tuple | None = None
    #: No GPU: a measured ``ds4lab context`` folder of stages 3, 3p and 3cc whose paired gains over
    #: stage 3 refit ``base``'s ``pdl_edge_us`` and ``graph_conditional_us``
    #: (:func:`ds4lab.calibration.from_context.fit_capture_stages`).
    from_context: Path | str | None = None


def check_config(cfg: CalibrateConfig) -> None:
    """Checks before any work: ``out`` neither shipped (nor in ds4lab's data folder) nor a folder; ``base`` valid
    against the schema.

    Raises:
        ds4lab.errors.CalibrationError: a shipped ``out``, or an invalid ``base`` (naming the file and every bad key;
            exit 2).
        BadInput: ``out`` is a folder."""
    from ..sim.calibration import read, refuse_shipped

    out = Path(cfg.out)
    refuse_shipped(out)
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder: name the calibration file to write")
    modes = [m for m, on in (("--moe-profile", cfg.moe_profile is not None), ("--long-context", cfg.long_context),
                             ("--from-ladder", bool(cfg.from_ladder)), ("--from-ds4", cfg.from_ds4 is not None),
                             ("--from-context", cfg.from_context is not None))
             if on]
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


#: The table a source writes beside the calibration: (its table, the file's suffix, the header it starts with).
SIDECARS = {"ds4": ("check", "-check.csv", "context,ds4,stage,"),
            "context": ("stages_fit", "-fit.csv", "figure,stage,context,")}


def source_of(cfg: CalibrateConfig) -> tuple[str, object]:
    """``(source, inputs)`` of :func:`ds4lab.calibration.fit.fit` that ``cfg`` asks for."""
    if cfg.long_context:
        return "long-context", None
    if cfg.from_ds4 is not None:
        return "ds4", cfg.from_ds4
    if cfg.from_context is not None:
        return "context", cfg.from_context
    if cfg.from_ladder:
        return "ladder", tuple(cfg.from_ladder)
    if cfg.moe_profile is not None:
        return "moe", cfg.moe_profile
    return "gpu", None


def run(cfg: CalibrateConfig, be, console) -> JobResult:
    """Measure on ``be`` (a GPU) or fit from ``cfg``'s folders over ``base``, and write ``cfg.out`` (locked, written
    only when complete and valid). Returns the :class:`~ds4lab.jobs.result.JobResult`: the calibration as ``value``; the
    fit's tables (``host_fit``, ``check-<n>``, ``stages_fit`` or ``check``).

    Raises:
        ds4lab.errors.CalibrationError: ``out`` shipped, ``base`` invalid, or an invalid result.
        BadInput: ``out`` a folder, a bad folder to fit from.
        ds4lab.report.results.OutputError: ``out``'s folder not writable, ``out`` not a calibration, or another run
            writing it."""
    from ..report.results import final_path, output_file
    from ..sim.calibration import read, refuse_shipped, validate

    check_config(cfg)
    out = Path(cfg.out)
    source, inputs = source_of(cfg)
    o = no_folder("calibrate", {"job": "calibrate", "calibration": str(out)})
    with output_file(out, "calibration", accept=_replaceable, refuse=refuse_shipped) as tmp:
        side = SIDECARS.get(source)
        side_path = _sidecar(out, side[1], side[2]) if side else None
        base = None if source == "gpu" else read(Path(cfg.base) if cfg.base else default_calibration_path())
        preset = cfg.preset or (default_preset("calibrate", be) if source == "gpu" else None)
        try:
            got = fit(source, base=base, inputs=inputs, be=be, preset=preset, say=console.print)
        except ValueError as e:
            raise BadInput(str(e)) from None
        for line in got.lines:
            console.print(line)
        for name, table in got.tables.items():
            o.table(name, table)
        if side:
            got.tables[side[0]].to_csv(side_path, index=False)
            console.print(f"the {'fit' if source == 'context' else 'check'} table: {side_path}")
        validate(got.calibration, str(out))
        write_calibration(got.calibration, tmp)
    console.print(f"calibration written to {final_path(out)}")
    o.result.files.append(out)
    return o.done(got.calibration)


def _sidecar(out: Path, suffix: str, header: str) -> Path:
    """The table beside ``out`` (``<stem><suffix>``), checked first: one there is replaced only when ds4lab wrote it
    (first line starts with ``header``) and its calibration is there. Raises BadInput naming it otherwise."""
    path = out.with_name(out.stem + suffix)
    if not path.exists():
        return path
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            ours = f.readline().startswith(header)
    except OSError:
        ours = False
    if not ours or not out.is_file():
        why = ("is not a table ds4lab wrote" if not ours else "is there without the calibration it belongs to")
        raise BadInput(f"--out {out}: {path} {why}, and ds4lab never replaces files it did not write: move it, "
                       "or choose another --out")
    return path
