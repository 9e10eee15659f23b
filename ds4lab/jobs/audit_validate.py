"""``ds4lab audit validate``: the audit held to what ``torch.cuda.graph`` does with the decode steps of
engines nobody here wrote (:mod:`ds4lab.audit.validate`, :mod:`ds4lab.audit.engines`). Needs a GPU,
PyTorch and transformers (not ds4lab dependencies), and no ds4lab backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from .audit import AuditConfig, _meta
from .common import out_folder
from .result import JobResult, result_folder


@dataclass
class ValidateConfig:
    """What ``ds4lab audit validate`` does (:mod:`ds4lab.audit.validate`): which families and caches of
    :mod:`ds4lab.audit.families` to run (GPU, torch and transformers needed; empty: all), in which dtypes
    (empty: float32 and bfloat16), and the result folder (None: ``results/audit-validate``)."""

    engines: tuple = ()
    caches: tuple = ()
    out: Path | str | None = None
    dtypes: tuple = ()
    #: audit the runs a finished ``audit validate`` saved in this folder (no GPU) instead of running them
    runs_from: Path | str | None = None


def check_config(cfg: ValidateConfig) -> None:
    """Raise :class:`BadInput` naming an unknown engine or cache, or an empty ``out``."""
    from ..audit.families import CACHES, DTYPES, FAMILIES, pairs

    bad = ([e for e in cfg.engines if e not in FAMILIES] + [c for c in cfg.caches if c not in CACHES]
           + [d for d in cfg.dtypes if d not in DTYPES])
    if bad:
        raise BadInput(f"audit validate: unknown {', '.join(bad)}; engines: {', '.join(FAMILIES)}; caches: "
                       f"{', '.join(CACHES)}; dtypes: {', '.join(DTYPES)}")
    if not pairs(cfg.engines, cfg.caches):
        raise BadInput(f"audit validate: no family runs with cache(s) {', '.join(cfg.caches)}: "
                       + "; ".join(f"{e}: {', '.join(c)}" for e, c in FAMILIES.items()))
    if cfg.runs_from is not None:
        src = Path(cfg.runs_from)
        if not src.is_dir():
            raise BadInput(f"--runs-from {cfg.runs_from}: no such folder")
        if not any(src.glob("*/engine.json")):
            raise BadInput(f"--runs-from {cfg.runs_from}: no run in it (no <engine>-<cache>-<dtype>/engine.json)")
        check_saved_runs(src, cfg)
    if cfg.out is not None and not str(cfg.out).strip():
        raise BadInput("--out '': an empty path would silently mean the current folder; name a folder")


def check_saved_runs(src: Path, cfg: ValidateConfig) -> None:
    """Raise :class:`BadInput` before anything is written: none of the runs asked for is in ``src``, or
    one that is cannot be audited (an ``engine.json`` that does not parse, no ``recording.csv.gz``),
    naming the file."""
    from ..audit.families import DTYPES, pairs
    from ..audit.validate import saved_run

    asked = [f"{e}-{c}-{d}" for e, c in pairs(cfg.engines, cfg.caches) for d in (cfg.dtypes or DTYPES)]
    have = [n for n in asked if (src / n / "engine.json").is_file()]
    if not have:
        raise BadInput(f"--runs-from {src}: none of the runs asked for is in it (asked: {', '.join(asked[:6])}"
                       f"{', …' if len(asked) > 6 else ''}; it holds: "
                       f"{', '.join(sorted(p.parent.name for p in src.glob('*/engine.json'))[:6])})")
    for n in have:
        r = saved_run(src / n)
        if not r.get("recording"):
            raise BadInput(f"--runs-from {src}: {src / n / 'recording.csv.gz'} is missing: the run cannot be audited")


def run(cfg: ValidateConfig, backend=None, console=None) -> JobResult:
    """Run :func:`ds4lab.audit.validate.validate` in its result folder; writes ``validate.csv``, each
    engine and cache's audit under ``<engine>-<cache>/audit/`` and ``meta.json``. Returns the
    :class:`~ds4lab.jobs.result.JobResult` (table ``validate``).

    Raises:
        BadInput: :func:`check_config`'s, or torch/transformers/a GPU missing (naming what).
        ds4lab.errors.CheckFailed: a verdict that disagrees with torch.cuda.graph, or a predicted replay
            time outside the tolerance, after writing everything.
    """
    from ..audit.engines import CACHES, ENGINES, TOKEN_RANGE, available
    from ..audit.families import DTYPES, pairs
    from ..audit.validate import TIME_TOLERANCE, markdown, validate
    from ..errors import CheckFailed

    check_config(cfg)
    if cfg.runs_from is None:
        ok, why = available()
        if not ok:
            raise BadInput(f"ds4lab audit validate: {why}")
    elif cfg.out is not None and Path(cfg.out).resolve() == Path(cfg.runs_from).resolve():
        raise BadInput(f"--out {cfg.out} is --runs-from's folder: the runs it holds would be replaced; name another")
    out, ran = out_folder(cfg.out, "audit-validate", (),
                          {"engines": list(cfg.engines or ENGINES), "caches": list(cfg.caches or CACHES)})
    meta = {**_meta(AuditConfig(files=("validate",))), "job": "audit-validate",
            "inputs": str(cfg.runs_from) if cfg.runs_from is not None else None,
            "runs": [list(p) for p in pairs(cfg.engines, cfg.caches)], "dtypes": list(cfg.dtypes or DTYPES),
            "time_tolerance": TIME_TOLERANCE}
    meta["token_range"] = TOKEN_RANGE  # every run's tokens are its NVTX ranges
    say = console.print if console is not None else print
    with result_folder("audit-validate", out, meta, ("validate.csv", "validate.md"), ran=ran) as o:
        import pandas as pd

        from .audit import write_audit

        def write(rows):  # after every run: a run cut short keeps what it measured
            df = pd.DataFrame(rows)
            o.table("validate", df)
            o.text("validate.md", markdown(df))

        df = validate(cfg.engines, cfg.caches, o.folder, dtypes=cfg.dtypes or DTYPES, say=say, on_row=write,
                      on_report=lambda rep, under: write_audit(o, [rep], under),
                      runs_from=Path(cfg.runs_from) if cfg.runs_from is not None else None)
        if df.empty:
            raise BadInput(f"--runs-from {cfg.runs_from}: none of the runs asked for is in it")
        write(df.to_dict("records"))
        meta["audited"] = [f"{r.family}-{r.cache}-{r.dtype}" for r in df.itertuples()]  # what ran (or was saved)
        meta["verdicts_agree"] = int(df.verdict_agrees.sum())
        meta["times_agree"] = int((df.time_agrees == True).sum())  # noqa: E712
        meta["verdicts_unknown"] = int(df.audit_verdict.astype(str).str.startswith("captures;").sum())
        bad = df[(~df.verdict_agrees) | (df.time_agrees == False)]  # noqa: E712
        say(f"wrote {o.where('validate.csv')}: {len(df) - len(bad)} of {len(df)} runs agree")
        if len(bad):
            raise CheckFailed("the audit disagrees with torch.cuda.graph on " + "; ".join(
                f"{r.family}/{r.cache}/{r.dtype} (torch {r.torch_outcome or 'failed'}, audit {r.audit_verdict or '-'}"
                + (f", time ×{r.predicted_over_measured:.2f}" if r.predicted_over_measured else "") + ")"
                for r in bad.itertuples()))
    return o.done()
