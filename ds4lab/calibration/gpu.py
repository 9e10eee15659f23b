"""``ds4lab calibrate`` (GPU only): measure the simulated runtime's cost-model parameters.

Measured on the current GPU, each with CUDA events (device time) or a host clock (host work):

* ``host_launch_us``: host time per kernel launch of a real decode token (op Python + launch
  layer + CuPy + driver), from eager tokens of the preset;
* ``host_graph_launch_us``: host time of one ``cudaGraphLaunch``;
* ``graph_node_us``: device time per node of a replayed graph of tiny kernels;
* ``kernel_fixed_us``, ``bandwidth_GBps``: a least-squares fit ``us = fixed + bytes / bandwidth``
  over every kernel of one token (each timed back to back behind a spin kernel), plus per-kernel
  fits in ``kernels``;
* ``memset_us``, ``host_api_us``, ``copy_GBps``;
* ``kernels.empty_kernel``: the traced duration of the empty kernel in a replayed graph as long as
  the token (:func:`ds4lab.measure.floors.measure_t_min`), so the sim models the launch-list
  floor's t_min as this GPU has it.

The result is a JSON file the ``sim`` backend loads (``DS4LAB_CALIBRATION=FILE``); ``ds4lab/data/h200.json``
is the one shipped for the H200.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..report import provenance, results
from ..timing import Stats, copy_bandwidth, event_ms


def _fit(nbytes: np.ndarray, us: np.ndarray, bw_default: float | None = None) -> tuple[float, float]:
    """Least squares ``us = a + nbytes / (bw * 1e3)``; returns (a µs >= 0, bw GB/s > 0).

    With a single distinct size (one call site), the slope is not identifiable: the bandwidth is
    ``bw_default`` and the fixed cost takes the rest of the median.
    """
    nbytes = nbytes.astype(np.float64)
    us = us.astype(np.float64)
    if len(set(nbytes.tolist())) < 2 and bw_default:
        a = float(np.median(us - nbytes / (bw_default * 1e3)))
        return max(a, 0.0), float(bw_default)
    A = np.stack([np.ones_like(nbytes), nbytes], axis=1)
    (a, slope), *_ = np.linalg.lstsq(A, us, rcond=None)
    if slope <= 0:  # no bandwidth signal (tiny kernels): all fixed cost
        return float(np.median(us)), float(bw_default or 1e6)
    return max(float(a), 0.0), 1.0 / float(slope) / 1e3


def calibrate(be, preset: str = "small", tokens: int = 24, console=None) -> dict:
    """Measure every parameter on ``be`` (a CupyBackend). Returns the calibration dict."""
    import cupy

    from .perop import per_op_times
    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions

    log = console.print if console else print
    be.compile_all()
    cfg = get_preset(preset)
    m = DecodeModel(cfg, be, TokenOptions(vocab=True))
    # host cost per launch in a real token (eager, legacy stream, as ds4lab run does it)
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
    launches = m.L.census.total() / tokens
    host_launch = Stats.of(host).median / launches
    log(f"eager {preset}: {Stats.of(dev).median:.1f} µs per token, {launches:.0f} launches, "
        f"{host_launch:.2f} host µs per launch")
    # per-kernel device times → fixed cost and bandwidth
    ops = per_op_times(be, m, pos=1100, token_id=9)
    a, bw = _fit(ops["nbytes"].to_numpy(), ops["us"].to_numpy())
    kernels = {}
    for name, g in ops.groupby("kernel"):
        ka, kbw = _fit(g["nbytes"].to_numpy(), g["us"].to_numpy(), bw_default=bw)
        kernels[name] = {"fixed_us": round(ka, 3), "bandwidth_GBps": round(kbw, 1), "samples": int(len(g)),
                         "median_us": round(float(g["us"].median()), 3)}
    log(f"kernel fit over {len(ops)} launches: {a:.2f} µs fixed + bytes / {bw:.0f} GB/s")
    # the empty kernel of the launch-list floor's t_min: its traced duration inside a graph as
    # long as the token, so the sim's modeled t_min (ds4lab.measure.floors) is this GPU's
    from .floors import measure_t_min

    tm = measure_t_min(be, len(ops))
    if tm.kernel_us is not None:
        kernels["empty_kernel"] = {"fixed_us": round(tm.kernel_us.median, 3), "bandwidth_GBps": round(bw, 1),
                                   "samples": int(tm.kernel_us.n), "median_us": round(tm.kernel_us.median, 3)}
    log(f"t_min: {tm.replay_us.median:.3f} µs per kernel replayed, empty kernel "
        f"{'—' if tm.kernel_us is None else f'{tm.kernel_us.median:.3f} µs'} (graph of {len(ops)} kernels)")
    # graph replay: per node and per launch
    st = cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros(1024, dtype=np.float32)
    fn = be.function("tiny_add")
    n_nodes = 400
    from ..capture.scope import capture_scope

    with capture_scope(None, st, "relaxed") as cap:  # CuPy's default mode is relaxed (gpu-facts.md)
        for _ in range(n_nodes):
            fn((4,), (256,), (x, np.int32(1024)), 0, st)
    g = cap.graph
    g.launch(st)
    st.synchronize()
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
    # memsetAsync host cost and device time
    buf = cupy.zeros(1024, dtype=np.int32)
    ms_host, ms_dev = [], []
    for _ in range(50):
        e0.record(st)
        t0 = time.perf_counter()
        cupy.cuda.runtime.memsetAsync(buf.data.ptr, 0, buf.nbytes, st.ptr)
        t1 = time.perf_counter()
        e1.record(st)
        ms_dev.append(event_ms(e0, e1) * 1e3)
        ms_host.append((t1 - t0) * 1e6)
    bwc = copy_bandwidth()
    meta = provenance.base_meta(be)
    cal = {
        "name": f"{meta.get('device', 'GPU')} ({time.strftime('%Y-%m-%d')})",
        "device": meta.get("device"),
        "driver": meta.get("driver"),
        "cupy": meta.get("cupy"),
        "measured": True,
        "source": f"ds4lab calibrate --preset {preset} (git {meta.get('git_revision')})",
        "host_launch_us": round(host_launch, 3),
        "host_graph_launch_us": round(Stats.of(hl).median, 3),
        "host_api_us": round(Stats.of(ms_host).median, 3),
        "kernel_fixed_us": round(a, 3),
        "graph_node_us": round(Stats.of(rep).median, 4),
        "bandwidth_GBps": round(bw, 1),
        "memset_us": round(Stats.of(ms_dev).median, 3),
        "copy_GBps": round(bwc.median, 1),
        "kernels": kernels,
        "eager_token_us": {"preset": preset, "median": round(Stats.of(dev).median, 1),
                           "p25": round(Stats.of(dev).p25, 1), "p75": round(Stats.of(dev).p75, 1)},
    }
    return cal


def add_kernel_fits(base: dict, ops, note: str) -> dict:
    """``base`` with per-kernel fits (``us = fixed + bytes / bandwidth``, :func:`_fit`) added for
    every kernel in ``ops`` (a per-op timing table: ``kernel``, ``nbytes``, ``us`` per launch)
    that ``base["kernels"]`` lacks; kernels it has keep their fits. ``note`` joins ``source``.

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
        a, bw = _fit(g["nbytes"].to_numpy(), g["us"].to_numpy(), bw_default=float(base["bandwidth_GBps"]))
        out["kernels"][name] = {"fixed_us": round(a, 3), "bandwidth_GBps": round(bw, 1), "samples": int(len(g)),
                                "median_us": round(float(g["us"].median()), 3)}
    out["source"] = f"{base.get('source', '')}; {note}"
    return out


#: The stages whose host times give the host constants: eager stage 0 (kernel launches only), ds4's
#: islands (stage i: kernel launches and graph-cache calls) and stage i+ (those plus kernel-node
#: updates of a cached graph).
HOST_FIT_STAGES = ("0", "i", "i+")


def fit_host_from_ladder(base: dict, folders) -> tuple[dict, "pandas.DataFrame"]:
    """``base`` with its ds4lab host constants refitted from measured ladder or context folders
    (``ladder.csv`` or ``context.csv`` and ``meta.json`` of a GPU run), no GPU needed. Each comes
    from one stage's host enqueue time per token (``host_us_median``), once the calls priced
    before it are taken out, and is the median over the folders' rows (one per context):

    * ``host_launch_us`` from stage 0: host time over kernel launches (what :func:`calibrate`
      measures from eager tokens);
    * ``host_graph_call_us`` from stage i: ``(host - K * host_launch_us) / G - host_graph_launch_us``,
      ds4lab's own work around each graph launch of its graph cache (keys, lookup, stream choice);
      ``host_graph_launch_us`` stays the bare ``cudaGraphLaunch`` that :func:`calibrate` measures;
    * ``host_node_update_us`` from stage i+: ``(host - K * host_launch_us - G * (host_graph_launch_us
      + host_graph_call_us)) / updates - host_api_us``, ds4lab's own work per kernel-node update
      (planning the call, packing the parameters) beside the update call.

    K, G, updates: the row's kernel launches, graph launches and node updates per token (a ladder
    from before stages i and i+ has no graph-launch or node-update column: 0). A constant whose
    stage no folder timed stays as in ``base``.

    Returns ``(calibration dict, table)``: the table (pandas) has one row per fitted value with its
    folder and context. ``source`` names the folders.

    Raises:
        ValueError: a folder that is not a ladder or context result, one modeled on the sim, a table
            without host times or launch counts, or no stage-0 row in any folder (each names it).
    """
    import pandas as pd

    from .sim_check import read_record

    rows, used = [], []
    for folder in map(Path, folders):
        job, _, d = read_record(folder)
        table = folder / f"{job}.csv"
        need = {"stage", "host_us_median", "kernel_launches"}
        if not need <= set(d.columns):
            raise ValueError(f"{table}: lacks {sorted(need - set(d.columns))}, the host enqueue time and launch "
                             "counts per stage the fit reads (a ladder from an older ds4lab)")
        for col in ("graph_launches", "node_updates"):  # older ladders: no stage launched graphs or updated nodes
            if col not in d.columns:
                d[col] = 0.0
        d["folder"] = str(folder)
        rows.append(d[d["stage"].isin(HOST_FIT_STAGES)])
        used.append(str(folder))
    if not rows:
        raise ValueError("name at least one measured ladder or context folder")
    d = pd.concat(rows, ignore_index=True)
    if not ((d["stage"] == "0") & (d["kernel_launches"] > 0)).any():
        raise ValueError(f"no stage 0 row in {', '.join(used)}: host_launch_us comes from eager tokens")
    out = dict(base)
    out.setdefault("host_graph_call_us", 0.0)
    out.setdefault("host_node_update_us", 0.0)
    fit = []

    def refit(stage: str, figure: str, value, per: str) -> None:
        rows = d[(d["stage"] == stage) & (d[per] > 0)]  # a row without what it prices says nothing of it
        got = [{"figure": figure, "folder": r.folder, "context": r.context, "value": float(value(r))}
               for r in rows.itertuples()]
        fit.extend(got)
        if got:
            out[figure] = round(max(0.0, float(np.median([g["value"] for g in got]))), 3)

    refit("0", "host_launch_us", lambda r: r.host_us_median / r.kernel_launches, "kernel_launches")
    hl, hg = out["host_launch_us"], float(base["host_graph_launch_us"])
    refit("i", "host_graph_call_us", lambda r: (r.host_us_median - r.kernel_launches * hl) / r.graph_launches - hg,
          "graph_launches")
    call = out["host_graph_call_us"]
    api = float(base["host_api_us"])
    refit("i+", "host_node_update_us",
          lambda r: (r.host_us_median - r.kernel_launches * hl - r.graph_launches * (hg + call)) / r.node_updates - api,
          "node_updates")
    out["source"] = (f"{base.get('source', '')}; host constants fitted from measured ladders by ds4lab calibrate "
                     f"--from-ladder {' '.join(used)}")
    return out, pd.DataFrame(fit, columns=["figure", "folder", "context", "value"])


#: Positions ``calibrate --long-context`` measures by default: both compressors emit at each
#: ((pos + 1) % 128 == 0), the indexer scores from a few hundred to 16 384 compressed rows, so each
#: long-context kernel gets a line over its bytes instead of one point (one position priced a
#: kernel whose work grows with the context at its 64k cost at every context).
LONG_CONTEXT_POSITIONS = (4095, 16383, 65535)


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


def long_context_kernels() -> list[str]:
    """The kernels ``kernels/longctx.cu`` defines (the ones the long-context token adds)."""
    from ..backends.cupy_backend import kernel_sources

    return sorted(k for k, f in kernel_sources().items() if f.name == "longctx.cu")


def calibrate_long_context(be, base: dict, preset: str = "ds4-flash", positions=LONG_CONTEXT_POSITIONS,
                           console=None) -> dict:
    """Fits for the kernels the long-context token adds (``kernels/longctx.cu``), measured as
    :func:`calibrate` measures the others (:func:`ds4lab.measure.perop.per_op_times`: each launch of one
    token re-issued behind a spin kernel, CUDA events), at every position of ``positions`` (default
    :data:`LONG_CONTEXT_POSITIONS`), one line per kernel over the bytes of all of them; those
    kernels' fits in ``base`` are replaced, the others kept.

    Raises:
        ValueError: a position where the compressors do not both emit (their emit kernels would not
            run), or no position.
    """
    import pandas as pd

    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions
    from .perop import per_op_times

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


def write_calibration(cal: dict, path: Path) -> None:
    """Write a calibration file (atomically). Raises :class:`ds4lab.errors.CalibrationError` for a
    path in ds4lab's own data folder (:func:`ds4lab.sim.calibration.refuse_shipped`)."""
    from ..sim.calibration import refuse_shipped

    path = Path(path)
    refuse_shipped(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    results.write_meta(path, cal)


#: The tiled (tokens > 1) expert kernels of ds4lab's five-launch path, their ds4 profile stage, and
#: their matrix (ds4's path: :func:`tiled_kernels`).
TILED_KERNELS = {"moe_gateup_tiled": ("gateup", "gate_up"), "moe_down_tiled": ("down", "down")}


def tiled_kernels(cfg) -> dict[str, tuple[str, str]]:
    """The tiled expert kernels of ``cfg``'s routed-MoE path: :data:`TILED_KERNELS`, or on ds4's path
    ``moe_gateup_mid_tiled_<gate/up format>`` and ``moe_down_tiled_<down format>``."""
    if cfg.moe_path != "ds4":
        return TILED_KERNELS
    gu, dn = cfg.expert_formats
    return {f"moe_gateup_mid_tiled_{gu}": ("gateup", "gate_up"), f"moe_down_tiled_{dn}": ("down", "down")}


def fit_tiled_moe(moe_dir: Path, max_tokens: int = 64) -> dict:
    """Per-kernel cost-model fits for the tiled routed-MoE kernels from a ``ds4lab moe`` folder
    measured on a GPU: the ``in-graph`` per-stage medians under ``uniform`` routing for 2 to
    ``max_tokens`` tokens per step (beyond that the kernels stop being bandwidth-bound), against
    the bytes the cost model charges them (the expected tile count under uniform routing times
    one expert's weights: :func:`ds4lab.token.reference.expected_tiles`).

    Returns ``{kernel: {fixed_us, bandwidth_GBps, samples, source}}`` to merge into a
    calibration's ``kernels``. Raises ``ValueError`` naming the folder when it is modeled (sim),
    lacks in-graph uniform rows for at least two token counts, or has no preset in its meta.
    """
    import pandas as pd

    from ..token.config import BYTES_PER_WEIGHT, get_preset
    from ..token.reference import expected_tiles

    moe_dir = Path(moe_dir)
    try:
        meta = json.loads((moe_dir / "meta.json").read_text())
        summary = pd.read_csv(moe_dir / "summary.csv")
    except (OSError, ValueError) as e:
        raise ValueError(f"{moe_dir}: not a ds4lab moe result folder ({e})") from None
    if meta.get("modeled") or not meta.get("measured", True):
        raise ValueError(f"{moe_dir}: modeled on the simulated runtime; fit from a GPU measurement")
    if not isinstance(meta, dict):
        raise ValueError(f"{moe_dir}/meta.json: a JSON object expected")
    preset = meta.get("preset", {})
    if isinstance(preset, str):
        preset = {"name": preset}
    if not isinstance(preset, dict) or "name" not in preset:
        raise ValueError(f"{moe_dir}/meta.json names no preset")
    # A folder written before ModelConfig.expert_format existed measured ds4lab's 4-bit block experts.
    cfg = get_preset(preset["name"], expert_format=preset.get("expert_format", "q4blk"))
    F, E, k, N = cfg.expert_ffn, cfg.embed, cfg.n_used, cfg.n_experts
    shapes = {"gate_up": (2 * F, E, cfg.expert_formats[0]), "down": (E, F, cfg.expert_formats[1])}
    missing = [c for c in ("mode", "routing", "tokens", "stage", "median_ms") if c not in summary.columns]
    if missing:
        raise ValueError(f"{moe_dir}/summary.csv lacks the column(s) {', '.join(missing)}")
    d = summary[(summary["mode"] == "in-graph") & (summary["routing"] == "uniform")
                & summary["tokens"].between(2, max_tokens)]
    fits = {}
    for kernel, (stage, bank) in tiled_kernels(cfg).items():
        g = d[d["stage"] == stage].sort_values("tokens")
        if g["tokens"].nunique() < 2:
            raise ValueError(f"{moe_dir}: {stage} needs in-graph uniform times for two token counts "
                             f"in 2..{max_tokens}, found {sorted(g['tokens'].unique())}")
        rows, cols, fmt = shapes[bank]
        per_tile = int(rows * cols * BYTES_PER_WEIGHT[fmt])
        nbytes = np.array([expected_tiles(int(t), k, N) * per_tile for t in g["tokens"]])
        a, bw = _fit(nbytes, g["median_ms"].to_numpy() * 1e3)
        fits[kernel] = {"fixed_us": round(a, 3), "bandwidth_GBps": round(bw, 1), "samples": int(len(g)),
                        "source": f"ds4lab moe in-graph, uniform, tokens {list(map(int, g['tokens']))}, "
                                  f"{meta.get('device')} {meta.get('timestamp', '')}"}
    return fits
