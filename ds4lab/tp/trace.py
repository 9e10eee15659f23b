"""The tensor-parallel token recorded as one event table across its devices, for ``ds4lab audit`` and
:mod:`ds4lab.audit.collectives`: on the sim from each device's modeled timeline (MODELED, no API rows), on GPUs a
CUPTI recording of both devices (:func:`ds4lab.trace.recording.recording`)."""

from __future__ import annotations

from ..trace.events import EventTable, make_frame
from ..experiments.stage_run import Span
from ..token.model import TokenOptions
from .stages import TP_STAGES

_COPY = {"memcpy PtoP": "PtoP", "memcpy HtoD": "HtoD", "memcpy DtoH": "DtoH"}


def record_tp_table(group, stage: str = "0", start: int = 1000, tokens: int = 4, warmup: int = 2) -> EventTable:
    """Run ``warmup`` untimed tokens then ``tokens`` recorded ones from ``start`` under TP stage ``stage`` on every rank
    of ``group``; the recorded tokens as one :class:`~ds4lab.trace.events.EventTable`. Raises KeyError: an unknown
    stage; ds4lab.trace.sources.common.SourceError: no CUPTI on a GPU host."""
    tps = TP_STAGES[stage]
    base = TokenOptions(vocab=group.models[0].opts.vocab)
    runs = group.stage_runs(tps.stage, base)
    first = start - warmup
    if group.node.name != "sim":
        return _record_gpu(group, tps, runs, first, warmup, tokens)
    rows_by_rank = group.run(lambda r: _sim_rank(group, tps, runs[r], r, first, warmup, tokens))
    rows = [row for rr in rows_by_rank for row in rr]
    return EventTable(make_frame(rows), f"<tensor-parallel token, stage {stage}>", "ds4lab-tp-sim",
                      [f"MODELED: the sim's per-device timelines of {group.world} ranks (reduce={group.reduce}); no "
                       "API rows (one launch per device row)"])


def _sim_rank(group, tps, run, rank: int, first: int, warmup: int, tokens: int) -> list[dict]:
    m, be = group.models[rank], group.models[rank].be
    m.placement = tps.placement
    run.activate()
    for i in range(warmup):
        run.token(first + i)
    be.synchronize()
    _, mark = be.trace_records(0)
    streams: dict[str, int] = {}
    spans = []
    for i in range(tokens):
        h0 = be.host_clock_us()
        run.token(first + warmup + i)
        be.synchronize()
        spans.append((h0, be.host_clock_us()))
    recs, _ = be.trace_records(mark)
    rows = []
    for stream, name, s_us, e_us, kind, graph in recs:
        if kind not in ("kernel", "memset", "memcpy"):
            continue
        sid = 0 if stream == "legacy" else streams.setdefault(stream, 100 + len(streams))
        row = {"kind": kind, "name": name, "pid": 0, "device": rank, "stream": sid, "start_ns": int(s_us * 1e3),
               "end_ns": int(e_us * 1e3), "graph_id": int(graph) if graph is not None else -1,
               "stream_type": "legacy" if sid == 0 else ""}
        if kind == "memcpy":
            row["copy_kind"] = _COPY.get(name, "")
        rows.append(row)
    for h0, h1 in spans:
        rows.append({"kind": "nvtx", "name": "token", "domain": "ds4lab", "pid": 0, "tid": rank + 1, "device": rank,
                     "start_ns": int(h0 * 1e3), "end_ns": int(h1 * 1e3)})
    return rows


def _record_gpu(group, tps, runs, first: int, warmup: int, tokens: int) -> EventTable:
    """Both ranks under one CUPTI recording (CUPTI's session is the process's: every device's activity)."""
    from ..trace.recording import recording

    def go(r: int, lo: int, n: int) -> None:
        m, run = group.models[r], runs[r]
        m.placement = tps.placement
        run.activate()
        for i in range(n):
            run.token(lo + i)
        group.node.wait_stream(r, run.stream)
        m.be.synchronize()

    group.run(lambda r: go(r, first, warmup))
    with recording(stacks=False) as rec:
        group.run(lambda r: go(r, first + warmup, tokens))
    return rec.table()


def tp_trace(group, stage: str, start: int, tokens: int):
    """The TP token recorded (:func:`record_tp_table`) and audited across its devices: ``(table, pairs, plan)``, the
    event table, the collectives paired by rank (:func:`ds4lab.audit.collectives.pair_collectives`) and the per-rank
    capture plan in each capture mode (:func:`ds4lab.audit.collectives.per_rank_plan`, column ``mode``)."""
    import pandas as pd

    from ..audit.analysis import analyze
    from ..audit.collectives import pair_collectives, per_rank_plan

    table = record_tp_table(group, stage, start, tokens)
    reports = analyze([table], token_range="token")
    plan = pd.concat([per_rank_plan(reports, m).assign(mode=m) for m in ("global", "thread_local", "relaxed")])
    return table, pair_collectives(table.frame), plan


__all__ = ["Span", "record_tp_table", "tp_trace"]
