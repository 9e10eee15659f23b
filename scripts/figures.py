#!/usr/bin/env python3
"""Writes ``docs/figures.md``, the page of current figures, from the committed records.

Every number on the page is read from a record under ``docs/measurements/`` (never typed here);
every table names its record and, from the record's own ``meta.json``, the GPU, driver, CuPy
version and date, or says MODELED where the record came from the simulated runtime.

Which record is current for each figure is the table ``CURRENT`` just below: a newer round
replaces a figure by changing its line there, then ``python3 scripts/figures.py``.
``tests/test_figures.py`` fails when the committed page differs from what this script writes.

    python3 scripts/figures.py            # rewrite docs/figures.md
    python3 scripts/figures.py --check    # exit 1 if docs/figures.md is stale
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

# figure → its current record (a folder or file under docs/measurements/)
CURRENT = {
    "ladder": "h200-2026-12-02b/notebooks/00_quickstart",
    "islands": "h200-2026-12-01/round3/islands",
    "context": "h200-2026-12-02b/notebooks-b/04_long_context/context",
    "capture_stages": "h200-2026-12-02b/capture-stages",
    "floors": "h200-2026-12-01/kernels/call2/bench.json",
    "per_op": "h200-2026-12-01/kernels/call2/bench.json",
    "launch": "h200-2026-12-01/kernels/call2/bench.json",
    "conformance": "h200-2026-12-02-ds4/conformance",
    "ds4": "h200-2026-12-02b/ds4",
    "ds4_long": "h200-2026-12-02-ds4/ds4-long",
    "exclusion": "h200-2026-12-02b/notebooks/02_profiling_vs_capture/exclusion",
    "hazards": "h200-2026-11-30b/hazards",
    "hazards_longctx": "h200-2026-11-30b/longctx",
    "hazards_island": "h200-2026-12-01/round2/hazards-island",
    "moe_overhead": "h200-2026-11-30b/moe",
    "moe_in_graph": "h200-2026-12-01/kernels/call2/moe",
    "moe_ds4": "h200-2026-12-01-moe-ds4/call2/timing",
}

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "docs" / "measurements"
PAGE = ROOT / "docs" / "figures.md"
PER_OP_ROWS = 15  # launch sites shown, by time lost against the copy bandwidth (all in per_op.csv)


# ---------------------------------------------------------------- reading records

def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def one_file(folder: Path, *names: str) -> Path:
    """The first of ``names`` that exists in ``folder`` (a record's table)."""
    for n in names:
        if (folder / n).exists():
            return folder / n
    raise FileNotFoundError(f"{folder}: none of {', '.join(names)}")


def _env_provenance(record: Path, root: Path) -> dict | None:
    """GPU, driver and versions from the round's env.log/env.txt (nvidia-smi CSV, then a versions
    line), for a job that wrote no meta.json; the date is the round folder's."""
    for folder in [record, *record.parents]:
        if folder == root or root not in folder.parents:
            break
        for name in ("env.log", "env.txt"):
            env = folder / name
            if env.exists():
                lines = [ln.strip() for ln in env.read_text().splitlines() if ln.strip()]
                gpu = next((ln.split(",") for ln in lines[1:] if ln.count(",") >= 1 and "cupy" not in ln), None)
                words = next((ln.split() for ln in lines if "cupy" in ln.split()), [])
                round_dir = record.relative_to(root).parts[0]
                return {"device": gpu[0].strip() if gpu else "?", "driver": gpu[1].strip() if gpu else "?",
                        "cupy": words[words.index("cupy") + 1] if "cupy" in words else "?",
                        "timestamp": round_dir.split("-", 1)[1][:10] if "-" in round_dir else "?",
                        "_from": str(env.relative_to(root)), "_env": True}
    return None


def provenance(record: Path, root: Path) -> dict:
    """What the record says about where it came from: its meta.json (or the ``meta`` of a
    bench.json), or, for a job that wrote none, the round's env.log."""
    if record.is_file():
        meta = json.loads(record.read_text()).get("meta")
        if meta:
            return {**meta, "_from": str(record.relative_to(root))}
        record = record.parent
    for name in ("meta.json",):
        if (record / name).exists():
            meta = json.loads((record / name).read_text())
            if "device" not in meta and "backends" in meta:  # conformance: one provenance per backend
                gpu = next((m for m in meta["backends"].values() if not m.get("modeled")), None)
                base = gpu or next(iter(meta["backends"].values()))
                meta = {**base, **{k: v for k, v in meta.items() if k != "backends"}, "backends": meta["backends"]}
            return {**meta, "_from": str((record / name).relative_to(root))}
    env = _env_provenance(record, root)
    if env:
        return env
    raise FileNotFoundError(f"{record}: no meta.json and no env.log in its round")


def cal_name(meta: dict) -> str:
    """The calibration a sim record was priced with (a name, or a dict with one)."""
    cal = meta.get("calibration")
    return (cal.get("name", "?") if isinstance(cal, dict) else cal) or "?"


def source_line(files: list[Path], meta: dict, root: Path) -> str:
    names = ", ".join(f"`docs/measurements/{p.relative_to(root)}`" for p in files)
    date = str(meta.get("timestamp", "?"))[:10]
    if meta.get("modeled") or meta.get("backend") == "sim":
        what = f"**MODELED** (simulated runtime, calibration {cal_name(meta)})"
    elif meta.get("job") == "ds4":  # ds4 itself: its commit, not a CuPy version (it runs none)
        what = f"{meta.get('device', '?')} · driver {meta.get('driver', '?')} · ds4 {meta.get('ds4_commit', '?')}"
    else:
        what = (f"{meta.get('device', '?')} · driver {meta.get('driver', '?')} · "
                f"CuPy {meta.get('cupy', '?')}")
    origin = meta["_from"]
    how = (" (provenance inside it)" if any(str(p.relative_to(root)) == origin for p in files)
           else f" (provenance: `docs/measurements/{origin}`"
           + ("; the job wrote no meta.json)" if meta.get("_env") else ")"))
    return f"Source: {names}{how} · {what} · {date}"


# ---------------------------------------------------------------- formatting

def num(x, digits: int = 0) -> str:
    """A number with a space between thousands, as the rest of the docs write them."""
    if x in (None, ""):
        return "—"
    v = float(x)
    s = f"{v:,.{digits}f}".replace(",", " ")
    return s


def ratio(x, digits: int = 2) -> str:
    return "—" if x in (None, "") else f"{float(x):.{digits}f}"


def pct(x, digits: int = 0) -> str:
    return "—" if x in (None, "") else f"{100 * float(x):.{digits}f} %"


def table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def yes(x) -> str:
    return "yes" if str(x) == "True" else "**no**"


def launches(row: dict) -> str:
    k, g = float(row["kernel_launches"] or 0), float(row["graph_launches"] or 0)
    parts = ([f"{num(k)} kernel{'s' * (k != 1)}"] if k else []) + ([f"{num(g)} graph{'s' * (g != 1)}"] if g else [])
    return " + ".join(parts) or "0"


# ---------------------------------------------------------------- one function per figure
# each: (record path, root) → (files read, meta, body markdown)

def fig_ladder(rec: Path, root: Path):
    f = one_file(rec, "ladder.csv")
    meta, rows = provenance(rec, root), read_csv(f)
    body = [f"`ds4lab ladder` on `{rows[0]['preset']}`: {num(meta.get('tokens'))} timed tokens per stage"
            + (f" in {meta['rounds']} interleaved rounds" if meta.get("rounds") else "")
            + (f", from position {num(meta['start_pos'])}" if meta.get("start_pos") is not None else "")
            + f"; GPU-busy floor {num(rows[0]['floor_us'])} µs (the sum of one token's kernel times)."]
    body.append(table(["stage", "µs per token, median (IQR)", "× stage 0", "efficiency (floor / µs)",
                       "host enqueue µs", "launches per token", "exact"],
                      [[r["stage"], f"{num(r['us_median'])} ({num(r['us_p25'])}–{num(r['us_p75'])})",
                        ratio(r["speedup"]), ratio(r["efficiency"]), num(r["host_us_median"]), launches(r),
                        yes(r["exact"])] for r in rows]))
    return [f], meta, "\n\n".join(body)


def fig_context(rec: Path, root: Path):
    f = one_file(rec, "context.csv")
    meta, rows = provenance(rec, root), read_csv(f)
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    by = {(r["context"], r["stage"]): r for r in rows}
    head = ["context"] + [f"stage {s}" + (" (graphs so far)" if s.startswith("3") else "") for s in stages]
    has_ratio = "3" in stages and "3c" in stages
    out = []
    for c in dict.fromkeys(r["context"] for r in rows):
        cells = [num(c)]
        for s in stages:
            r = by.get((c, s))
            cell = "—" if r is None else num(r["us_median"]) + (f" ({r['graphs']})" if s.startswith("3") else "")
            cells.append(cell if r is None or r["exact"] == "True" else cell + " **not exact**")
        if has_ratio:
            cells.append(ratio(float(by[(c, "3c")]["us_median"]) / float(by[(c, "3")]["us_median"])))
        out.append(cells)
    body = [f"`ds4lab context` on `{rows[0]['preset']}` (the long-context token): µs per token, median "
            f"of {num(meta.get('tokens'))} tokens per stage and context; exactness against stage 0 over "
            f"{num(meta.get('span'))} tokens around each context.",
            table(head + (["3c / 3"] if has_ratio else []), out)]
    return [f], meta, "\n\n".join(body)


def _bench(rec: Path) -> dict:
    return json.loads(rec.read_text())


def bench_token(b: dict) -> str:
    """The token a bench record measured, as the presets name it today: a record whose routed MoE is
    ds4lab's five-launch one (``moe_gateup_decode`` … ``moe_sum``) was taken when ``ds4-flash`` had that
    MoE; today that token is ``ds4-flash-q4blk``, and ``ds4-flash`` runs ds4's four-launch MoE."""
    p = b.get("per_op", {})
    kernels = {str(s.get("kernel")) for s in p.get("sites", [])}
    n = p.get("floors", {}).get("kernels") or p.get("kernels")
    if "moe_sum" in kernels or "moe_gateup_decode" in kernels:
        return (f"`ds4lab bench --preset ds4-flash --per-op` as run then, on the token with ds4lab's five-launch "
                f"routed MoE ({num(n)} kernels per token; today's `ds4-flash-q4blk`; today's `ds4-flash`, ds4's "
                "four-launch MoE, 1 078 kernels, has no bench record yet)")
    return "`ds4lab bench --preset ds4-flash --per-op`"


def fig_floors(rec: Path, root: Path):
    b, meta = _bench(rec), provenance(rec, root)
    p = b.get("per_op", {})
    fl = p.get("floors", {})
    g = {**p, **fl}
    rows = [
        ("replayed token, busy µs (CUPTI kernel records)", num(g.get("token_busy_us"))),
        ("replayed token, µs (CUDA events)", num(g.get("token_replay_us"))),
        ("bytes per token", f"{num(g['token_bytes'] / 1e9, 2)} GB" if g.get("token_bytes") else None),
        ("copy bandwidth GB/s (device to device, same run)", num(g.get("copy_GBps"))),
        ("bytes-moved floor µs", num(g.get("bytes_floor_us"))),
        ("t_min µs per kernel (empty kernel, graph as long as the launch list)", ratio(g.get("t_min_us"))
         if g.get("t_min_us") else None),
        ("launch-list floor µs: Σ max(bytes / copy bandwidth, t_min)", num(g.get("launch_floor_us"))
         if g.get("launch_floor_us") else None),
        ("kernels bound by t_min", f"{num(g['t_min_bound_kernels'])} of {num(g.get('kernels'))}"
         if g.get("t_min_bound_kernels") else None),
        ("busy / bytes floor", ratio(g["busy_vs_bytes_floor"]["over_floor"] if g.get("busy_vs_bytes_floor")
                                     else g.get("busy_over_floor"))),
        ("busy / launch-list floor", ratio(g["busy_vs_launch_floor"]["over_floor"])
         if g.get("busy_vs_launch_floor") else None),
        ("large kernels (≥ 8 MB): µs, fraction of copy", f"{num(g['large_kernel_us'])} µs over "
         f"{num(g.get('large_kernels'))} kernels, {pct(g.get('large_kernel_copy_fraction'))}"
         if g.get("large_kernel_us") else None),
        ("routed-MoE decode step, fraction of copy", pct(b.get("moe_decode_copy_fraction"))),
        ("attention µs per layer", ratio(g.get("attention_us_per_layer"))
         if g.get("attention_us_per_layer") else None),
        ("per-op method", f"`{p.get('method')}`, {num(p.get('tokens'))} tokens" if p.get("method") else None),
    ]
    body = [f"{bench_token(b)}: the replayed token against its floors.",
            table(["figure", "value"], [[k, v] for k, v in rows if v not in (None, "—")])]
    return [rec], meta, "\n\n".join(body)


def fig_per_op(rec: Path, root: Path):
    b, meta = _bench(rec), provenance(rec, root)
    sites = sorted(b["per_op"]["sites"], key=lambda s: -float(s["lost_us"]))
    csv_path = rec.parent / "per_op.csv"
    shown = sites[:PER_OP_ROWS]
    body = [f"{bench_token(b)}: per launch site of one token, µs summed over the "
            f"site's launches, sorted by "
            f"time lost against the copy bandwidth; {len(shown)} of {len(sites)} sites"
            + (" (all in `per_op.csv`)." if csv_path.exists() else "."),
            table(["site", "kernel", "launches", "MB per token", "µs", "fraction of copy", "lost µs"],
                  [[f"{s['cluster']}/{s['site']}", f"`{s['kernel']}`", num(s["launches"]),
                    num(float(s["bytes"]) / 1e6, 1), num(s["us"]), pct(s["copy_fraction"]), num(s["lost_us"])]
                   for s in shown])]
    return [rec] + ([csv_path] if csv_path.exists() else []), meta, "\n\n".join(body)


def fig_launch(rec: Path, root: Path):
    b, meta = _bench(rec), provenance(rec, root)
    lo = b["launch_overhead"]
    rows = [[k, f"{ratio(v['host_us']['median'])} ({ratio(v['host_us']['p25'])}–{ratio(v['host_us']['p75'])})",
             ratio(v["ratio_vs_bare"], 3)] for k, v in lo.items()]
    n = next(iter(lo.values()))["host_us"]["n"]
    body = [f"`ds4lab bench`: host µs per launch of the same small kernel, median of {n} repeats.",
            table(["launch path", "host µs per launch, median (IQR)", "× bare RawKernel"], rows)]
    gr = b.get("graph_replay")
    if gr:
        body += ["Graph replay, µs per kernel node:",
                 table(["graph", "µs per node, median (IQR)"],
                       [[k, f"{ratio(v['median'], 3)} ({ratio(v['p25'], 3)}–{ratio(v['p75'], 3)})"]
                        for k, v in gr.items()])]
    mb = b.get("moe_bandwidth")
    if mb:
        r = mb["graph_replay_us"]
        body.append(f"Routed-MoE decode step (one graph of routings, {num(mb['bytes_per_step'] / 1e6, 1)} MB "
                    f"per step): {ratio(r['median'], 1)} µs replayed (IQR {ratio(r['p25'], 1)}–"
                    f"{ratio(r['p75'], 1)}), {num(mb['achieved_GBps'])} GB/s, "
                    f"{pct(mb['fraction_of_copy'])} of the copy bandwidth; eager "
                    f"{ratio(mb['eager_us']['median'], 1)} µs.")
    return [rec], meta, "\n\n".join(body)


def fig_conformance(rec: Path, root: Path):
    meta = provenance(rec, root)
    f = one_file(rec, "conformance.csv")
    backends = meta.get("backends", {})
    sim = next((m for m in backends.values() if m.get("modeled")), None)
    mism = meta.get("expectation_mismatches", {})
    # counted from the table: a scenario skipped on a backend (one row, step <skipped>) was not compared
    steps = read_csv(f)
    ran = [r for r in steps if r["step"] != "<skipped>"]
    skipped = sorted({r["scenario"] for r in steps} - {r["scenario"] for r in ran})
    rows = [["scenarios compared", num(len({r["scenario"] for r in ran}))], ["steps compared", num(len(ran))],
            ["disagreements (GPU against sim)", num(sum(r["agree"] == "False" for r in ran))],
            ["scenarios skipped (not run on every backend, not compared)", num(len(skipped))]]
    rows += [[f"steps differing from the documented expectation, {b}", num(v)] for b, v in mism.items()]
    body = [f"`ds4lab conformance --backend cupy`: every scenario on the GPU and on the simulated runtime, "
            f"step by step (backends: {', '.join(backends) or '?'}).",
            table(["figure", "value"], rows)]
    if sim:
        body.append(f"The sim's side is MODELED (calibration {cal_name(sim)}).")
    return [f, rec / "meta.json"], meta, "\n\n".join(body)


def fig_exclusion(rec: Path, root: Path):
    meta = provenance(rec, root)
    f = one_file(rec, "exclusion-agreement.csv")
    rows = read_csv(f)
    cols = list(dict.fromkeys(r["column"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cell = {(r["mode"], r["column"]): r for r in rows}

    def show(r):
        if r is None:
            return "—"
        return r["outcome_cupy"] if r["agree"] == "True" else f"**{r['outcome_cupy']} (sim: {r['outcome_sim']})**"

    agree = sum(r["agree"] == "True" for r in rows)
    sim = (meta.get("backends") or {}).get("sim", {})
    body = [f"`ds4lab exclusion --backend cupy`: each profiling mode under each way of running the MoE "
            f"call, on the GPU and on the simulated runtime: **{agree} of {len(rows)} cells agree**"
            + (f" (the sim's side MODELED, calibration {cal_name(sim)})"
               if sim else "") + ". The GPU's outcome:",
            table(["mode"] + cols, [[m] + [show(cell.get((m, c))) for c in cols] for m in modes])]
    return [f], meta, "\n\n".join(body)


def fig_hazards(rec: Path, root: Path):
    f = one_file(rec, "hazards.csv", "hazards-small.csv")
    meta, rows = provenance(rec, root), read_csv(f)
    preset = meta.get("preset", {}).get("name") if isinstance(meta.get("preset"), dict) else None
    body = ["`ds4lab hazards`" + (f" on `{preset}`" if preset else "") + ": each ds4-today path put back into "
            "a captured stage.",
            table(["hazard", "capture mode", "outcome", "CUDA errors", "exact", "first difference"],
                  [[r["hazard"], r.get("capture_mode", "—"), r["outcome"], r["errors"], yes(r["exact"]),
                    r["first_mismatch"] or "—"] for r in rows])]
    return [f], meta, "\n\n".join(body)


def fig_moe_overhead(rec: Path, root: Path):
    f = one_file(rec, "overhead.csv")
    meta, rows = provenance(rec, root), read_csv(f)

    def cost(r):
        if r["mode"] == "none":
            return f"baseline {num(r['us_per_token'])} µs per token"
        if r["measurable"] != "True":
            return f"not measurable (±{num((float(r['overhead_hi_us']) - float(r['overhead_lo_us'])) / 2)} µs)"
        return (f"+{num(r['overhead_us'])} µs (+{ratio(r['overhead_pct'], 1)} % of its paired baseline, "
                f"{num(r['baseline_us'])} µs; 95 % CI {num(r['overhead_lo_us'])}–{num(r['overhead_hi_us'])})")

    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {(r["mode"], r["regime"]): r for r in rows}
    pairs = next((r["pairs"] for r in rows if r["mode"] != "none"), "?")
    body = [f"`ds4lab moe` on `ds4-flash`: each profiling mode's cost on a whole token, median of {pairs} "
            f"paired, interleaved differences against its own baseline blocks (timed beside it; its median and "
            f"the percentage of it given with each cost), 95 % sign-test interval; the `none` row is the median "
            f"of every mode's baseline blocks (regimes: {', '.join(regimes)}; replayed = stage 2).",
            table(["mode"] + regimes,
                  [[m] + [cost(by[(m, g)]) + (f"; {by[(m, g)]['note']}" if by[(m, g)]["note"] and m != "none"
                                              else "") if (m, g) in by else "—" for g in regimes]
                   for m in modes])]
    return [f], meta, "\n\n".join(body)


def fig_moe_ds4(rec: Path, root: Path):
    f = one_file(rec, "moe_decode_kernels.csv")
    meta, rows = provenance(rec, root), read_csv(f)
    sites = list(dict.fromkeys(r["site"] for r in rows))
    groups = list(dict.fromkeys((r["preset"], r["expert_format"], r["decode"]) for r in rows))
    by = {(r["preset"], r["expert_format"], r["decode"], r["site"]): r for r in rows}
    out = []
    for g in groups:
        cells = [f"`{g[0]}`", g[1], g[2]]
        for site in sites:
            r = by.get((*g, site))
            cells.append("—" if r is None else f"{ratio(r['us_median'], 1)} ({pct(r['copy_fraction'])})")
        step = next(r["step_us_events"] for r in rows if (r["preset"], r["expert_format"], r["decode"]) == g)
        out.append(cells + [ratio(step, 1)])
    body = [f"One routed-MoE decode step (one token), each kernel's CUPTI duration under graph replay, "
            f"median over {meta.get('replays', '?')} replays of a graph of {meta.get('routings', '?')} "
            f"routings; µs per launch (fraction of the copy bandwidth, "
            f"{num(meta.get('copy_GBps'))} GB/s in the same run); the step's µs from CUDA events.",
            table(["preset", "expert format", "kernels"] + sites + ["step µs"], out)]
    return [f], meta, "\n\n".join(body)


def fig_capture_stages(rec: Path, root: Path):
    """The device-side capture stages (docs/capture-stages.md) against stage 3: µs per token, each
    stage's paired gain over stage 3 with its 95 % interval, and 3c / 3, 3cc / 3."""
    f = one_file(rec, "context.csv")
    meta, rows = provenance(rec, root), read_csv(f)
    stages = [s for s in dict.fromkeys(r["stage"] for r in rows) if s != "3"]
    by = {(r["context"], r["stage"]): r for r in rows}

    def gain(r):
        if r["gain_measurable"] != "True":
            lo, hi = float(r["gain_lo"]), float(r["gain_hi"])
            return f"not measurable (±{num((hi - lo) / 2)})"
        return f"{float(r['gain_us']):+,.0f} ({num(r['gain_lo'])}…{num(r['gain_hi'])})".replace(",", " ")

    out = []
    for c in dict.fromkeys(r["context"] for r in rows):
        base = by[(c, "3")]
        cells = [num(c), num(base["us_median"]) + ("" if base["exact"] == "True" else " **not exact**")]
        for s in stages:
            r = by.get((c, s))
            cells.append("—" if r is None else f"{num(r['us_median'])}: {gain(r)}"
                         + ("" if r["exact"] == "True" else " **not exact**"))
        cells += [ratio(float(by[(c, s)]["us_median"]) / float(base["us_median"]), 3)
                  for s in ("3c", "3cc") if (c, s) in by]
        out.append(cells)
    ratios = [f"{s} / 3" for s in ("3c", "3cc") if any(k[1] == s for k in by)]
    body = [f"`ds4lab context` on `{rows[0]['preset']}`: µs per token, median of {num(meta.get('tokens'))} "
            f"tokens per stage and context" + (f" in {num(meta['rounds'])} interleaved rounds" if meta.get("rounds") else "")
            + "; each stage's gain "
            "over stage 3 paired per token, µs with its 95 % interval (positive: faster than 3); every "
            "stage checked bit for bit against stage 0.",
            table(["context", "stage 3 µs"] + [f"stage {s} µs: gain over 3" for s in stages] + ratios, out)]
    return [f], meta, "\n\n".join(body)


def fig_ds4(rec: Path, root: Path):
    """ds4 itself (a ``ds4lab ds4`` folder, or a round holding several): µs per token, islands off
    and on, the paired gain, the MoE profile and its cost, one row per context of every folder."""
    folders = [rec] if (rec / "gains.csv").is_file() else sorted(p.parent for p in rec.glob("*/gains.csv"))
    meta = provenance(folders[0], root)
    meta = {**meta, "device": meta.get("gpu", "?"),
            "timestamp": meta.get("timestamp") or rec.relative_to(root).parts[0].split("-", 1)[1][:10]}
    rows, files = [], []
    for f in folders:
        summ = {(r["config"], r["context"]): r for r in read_csv(f / "summary.csv")}
        gains = {(r["other"], r["context"]): r for r in read_csv(f / "gains.csv")}
        files += [f / "summary.csv", f / "gains.csv"]
        for ctx in sorted({c for _, c in summ}, key=int):
            off, on = summ.get(("islands-off", ctx)), summ.get(("islands-on", ctx))
            g, prof = gains.get(("islands-on", ctx)), summ.get(("moe-profile", ctx))
            cost = gains.get(("moe-profile", ctx))
            if not (off and on and g):
                continue
            rows.append([num(float(ctx)), num(off["us_per_token"]), num(on["us_per_token"]),
                         f"{num(g['gain_us'])} ({num(g['gain_lo'])}…{num(g['gain_hi'])})", ratio(g["ratio"], 3),
                         num(prof["us_per_token"]) if prof else "—",
                         f"{num(-float(cost['gain_us']))} ({num(-float(cost['gain_hi']))}…{num(-float(cost['gain_lo']))})"
                         if cost else "—"])
    body = [f"`ds4lab ds4` (ds4 `{meta.get('ds4_commit', '?')}`, the synthetic Flash-shaped model, weights in "
            "GPU memory): µs per token, the median of the timed tokens between CUDA events; the islands' "
            "gain paired by position, with its 95 % interval.",
            table(["context", "islands off µs", "islands on µs", "islands gain µs (95 % CI)", "× off / on",
                   "MoE profile µs", "MoE profile cost over islands on µs (95 % CI)"], rows)]
    return files, meta, "\n\n".join(body)


FIGURES = [  # (figure, heading, renderer, note that carries no figure of its own)
    ("ladder", "The stage ladder", fig_ladder,
     "Notebook 00 with its defaults, on the H200. The eager stages are host-bound and drift between runs "
     "minutes apart; compare them within one run."),
    ("islands", "ds4's decode islands", fig_ladder,
     "Fewer tokens than the default ladder (200 per stage), in as many interleaved rounds: each median and "
     "interquartile range stands as measured, the eager stage 0 (host-bound) spreading most; the README's "
     "current figure."),
    ("context", "The context ladder", fig_context,
     "Notebook 04 with its defaults, on the H200. Stage 3 needs one graph per token shape (emit or not "
     "per compressor, top-k regime); 3c one graph for every position."),
    ("capture_stages", "Device-side capture stages: conditional nodes and programmatic launch", fig_capture_stages,
     "3c launches the worst case on every token; 3cc decides emit and top-k regime on the device "
     "(conditional nodes), one graph for every position; `p`: programmatic dependent launch inside the "
     "graph. How each works and why each overlap is safe: docs/capture-stages.md."),
    ("floors", "The token against its floors", fig_floors, None),
    ("per_op", "Per-op roofline", fig_per_op, None),
    ("launch", "Launch cost", fig_launch,
     "Host cost per launch moves between runs on this host by more than the launcher's own cost: "
     "read the ratios within one run."),
    ("ds4", "ds4 itself: its decode islands off and on, 1k and 4k", fig_ds4,
     "ds4lab's own ladder (above) measures its rebuild, launched from Python; these are ds4's, from C. "
     "What the record shows besides (the MoE profile's lost island 1 and what the audit says of it): "
     "its round's README."),
    ("ds4_long", "ds4 itself: 16k and 64k", fig_ds4,
     "The eager gap, the bound on more capture and ds4's host-mapped default: this round's README."),
    ("conformance", "Conformance: the GPU against the simulated runtime", fig_conformance, None),
    ("exclusion", "Profiling × capture: the exclusion matrix", fig_exclusion, None),
    ("hazards", "Hazards", fig_hazards, None),
    ("hazards_longctx", "Long-context hazards", fig_hazards,
     "Stage 3c (device-side predicates) stays exact for every one of them."),
    ("hazards_island", "ds4's MoE profile inside its decode islands", fig_hazards, None),
    ("moe_overhead", "MoE profiler overheads", fig_moe_overhead,
     "The in-graph mode changed after this record (stage kernels write their own stamps): its current "
     "figure is the next table."),
    ("moe_in_graph", "MoE profiler overhead, in-graph stamps", fig_moe_overhead, None),
    ("moe_ds4", "ds4's routed-MoE decode kernels, by expert format", fig_moe_ds4,
     "`staged` are the kernels kept; `stream` (several tiles per block, the next one in flight) were "
     "no faster overall and were removed."),
]


def render(current: dict[str, str] | None = None, root: Path = MEASUREMENTS) -> str:
    """The page, for the figures in ``current`` (figure → record under ``root``), in page order."""
    current = CURRENT if current is None else current
    unknown = set(current) - {k for k, *_ in FIGURES}
    if unknown:
        raise KeyError(f"no such figure: {', '.join(sorted(unknown))}")
    out = ["# Current figures",
           "",
           "Written by `scripts/figures.py` from the records under `docs/measurements/` (do not edit by "
           "hand: change the record table `CURRENT` at the top of the script and run it again; "
           "`tests/test_figures.py` fails while this page is stale). Each table names its record and, "
           "from that record's `meta.json`, the GPU, driver, CuPy version and date; a "
           "figure from the simulated runtime says MODELED. How each round was run, and which of its "
           "figures later records superseded: the README in each round's folder. Why things are the "
           "way they are: [design-log.md](design-log.md).",
           "",
           "Records made before ds4's expert formats came into ds4lab (every round before "
           "`h200-2026-12-01-moe-ds4`) ran ds4lab's own 4-bit experts and five-launch routed MoE: the "
           "presets they name `ds4-flash` and `small` are today's `ds4-flash-q4blk` and `small-q4blk`.",
           "",
           "| figure | record |",
           "|---|---|"]
    out += [f"| {title} | `{current[key]}` |" for key, title, *_ in FIGURES if key in current]
    for key, title, fn, note in FIGURES:
        if key not in current:
            continue
        rec = root / current[key]
        files, meta, body = fn(rec, root)
        out += ["", f"## {title}", "", source_line(files, meta, root), "", body]
        if note:
            out += ["", note]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python3 scripts/figures.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
