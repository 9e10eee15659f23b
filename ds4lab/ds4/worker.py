"""One ds4 configuration in a process of its own (ds4 reads its switches once per process): ``python -m
ds4lab.ds4.worker PLAN.json``. Per context it prefills, runs untimed warm-up tokens, then timed decode tokens, keeping
each token's logits; the files it writes: ``docs/ds4.md``."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

TOKEN_FIELDS = ("config", "context", "index", "pos", "token", "gpu_us", "host_us", "argmax", "logits_sha")
#: Per timed token of a capturing configuration: what the driver's whole-token capture did
#: (:class:`ds4lab.ds4.engine.TokenStats`).
CAPTURE_FIELDS = ("config", "context", "index", "pos", "segments", "splits", "instantiated", "updated",
                  "update_refused", "nodes", "kernel_nodes", "nodes_changed", "kernels_shape",
                  "kernels_uncompared", "diffed_segments", "breaks", "replayed", "records", "moved", "slot_bytes")
PREFILL_FIELDS = ("config", "context", "from_pos", "tokens", "seconds")
#: Passes over ``trace_tokens`` decode tokens at a traced context (:func:`_trace`): the CUPTI recording,
#: then the kernel-argument recording, each on tokens of its own.
TRACE_PASSES = 2


def tokens_per_context(warmup: int, tokens: int, trace_tokens: int, traced: bool) -> int:
    """Decode tokens a worker evaluates after prefilling to one context: ``warmup`` untimed, ``tokens`` timed and, at a
    traced context, :data:`TRACE_PASSES` × ``trace_tokens`` recorded (the prompt and the context are sized by it)."""
    return int(warmup) + int(tokens) + (TRACE_PASSES * int(trace_tokens) if traced else 0)


def prompt_tokens(n: int, vocab: int, seed: int) -> list[int]:
    """``n`` token ids drawn uniformly from ``[0, vocab)`` with ``seed`` (NumPy PCG64): the one prompt every
    configuration walks, so all of them decode the same tokens at the same positions."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


def _write_csv(path: Path, fields, rows) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def run(plan: dict) -> int:
    """Run ``plan`` (keys: ``library``, ``model``, ``config``, ``contexts``, ``warmup``, ``tokens``,
    ``trace_contexts``, ``trace_tokens``, ``seed``, ``threads``, ``resident``, ``capture``, ``out``). Returns 0."""
    import hashlib

    import numpy as np

    from .engine import Ds4Engine

    out = Path(plan["out"])
    out.mkdir(parents=True, exist_ok=True)
    contexts = sorted(int(c) for c in plan["contexts"])
    warmup, tokens = int(plan["warmup"]), int(plan["tokens"])
    trace_ctx = {int(c) for c in plan.get("trace_contexts", ())}
    trace_tokens = int(plan.get("trace_tokens", 0))
    # the last position any context reaches: its own decode tokens after it (a traced context evaluates more)
    last = max(c + tokens_per_context(warmup, tokens, trace_tokens, c in trace_ctx) for c in contexts)
    ctx_size = last + 64
    cfg = plan["config"]
    t0 = time.monotonic()
    _emit(event="open", config=cfg, ctx_size=ctx_size)
    eng = Ds4Engine(plan["library"], plan["model"], ctx_size, int(plan.get("threads", 0)),
                    resident=bool(plan.get("resident", False)))
    capture = int(plan.get("capture", 0))
    if capture:
        eng.capture_mode(capture)
    info = {"config": cfg, "open_seconds": round(time.monotonic() - t0, 1), "ctx_size": ctx_size,
            "vocab_size": eng.vocab_size, "layer_count": eng.layer_count,
            "routed_quant_bits": eng.routed_quant_bits, "model_bytes": eng.model_bytes,
            "rewritten": eng.rewritten, "capture": capture}
    _emit(event="opened", **info)
    prompt = prompt_tokens(last + 1, eng.vocab_size, int(plan.get("seed", 0)))
    token_rows, prefill_rows, capture_rows, traces = [], [], [], {}
    try:
        for ctx in contexts:
            if eng.pos > ctx:
                raise ValueError(f"context {ctx} lies before position {eng.pos} (contexts closer than "
                                 f"warmup + tokens apart)")
            start = eng.pos
            secs = eng.sync(prompt[:ctx])
            prefill_rows.append({"config": cfg, "context": ctx, "from_pos": start, "tokens": ctx - start,
                                 "seconds": round(secs, 4)})
            _emit(event="prefilled", config=cfg, context=ctx, tokens=ctx - start, seconds=round(secs, 2))
            logits = []
            for i in range(warmup + tokens):
                pos = eng.pos
                gpu_us, host_us = eng.eval_timed(prompt[pos])
                if i >= warmup:  # after the token's events: nothing here is timed
                    lg = eng.logits()
                    logits.append(lg)
                    token_rows.append({"config": cfg, "context": ctx, "index": i - warmup, "pos": pos,
                                       "token": prompt[pos], "gpu_us": round(gpu_us, 2),
                                       "host_us": round(host_us, 2), "argmax": int(np.argmax(lg)),
                                       "logits_sha": hashlib.sha256(lg.tobytes()).hexdigest()[:16]})
                    if capture:
                        capture_rows.append({"config": cfg, "context": ctx, "index": i - warmup, "pos": pos,
                                             **eng.capture_stats(diff=True)})
            np.save(out / f"logits-{ctx}.npy", np.stack(logits))
            _write_csv(out / "tokens.csv", TOKEN_FIELDS, token_rows)
            if capture:
                _write_csv(out / "capture.csv", CAPTURE_FIELDS, capture_rows)
                _write_csv(out / "capture-args.csv", ("config", "kernel", "param", "changes"),
                           [{"config": cfg, **r} for r in eng.capture_tally()])
            _write_csv(out / "prefill.csv", PREFILL_FIELDS, prefill_rows)
            _emit(event="timed", config=cfg, context=ctx, tokens=tokens)
            if ctx in trace_ctx and trace_tokens:
                traces[ctx] = _trace(eng, prompt, trace_tokens, out / f"trace-{ctx}")
                _emit(event="traced", config=cfg, context=ctx, **traces[ctx])
    finally:
        eng.close()
    info.update(seconds=round(time.monotonic() - t0, 1), traces={str(k): v for k, v in traces.items()})
    tmp = out / "worker.json.tmp"
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(out / "worker.json")
    _emit(event="done", config=cfg)
    return 0


def _trace(eng, prompt, n: int, folder: Path) -> dict:
    """Record ``n`` decode tokens with CUPTI (each in an NVTX range ``decode_step``), then ``n`` more with their kernel
    arguments (an untimed pass of its own: the argument capture costs host time per launch,
    :mod:`ds4lab.audit.arguments`) into ``arguments.csv.gz`` and ``arguments.json.gz`` beside the first. Returns
    what happened: the recordings' paths, or why there is none."""
    try:
        import nvtx
        from ..audit.arguments import recording
        from ..trace.sources import SourceError
    except ImportError as e:
        return {"recording": "", "arguments": "", "why": f"no recording: {e}"}

    def tokens(rec):
        for _ in range(n):
            pos = eng.pos
            # the host range stands in for the NVTX range where NVTX does not reach CUPTI
            # untimed: the token's range holds ds4's own calls only, none of the timing's events
            with nvtx.annotate("decode_step"), rec.host_range("decode_step"):
                eng.eval(prompt[pos])

    try:
        with recording(stacks=False) as rec:
            tokens(rec)
        path = rec.save(folder, note="ds4 decode tokens recorded by ds4lab ds4")
    except SourceError as e:
        return {"recording": "", "arguments": "", "why": str(e)}
    args, why = "", ""
    try:
        with recording(stacks=False, arguments=True, token_range="decode_step") as rec2:
            tokens(rec2)
        args = str(rec2.save(folder / "arguments.csv.gz", note="ds4 decode tokens, kernel arguments (untimed)"))
    except (SourceError, OSError, RuntimeError) as e:  # the first recording stands without the second
        why = f"no kernel arguments: {e}"
    return {"recording": str(path), "arguments": args, "why": why}


def main(argv=None) -> int:
    """Entry point: ``python -m ds4lab.ds4.worker PLAN.json``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ds4lab.ds4.worker PLAN.json", file=sys.stderr)
        return 2
    return run(json.loads(Path(argv[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
