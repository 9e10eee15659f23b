"""Conformance scenarios for the audit's PyTorch-level rules, run on a GPU with torch:
:data:`~ds4lab.audit.frozen.HOST_COPY_RULE` (``pageable_copy_0dim``, ``pageable_copy_1d`` refused;
``pinned_copy_0dim`` captures) and :data:`~ds4lab.audit.frozen.UNSET_RULE` (``unset_words``: a strided copy's
unset words change under one key and replay bit-identical; ``cpu_scalar_operand``: the key changes and the replay
keeps the captured value). ``python -m ds4lab.audit.torch_rules --out DIR`` writes ``DIR/torch_rules.json`` and
exits 1 when one does not hold. docs/audit-arguments.md, "What PyTorch refuses that CUDA would capture"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: scenario → what the rule expects (observation → value).
EXPECT = {
    "pageable_copy_0dim": {"capture": "refused: pinned"},
    "pageable_copy_1d": {"capture": "refused: pinned"},
    "pinned_copy_0dim": {"capture": "ok"},
    "cpu_scalar_operand": {"capture": "ok", "replay": "captured value", "keys": "differ"},
    "unset_words": {"capture": "ok", "replay": "bit-identical", "keys": "same", "changing words": "some"},
}


def _graph(torch, fn):
    """``fn`` captured with ``torch.cuda.graph`` (which ends the capture on every exception), or the refusal as
    ``"refused: pinned"`` / ``"refused: <message>"``."""
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except RuntimeError as e:
        torch.cuda.synchronize()
        msg = str(e)
        return "refused: pinned" if "unless the CPU tensor is pinned" in msg else f"refused: {msg[:120]}"
    return g


def _capture(torch, fn) -> str:
    """``"ok"`` where ``fn`` captures, else the refusal (:func:`_graph`)."""
    g = _graph(torch, fn)
    return g if isinstance(g, str) else "ok"


def _eager_kernels(fn) -> list:
    """The kernels one eager call launches (CUPTI, through ds4lab's recording), or [] without CUPTI."""
    from ..trace.recording import recording
    from ..trace.sources.common import SourceError

    try:
        with recording(stacks=False) as rec:
            fn()
    except SourceError:
        return []
    return sorted({str(n)[:80] for n in rec.table().frame.query("kind == 'kernel'")["name"]})


def _keys_and_words(torch, fn, op: str, calls: int = 6) -> tuple[str, str]:
    """An argument pass over ``calls`` eager calls of ``fn``, sizes changing between: whether operator ``op``'s
    launches have one host-argument key, and whether their bytes change."""
    from ..trace.recording import recording

    with recording(stacks=False, arguments=True) as rec:
        for k in range(calls):
            torch.full((7 * k + 1,), float(k), device="cuda").sum()
            fn()
        torch.cuda.synchronize()
    st = rec.arguments
    mine = [c for c, i in st.op_of.items() if st.ops and i in st.ops and st.ops[i]["name"].startswith(op)]
    keys = {st.ops[st.op_of[c]]["key"] for c in mine}
    digests = {st.launches[c][1] for c in mine if c in st.launches}
    return ("same" if len(keys) == 1 else "differ" if keys else "none"), ("some" if len(digests) > 1 else "none")


def run() -> dict:
    """Run every scenario (:data:`EXPECT`); returns ``{scenario: {"observed", "expected", "holds"}}``."""
    import torch

    dev = "cuda"
    out = {}

    def record(name, obs):
        exp = EXPECT[name]
        out[name] = {"observed": obs, "expected": exp, "holds": all(obs.get(k) == v for k, v in exp.items())}

    dst = torch.empty((), device=dev, dtype=torch.int64)
    src0 = torch.tensor(7)
    record("pageable_copy_0dim", {"eager kernels": _eager_kernels(lambda: dst.copy_(src0)),
                                  "capture": _capture(torch, lambda: dst.copy_(src0))})
    dst1 = torch.empty(4, device=dev, dtype=torch.int64)
    src1 = torch.arange(4)
    record("pageable_copy_1d", {"capture": _capture(torch, lambda: dst1.copy_(src1))})
    pinned = torch.tensor(7).pin_memory()
    record("pinned_copy_0dim", {"capture": _capture(torch, lambda: dst.copy_(pinned, non_blocking=True))})

    # a CPU scalar operand: read on the host at launch, by value in the kernel
    x = torch.arange(8, device=dev, dtype=torch.float32)
    y = torch.empty_like(x)
    pos = [3.0]
    step = lambda: torch.add(x, torch.tensor(pos[0]), out=y)  # noqa: E731
    keys_cpu, _ = _keys_and_words(torch, lambda: (pos.__setitem__(0, pos[0] + 1), step()), "aten::add")
    pos[0] = 3.0
    r = _capture_replay(torch, step, lambda: pos.__setitem__(0, 5.0), y, x + 3.0, x + 5.0)
    record("cpu_scalar_operand", {"capture": "ok" if isinstance(r, tuple) else r,
                                  "replay": r[1] if isinstance(r, tuple) else "—", "keys": keys_cpu})

    # a strided copy: TensorIterator's offset calculator, its slots past the tensors' rank unset
    a = torch.randn(64, 48, device=dev)
    b = torch.empty(48, 64, device=dev)
    strided = lambda: b.copy_(a.t())  # noqa: E731
    keys_u, words_u = _keys_and_words(torch, strided, "aten::copy_")
    r = _capture_replay(torch, strided, lambda: b.zero_(), b, a.t().clone(), None)
    record("unset_words", {"capture": "ok" if isinstance(r, tuple) else r,
                           "replay": r[1] if isinstance(r, tuple) else "—", "keys": keys_u, "changing words": words_u})
    return out


def _capture_replay(torch, step, change, result, captured, new, replays: int = 5):
    """Capture ``step``, then ``replays`` times change, replay and compare ``result`` with ``captured`` and ``new``.
    Returns ``("ok", "captured value" | "new value" | "bit-identical" | "differs")`` or the refusal."""
    g = _graph(torch, step)
    if isinstance(g, str):
        return g
    seen = set()
    for _ in range(replays):
        change()
        g.replay()
        torch.cuda.synchronize()
        if torch.equal(result, captured):
            seen.add("bit-identical" if new is None else "captured value")
        elif new is not None and torch.equal(result, new):
            seen.add("new value")
        else:
            seen.add("differs")
    return "ok", (seen.pop() if len(seen) == 1 else "differs")


def main(argv=None) -> int:
    """``python -m ds4lab.audit.torch_rules --out DIR``: 0 when every scenario holds, else 1."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ds4lab.audit.torch_rules", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for torch_rules.json")
    a = ap.parse_args(argv)
    res = run()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "torch_rules.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{'holds' if v['holds'] else 'FAILS'}  {k}: {v['observed']}")
    return 0 if all(v["holds"] for v in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
