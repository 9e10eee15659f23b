"""``ds4lab ladder``: the stages of ds4's CUDA-graph plan, measured (GPU) or modeled (sim).

Each stage is one configuration of the same decode token (``shared/context/ds4-decode.md``,
"The staged plan"). Per stage: exactness against stage 0 over K tokens (final hidden state and
logits, bit for bit), then µs per token over N tokens after warm-up (CUDA events on the stage's
stream; each token ended with a device synchronize as ds4 does), host enqueue time, kernel and
graph launches per token, the graph cache's statistics, speedup over stage 0, and efficiency
against the GPU-busy floor (the sum of one token's kernel durations).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import provenance, results
from . import stream as S
from .capture import GraphCache
from .config import MAX_POS, get_preset
from .model import DecodeModel, TokenOptions
from .timing import Stats, profiler_range

#: The hazard fixes a stage can require (context file, "Capture hazards").
FIXES = ("launches through the accessor", "non-blocking stream", "async counts clear",
         "expert selection on the device", "preallocated scratch", "no host-timed profiling",
         "scalars from device buffers", "node parameters updated before replay",
         "no device sync in the body", "warm-up before capture")


@dataclass(frozen=True)
class Stage:
    """One rung of the ladder: which stream, which clusters are captured, which fixes apply."""

    name: str
    short: str
    description: str
    nonblocking: bool = True
    capture: tuple = ()
    options: dict = field(default_factory=dict)
    update: bool = False
    fixes: tuple = ()


#: The first decoded position (the KV window is full from the start) and what a ladder writes.
START_POS = 1000
LADDER_OUTPUTS = ("ladder.csv", "ladder.png", "ladder.svg", "ladder.pdf")

STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("0", "eager, legacy", "stage 0: every launch through the accessor, no override: legacy stream, eager",
          nonblocking=False, fixes=("launches through the accessor",)),
    Stage("0s", "eager, stream", "eager on a non-blocking stream set with capture_set_stream (the stream "
          "change alone, no capture)", fixes=("launches through the accessor", "non-blocking stream")),
    Stage("1", "shared FFN", "shared-expert FFN cluster of every layer captured once, replayed (one graph per layer)",
          capture=("shared",), fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture")),
    Stage("2", "+ routed MoE", "stage 1 plus the routed-MoE cluster captured (experts read on the device, counts "
          "clear async, scratch preallocated, no host-timed profiling)", capture=("shared", "moe"),
          options=dict(counts_clear="async", scratch="prealloc", moe_profile=False),
          fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture", "async counts clear",
                 "expert selection on the device", "preallocated scratch", "no host-timed profiling")),
    Stage("3", "whole token", "the whole token body captured, per-token scalars read from device buffers "
          "written before each replay (one graph per token shape)", capture=("token",),
          options=dict(counts_clear="async", scratch="prealloc", moe_profile=False, scalars="device"),
          fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture", "async counts clear",
                 "expert selection on the device", "preallocated scratch", "no host-timed profiling",
                 "scalars from device buffers", "no device sync in the body")),
    Stage("3u", "token + update", "as 3, scalars passed by value; the executable graph's kernel parameters "
          "updated before each replay (re-capture + cudaGraphExecUpdate)", capture=("token",), update=True,
          options=dict(counts_clear="async", scratch="prealloc", moe_profile=False, scalars="value"),
          fixes=("launches through the accessor", "non-blocking stream", "warm-up before capture", "async counts clear",
                 "expert selection on the device", "preallocated scratch", "no host-timed profiling",
                 "node parameters updated before replay", "no device sync in the body")),
)}


def fixes_table():
    """Which hazard fixes each stage requires: a DataFrame, stages × fixes (``required`` / ``—``)."""
    import pandas as pd

    return pd.DataFrame({s.name: ["required" if f in s.fixes else "—" for f in FIXES] for s in STAGES.values()},
                        index=list(FIXES))


class LadderInputError(ValueError):
    """A ladder request that cannot run (the command line exits 2); nothing was measured."""


def parse_stages(text: str) -> list[Stage]:
    """``"0,0s,1"`` → stages. Raises :class:`LadderInputError` naming an unknown or repeated stage."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in STAGES]
    if bad or not names:
        raise LadderInputError(f"unknown stage(s) {', '.join(bad) or repr(text)}; choose from: {', '.join(STAGES)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LadderInputError(f"stage(s) {', '.join(twice)} listed more than once in {text!r}")
    return [STAGES[n] for n in names]


class StageRun:
    """One stage on a shared model: its options, its stream and its graph cache.

    All stages of a ladder share one :class:`DecodeModel` (one set of weights), switching
    options and executor with :meth:`activate`, so the stages can be timed in interleaved rounds
    and host noise falls on all of them alike.
    """

    def __init__(self, model: DecodeModel, stage: Stage, base_opts: TokenOptions, mode: str = "thread_local",
                 guard: bool = True, warmup: int = 1) -> None:
        self.stage, self.model, self.be = stage, model, model.be
        self.opts = TokenOptions(**{**base_opts.summary(), **stage.options})
        self.stream = self.be.new_stream(non_blocking=True) if stage.nonblocking else S.LEGACY_STREAM
        self.cache = GraphCache(self.be, stage.capture, mode=mode, update=stage.update, guard=guard,
                                warmup=warmup) if stage.capture else None

    def activate(self) -> None:
        self.model.set_options(self.opts)
        self.model.executor = self.cache

    def token(self, pos: int, tok: int) -> None:
        if self.stage.nonblocking:
            with S.stream_override(self.stream):
                self.model.token(pos, tok)
        else:
            self.model.token(pos, tok)


def token_id_at(pos: int, vocab: int) -> int:
    return (pos * 7919 + 13) % vocab


def exactness_record(run: StageRun, start: int, k: int) -> list[dict]:
    """From the prefilled state, decode ``k`` tokens from ``start`` with ``run``'s stage; after each:
    hidden state, logits, per-layer KV caches (host copies)."""
    be, m = run.be, run.model
    run.activate()
    m.reset_state()
    out = []
    for i in range(k):
        pos = start + i
        run.token(pos, token_id_at(pos, m.cfg.vocab))
        be.synchronize()
        out.append({"hidden": m.hidden().copy(),
                    "logits": None if m.logits is None else m.output_logits().copy(),
                    **{f"kv_cache[{layer}]": be.to_host(c).copy() for layer, c in enumerate(m.cache)}})
    return out


def first_difference(ref: list[dict], got: list[dict]) -> str | None:
    """``None`` when every tensor of every token is bit-identical, else the first that differs
    (token index and tensor name; caches before the hidden state, in layer order)."""
    for t, (a, b) in enumerate(zip(ref, got)):
        names = [n for n in a if n.startswith("kv_cache")] + ["hidden", "logits"]
        for n in names:
            x, y = a.get(n), b.get(n)
            if x is None and y is None:
                continue
            if x is None or y is None or x.shape != y.shape or not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
                return f"token {t}: {n}"
    return None


def gpu_busy_floor(be, model, pos: int) -> float | None:
    """µs: the sum of one token's kernel durations (per-op CUDA events on a GPU; the cost model's
    kernel times on the sim). The token runs eagerly, whatever the stage captures."""
    executor, model.executor = model.executor, None
    try:
        return _floor(be, model, pos)
    finally:
        model.executor = executor


def _floor(be, model, pos: int) -> float | None:
    if be.is_gpu:
        from .bench import per_op_times

        return float(per_op_times(be, model, pos=pos, token_id=token_id_at(pos, model.cfg.vocab)).us.sum())
    if getattr(be, "models_time", False):
        L = model.L
        L.trace = []
        model.token(pos, token_id_at(pos, model.cfg.vocab))
        trace, L.trace = L.trace, None
        return float(sum(be.cal.kernel_us(r.kernel, r.nbytes) for r in trace))
    return None


def _host_clock(be):
    """The sim's modeled host clock (µs), or None on a GPU (the real host clock is used)."""
    if getattr(be, "models_time", False):
        return lambda: be.host_time_us
    return None


def time_stage(run: StageRun, start: int, tokens: int, warmup: int, progress=None) -> dict:
    """µs per token (events on the stage's stream), host enqueue µs, launches per token."""
    be, m = run.be, run.model
    e0, e1 = be.new_event(), be.new_event()
    host_clock = _host_clock(be)
    for i in range(warmup):
        run.token(start + i, token_id_at(start + i, m.cfg.vocab))
    be.synchronize()
    m.L.census.reset()
    gpu, host = [], []
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()  # no collector pauses inside the timed tokens
    try:
        with profiler_range(be):  # nsys --capture-range=cudaProfilerApi records only these tokens
            _timed_tokens(run, start, warmup, tokens, e0, e1, host_clock, gpu, host, progress)
    finally:
        if gc_was:
            gc.enable()
    kinds = m.L.census.by_kind()
    per = {r.kind: float(r.launches) for r in kinds.itertuples()}
    return {"us": Stats.of(gpu), "host_us": Stats.of(host), "us_samples": gpu, "host_samples": host,
            "kernel_launches": per.get("kernel", 0.0), "graph_launches": per.get("graph", 0.0),
            "memsets": per.get("memset", 0.0), "memcpys": per.get("memcpy", 0.0)}


def _timed_tokens(run, start, warmup, tokens, e0, e1, host_clock, gpu, host, progress) -> None:
    be, m, stream = run.be, run.model, run.stream
    for i in range(tokens):
        pos = start + warmup + i
        be.event_record(stream, e0)
        h0 = host_clock() if host_clock else time.perf_counter() * 1e6
        run.token(pos, token_id_at(pos, m.cfg.vocab))
        h1 = host_clock() if host_clock else time.perf_counter() * 1e6
        be.event_record(stream, e1)
        be.synchronize()  # ds4 ends every token with cudaDeviceSynchronize()
        gpu.append(be.event_elapsed_ms(e0, e1) * 1e3)
        host.append(h1 - h0)
        if progress:
            progress()


def make_backends(backend: str):
    """(timing backend, exactness backend or None, label). ``auto``: cupy with a GPU, else sim."""
    from .backends.cupy_backend import gpu_usable

    if backend == "auto":
        backend = "cupy" if gpu_usable()[0] else "sim"
    if backend == "cupy":
        from .backends.cupy_backend import CupyBackend

        be = CupyBackend()
        return be, be
    if backend == "sim":
        from .sim.backend import SimBackend

        return SimBackend(timing_only=True), SimBackend(timing_only=False)
    raise ValueError(f"ds4lab ladder runs on cupy or sim, not {backend!r}")


def run_ladder(backend: str = "auto", preset: str | None = None, stages: str = "0,0s,1,2,3,3u",
               tokens: int = 200, warmup: int = 8, exact_tokens: int = 6, out: Path | None = None,
               mode: str = "thread_local", console=None, rounds: int = 4, nvtx: bool = False):
    """Run the ladder; writes ``ladder.csv`` (row by row), ``meta.json`` and ``ladder.png/.svg/.pdf``.

    Raises:
        ValueError: unknown stage, too few tokens, or a stage that is not bit-identical to stage 0
            (after writing everything: the figures on disk say which stage and tensor).
    """
    from .progress import make_console

    con = console or make_console()
    st_list = parse_stages(stages)
    if tokens < 200:
        con.print(f"[yellow]note: {tokens} timed tokens per stage (the ladder's figures use at least 200)[/]")
    if tokens < 1 or exact_tokens < 0 or rounds < 1 or warmup < 0:
        raise LadderInputError(f"tokens={tokens}, warmup={warmup}, exact_tokens={exact_tokens} and "
                               f"rounds={rounds} must be positive")
    if rounds > tokens:
        con.print(f"[yellow]note: {tokens} tokens cannot fill {rounds} rounds: timing {tokens} round(s) of one[/]")
        rounds = tokens
    per_round = -(-tokens // rounds)
    last = START_POS + exact_tokens + 2 + rounds * len(st_list) * (per_round + warmup)
    if last > MAX_POS:
        raise LadderInputError(f"--tokens {tokens} with --warmup {warmup} and --repeats {rounds} would decode "
                               f"positions up to {last}, past {MAX_POS} (positions are int32 kernel arguments)")
    if per_round * rounds != tokens:
        con.print(f"[yellow]note: {tokens} tokens in {rounds} rounds: {per_round} per round, "
                  f"{per_round * rounds} timed per stage[/]")
    be, be_exact = make_backends(backend)
    was_enabled = S.graphs_enabled()
    S.set_graphs_enabled(True)  # DS4_CUDA_GRAPHS=1: stages 0s and up set an override
    try:
        return _ladder(be, be_exact, preset, st_list, tokens, warmup, exact_tokens, out, mode, con, rounds, nvtx)
    finally:
        S.set_graphs_enabled(was_enabled)


def _rows(runs, samples, launches, exact, floor, be, preset, meta) -> list[dict]:
    """One row per stage from the samples so far."""
    rows, base_us = [], None
    for run in runs:
        st = run.stage
        us, host = Stats.of(samples[st.name]["us"]), Stats.of(samples[st.name]["host"])
        if st.name == "0":
            base_us = us.median
        stats = run.cache.stats.as_dict() if run.cache else {}
        rows.append({
            "stage": st.name, "short": st.short, "us_median": us.median, "us_p25": us.p25, "us_p75": us.p75,
            "n": us.n, "host_us_median": host.median, "floor_us": floor,
            "efficiency": (floor / us.median) if floor else None,
            "kernel_launches": launches[st.name][0], "graph_launches": launches[st.name][1],
            "speedup": None, "exact": exact[st.name][0], "first_mismatch": exact[st.name][1],
            "captures": stats.get("captures", 0), "replays": stats.get("replays", 0),
            "updates": stats.get("updates", 0), "retirements": stats.get("retirements", 0),
            "failures": ";".join(f"{k}={v}" for k, v in stats.get("failures", {}).items()),
            "backend": be.name, "preset": preset, "modeled": meta["modeled"], "description": st.description,
        })
    vs = "0" if base_us else rows[0]["stage"]  # without stage 0, gains are against the first stage listed
    base_us = base_us or rows[0]["us_median"]
    for r in rows:
        r["speedup"] = base_us / r["us_median"]
        r["speedup_vs"] = vs
    return rows


def _ladder(be, be_exact, preset, st_list, tokens, warmup, exact_tokens, out, mode, con, rounds=4, nvtx=False):
    preset = preset or ("ds4-flash" if be.is_gpu else "small")
    cfg = get_preset(preset)
    out = Path(out or f"results/ladder-{preset}-{be.name}")
    meta = provenance.base_meta(be)
    meta.update(job="ladder", preset=cfg.summary(), stages=[s.name for s in st_list], tokens=tokens,
                warmup=warmup, exact_tokens=exact_tokens, capture_mode=mode,
                modeled=bool(getattr(be, "models_time", False)))
    if meta["modeled"]:
        meta["calibration"] = getattr(be, "calibration", {}).get("name", "?") if isinstance(
            getattr(be, "calibration", None), dict) else str(getattr(be, "calibration", "?"))
        con.print(f"[bold yellow]sim backend: every figure below is MODELED "
                  f"(calibration {meta['calibration']}), not measured.[/]")
    if "0" not in {s.name for s in st_list}:
        con.print(f"[yellow]note: no stage 0 in the list: gains (×) are against stage {st_list[0].name}[/]")
    with results.job_folder(out, meta, LADDER_OUTPUTS):
        return _measure(be, be_exact, preset, cfg, st_list, tokens, warmup, exact_tokens, out, mode, con, rounds,
                        nvtx, meta)


def _measure(be, be_exact, preset, cfg, st_list, tokens, warmup, exact_tokens, out, mode, con, rounds, nvtx, meta):
    import pandas as pd

    from . import plots
    from .progress import JobProgress

    con.print(f"[bold]ds4lab ladder[/] · {preset} · {provenance.label(meta) if not meta['modeled'] else 'modeled'}")
    base = TokenOptions(vocab=True)
    start = START_POS
    model = DecodeModel(cfg, be, base, nvtx=nvtx)
    runs = [StageRun(model, st, base, mode=mode) for st in st_list]

    # 1. exactness: every stage from the same prefilled state, against stage 0, bit for bit
    exact = {st.name: ("n/a", "") for st in st_list}
    can_check = be_exact is not None and (be_exact.is_gpu or preset != "ds4-flash")
    if can_check and exact_tokens:
        if be_exact is be:
            model_x, runs_x = model, runs
        else:
            model_x = DecodeModel(cfg, be_exact, base)
            runs_x = [StageRun(model_x, st, base, mode=mode) for st in st_list]
        ref = exactness_record(StageRun(model_x, STAGES["0"], base, mode=mode), start, exact_tokens)
        for rx in runs_x:
            diff = first_difference(ref, exactness_record(rx, start, exact_tokens))
            exact[rx.stage.name] = (diff is None, diff or "")
            con.print(f"exactness, stage {rx.stage.name}: " + ("bit-identical to stage 0" if diff is None
                                                               else f"DIFFERS at {diff}"))
        del model_x, runs_x, ref
    elif exact_tokens:
        con.print("exactness: not checked (the simulated runtime cannot compute ds4-flash in reasonable time; "
                  "run it on a GPU, or use --preset small)")

    # 2. the GPU-busy floor: one token's kernel durations
    floor = gpu_busy_floor(be, model, start + exact_tokens)

    # 3. timing in interleaved rounds (odd rounds in reverse order): host noise hits every stage
    pos = start + exact_tokens + 1
    per_round = -(-tokens // rounds)
    samples = {r.stage.name: {"us": [], "host": []} for r in runs}
    launches = {}
    rows = []
    csv_path = out / "ladder.csv"
    with JobProgress(con, "timing stages", per_round * rounds * len(runs)) as prog:
        for rnd in range(rounds):
            for run in (runs if rnd % 2 == 0 else runs[::-1]):
                run.activate()
                t = time_stage(run, pos, per_round, warmup if rnd == 0 else 2, progress=prog.advance)
                pos += per_round + warmup
                samples[run.stage.name]["us"] += t["us_samples"]
                samples[run.stage.name]["host"] += t["host_samples"]
                launches[run.stage.name] = (t["kernel_launches"], t["graph_launches"])
            rows = _rows(runs, samples, launches, exact, floor, be, preset, meta)
            pd.DataFrame(rows).to_csv(csv_path, index=False)  # every round's figures as soon as they exist
    for r in rows:
        con.print(f"stage {r['stage']:3s} {r['us_median']:10.1f} µs/token (IQR {r['us_p25']:.1f}–{r['us_p75']:.1f})"
                  f"  ×{r['speedup'] or 0:.2f}  eff {r['efficiency'] or 0:.2f}  exact={r['exact']}"
                  f"{'  ' + r['first_mismatch'] if r['first_mismatch'] else ''}"
                  f"  launches {r['kernel_launches']:.0f} kernels + {r['graph_launches']:.0f} graphs"
                  + (f"  captures {r['captures']} replays {r['replays']} updates {r['updates']} "
                     f"retired {r['retirements']} {r['failures']}" if r["captures"] or r["failures"] else ""))
    df = pd.DataFrame(rows)
    meta["floor_us"] = floor
    meta["fixes"] = fixes_table().to_dict()
    provenance.write_json(out / "meta.json", meta)
    fig = plots.ladder_figure(df, meta)
    paths = plots.save(fig, out / "ladder")
    con.print(f"wrote {csv_path}, {out / 'meta.json'}, " + ", ".join(str(p) for p in paths))
    bad = df[df.exact == False]  # noqa: E712
    if len(bad):
        raise ValueError("not bit-identical to stage 0: " + "; ".join(f"stage {r.stage}: {r.first_mismatch}"
                                                                       for r in bad.itertuples()))
    return df
