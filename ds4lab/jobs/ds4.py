"""``ds4lab ds4``: the real engine as a backend of the workbench. Build ds4 from a checkout (cached by commit and
architecture), write (or reuse) a Flash-shaped synthetic model, run its decode token per configuration and context,
and write ds4lab's tables (:mod:`ds4lab.ds4.measure`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..ds4.configs import DEFAULT_CONFIGS, VARIANTS, parse_configs, parse_stages
from ..report import results
from .result import JobResult
from .common import BadInput, check_out_option, out_folder

#: What the job writes in its folder.
DS4_OUTPUTS = ("tokens.csv", "summary.csv", "gains.csv", "islands.csv", "prefill.csv", "census.csv", "kernels-*.csv",
               "expert-data.csv", "audit-*", "exact.csv", "capture.csv", "capture-args.csv", "ladder.csv",
               "rewrite-sites.csv", "rewrite-sites-3.csv", "ds4-*.log", "worker-*", "build.json", "build-rewritten.json",
               "build-rewritten-3.json")

#: ds4lab's default contexts: those of ``ds4lab context``, so the two tables sit side by side.
DEFAULT_CONTEXTS = (1024, 4096, 16384, 65536)


@dataclass
class Ds4JobConfig:
    """Arguments of ``ds4lab ds4``.

    ``source``: a ds4 checkout (folder or .tar.gz; required). ``model``: a GGUF (None: the synthetic Flash-shaped
    model, cached). ``configs``: :data:`ds4lab.ds4.configs.VARIANTS` names (None: ``DEFAULT_CONFIGS``, or none beyond
    ``stages``'). ``stages``: rungs of ds4's capture ladder (:func:`ds4lab.ds4.configs.parse_stages`).
    ``host_march``: ``-march`` of ds4's host code. ``keep_logits``: keep ``logits-*.npy`` (0.5 MB a token).
    ``contexts``: ascending positions, spaced as :func:`ds4lab.ds4.worker.tokens_per_context` needs.
    ``trace_contexts``: contexts where ``trace_tokens`` tokens are recorded with CUPTI. ``arch``: None for the GPU's
    own. ``copy_model``: ``DS4_CUDA_COPY_MODEL=1``."""

    source: str | Path | None = None
    model: str | Path | None = None
    configs: tuple | str | None = None
    stages: tuple | str | None = None
    host_march: str = "native"
    keep_logits: bool = False
    #: audit each recording (``ds4lab audit``) in the job; False leaves it to a later ``ds4lab audit`` of
    #: ``worker-*/trace-*/recording.csv.gz`` (CPU work that need not spend GPU-machine time)
    audit: bool = True
    #: never run ds4's make: use the cached builds (carried from another machine) or stop
    no_build: bool = False
    contexts: tuple = DEFAULT_CONTEXTS
    warmup: int = 4
    tokens: int = 32
    trace_contexts: tuple = (1024,)
    trace_tokens: int = 4
    seed: int = 0
    threads: int = 0
    arch: str | None = None
    jobs: int | None = None
    copy_model: bool = True
    #: layers of the synthetic model whose routed experts are random blocks, not holes (about 1.8 GB
    #: each), so the recording can tell whether ds4's expert kernels run faster on zeros
    random_expert_layers: tuple = (21,)
    cache: str | Path | None = None
    out: Path | str | None = None
    extra: dict = field(default_factory=dict)


def check_config(cfg: Ds4JobConfig) -> None:
    """Checks that need no GPU. Raises :class:`BadInput` naming the bad value."""
    from ..ds4.source import locate

    if cfg.source is None:
        raise BadInput("ds4lab ds4 needs --source PATH: a ds4 checkout (folder or .tar.gz)")
    locate(cfg.source)
    if isinstance(cfg.configs, str):
        cfg.configs = parse_configs(cfg.configs)
    if cfg.stages is not None:
        ladder = parse_stages(cfg.stages if isinstance(cfg.stages, str) else ",".join(cfg.stages))
        cfg.configs = tuple(dict.fromkeys(ladder + tuple(cfg.configs or ())))
    elif cfg.configs is None:
        cfg.configs = DEFAULT_CONFIGS
    import re

    if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(cfg.host_march)):
        raise BadInput(f"--host-march {cfg.host_march!r}: give a -march value such as native or x86-64-v3")
    for name in cfg.configs:
        if name not in VARIANTS:
            raise BadInput(f"--configs: unknown {name}; choose from {', '.join(VARIANTS)}")
    from .context import parse_contexts

    from ..token.config import get_preset

    ctx = tuple(parse_contexts(cfg.contexts))  # empty items, repeats, order: as ds4lab context refuses them
    cfg.contexts = ctx
    limit = get_preset("ds4-flash", long_context=True).max_context  # the longest context ds4lab models
    if ctx[-1] > limit:
        raise BadInput(f"--contexts: {ctx[-1]} is past {limit}, the longest context ds4lab asks ds4 for "
                       "(ds4-flash's max_context in ds4lab's presets)")
    from ..ds4.worker import tokens_per_context

    per = tokens_per_context(cfg.warmup, cfg.tokens, cfg.trace_tokens, traced=True)
    close = [f"{a}→{b}" for a, b in zip(ctx, ctx[1:]) if b - a <= per]
    if close:
        raise BadInput(f"--contexts: {', '.join(close)} lie within warmup + tokens + 2 × trace tokens ({per}) of "
                       "each other; space them further apart")
    bad = [c for c in cfg.trace_contexts if int(c) not in ctx]
    if bad:
        raise BadInput(f"--trace-contexts {','.join(map(str, bad))}: not among --contexts")
    if cfg.tokens < 2:
        raise BadInput(f"--tokens {cfg.tokens}: time at least 2 decode tokens per context")
    for name, low in (("warmup", 0), ("trace_tokens", 0), ("jobs", 1)):
        v = getattr(cfg, name)
        if v is not None and v < low:
            raise BadInput(f"--{name.replace('_', '-')} {v}: must be at least {low}")
    bad = [x for x in cfg.random_expert_layers if not 0 <= int(x) < 43]
    if bad:
        raise BadInput(f"--random-expert-layers {','.join(map(str, bad))}: ds4-flash has layers 0..42")
    if cfg.model is not None:
        if not Path(cfg.model).is_file():
            raise BadInput(f"--model {cfg.model}: no such file")
        with open(cfg.model, "rb") as f:
            if f.read(4) != b"GGUF":
                raise BadInput(f"--model {cfg.model}: not a GGUF file (it does not start with the GGUF magic)")
    check_out_option(cfg.out)


def _gpu_info() -> dict:
    import subprocess

    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.free",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
        name, driver, total, free = [x.strip() for x in p.stdout.strip().splitlines()[0].split(",")]
        return {"gpu": name, "driver": driver, "gpu_memory_mib": int(total), "gpu_free_mib": int(free)}
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return {}


def model_for(cfg: Ds4JobConfig, cache: Path, say=print):
    """``(path, info)`` of the GGUF ds4 runs: ``cfg.model``, or the synthetic model in ``cache``, written once and
    reused while ds4lab's tensor plan is the same (its name carries the plan's digest)."""
    import hashlib
    import json

    if cfg.model is not None:
        return Path(cfg.model), {"model": str(cfg.model), "synthetic": False}
    from ..ds4 import gguf_model, gguf_writer

    plan = hashlib.sha256(Path(gguf_model.__file__).read_bytes() + Path(gguf_writer.__file__).read_bytes())
    rl = "-".join(str(int(x)) for x in cfg.random_expert_layers) or "none"
    path = Path(cache) / f"model-ds4-flash-seed{cfg.seed}-rl{rl}-{plan.hexdigest()[:12]}.gguf"
    side = path.with_suffix(".json")
    if path.is_file() and side.is_file() and gguf_writer.read_marker(path) is not None:
        info = json.loads(side.read_text())
        say(f"synthetic model: cached ({path}, {info['apparent_bytes'] / 2**30:.1f} GiB, "
            f"{info['written_bytes'] / 2**30:.1f} GiB written)")
        return path, info
    path.parent.mkdir(parents=True, exist_ok=True)
    say(f"synthetic model: writing {path} (a sparse file: the routed experts are holes)")
    m = gguf_writer.write_synthetic_model(path, preset="ds4-flash", seed=cfg.seed,
                                          random_expert_layers=tuple(int(x) for x in cfg.random_expert_layers))
    info = {k: (str(v) if isinstance(v, Path) else v) for k, v in m.__dict__.items()}
    info.update(synthetic=True, model=str(path), routed_quant_bits=2,
                random_expert_layers=[int(x) for x in cfg.random_expert_layers])
    side.write_text(json.dumps(info, indent=2))
    say(f"synthetic model: {m.apparent_bytes / 2**30:.1f} GiB, {m.written_bytes / 2**30:.1f} GiB written in "
        f"{m.seconds:.0f} s")
    return path, info


def run(cfg: Ds4JobConfig, be=None, console=None) -> JobResult:
    """Build ds4, then measure every configuration (:mod:`ds4lab.ds4.measure`); returns the tables and the meta.

    Raises:
        BadInput: no GPU, a bad checkout, too little GPU memory for the model.
        BuildError: ds4 did not build (its compiler output kept, named)."""
    from ..ds4 import build as B
    from ..ds4 import measure as M
    from ..ds4.source import locate

    say = console.print if console is not None else print
    check_config(cfg)
    found = B.gpu_arch()  # BadInput without a GPU, --arch given or not: before any work
    arch = cfg.arch or found
    gpu = _gpu_info()
    src = locate(cfg.source)
    # the result folder is checked (a file, a folder ds4lab did not write) before minutes of build
    # and model; the default is one per ds4 commit (results/ds4-<commit>), and a rerun that ran other
    # configurations or contexts keeps the earlier results beside it (results.job_folder)
    out, ran = out_folder(cfg.out, "ds4", (src.commit[:12] or src.digest,),
                          {"configs": list(cfg.configs), "contexts": list(cfg.contexts), "source": src.digest})
    cache = Path(cfg.cache) if cfg.cache else B.cache_root()
    builds = {VARIANTS[v].build for v in cfg.configs}
    bld = B.build(src, B.build_plan(arch, jobs=cfg.jobs, host_march=cfg.host_march), cache=cache, say=say,
                  cached_only=cfg.no_build)
    rw = (B.build(src, B.build_plan(arch, jobs=cfg.jobs, host_march=cfg.host_march, rewrite=True), cache=cache,
                  say=say, cached_only=cfg.no_build) if "rewritten" in builds else None)
    rw3 = (B.build(src, B.build_plan(arch, jobs=cfg.jobs, host_march=cfg.host_march, rewrite=True,
                                     rewrite_stage="3"), cache=cache, say=say, cached_only=cfg.no_build)
           if "rewritten-3" in builds else None)
    for b, sites in ((rw, "rewrite-sites.csv"), (rw3, "rewrite-sites-3.csv")):
        if b is not None and b.info.get("rewrite", {}).get("unrouted"):
            say(f"[bold red]ds4lab's rewrite left sites unrouted[/] ({sites}): "
                + "; ".join(b.info["rewrite"]["unrouted"]))
    model, model_info = model_for(cfg, cache / "ds4", say=say)
    need_mib = Path(model).stat().st_size / 2**20
    if cfg.copy_model and gpu.get("gpu_free_mib") and need_mib > 0.97 * gpu["gpu_free_mib"]:
        raise BadInput(f"model {model} is {need_mib / 1024:.1f} GiB; the GPU has {gpu['gpu_free_mib'] / 1024:.1f} GiB "
                       "free (ds4 copies it whole with DS4_CUDA_COPY_MODEL=1): run with --no-copy-model")
    plan = M.MeasurePlan(str(bld.library), str(model), tuple(cfg.configs), tuple(int(c) for c in cfg.contexts),
                         cfg.warmup, cfg.tokens, tuple(int(c) for c in cfg.trace_contexts), cfg.trace_tokens,
                         cfg.seed, cfg.threads, cfg.copy_model, str(rw.library) if rw else "",
                         str(rw3.library) if rw3 else "")
    meta = _meta(src, arch, gpu, bld, rw, model_info, plan, cfg)
    meta["stage3_build"] = _build_meta(rw3)
    workers = {}
    with results.job_folder(out, meta, DS4_OUTPUTS, say=say, ran=ran) as folder:
        folder = Path(folder)
        shutil.copy(bld.folder / "build.json", folder / "build.json")
        if rw is not None:
            shutil.copy(rw.folder / "build.json", folder / "build-rewritten.json")
            shutil.copy(rw.folder / "rewrite-sites.csv", folder / "rewrite-sites.csv")
        if rw3 is not None:
            shutil.copy(rw3.folder / "build.json", folder / "build-rewritten-3.json")
            shutil.copy(rw3.folder / "rewrite-sites.csv", folder / "rewrite-sites-3.csv")
        say(f"[bold]ds4lab ds4[/] · {src.label} · {gpu.get('gpu', '?')} (driver {gpu.get('driver', '?')}) · "
            f"contexts {','.join(map(str, plan.contexts))} · {plan.tokens} tokens each")
        for v in plan.configs:
            if VARIANTS[v].expert_bits and model_info.get("routed_quant_bits") not in VARIANTS[v].expert_bits:
                say(f"  {v}: skipped: ds4 takes it for {VARIANTS[v].expert_bits}-bit routed experts only")
                workers[v] = {"config": v, "skipped": "format"}
                continue
            workers[v] = M.run_variant(plan, v, folder, say=say)
            meta["workers"] = workers
            ran_configs = [w for w in workers if "skipped" not in workers[w]]
            M.collect(folder, ran_configs, model_info.get("random_expert_layers", ()))  # the tables so far, written
        ran_configs = [w for w in workers if "skipped" not in workers[w]]
        tables = M.collect(folder, ran_configs, model_info.get("random_expert_layers", ()))
        meta["workers"] = workers
        meta["audits"] = audit_recordings(folder, ran_configs, say=say) if cfg.audit else "not run (--no-audit)"
        _report(tables, meta, folder, cfg, say)
    # the one result type (ds4lab.jobs.result): the tables collected and the meta (also as its value)
    return JobResult("ds4", meta, out=out, tables=dict(tables), value={"tables": tables, "meta": meta})


def _build_meta(b) -> dict | None:
    """What ``meta.json`` keeps of a rewritten build (``None``: not built)."""
    if b is None:
        return None
    return {k: b.info.get(k) for k in ("seconds", "flags_digest", "driver_digest", "library_bytes", "rewrite")} | {
        "cached": b.cached}


def _meta(src, arch: str, gpu: dict, bld, rw, model_info: dict, plan, cfg: Ds4JobConfig) -> dict:
    """The run's ``meta.json``: provenance, GPU, ds4's source and builds, the model, the plan, the configurations."""
    import platform
    import time

    from ..report import provenance

    return {"job": "ds4", "git_revision": provenance.git_revision(), "source_digest": provenance.source_digest(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), **gpu,
            "ds4_commit": src.commit, "ds4_source": str(src.path),
            "ds4_source_digest": src.digest, "arch": arch, "build": {k: bld.info.get(k) for k in
            ("seconds", "objects", "flags_digest", "driver_digest", "nvcc", "cc", "library_bytes")},
            "build_cached": bld.cached, "host_march": cfg.host_march,
            "rewritten_build": _build_meta(rw),
            "model": model_info, "plan": plan.__dict__, "measured": True,
            "configs": {n: {"env": VARIANTS[n].environ, "what": VARIANTS[n].what, "build": VARIANTS[n].build,
                            "capture": VARIANTS[n].capture, "stage": VARIANTS[n].stage} for n in cfg.configs}}


def _report(tables: dict, meta: dict, folder: Path, cfg: Ds4JobConfig, say) -> None:
    """The console's tables, the weights' placement checked against the plan, the logits dropped unless kept."""
    if "summary" in tables:
        say(tables["summary"].to_string(index=False))
    if "gains" in tables:
        say(tables["gains"].to_string(index=False))
    if "ladder" in tables:
        say("ds4's capture ladder (µs per token; gains paired by position, 95 % intervals):\n"
            + tables["ladder"][["context", "stage", "us_per_token", "gain_over_0_us", "gain_over_0_lo",
                                "gain_over_0_hi", "vs_shipped_us", "exact_tokens", "compared_tokens",
                                "graphs_per_token", "node_updates_per_token", "splits_per_token"]]
            .to_string(index=False))
    if "exact" in tables and not cfg.keep_logits:  # the comparison is kept; the 0.5 MB-a-token logits are not
        for f in folder.glob("worker-*/logits-*.npy"):
            f.unlink()
    say(tables["islands"].to_string(index=False))
    isl = tables["islands"]
    meta["weights"] = dict(zip(isl.config, isl.weights)) if "weights" in isl else {}
    astray = sorted(c for c, w in meta["weights"].items() if w != ("gpu-memory" if cfg.copy_model else "host-mapped"))
    if astray:  # the tokens stand, but they are not timed where they were asked to be
        say(f"[bold red]warning[/]: ds4's log does not say the weights are "
            f"{'in GPU memory' if cfg.copy_model else 'host-mapped'} for {', '.join(astray)} "
            f"(islands.csv, weights column)")
    if "expert_data" in tables and not tables["expert_data"].empty:
        say("per-layer kernels, random expert layers against holes (ratio > 1: zeros run faster):\n"
            + tables["expert_data"].head(8).to_string(index=False))


def audit_recordings(folder: Path, configs, say=print) -> dict:
    """``ds4lab audit`` of each configuration's recorded tokens into ``audit-<config>-<context>/``. Returns ``{folder
    name: "audited" or why not}`` (never fatal)."""
    from . import execute
    from .audit import AuditConfig

    done = {}
    for v in configs:
        for rec in sorted((Path(folder) / f"worker-{v}").glob("trace-*/recording.csv.gz")):
            name = f"audit-{v}-{rec.parent.name.split('-', 1)[1]}"
            try:
                execute("audit", AuditConfig(files=(str(rec),), token_range="decode_step", out=Path(folder) / name))
                done[name] = "audited"
            except Exception as e:  # noqa: BLE001 - an audit that cannot read a recording is reported, not fatal
                done[name] = f"not audited: {type(e).__name__}: {e}"
            say(f"  {name}: {done[name]}")
    return done
