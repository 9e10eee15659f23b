"""The one experiment behind ``ds4lab ladder`` and ``ds4lab context``: stage runs at one or more contexts, each checked
bit for bit against stage 0, with its floors, then timed in interleaved rounds (odd rounds reversed).

:func:`run_table` runs a :class:`Table` and returns its rows; it writes and prints nothing (its :class:`Callbacks`
are told). :func:`ladder_table` and :func:`context_table` make the two commands' tables. Next: :mod:`.stage_run` (one
stage), :mod:`.floors`, ``docs/commands.md`` ("The stages")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..capture import stream as S
from ..errors import BadInput
from ..timing import Difference, Stats, paired_difference
from ..token.config import MAX_POS, get_preset, is_ds4_flash
from ..token.model import DecodeModel, TokenOptions
from .stage_run import Span, StageRun, compare_runs, outcome
from .stages import STAGES, Stage, parse_stages


@dataclass(frozen=True)
class Table:
    """What a ladder measures.

    Attributes:
        stages: the stages, in order (the first is the gains' reference when stage 0 is absent).
        contexts: start positions.
        exact_tokens: tokens compared bit for bit at each context (0: none).
        exact_lead: the exactness span starts this many tokens before the context.
        tokens: timed tokens per stage and context, over ``rounds`` rounds.
        warmup: untimed tokens before a stage's first round at a context (2 before later rounds).
        rounds: interleaved rounds.
        timing_after_exact: time from the token after the exactness span (ladder), else from the context itself.
        floor: compute the GPU-busy floor at each context."""

    stages: tuple
    contexts: tuple
    exact_tokens: int
    exact_lead: int
    tokens: int
    warmup: int
    rounds: int
    timing_after_exact: bool = True
    floor: bool = True

    @property
    def per_round(self) -> int:
        return -(-self.tokens // self.rounds)

    def exact_span(self, context: int) -> Span:
        return Span(context - self.exact_lead, self.exact_tokens)

    def timing_start(self, context: int) -> int:
        """The first timed position of round 0 at ``context`` (after its warm-up)."""
        if not self.timing_after_exact:
            return context
        return context - self.exact_lead + self.exact_tokens + 1 + self.warmup

    def timed_positions(self, context: int) -> list[int]:
        """Every position the stages are timed at, at ``context`` (all rounds)."""
        return [p for rnd in range(self.rounds) for p in self.round_span(context, rnd).positions()]

    def round_span(self, context: int, rnd: int) -> Span:
        """Round ``rnd``'s timed positions at ``context`` (every stage of the round decodes them)."""
        step = self.per_round + max(self.warmup, 2)
        return Span(self.timing_start(context) + rnd * step, self.per_round)

    def last_position(self) -> int:
        """The last position any run of the table decodes (the caches' size and the int32 limit depend on it)."""
        return max(max(self.round_span(c, self.rounds - 1).start + self.per_round,
                       c - self.exact_lead + self.exact_tokens) for c in self.contexts)

    def first_position(self) -> int:
        """The first position any run decodes (exactness spans and warm-up tokens included)."""
        return min(min(c - self.exact_lead, self.timing_start(c) - self.warmup) for c in self.contexts)


def exactness_backend(be):
    """``be``, or on a timing-only sim a sim that computes."""
    if not be.timing_only:
        return be
    from ..backends import make_backend

    return make_backend("sim", seed=be.seed, timing_only=False)


def floors_at(be, model: DecodeModel, context: int, positions=None, base: TokenOptions | None = None) -> dict:
    """The floors at ``context`` (:func:`ds4lab.experiments.floors.token_floors`), busy time the median over the
    timed ``positions``; ``{}`` without time. Leaves ``model`` with stage 3 active."""
    if not (be.measures_time or be.models_time):
        return {}
    from .floors import token_floors

    tf = token_floors(be, model, start_pos=context, busy_positions=positions, base=base)
    return {"floor_us": tf.busy.busy.median, "bytes_floor_us": tf.floor.bytes_floor_us,
            "launch_floor_us": tf.floor.launch_floor_us, "t_min_us": tf.floor.t_min_us,
            "floor_source": tf.busy.source}


class Ladder:
    """A :class:`Table` of stage runs on one model (and a computing twin where exactness needs one), context by context.

    Args:
        be: the backend that times.
        mcfg: the model configuration.
        table: what to measure.
        mode: the capture mode (a stage's policy may fix its own).
        nvtx: NVTX ranges on launches.
        check: whether exactness can be computed here.

    Stage ``3`` on the long-context token keys its graphs on the token's shape (``key_decisions``)."""

    def __init__(self, be, mcfg, table: Table, *, mode: str = "thread_local", nvtx: bool = False,
                 check: bool = True) -> None:
        self.be, self.cfg, self.table, self.mode = be, mcfg, table, mode
        self.base = TokenOptions(vocab=True)
        self.model = DecodeModel(mcfg, be, self.base, nvtx=nvtx)
        self.runs = [self._run(self.model, st) for st in table.stages]
        self.check = check and table.exact_tokens > 0
        self._check_runs = None

    def _run(self, model: DecodeModel, stage: Stage) -> StageRun:
        # Stage 3 on the long-context token keeps one graph per token shape (emit or not, top-k regime).
        policy = stage.policy.with_(key_decisions=True) if (stage.name == "3" and model.cfg.long_context) else None
        return StageRun(model, stage, self.base, mode=self.mode, policy=policy)

    def _checking(self) -> tuple[StageRun, list[StageRun]]:
        if self._check_runs is None:
            be_x = exactness_backend(self.be)
            if be_x is self.be:
                model_x, runs_x = self.model, self.runs
            else:
                model_x = DecodeModel(self.cfg, be_x, self.base)
                runs_x = [self._run(model_x, st) for st in self.table.stages]
            self._check_runs = (self._run(model_x, STAGES["0"]), runs_x)
        return self._check_runs

    def exactness(self, context: int, say: Callable[[str], None] = lambda s: None,
                  on_result: Callable[[dict], None] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict:
        """``{stage: (exact: bool | "n/a", first difference or "")}`` at ``context``; ``on_result`` gets the verdicts
        after each stage, ``progress(done, total)`` returns text to end the line said."""
        if not self.check:
            return {r.name: ("n/a", "") for r in self.runs}
        ref, runs_x = self._checking()
        got: dict = {}
        total = len(runs_x) + 1
        tell = progress or (lambda done, n: "")

        def told(r, diff):
            got[r.name] = (diff is None, diff or "")
            say(f"exactness at {context}, stage {r.name}: " + ("bit-identical to stage 0" if diff is None
                                                                else f"DIFFERS at {diff}") + tell(len(got) + 1, total))
            if on_result is not None:
                on_result(dict(got))

        compare_runs(ref, runs_x, self.table.exact_span(context), told,
                     on_reference=lambda: say(f"exactness at {context}: stage 0's reference recorded" + tell(1, total)))
        return got

    def measure(self, context: int, *, exact: dict, floors: dict, progress=None,
                on_stage: Callable[[list[dict]], None] | None = None,
                starting: Callable[[int, str], None] | None = None) -> list[dict]:
        """Time every stage at ``context`` in interleaved rounds; one row per stage. ``on_stage`` gets
        :meth:`partial_rows` after each stage of each round, ``starting(round, stage)`` before it, ``progress()``
        after every token."""
        t = self.table
        samples = {r.name: {"us": [], "host": []} for r in self.runs}
        launches: dict = {}
        timed = {r.name: 0 for r in self.runs}  # rounds each stage has been timed in
        self.model.reset_state()
        for rnd in range(t.rounds):
            span = t.round_span(context, rnd)
            for run in (self.runs if rnd % 2 == 0 else self.runs[::-1]):
                if starting is not None:
                    starting(rnd, run.name)
                got = run.time(span, t.warmup if rnd == 0 else 2, progress=progress)
                samples[run.name]["us"] += got["us_samples"]
                samples[run.name]["host"] += got["host_samples"]
                launches[run.name] = got
                timed[run.name] = rnd + 1
                if on_stage is not None:
                    on_stage(self.partial_rows(context, exact, floors, samples, launches, timed))
        return self._rows(context, samples, launches, exact, floors)

    def tokens_timed(self) -> int:
        """The tokens :meth:`measure` decodes over every context, warm-up included: one ``progress()`` call each."""
        return tokens_timed(self.table)

    def partial_rows(self, context: int, exact: dict, floors: dict, samples: dict | None = None,
                     launches: dict | None = None, timed: dict | None = None) -> list[dict]:
        """The rows of ``context`` while it is measured, :meth:`measure`'s columns plus ``state``, ``rounds_timed``
        and ``rounds``: µs over the rounds timed so far, speedup and gain only over rounds both the stage and the
        baseline ran, ``exact`` empty until checked."""
        t = self.table
        samples, launches, timed = samples or {}, launches or {}, timed or {}
        names = [r.name for r in self.runs]
        vs = "0" if "0" in names else names[0]  # as in a finished row
        base = samples.get(vs, {}).get("us", [])
        rows = []
        for run in self.runs:
            k = timed.get(run.name, 0)
            r = self._row(run, context, samples.get(run.name), launches.get(run.name), exact, floors)
            if k == 0:
                state = ("not timed yet" if not self.check else "exactness checked; not timed yet"
                         if run.name in exact else "exactness not checked yet; not timed yet")
            else:
                state = (f"timed in all {t.rounds} rounds" if k == t.rounds
                         else f"partial: timed in {k} of {t.rounds} rounds")
                us = samples[run.name]["us"]
                m = min(len(base), len(us))  # the rounds both were timed in come first in both
                if m:
                    c = paired_difference(base[:m], us[:m])
                    d = Difference(-c.median, -c.hi, -c.lo, c.n, c.baseline, c.confidence)
                    r.update(speedup=Stats.of(base[:m]).median / Stats.of(us[:m]).median, speedup_vs=vs,
                             gain_us=d.median, gain_lo=d.lo, gain_hi=d.hi, gain_measurable=d.measurable,
                             gain=d.fmt())
                    if m < len(us):
                        state += f"; ×, gain over the {m // t.per_round} round(s) stage {vs} was timed in too"
                else:
                    state += f"; ×, gain once stage {vs} is timed"
            rows.append({"stage": r["stage"], "short": r["short"], "context": context, "state": state,
                         "rounds_timed": k, "rounds": t.rounds, **r})
        return rows

    def _row(self, run: StageRun, context: int, samples: dict | None, got: dict | None, exact: dict,
             floors: dict) -> dict:
        """One stage's row; columns empty while ``samples``/``got`` are None or the stage is unchecked."""
        st = run.stage
        timed = bool(samples and samples["us"])
        us = Stats.of(samples["us"]) if timed else None
        host = Stats.of(samples["host"]) if timed else None
        stats = run.stats()
        ok, first = exact.get(st.name, (None, ""))
        med = us.median if timed else None
        return {
            "stage": st.name, "short": st.short, "context": context, "us_median": med,
            "us_p25": us.p25 if timed else None, "us_p75": us.p75 if timed else None, "n": us.n if timed else 0,
            "host_us_median": host.median if timed else None,
            **{k: floors.get(k) for k in ("floor_us", "bytes_floor_us", "launch_floor_us", "t_min_us",
                                          "floor_source")},
            "efficiency": _eff(floors.get("floor_us"), med),
            "launch_floor_efficiency": _eff(floors.get("launch_floor_us"), med),
            "bytes_floor_efficiency": _eff(floors.get("bytes_floor_us"), med),
            **{k: got[k] if got else None for k in ("kernel_launches", "graph_launches", "node_updates")},
            "speedup": None, "exact": ok, "first_mismatch": first,
            "outcome": "" if ok is None else outcome(first or None, stats) if ok != "n/a" else "not checked",
            "capture_mode": run.mode if st.capture else "",
            **{k: stats.get(k, 0) for k in ("captures", "replays", "updates", "reinstantiations", "fallbacks",
                                             "retirements", "recaptures", "eager_runs", "aborts",
                                             "invalidations", "variant_overflows", "skipped")},
            "graphs": stats.get("captures", 0) - stats.get("updates", 0) - stats.get("reinstantiations", 0),
            "update_results": ";".join(f"{k}={v}" for k, v in stats.get("update_results", {}).items()),
            "failures": ";".join(f"{k}={v}" for k, v in stats.get("failures", {}).items()),
            "decisions": repr(self.model.longctx_decisions(context, by_value=False))
            if self.model.lc is not None else "",
            "description": st.description,
            **dict.fromkeys(("speedup_vs", "gain_us", "gain_lo", "gain_hi", "gain_measurable", "gain")),
        }

    def _rows(self, context: int, samples: dict, launches: dict, exact: dict, floors: dict) -> list[dict]:
        rows = [self._row(run, context, samples[run.name], launches[run.name], exact, floors) for run in self.runs]
        base_us = next((r["us_median"] for r in rows if r["stage"] == "0"), None)
        vs = "0" if base_us else rows[0]["stage"]  # without stage 0, gains are against the first stage listed
        base_us = base_us or rows[0]["us_median"]
        base = samples[vs]["us"]
        for r in rows:
            r["speedup"] = base_us / r["us_median"]
            r["speedup_vs"] = vs
            # the gain: token k of this stage paired with token k of the baseline (the same position, the
            # same interleaved round), median of the differences with its 95 % interval
            c = paired_difference(base, samples[r["stage"]]["us"])  # this stage's cost over the baseline
            d = Difference(-c.median, -c.hi, -c.lo, c.n, c.baseline, c.confidence)  # its gain, % of the baseline
            r.update(gain_us=d.median, gain_lo=d.lo, gain_hi=d.hi, gain_measurable=d.measurable, gain=d.fmt())
        return rows


def _eff(floor, us):
    return floor / us if floor and us else None


# ----------------------------------------------------------------------------- the two tables, run
def ladder_table(stages: str, start_pos: int, *, exact_tokens: int, tokens: int, warmup: int, rounds: int,
                 long_context: bool = False) -> Table:
    """The ladder's :class:`Table`: ``stages`` at ``start_pos``, exactness over ``exact_tokens``, ``tokens`` in
    ``rounds`` rounds (at most one per token). Raises ``StageInputError`` for an unknown stage."""
    return Table(stages=tuple(parse_stages(stages, long_context=long_context)), contexts=(start_pos,),
                 exact_tokens=exact_tokens, exact_lead=0, tokens=tokens, warmup=warmup, rounds=min(rounds, tokens))


def context_table(stages: str, contexts, *, span: int, tokens: int, warmup: int, rounds: int) -> Table:
    """The context ladder's :class:`Table` (long-context token): span from ``context - 4``, timing, floors."""
    return Table(stages=tuple(parse_stages(stages, long_context=True)), contexts=tuple(int(c) for c in contexts),
                 exact_tokens=span, exact_lead=4, tokens=tokens, warmup=warmup, rounds=rounds,
                 timing_after_exact=False, floor=True)


def model_config(preset: str, table: Table, long_context: bool, what: str = "the table"):
    """The preset with the long-context token on and ``max_context`` the next multiple of 128 past the table's last
    position.

    Raises:
        BadInput: a position past int32 or the preset's ``max_context`` (naming ``what``)."""
    last = table.last_position()
    if last > MAX_POS:
        raise BadInput(f"{what}: the run would decode positions up to {last}, past {MAX_POS} (positions are "
                       "int32 kernel arguments)")
    if not long_context:
        return get_preset(preset)
    limit = get_preset(preset, long_context=True).max_context
    if last >= limit:
        raise BadInput(f"{what}: the run decodes up to position {last}, past the {preset} preset's max_context "
                       f"{limit}")
    return get_preset(preset, long_context=True, max_context=-(-(last + 1) // 128) * 128)


def can_check(be, mcfg) -> bool:
    """Whether exactness is computed for ``mcfg`` on ``be``: always on a GPU; off it, not for ds4-flash (hours)."""
    return be.is_gpu or not is_ds4_flash(mcfg.name)


def _nothing(*_a, **_k) -> None:
    return None


@dataclass
class Callbacks:
    """What :func:`run_table` tells its caller; each is optional.

    Attributes:
        say: a line in words (each stage's exactness verdict).
        partial: the rows of the context being measured, each time they change.
        finished: ``(rows, so_far)``: a context's finished rows and every finished context's as a table.
        starting: ``(context, round, stage)`` before a stage's round; round None: the exactness check.
        token: after every timed token, warm-up included.
        exact_progress: ``(done, total) -> str`` after each exactness run; its text ends the line said."""

    say: Callable[[str], None] = _nothing
    partial: Callable[[list], None] = _nothing
    finished: Callable[[list, object], None] = _nothing
    starting: Callable[[int, int | None, str], None] = _nothing
    token: Callable[[], None] = _nothing
    exact_progress: Callable[[int, int], str] = lambda done, total: ""


def table_frame(rows: list[dict], be, preset: str):
    """``rows`` as the table's DataFrame: each row ends with ``backend``, ``preset`` and ``modeled``."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if len(df):
        df["backend"], df["preset"], df["modeled"] = be.name, preset, bool(be.models_time)
    return df


def run_table(be, mcfg, table: Table, *, mode: str = "thread_local", nvtx: bool = False, check: bool | None = None,
              on: Callbacks | None = None):
    """Run ``table`` on ``be`` for ``mcfg``: per context exactness (where ``check``; None: :func:`can_check`), floors,
    timing rounds. On the sim each context is priced at its kernel time factor
    (:meth:`ds4lab.executor.base.ModeledTime.model_context`).

    Returns:
        The table (pandas): one row per stage and context, :meth:`Ladder.measure`'s columns plus ``backend``,
        ``preset``, ``modeled``."""
    from ..executor.base import ModeledTime

    on = on or Callbacks()
    lad = Ladder(be, mcfg, table, mode=mode, nvtx=nvtx, check=can_check(be, mcfg) if check is None else check)
    done: list[dict] = []
    with S.graphs_enabled():  # DS4_CUDA_GRAPHS=1: every stage but 0 sets an override
        for c in table.contexts:
            if isinstance(be, ModeledTime):
                be.model_context(c)
            on.partial(lad.partial_rows(c, {}, {}))
            on.starting(c, None, "")
            exact = lad.exactness(c, on.say, on_result=lambda ex, c=c: on.partial(lad.partial_rows(c, ex, {})),
                                  progress=on.exact_progress)
            floors = floors_at(be, lad.model, c, table.timed_positions(c), lad.base) if table.floor else {}
            on.partial(lad.partial_rows(c, exact, floors))
            rows = lad.measure(c, exact=exact, floors=floors, progress=on.token, on_stage=on.partial,
                               starting=lambda rnd, stage, c=c: on.starting(c, rnd, stage))
            done += rows
            on.finished(rows, table_frame(done, be, mcfg.name))
    return table_frame(done, be, mcfg.name)


def tokens_timed(table: Table) -> int:
    """The tokens :func:`run_table` decodes in its timing rounds, warm-up included."""
    per_context = sum(table.per_round + (table.warmup if rnd == 0 else 2) for rnd in range(table.rounds))
    return per_context * len(table.stages) * len(table.contexts)


__all__ = ["Callbacks", "Ladder", "Table", "can_check", "context_table", "exactness_backend", "floors_at",
           "ladder_table", "model_config", "run_table", "table_frame", "tokens_timed"]
