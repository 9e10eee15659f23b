"""Where a number came from: machine, software versions, configuration, git revision, time."""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import subprocess
from pathlib import Path

from ..version import __version__


def git_revision() -> str | None:
    """The checkout's commit (with ``-dirty`` when it has changes), or None outside git."""
    root = Path(__file__).resolve().parents[2]
    # a read-only look: git status would otherwise refresh the checkout's index, taking its lock
    # (and, cut by a full disk or a file size limit, could leave index.lock behind)
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5, env=env)
        if rev.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, env=env).stdout.strip()
        return rev.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:
        return None


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 (16 hex digits) of every ``.py`` and ``.json`` file of the package and every CUDA source it compiles:
    names the code that ran even without git (a copied tree, a wheel)."""
    import hashlib

    from ..backends.cupy_backend import kernels_dir

    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]
    files = [(f"ds4lab/{p.relative_to(pkg)}", p) for p in pkg.rglob("*") if p.suffix in (".py", ".json")
             and "__pycache__" not in p.parts]
    kd = Path(kernels_dir())
    files += [(f"kernels/{p.relative_to(kd)}", p) for p in kd.rglob("*") if p.suffix in (".cu", ".cuh")]
    for name, p in sorted(files):
        h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def base_meta(backend) -> dict:
    """Provenance common to every result: backend/device info, versions, flags, time."""
    import numpy

    from ..capture.stream import ENV_FLAG, graphs_flag

    return {
        "ds4lab": __version__,
        "git_revision": git_revision(),
        "source_digest": source_digest(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        **backend.info(),
        "measured": bool(backend.measures_time),
        "flags": {ENV_FLAG: os.environ.get(ENV_FLAG), "graphs_enabled": graphs_flag()},
    }


def calibration_label(meta: dict) -> str:
    """How a title names ``meta["calibration"]``: its name when shipped, else name, path and short SHA-256."""
    cal = meta.get("calibration")
    if not isinstance(cal, dict):
        return str(cal if cal is not None else "?")
    if cal.get("shipped") is False:  # not ds4lab's own file: say which
        from ..sim.calibration import title_label

        return title_label(cal)
    return str(cal.get("name", "?"))


#: The columns a job's table carries so that each row, copied out of its folder, still says where it
#: came from (as ``ladder.csv`` and ``context.csv`` do): the backend, the preset, whether it is modeled.
SOURCE_COLUMNS = ("backend", "preset", "modeled")


def preset_name(meta: dict) -> str | None:
    """The preset's name in ``meta["preset"]`` (a preset summary dict or a name)."""
    p = meta.get("preset")
    return p.get("name") if isinstance(p, dict) else p


def with_source_columns(df, backend: str, preset: str | None, modeled: bool):
    """``df`` with :data:`SOURCE_COLUMNS` (``backend``, ``preset``, ``modeled``) appended; no rows: the header kept."""
    out = df.copy()
    for column, value in zip(SOURCE_COLUMNS, (backend, preset, bool(modeled))):
        out[column] = value
    return out


def label(meta: dict) -> str:
    """One line naming the source of a figure, for titles and printed tables."""
    if meta.get("modeled"):
        return f"MODELED by the {meta.get('backend')} backend (calibration {calibration_label(meta)}), not measured"
    if not meta.get("measured"):
        return f"{meta.get('backend')} backend on {meta.get('device', 'CPU')} — no timing claims"
    return (f"measured on {meta.get('device')} · driver {meta.get('driver')} · "
            f"CUDA runtime {cuda_version(meta.get('cuda_runtime'))} · CuPy {meta.get('cupy')}")


def cuda_version(v) -> str:
    """``cudaRuntimeGetVersion``'s integer (1000 × major + 10 × minor) as ``13.2``; anything else as it is."""
    if isinstance(v, int) and v >= 1000:
        return f"{v // 1000}.{v % 1000 // 10}"
    return str(v)
