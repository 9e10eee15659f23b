"""``ds4lab bench`` (GPU only): host cost per eager launch through the launch layer (NVTX off and on) against a bare
CuPy ``RawKernel`` and CuPy's ``Function`` call (host clock around N launches; GPU span by events), and the 6-expert
routed-MoE decode step at the preset's dimensions (16 routings captured into one graph, replayed, events) against a
device-to-device copy. Next: ``docs/figures.md``, "Launch cost"."""

from __future__ import annotations

import time

import numpy as np

from ..token import ops
from ..report import provenance
from ..capture import stream as S
from ..capture.scope import capture_scope
from ..timing import Stats, copy_bandwidth, event_ms


def _noop() -> None:
    pass


def launch_overhead(be, n: int = 2000, repeats: int = 15) -> dict:
    """Host µs per launch for each launch path (median and IQR over ``repeats`` of ``n`` launches)."""
    import cupy

    from ..capture.launch import Launcher

    raw = be._module(be._sources["tiny_add"]).get_function("tiny_add")
    fn = be.function("tiny_add")
    x = cupy.zeros(1024, dtype=np.float32)
    args = (x, np.int32(1024))
    grid, block = (4,), (256,)
    L_off = Launcher(be, nvtx=False)
    L_on = Launcher(be, nvtx=True)
    side = cupy.cuda.Stream(non_blocking=True)

    def bare():
        for _ in range(n):
            raw(grid, block, args)

    def function():
        null = cupy.cuda.Stream.null
        for _ in range(n):
            fn(grid, block, args, 0, null)

    def function_side():
        for _ in range(n):
            fn(grid, block, args, 0, side)

    def launcher(L):
        def go():
            for _ in range(n):
                L.kernel("bench", "tiny_add", grid, block, args, _noop)
        return go

    def launcher_override():
        with S.stream_override(side):
            for _ in range(n):
                L_off.kernel("bench", "tiny_add", grid, block, args, _noop)

    variants = {
        "cupy RawKernel (bare)": (bare, False),
        "cupy Function + stream": (function, False),
        "cupy Function + non-blocking stream": (function_side, True),
        "ds4lab launcher, NVTX off": (launcher(L_off), False),
        "ds4lab launcher, NVTX on": (launcher(L_on), False),
        "ds4lab launcher, override stream": (launcher_override, True),
    }
    out = {}
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    for name, (go, needs_flag) in variants.items():
        with S.graphs_enabled(needs_flag):
            go()  # warm-up
            be.synchronize()
            host, gpu = [], []
            for _ in range(repeats):
                st = side if name.endswith(("override stream", "non-blocking stream")) else cupy.cuda.Stream.null
                e0.record(st)
                t0 = time.perf_counter()
                go()
                t1 = time.perf_counter()
                e1.record(st)
                gpu.append(event_ms(e0, e1) * 1e3 / n)
                host.append((t1 - t0) * 1e6 / n)
                be.synchronize()
        out[name] = {"host_us": Stats.of(host), "gpu_span_us": Stats.of(gpu)}
    base = out["cupy RawKernel (bare)"]["host_us"].median
    for v in out.values():
        v["ratio_vs_bare"] = v["host_us"].median / base
    return out


def moe_bandwidth(be, cfg, routings: int = 16, replays: int = 50, seed: int = 7) -> dict:
    """Achieved GB/s of the decode routed-MoE step (T = 1), graph-replayed, against a D2D copy."""
    import cupy

    from ..token.model import DecodeModel, TokenOptions

    m = DecodeModel(cfg, be, TokenOptions(counts_clear="async"), n_layers=1)
    L, bank = m.L, m.banks[0]
    rng = np.random.default_rng(seed)
    k, E = cfg.n_used, cfg.embed
    x_all = be.from_host(rng.standard_normal((routings, E)).astype(np.float32))
    ids_all = be.from_host(np.stack([rng.choice(cfg.n_experts, k, replace=False)
                                     for _ in range(routings)]).astype(np.int32))
    w_all = be.from_host(rng.dirichlet(np.ones(k), routings).astype(np.float32))

    def step(i):  # the token's routed-MoE launches for the config's expert format and path
        m.moe_launches(bank, x_all[i], ids_all[i], w_all[i], 1)

    st = cupy.cuda.Stream(non_blocking=True)
    with S.graphs_enabled():
        with S.stream_override(st):
            with L.recording() as rec:  # bytes of a step: the launch sites' own counts (weights, activations)
                step(0)
            for i in range(1, routings):  # warm-up, eager
                step(i)
            st.synchronize()
            # eager timing of the same steps (host-bound: launches arrive slower than the GPU runs them)
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            eager = []
            for _ in range(10):
                e0.record(st)
                for i in range(routings):
                    step(i)
                e1.record(st)
                eager.append(event_ms(e0, e1) * 1e3 / routings)
            with capture_scope(None, st, "thread_local") as cap:
                for i in range(routings):
                    step(i)
            g = cap.graph
        g.upload(st) if hasattr(g, "upload") else None
        g.launch(st)
        st.synchronize()
        rep = []
        for _ in range(replays):
            e0.record(st)
            g.launch(st)
            e1.record(st)
            rep.append(event_ms(e0, e1) * 1e3 / routings)
    nbytes = sum(r.nbytes for r in rec)
    st_rep = Stats.of(rep)
    bw = copy_bandwidth()
    return {"bytes_per_step": nbytes, "graph_replay_us": st_rep, "eager_us": Stats.of(eager),
            "achieved_GBps": nbytes / (st_rep.median * 1e-6) / 1e9, "copy_GBps": bw,
            "fraction_of_copy": nbytes / (st_rep.median * 1e-6) / 1e9 / bw.median}


#: Keys of :func:`summary` (the fields ``bench.json`` carries at its top level).
SUMMARY_KEYS = ("token_busy_us", "bytes_floor_us", "launch_floor_us", "t_min_us", "t_min_kernel_us",
                "large_kernel_copy_fraction", "moe_decode_copy_fraction", "attention_us_per_layer",
                "busy_vs_bytes_floor", "busy_vs_launch_floor", "replay_vs_launch_floor", "token_replay_us",
                "busy_over_floor", "copy_GBps", "launch_us_bare", "launch_us_override", "launch_us_nvtx",
                "launch_us_launcher")


def summary(lo: dict, mb: dict, per_op: dict | None) -> dict:
    """The headline figures of a bench run (:data:`SUMMARY_KEYS`): the per-op run's busy time, floors, t_min, copy
    fractions and efficiencies (None without it), the MoE step's copy fraction, host µs per launch."""
    host = {k: v["host_us"].median for k, v in lo.items()}
    po = per_op or {}
    return {
        **{k: po.get(k) for k in ("token_busy_us", "bytes_floor_us", "launch_floor_us", "t_min_us", "t_min_kernel_us",
                                  "large_kernel_copy_fraction", "attention_us_per_layer", "busy_vs_bytes_floor",
                                  "busy_vs_launch_floor", "replay_vs_launch_floor", "token_replay_us")},
        "busy_over_floor": (po["token_busy_us"] / po["bytes_floor_us"]) if po.get("bytes_floor_us") else None,
        "copy_GBps": mb["copy_GBps"].median,
        "moe_decode_copy_fraction": mb["fraction_of_copy"],
        "launch_us_bare": host["cupy RawKernel (bare)"],
        "launch_us_override": host["ds4lab launcher, override stream"],
        "launch_us_nvtx": host["ds4lab launcher, NVTX on"],
        "launch_us_launcher": host["ds4lab launcher, NVTX off"],
    }


def run_bench(be, cfg, console, *, per_op: bool = False, outputs: dict | None = None) -> dict:
    """The benchmarks: prints tables, returns the figures (with provenance) and :func:`summary`'s fields; ``per_op``
    adds :func:`ds4lab.measure.perop.run_per_op` (its tables and figure into ``outputs``)."""
    from rich.table import Table

    meta = provenance.base_meta(be)
    be.compile_all()
    lo = launch_overhead(be)
    t = Table(title=f"host cost per eager launch — {provenance.label(meta)}")
    for c in ("launch path", "host µs/launch (median)", "IQR", "GPU span µs/launch", "× bare RawKernel"):
        t.add_column(c, justify="left" if c == "launch path" else "right")
    for name, v in lo.items():
        h = v["host_us"]
        t.add_row(name, f"{h.median:.2f}", f"{h.p25:.2f}–{h.p75:.2f}", f"{v['gpu_span_us'].median:.2f}",
                  f"{v['ratio_vs_bare']:.3f}")
    console.print(t)
    mb = moe_bandwidth(be, cfg)
    t2 = Table(title=f"routed-MoE decode step, {cfg.name} (6 experts) — {provenance.label(meta)}")
    t2.add_column("figure")
    t2.add_column("value", justify="right")
    t2.add_row("bytes per step", f"{mb['bytes_per_step'] / 1e6:.1f} MB")
    t2.add_row("graph replay µs/step (median, IQR)",
               f"{mb['graph_replay_us'].median:.1f} ({mb['graph_replay_us'].p25:.1f}–{mb['graph_replay_us'].p75:.1f})")
    t2.add_row("eager µs/step (median)", f"{mb['eager_us'].median:.1f}")
    t2.add_row("achieved GB/s", f"{mb['achieved_GBps']:.0f}")
    t2.add_row("D2D copy GB/s (read+write)", f"{mb['copy_GBps'].median:.0f}")
    t2.add_row("fraction of copy bandwidth", f"{mb['fraction_of_copy']:.0%}")
    console.print(t2)
    gr = graph_replay_cost(be)
    t3 = Table(title=f"graph replay cost per kernel node (350 small kernels) — {provenance.label(meta)}")
    t3.add_column("graph")
    t3.add_column("µs per node (median)", justify="right")
    t3.add_column("IQR", justify="right")
    for name, st in gr.items():
        t3.add_row(name, "—" if st is None else f"{st.median:.3f}", "" if st is None else f"{st.p25:.3f}–{st.p75:.3f}")
    console.print(t3)
    po = None
    if per_op:
        from .perop import run_per_op

        po = run_per_op(be, cfg, console, outputs, copy_GBps=mb["copy_GBps"].median, meta=meta)
    res = summary(lo, mb, po)
    res.update({"meta": meta, "launch_overhead": lo, "moe_bandwidth": mb, "graph_replay": gr})
    if po is not None:
        res["per_op"] = po
    return res


def graph_replay_cost(be, n: int = 350, replays: int = 50) -> dict:
    """µs per node of a replayed graph of ``n`` small kernels: ds4lab, CuPy's graph API, torch (where importable)."""
    import cupy

    from ..capture.launch import Launcher

    out = {}
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()

    def time_replays(launch, stream):
        launch()
        stream.synchronize()
        v = []
        for _ in range(replays):
            e0.record(stream)
            launch()
            e1.record(stream)
            v.append(event_ms(e0, e1) * 1e3 / n)
        return Stats.of(v)

    # ds4lab: the launch layer under capture
    st = be.new_stream(non_blocking=True)
    x = cupy.zeros(1024, dtype=np.float32)
    L = Launcher(be)
    with S.graphs_enabled(), S.stream_override(st):
        with capture_scope(be, st, "thread_local") as cap:
            for _ in range(n):
                L.kernel("bench", "tiny_add", (4,), (256,), (x, np.int32(1024)), _noop)
    ex = be.graph_instantiate(cap.graph)
    out["ds4lab launcher graph"] = time_replays(lambda: be.graph_launch(ex, st), st)
    # CuPy's own graph API with a bare RawKernel
    raw = be._module(be._sources["tiny_add"]).get_function("tiny_add")
    s2 = cupy.cuda.Stream(non_blocking=True)
    with s2, capture_scope(None, s2, "relaxed") as cap2:  # CuPy's default mode is relaxed (gpu-facts.md)
        for _ in range(n):
            raw((4,), (256,), (x, np.int32(1024)))
    g2 = cap2.graph
    out["CuPy Graph, bare RawKernel"] = time_replays(lambda: g2.launch(s2), s2)
    try:
        import torch

        t = torch.zeros(1024, device="cuda")
        ts = torch.cuda.Stream()
        with torch.cuda.stream(ts):
            for _ in range(3):
                t.add_(1)
        torch.cuda.synchronize()
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            for _ in range(n):
                t.add_(1)
        te0, te1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        tg.replay()
        torch.cuda.synchronize()
        v = []
        for _ in range(replays):
            te0.record()
            tg.replay()
            te1.record()
            te1.synchronize()
            v.append(te0.elapsed_time(te1) * 1e3 / n)
        out["torch.cuda.CUDAGraph, x.add_(1)"] = Stats.of(v)
    except Exception as e:  # torch missing or without CUDA: say so in the table
        out[f"torch unavailable ({type(e).__name__})"] = None
    return out
