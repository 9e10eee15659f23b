"""``ds4lab ladder``: the stages of ds4's CUDA-graph plan, measured (GPU) or modeled (sim).

Each stage is one configuration of the same decode token (``shared/context/ds4-decode.md``,
"The staged plan"; :mod:`ds4lab.experiments.ladder`). Per stage: exactness against stage 0 over K tokens
(final hidden state, logits and every KV cache, bit for bit), then µs per token over N tokens
after warm-up (CUDA events on the stage's stream; each token ended with a device synchronize as
ds4 does), host enqueue time, kernel and graph launches per token, the graph cache's statistics,
speedup over stage 0, and efficiency against the GPU-busy floor (the sum of one token's kernel
durations). Stages are timed in interleaved rounds (odd rounds in reverse order), so host noise
falls on every stage alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..report import provenance, results
from ..capture import stream as S
from ..sim.calibration import backend_calibration
from ..token.config import MAX_POS, get_preset, is_ds4_flash
from ..experiments.ladder import (LADDER_OUTPUTS, START_POS, STAGES, LadderInputError, StageRun, exactness_record,
                                  first_difference, fixes_table, gpu_busy_floor, parse_stages, time_stage)
from ..token.model import DecodeModel, TokenOptions
from ..timing import Stats
from .common import CheckFailed, default_preset, modeled_banner


@dataclass
class LadderConfig:
    """Arguments of ``ds4lab ladder`` (see ``ds4lab ladder --help``).

    ``tokens``: timed tokens per stage, split over ``rounds`` interleaved rounds; ``exact_tokens``:
    tokens compared bit for bit with stage 0 (0: skip); ``mode``: stream-capture mode
    (``global``, ``thread_local``, ``relaxed``); ``out``: result folder (None:
    ``results/ladder-<preset>-<backend>``); ``start_pos``: the first decoded position;
    ``long_context``: the long-context token (:mod:`ds4lab.experiments.context`), where stage ``3c`` exists.
    """

    stages: str = "0,0s,1,2,3,3u"
    preset: str | None = None
    tokens: int = 200
    warmup: int = 8
    exact_tokens: int = 6
    rounds: int = 4
    mode: str = "thread_local"
    nvtx: bool = False
    out: Path | str | None = None
    #: Position of the first decoded token (the caches are prefilled up to it): time any stage at
    #: any context.
    start_pos: int = START_POS
    #: The long-context token (compressed and indexed attention; stage ``3c`` becomes available).
    long_context: bool = False


class NotExact(CheckFailed):
    """A stage is not bit-identical to stage 0 (exit 1); everything was measured and written."""


def check(cfg: LadderConfig, con) -> tuple[list, int]:
    """Validate ``cfg`` before any work. Returns ``(stages, rounds)`` (rounds capped at tokens).

    Raises:
        LadderInputError: unknown or repeated stage, non-positive counts, positions past int32,
            an empty ``out``.
    """
    st_list = _stages(cfg)
    if cfg.start_pos < 4:
        raise LadderInputError(f"--start-pos {cfg.start_pos}: the ladder starts at position 4 or later")
    if cfg.tokens < 1 or cfg.exact_tokens < 0 or cfg.rounds < 1 or cfg.warmup < 0:
        raise LadderInputError(f"tokens={cfg.tokens}, warmup={cfg.warmup}, exact_tokens={cfg.exact_tokens} and "
                               f"rounds={cfg.rounds} must be positive")
    if cfg.out is not None and not str(cfg.out).strip():
        raise LadderInputError("--out '': an empty path would silently mean the current folder; name a folder")
    if cfg.tokens < 200:
        con.print(f"[yellow]note: {cfg.tokens} timed tokens per stage (the ladder's figures use at least 200)[/]")
    rounds = cfg.rounds
    if rounds > cfg.tokens:
        con.print(f"[yellow]note: {cfg.tokens} tokens cannot fill {rounds} rounds: timing {cfg.tokens} "
                  "round(s) of one[/]")
        rounds = cfg.tokens
    per_round = -(-cfg.tokens // rounds)
    last = cfg.start_pos + cfg.exact_tokens + 2 + rounds * len(st_list) * (per_round + cfg.warmup)
    if last > MAX_POS:
        raise LadderInputError(f"--start-pos {cfg.start_pos} with --tokens {cfg.tokens}, --warmup {cfg.warmup} and "
                               f"--repeats {rounds} would decode positions up to {last}, past {MAX_POS} (positions "
                               "are int32 kernel arguments)")
    if per_round * rounds != cfg.tokens:
        con.print(f"[yellow]note: {cfg.tokens} tokens in {rounds} rounds: {per_round} per round, "
                  f"{per_round * rounds} timed per stage[/]")
    return st_list, rounds


def _stages(cfg: LadderConfig) -> list:
    """The stages of ``cfg``: :data:`ds4lab.experiments.ladder.STAGES`, plus ``3c`` on the long-context token."""
    if not cfg.long_context:
        return parse_stages(cfg.stages)
    from ..experiments.context import CONTEXT_STAGES

    names = [t.strip() for t in cfg.stages.split(",") if t.strip()]
    if "3c" not in names:
        return parse_stages(cfg.stages)
    rest = ",".join(n for n in names if n != "3c")
    out = parse_stages(rest) if rest else []
    return out + [CONTEXT_STAGES["3c"]]


def _model_config(cfg: LadderConfig, preset: str, st_list, rounds: int):
    """The preset, with the long-context token switched on and ``max_context`` past the last position."""
    if not cfg.long_context:
        return get_preset(preset)
    per_round = -(-cfg.tokens // rounds)
    last = cfg.start_pos + cfg.exact_tokens + 2 + rounds * len(st_list) * (per_round + cfg.warmup)
    return get_preset(preset, long_context=True, max_context=-(-(last + 1) // 128) * 128)


def exactness_backend(be):
    """The backend the exactness check computes on: ``be`` itself, or on a timing-only sim a sim
    that computes (timing-only models time without numbers)."""
    if not be.timing_only:
        return be
    from ..backends import make_backend

    return make_backend("sim", seed=be.seed, timing_only=False)


def run(cfg: LadderConfig, be, console=None):
    """Run the ladder on ``be``; writes ``ladder.csv`` (every round), ``meta.json`` and
    ``ladder.png/.svg/.pdf``. Returns the per-stage DataFrame.

    Raises:
        LadderInputError: bad input (nothing measured; exit 2).
        NotExact: a stage not bit-identical to stage 0, after writing everything (exit 1).
    """
    from ..progress import make_console

    con = console or make_console()
    st_list, rounds = check(cfg, con)
    preset = cfg.preset or default_preset("ladder", be)
    mcfg = _model_config(cfg, preset, st_list, rounds)
    out = Path(cfg.out or f"results/ladder-{preset}-{be.name}")
    meta = provenance.base_meta(be)
    meta.update(job="ladder", preset=mcfg.summary(), stages=[s.name for s in st_list], tokens=cfg.tokens,
                warmup=cfg.warmup, exact_tokens=cfg.exact_tokens, capture_mode=cfg.mode, modeled=be.models_time,
                start_pos=cfg.start_pos, long_context=cfg.long_context, rounds=rounds, nvtx=cfg.nvtx)
    banner = modeled_banner(be)
    if banner:
        meta["calibration"] = backend_calibration(be)  # name, path, sha256, shipped
        con.print(banner)
    if "0" not in {s.name for s in st_list}:
        con.print(f"[yellow]note: no stage 0 in the list: gains (×) are against stage {st_list[0].name}[/]")
    was_enabled = S.graphs_enabled()
    S.set_graphs_enabled(True)  # DS4_CUDA_GRAPHS=1: stages 0s and up set an override
    try:
        with results.job_folder(out, meta, LADDER_OUTPUTS):  # a NotExact run is written, then "failed"
            df = _measure(be, preset, mcfg, st_list, cfg, rounds, out, con, meta)
            bad = df[df.exact == False]  # noqa: E712
            if len(bad):
                raise NotExact("not bit-identical to stage 0: " + "; ".join(
                    f"stage {r.stage}: {r.first_mismatch}" for r in bad.itertuples()))
    finally:
        S.set_graphs_enabled(was_enabled)
    return df


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
            "updates": stats.get("updates", 0), "reinstantiations": stats.get("reinstantiations", 0),
            "fallbacks": stats.get("fallbacks", 0), "retirements": stats.get("retirements", 0),
            "aborts": stats.get("aborts", 0),
            "update_results": ";".join(f"{k}={v}" for k, v in stats.get("update_results", {}).items()),
            "failures": ";".join(f"{k}={v}" for k, v in stats.get("failures", {}).items()),
            "backend": be.name, "preset": preset, "modeled": meta["modeled"], "description": st.description,
        })
    vs = "0" if base_us else rows[0]["stage"]  # without stage 0, gains are against the first stage listed
    base_us = base_us or rows[0]["us_median"]
    for r in rows:
        r["speedup"] = base_us / r["us_median"]
        r["speedup_vs"] = vs
    return rows


def _exactness(be, preset, mcfg, st_list, base, cfg, model, runs, con) -> dict:
    """Every stage from the same prefilled state, against stage 0, bit for bit."""
    exact = {st.name: ("n/a", "") for st in st_list}
    if not cfg.exact_tokens:
        return exact
    be_x = exactness_backend(be)
    if not (be_x.is_gpu or not is_ds4_flash(preset)):
        con.print("exactness: not checked (the simulated runtime cannot compute ds4-flash in reasonable time; "
                  "run it on a GPU, or use --preset small)")
        return exact
    if be_x is be:
        model_x, runs_x = model, runs
    else:
        model_x = DecodeModel(mcfg, be_x, base)
        runs_x = [StageRun(model_x, st, base, mode=cfg.mode) for st in st_list]
    ref = exactness_record(StageRun(model_x, STAGES["0"], base, mode=cfg.mode), cfg.start_pos, cfg.exact_tokens)
    for rx in runs_x:
        diff = first_difference(ref, exactness_record(rx, cfg.start_pos, cfg.exact_tokens))
        exact[rx.stage.name] = (diff is None, diff or "")
        con.print(f"exactness, stage {rx.stage.name}: " + ("bit-identical to stage 0" if diff is None
                                                           else f"DIFFERS at {diff}"))
    return exact


def _measure(be, preset, mcfg, st_list, cfg: LadderConfig, rounds, out, con, meta):
    import pandas as pd

    from ..report import plots
    from ..progress import JobProgress

    con.print(f"[bold]ds4lab ladder[/] · {preset} · {provenance.label(meta) if not meta['modeled'] else 'modeled'}")
    base = TokenOptions(vocab=True)
    model = DecodeModel(mcfg, be, base, nvtx=cfg.nvtx)
    runs = [StageRun(model, st, base, mode=cfg.mode) for st in st_list]

    # 1. exactness, 2. the GPU-busy floor: one token's kernel durations
    exact = _exactness(be, preset, mcfg, st_list, base, cfg, model, runs, con)
    floor = gpu_busy_floor(be, model, cfg.start_pos + cfg.exact_tokens)

    # 3. timing in interleaved rounds (odd rounds in reverse order): host noise hits every stage
    pos = cfg.start_pos + cfg.exact_tokens + 1
    per_round = -(-cfg.tokens // rounds)
    samples = {r.stage.name: {"us": [], "host": []} for r in runs}
    launches = {}
    rows = []
    csv_path = out / "ladder.csv"
    with JobProgress(con, "timing stages", per_round * rounds * len(runs)) as prog:
        for rnd in range(rounds):
            for run in (runs if rnd % 2 == 0 else runs[::-1]):
                run.activate()
                t = time_stage(run, pos, per_round, cfg.warmup if rnd == 0 else 2, progress=prog.advance)
                pos += per_round + cfg.warmup
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
                     f"re-instantiations {r['reinstantiations']} fallbacks {r['fallbacks']} "
                     f"retired {r['retirements']} {r['failures']} {r['update_results']}"
                     if r["captures"] or r["failures"] else ""))
    df = pd.DataFrame(rows)
    meta["floor_us"] = floor
    meta["fixes"] = fixes_table().to_dict()
    provenance.write_json(out / "meta.json", meta)
    paths = plots.save(plots.ladder_figure(df, meta), out / "ladder")
    con.print(f"wrote {csv_path}, {out / 'meta.json'}, " + ", ".join(str(p) for p in paths))
    return df
