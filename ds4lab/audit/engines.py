"""Decode steps of engines nobody here wrote, recorded for the audit and set against what
``torch.cuda.graph`` actually does with the same step (``ds4lab audit validate``; GPU, PyTorch and
transformers needed, none of them ds4lab dependencies).

For each engine (a transformers model built from its config with random weights: no download) and
each KV cache (``dynamic``: transformers' ``DynamicCache``, which grows by concatenation; ``static``:
``StaticCache``, written in place at ``cache_position``):

1. a prompt is prefilled, then :data:`EAGER_STEPS` decode steps run eagerly, each inside an NVTX range
   ``decode_step``, recorded in-process (:func:`ds4lab.trace.recording.recording`: CUPTI, with Python
   stacks at the hazard-class calls), and timed with CUDA events (µs per step, median);
2. one decode step is captured with ``torch.cuda.graph`` (capture mode ``global``, PyTorch's default)
   on static input buffers (token id, position, ``cache_position``); a capture that raises is
   ``refused`` (PyTorch's error named);
3. a captured graph is replayed at the next :data:`REPLAY_STEPS` positions, the inputs copied into its
   buffers first. Before each replay the cache is snapshotted, the step is run eagerly from it (the
   reference), the cache is restored, and the graph replays: ``captured, replays right`` when every
   replay's logits are within :data:`RIGHT_RTOL` of the eager step's (relative L2) and pick the same
   next token; ``captured, replays wrong`` otherwise (first position that differs named). Models run in
   float32, so a right replay differs from eager by rounding only (order-of-1e-6 relative), and a stale
   one by the whole attention over a wrong context;
4. replays are timed with CUDA events (µs per step, median), the host copies of the inputs included.

The recording is saved beside the results (``<engine>-<cache>/recording.csv.gz``) for the audit, which
the job :mod:`ds4lab.jobs.audit` runs on it and compares with the outcome and the replay time.

Sources: PyTorch ``torch.cuda.graph`` / ``torch.cuda.CUDAGraph`` (capture on a side stream, a private
memory pool, ``capture_error_mode="global"`` by default); transformers ``DynamicCache``, ``StaticCache``
(``cache_position``); CUDA Programming Guide, "CUDA Graphs".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

#: The engines ``ds4lab audit validate`` builds (small configurations of three families).
ENGINES = ("llama", "deepseek-v3", "qwen2-moe")
CACHES = ("dynamic", "static")
PROMPT = 16
EAGER_STEPS = 8
REPLAY_STEPS = 6
#: A replay is right when its logits are within this relative L2 error of the eager step's (float32).
RIGHT_RTOL = 1e-3
TOKEN_RANGE = "decode_step"
#: Positions a static cache holds: the prompt, the recorded and timed eager steps, the capture, the
#: compared and the timed replays, with room to spare.
MAX_CACHE = 256  # the validate runs (ds4lab.audit.families) take about 120 positions


@dataclass
class EngineRun:
    """One engine and cache: what torch.cuda.graph did, the times, and the recording's file."""

    engine: str
    cache: str
    outcome: str = ""
    detail: str = ""
    eager_us: float | None = None
    replay_us: float | None = None
    recording: str = ""
    replay_errors: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)


def build(engine: str, *, layers: int | None = None, dtype: str = "float32"):
    """A transformers causal LM of ``engine`` (:data:`ENGINES`) in ``dtype`` (float32 or bfloat16) on the
    GPU, from a small config with random weights. Returns ``(model, config summary)``.

    Raises:
        ValueError: an unknown engine (naming the known ones).
        ImportError: torch or transformers missing.
    """
    import torch
    import transformers as T

    torch.manual_seed(0)
    if engine == "llama":
        cfg = T.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers or 8,
                            num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                            max_position_embeddings=512)
        cls = T.LlamaForCausalLM
    elif engine == "deepseek-v3":
        cfg = T.DeepseekV3Config(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                                 num_hidden_layers=layers or 4, num_attention_heads=8, num_key_value_heads=8,
                                 n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
                                 first_k_dense_replace=1, n_group=4, topk_group=2, q_lora_rank=256,
                                 kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64,
                                 vocab_size=16000, max_position_embeddings=512)
        cls = T.DeepseekV3ForCausalLM
    elif engine == "qwen2-moe":
        cfg = T.Qwen2MoeConfig(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                               shared_expert_intermediate_size=512, num_hidden_layers=layers or 4,
                               num_attention_heads=8, num_key_value_heads=4, num_experts=16,
                               num_experts_per_tok=4, vocab_size=16000, max_position_embeddings=512)
        cls = T.Qwen2MoeForCausalLM
    else:
        raise ValueError(f"unknown engine {engine!r}; choose from: {', '.join(ENGINES)}")
    model = cls(cfg).to(device="cuda", dtype=getattr(torch, dtype)).eval()
    summary = {"engine": engine, "class": cls.__name__, "layers": cfg.num_hidden_layers,
               "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "dtype": dtype,
               "transformers": T.__version__, "torch": torch.__version__}
    return model, summary


class _Step:
    """One decode step of ``model`` on static input buffers (what a graph captures)."""

    def __init__(self, model, cache, vocab: int) -> None:
        import torch

        self.model, self.cache, self.vocab = model, cache, vocab
        self.ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        self.pos = torch.zeros((1,), dtype=torch.long, device="cuda")
        self.logits = None

    def set(self, pos: int) -> None:
        """Write the inputs of position ``pos`` into the buffers (host to device copies)."""
        self.ids.fill_((pos * 7919 + 13) % self.vocab)
        self.pos.fill_(pos)

    def __call__(self):
        import torch

        with torch.no_grad():
            out = self.model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.pos,
                             position_ids=self.pos.view(1, 1), use_cache=True)
        self.logits = out.logits
        return self.logits


def _make_cache(model, kind: str):
    import transformers as T

    if kind == "dynamic":
        return T.DynamicCache(config=model.config)
    return T.StaticCache(config=model.config, max_cache_len=MAX_CACHE)


def _prefill(model, cache) -> None:
    import torch

    ids = torch.arange(PROMPT, device="cuda").view(1, -1) % model.config.vocab_size
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(PROMPT, device="cuda"),
              use_cache=True)
    torch.cuda.synchronize()


def _snapshot(cache):
    """A copy of the cache's state to restore after a reference step (tensors cloned)."""
    return copy.deepcopy(cache)


def _restore(cache, snap) -> None:
    """Put every tensor of ``snap``'s layers back into ``cache`` in place (a graph holds the cache's
    own tensors): keys, values, and the device-side counters a cache keeps (transformers' static layer
    writes at its ``cumulative_length``, a device tensor the step advances)."""
    import torch

    for layer, old in zip(getattr(cache, "layers", []), getattr(snap, "layers", [])):
        for name, s in vars(old).items():
            t = getattr(layer, name, None)
            if not (isinstance(s, torch.Tensor) and isinstance(t, torch.Tensor)):
                continue
            if t.shape == s.shape:
                t.copy_(s)
            else:  # a dynamic cache grown by the reference step: put the old tensor back
                setattr(layer, name, s.clone())


def _device() -> dict:
    """The GPU, driver and CUDA versions this run measured on (the provenance of its outcome and µs)."""
    import torch

    info = {"device": torch.cuda.get_device_name(), "torch_cuda": torch.version.cuda}
    try:  # CuPy names the driver; torch does not
        from ..backends.cupy_backend import device_info

        info.update({k: v for k, v in device_info().items() if k in ("driver", "cuda_driver_api", "cupy")})
    except Exception as e:  # noqa: BLE001 - provenance only: say why it is missing
        info["driver"] = f"unknown ({type(e).__name__})"
    return info


def _events_us(fn, n: int) -> float:
    import statistics

    import torch

    out = []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(out)


def run_engine(engine: str, cache_kind: str, out: Path, *, say=print) -> EngineRun:
    """Record, capture, replay and time one engine and cache (module docstring); the recording is
    saved under ``out/<engine>-<cache>/``. Never raises for what the capture does: a refused capture is
    an outcome. Raises for a missing torch/transformers/GPU or an unknown engine/cache."""
    import torch

    from ..trace.recording import recording

    if cache_kind not in CACHES:
        raise ValueError(f"unknown cache {cache_kind!r}; choose from: {', '.join(CACHES)}")
    model, summary = build(engine)
    res = EngineRun(engine, cache_kind, config=summary, device=_device())
    cache = _make_cache(model, cache_kind)
    _prefill(model, cache)
    step = _Step(model, cache, model.config.vocab_size)
    pos = PROMPT
    step.set(pos)  # one warm step outside the recording (kernels and handles created)
    step()
    pos += 1
    torch.cuda.synchronize()
    folder = Path(out) / f"{engine}-{cache_kind}"
    folder.mkdir(parents=True, exist_ok=True)
    with recording() as rec:
        for _ in range(EAGER_STEPS):
            torch.cuda.nvtx.range_push(TOKEN_RANGE)
            step.set(pos)
            with rec.host_range(TOKEN_RANGE):  # stands in where NVTX does not reach CUPTI
                step()
            torch.cuda.nvtx.range_pop()
            pos += 1
        torch.cuda.synchronize()
    res.recording = str(rec.save(folder, engine=engine, cache=cache_kind))

    def eager_once():
        nonlocal pos
        step.set(pos)
        step()
        pos += 1

    res.eager_us = _events_us(eager_once, 5)
    # capture one step on the buffers (PyTorch warms up on a side stream first, as its docs ask)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step.set(pos)
        step()
    torch.cuda.current_stream().wait_stream(side)
    pos += 1
    graph = torch.cuda.CUDAGraph()
    try:
        step.set(pos)
        with torch.cuda.graph(graph):
            graph_logits = step()  # the tensor every replay writes
    except Exception as e:  # noqa: BLE001 - what torch.cuda.graph refused is the result
        res.outcome, res.detail = "refused", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        torch.cuda.synchronize()
        say(f"{engine}/{cache_kind}: capture refused: {res.detail}")
        return res
    captured_at = pos
    pos += 1
    wrong = None
    for _ in range(REPLAY_STEPS):
        step.set(pos)
        snap = _snapshot(cache)
        ref = step().detach().clone()
        _restore(cache, snap)
        step.set(pos)
        graph.replay()
        torch.cuda.synchronize()
        got = graph_logits
        err = float(torch.linalg.vector_norm(got.float() - ref.float()) / torch.linalg.vector_norm(ref.float()))
        same = bool(torch.argmax(got[0, -1]) == torch.argmax(ref[0, -1]))
        res.replay_errors.append({"position": pos, "rel_err": err, "same_next_token": same})
        if wrong is None and (err > RIGHT_RTOL or not same):
            wrong = pos
        pos += 1

    def replay_once():
        nonlocal pos
        step.set(pos)
        graph.replay()
        pos += 1

    res.replay_us = _events_us(replay_once, 10)
    if wrong is None:
        res.outcome = "captured, replays right"
        res.detail = f"captured at {captured_at}; max relative error {max(r['rel_err'] for r in res.replay_errors):.1e}"
    else:
        e = next(r for r in res.replay_errors if r["position"] == wrong)
        res.outcome = "captured, replays wrong"
        res.detail = (f"captured at {captured_at}; from position {wrong} the replay differs from the eager step "
                      f"(relative error {e['rel_err']:.2e}, same next token: {e['same_next_token']})")
    say(f"{engine}/{cache_kind}: {res.outcome} · eager {res.eager_us:.0f} µs, replay {res.replay_us:.0f} µs per step")
    del graph
    torch.cuda.synchronize()
    return res


def run_isolated(engine: str, cache_kind: str, out: Path, *, dtype: str = "float32", timeout: float = 900) -> dict:
    """One family of :mod:`ds4lab.audit.families` (:func:`~ds4lab.audit.families.run_family`: a timed
    pass, an argument pass, the capture's cost, :func:`~ds4lab.audit.replay_check.check_replay`) in a
    subprocess of this interpreter (``python -m ds4lab.audit.families``), so that a step that kills its
    CUDA context (a device-side assert) costs only that run, and NVTX ranges reach CUPTI
    (``NVTX_INJECTION64_PATH`` set at the process's start). Returns the run as a dict (``error`` set, with
    the process's last lines, when it failed); its files are in ``out/<engine>-<cache>-<dtype>/``."""
    import json
    import os
    import subprocess
    import sys

    from ..trace.cupti import cupti_library

    folder = Path(out) / f"{engine}-{cache_kind}-{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    lib = cupti_library()
    if lib is not None:
        env.setdefault("NVTX_INJECTION64_PATH", str(lib))
    try:
        r = subprocess.run([sys.executable, "-m", "ds4lab.audit.families", engine, cache_kind, dtype, str(out)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"engine": engine, "cache": cache_kind, "dtype": dtype, "outcome": "",
                "error": f"timed out after {timeout:.0f} s"}
    result = folder / "engine.json"
    if r.returncode == 0 and result.is_file():
        return json.loads(result.read_text())
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-6:])
    return {"engine": engine, "cache": cache_kind, "dtype": dtype, "outcome": "",
            "error": f"exit {r.returncode}: {tail}"}


#: The decode loops bundled with ds4lab (``ds4lab/data/audit/torch-<engine>-<cache>.csv.gz``): recordings
#: of :func:`run_engine` on an H200, trimmed to their decode steps, for auditing without a GPU. Their
#: torch.cuda.graph outcomes beside them (recorded_outcome); the runs: docs/measurements/h200-2026-12-01/round2.
RECORDED = (("llama", "static"), ("llama", "dynamic"), ("deepseek-v3", "static"))


def recorded(engine: str, cache_kind: str) -> Path:
    """The bundled recording of ``engine`` with ``cache_kind`` (:data:`RECORDED`), a ds4lab recording
    (``.csv.gz``) that ``ds4lab audit`` reads.

    Raises:
        ValueError: a pair that is not bundled (naming the bundled ones).
    """
    from importlib.resources import files

    if (engine, cache_kind) not in RECORDED:
        raise ValueError(f"no bundled recording of {engine!r} with a {cache_kind!r} cache; bundled: "
                         + ", ".join(f"{e}/{c}" for e, c in RECORDED))
    return Path(str(files("ds4lab") / "data" / "audit" / f"torch-{engine}-{cache_kind}.csv.gz"))


def recorded_outcome(engine: str, cache_kind: str) -> dict:
    """What torch.cuda.graph did with the bundled recording's engine and cache on the GPU that recorded
    it: :class:`EngineRun`'s fields (``outcome``, ``detail``, ``eager_us``, ``replay_us`` measured with
    CUDA events, ``device`` with the GPU and driver), from ``torch-<engine>-<cache>.json`` beside it.

    Raises:
        ValueError: a pair that is not bundled.
    """
    import json

    return json.loads(recorded(engine, cache_kind).with_name(f"torch-{engine}-{cache_kind}.json").read_text())


def outcome_beside(recording: Path) -> dict | None:
    """What torch.cuda.graph did with the engine a recording was made from, when its outcome sits
    beside it (``<stem>.json`` beside ``<stem>.csv.gz``, as the bundled ones ship, or ``engine.json``
    beside ``recording.csv.gz``, as ``ds4lab audit validate`` writes them): :class:`EngineRun`'s
    fields, or None when there is none (or it is not an outcome)."""
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
    """The trace :func:`audit_source` chose, and what torch.cuda.graph did with its step where known.

    Attributes:
        trace: the file to audit.
        kind: ``own`` (a trace given), ``live`` (recorded here, on the GPU), ``bundled`` (recorded on an
            H200, shipped with ds4lab).
        torch_run: :class:`EngineRun`'s fields for ``live`` and ``bundled`` (outcome, detail, µs, device);
            None for ``own``.
        note: one line saying which trace it is and where it was recorded.
    """

    trace: Path
    kind: str
    torch_run: dict | None
    note: str


def audit_source(backend: str = "auto", engine: str = "llama", cache_kind: str = "dynamic", trace=None,
                 record_into: Path | None = None) -> AuditSource:
    """What notebook 05 audits: ``trace`` when given (your own engine's); else ``engine`` with
    ``cache_kind`` recorded live (:func:`run_isolated`, into ``record_into``, a folder of its own: the
    audit's result folder stays apart) where ``backend`` is ``cupy``, or ``auto`` and torch sees a GPU
    (:func:`available`); else the bundled recording (:func:`recorded`) with its outcome beside it.

    Raises:
        ValueError: an unknown backend (auto, cupy, sim); ``cupy`` where no live recording can be made
            (naming why); a live recording that failed (the process's last lines); no ``record_into``
            for a live one; a pair that is not bundled where the bundled one is taken.
    """
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


__all__ = ["AuditSource", "CACHES", "ENGINES", "EngineRun", "RECORDED", "RIGHT_RTOL", "TOKEN_RANGE", "audit_source",
           "available", "build", "outcome_beside", "recorded", "recorded_outcome", "run_engine", "run_isolated"]


if __name__ == "__main__":  # one engine and cache, as run_isolated runs it
    import dataclasses
    import json
    import sys

    _engine, _cache, _out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    _r = run_engine(_engine, _cache, _out)
    (_out / f"{_engine}-{_cache}" / "engine.json").write_text(json.dumps(dataclasses.asdict(_r), indent=1,
                                                                         default=str))
