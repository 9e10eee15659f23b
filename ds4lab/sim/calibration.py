"""Calibration files: one JSON Schema (:data:`SCHEMA`), checked field by field, and what identifies a file.

Every calibration (shipped, or named by ``$DS4LAB_CALIBRATION``) is validated before any number is used; a bad one
raises :class:`~ds4lab.errors.CalibrationError` naming the file and each bad key path. :func:`calibration_info` is
what a result records (name, path, SHA-256, shipped or not). The cost model: :mod:`ds4lab.sim.costmodel`."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import CalibrationError

#: Ranges (inclusive unless named exclusive). Host and device costs in µs: 0 to 1 s. Bandwidths in
#: GB/s: above 0, at most 10 000 000 (an H200 moves 4 800 GB/s; cached "effective" fits reach
#: ~6 400; the shipped file writes 1 000 000 for "no bandwidth term", a fixed-cost kernel).
_US = {"type": "number", "finite": True, "minimum": 0, "maximum": 1e6}
_GBPS = {"type": "number", "finite": True, "exclusiveMinimum": 0, "maximum": 1e7}
_TEXT = {"type": "string"}

#: The calibration schema (JSON Schema 2020-12 plus ds4lab's ``finite`` keyword: JSON Schema's
#: ``number`` admits NaN and infinities, which Python's ``json`` parses from ``NaN``/``Infinity``; and
#: its ``ascendingContexts`` keyword: a list of ``[context, value]`` pairs whose contexts strictly
#: ascend, which JSON Schema cannot say).
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ds4lab sim calibration",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "device", "source", "measured", "host_launch_us", "host_graph_launch_us", "host_api_us",
                 "kernel_fixed_us", "graph_node_us", "bandwidth_GBps", "memset_us"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "device": _TEXT,
        "source": _TEXT,
        "measured": {"type": "boolean"},
        "driver": {"type": ["string", "null"]},
        "cupy": {"type": ["string", "null"]},
        "host_launch_us": _US,
        "host_graph_launch_us": _US,
        "host_api_us": _US,
        "host_graph_call_us": _US,
        "host_node_update_us": _US,
        # every kernel's modeled time multiplied by this (a calibration made from another engine's
        # kernels, ``calibrate --from-ds4``: ds4's busy time over ds4lab's); 1 when absent
        "kernel_time_scale": {"type": "number", "finite": True, "exclusiveMinimum": 0, "maximum": 100},
        # the same factor by context, ``[[context, scale], ...]`` (contexts positive, strictly ascending):
        # interpolated in log2(context) between them, constant outside (Calibration.scale_at); where
        # absent, kernel_time_scale at every context
        "kernel_time_scale_by_context": {
            "type": "array", "minItems": 1, "ascendingContexts": True,
            "items": {"type": "array", "minItems": 2, "maxItems": 2,
                      "prefixItems": [{"type": "integer", "minimum": 1},
                                      {"type": "number", "finite": True, "exclusiveMinimum": 0, "maximum": 100}]},
        },
        "pdl_edge_us": _US,
        "graph_conditional_us": _US,
        "kernel_fixed_us": _US,
        "graph_node_us": _US,
        "graph_node_gap_us": _US,
        "eager_gap_us": _US,
        "memset_us": _US,
        "bandwidth_GBps": _GBPS,
        "copy_GBps": {"anyOf": [_GBPS, {"type": "null"}]},
        "h2d_GBps": {"anyOf": [_GBPS, {"type": "null"}]},
        "kernels": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "anyOf": [{"required": ["fixed_us"]}, {"required": ["bandwidth_GBps"]}],
                "properties": {
                    "fixed_us": _US,
                    "bandwidth_GBps": _GBPS,
                    "samples": {"type": "integer", "minimum": 0},
                    "median_us": {"type": "number", "finite": True, "minimum": 0, "maximum": 1e7},
                    "note": _TEXT,
                    "source": _TEXT,
                },
            },
        },
        "eager_token_us": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"preset": _TEXT,
                           **{k: {"type": "number", "finite": True, "minimum": 0, "maximum": 1e8}
                              for k in ("median", "p25", "p75")}},
        },
        "fit": {"type": "object", "additionalProperties": {"type": "number", "finite": True}},
        "notes": {"anyOf": [_TEXT, {"type": "object", "additionalProperties": _TEXT}]},
    },
}


def _validator():
    import jsonschema
    from jsonschema import validators

    def finite(validator, want, instance, schema):
        if want and validator.is_type(instance, "number") and not math.isfinite(instance):
            yield jsonschema.ValidationError(f"{instance!r} is not a finite number")

    def ascending(validator, want, instance, schema):
        if not (want and validator.is_type(instance, "array")):
            return
        ctx = [p[0] for p in instance if isinstance(p, list) and p and validator.is_type(p[0], "number")]
        for a, b in zip(ctx, ctx[1:]):
            if not b > a:
                yield jsonschema.ValidationError(f"contexts {ctx} are not strictly ascending: {b!r} after {a!r}")
                return

    cls = validators.extend(jsonschema.Draft202012Validator, {"finite": finite, "ascendingContexts": ascending})
    return cls(SCHEMA)


def _path(err) -> str:
    return ".".join(str(p) for p in err.absolute_path)


def _problems(d: Any) -> list[tuple[str, str]]:
    """Every schema violation of ``d`` as ``(key path, message)``, unknown keys named one by one."""
    out: list[tuple[str, str]] = []
    for err in sorted(_validator().iter_errors(d), key=lambda e: (_path(e), e.validator)):
        where = _path(err)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = set(err.schema.get("properties", {}))
            for k in sorted(set(err.instance) - known):
                out.append((f"{where}.{k}" if where else k, "unknown key"))
            continue
        if err.validator in ("anyOf", "oneOf") and err.context:  # name the closest alternative's reason
            msg = "; ".join(sorted({c.message for c in err.context}))
        else:
            msg = err.message
        out.append((where, msg))
    merged: dict[str, list[str]] = {}
    for k, m in out:  # one entry per key path (Infinity breaks both 'finite' and 'maximum')
        if m not in merged.setdefault(k, []):
            merged[k].append(m)
    return [(k, "; ".join(ms)) for k, ms in merged.items()]


def validate(d: Any, path: str = "<dict>") -> dict:
    """Check a calibration ``d`` (parsed JSON, from ``path``) against :data:`SCHEMA`; returns ``d``. Raises
    CalibrationError: naming ``path`` and every ``(key path, problem)``: wrong type, a number not finite or out of
    range, a missing or unknown key."""
    problems = _problems(d)
    if problems:
        raise CalibrationError(path, problems)
    return d


def read(path: str | Path) -> dict:
    """Read and validate a calibration file; raises :class:`CalibrationError` naming the file for a missing or
    unreadable file, a file that is not UTF-8 text (a binary file: the offset of the first byte that is not), bad
    JSON (with line and column) or any schema problem."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CalibrationError(str(p), [("", f"cannot be read ({e.strerror or e})")]) from None
    try:
        text = raw.decode("utf-8")  # RFC 8259: JSON exchanged between systems is UTF-8
    except UnicodeDecodeError as e:
        raise CalibrationError(str(p), [("", f"not a calibration: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                             f"offset {e.start}); a calibration is a JSON file")]) from None
    try:
        d = json.loads(text)
    except ValueError as e:
        raise CalibrationError(str(p), [("", f"not JSON ({e})")]) from None
    return validate(d, str(p))


#: Where the shipped calibration lives (``ds4lab/data``): the one measured on the H200.
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
MEASURED_FILE = DATA_DIR / "h200.json"

#: Environment variable naming a calibration file to use instead of the shipped one (every
#: command and notebook that builds a ``sim`` backend without an explicit calibration).
CALIBRATION_ENV = "DS4LAB_CALIBRATION"


def default_calibration_path() -> Path:
    """``$DS4LAB_CALIBRATION`` when set, else the shipped ``ds4lab/data/h200.json`` (measured). Raises CalibrationError
    naming a ``$DS4LAB_CALIBRATION`` that is not a file."""
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        if Path(env).is_dir():
            raise CalibrationError(env, [("", f"{CALIBRATION_ENV}={env} is a folder: name a calibration file")])
        if not Path(env).is_file():
            raise CalibrationError(env, [("", f"{CALIBRATION_ENV}={env}: no such calibration file")])
        return Path(env)
    return MEASURED_FILE


#: SHA-256 of every calibration file as it ships, in ``sha256sum`` format (``sha256sum -c
#: SHA256SUMS`` in ``ds4lab/data`` checks them); a file counts as shipped only with these bytes.
MANIFEST = DATA_DIR / "SHA256SUMS"


def shipped_hashes() -> dict[str, str]:
    """``{file name: SHA-256}`` of the shipped calibration files, from :data:`MANIFEST` (empty when the manifest is
    missing: then nothing counts as shipped)."""
    try:
        text = MANIFEST.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        digest, _, name = line.strip().partition("  ")
        if len(digest) == 64 and name:
            out[name.lstrip("*")] = digest.lower()
    return out


def shipped_files() -> list[Path]:
    """The calibration files that ship with ds4lab (those :data:`MANIFEST` lists), resolved."""
    return sorted((DATA_DIR / n).resolve() for n in shipped_hashes() if (DATA_DIR / n).is_file())


def is_shipped(path: str | Path, sha256: str | None = None) -> bool:
    """Whether ``path`` is a shipped calibration file with exactly the shipped bytes (SHA-256 in :data:`MANIFEST`;
    ``sha256`` if the caller has it); an edit in place, or any other file in ``ds4lab/data``, is not shipped."""
    p = Path(path).resolve()
    if p.parent != DATA_DIR.resolve():
        return False
    want = shipped_hashes().get(p.name)
    if want is None:
        return False
    if sha256 is None:
        try:
            sha256 = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError:
            return False
    return sha256 == want


def refuse_shipped(path: str | Path) -> None:
    """Refuse to write a calibration into ``ds4lab/data`` (it holds only what ships). Raises CalibrationError naming
    ``path`` and where to write instead (exit 2)."""
    p = Path(path)
    try:
        inside = p.resolve().parent == DATA_DIR.resolve()
    except OSError:
        inside = False
    if inside:
        what = "a calibration shipped with ds4lab" if p.resolve() in shipped_files() else "ds4lab's data folder"
        raise CalibrationError(str(p), [("", f"is {what} ({DATA_DIR}); ds4lab never overwrites it: write your "
                                             f"calibration elsewhere (--out results/calibration.json) and point "
                                             f"{CALIBRATION_ENV} at it")])


def calibration_info(src: str | Path | dict | None = None) -> dict:
    """What identifies a calibration, for ``meta.json`` and figure titles.

    ``src``: a file path, a dict (hashed as canonical JSON: sorted keys, no spaces), or None (the default file). Returns
    ``{"name", "path" (or None), "sha256" (64 hex digits), "shipped"}``; ``shipped`` as :func:`is_shipped`. Raises
    CalibrationError: the file cannot be read or is not a valid calibration."""
    if src is None:
        src = default_calibration_path()
    if isinstance(src, dict):
        validate(src)
        raw = json.dumps(src, sort_keys=True, separators=(",", ":")).encode()
        return {"name": str(src.get("name")), "path": None, "sha256": hashlib.sha256(raw).hexdigest(),
                "shipped": False}
    p = Path(src).resolve()
    d = read(p)
    sha = hashlib.sha256(p.read_bytes()).hexdigest()
    return {"name": d["name"], "path": str(p), "sha256": sha, "shipped": is_shipped(p, sha)}


def title_label(info: dict) -> str:
    """How a figure title names a calibration: its name when shipped; else name, path and short hash."""
    if info.get("shipped"):
        return str(info.get("name"))
    where = info.get("path") or "in-memory"
    return f"{info.get('name')} ({where}, sha256 {str(info.get('sha256', ''))[:12]})"


def backend_calibration(be) -> dict | None:
    """:func:`calibration_info` of the calibration a backend models time with, for ``meta["calibration"]`` (None for a
    backend that claims no modeled time; a calibration given as a dict is hashed from its ``name`` only)."""
    cal = be.calibration  # a declared capability: None where time is not modeled
    if not isinstance(cal, dict):
        return None
    if cal.get("path"):
        return calibration_info(cal["path"])
    raw = json.dumps(cal, sort_keys=True, default=str).encode()
    return {"name": str(cal.get("name")), "path": None, "sha256": hashlib.sha256(raw).hexdigest(), "shipped": False}
