"""What ``torch.cuda.graph`` did with decode steps the audit reads: the recordings bundled with ds4lab
(:data:`RECORDED`, recorded on an H200 with their outcome beside them), a recording's outcome beside it
(:func:`outcome_beside`), and the live run notebook 05 makes (:func:`run_isolated`). Sources: PyTorch
``torch.cuda.graph``; transformers ``DynamicCache``, ``StaticCache``; CUDA Programming Guide, "CUDA Graphs"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The transformers engines of ds4lab's step scripts (``ds4lab/data/steps/ds4lab-<engine>.py``).
ENGINES = ("llama", "deepseek-v3", "qwen2-moe")
CACHES = ("dynamic", "static")
#: The NVTX range the bundled recordings and ds4lab's step scripts mark each decode step with.
TOKEN_RANGE = "decode_step"


def run_isolated(engine: str, cache_kind: str, out: Path, *, dtype: str = "float32") -> dict:
    """Record ``ds4lab/data/steps/ds4lab-<engine>.py`` as a user's script (:func:`ds4lab.audit.steps.run_step`); returns
    its ``engine.json`` fields (``error`` where a part failed), files in ``out/ds4lab-<engine>-<cache>-<dtype>/``."""
    from .steps import run_step, steps_folder

    script = steps_folder() / f"ds4lab-{engine}.py"
    if not script.is_file():
        return {"engine": engine, "cache": cache_kind, "dtype": dtype, "outcome": "",
                "error": f"no step script {script.name} in {script.parent}"}
    return run_step(script, f"ds4lab-{engine}", cache_kind, dtype, Path(out), say=lambda *a, **k: None)


#: The decode loops bundled with ds4lab (``ds4lab/data/audit/torch-<engine>-<cache>.csv.gz``): recordings
#: of ds4lab's in-process engine runs on an H200, trimmed to their decode steps, for auditing without a GPU. Their
#: torch.cuda.graph outcomes beside them (recorded_outcome); the runs: docs/measurements/h200-2026-12-01/round2.
RECORDED = (("llama", "static"), ("llama", "dynamic"), ("deepseek-v3", "static"))


def recorded(engine: str, cache_kind: str) -> Path:
    """The bundled ``.csv.gz`` of ``engine``/``cache_kind``; ValueError for a pair not bundled (naming those)."""
    from importlib.resources import files

    if (engine, cache_kind) not in RECORDED:
        raise ValueError(f"no bundled recording of {engine!r} with a {cache_kind!r} cache; bundled: "
                         + ", ".join(f"{e}/{c}" for e, c in RECORDED))
    return Path(str(files("ds4lab") / "data" / "audit" / f"torch-{engine}-{cache_kind}.csv.gz"))


def recorded_outcome(engine: str, cache_kind: str) -> dict:
    """What torch.cuda.graph did with the bundled pair on the GPU that recorded it (``outcome``, ``detail``,
    ``eager_us``, ``replay_us``, ``device``). Raises ValueError: a pair not bundled."""
    import json

    return json.loads(recorded(engine, cache_kind).with_name(f"torch-{engine}-{cache_kind}.json").read_text())


def outcome_beside(recording: Path) -> dict | None:
    """The run's fields where an outcome (``<stem>.json``, ``engine.json``) sits beside ``recording``, else None."""
    import json

    recording = Path(recording)
    stem = recording.name.split(".", 1)[0]
    for name in (f"{stem}.json", "engine.json"):
        p = recording.with_name(name)
        if p == recording or not p.is_file():
            continue
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and "outcome" in d:
            return d
    return None


def available() -> tuple[bool, str]:
    """Whether torch (with a GPU) and transformers are importable here, and why not."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        return False, f"{e.name or e} is not installed (ds4lab audit validate needs torch and transformers)"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA GPU"
    return True, ""


@dataclass
class AuditSource:
    """The trace :func:`audit_source` chose: ``trace``, ``kind`` (``own``, ``live``, ``bundled``), ``torch_run`` (None
    for ``own``), ``note`` (which trace and where it was recorded)."""

    trace: Path
    kind: str
    torch_run: dict | None
    note: str


def audit_source(backend: str = "auto", engine: str = "llama", cache_kind: str = "dynamic", trace=None,
                 record_into: Path | None = None) -> AuditSource:
    """What notebook 05 audits: ``trace`` when given; else ``engine``/``cache_kind`` recorded live into
    ``record_into`` where ``backend`` is ``cupy``, or ``auto`` with a GPU; else the bundled recording. Raises
    ValueError: an unknown backend; ``cupy`` where no live recording can be made (why); a failed live recording (its
    last lines); no ``record_into`` for a live one; a pair not bundled."""
    if backend not in ("auto", "cupy", "sim"):
        raise ValueError(f"backend {backend!r}: choose auto (live where torch sees a GPU, else the bundled recording), "
                         "cupy (live) or sim (the bundled recording)")
    if trace is not None:
        return AuditSource(Path(trace), "own", None, f"auditing {trace}")
    live_ok, why = available()
    if backend == "cupy" and not live_ok:
        raise ValueError(f"backend 'cupy' records {engine}/{cache_kind} live, but {why}")
    if backend == "cupy" or (backend == "auto" and live_ok):
        if record_into is None:
            raise ValueError("a live recording needs a folder to record into (record_into)")
        run = run_isolated(engine, cache_kind, Path(record_into))
        if run.get("error"):
            raise ValueError(f"{engine}/{cache_kind}: the live recording failed: {run['error']}")
        dev = run.get("device") or {}
        return AuditSource(Path(run["recording"]), "live", run,
                           f"recorded {engine} with a {cache_kind} cache on {dev.get('device', 'this GPU')} (measured)")
    run = recorded_outcome(engine, cache_kind)
    dev, cfg = run.get("device") or {}, run.get("config") or {}
    note = (f"the bundled recording of {engine} with a {cache_kind} cache, recorded on {dev.get('device', 'an H200')} "
            f"(driver {dev.get('driver', '?')}, torch {cfg.get('torch', '?')})")
    if backend == "auto":
        note += f"; live recording off: {why}"
    return AuditSource(recorded(engine, cache_kind), "bundled", run, note)


__all__ = ["AuditSource", "CACHES", "ENGINES", "RECORDED", "TOKEN_RANGE", "audit_source", "available", "outcome_beside",
           "recorded", "recorded_outcome", "run_isolated"]
