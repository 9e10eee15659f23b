"""Per-kernel cost fits, ``us = fixed + bytes / bandwidth``: the one least-squares line (:func:`linear_fit`), a
calibration's ``kernels`` extended or refitted from a per-op table (:func:`add_kernel_fits`, :func:`refit_kernels`),
and the kernel constants from a per-op table and its trace (:func:`fit_calibration`)."""

from __future__ import annotations

import numpy as np


def linear_fit(nbytes: np.ndarray, us: np.ndarray, bw_default: float | None = None) -> tuple[float, float]:
    """Least squares ``us = a + nbytes / (bw * 1e3)``; returns (a µs >= 0, bw GB/s > 0). With one distinct size, or
    no bandwidth signal (slope ≤ 0), the bandwidth is ``bw_default`` (or 1 000 000 GB/s) and the rest fixed cost."""
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
    """One kernel's ``kernels`` entry: :func:`linear_fit` of its launches as ``{fixed_us, bandwidth_GBps, ...}``."""
    a, bw = linear_fit(nbytes, us, bw_default)
    return {"fixed_us": round(a, 3), "bandwidth_GBps": round(bw, 1), "samples": int(len(us)),
            "median_us": round(float(np.median(np.asarray(us, dtype=np.float64))), 3)}


def add_kernel_fits(base: dict, ops, note: str) -> dict:
    """``base`` with :func:`kernel_fit` fits added for each kernel of ``ops`` (``kernel``, ``nbytes``, ``us``) it
    lacks; ``note`` joins ``source``. Raises ValueError for missing columns or ``kernels``."""
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
    """``base`` with the fits of ``names`` that ``ops`` holds replaced. Raises ValueError as :func:`add_kernel_fits`."""
    ops = ops[ops["kernel"].isin(set(names))]
    keep = {k: v for k, v in base["kernels"].items() if k not in set(ops["kernel"])}
    return add_kernel_fits({**base, "kernels": keep}, ops, note)


#: Kernels whose time is dominated by streaming a weight matrix (the global fit).
MATVEC_KERNELS = ("q8_matvec", "q8_matvec_swiglu", "q8_matvec_expand", "moe_gateup_decode", "moe_down_decode",
                  "router_logits")


def _linfit(xs, ys):
    """Least squares ``y = a + b x``; returns (a, b) (b = 0 when x has no spread)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def _median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def fit_calibration(rows, nbytes, *, tolerance: float = 0.10) -> dict:
    """Fit ``kernel_fixed_us``, ``bandwidth_GBps`` and per-kernel overrides from a per-op table and the trace of the
    same launches (``docs/calibration.md``, "Kernel fits from a recorded run").

    Args:
        rows: per-op measurements, dicts with ``kernel`` and ``us``, in launch order.
        nbytes: the launcher's ``nbytes`` for the same launches, same order.
        tolerance: a kernel gets an override when the global model misses its median by more.

    Returns:
        ``{"kernel_fixed_us", "bandwidth_GBps", "kernels", "fit": {...summary...}}``."""
    rows, nb = list(rows), list(nbytes)
    if len(rows) != len(nb):
        raise ValueError(f"{len(rows)} measured launches but {len(nb)} traced ones")
    pts: dict[str, list[tuple[int, float]]] = {}
    for r, n in zip(rows, nb):
        pts.setdefault(r["kernel"], []).append((int(n), float(r["us"])))
    mv = [(n, us) for k in MATVEC_KERNELS for (n, us) in pts.get(k, [])]
    if len(mv) < 2:
        raise ValueError("need at least two matvec launches to fit a bandwidth")
    a, b = _linfit([n for n, _ in mv], [us for _, us in mv])
    if b <= 0:
        raise ValueError("matvec times do not grow with bytes: cannot fit a bandwidth")
    fixed, bw = max(a, 0.0), 1.0 / (b * 1e3)
    kernels = {}
    for k, p in sorted(pts.items()):
        pred = [fixed + n / (bw * 1e3) for n, _ in p]
        if _median([abs(pu - us) / us for (n, us), pu in zip(p, pred)]) <= tolerance:
            continue
        # Candidates: a fixed cost at the global bandwidth (mean residual: keeps the kernel's total),
        # and the kernel's own line when its launches span several sizes and the line is physical.
        cands = [{"fixed_us": round(max(0.1, sum(us - n / (bw * 1e3) for n, us in p) / len(p)), 3)}]
        if len({n for n, _ in p}) > 1:
            ka, kb = _linfit([n for n, _ in p], [us for _, us in p])
            if kb > 0 and ka > 0:
                cands.append({"fixed_us": round(ka, 3), "bandwidth_GBps": round(1.0 / (kb * 1e3), 1)})

        def abs_err(o):
            f, g = o["fixed_us"], o.get("bandwidth_GBps", bw)
            return sum(abs(f + n / (g * 1e3) - us) for n, us in p)

        kernels[k] = min(cands, key=abs_err)
    # How well the fitted model reproduces the measurement, launch by launch.
    from ..sim.costmodel import Calibration

    cal = Calibration("fit", "", "", False, 0, 0, 0, fixed, 0, bw, 0, kernels)
    model = [cal.kernel_us(r["kernel"], n) for r, n in zip(rows, nb)]
    meas = [float(r["us"]) for r in rows]
    return {
        "kernel_fixed_us": round(fixed, 3),
        "bandwidth_GBps": round(bw, 1),
        "kernels": kernels,
        "fit": {"launches": len(rows), "matvec_launches": len(mv),
                "measured_sum_us": round(sum(meas), 1), "modeled_sum_us": round(sum(model), 1),
                "median_abs_rel_error": round(_median([abs(m - u) / u for m, u in zip(model, meas)]), 4)},
    }
