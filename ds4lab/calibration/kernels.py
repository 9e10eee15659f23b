"""Per-kernel cost fits, ``us = fixed + bytes / bandwidth``: the one least-squares line every fit of
kernel times uses (:func:`linear_fit`), and a calibration's ``kernels`` extended or refitted from a
per-op timing table (:func:`add_kernel_fits`, :func:`refit_kernels`)."""

from __future__ import annotations

import numpy as np


def linear_fit(nbytes: np.ndarray, us: np.ndarray, bw_default: float | None = None) -> tuple[float, float]:
    """Least squares ``us = a + nbytes / (bw * 1e3)``; returns (a µs >= 0, bw GB/s > 0).

    With a single distinct size (one call site), the slope is not identifiable: the bandwidth is
    ``bw_default`` and the fixed cost takes the rest of the median. With no bandwidth signal (a slope
    at or below 0: tiny kernels) all is fixed cost, the bandwidth ``bw_default`` or 1 000 000 GB/s.
    """
    nbytes = np.asarray(nbytes, dtype=np.float64)
    us = np.asarray(us, dtype=np.float64)
    if len(set(nbytes.tolist())) < 2 and bw_default:
        a = float(np.median(us - nbytes / (bw_default * 1e3)))
        return max(a, 0.0), float(bw_default)
    A = np.stack([np.ones_like(nbytes), nbytes], axis=1)
    (a, slope), *_ = np.linalg.lstsq(A, us, rcond=None)
    if slope <= 0:
        return float(np.median(us)), float(bw_default or 1e6)
    return max(float(a), 0.0), 1.0 / float(slope) / 1e3


def kernel_fit(nbytes, us, bw_default: float | None = None) -> dict:
    """One kernel's entry of a calibration's ``kernels``: :func:`linear_fit` of its launches (``nbytes``
    and ``us`` per launch) as ``{fixed_us, bandwidth_GBps, samples, median_us}``."""
    a, bw = linear_fit(nbytes, us, bw_default)
    return {"fixed_us": round(a, 3), "bandwidth_GBps": round(bw, 1), "samples": int(len(us)),
            "median_us": round(float(np.median(np.asarray(us, dtype=np.float64))), 3)}


def add_kernel_fits(base: dict, ops, note: str) -> dict:
    """``base`` with per-kernel fits (:func:`kernel_fit`) added for every kernel in ``ops`` (a per-op
    timing table: ``kernel``, ``nbytes``, ``us`` per launch) that ``base["kernels"]`` lacks; kernels it
    has keep their fits. ``note`` joins ``source``.

    Raises:
        ValueError: ``ops`` has none of the columns it needs, or ``base`` no ``kernels`` object.
    """
    if not {"kernel", "nbytes", "us"} <= set(ops.columns):
        raise ValueError(f"a per-op table needs kernel, nbytes and us columns, not {list(ops.columns)}")
    if not isinstance(base.get("kernels"), dict):
        raise ValueError("the base calibration has no kernels object")
    out = dict(base)
    out["kernels"] = dict(base["kernels"])
    for name, g in ops[~ops["kernel"].isin(set(base["kernels"]))].groupby("kernel"):
        out["kernels"][name] = kernel_fit(g["nbytes"].to_numpy(), g["us"].to_numpy(),
                                          bw_default=float(base["bandwidth_GBps"]))
    out["source"] = f"{base.get('source', '')}; {note}"
    return out


def refit_kernels(base: dict, ops, names, note: str) -> dict:
    """``base`` with the fits of the kernels of ``names`` that ``ops`` (a per-op table of ``kernel``,
    ``nbytes``, ``us``) holds replaced by fits over ``ops`` (:func:`add_kernel_fits`); every other
    kernel's fit is kept, those of ``names`` that ``ops`` lacks included. ``note`` joins ``source``.

    Raises:
        ValueError: as :func:`add_kernel_fits` (``ops`` without its columns, ``base`` without kernels).
    """
    ops = ops[ops["kernel"].isin(set(names))]
    keep = {k: v for k, v in base["kernels"].items() if k not in set(ops["kernel"])}
    return add_kernel_fits({**base, "kernels": keep}, ops, note)
