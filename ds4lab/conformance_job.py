"""``ds4lab conformance``: run the scenarios on the chosen backends, write one table, compare."""

from __future__ import annotations

import json
from pathlib import Path

from . import provenance
from .conformance import SCENARIOS, compare, run_scenarios


def _make(name: str):
    if name == "cupy":
        from .backends.cupy_backend import CupyBackend

        return CupyBackend()
    from .sim.backend import SimBackend

    return SimBackend()


def expectation_mismatches(results: dict[str, dict[str, dict[str, str]]]):
    """Steps whose outcome differs from a scenario's documented expectation (``Scenario.expect``).

    Returns a DataFrame: backend, scenario, step, expected, got, source (empty when all agree).
    """
    import pandas as pd

    rows = []
    for b, res in results.items():
        for sc in SCENARIOS:
            if not sc.expect or sc.name not in res:
                continue
            for step, want in sc.expect.items():
                got = res[sc.name].get(step, "—")
                if got != want:
                    rows.append({"backend": b, "scenario": sc.name, "step": step, "expected": want, "got": got,
                                 "source": sc.source})
    return pd.DataFrame(rows, columns=["backend", "scenario", "step", "expected", "got", "source"])


def run_conformance(backend: str, out: Path, names, console) -> bool:
    """Run on ``cupy`` and ``sim`` (``cupy``/``auto`` with a GPU) or on ``sim`` alone.

    Writes ``conformance.csv`` (scenario, step, one column per backend, agree), the raw records
    (``conformance-<backend>.json``), ``expectations.csv`` (steps that differ from a scenario's
    documented expectation, per backend) and ``meta.json``. Returns True when every step agrees (sim
    alone: when no scenario raised an unexpected exception).
    """
    from .backends import BackendUnavailable
    from .backends.cupy_backend import gpu_usable
    from .progress import JobProgress
    from .results import check_out

    unknown = sorted(set(names or ()) - {sc.name for sc in SCENARIOS})
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)} (`ds4lab conformance --list` names them)")

    if backend == "auto":
        backend = "cupy" if gpu_usable()[0] else "sim"
    order = ["cupy", "sim"] if backend == "cupy" else ["sim"]
    out = Path(out)
    check_out(out, ("conformance.csv", "meta.json"))
    results, metas = {}, {}
    for b in order:
        try:
            be = _make(b)
        except BackendUnavailable:
            raise  # asked for the GPU and there is none: an error, not a sim-only run
        except Exception as e:  # the sim may be missing in a partial install: say so, keep the GPU half
            console.print(f"[red]backend {b} unavailable: {e}[/]")
            continue
        if b == "cupy":
            be.compile_all()
        n = len(names) if names else len(SCENARIOS)
        with JobProgress(console, f"{b}: scenarios", n) as prog:
            results[b] = run_scenarios(be, names, progress=lambda _: prog.advance())
        metas[b] = provenance.base_meta(be)
        (out / f"conformance-{b}.json").write_text(json.dumps(results[b], indent=1) + "\n")
    df = compare(results)
    df.to_csv(out / "conformance.csv", index=False)
    exp = expectation_mismatches(results)
    exp.to_csv(out / "expectations.csv", index=False)
    from .results import write_meta

    write_meta(out / "meta.json", {"job": "conformance", "backends": metas,
                                   "scenarios": len({s for s in df.scenario}),
                                   "steps": len(df), "disagreements": int((~df.agree).sum()),
                                   "expectation_mismatches": {b: int((exp.backend == b).sum()) for b in results}})
    exc = df[df.step.isin(["<exception>", "<unhandled>"])]
    console.print(f"{df.scenario.nunique()} scenarios, {len(df)} steps on {', '.join(results)}")
    if len(results) > 1:
        bad = df[~df.agree]
        console.print(f"disagreements: {len(bad)}")
        if len(bad):
            console.print(bad[["scenario", "step", *results]].to_string(index=False))
    if len(exp):
        console.print(f"steps that differ from the documented expectation ({len(exp)}; expectations.csv):")
        console.print(exp[["backend", "scenario", "step", "expected", "got"]].to_string(index=False))
    if len(exc):
        console.print("[red]scenarios that raised:[/]")
        console.print(exc.to_string(index=False))
    console.print(f"table: {out / 'conformance.csv'}")
    return bool(df.agree.all()) and len(exc) == 0
