"""The decode steps ``ds4lab audit validate`` holds the audit to (GPU, torch, transformers): each family
recorded (a timed pass and an argument pass), captured and replayed against its eager twin
(:func:`ds4lab.audit.replay_check.check_replay`), in float32 and bf16.

Families (:data:`FAMILIES`, engine → the caches it runs with):

==================  ==========================================  ========================================
engine              what                                        caches
==================  ==========================================  ========================================
``llama``           transformers Llama (config, random weights)  ``dynamic`` (DynamicCache), ``static``
``deepseek-v3``     transformers DeepSeek-V3 (MLA, routed MoE)   ``dynamic``, ``static``
``qwen2-moe``       transformers Qwen2-MoE                       ``dynamic``, ``static``
``mistral``         transformers Mistral, ``sliding_window`` 32  ``dynamic``, ``static``
``gemma2``          transformers Gemma2 (sliding and global      ``dynamic``, ``static``
                    layers, soft-capping), window 32
``qwen2``           transformers Qwen2, ``use_sliding_window``   ``dynamic``, ``static``
``handwritten``     a decoder written here in plain torch (a     ``host-counter`` (the cache keeps its
                    KV cache tensor, masked attention over it)   write index and mask bound on the host),
                                                                 ``device-counter`` (both on the device),
                                                                 ``host-read`` (device counter, and the
                                                                 step reads it on the host: ``.item()``)
==================  ==========================================  ========================================

The positions run past the window (prompt 16, a window of 32, about a hundred steps), so sliding
layers wrap. Each run (:func:`run_family`, in its own process through :func:`ds4lab.audit.engines.run_isolated`):

1. build, prefill, two warm steps;
2. the **timed pass**: :data:`~ds4lab.audit.engines.EAGER_STEPS` eager steps, each inside an NVTX range
   ``decode_step`` around the step alone (the inputs are written before it, outside the range, as a
   graph replay would have them written), recorded (``recording.csv.gz``);
3. the **capture-path pass**, where the timed pass asked whether the stream captures
   (:mod:`ds4lab.trace.capture_path`): as many steps again with PyTorch answering yes
   (``capture-path.csv.gz``): the work a graph of the step holds, which the plans model;
4. the **argument pass**: as many steps again, with the kernel arguments recorded
   (``arguments.csv.gz``, ``arguments.json.gz``): never timed;
5. the **cost** of argument capture, paired and interleaved (:func:`ds4lab.audit.arguments.measure_overhead`:
   µs per launch with its 95 % interval), written into the arguments file;
6. eager µs per step (CUDA events, median);
7. :func:`~ds4lab.audit.replay_check.check_replay`: refused / replays right / replays wrong with the
   first position and output, and the replay's µs per step (a loop that never waits, one that waits
   for every replay, and the graph's device time alone).
"""

from __future__ import annotations

import contextlib

import json
import sys
from pathlib import Path

TRANSFORMERS_CACHES = ("dynamic", "static")
HAND_CACHES = ("host-counter", "device-counter", "host-read")
FAMILIES = {"llama": TRANSFORMERS_CACHES, "deepseek-v3": TRANSFORMERS_CACHES, "qwen2-moe": TRANSFORMERS_CACHES,
            "mistral": TRANSFORMERS_CACHES, "gemma2": TRANSFORMERS_CACHES, "qwen2": TRANSFORMERS_CACHES,
            "handwritten": HAND_CACHES}
CACHES = TRANSFORMERS_CACHES + HAND_CACHES
DTYPES = ("float32", "bfloat16")
WINDOW = 32
HAND_MAX = 256


def pairs(engines=(), caches=()) -> list[tuple[str, str]]:
    """The (engine, cache) runs asked for: every engine's own caches among ``caches`` (all when empty)."""
    out = []
    for e in engines or FAMILIES:
        for c in FAMILIES[e]:
            if not caches or c in caches:
                out.append((e, c))
    return out


def build(engine: str, dtype: str = "float32"):
    """The model of a transformers family in ``dtype`` on the GPU (:func:`ds4lab.audit.engines.build` for
    the first three), and its summary."""
    import torch
    import transformers as T

    from . import engines as E

    if engine in ("llama", "deepseek-v3", "qwen2-moe"):
        return E.build(engine, dtype=dtype)
    torch.manual_seed(0)
    small = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=16000, max_position_embeddings=512)
    if engine == "mistral":
        cfg, cls = T.MistralConfig(**small, sliding_window=WINDOW), T.MistralForCausalLM
    elif engine == "gemma2":
        cfg, cls = T.Gemma2Config(**small, head_dim=64, sliding_window=WINDOW), T.Gemma2ForCausalLM
    elif engine == "qwen2":
        cfg, cls = (T.Qwen2Config(**small, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
                    T.Qwen2ForCausalLM)
    else:
        raise ValueError(f"unknown engine {engine!r}; choose from: {', '.join(FAMILIES)}")
    model = cls(cfg).to(device="cuda", dtype=getattr(torch, dtype)).eval()
    return model, {"engine": engine, "class": cls.__name__, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                   "vocab": cfg.vocab_size, "dtype": dtype, "sliding_window": WINDOW, "transformers": T.__version__,
                   "torch": torch.__version__}


class HandDecoder:
    """A small decoder in plain torch (module docstring): ``mode`` one of :data:`HAND_CACHES`. ``ids`` is
    its static input; :meth:`set` writes a position's token into it; :meth:`__call__` is one step."""

    def __init__(self, mode: str, dtype: str = "float32", layers: int = 2, d: int = 256, heads: int = 4,
                 vocab: int = 4096) -> None:
        import torch

        if mode not in HAND_CACHES:
            raise ValueError(f"unknown cache {mode!r} for handwritten; choose from: {', '.join(HAND_CACHES)}")
        g = torch.Generator(device="cuda").manual_seed(0)
        dt = getattr(torch, dtype)
        r = lambda *s: (torch.randn(*s, generator=g, device="cuda") * 0.05).to(dt)  # noqa: E731
        self.mode, self.layers, self.d, self.heads, self.hd, self.vocab = mode, layers, d, heads, d // heads, vocab
        self.emb = r(vocab, d)
        self.w = [(r(d, 3 * d), r(d, d), r(d, 4 * d), r(4 * d, d)) for _ in range(layers)]
        self.k = torch.zeros(layers, heads, HAND_MAX, self.hd, dtype=dt, device="cuda")
        self.v = torch.zeros_like(self.k)
        self.arange = torch.arange(HAND_MAX, device="cuda")
        self.ids = torch.zeros((1,), dtype=torch.long, device="cuda")
        self.pos = 0                                                   # host-counter: on the host
        self.dpos = torch.zeros((1,), dtype=torch.long, device="cuda")  # the others: on the device

    def set(self, p: int) -> None:
        self.ids.fill_((p * 7919 + 13) % self.vocab)

    def __call__(self):
        import torch

        x = self.emb[self.ids]
        for i, (wqkv, wo, w1, w2) in enumerate(self.w):
            q, k, v = (x @ wqkv).view(3, self.heads, self.hd)
            if self.mode == "host-counter":
                self.k[i, :, self.pos] = k   # the slot's address is computed on the host
                self.v[i, :, self.pos] = v
                mask = self.arange <= self.pos  # the mask bound by value
            else:
                self.k[i].index_copy_(1, self.dpos, k.unsqueeze(1))
                self.v[i].index_copy_(1, self.dpos, v.unsqueeze(1))
                mask = self.arange <= self.dpos
            att = (q.unsqueeze(1) @ self.k[i].transpose(1, 2)).squeeze(1) / self.hd ** 0.5
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            o = (att.unsqueeze(1) @ self.v[i]).reshape(1, self.d)
            x = x + o @ wo
            x = x + torch.nn.functional.gelu(x @ w1) @ w2
        logits = x @ self.emb.T
        if self.mode == "host-counter":
            self.pos += 1
        else:
            self.dpos += 1
        if self.mode == "host-read" and int(self.dpos.item()) >= HAND_MAX:  # a device value read on the host
            raise RuntimeError("cache full")
        return logits


def _family(engine: str, cache: str, dtype: str):
    """``(step, set, state, start position, summary)`` of one family."""
    from . import engines as E

    if engine == "handwritten":
        dec = HandDecoder(cache, dtype)
        summary = {"engine": engine, "class": "HandDecoder", "layers": dec.layers, "hidden": dec.d,
                   "vocab": dec.vocab, "dtype": dtype, "cache": cache}
        return dec, dec.set, [dec], 0, summary
    model, summary = build(engine, dtype)
    kv = E._make_cache(model, cache)
    E._prefill(model, kv)
    step = E._Step(model, kv, model.config.vocab_size)
    return step, step.set, [kv], E.PROMPT, summary


def run_family(engine: str, cache: str, dtype: str, out: Path, *, say=print) -> dict:
    """One family in one process (module docstring); writes ``out/<engine>-<cache>-<dtype>/`` and returns
    what ``engine.json`` holds."""
    import torch

    from . import engines as E
    from .arguments import load, measure_overhead, save, token_launches
    from ..trace.capture_path import CAPTURE_PATH_NAME, NOT_ASKED, as_if_capturing, asks_capture_status
    from ..trace.recording import store_path
    from .arguments import recording
    from .replay_check import check_replay

    folder = Path(out) / f"{engine}-{cache}-{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    step, set_pos, state, pos, summary = _family(engine, cache, dtype)
    res = {"engine": engine, "cache": cache, "dtype": dtype, "config": summary, "device": E._device()}

    def one(record_range: bool = True, rec=None):
        nonlocal pos
        set_pos(pos)
        if record_range:
            torch.cuda.nvtx.range_push(E.TOKEN_RANGE)
        # the host range stands in for the NVTX range where NVTX does not reach CUPTI
        with rec.host_range(E.TOKEN_RANGE) if rec is not None else contextlib.nullcontext():
            step()
        if record_range:
            torch.cuda.nvtx.range_pop()
        pos += 1

    with torch.no_grad():
        for _ in range(2):
            one(False)
        torch.cuda.synchronize()
        with recording() as timed:
            for _ in range(E.EAGER_STEPS):
                one(rec=timed)
            torch.cuda.synchronize()
        res["recording"] = str(timed.save(folder / "recording.csv.gz", engine=engine, cache=cache, dtype=dtype))
        if asks_capture_status(timed.table().frame):
            # the step asks whether the stream captures: record the path a graph of it would hold
            try:
                with as_if_capturing():  # one untimed step: the capture path's kernels loaded before it is recorded
                    one(False)
                    torch.cuda.synchronize()
                with as_if_capturing() as asked, recording() as cp:
                    for _ in range(E.EAGER_STEPS):
                        one(rec=cp)
                    torch.cuda.synchronize()
                res["capture_path_asked"] = asked.count
                if asked.count:
                    res["capture_path"] = str(cp.save(folder / CAPTURE_PATH_NAME, engine=engine, cache=cache,
                                                      dtype=dtype, capture_path_asked=asked.count))
                    say(f"{engine}/{cache}/{dtype}: capture path recorded (asked {asked.count} times in "
                        f"{E.EAGER_STEPS} steps)")
                else:  # the questions came from C/C++ (CUDA's answer stands there): the same path, not kept
                    say(f"{engine}/{cache}/{dtype}: no capture-path pass kept: {NOT_ASKED}")
            except Exception as e:  # noqa: BLE001 - the pass failing is said; the plans stay on the recorded path
                res["capture_path_error"] = f"{type(e).__name__}: {e}"
                say(f"{engine}/{cache}/{dtype}: no capture-path pass ({res['capture_path_error']})")
                torch.cuda.synchronize()
        with recording(arguments=True, token_range=E.TOKEN_RANGE) as args:
            for _ in range(E.EAGER_STEPS):
                one(rec=args)
            torch.cuda.synchronize()
        args.save(folder / "arguments.csv.gz", engine=engine, cache=cache, dtype=dtype)
        store = store_path(folder / "arguments.csv.gz")
        res["arguments"] = str(store)
        try:
            tl = token_launches(args.table(), E.TOKEN_RANGE)
            per_step = sum(len(t) for t in tl.tokens) / max(len(tl.tokens), 1)
        except Exception:  # noqa: BLE001 - no tokens: the launches per step as recorded
            per_step = len(args.arguments.launches) / E.EAGER_STEPS if args.arguments else 0.0
        try:
            cost = measure_overhead(lambda: one(False), per_step, sync=torch.cuda.synchronize)
            st = load(store)
            st.cost = cost
            save(st, store)
            res["overhead"] = cost
            say(f"{engine}/{cache}/{dtype}: argument capture {cost['text']}")
        except Exception as e:  # noqa: BLE001 - the cost unmeasured is said, the rest goes on
            res["overhead"] = {"text": f"not measured ({type(e).__name__}: {e})"}

        def eager_once():
            one(False)

        res["eager_us"] = E._events_us(eager_once, 5)
        chk = check_replay(step, state, advance=set_pos, start=pos, positions=E.REPLAY_STEPS)
    res.update({"outcome": chk.outcome, "detail": chk.detail, "first_position": chk.first_position,
                "first_output": chk.first_output, "replay_us": chk.replay_us, "replay_spread": chk.replay_spread,
                "replay_sync_us": chk.replay_sync_us, "replay_device_us": chk.replay_device_us,
                "graph_kernels": chk.graph_kernels, "replay_errors": chk.errors})
    say(f"{engine}/{cache}/{dtype}: {chk.outcome} ({chk.detail})")
    (folder / "engine.json").write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":  # one family, as ds4lab.audit.engines.run_isolated runs it
    run_family(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    sys.exit(0)


__all__ = ["CACHES", "DTYPES", "FAMILIES", "HandDecoder", "build", "pairs", "run_family"]
