"""``ds4lab audit validate``: the audit held to what ``torch.cuda.graph`` does with decode steps run as a user runs
them (:mod:`ds4lab.audit.validate`). Needs a GPU, PyTorch and cupti-python; ``--runs-from`` audits saved runs on the
CPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from .audit import AuditConfig, _meta
from .common import out_folder
from .result import JobResult, result_folder


DTYPES = ("float32", "bfloat16")


@dataclass
class ValidateConfig:
    """What ``ds4lab audit validate`` does: ``families``/``caches`` of the steps folder (empty: all), ``dtypes``
    (empty: float32 and bfloat16), ``steps`` (None: ``ds4lab/data/steps``), ``out``."""

    engines: tuple = ()
    caches: tuple = ()
    out: Path | str | None = None
    dtypes: tuple = ()
    #: audit the runs a finished ``audit validate`` saved in this folder (no GPU) instead of running them
    runs_from: Path | str | None = None
    #: the folder of family scripts (:mod:`ds4lab.audit.steps`); None: the one shipped with ds4lab
    steps: Path | str | None = None
    #: measure the argument capture's cost per launch in each run (beside check_replay)
    capture_cost: bool = True


def check_config(cfg: ValidateConfig) -> None:
    """Raise :class:`BadInput` naming an unknown dtype, a steps folder without scripts, an empty ``out``, or a
    ``runs_from`` folder without the runs asked for or not auditable."""
    bad = [d for d in cfg.dtypes if d not in DTYPES]
    if bad:
        raise BadInput(f"audit validate: unknown dtype {', '.join(bad)}; dtypes: {', '.join(DTYPES)}")
    if cfg.runs_from is not None:
        src = Path(cfg.runs_from)
        if not src.is_dir():
            raise BadInput(f"--runs-from {cfg.runs_from}: no such folder")
        if not any(src.glob("*/engine.json")):
            raise BadInput(f"--runs-from {cfg.runs_from}: no run in it (no <family>-<cache>-<dtype>/engine.json)")
        check_saved_runs(src, cfg)
    else:
        from ..audit.steps import discover

        discover(cfg.steps)
    if cfg.out is not None and not str(cfg.out).strip():
        raise BadInput("--out '': an empty path would silently mean the current folder; name a folder")


def check_saved_runs(src: Path, cfg: ValidateConfig) -> None:
    """Raise :class:`BadInput` before anything is written: none of the runs asked for is in ``src``, or one that is
    cannot be audited (an ``engine.json`` that does not parse, no ``recording.csv.gz``), naming the file."""
    import json

    from ..audit.validate import runs, saved_run

    for f in sorted(src.glob("*/engine.json")):  # a file that does not parse is named, never skipped
        try:
            json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise BadInput(f"{f}: not a run's engine.json ({type(e).__name__}: {e})") from None
    have = runs(cfg.engines, cfg.caches, cfg.dtypes or DTYPES, runs_from=src)
    if not have:
        asked = ", ".join([*cfg.engines, *cfg.caches, *cfg.dtypes]) or "everything"
        raise BadInput(f"--runs-from {src}: none of the runs asked for is in it (asked: {asked}; it holds: "
                       f"{', '.join(sorted(p.parent.name for p in src.glob('*/engine.json'))[:6])})")
    for _, _, _, saved, folder in have:
        if not saved().get("recording"):
            raise BadInput(f"--runs-from {src}: {Path(folder) / 'recording.csv.gz'} is missing: the run cannot be "
                           "audited")


def run(cfg: ValidateConfig, backend=None, console=None) -> JobResult:
    """Run :func:`ds4lab.audit.validate.validate` in its result folder (``validate.csv``, each run's ``audit/``,
    ``meta.json``). Returns the :class:`~ds4lab.jobs.result.JobResult` (table ``validate``).

    Raises:
        BadInput: :func:`check_config`'s, or torch/transformers/a GPU missing (naming what).
        ds4lab.errors.CheckFailed: after writing everything, a run that fails
            (:func:`ds4lab.audit.validate.failures`)."""
    from ..audit.engines import available
    from ..audit.validate import TIME_TOLERANCE, failures, markdown, validate
    from ..errors import CheckFailed

    check_config(cfg)
    if cfg.runs_from is None:
        ok, why = available()
        if not ok:
            raise BadInput(f"ds4lab audit validate: {why}")
    elif cfg.out is not None and Path(cfg.out).resolve() == Path(cfg.runs_from).resolve():
        raise BadInput(f"--out {cfg.out} is --runs-from's folder: the runs it holds would be replaced; name another")
    out, ran = out_folder(cfg.out, "audit-validate", (),
                          {"engines": list(cfg.engines), "caches": list(cfg.caches)})
    meta = {**_meta(AuditConfig(files=("validate",))), "job": "audit-validate",
            "inputs": str(cfg.runs_from) if cfg.runs_from is not None else None,
            "asked": [*cfg.engines, *cfg.caches], "dtypes": list(cfg.dtypes or DTYPES),
            "steps": str(cfg.steps) if cfg.steps is not None else "ds4lab/data/steps",
            "time_tolerance": TIME_TOLERANCE}
    meta["token_range"] = None  # every run's tokens are found as a user's are: the step's own NVTX range
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
                      runs_from=Path(cfg.runs_from) if cfg.runs_from is not None else None, steps=cfg.steps,
                      capture_cost=cfg.capture_cost)
        if df.empty:
            raise BadInput(f"--runs-from {cfg.runs_from}: none of the runs asked for is in it")
        write(df.to_dict("records"))
        meta["audited"] = [f"{r.family}-{r.cache}-{r.dtype}" for r in df.itertuples()]  # what ran (or was saved)
        meta["verdicts_agree"] = int(df.verdict_agrees.sum())
        meta["times_agree"] = int((df.time_agrees == True).sum())  # noqa: E712
        meta["verdicts_unknown"] = int(df.audit_verdict.astype(str).str.startswith("captures;").sum())
        meta["cause_first"] = int((df.get("cause_first") == True).sum())  # noqa: E712
        meta["frozen_on_right"] = int((df.get("frozen_on_right") == True).sum())  # noqa: E712
        meta["check_agrees"] = int((df.get("check_agrees") == True).sum())  # noqa: E712
        bad = failures(df)
        say(f"wrote {o.where('validate.csv')}: {len(df) - len(bad)} of {len(df)} runs agree")
        if len(bad):
            raise CheckFailed("the audit disagrees with torch.cuda.graph on " + "; ".join(
                f"{r.family}/{r.cache}/{r.dtype} (torch {r.torch_outcome or 'failed'}, audit {r.audit_verdict or '-'}"
                + (f", time ×{r.predicted_over_measured:.2f}" if r.predicted_over_measured else "")
                + (" not held" if r.predicted_over_measured and getattr(r, "time_note", "") else "")
                + (", frozen findings on a step that replays right" if getattr(r, "frozen_on_right", False) is True
                   else "")
                + (", not led by its true cause" if getattr(r, "cause_first", None) is False else "")
                + (f", check_replay {r.check_outcome or 'failed'}" if getattr(r, "check_agrees", None) is False
                   else "") + ")"
                for r in bad.itertuples()))
    return o.done()
