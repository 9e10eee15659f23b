"""Nsight Compute ``ncu --csv`` output (details or raw page, with ``--nvtx``) → ``ncu_kernels`` (one row per profiled
kernel, its NVTX stack split into ds4lab's token / layer / cluster / op, joinable to ds4lab's launch sites) and
``ncu_metrics`` (every metric, long). ncu locks clocks to base by default: its durations are for ratios, not for
the ladder's µs. Sources: the Nsight Compute CLI guide (``--csv``, ``--page``, ``--print-units``, ``--nvtx``); the
pages and their columns: docs/trace-readers.md, "Nsight Compute CSV"."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd

from .common import TIME_UNIT_US, Ingested, ends_with_newline, num, problem, text_lines

#: The formats this module reads (:func:`ds4lab.trace.sources.detect`'s names) and what they are.
FORMATS = {"ncu-csv": "Nsight Compute CSV output"}
#: What it yields: an event table (``events``), summary tables (``tables``).
YIELDS = ("tables",)

#: the details page's section that holds the throughputs as % of peak (``--section SpeedOfLight``)
SOL_SECTION = "GPU Speed Of Light Throughput"
#: details-page (section, metric name) → (column, unit kind): a metric counts for a column only in
#: its section and with its kind of unit. "Memory Throughput" is % of peak in the Speed Of Light
#: section and Gbyte/second in Memory Workload Analysis: only the first is ``memory_pct``.
DETAILS_METRICS = {(SOL_SECTION, "Duration"): ("duration_us", "time"),
                   (SOL_SECTION, "DRAM Throughput"): ("dram_pct", "%"),
                   (SOL_SECTION, "Compute (SM) Throughput"): ("sm_pct", "%"),
                   (SOL_SECTION, "Memory Throughput"): ("memory_pct", "%"),
                   ("Launch Statistics", "Registers Per Thread"): ("registers", "count")}
#: raw-page metric name → (column, unit kind)
RAW_METRICS = {"gpu__time_duration.sum": ("duration_us", "time"),
               "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("dram_pct", "%"),
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("dram_pct", "%"),
               "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("sm_pct", "%"),
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("memory_pct", "%"),
               "launch__registers_per_thread": ("registers", "count")}
ID_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC")
NVTX_DOMAIN = "ds4lab"
KERNEL_COLUMNS = ("id", "kernel", "grid", "block", "duration_us", "dram_pct", "sm_pct", "memory_pct", "registers",
                  "nvtx", "position", "layer", "cluster", "op", "device", "pid", "page", "provenance")
RULE_TABLE_COLUMNS = ("id", "kernel", "section", "rule", "type", "description", "speedup_type", "speedup_pct",
                      "file", "source")
_RANGE = re.compile(r'"([^"]*)"')


def looks_like(text: str) -> bool:
    """Whether ``text`` holds ``ncu --csv`` output: a CSV header row starting ``"ID","Process ID"`` (both pages), or
    ``==PROF==`` lines before a header with ``"Kernel Name"``."""
    if re.search(r'^"ID","Process ID"', text, re.M):
        return True
    return "==PROF==" in text and bool(re.search(r'^".*"Kernel Name"', text, re.M))


def parse_nvtx_stack(cell: str) -> list[dict]:
    """The push/pop ranges of one NVTX cell, outermost first: ``{"domain", "name", "payload"}`` (payload an int
    where it parses). Each quoted range is ``domain:name:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg`` (the six
    attribute fields counted from the end, so a name may hold ``:``); fewer fields: the second is the name."""
    out = []
    for r in _RANGE.findall(cell or ""):
        f = r.split(":")
        if len(f) < 2:
            out.append({"domain": "", "name": r, "payload": None})
            continue
        if len(f) >= 8:
            name, pl = ":".join(f[1:len(f) - 6]), f[len(f) - 5]
        else:
            name, pl = f[1], (f[3] if len(f) >= 4 else None)
        out.append({"domain": f[0], "name": name, "payload": _payload(pl)})
    return out


def _payload(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        try:
            return int(float(v))
        except ValueError:  # "none", text
            return None


def ds4lab_levels(stack: list[dict]) -> dict:
    """position / layer / cluster / op from a parsed stack (ds4lab's domain only); missing: None."""
    own = [r for r in stack if r["domain"] == NVTX_DOMAIN]
    got = {"position": None, "layer": None, "cluster": None, "op": None}
    rest = []
    for r in own:
        if r["name"] == "token" and got["position"] is None and not rest:
            got["position"] = r["payload"]
        elif r["name"] == "layer" and got["layer"] is None and not rest:
            got["layer"] = r["payload"]
        else:
            rest.append(r)
    if rest:
        got["cluster"] = rest[0]["name"]
        if got["layer"] is None and rest[0]["payload"] is not None and rest[0]["payload"] >= 0:
            got["layer"] = rest[0]["payload"]
    if len(rest) > 1:
        got["op"] = rest[-1]["name"]
    return got


def read_ncu_csv(path: Path, lenient: bool) -> Ingested:
    """``ncu --csv`` output → ``ncu_kernels`` (:data:`KERNEL_COLUMNS`, ``file``, ``source``), ``ncu_metrics``
    (every metric, long, with its unit) and ``ncu_rules`` (the details page's rule results). Malformed (file and
    line): a row of the wrong field count; a kernel column's value not a number (``n/a``: empty), in a unit of the
    wrong kind, negative, or a percentage outside 0–100; one column given twice with two values; a cut last line."""
    res = Ingested(path, "ncu-csv")
    lines = [line for _, line in text_lines(res, path)]
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID",')), None)
    if start is None:
        problem(res, lenient, 0, 'no ncu CSV header (a row starting "ID","Process ID"); was --csv given?')
        return res
    hdr = next(csv.reader([lines[start]]))
    page = "details" if "Metric Name" in hdr and "Metric Value" in hdr else "raw"
    nvtx_cols = [h for h in hdr if "Push/Pop_Range" in h]
    kernels: dict[str, dict] = {}
    metrics, rules = [], []
    units = None
    first = start + 1
    if page == "raw" and first < len(lines):
        try:
            u = next(csv.reader([lines[first]]))
        except csv.Error:
            u = []
        if len(u) == len(hdr) and not (u[0].strip() if u else "x"):  # the units row: no ID
            units = dict(zip(hdr, u))
            first += 1
    cut = not ends_with_newline(path)
    for k in range(first, len(lines)):
        line = lines[k]
        n = k + 1
        if not line.strip():
            continue
        if line.startswith("==") and "==" in line[2:]:
            continue  # ==PROF== / ==WARNING== lines can also come after the table
        if cut and k == len(lines) - 1:
            problem(res, lenient, n, "the file ends in the middle of this line: cut off (truncated), not read", line)
            continue
        try:
            cells = next(csv.reader([line]))
        except csv.Error as e:
            problem(res, lenient, n, f"unreadable CSV ({e})", line)
            continue
        if len(cells) < len(hdr) and page == "details" and len(cells) >= hdr.index("Metric Value") + 1:
            cells = cells + [""] * (len(hdr) - len(cells))  # rule columns left off
        if len(cells) != len(hdr):
            problem(res, lenient, n, f"{len(cells)} fields, the ncu header (line {start + 1}) has {len(hdr)}", line)
            continue
        rec = dict(zip(hdr, cells))
        kid = rec.get("ID", "").strip()
        if not kid:
            problem(res, lenient, n, "a row without a kernel ID", line)
            continue
        kr = kernels.get(kid)
        if kr is None:
            kr = kernels[kid] = _kernel_row(rec, kid, nvtx_cols, page, path, n)
        if page == "details":
            if rec.get("Rule Name", "").strip():
                rules.append(_rule_row(rec, kr, path, n))
            if not rec["Metric Name"].strip():
                continue  # a rule's row: no metric in it
            bad = _metric(kr, metrics, rec.get("Section Name", "").strip(), rec["Metric Name"].strip(),
                          rec.get("Metric Unit", "").strip(), rec["Metric Value"], DETAILS_METRICS)
            if bad:
                problem(res, lenient, n, bad, line)
        else:
            for h in hdr:
                if h in ID_COLUMNS or h in nvtx_cols or "Start/Stop_Range" in h:
                    continue
                bad = _metric(kr, metrics, "raw", h, (units or {}).get(h, "").strip(), rec[h], RAW_METRICS)
                if bad:
                    problem(res, lenient, n, bad, line)
                    break
    if not kernels and not res.problems:
        problem(res, lenient, start + 1, "an ncu CSV header without any kernel row")
    for kr in kernels.values():
        kr.pop("_from", None)
    res.tables["ncu_kernels"] = pd.DataFrame(list(kernels.values()))
    res.tables["ncu_metrics"] = pd.DataFrame(metrics, columns=["id", "kernel", "section", "metric", "unit", "value",
                                                               "file"]).assign(file=str(path))
    if rules:
        res.tables["ncu_rules"] = pd.DataFrame(rules, columns=list(RULE_TABLE_COLUMNS))
    return res


def _kernel_row(rec: dict, kid: str, nvtx_cols: list, page: str, path: Path, n: int) -> dict:
    stack = parse_nvtx_stack(rec[nvtx_cols[0]]) if nvtx_cols else []
    return {"id": _int(kid), "kernel": rec.get("Kernel Name", "").strip(),
            "grid": rec.get("Grid Size", "").strip(), "block": rec.get("Block Size", "").strip(),
            "duration_us": None, "dram_pct": None, "sm_pct": None, "memory_pct": None, "registers": None,
            "nvtx": " > ".join(f"{r['domain']}:{r['name']}" for r in stack), **ds4lab_levels(stack),
            "device": rec.get("Device", "").strip(), "pid": _int(rec.get("Process ID", "").strip()),
            "page": page, "provenance": _provenance(rec), "file": str(path), "source": f"{path.name}:{n}",
            "_from": {}}


def _rule_row(rec: dict, kr: dict, path: Path, n: int) -> dict:
    """One rule result of the details page (``ncu_rules``): the estimated speedup (% of the kernel's time, ncu's
    "Estimated Speedup") as a number where it is one."""
    sp = rec.get("Estimated Speedup", "").strip()
    try:
        speedup = num(sp) if sp else None
    except ValueError:
        speedup = None
    return {"id": kr["id"], "kernel": kr["kernel"], "section": rec.get("Section Name", "").strip(),
            "rule": rec.get("Rule Name", "").strip(), "type": rec.get("Rule Type", "").strip(),
            "description": rec.get("Rule Description", "").strip(),
            "speedup_type": rec.get("Estimated Speedup Type", "").strip(), "speedup_pct": speedup,
            "file": str(path), "source": f"{path.name}:{n}"}


def _provenance(rec: dict) -> str:
    """Where an ncu row's numbers come from: the tool and the GPU's compute capability (``CC``)."""
    cc = rec.get("CC", "").strip()
    return "Nsight Compute" + (f", CC {cc}" if cc else "")


def _int(s: str):
    try:
        return int(s)
    except ValueError:
        return s


#: the units ncu prints for a percentage (``--print-units``)
_PCT_UNITS = ("%",)


def _metric(kr, metrics, section, name, unit, value, wanted) -> str | None:
    """Record one metric value in ``ncu_metrics`` and set the kernel column it stands for (``wanted``) when its
    unit is of the column's kind. Returns what is wrong, else None."""
    v = None
    cell = value.strip()
    spec = wanted.get((section, name)) if (section, name) in wanted else wanted.get(name)
    if cell and cell.lower() not in ("n/a", "nan"):
        try:
            v = num(cell)
        except ValueError:
            if spec is not None:
                return f"metric {name!r} ({section}): {cell!r} is not a number"
    metrics.append({"id": kr["id"], "kernel": kr["kernel"], "section": section, "metric": name, "unit": unit,
                    "value": v if v is not None else cell})
    if spec is None or v is None:
        return None
    col, kind = spec
    if kind == "time":
        f = TIME_UNIT_US.get(unit)
        if f is None:
            return (f"metric {name!r} ({section}): unit {unit!r} is not a time unit ncu prints "
                    "(ns, us, ms, s, nsecond, usecond, msecond, second)")
        v *= f
    elif kind == "%":
        if unit not in _PCT_UNITS:
            return f"metric {name!r} ({section}): unit {unit!r}, not %: not the % of peak column {col} holds"
        if not 0 <= v <= 100:
            return f"metric {name!r} ({section}) = {cell} %: a percentage of peak lies in 0-100"
    if v < 0:
        return f"metric {name!r} ({section}) = {cell} is negative"
    prev = kr["_from"].get(col)
    if prev is not None and kr[col] is not None and kr[col] != v:
        return (f"kernel ID {kr['id']}: {col} given twice with two values: {kr[col]:g} ({prev}) and {v:g} "
                f"({section} / {name})")
    kr[col] = v
    kr["_from"][col] = f"{section} / {name}"
    return None


def join_sites(kernels: pd.DataFrame, sites: pd.DataFrame, bandwidth_GBps: float | None = None) -> pd.DataFrame:
    """ncu kernel rows joined to ds4lab launch sites on (cluster, op, layer): adds ``site_kernel``, ``nbytes``,
    ``achieved_GBps``, ``site_known``; a row whose layer is unknown or absent joins on (cluster, op) alone, the
    site's first layer (``site_layer``). ``bandwidth_GBps`` (a peak) adds ``bw_fraction``."""
    s = sites.rename(columns={"kernel": "site_kernel", "layer": "site_layer"})
    exact = s.drop_duplicates(["cluster", "op", "site_layer"])
    first = s.drop_duplicates(["cluster", "op"])
    k = kernels.copy().reset_index(drop=True)
    k["site_layer"] = pd.to_numeric(k["layer"], errors="coerce")
    k.loc[k["site_layer"].isna() & k["cluster"].isin(["embed", "final"]), "site_layer"] = -1
    cols = ["cluster", "op", "site_layer", "site_kernel", "nbytes"]
    out = k.merge(exact[cols], on=["cluster", "op", "site_layer"], how="left")
    miss = out["site_kernel"].isna()
    if miss.any():
        alt = k.loc[miss, ["cluster", "op"]].merge(first[cols], on=["cluster", "op"], how="left")
        for c in ("site_layer", "site_kernel", "nbytes"):
            out.loc[miss, c] = alt[c].to_numpy()
    known = set(zip(sites["cluster"], sites["op"]))
    out["site_known"] = [(c, o) in known for c, o in zip(out["cluster"], out["op"])]
    dur = pd.to_numeric(out["duration_us"], errors="coerce")
    out["achieved_GBps"] = pd.to_numeric(out["nbytes"], errors="coerce") / (dur * 1e3)
    if bandwidth_GBps:
        out["bw_fraction"] = out["achieved_GBps"] / bandwidth_GBps
    return out


def per_site(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per launch site (cluster, op), file, device and process: kernel, launches, median duration (µs),
    DRAM %, SM %, achieved GB/s where joined; largest total duration first; no ds4lab op: ``(no NVTX op)``."""
    k = kernels.copy()
    k["cluster"] = k["cluster"].fillna("(no ds4lab range)")
    k["op"] = k["op"].fillna("(no NVTX op)")
    for c in ("duration_us", "dram_pct", "sm_pct", "achieved_GBps"):
        if c in k:
            k[c] = pd.to_numeric(k[c], errors="coerce")
    agg = {"kernel": ("kernel", "first"), "launches": ("kernel", "size"), "total_us": ("duration_us", "sum"),
           "duration_us": ("duration_us", "median"), "dram_pct": ("dram_pct", "median"), "sm_pct": ("sm_pct", "median")}
    if "achieved_GBps" in k:
        agg["achieved_GBps"] = ("achieved_GBps", "median")
    if "provenance" in k:
        agg["provenance"] = ("provenance", "first")
    # one row per site and device/process: two GPUs' kernels never share a median
    by = ["cluster", "op"] + [c for c in ("file", "device", "pid") if c in k]
    g = k.groupby(by, dropna=False).agg(**agg).reset_index()
    return g.sort_values("total_us", ascending=False).reset_index(drop=True)

