"""The ``sim`` backend's timing model: a calibration, a host clock, a device, a timeline.

Every figure here is *modeled*, never measured (µs). The model (host clock, device, graph replay, kernel time factor,
programmatic edges, conditional nodes): ``docs/sim.md``, "The timing model". The calibration's keys:
:data:`ds4lab.sim.calibration.SCHEMA`; the fits: :mod:`ds4lab.calibration`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .calibration import SCHEMA, default_calibration_path, read, validate

REQUIRED = tuple(SCHEMA["required"])
#: Defaults for the optional fields (µs or GB/s).
OPTIONAL = {"kernels": {}, "copy_GBps": None, "h2d_GBps": 25.0, "graph_node_gap_us": 0.0, "eager_gap_us": 0.0,
            "host_graph_call_us": 0.0, "host_node_update_us": 0.0, "kernel_time_scale": 1.0,
            "kernel_time_scale_by_context": None, "pdl_edge_us": 0.5, "graph_conditional_us": 1.0}

#: The optional constants whose defaults no measurement gave yet, and why each default is what it is
#: (``docs/capture-stages.md``: the H200 run that replaces them). A calibration file that sets one
#: carries its own value.
GUESSED = {
    "pdl_edge_us": "GUESS: about the idle gap measured between two dependent kernel nodes of a replayed graph "
                   "(graph_node_gap_us, 0.43 us on the H200), which an overlapped launch can hide; fitted from "
                   "stage 3p against stage 3 of a measured context folder by ds4lab calibrate --from-context",
    "graph_conditional_us": "GUESS: no source gives the device time of evaluating a conditional node; fitted "
                            "from stage 3cc against stage 3 of a measured context folder by ds4lab calibrate "
                            "--from-context",
}

#: How a calibration marks one of :data:`GUESSED` measured: its ``notes`` entry for the key begins so.
MEASURED_NOTE = "MEASURED"


def guessed(cal: dict) -> dict[str, str]:
    """The constants of :data:`GUESSED` that calibration ``cal`` still guesses, with their reasons: all but those it
    sets and marks measured (its ``notes`` entry begins with :data:`MEASURED_NOTE`, as ``calibrate --from-context``
    writes it)."""
    notes = cal.get("notes") if isinstance(cal.get("notes"), dict) else {}
    return {k: why for k, why in GUESSED.items()
            if not (cal.get(k) is not None and str(notes.get(k, "")).startswith(MEASURED_NOTE))}


#: Kernels that a calibration file may not have measured yet, and the measured kernel of the same
#: stage and kind whose fit (fixed cost, bandwidth) prices them until it has (``ds4lab calibrate``
#: measures every kernel of a token, so a re-measured file carries their own fits): ds4's routed-MoE
#: path (``kernels/moe_ds4.cu``) by prefix, priced as ds4lab's earlier routed-MoE kernels.
STAND_INS = (("cond_set_", "comp_rope_store"), ("xq_quantize_q8k", "xq_quantize"), ("moe_midq_q8k", "moe_midq"),
             ("moe_gateup_mid_tiled_", "moe_gateup_tiled"), ("moe_gateup_mid_", "moe_gateup_decode"),
             ("moe_down_tiled_", "moe_down_tiled"), ("moe_down_sum_", "moe_down_decode"),
             ("moe_sum_slots", "moe_sum"))


def stand_in(name: str) -> str | None:
    """The measured kernel whose fit prices ``name`` when the calibration has none of its own (:data:`STAND_INS`: an
    exact name, or a prefix ending in ``_``), or None."""
    for key, other in STAND_INS:
        if name == key or (key.endswith("_") and name.startswith(key)):
            return other
    return None


@dataclass
class Calibration:
    """The constants of the cost model (schema: :data:`ds4lab.sim.calibration.SCHEMA`)."""

    name: str
    device: str
    source: str
    measured: bool
    host_launch_us: float
    host_graph_launch_us: float
    host_api_us: float
    kernel_fixed_us: float
    graph_node_us: float
    bandwidth_GBps: float
    memset_us: float
    kernels: dict = field(default_factory=dict)
    copy_GBps: float | None = None
    h2d_GBps: float = 25.0
    #: Device idle between two dependent kernel nodes of a replayed graph beyond their CUPTI durations (µs), what a
    #: plan from traced durations adds per node boundary (``ds4lab.audit.plans``).
    graph_node_gap_us: float = 0.0
    #: Device idle between two eager kernels even when the host has run ahead (µs; graph nodes are spared it);
    #: 0 in ds4lab's own calibrations, fitted by :func:`ds4lab.calibration.from_ds4.fit_from_ds4`.
    eager_gap_us: float = 0.0
    #: ds4lab's own host work around each graph-cache launch, on top of ``host_graph_launch_us`` (µs).
    host_graph_call_us: float = 0.0
    #: ds4lab's own host work per kernel-node update (stage i+), on top of ``host_api_us`` (µs).
    host_node_update_us: float = 0.0
    #: Every kernel's modeled time is multiplied by this (the schema says where it comes from).
    kernel_time_scale: float = 1.0
    #: ``((context, scale), ...)``: the kernel time factor by context (:meth:`scale_at`); None: ``kernel_time_scale``.
    kernel_time_scale_by_context: tuple | None = None
    #: device µs a kernel node reached by a programmatic edge gains over its fit: GUESSED until the H200 measures it
    pdl_edge_us: float = 0.5
    #: device µs to evaluate one conditional node in a replay: GUESSED until the H200 measures it
    graph_conditional_us: float = 1.0
    path: str | None = None

    @classmethod
    def load(cls, src: "str | Path | dict | Calibration | None" = None) -> "Calibration":
        """From a JSON path, a dict, None (the default file), or a :class:`Calibration` (returned as it is). Raises
        CalibrationError (a ValueError): unreadable file, or a field that breaks :data:`ds4lab.sim.calibration.SCHEMA`
        (names the file and every key path)."""
        if isinstance(src, Calibration):
            return src
        path = None
        if src is None:
            src = default_calibration_path()
        if isinstance(src, (str, Path)):
            path = str(Path(src).resolve())
            d = read(src)  # every field checked against ds4lab.sim.calibration.SCHEMA
        elif isinstance(src, dict):
            d = validate(dict(src))
        else:
            raise TypeError(f"calibration must be a path, a dict or None, not {type(src).__name__}")
        kw = {k: d[k] for k in REQUIRED}
        for k, v in OPTIONAL.items():
            kw[k] = d.get(k, v) if d.get(k) is not None else v
        kw["measured"] = bool(kw["measured"])
        if kw["kernel_time_scale_by_context"]:
            kw["kernel_time_scale_by_context"] = tuple((int(c), float(v))
                                                       for c, v in kw["kernel_time_scale_by_context"])
        for k in REQUIRED[4:]:
            kw[k] = float(kw[k])
        return cls(**kw, path=path)

    def provenance(self) -> dict:
        """What the backend reports as ``calibration``: name, path, source, measured."""
        return {"name": self.name, "path": self.path, "provenance": self.source, "measured": self.measured,
                "device": self.device}

    def scale_at(self, context: int | None) -> float:
        """The kernel time factor (dimensionless) at ``context`` (a decode position > 0; None: ``kernel_time_scale``):
        ``kernel_time_scale_by_context`` linear in log2(context) between its contexts, held constant outside them.
        Raises ValueError: ``context`` not a positive number (names it)."""
        pts = self.kernel_time_scale_by_context
        if context is None or not pts:
            return self.kernel_time_scale
        try:
            context = float(context)
        except (TypeError, ValueError):
            raise ValueError(f"kernel time factor at context {context!r}: a context is a positive number") from None
        if not (math.isfinite(context) and context > 0):
            raise ValueError(f"kernel time factor at context {context!r}: a context is a positive number")
        import numpy as np

        # np.interp: exact at the listed points, linear between them, the end values held outside
        return float(np.interp(math.log2(context), [math.log2(c) for c, _ in pts], [v for _, v in pts]))

    # ------------------------------------------------------------------ device times
    def kernel_us(self, name: str, nbytes: int) -> float:
        """Modeled GPU time (µs) of kernel ``name`` moving ``nbytes`` at ``kernel_time_scale``: its own fit, else its
        stand-in's (:func:`stand_in`), else the general line; the device applies :attr:`Device.kernel_factor`."""
        o = self.kernels.get(name) or self.kernels.get(stand_in(name) or "")
        if o:
            us = float(o.get("fixed_us", self.kernel_fixed_us)) + nbytes / (
                float(o.get("bandwidth_GBps", self.bandwidth_GBps)) * 1e3)
        else:
            us = self.kernel_fixed_us + nbytes / (self.bandwidth_GBps * 1e3)
        return us * self.kernel_time_scale

    def programmatic_us(self, gpu_us: float) -> float:
        """A kernel node's modeled time when a programmatic edge reaches it: ``pdl_edge_us`` less, never below half of
        ``gpu_us`` (the overlap hides its launch, not its work). GUESS (see :data:`GUESSED`)."""
        return max(gpu_us - self.pdl_edge_us, 0.5 * gpu_us)

    def memset_gpu_us(self, nbytes: int) -> float:
        """A memset of ``nbytes`` (fixed cost plus writing at the copy bandwidth)."""
        return self.memset_us + nbytes / ((self.copy_GBps or self.bandwidth_GBps) * 1e3)

    def h2d_gpu_us(self, nbytes: int) -> float:
        """A host-to-device (or device-to-host) copy of ``nbytes``."""
        return self.memset_us + nbytes / (self.h2d_GBps * 1e3)


class Device:
    """The modeled device and host clock: one kernel at a time, and a timeline of what ran.

    ``timeline`` holds ``(stream, name, start_us, end_us, kind, graph)`` tuples (``graph`` is the graph id for replayed
    nodes, else None), at most ``timeline_limit`` of them (the oldest are dropped; ``dropped`` counts them)."""

    def __init__(self, cal: Calibration, timeline_limit: int = 200_000) -> None:
        self.cal = cal
        self.host_us = 0.0
        self.free_us = 0.0  # when the device finishes the last kernel it was given
        self.timeline: list[tuple] = []
        self.timeline_limit = timeline_limit
        self.dropped = 0
        self.busy_us = 0.0  # total modeled device-busy time
        #: Multiplies the priced µs of every compute kernel the device runs (eager or a graph node, NCCL
        #: collectives excepted: the link model prices those): the calibration's kernel time factor at
        #: the context being modeled over its ``kernel_time_scale`` (:meth:`set_context`); 1: as priced.
        self.kernel_factor = 1.0

    def set_context(self, context: int | None) -> float:
        """Price the kernels run from now on at ``context`` (None: at ``kernel_time_scale``): :attr:`kernel_factor`
        becomes ``cal.scale_at(context) / cal.kernel_time_scale``. Returns ``cal.scale_at(context)``; ValueError for a
        context that is not positive."""
        scale = self.cal.scale_at(context)
        self.kernel_factor = 1.0 if scale == self.cal.kernel_time_scale else scale / self.cal.kernel_time_scale
        return scale

    def host(self, us: float) -> float:
        """Advance the host clock by one call's cost; returns the new time (the submit time)."""
        self.host_us += us
        return self.host_us

    def wait_host(self, t: float) -> None:
        """The host blocks until device time ``t`` (a synchronize)."""
        if t > self.host_us:
            self.host_us = t

    def run(self, stream_name: str, name: str, earliest: float, dur: float, kind: str,
            graph: int | None = None, occupies: bool = True) -> tuple[float, float]:
        """Schedule one piece of device work no earlier than ``earliest``; returns (start, end). A ``kernel`` (not an
        NCCL collective, ``nccl*``) lasts ``dur`` times :attr:`kernel_factor`."""
        if kind == "kernel" and self.kernel_factor != 1.0 and not name.startswith("nccl"):
            dur *= self.kernel_factor
        start = max(earliest, self.free_us) if occupies else earliest
        end = start + dur
        if occupies:
            self.free_us = end
            self.busy_us += dur
        if self.timeline_limit:
            if len(self.timeline) >= self.timeline_limit:
                del self.timeline[: self.timeline_limit // 10]
                self.dropped += self.timeline_limit // 10
            self.timeline.append((stream_name, name, start, end, kind, graph))
        return start, end

    def reset(self) -> None:
        """Clocks back to 0 and an empty timeline (streams keep their own ready times: reset them too)."""
        self.host_us = self.free_us = self.busy_us = 0.0
        self.timeline.clear()
        self.dropped = 0
