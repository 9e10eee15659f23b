"""``ds4lab ds4``'s measurement: ds4 built from its source, its decode token timed per configuration and context (one
worker process each, :mod:`ds4lab.ds4.worker`, paired by position), recorded with CUPTI, and read into ds4lab's
tables. The files a run writes: ``docs/ds4.md``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import readout as R
from .configs import REFERENCE, VARIANTS

#: Configuration pairs whose per-position difference ``gains.csv`` holds (base, other: the gain of other).
GAINS = (("islands-off", "islands-on"), ("islands-on", "moe-profile"), ("islands-on", "moe-graph"),
         ("islands-off", "stage-0"), ("stage-0", "stage-i"), ("stage-0", "stage-3u"), ("stage-i", "stage-3u"),
         ("stage-0", "stage-3"), ("stage-i", "stage-3"), ("stage-3u", "stage-3"))


@dataclass(frozen=True)
class MeasurePlan:
    """What one ``ds4lab ds4`` run measures (every field in ``meta.json``). ``library``: ds4 as it ships;
    ``rewritten_library``: ds4 with ds4lab's stage 0 (the ``stage-*`` configurations but ``stage-3``; ``""`` if none);
    ``stage3_library``: ds4 with ds4lab's stage 3 (``stage-3``; ``""`` if none)."""

    library: str
    model: str
    configs: tuple
    contexts: tuple
    warmup: int
    tokens: int
    trace_contexts: tuple
    trace_tokens: int
    seed: int
    threads: int
    copy_model: bool
    rewritten_library: str = ""
    stage3_library: str = ""

    def library_of(self, variant: str) -> str:
        """The library ``variant`` runs (its :attr:`~ds4lab.ds4.configs.Ds4Variant.build`)."""
        return {"rewritten": self.rewritten_library, "rewritten-3": self.stage3_library}.get(
            VARIANTS[variant].build, self.library)


#: The configurations whose tokens are recorded with CUPTI at ``trace_contexts`` (the MoE profile's too:
#: ``ds4lab audit`` of it against what ds4's log says its island 1 did).
RECORDED = ("islands-off", "islands-on", "moe-profile", "stage-0", "stage-i", "stage-3u", "stage-3")


def worker_env(variant: str, copy_model: bool, base=None) -> dict:
    """The environment of ``variant``'s worker: ``base`` (default ``os.environ``) without the caller's ``DS4_*``
    switches, plus the variant's own and, with ``copy_model``, ``DS4_CUDA_COPY_MODEL=1``."""
    env = {k: v for k, v in (base if base is not None else os.environ).items() if not k.startswith("DS4_")}
    env.update(VARIANTS[variant].environ)
    if copy_model:
        env["DS4_CUDA_COPY_MODEL"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if not env.get("NVTX_INJECTION64_PATH"):  # NVTX reaches CUPTI only when injected at process start
        from ..trace.cupti import cupti_library

        lib = cupti_library()
        if lib is not None:
            env["NVTX_INJECTION64_PATH"] = str(lib)
    return env


def run_variant(plan: MeasurePlan, variant: str, folder: Path, say=print, progress=None) -> dict:
    """Run ``variant``'s worker into ``folder/worker-<variant>``, ds4's stderr into ``folder/ds4-<variant>.log``.
    Returns the worker's ``worker.json`` (or, when it failed, a dict with ``failed`` naming the exit status and the
    log's last lines)."""
    wdir = folder / f"worker-{variant}"
    wdir.mkdir(parents=True, exist_ok=True)
    spec = {"library": plan.library_of(variant), "model": plan.model, "config": variant,
            "capture": VARIANTS[variant].capture, "contexts": list(plan.contexts),
            "warmup": plan.warmup, "tokens": plan.tokens,
            "trace_contexts": list(plan.trace_contexts) if variant in RECORDED else [],
            "trace_tokens": plan.trace_tokens, "seed": plan.seed, "threads": plan.threads,
            "resident": plan.copy_model, "out": str(wdir)}
    (wdir / "plan.json").write_text(json.dumps(spec, indent=2))
    log = folder / f"ds4-{variant}.log"
    t0 = time.monotonic()
    with open(log, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "ds4lab.ds4.worker", str(wdir / "plan.json")],
                             stdout=subprocess.PIPE, stderr=err, text=True,
                             env=worker_env(variant, plan.copy_model))
        try:
            for line in p.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if progress:
                    progress(ev)
                say(_describe(ev))
            rc = p.wait()
        except BaseException:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    info_path = wdir / "worker.json"
    if rc == 0 and info_path.exists():
        info = json.loads(info_path.read_text())
    else:
        tail = log.read_text(errors="replace").strip().splitlines()[-8:]
        info = {"config": variant, "failed": f"exit {rc}", "log_tail": tail}
        say(f"  {variant}: worker failed (exit {rc}); ds4's last lines:\n    " + "\n    ".join(tail))
    info["wall_seconds"] = round(time.monotonic() - t0, 1)
    return info


def _describe(ev: dict) -> str:
    e = ev.get("event")
    c = ev.get("config", "")
    if e == "opened":
        return (f"  {c}: ds4 opened the model in {ev['open_seconds']} s ({ev['layer_count']} layers, vocabulary "
                f"{ev['vocab_size']}, {ev['routed_quant_bits']}-bit routed experts)")
    if e == "prefilled":
        return f"  {c}: prefill to {ev['context']} ({ev['tokens']} tokens) {ev['seconds']} s"
    if e == "timed":
        return f"  {c}: {ev['tokens']} decode tokens timed at context {ev['context']}"
    if e == "traced":
        return f"  {c}: recorded tokens at context {ev['context']}: {ev.get('recording') or ev.get('why')}"
    return f"  {c}: {e}"


def collect(folder: Path, configs, random_expert_layers=()) -> dict:
    """Read every worker's files in ``folder`` into the job's tables and write them (the files ``docs/ds4.md``
    lists; with ``random_expert_layers`` also ``expert-data.csv``, :func:`ds4lab.ds4.readout.expert_data_check`).
    Returns the tables by name. Works on a folder copied from the GPU machine."""
    folder = Path(folder)
    tokens, prefill, census, logs, data, capture, capture_args = [], [], [], {}, [], [], []
    for v in configs:
        w = folder / f"worker-{v}"
        if (w / "tokens.csv").exists():
            tokens.append(pd.read_csv(w / "tokens.csv"))
        if (w / "prefill.csv").exists():
            prefill.append(pd.read_csv(w / "prefill.csv"))
        if (w / "capture.csv").exists():
            capture.append(pd.read_csv(w / "capture.csv", keep_default_na=False))
        if (w / "capture-args.csv").exists() and (w / "capture-args.csv").stat().st_size > 0:
            capture_args.append(pd.read_csv(w / "capture-args.csv"))
        logs[v] = R.read_log(folder / f"ds4-{v}.log")
        for rec in sorted(w.glob("trace-*/recording.csv.gz")):
            from ..trace.sources import read_events as read_trace

            table = read_trace(rec)
            try:
                per_tok, per_kernel = R.trace_census(table.frame)
            except ValueError as e:  # one unreadable recording costs its own tables, not the run's
                print(f"  {rec}: no census: {e}", file=sys.stderr)
                continue
            ctx = int(rec.parent.name.split("-", 1)[1])
            per_kernel.to_csv(folder / f"kernels-{v}-{ctx}.csv", index=False)
            census.append(per_tok.assign(config=v, context=ctx))
            if random_expert_layers:
                data.append(R.expert_data_check(table.frame, random_expert_layers).assign(config=v, context=ctx))
    out = {}

    def put(key: str, name: str, frames) -> None:  # concatenated, kept, and written as it is named
        if frames:
            out[key] = pd.concat(frames, ignore_index=True)
            out[key].to_csv(folder / name, index=False)

    put("tokens", "tokens.csv", tokens)
    if tokens:
        t = out["tokens"]
        put("summary", "summary.csv", [R.summarize_tokens(t)])
        put("gains", "gains.csv", [R.paired_gain(t, base, other) for base, other in GAINS
                                   if {base, other} <= set(t.config)])
        ex = R.exactness(folder, [c for c in configs if c != REFERENCE], REFERENCE)
        if not len(ex) and (folder / "exact.csv").exists():  # the logits were removed once compared
            ex = pd.read_csv(folder / "exact.csv")
        put("exact", "exact.csv", [ex] if len(ex) else [])
    put("prefill", "prefill.csv", prefill)
    put("census", "census.csv", census)
    put("capture", "capture.csv", capture)
    put("capture_args", "capture-args.csv", capture_args)
    if "summary" in out and any(VARIANTS[c].stage for c in configs if c in VARIANTS):
        from .ladder import ladder_table

        put("ladder", "ladder.csv", [ladder_table(out)])
    put("expert_data", "expert-data.csv", data)
    put("islands", "islands.csv", [R.island_table(logs)])
    return out
