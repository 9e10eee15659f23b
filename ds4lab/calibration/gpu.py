"""``ds4lab calibrate`` (GPU only): the sim's cost-model parameters measured on this GPU (:func:`calibrate`), and the
long-context token's kernels refitted over several positions (:func:`calibrate_long_context`). What each constant is:
``docs/calibration.md``, "gpu"; ``ds4lab/data/h200.json`` is the shipped one."""

from __future__ import annotations

import time

import numpy as np

from ..report import provenance
from ..timing import Stats, copy_bandwidth, event_ms
from .kernels import kernel_fit, linear_fit, refit_kernels


def calibrate(be, preset: str = "small", tokens: int = 24, console=None) -> dict:
    """Measure every parameter on ``be`` (a CupyBackend; ``docs/calibration.md``, "gpu"); returns the calibration."""
    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions

    log = console.print if console else print
    be.compile_all()
    m = DecodeModel(get_preset(preset), be, TokenOptions(vocab=True))
    host_launch, dev = _eager_tokens(be, m, tokens)
    log(f"eager {preset}: {Stats.of(dev).median:.1f} µs per token, {m.L.census.total() / tokens:.0f} launches, "
        f"{host_launch:.2f} host µs per launch")
    a, bw, kernels = _kernel_fits(be, m, log)
    graph_node, host_graph_launch = _graph_replay(be)
    memset_host, memset_dev = _memset(be)
    meta = provenance.base_meta(be)
    return {
        "name": f"{meta.get('device', 'GPU')} ({time.strftime('%Y-%m-%d')})",
        "device": meta.get("device"),
        "driver": meta.get("driver"),
        "cupy": meta.get("cupy"),
        "measured": True,
        "source": f"ds4lab calibrate --preset {preset} (git {meta.get('git_revision')})",
        "host_launch_us": round(host_launch, 3),
        "host_graph_launch_us": round(host_graph_launch, 3),
        "host_api_us": round(memset_host, 3),
        "kernel_fixed_us": round(a, 3),
        "graph_node_us": round(graph_node, 4),
        "bandwidth_GBps": round(bw, 1),
        "memset_us": round(memset_dev, 3),
        "copy_GBps": round(copy_bandwidth().median, 1),
        "kernels": kernels,
        "eager_token_us": {"preset": preset, "median": round(Stats.of(dev).median, 1),
                           "p25": round(Stats.of(dev).p25, 1), "p75": round(Stats.of(dev).p75, 1)},
    }


def _eager_tokens(be, m, tokens: int) -> tuple[float, list[float]]:
    """``(host µs per launch, device µs per token)`` of ``tokens`` eager tokens, as ``ds4lab run`` decodes them."""
    import cupy

    for i in range(3):
        m.token(1000 + i, 3)
    be.synchronize()
    host, dev = [], []
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    m.L.census.reset()
    for i in range(tokens):
        e0.record()
        t0 = time.perf_counter()
        m.token(1003 + i, 5 + i)
        t1 = time.perf_counter()
        e1.record()
        be.synchronize()
        host.append((t1 - t0) * 1e6)
        dev.append(event_ms(e0, e1) * 1e3)
    return Stats.of(host).median / (m.L.census.total() / tokens), dev


def _kernel_fits(be, m, log) -> tuple[float, float, dict]:
    """``(fixed µs, GB/s, kernels)``: one fit over a token's kernels, one per kernel, and the empty kernel's t_min."""
    from ..experiments.floors import measure_t_min
    from ..measure.perop import per_op_times

    ops = per_op_times(be, m, pos=1100, token_id=9)
    a, bw = linear_fit(ops["nbytes"].to_numpy(), ops["us"].to_numpy())
    kernels = {name: kernel_fit(g["nbytes"].to_numpy(), g["us"].to_numpy(), bw_default=bw)
               for name, g in ops.groupby("kernel")}
    log(f"kernel fit over {len(ops)} launches: {a:.2f} µs fixed + bytes / {bw:.0f} GB/s")
    tm = measure_t_min(be, len(ops))
    if tm.kernel_us is not None:
        kernels["empty_kernel"] = {"fixed_us": round(tm.kernel_us.median, 3), "bandwidth_GBps": round(bw, 1),
                                   "samples": int(tm.kernel_us.n), "median_us": round(tm.kernel_us.median, 3)}
    log(f"t_min: {tm.replay_us.median:.3f} µs per kernel replayed, empty kernel "
        f"{'—' if tm.kernel_us is None else f'{tm.kernel_us.median:.3f} µs'} (graph of {len(ops)} kernels)")
    return a, bw, kernels


def _graph_replay(be, n_nodes: int = 400) -> tuple[float, float]:
    """``(device µs per node, host µs per cudaGraphLaunch)`` of a replayed graph of tiny kernels, median of 30."""
    import cupy

    from ..capture.scope import capture_scope

    st = cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros(1024, dtype=np.float32)
    fn = be.function("tiny_add")
    with capture_scope(None, st, "relaxed") as cap:
        for _ in range(n_nodes):
            fn((4,), (256,), (x, np.int32(1024)), 0, st)
    g = cap.graph
    g.launch(st)
    st.synchronize()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    rep, hl = [], []
    for _ in range(30):
        e0.record(st)
        t0 = time.perf_counter()
        g.launch(st)
        t1 = time.perf_counter()
        e1.record(st)
        rep.append(event_ms(e0, e1) * 1e3 / n_nodes)
        hl.append((t1 - t0) * 1e6)
        st.synchronize()
    return Stats.of(rep).median, Stats.of(hl).median


def _memset(be) -> tuple[float, float]:
    """``(host µs, device µs)`` of a ``cudaMemsetAsync`` of 4 KiB, median over 50."""
    import cupy

    st = cupy.cuda.Stream(non_blocking=True)
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    buf = cupy.zeros(1024, dtype=np.int32)
    host, dev = [], []
    for _ in range(50):
        e0.record(st)
        t0 = time.perf_counter()
        cupy.cuda.runtime.memsetAsync(buf.data.ptr, 0, buf.nbytes, st.ptr)
        t1 = time.perf_counter()
        e1.record(st)
        dev.append(event_ms(e0, e1) * 1e3)
        host.append((t1 - t0) * 1e6)
    return Stats.of(host).median, Stats.of(dev).median


#: Positions ``calibrate --long-context`` measures by default: both compressors emit at each
#: ((pos + 1) % 128 == 0), the indexer scores from a few hundred to 16 384 compressed rows, so each
#: long-context kernel gets a line over its bytes instead of one point (one position priced a
#: kernel whose work grows with the context at its 64k cost at every context).
LONG_CONTEXT_POSITIONS = (4095, 16383, 65535)


def long_context_kernels() -> list[str]:
    """The kernels ``kernels/longctx.cu`` defines (the ones the long-context token adds)."""
    from ..backends.cupy_backend import kernel_sources

    return sorted(k for k, f in kernel_sources().items() if f.name == "longctx.cu")


def calibrate_long_context(be, base: dict, preset: str = "ds4-flash", positions=LONG_CONTEXT_POSITIONS,
                           console=None) -> dict:
    """Fits for the long-context token's kernels (``kernels/longctx.cu``), measured as :func:`calibrate` does at
    every position of ``positions`` (default :data:`LONG_CONTEXT_POSITIONS`); those fits in ``base`` are replaced,
    the others kept. Raises ValueError for no position or one where both compressors do not emit."""
    import pandas as pd

    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions
    from ..measure.perop import per_op_times

    positions = sorted({int(p) for p in positions})
    if not positions:
        raise ValueError("name at least one position")
    bad = [p for p in positions if (p + 1) % 128]
    if bad:
        raise ValueError(f"positions {bad}: pick positions where both compressors emit ((pos + 1) % 128 == 0)")
    log = console.print if console else print
    cfg = get_preset(preset, long_context=True, max_context=-(-(positions[-1] + 2) // 128) * 128)
    m = DecodeModel(cfg, be, TokenOptions(vocab=False))
    names = long_context_kernels()
    tables = []
    for pos in positions:
        m.token(pos - 1, 3)  # warm: every kernel of this position's launch list compiled and loaded
        be.synchronize()
        ops = per_op_times(be, m, pos=pos, token_id=9)
        mine = ops[ops["kernel"].isin(names)]
        log(f"long-context token at {pos}: {len(ops)} launches, {len(mine)} of the long-context kernels")
        tables.append(ops.assign(position=pos))
    return refit_kernels(base, pd.concat(tables, ignore_index=True), names,
                         f"long-context kernels fitted by ds4lab calibrate --long-context ({preset}, positions "
                         f"{', '.join(map(str, positions))})")
