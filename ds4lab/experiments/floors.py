"""The floors a decode token's GPU time is measured against, and the replayed token's busy time: the bytes floor (Σ
nbytes / copy bandwidth), t_min (an empty kernel's replay cost in a graph as long as the launch list), the launch-list
floor (Σ max(bytes / bandwidth, t_min)) and the busy time (union of kernel intervals, :func:`replayed_token_busy`).

On the sim every figure is the cost model's (``source``: ``modeled``). Next: ``docs/figures.md``, "The token against
its floors"; :func:`token_floors` does it all in one call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..timing import Stats, sources
from ..trace.live import busy_us, trace_source

#: Kernels of this many bytes or more are "large" (``large_kernel_copy_fraction``): the weight
#: streams of the token (8 MB: every Q8_0 and 4-bit matrix of a ds4-flash layer but ``kv``,
#: ``q_a`` and the router).
LARGE_KERNEL_BYTES = 8_000_000


@dataclass
class TokenBusy:
    """Busy time of replayed tokens (:func:`replayed_token_busy`).

    ``busy``/``span``: µs per token (union of kernel intervals / first start to last end); ``kernels``: records per
    token (each token's in ``counts``); ``names``, ``durations`` ``[tokens, kernels]`` (µs) when every token gave the
    same kernels; ``source``: ``cupti`` or ``modeled (...)``."""

    busy: Stats
    span: Stats
    kernels: int
    counts: list[int]
    source: str
    names: list[str] = field(default_factory=list)
    durations: Any = None


def replayed_token_busy(be, run_token: Callable[[int], None], tokens: int = 10, *,
                        warmup: int = 2) -> TokenBusy:
    """Busy time of ``tokens`` calls of ``run_token(i)``, each synchronized, from the kernel trace, after ``warmup``
    untraced calls.

    Raises:
        ValueError: ``tokens < 1`` or ``warmup < 0``.
        RuntimeError: no kernel trace on ``be`` (the message says why), or a token gave no kernel record."""
    if tokens < 1 or warmup < 0:
        raise ValueError(f"replayed_token_busy: tokens={tokens} must be >= 1 and warmup={warmup} >= 0")
    src = trace_source(be)
    if not src.available:
        raise RuntimeError(f"no kernel trace on the {be.name} backend: {src.reason}")
    for i in range(warmup):
        run_token(i)
    be.synchronize()
    busy, span, counts, per = [], [], [], []
    src.start()
    try:
        src.take()
        for j in range(tokens):
            run_token(warmup + j)
            be.synchronize()
            recs = sorted((r for r in src.take() if r.kind == "kernel"), key=lambda r: r.start_ns)
            b, s, n = busy_us(recs)
            if n == 0:
                raise RuntimeError(f"token {j}: no kernel record (is the trace attached to this process?)")
            busy.append(b)
            span.append(s)
            counts.append(n)
            per.append(recs)
    finally:
        src.stop()
    names, durations = [], None
    if len(set(counts)) == 1 and all([r.name for r in p] == [r.name for r in per[0]] for p in per):
        names = [r.name for r in per[0]]
        durations = np.array([[r.dur_ns * 1e-3 for r in p] for p in per])
    source = "cupti" if not be.models_time else sources(be)[0]
    return TokenBusy(Stats.of(busy), Stats.of(span), int(np.median(counts)), counts, source, names, durations)


# ----------------------------------------------------------------------------- t_min
@dataclass
class TMin:
    """The least a kernel costs in a replayed graph: ``replay_us`` (events), ``kernel_us`` (trace), ``source``."""

    replay_us: Stats
    kernel_us: Stats | None
    kernels: int
    source: str


def measure_t_min(be, n_kernels: int, *, replays: int = 20, trace: bool = True) -> TMin:
    """t_min on ``be``: a graph of ``n_kernels`` ``bench.cu:empty_kernel`` launches replayed ``replays`` times between
    two events (after two warm-ups), µs per kernel; with ``trace``, the kernel's own duration too.

    Raises:
        ValueError: ``n_kernels < 1`` or ``replays < 1``.
        ds4lab.errors.CudaError: what the runtime raised."""
    from ..capture.scope import capture_scope

    if n_kernels < 1 or replays < 1:
        raise ValueError(f"measure_t_min: n_kernels={n_kernels} and replays={replays} must be >= 1")
    st = be.new_stream(non_blocking=True)

    def ref():
        pass

    with capture_scope(be, st, "thread_local") as cap:
        for _ in range(n_kernels):
            be.launch(st, "empty_kernel", (1,), (32,), (), 0, ref, 0)
    ex = be.graph_instantiate(cap.graph)
    e0, e1 = be.new_event(), be.new_event()
    for _ in range(2):
        be.graph_launch(ex, st)
    be.synchronize()
    per = []
    for _ in range(replays):
        be.event_record(st, e0)
        be.graph_launch(ex, st)
        be.event_record(st, e1)
        be.event_synchronize(e1)
        per.append(be.event_elapsed_ms(e0, e1) * 1e3 / n_kernels)
    kern = None
    if trace:
        src = trace_source(be)
        if src.available:
            src.start()
            try:
                src.take()
                for _ in range(2):
                    be.graph_launch(ex, st)
                be.synchronize()
                d = [r.dur_ns * 1e-3 for r in src.take() if r.kind == "kernel" and r.name == "empty_kernel"]
            finally:
                src.stop()
            kern = Stats.of(d) if d else None
    source = "cuda-events" if not be.models_time else sources(be)[0]
    return TMin(Stats.of(per), kern, n_kernels, source)


# ----------------------------------------------------------------------------- the floors
@dataclass
class LaunchListFloor:
    """The floors of one launch list (see :func:`launch_list_floor`). Times in µs."""

    kernels: int
    bytes: int
    bandwidth_GBps: float
    t_min_us: float
    bytes_floor_us: float
    launch_floor_us: float
    #: kernels whose floor is t_min (bytes / bandwidth is less)
    t_min_bound: int
    per_kernel_us: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The scalar fields (``per_kernel_us`` left out)."""
        return {k: getattr(self, k) for k in ("kernels", "bytes", "bandwidth_GBps", "t_min_us", "bytes_floor_us",
                                              "launch_floor_us", "t_min_bound")}


def _nbytes(records) -> list[int]:
    if hasattr(records, "columns"):  # a DataFrame with an nbytes column
        return [int(b) for b in records["nbytes"]]
    out = []
    for r in records:
        if isinstance(r, (int, np.integer)):
            out.append(int(r))
        elif isinstance(r, dict):
            out.append(int(r["nbytes"]))
        else:
            out.append(int(r.nbytes))
    return out


def launch_list_floor(records, bandwidth_GBps: float, t_min_us: float) -> LaunchListFloor:
    """The bytes floor and the launch-list floor of a launch list.

    Args:
        records: one entry per launch: launch records (``.nbytes``), dicts with ``"nbytes"``, byte counts, or a
            DataFrame with ``nbytes``.
        bandwidth_GBps: the copy bandwidth (GB/s, bytes read + written).
        t_min_us: the least a kernel costs (µs).

    Returns:
        :class:`LaunchListFloor`: Σ bytes / bandwidth, Σ max(bytes / bandwidth, t_min), and each kernel's floor.

    Raises:
        ValueError: a bandwidth that is not positive, or a negative t_min."""
    if not bandwidth_GBps > 0 or not t_min_us >= 0:
        raise ValueError(f"launch_list_floor: bandwidth_GBps={bandwidth_GBps} must be > 0 and "
                         f"t_min_us={t_min_us} >= 0")
    nb = np.asarray(_nbytes(records), dtype=np.float64)
    by_bytes = nb / (bandwidth_GBps * 1e3)  # bytes / (GB/s * 1e3) = µs
    per = np.maximum(by_bytes, t_min_us)
    return LaunchListFloor(int(nb.size), int(nb.sum()), float(bandwidth_GBps), float(t_min_us),
                           float(by_bytes.sum()), float(per.sum()), int((by_bytes < t_min_us).sum()),
                           per.tolist())


def efficiencies(busy_us: float, floor_us: float) -> dict:
    """``{"efficiency", "over_floor", "floor_beaten"}`` for a time and its floor (µs); a beaten floor (time below it)
    is no floor, and its efficiency above 1 must not be read as one."""
    if not busy_us > 0 or not floor_us > 0:
        return {"efficiency": None, "over_floor": None, "floor_beaten": None}
    return {"efficiency": floor_us / busy_us, "over_floor": busy_us / floor_us, "floor_beaten": busy_us < floor_us}


def copy_GBps(be, measured: float | None = None) -> tuple[float, str]:
    """The copy bandwidth the floors use and its source: ``measured`` when given, a fresh measurement on a GPU, the
    calibration's on the sim.

    Raises:
        ValueError: a backend that neither measures nor models time."""
    if measured is not None:
        return float(measured), "measured (device-to-device copy, same run)"
    if be.models_time:
        v, why = be.modeled_copy_GBps()
        return float(v), f"modeled ({why})"
    if be.is_gpu:
        from ..timing import copy_bandwidth

        return copy_bandwidth().median, "measured (device-to-device copy)"
    raise ValueError(f"the {be.name} backend neither measures nor models a copy bandwidth")


# ----------------------------------------------------------------------------- one replayed token
def whole_token_runner(model, start_pos: int = 1000, base=None):
    """``(run_token, stream)``: ``run_token(i)`` decodes ``start_pos + i`` with the whole token captured once and
    replayed (stage 3, :class:`~ds4lab.experiments.stage_run.StageRun`; the first call eager, the second captures).
    The caller runs it inside ``graphs_enabled()``; ``base``: the token options stage 3 goes over (default: the
    model's)."""
    from .stage_run import StageRun
    from .stages import STAGES

    run = StageRun(model, STAGES["3"], model.opts if base is None else base)
    run.activate()
    return (lambda i: run.token(start_pos + i)), run.stream


@dataclass
class TokenFloors:
    """One token's floors and its replayed busy time (:func:`token_floors`). Times in µs."""

    floor: LaunchListFloor
    t_min: TMin
    #: launch-list floor with the empty kernel's traced duration as t_min (bounds the busy time)
    launch_floor_busy_us: float | None
    busy: TokenBusy
    #: the replayed token's µs per token (events around each replay, median)
    replay_us: Stats
    copy_source: str
    #: one row per launch: cluster, layer, site, kernel, nbytes, us (median over the traced
    #: replays; None when the trace did not match the launch list)
    launches: Any = None

    def summary(self) -> dict:
        """The figures ``bench.json`` carries (see :data:`SUMMARY_KEYS`)."""
        busy = self.busy.busy.median
        out = {"token_busy_us": busy, "token_span_us": self.busy.span.median, "token_replay_us": self.replay_us.median,
               "bytes_floor_us": self.floor.bytes_floor_us, "launch_floor_us": self.floor.launch_floor_us,
               "launch_floor_busy_us": self.launch_floor_busy_us, "t_min_us": self.floor.t_min_us,
               "t_min_kernel_us": None if self.t_min.kernel_us is None else self.t_min.kernel_us.median,
               "copy_GBps": self.floor.bandwidth_GBps, "kernels": self.floor.kernels,
               "t_min_bound_kernels": self.floor.t_min_bound, "token_bytes": self.floor.bytes,
               "busy_source": self.busy.source, "t_min_source": self.t_min.source, "copy_source": self.copy_source}
        for name, (t, f) in {"busy_vs_bytes_floor": (busy, self.floor.bytes_floor_us),
                             "busy_vs_launch_floor": (busy, self.floor.launch_floor_us),
                             "busy_vs_launch_floor_busy": (busy, self.launch_floor_busy_us or 0.0),
                             "replay_vs_launch_floor": (self.replay_us.median, self.floor.launch_floor_us)}.items():
            out[name] = efficiencies(t, f)
        if self.launches is not None:
            out.update(kernel_figures(self.launches, self.floor.bandwidth_GBps))
        return out


#: Keys of :meth:`TokenFloors.summary` that ``bench.json`` carries at its top level.
SUMMARY_KEYS = ("token_busy_us", "token_span_us", "token_replay_us", "bytes_floor_us", "launch_floor_us",
                "launch_floor_busy_us", "t_min_us", "t_min_kernel_us", "large_kernel_copy_fraction",
                "attention_us_per_layer", "busy_vs_bytes_floor", "busy_vs_launch_floor", "replay_vs_launch_floor")


def kernel_figures(launches, bandwidth_GBps: float) -> dict:
    """From per-launch rows (kernel, nbytes, us): the large kernels' achieved fraction of ``bandwidth_GBps``, their
    count and µs, and the median µs of one ``attention_decode`` (None without one)."""
    big = launches[launches["nbytes"] >= LARGE_KERNEL_BYTES]
    frac = None
    if len(big) and big["us"].sum() > 0:
        frac = float(big["nbytes"].sum() / (big["us"].sum() * 1e-6) / 1e9 / bandwidth_GBps)
    att = launches[launches["kernel"] == "attention_decode"]
    return {"large_kernel_copy_fraction": frac, "large_kernels": int(len(big)),
            "large_kernel_us": float(big["us"].sum()),
            "attention_us_per_layer": float(att["us"].median()) if len(att) else None}


def token_floors(be, model, *, copy_measured: float | None = None, tokens: int = 10, start_pos: int = 1000,
                 replays: int = 20, busy_positions=None, base=None) -> TokenFloors:
    """Everything the floors need for ``model``'s token: the launch list, :func:`copy_GBps`, :func:`measure_t_min`, both
    floors, and ``tokens`` replayed tokens timed and traced for busy time (at ``busy_positions``, default the ``tokens``
    positions after the timed ones). Leaves ``model`` with the replay executor installed.

    Raises what :func:`measure_t_min` and :func:`replayed_token_busy` raise."""
    from ..capture import stream as S
    from ..timing import time_steps

    from ..token.config import token_id_at

    vocab = model.cfg.vocab
    model.executor = None
    model.token(start_pos - 1, token_id_at(start_pos - 1, vocab))  # every kernel compiled and loaded
    be.synchronize()
    with model.L.recording() as trace:
        model.token(start_pos, token_id_at(start_pos, vocab))
    be.synchronize()
    bw, why = copy_GBps(be, copy_measured)
    tm = measure_t_min(be, len(trace), replays=replays)
    floor = launch_list_floor(trace, bw, tm.replay_us.median)
    busy_floor = None if tm.kernel_us is None else launch_list_floor(trace, bw, tm.kernel_us.median).launch_floor_us
    with S.graphs_enabled():
        run_token, st = whole_token_runner(model, start_pos, base)
        smp = time_steps(be, run_token, tokens, stream=st, warmup=3)
        offsets = ([p - start_pos for p in busy_positions] if busy_positions is not None
                   else [tokens + 3 + i for i in range(tokens)])
        for _ in range(2):  # each token shape seen and captured before it is traced: replays only
            for off in offsets:
                run_token(off)
        tb = replayed_token_busy(be, lambda j: run_token(offsets[j]), len(offsets), warmup=0)
    launches = None
    names = [r.kernel for r in trace]
    if tb.durations is not None and tb.names == names:
        import pandas as pd

        launches = pd.DataFrame({"cluster": [r.cluster for r in trace], "layer": [r.layer for r in trace],
                                 "site": [r.site for r in trace], "kernel": names,
                                 "nbytes": [r.nbytes for r in trace],
                                 "us": np.median(tb.durations, axis=0),
                                 "us_p25": np.percentile(tb.durations, 25, axis=0),
                                 "us_p75": np.percentile(tb.durations, 75, axis=0)})
    return TokenFloors(floor, tm, busy_floor, tb, Stats.of(smp.device_us), why, launches)
