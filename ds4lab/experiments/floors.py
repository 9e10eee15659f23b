"""The floors a decode token's GPU time is measured against, and the replayed token's busy time.

* the **bytes floor**: the bytes the token must move (each launch's declared ``nbytes``) over the measured
  device-to-device copy bandwidth (:func:`ds4lab.timing.copy_bandwidth`);
* **t_min**: the replay time per kernel of an empty kernel inside a graph as long as the token's launch list (CUDA
  events, median over replays); ``t_min_kernel_us``: that kernel's own duration (CUPTI), t_min without the node gap;
* the **launch-list floor**: ``max(bytes / bandwidth, t_min)`` summed over the launch list: no set of kernels with
  ds4's launch list beats it (with ``t_min_kernel_us``, it bounds the busy time: ``launch_floor_busy_us``);
* the **busy time** of a replayed token: the union of its kernel intervals, median over tokens
  (:func:`replayed_token_busy_us`).

Efficiency is floor / time (:func:`efficiencies` says where a floor is beaten). On the sim every figure is the cost
model's (``source``: ``modeled``). Sources: CUDA Runtime API (stream capture, ``cudaGraphLaunch``, events); CUPTI
``CONCURRENT_KERNEL`` records."""

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


# ----------------------------------------------------------------------------- trace source
def kernel_trace(be):
    """The kernel-trace source every busy-time figure reads (:func:`ds4lab.trace.live.trace_source`): CUPTI activity
    records on a GPU, the modeled timeline on ``sim``, or an unavailable source whose ``reason`` says why;
    ``take()`` gives the trace model's device records since the last take."""
    return trace_source(be)


@dataclass
class TokenBusy:
    """Busy time of replayed tokens (see :func:`replayed_token_busy`).

    ``busy``: µs per token, union of kernel intervals; ``span``: first kernel start to last kernel end, µs per token;
    ``kernels``: kernel records per token (each token's count in ``counts``); ``names`` and ``durations`` ``[tokens,
    kernels]`` (µs, in start order) when every token gave the same kernels; ``source``: ``cupti`` or ``modeled (...)``.
    """

    busy: Stats
    span: Stats
    kernels: int
    counts: list[int]
    source: str
    names: list[str] = field(default_factory=list)
    durations: Any = None


def replayed_token_busy(be, run_token: Callable[[int], None], tokens: int = 10, *,
                        warmup: int = 2) -> TokenBusy:
    """Busy time of ``tokens`` tokens run by ``run_token(i)`` (for a replayed token: a graph launch; the caller decides
    what runs), each followed by a device synchronize, from the kernel trace (:func:`kernel_trace`). ``warmup``
    calls come first, untraced (captures, instantiation, first replay).

    Raises:
        ValueError: ``tokens < 1`` or ``warmup < 0``.
        RuntimeError: no kernel trace on ``be`` (the message says why), or a token gave no kernel record."""
    if tokens < 1 or warmup < 0:
        raise ValueError(f"replayed_token_busy: tokens={tokens} must be >= 1 and warmup={warmup} >= 0")
    src = kernel_trace(be)
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


def replayed_token_busy_us(be, run_token: Callable[[int], None], tokens: int = 10) -> Stats:
    """µs per token of GPU-busy time (union of kernel intervals, kernel trace), median over ``tokens`` calls of
    ``run_token(i)``: :func:`replayed_token_busy`'s ``busy``. Modeled on the sim. Raises what
    :func:`replayed_token_busy` raises."""
    return replayed_token_busy(be, run_token, tokens).busy


# ----------------------------------------------------------------------------- t_min
@dataclass
class TMin:
    """The least a kernel costs in a replayed graph (see module docstring).

    ``replay_us``: µs per kernel of a replayed graph of ``kernels`` empty kernels (events, one figure per replay);
    ``kernel_us``: the empty kernel's own duration in the trace (µs per record, None without a trace); ``source``:
    ``cuda-events`` or ``modeled (...)``."""

    replay_us: Stats
    kernel_us: Stats | None
    kernels: int
    source: str


def measure_t_min(be, n_kernels: int, *, replays: int = 20, trace: bool = True) -> TMin:
    """t_min on ``be``: a graph of ``n_kernels`` launches of ``bench.cu:empty_kernel`` (grid 1, 32 threads), captured
    on a non-blocking stream, instantiated, replayed ``replays`` times between two events after two warm-up replays;
    µs per kernel = replay time / ``n_kernels``. With ``trace``, two more replays under the kernel trace give the
    empty kernel's own duration.

    Raises:
        ValueError: ``n_kernels < 1`` or ``replays < 1``.
        ds4lab.errors.CudaError: what the runtime raised (capture, instantiate, launch)."""
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
        src = kernel_trace(be)
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
        records: one entry per kernel launch, in any order: launch records (``.nbytes``, as ``Launcher.recording()``
            gives them), dicts with ``"nbytes"``, plain byte counts, or a DataFrame with an ``nbytes`` column.
        bandwidth_GBps: the copy bandwidth (GB/s, bytes read + written) the bytes are moved at.
        t_min_us: the least a kernel costs (µs; :func:`measure_t_min`).

    Returns:
        :class:`LaunchListFloor`: bytes floor Σ bytes / bandwidth, launch-list floor
        Σ max(bytes / bandwidth, t_min), and each kernel's floor.

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
    """``{"efficiency": floor / time, "over_floor": time / floor, "floor_beaten": bool}`` for a measured time and a
    floor of it (µs). ``floor_beaten`` is True when the time is below the floor: then the floor is not one (a
    bandwidth or t_min measured too low) and the efficiency, above 1, must not be read as one."""
    if not busy_us > 0 or not floor_us > 0:
        return {"efficiency": None, "over_floor": None, "floor_beaten": None}
    return {"efficiency": floor_us / busy_us, "over_floor": busy_us / floor_us, "floor_beaten": busy_us < floor_us}


def copy_GBps(be, measured: float | None = None) -> tuple[float, str]:
    """The copy bandwidth the floors use and its source: ``measured`` when given (the caller's own
    :func:`ds4lab.timing.copy_bandwidth` median), a fresh measurement on a GPU, the calibration's on a backend that
    models time.

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
    """``(run_token, stream)``: ``run_token(i)`` decodes position ``start_pos + i`` with ``model``'s whole token body
    captured once and replayed: stage 3 (:class:`~ds4lab.experiments.stage_run.StageRun` of ``STAGES["3"]``: scalars
    from a device buffer, async counts clear, preallocated scratch, no MoE profile, a non-blocking stream; the first
    call runs eagerly, the second captures). Activates the run on ``model``; the caller runs tokens inside
    ``ds4lab.capture.stream.graphs_enabled()``. ``base``: the token options stage 3's go over (default: the model's
    current ones; a ladder passes its own base, since its model holds the options of the stage it ran last)."""
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
    """From per-launch rows (columns kernel, nbytes, us): the large kernels' (≥ :data:`LARGE_KERNEL_BYTES`) achieved
    bandwidth as a fraction of ``bandwidth_GBps`` (their bytes over their summed µs), their count and µs, and the
    median µs of one ``attention_decode`` launch (``attention_us_per_layer``; None when the token has none)."""
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
    """Everything the floors need for ``model``'s token, in one call: the launch list (one eager token traced), the
    copy bandwidth (:func:`copy_GBps`), t_min for a graph of that many kernels (:func:`measure_t_min`), both floors,
    and ``tokens`` replayed tokens (the whole token captured, :func:`whole_token_runner`) timed with events and
    traced for busy time. Each launch's µs comes from the traced replays when their kernels match the launch list
    name by name. ``busy_positions``: the positions whose replays give the busy time (default: ``tokens`` positions
    after the timed ones); a ladder passes the positions it times, so that at a long context, where the launch list
    changes with the position, the busy time is that of the tokens it bounds. ``base``:
    :func:`whole_token_runner`'s. Leaves ``model`` with the replay executor installed.

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
