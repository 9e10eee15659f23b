"""``ds4lab ladder`` and ``ds4lab context``: a table of capture stages, measured (GPU) or modeled (sim), through
:func:`ds4lab.experiments.ladder.run_table`.

Written as it comes: ``<job>.csv`` holds the finished contexts; the one being measured is in ``<job>.partial.csv``
(``state``, ``rounds_timed``, ``rounds``), removed once finished; then ``meta.json`` and the figure. A stopped run
keeps both and says how far it got (``progress``). Next: :mod:`ds4lab.jobs.context`, ``docs/commands.md``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..capture import stream as S
from ..errors import BadInput
from ..experiments.ladder import (Callbacks, Table, can_check, ladder_table, model_config, run_table, table_frame,
                                  tokens_timed)
from ..experiments.stages import LADDER_DEFAULT, START_POS, fixes_table, parse_stages
from ..report import provenance, results
from ..sim.calibration import backend_calibration
from ..timing import has_spread
from ..token import weights as W
from .common import CheckFailed, check_out_option, default_preset, modeled_banner, out_folder
from .result import JobResult, result_folder

LADDER_OUTPUTS = ("ladder.csv", "ladder.png", "ladder.svg", "ladder.pdf")

#: The most tokens an exactness span may hold: every token copies every cache to the host.
MAX_EXACT_TOKENS = 256


@dataclass
class LadderConfig:
    """Arguments of ``ds4lab ladder`` (its defaults). ``tokens`` split over ``rounds``; ``exact_tokens`` 0: skip;
    ``out`` None: ``results/ladder-<preset>-<backend>[-longctx]``; ``long_context``: stage ``3c`` exists."""

    stages: str = LADDER_DEFAULT
    preset: str | None = None
    tokens: int = 200
    warmup: int = 8
    exact_tokens: int = 6
    rounds: int = 4
    mode: str = "thread_local"
    nvtx: bool = False
    out: Path | str | None = None
    start_pos: int = START_POS
    long_context: bool = False


#: Seconds of timing after which the ladder says once how long the rest will take (the pace so far).
ESTIMATE_AFTER_S = 5.0


class NotExact(CheckFailed):
    """A stage is not bit-identical to stage 0 (exit 1); everything was measured and written."""


def check_counts(**counts) -> None:
    """Raise :class:`BadInput` naming each count out of range (``tokens``, ``rounds`` ≥ 1; ``warmup``,
    ``exact_tokens``, ``span`` ≥ 0; spans ≤ :data:`MAX_EXACT_TOKENS`)."""
    positive = ("tokens", "rounds")
    bad = [f"--{k.replace('_', '-')} {v} must be {'at least 1' if k in positive else 'at least 0'}"
           for k, v in counts.items() if v < (1 if k in positive else 0)]
    bad += [f"--{k.replace('_', '-')} {v}: at most {MAX_EXACT_TOKENS} tokens are compared bit for bit (each "
            "copies every cache to the host)" for k, v in counts.items()
            if k in ("exact_tokens", "span") and v > MAX_EXACT_TOKENS]
    if bad:
        raise BadInput("; ".join(bad))


def check_config(cfg: LadderConfig) -> None:
    """Checks that need no backend. Raises :class:`BadInput` naming the bad value."""
    parse_stages(cfg.stages, long_context=cfg.long_context)
    check_counts(tokens=cfg.tokens, rounds=cfg.rounds, warmup=cfg.warmup, exact_tokens=cfg.exact_tokens)
    check_out_option(cfg.out)
    if cfg.start_pos < 4:
        raise BadInput(f"--start-pos {cfg.start_pos}: the ladder starts at position 4 or later")


def table_of(cfg: LadderConfig, con=None) -> Table:
    """The ladder's :class:`Table`, rounds capped at the tokens (said on ``con``)."""
    if cfg.rounds > cfg.tokens and con is not None:
        con.print(f"[yellow]note: {cfg.tokens} tokens cannot fill {cfg.rounds} rounds: timing {cfg.tokens} "
                  "round(s) of one[/]")
    return ladder_table(cfg.stages, cfg.start_pos, exact_tokens=cfg.exact_tokens, tokens=cfg.tokens,
                        warmup=cfg.warmup, rounds=cfg.rounds, long_context=cfg.long_context)


def run(cfg: LadderConfig, be, console) -> JobResult:
    """Run the ladder on ``be``: ``ladder.csv``, ``meta.json``, ``ladder.png/.svg/.pdf``. Returns the
    :class:`~ds4lab.jobs.result.JobResult` (table and figure ``ladder``).

    Raises:
        BadInput: bad input (nothing measured; exit 2).
        NotExact: a stage not bit-identical to stage 0, after writing everything (exit 1)."""
    check_config(cfg)
    table = table_of(cfg, console)
    preset = cfg.preset or default_preset("ladder", be)
    mcfg = model_config(preset, table, cfg.long_context,
                        f"--start-pos {cfg.start_pos} with --tokens {cfg.tokens}, --warmup {cfg.warmup} and "
                        f"--repeats {table.rounds}")
    if cfg.tokens < 200:
        console.print(f"[yellow]note: {cfg.tokens} timed tokens per stage (the ladder's figures use at least 200)[/]")
    if table.per_round * table.rounds != cfg.tokens:
        console.print(f"[yellow]note: {cfg.tokens} tokens in {table.rounds} rounds: {table.per_round} per round, "
                      f"{table.per_round * table.rounds} timed per stage[/]")
    out, ran = out_folder(cfg.out, "ladder", (preset, be.name, "longctx" if cfg.long_context else None),
                          {"preset": preset, "backend": be.name, "stages": [s.name for s in table.stages],
                           "long_context": cfg.long_context, "start_pos": cfg.start_pos, "mode": cfg.mode})
    meta = dict(start_pos=cfg.start_pos, long_context=cfg.long_context, rounds=table.rounds, nvtx=cfg.nvtx,
                exact_tokens=cfg.exact_tokens)
    return write_table("ladder", be, console, mcfg, table, out, meta, LADDER_OUTPUTS, mode=cfg.mode, nvtx=cfg.nvtx,
                       ran=ran)


def write_table(job: str, be, con, mcfg, table: Table, out: Path, extra_meta: dict, outputs, *, mode: str,
                nvtx: bool = False, ran: dict | None = None) -> JobResult:
    """Both ladders' job: :func:`ds4lab.experiments.ladder.run_table` in the result folder, written as it goes, then
    ``meta.json`` and the figure; :class:`NotExact` names every stage (and context) that differs."""
    from ..progress import JobProgress
    from ..report import plots

    mem = {"weights_bytes": W.model_bytes(mcfg, True), "caches_bytes": W.cache_bytes(mcfg)}
    banner = modeled_banner(be)
    check = can_check(be, mcfg)
    with S.graphs_enabled():  # the flag as the run has it, in meta.json's provenance
        meta = provenance.base_meta(be)
    meta.update(job=job, preset=mcfg.summary(), stages=[s.name for s in table.stages], contexts=list(table.contexts),
                tokens=table.tokens, warmup=table.warmup, capture_mode=mode, modeled=be.models_time, memory=mem,
                fixes=fixes_table(list(table.stages)).to_dict(), exactness_checked=bool(table.exact_tokens and check),
                **extra_meta)
    if banner:
        meta["calibration"] = backend_calibration(be)  # name, path, sha256, shipped
    now: dict = {"rows": None, "done": []}  # the rows of the context being measured (None between contexts)
    with result_folder(job, out, meta, outputs, say=con.print,
                       on_stop=lambda status: _stopped(con, job, table, now["done"], now["rows"], meta), ran=ran) as o:
        # said inside the folder, before anything is allocated: a run stopped here is recorded as such
        con.print(f"[bold]ds4lab {job}[/] · {mcfg.name} · memory: weights {mem['weights_bytes'] / 2**30:.2f} GiB + "
                  f"caches {mem['caches_bytes'] / 2**30:.2f} GiB (max_context {mcfg.max_context})")
        for line in ([banner] if banner else []) + _notes(table, check):
            con.print(line)
        with JobProgress(con, "timing stages", tokens_timed(table), eta=True) as prog:
            df = run_table(be, mcfg, table, mode=mode, nvtx=nvtx, check=check,
                           on=_writer(job, o, con, prog, table, now, be, mcfg.name))
        if "floor_us" in df and df.floor_us.notna().any():
            meta["floors"] = {int(c): {k: g[k].iloc[0] for k in ("floor_us", "bytes_floor_us", "launch_floor_us",
                                                                    "t_min_us", "floor_source")}
                              for c, g in df.groupby("context")}
        o.table(job, df)
        paths = o.figure(job, plots.ladder_figure(df, meta) if job == "ladder" else plots.context_figure(df, meta))
        con.print(f"wrote {o.where(job + '.csv')}, {o.where('meta.json')}, "
                  + ", ".join(str(o.where(p.name)) for p in paths))
        bad = df[df.exact == False]  # noqa: E712
        if len(bad):
            raise NotExact("not bit-identical to stage 0: " + "; ".join(
                f"stage {r.stage}" + (f" at context {r.context}" if len(table.contexts) > 1 else "")
                + f": {r.first_mismatch}" for r in bad.itertuples()))
    return o.done()


def _notes(table: Table, check: bool) -> list[str]:
    """What the run says before it starts about the gains' baseline and the exactness check."""
    out = []
    if "0" not in {s.name for s in table.stages}:
        out.append(f"[yellow]note: no stage 0 in the list: gains (×) are against stage {table.stages[0].name}[/]")
    if table.exact_tokens and not check:
        out.append("exactness: not checked (the simulated runtime cannot compute ds4-flash in reasonable time; "
                   "run it on a GPU, or use a smaller preset)")
    return out


def _writer(job: str, o, con, prog, table: Table, now: dict, be, preset: str) -> Callbacks:
    """The callbacks that write a table run as it goes (partial and finished CSVs, console lines, the progress bar)."""
    partial_path = o.folder / f"{job}.partial.csv"
    many = len(table.contexts) > 1
    est = {"said": False, "t0": None, "stage": None}

    def partial(rows: list[dict]) -> None:
        now["rows"] = rows
        results.write_text_atomic(partial_path, table_frame(rows, be, preset).to_csv(index=False))

    def finished(rows: list[dict], so_far) -> None:
        o.table(job, so_far)  # the finished contexts, as a run ends
        now["done"] += rows
        partial_path.unlink()
        now["rows"] = None
        for r in rows:
            con.print(_line(r, many))

    def starting(c: int, rnd: int | None, stage: str) -> None:
        est["stage"] = stage
        prog.describe(f"exactness at {c}" if rnd is None else ("context " + str(c) + " · " if many else "")
                      + f"round {rnd + 1}/{table.rounds} · stage {stage}")

    def token() -> None:  # after every timed token (and its closing synchronize): cheap
        prog.advance()
        if not est["said"]:
            _estimate(con, prog, table, est)

    return Callbacks(say=con.print, partial=partial, finished=finished, starting=starting, token=token,
                     exact_progress=_exactness_estimate(table.exact_tokens))


def _exactness_estimate(tokens: int):
    """``progress(done, total)`` for the exactness check, with the time left at the pace so far."""
    from ..progress import duration

    t0 = time.perf_counter()  # a host clock for the estimate shown, nothing measured

    def progress(done: int, total: int) -> str:
        left = (time.perf_counter() - t0) / done * (total - done)
        return f" ({done}/{total} runs of {tokens} tokens" + (f", about {duration(left)} left)" if done < total else ")")

    return progress


def _estimate(con, prog, table: Table, est: dict) -> None:
    """Once timing has run :data:`ESTIMATE_AFTER_S`, say how long the rest will take at the pace so far."""
    from ..progress import duration

    now = time.perf_counter()  # a host clock for the estimate shown, nothing measured
    steps = tokens_timed(table)
    if est["t0"] is None:
        est["t0"] = now
    elif now - est["t0"] >= ESTIMATE_AFTER_S and prog.done < steps:
        est["said"] = True  # once: the bar (or a line each quarter) goes on estimating
        n = len(table.stages)
        con.print(f"timing {steps} tokens ({n} stage{'s' if n > 1 else ''} × {table.rounds} "
                  f"round{'s' if table.rounds > 1 else ''}"
                  + (f" × {len(table.contexts)} contexts" if len(table.contexts) > 1 else "")
                  + f", warm-up included): about {duration(prog.remaining_s() or 0.0)} left at the pace so far "
                  f"(stage {est['stage']}; stages differ)")


def _stopped(con, job: str, table: Table, done: list[dict], rows: list[dict] | None, meta: dict) -> None:
    """Record in ``meta["progress"]`` (and say) the contexts a stopped run finished and how far the current one got."""
    finished = sorted({r["context"] for r in done})
    if rows is None and len(finished) == len(table.contexts):  # everything measured (a check failed)
        return
    parts = []
    if finished:
        parts.append(f"{job}.csv: context{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))} "
                     "finished")
    if rows is not None:
        checked = sum(r["exact"] in (True, False) for r in rows)
        timed = [r["rounds_timed"] for r in rows]
        parts.append(f"{job}.partial.csv: context {rows[0]['context']}, "
                     + (f"exactness checked for {checked} of {len(rows)} stages, " if meta["exactness_checked"] else "")
                     + ("no stage timed yet" if not any(timed) else
                        f"every stage timed in {timed[0]} of {table.rounds} rounds" if min(timed) == max(timed) else
                        f"stages timed in {min(timed)} to {max(timed)} of {table.rounds} rounds")
                     + " (its column state says what each row holds)")
    meta["progress"] = "; ".join(parts) or "nothing measured yet"
    con.print(f"kept: {meta['progress']}")


def per_token(x: float) -> str:
    """A count per token as read: whole when it is (``24``), else with its fraction (``0.75``)."""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.2f}"


def _line(r: dict, with_context: bool) -> str:
    cache = (f"  captures {r['captures']} replays {r['replays']} updates {r['updates']} re-instantiations "
             f"{r['reinstantiations']} fallbacks {r['fallbacks']} retired {r['retirements']} "
             f"invalidated {r['invalidations']} node updates/token {per_token(r['node_updates'])} {r['failures']} "
             f"{r['update_results']}" if r["captures"] or r["failures"] else "")
    return ((f"context {r['context']:>7} " if with_context else "")
            + f"stage {r['stage']:3s} {r['us_median']:10.1f} µs/token "
            + (f"(IQR {r['us_p25']:.1f}–{r['us_p75']:.1f})" if has_spread(r["us_p25"], r["us_p75"]) else "(no spread)")
            + f"  ×{r['speedup'] or 0:.2f}"
            + (f"  gain {r['gain']}" if r["stage"] != r["speedup_vs"] else "")
            + (f"  eff {r['efficiency']:.2f}" if r["efficiency"] else "")
            + f"  exact={r['exact']}"
            f"{'  ' + r['first_mismatch'] if r['first_mismatch'] else ''}"
            f"  launches {per_token(r['kernel_launches'])} kernels + {per_token(r['graph_launches'])} graphs" + cache)


__all__ = ["LADDER_OUTPUTS", "LadderConfig", "NotExact", "check_config", "run", "table_of", "write_table"]
