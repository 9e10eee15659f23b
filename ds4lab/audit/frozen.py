"""Frozen values and addresses, found by comparing the tokens of an argument pass argument by argument, and the replay
verdict.

:func:`compare` reads an argument pass (:mod:`ds4lab.audit.arguments`) and, at each launch index of the tokens with
identical launch lists, compares the parameters piece by piece (a parameter of 8 bytes or less whole, a larger one in
8-byte words); what differs is one of :data:`CLASSES`, each with its evidence (:data:`STRENGTH`). :func:`verdict` says
**replays right** only with that evidence and nothing frozen feeding the step, **replays wrong**, **refused**, or
**captures; replay correctness unknown from this trace** with the command that records what is missing. The classes,
the rules (:data:`POOL_RULE`, :data:`UNSET_RULE`, :data:`TRACK_RULE`, :data:`INPUT_RULE`, :data:`HOST_COPY_RULE`) and
the verdict: ``docs/audit-arguments.md``, "What the comparison concludes" and "The verdict"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import arguments as A
from .verdicts import compact_ranges
from .where import user_frame

RIGHT, WRONG, REFUSED = "replays right", "replays wrong", "refused"
UNKNOWN = "captures; replay correctness unknown from this trace"
#: The verdict of a trace that holds no host call: whether the stream captures is not shown either.
BLIND = "capture and replay unknown from this trace"
#: What records the host calls a device-only trace lacks.
HOST_COMMAND = ("torch.profiler with ProfilerActivity.CPU and ProfilerActivity.CUDA, nsys profile -t cuda,nvtx, or "
                "ds4lab audit run -- python PROGRAM ARGS (the host calls, and every launch's kernel arguments)")
FROZEN_VALUE, FROZEN_ADDRESS, RING_SLOT = "frozen value", "frozen address", "ring-buffer slot"
TEMPORARY, UNKNOWN_ADDRESS = "step temporary", "unknown address"
UNSET = "unset bytes"
#: A changing word of an operator whose host arguments change, that follows none of them and addresses nothing.
NOT_VALUE = "not a value of the step"
#: A launch at the head of the token that writes the step's input from the host (INPUT_RULE).
INPUT = "input written by the host"
#: A copy PyTorch refuses while a stream captures (an op-log finding, not an argument class).
HOST_COPY = "pageable host copy"
CLASSES = (FROZEN_VALUE, FROZEN_ADDRESS, RING_SLOT, TEMPORARY, UNKNOWN_ADDRESS, UNSET, NOT_VALUE, INPUT)
#: Classes listed apart: bytes with no evidence that the step computes them (never decide a verdict).
NOT_VALUES = (UNSET, NOT_VALUE)
#: How strong the evidence of a finding that makes a replay wrong is (the verdict names the strongest first):
#: a word that follows a host argument of its PyTorch operator, or a by-value argument outside any operator
#: that moves by a constant per token (a position); a grid, block or launch count that changes; an address
#: that moves by a constant stride into memory that outlives the step; any other frozen address; any other
#: by-value argument that changes.
STRENGTH = {"tracked": 5, "position": 5, "structure": 4, "slot": 4, "address": 3, "value": 2}
#: Classes that make a replay wrong.
FROZEN = (FROZEN_VALUE, FROZEN_ADDRESS, RING_SLOT)
POOL_RULE = ("torch.cuda.graph captures into a private memory pool: every allocation the step makes during "
             "capture comes from that pool and stays the graph's, so each replay uses the same temporaries, "
             "and an address that moves between eager tokens only because the caching allocator handed out "
             "another block is the same buffer in every replay (PyTorch, 'CUDA Graphs': graph memory "
             "management; CUDA Programming Guide, 'CUDA Graphs': stream-ordered allocation in graphs)")
UNSET_RULE = ("a PyTorch operator's kernels get their by-value arguments from the operator's host arguments (sizes, "
              "strides, dtypes and storage offsets of its tensors, its scalars, the values of the CPU tensors it "
              "reads) and data pointers; a word that differs between tokens while every one of those is the same "
              "was set by none of them: an unused slot of a by-value struct (TensorIterator's offset calculators "
              "hold MAX_DIMS slots and set the tensor's rank: aten/src/ATen/cuda/detail/OffsetCalculator.cuh), "
              "padding, whatever the host stack held; the kernel computes the same result from it at every token "
              "(the operator log of the argument pass: ds4lab.trace.torch_ops); such a word that falls inside a "
              "live allocation is taken for no address only when it is odd and outside every tensor of the "
              "operator (no element wider than a byte starts there; the allocator's blocks are 512-byte aligned)")
TRACK_RULE = ("a PyTorch operator's kernels get their by-value arguments from the operator's host arguments: a word "
              "that changes while those change is a value of the step only where it follows one of them from token "
              "to token (equal to it, its negation or reciprocal, or an affine function of it over three or more "
              "values, read as an integer or as a float32/float64 within 1e-6); a word that follows none and "
              "addresses nothing alive is bytes no argument set (TensorIterator's unused offset-calculator slots, a "
              "functor's padding) or a number no kernel reads (the operator log: ds4lab.trace.torch_ops)")
INPUT_RULE = ("torch.cuda.graph replays a step on static inputs the host writes before each replay (PyTorch, 'CUDA "
              "Graphs': fill the static inputs, then replay): the launches at the head of a token that write host "
              "values into memory that outlives the tokens (aten::fill_ with a host scalar, copy_ from a CPU "
              "tensor, zero_; and a fill or copy that is the same in every token), before any other work of the "
              "token, are its inputs, not its work; their changing values and their pageable copies decide no "
              "verdict (a graph of the step leaves them out; one captured around them would freeze them)")
HOST_COPY_RULE = ("PyTorch refuses a copy between a CPU tensor that is not pinned and a CUDA tensor while the "
                  "current stream captures ('Cannot copy between CPU and CUDA tensors during CUDA graph capture "
                  "unless the CPU tensor is pinned': aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda), "
                  "a 0-dim source included, where CUDA alone would capture the copy as a memcpy node; conformance: "
                  "ds4lab.audit.torch_rules, scenario pageable_copy_0dim / pageable_copy_1d")
NODE_RULE = ("CUDA Programming Guide, 'CUDA Graphs': a kernel node keeps the arguments it was captured with; "
             "a new value needs cudaGraphExecKernelNodeSetParams or a new capture")
RECORD_COMMAND = ("ds4lab audit run -- python PROGRAM ARGS (records every launch's kernel arguments in a second, "
                  "untimed pass), or in Python: with ds4lab.audit.arguments.recording(arguments=True): ...")
FIXES = {
    FROZEN_VALUE: "read it from a device buffer written before each replay (a static input tensor), or update the "
                  "node (cudaGraphExecKernelNodeSetParams / cudaGraphExecUpdate)",
    FROZEN_ADDRESS: "give the kernel one static buffer (copy the new input into it before each replay), or index "
                    "on the device from a position held in device memory",
    RING_SLOT: "pass the base address and read the slot index from device memory (cache_position as a device "
               "tensor), not a host-computed slot address",
    TEMPORARY: "nothing: harmless under the graph's private memory pool",
    UNSET: "nothing: no host argument of the operator set it",
    NOT_VALUE: "nothing: no host number of the operator reaches it",
    INPUT: "capture the step after its inputs are written (write them into the static buffers before each replay)",
    HOST_COPY: "pin the CPU tensor (tensor.pin_memory(), or allocate it with pin_memory=True) and copy it "
               "before the replay, or compute the value on the device",
    UNKNOWN_ADDRESS: "record the allocations (an argument pass where torch is loaded, or cudaMalloc inside the "
                     "recording) so the address can be placed",
}


@dataclass
class ArgumentAudit:
    """What :func:`compare` found in one argument pass: ``findings`` (one row per kernel, class, parameter and
    offset: ``kind``, ``name``, ``call_class``, ``launch_index``, ``launches``, ``param``, ``byte_offset``, ``size``,
    ``values``, ``token_range``, ``tokens``, ``count``, ``what``, ``where``, ``fix``, ``verdict``, ``rule_source``),
    ``compared`` (tokens), ``launches`` (per token), ``unread``, ``unread_kernels``, ``how``, ``notes``, ``source``,
    ``cost``."""

    findings: pd.DataFrame
    compared: list
    launches: int
    unread: int = 0
    unread_kernels: list = field(default_factory=list)
    how: str = ""
    notes: list = field(default_factory=list)
    source: str = ""
    cost: dict = field(default_factory=dict)
    #: the operator calls PyTorch refuses under capture (pageable host copies in the tokens), one row each
    refusals: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: whether the pass logged the framework's operators (unset words can only be told where it did)
    op_log: bool = False

    @property
    def frozen(self) -> pd.DataFrame:
        f = self.findings
        return f[f["call_class"].isin(FROZEN)] if len(f) else f

    @property
    def complete(self) -> bool:
        """Compared argument by argument: two or more tokens, every launch read, no unknown address."""
        f = self.findings
        return (len(self.compared) >= 2 and self.unread == 0
                and not (len(f) and (f["call_class"] == UNKNOWN_ADDRESS).any()))


@dataclass(frozen=True)
class Verdict:
    """The replay verdict of one audited step: ``verdict`` (:data:`RIGHT`, :data:`WRONG`, :data:`REFUSED`,
    :data:`UNKNOWN`), ``why`` (the finding that decides it, the strongest first, and how many others; or what is
    missing), ``evidence`` (what was compared), ``command`` (what records the missing evidence; "" when nothing is
    missing)."""

    verdict: str
    why: str
    evidence: str = ""
    command: str = ""
    #: the finding that decides it (:func:`_lead`: kind, name, call_class, param, byte_offset, where,
    #: evidence); {} where nothing found decides it
    lead: dict = field(default_factory=dict)
    #: how many other findings would decide it too
    others: int = 0

    def text(self) -> str:
        return (f"{self.verdict}: {self.why}" + (f"; {self.evidence}" if self.evidence else "")
                + (f"; record it with {self.command}" if self.command else ""))


# ----------------------------------------------------------------------------- the comparison
class _Allocations:
    """The pass's allocations as arrays, for placing values (innermost alive allocation)."""

    def __init__(self, store: A.ArgumentStore) -> None:
        a = np.array([x[:4] for x in store.allocations], dtype=np.float64).reshape(-1, 4)
        self.base, self.size, self.alloc, self.free = (a[:, i] for i in range(4))
        self.src = [x[4] for x in store.allocations]
        self.ranges = store.ranges
        self.segments = [tuple(s) for s in (store.segments or [])]

    def place(self, v: int, at_ns: int):
        """``(source, base, size, alloc_ns, free_ns)`` of the smallest allocation holding ``v`` alive at ``at_ns``,
        else its driver range at the pass's end (``alloc_ns`` -1), else None."""
        if len(self.base):
            m = ((self.base <= v) & (v < self.base + self.size) & ((self.alloc < 0) | (self.alloc <= at_ns))
                 & ((self.free < 0) | (self.free >= at_ns)))
            idx = np.flatnonzero(m)
            if len(idx):
                i = int(idx[np.argmin(self.size[idx])])
                return (self.src[i], int(self.base[i]), int(self.size[i]), int(self.alloc[i]), int(self.free[i]))
        r = self.ranges.get(int(v))
        if r is not None:
            seg = any(b <= v < b + s for b, s in self.segments)
            return ("caching-allocator segment" if seg else "driver range", int(r[0]), int(r[1]), -1, -1)
        return None


def _lifetime(loc, start: int, end: int, first: int, last: int) -> str:
    """``own`` (allocated inside this token), ``persistent`` (before the tokens, alive after them), ``carried`` (made
    between tokens or by an earlier one, or freed before the last) or ``unknown``."""
    if loc is None or loc[0] == "caching-allocator segment":
        return "unknown"
    _, _, _, alloc, free = loc
    if alloc >= 0 and start <= alloc < end:
        return "own"
    if (alloc < 0 or alloc < first) and (free < 0 or free > last):
        return "persistent"
    return "carried"


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def _scalar_text(piece_vals: list[bytes]) -> list[str]:
    """Each value as its signed little-endian integer (a float's bit pattern: only its change counts)."""
    return [str(int.from_bytes(b, "little", signed=True)) for b in piece_vals]


def _position_like(ints: list[int]) -> str:
    d = np.diff(np.array(ints, dtype=np.float64))
    if len(d) and np.all(d == d[0]) and d[0] != 0:
        return f"{d[0]:+g} per token"
    return ""


def compare(store: A.ArgumentStore, table, *, token_range: str | None = None, source: str = "") -> ArgumentAudit:
    """Compare the argument pass ``store`` over its event ``table`` (module docstring)."""
    from .tokens import NoTokens

    try:
        tl = A.token_launches(table, token_range or store.token_range)
    except NoTokens as e:
        return ArgumentAudit(pd.DataFrame(), [], 0, notes=[f"no tokens in the argument pass: {e}"], source=source,
                             cost=store.cost)
    allocs = _Allocations(store)
    rows, unread, unread_k, compared = [], 0, set(), []
    groups = tl.groups()
    notes = list(store.notes)
    if not groups:
        notes.append("no two tokens of the argument pass have identical launch lists: nothing compared")
    head_end: dict = {}  # token -> when its inputs written by the host end (INPUT_RULE)
    for g in groups:
        compared += g
        first, last = tl.start_ns[g[0]], tl.end_ns[g[-1]]
        head = _head_inputs(store, tl, g, allocs, first, last)
        for t in g:
            head_end[t] = tl.tokens[t][len(head)][2] if len(head) < len(tl.tokens[t]) else tl.end_ns[t]
        for i in range(len(tl.tokens[g[0]])):
            launches = [tl.tokens[t][i] for t in g]
            name = launches[0][1]
            recs = [store.launches.get(c) for c, _, _ in launches]
            if any(r is None or r[1] is None for r in recs):
                unread += len(g)
                unread_k.add(name)
                continue
            if len({r[1] for r in recs}) == 1:
                continue
            if i in head:
                rows.append(_input_row(name, i, launches, g, store))
                continue
            vals = [store.params(c) for c, _, _ in launches]
            if any(b is None or p is None for _, p, b in vals):
                unread += len(g)
                unread_k.add(name)
                continue
            layout = vals[0][1]
            chunks = [A.split(layout, b) for _, _, b in vals]
            stack = next((store.stacks[c] for c, _, _ in launches if c in store.stacks), "")
            for j, (off, size) in enumerate(layout):
                per_tok = [c[j] for c in chunks]
                if len(set(per_tok)) == 1:
                    continue
                pieces = [A.words(c) for c in per_tok]
                for w in range(len(pieces[0])):
                    wo = pieces[0][w][0]
                    pv = [p[w][1] for p in pieces]
                    if len(set(pv)) == 1:
                        continue
                    rows.append(_classify(name, i, j, off + wo, len(pv[0]), pv, launches, g, tl, allocs, first,
                                          last, stack, store))
    df = _merge(pd.DataFrame(rows))
    refusals = _host_copies(store, tl, table, head_end, allocs)
    if unread_k:
        notes.append(f"{unread:,} launch(es) in the compared tokens unread ({', '.join(sorted(unread_k)[:6])}"
                     f"{', …' if len(unread_k) > 6 else ''}): their arguments were not compared")
    n = len(tl.tokens[groups[0][0]]) if groups else 0
    if store.ops is None:
        notes.append("no operator log in the argument pass (torch not loaded, or a pass made before it was kept): a "
                     "changing word no allocation holds is taken as a value, never as bytes nobody set")
    return ArgumentAudit(df, sorted(compared), n, unread, sorted(unread_k), tl.how, notes, source, store.cost,
                         refusals, store.ops is not None)


def _ops_of(store: A.ArgumentStore, launches) -> list:
    """The operator call that made each launch (None where the op log has none)."""
    if store.ops is None:
        return [None] * len(launches)
    return [store.ops.get(store.op_of.get(c, -1)) for c, _, _ in launches]


def _operator_known(ops: list) -> bool:
    """Whether every launch was made by the same operator the op log described, none opaque or random."""
    from ..trace.torch_ops import random_op

    if not ops or any(o is None or "key" not in o for o in ops):
        return False
    o0 = ops[0]
    return not (any(o["name"] != o0["name"] or o.get("opaque") for o in ops) or random_op(o0["name"]))


def _same_operator(ops: list) -> bool:
    """Whether every launch was made by the same operator with the same host-argument key (:func:`_operator_known`)."""
    return _operator_known(ops) and len({o["key"] for o in ops}) == 1


def _addresses_nothing(ops: list, ints: list[int], locs: list, lives: list) -> str | None:
    """:data:`TEMPORARY` or :data:`UNSET` where each token's value is inside memory the token allocated or no
    address of anything alive (:func:`_no_address`), never inside the operator's own tensors; else None."""
    own = False
    for o, v, loc, life in zip(ops, ints, locs, lives):
        if life == "own":
            own = True
            continue
        spans = o.get("spans", ())
        if any(b <= v < b + n for b, n in spans):
            return None
        if loc is not None and loc[0] != "caching-allocator segment" and not _no_address(v, spans):
            return None
    return TEMPORARY if own else UNSET


#: Relative tolerance of a float word against the host number it follows (a double rounded to float32:
#: 6e-8; headroom for an opmath conversion).
FLOAT_RTOL = 1e-6


def _decodings(pv: list[bytes]) -> list[tuple[str, list]]:
    """The ways a word's bytes can hold a number, as ``(name, value per token)``: the signed word, and for 8
    bytes its int32 halves, float64 and float32 (a functor's ``opmath`` scalar)."""
    import struct

    n = len(pv[0])
    out = [("int", [int.from_bytes(b, "little", signed=True) for b in pv])]
    if n == 8:
        out += [("int32", [int.from_bytes(b[:4], "little", signed=True) for b in pv]),
                ("int32 (high half)", [int.from_bytes(b[4:], "little", signed=True) for b in pv]),
                ("float64", [struct.unpack("<d", b)[0] for b in pv]),
                ("float32", [struct.unpack("<f", b[:4])[0] for b in pv]),
                ("float32 (high half)", [struct.unpack("<f", b[4:])[0] for b in pv])]
    elif n == 4:
        out.append(("float32", [struct.unpack("<f", b)[0] for b in pv]))
    return [(name, v) for name, v in out if len(set(v)) > 1 and (name.startswith("int") or all(_plausible(x) for x in v))]


def _plausible(x: float) -> bool:
    """Whether a float decoding can be a number a host computed: finite, zero or of a magnitude between 1e-30 and 1e30
    (bytes that are no float read as denormals, NaNs or huge exponents)."""
    return x == 0.0 or (x == x and 1e-30 < abs(x) < 1e30)


def _follows(word: list, host: list, exact_int: bool) -> str:
    """How ``word`` (per token) follows the host number ``host``, or "": equal, negated, reciprocal, or with three
    or more distinct values affine (integers exactly, floats within :data:`FLOAT_RTOL`)."""
    w = np.asarray(word, dtype=np.float64)
    h = np.asarray(host, dtype=np.float64)
    if len(set(host)) < 2:
        return ""
    tol = 0.0 if exact_int else FLOAT_RTOL

    def close(a, b):
        return bool(np.all(np.abs(a - b) <= tol * np.maximum(np.abs(b), 1e-30)))

    if close(w, h):
        return "equal to it"
    if close(w, -h):
        return "its negation"
    if not exact_int and np.all(h != 0) and close(w, 1.0 / h):
        return "its reciprocal"
    if len(set(host)) >= 3:
        a, b = np.polyfit(h, w, 1)
        if exact_int:
            a, b = round(a), round(b)
            ok = a != 0 and np.array_equal(w, a * h + b)
        else:
            ok = a != 0 and close(w, a * h + b)
        if ok:
            return f"{a:g}×it {b:+g}" if b else f"{a:g}×it"
    return ""


def _tracked(ops: list, pv: list[bytes]) -> dict | None:
    """The op log's changing host number a changing word follows (``{"label", "host", "decoding", "how"}``), or None."""
    if any("vals" not in o for o in ops):
        return None
    per = [dict((str(k), v) for k, v in o["vals"]) for o in ops]
    labels = [k for k in per[0] if all(k in p for p in per[1:])]
    moving = [(k, [p[k] for p in per]) for k in labels if len({p[k] for p in per}) > 1]
    if not moving:
        return None
    for name, word in _decodings(pv):
        exact = name.startswith("int")
        for k, host in moving:
            if exact and not all(float(x).is_integer() for x in host):
                continue
            how = _follows(word, host, exact)
            if how:
                return {"label": k, "host": host, "decoding": name, "how": how}
    return None


def _no_address(v: int, spans) -> bool:
    """Whether a word inside a live allocation is still no address the operator's kernel uses: odd (blocks are
    512-byte aligned) and outside every tensor of the operator (``spans``), as an unused slot holding a 32-bit
    field and the top of a host pointer reads."""
    return bool(spans) and v % 2 == 1


def _set_by(ops: list) -> str:
    """``; set by aten::lt.Scalar(…, 10) … (…, 12)``: the operator whose host arguments changed, where known."""
    if not ops or any(o is None or "key" not in o for o in ops) or len({o["key"] for o in ops}) < 2:
        return ""
    texts = list(dict.fromkeys(o["text"] for o in ops))
    return (f"; set by {ops[0]['name']} from host arguments that change: ({texts[0]})"
            + (f" … ({texts[-1]})" if len(texts) > 1 else ""))


#: Frames of CUDA libraries other than PyTorch: a pageable copy whose stack names one is not PyTorch's.
OTHER_CUDA_LIBRARIES = re.compile(r"(^|[/;\s])(cupy(x|_backends)?|numba|cuda/(bindings|core)|pycuda)/")


def _host_copies(store: A.ArgumentStore, tl, table=None, head_end=None, allocs=None) -> pd.DataFrame:
    """One row per (call, frame) of the copies between pageable host memory and the GPU inside a token of a pass
    that ran PyTorch (:data:`HOST_COPY_RULE`): the op log's ``copy_``/``_to_copy`` from an unpinned CPU tensor,
    and the pass's pageable CUDA copies unless the stack names another CUDA library."""
    if store.ops is None:
        return pd.DataFrame()
    by: dict = {}

    def add(key, toks, make):
        r = by.get(key)
        if r is None:
            r = by[key] = {**make(), "_toks": set(), "count": 0}
        r["_toks"].update(toks)
        r["count"] += 1

    def tokens_at(t_ns):
        return [t for t in range(len(tl.tokens)) if tl.start_ns[t] <= t_ns < tl.end_ns[t]]

    def row(name, text, what, where):
        return {"kind": "framework call", "name": name, "call_class": HOST_COPY, "launch_index": -1, "param": -1,
                "byte_offset": -1, "size": 0, "values": text, "what": what + ": PyTorch refuses it while the stream "
                "captures", "where": where, "fix": FIXES[HOST_COPY], "verdict": "invalidates",
                "rule_source": HOST_COPY_RULE}

    for o in store.ops.values():
        c = o.get("copy")
        toks = tokens_at(o["t_ns"]) if c else []
        if toks and head_end and allocs is not None and c.get("direction") == "h2d" and _input_copy(o, toks, tl,
                                                                                                  head_end, allocs):
            continue  # the step's input, written by the host before its work: outside a graph of the step
        if not toks:
            continue
        where = user_frame(c.get("stack", "")) or ""
        direction = "host-to-device" if c["direction"] == "h2d" else "device-to-host"
        add((o["name"], where), toks, lambda: row(
            o["name"], o["text"], f"{o['name']}({o['text']}): a {direction} copy of a {c['dim']}-dim CPU tensor that "
            f"is not pinned", where))
    if table is not None:
        f = table.frame
        cp = f[(f["kind"] == "memcpy") & (f["host_memory"] == "pageable") & f["copy_kind"].isin(("HtoD", "DtoH"))]
        api = f[f["kind"] == "api"].drop_duplicates("correlation").set_index("correlation")
        for _, m in cp.iterrows():
            a = api.loc[m["correlation"]] if m["correlation"] in api.index else None
            t0 = int(a["start_ns"]) if a is not None else int(m["start_ns"])
            toks = tokens_at(t0)
            stack = str(a["stack"]) if a is not None else ""
            if not toks or OTHER_CUDA_LIBRARIES.search(stack):
                continue
            where = user_frame(stack) or ""
            name = str(a["name"]) if a is not None else "cudaMemcpyAsync"
            direction = "host-to-device" if m["copy_kind"] == "HtoD" else "device-to-host"
            add((name, where), toks, lambda: row(
                name, f"{int(m['bytes'])} B", f"{name}: a {direction} copy of {int(m['bytes'])} B with pageable host "
                f"memory, made in a pass that ran PyTorch (a torch.tensor(..., device='cuda'), .to(), .cpu(), "
                f".tolist(): PyTorch's copy_kernel_cuda)", where))
    rows = []
    for r in by.values():
        toks = sorted(r.pop("_toks"))
        rows.append({**r, "token_range": compact_ranges(toks), "tokens": len(toks), "launches": ""})
    return pd.DataFrame(rows)


#: Operators that write host values into their ``self`` (a fill with a host scalar, a copy from a CPU
#: tensor, a zeroing): at the head of a token into memory that outlives it, the step's inputs (INPUT_RULE).
INPUT_OPS = ("aten::fill_", "aten::copy_", "aten::zero_")
#: Kernels PyTorch fills and copies with (a launch identical in every token keeps no operator in the store).
INPUT_KERNELS = re.compile(r"FillFunctor|copy_kernel|fill_kernel")


def _input_write(o) -> bool:
    """Whether an operator call writes host values only into its ``self``: an :data:`INPUT_OPS` call whose only device
    storage is one (``self``'s; a copy from another device tensor is the step's work)."""
    return (o is not None and str(o.get("name", "")).split(".", 1)[0] in INPUT_OPS and bool(o.get("spans"))
            and len({b for b, _ in o["spans"]}) == 1 and not o.get("opaque"))


def _persistent(o, at_ns: int, t: int, tl, allocs, first, last) -> bool:
    """Whether the storage an operator call writes (its first span) outlives the tokens (INPUT_RULE)."""
    loc = allocs.place(int(o["spans"][0][0]), at_ns)
    return _lifetime(loc, tl.start_ns[t], tl.end_ns[t], first, last) == "persistent"


def _head_inputs(store, tl, g, allocs, first, last) -> set:
    """The launch indexes at the head of the tokens ``g`` that write the step's inputs from the host
    (:data:`INPUT_RULE`): :data:`INPUT_OPS` calls writing into memory that outlives the tokens, or
    :data:`INPUT_KERNELS` the same in every token; empty without an operator log."""
    out: set = set()
    if store.ops is None:
        return out
    known = -1  # the last launch known (from the op log) to write an input: the head ends after it
    for i in range(len(tl.tokens[g[0]])):
        launches = [tl.tokens[t][i] for t in g]
        ops = _ops_of(store, launches)
        if all(o is None for o in ops):
            digests = {(store.launches.get(c) or ["", None])[1] for c, _, _ in launches}
            if len(digests) == 1 and None not in digests and INPUT_KERNELS.search(launches[0][1]):
                out.add(i)
                continue
            break
        if not all(_input_write(o) and _persistent(o, at, t, tl, allocs, first, last)
                   for o, (_, _, at), t in zip(ops, launches, g)):
            break
        out.add(i)
        known = i
    return {i for i in out if i <= known}


def _input_copy(o, toks, tl, head_end, allocs) -> bool:
    """Whether an op-log pageable copy is a token's input written at its head into memory that outlives the tokens."""
    t = toks[0]
    if t not in head_end or o["t_ns"] >= head_end[t] or not o.get("spans"):
        return False
    starts = [tl.start_ns[k] for k in head_end]
    first, last = min(starts), max(tl.end_ns[k] for k in head_end)
    return _persistent(o, o["t_ns"], t, tl, allocs, first, last)


def _input_row(name, i, launches, g, store) -> dict:
    """A changing launch at the head of the token that writes the step's input from the host (INPUT_RULE)."""
    ops = _ops_of(store, launches)
    texts = list(dict.fromkeys(o["text"] for o in ops))
    what = (f"launch {i} of the token writes the step's input from the host: {ops[0]['name']}({texts[0]})"
            + (f" … ({texts[-1]})" if len(texts) > 1 else "") + ", into memory that outlives the step, before any "
            "of its work: a graph of the step leaves it out, and it is written before each replay")
    return {"kind": "argument", "name": name, "launch_index": i, "launches": str(i), "param": -1, "byte_offset": -1,
            "size": 0, "token_range": compact_ranges(g), "tokens": len(g), "count": len(g),
            "where": "", "call_class": INPUT, "values": "; ".join(texts[:4]), "what": what, "fix": FIXES[INPUT],
            "verdict": "allowed", "rule_source": INPUT_RULE, "evidence": f"{ops[0]['name']} at the head of the token",
            "strength": 0}


def _classify(name, i, j, offset, size, pv, launches, g, tl, allocs, first, last, stack, store) -> dict:
    """One changing word (``pv``: its bytes per compared token) classed (:data:`CLASSES`, module docstring), with the
    ``evidence`` that decides its class and the ``strength`` of that evidence (:data:`STRENGTH`)."""
    ints = [int.from_bytes(b, "little", signed=False) for b in pv]
    locs = [allocs.place(v, at) for v, (_, _, at) in zip(ints, launches)] if size == 8 else [None] * len(pv)
    modal = pv[0]
    odd = [t for t, b in zip(g, pv) if b != modal]
    base = {"kind": "argument", "name": name, "launch_index": i, "param": j, "byte_offset": offset, "size": size,
            "token_range": compact_ranges(odd), "tokens": len(odd), "count": len(g), "where": user_frame(stack) or "",
            "rule_source": NODE_RULE}
    lives = [_lifetime(loc, tl.start_ns[t], tl.end_ns[t], first, last) for loc, t in zip(locs, g)]
    ops = _ops_of(store, launches)
    known = _operator_known(ops)
    same = known and _same_operator(ops)
    why = _addresses_nothing(ops, ints, locs, lives) if known and not all(x == "own" for x in lives) else None
    at = f"launch {i} of the token, parameter {j} (byte {offset}, {size} B)"
    if why == UNSET and not same:  # the operator's host arguments change: a value only where the word follows one
        tr = _tracked(ops, pv) if all("vals" in o for o in ops) else None
        if tr is None and all("vals" in o for o in ops):
            shown = _scalar_text(pv) if all(x is None for x in locs) else [f"0x{v:x}" for v in ints]
            what = (f"{at}: {', '.join(shown[:4])}{', …' if len(shown) > 4 else ''}, follows none of the host "
                    f"numbers of {ops[0]['name']} that change ({_moving(ops)}) and is no address of anything alive: "
                    "not a value of the step (bytes no argument set, or set from something no kernel reads)")
            return {**base, "call_class": NOT_VALUE, "values": ", ".join(shown[:8]), "what": what,
                    "fix": FIXES[NOT_VALUE], "verdict": "allowed", "rule_source": TRACK_RULE,
                    "evidence": f"follows none of {ops[0]['name']}'s changing host numbers", "strength": 0}
        if tr is not None:
            shown = _scalar_text(pv)
            values = ", ".join(_show(v) for v in tr["host"][:6]) + (", …" if len(tr["host"]) > 6 else "")
            step = _position_like([int(x) for x in shown])
            what = (f"{at} by value: {', '.join(shown[:6])}{', …' if len(shown) > 6 else ''}, as {tr['decoding']}, "
                    f"{tr['how']} of {ops[0]['name']}'s host argument {tr['label']} ({values})"
                    + (f"; {step}" if step else "") + _set_by(ops) + ": the graph replays the captured value")
            return {**base, "call_class": FROZEN_VALUE, "values": ", ".join(shown[:8]), "what": what,
                    "fix": FIXES[FROZEN_VALUE], "verdict": "frozen", "rule_source": f"{TRACK_RULE}; {NODE_RULE}",
                    "evidence": f"{ops[0]['name']}'s {tr['label']}: {values}" + (f" ({step})" if step else ""),
                    "strength": STRENGTH["tracked"]}
        why = None  # an op log without the numbers (an older pass): the parameter-level comparison below
    if why is not None:
        shown = (_scalar_text(pv) if all(x is None for x in locs)
                 else [f"0x{v:x}" for v in ints])
        same_ = (f"every host argument of {ops[0]['name']} ({ops[0]['text'][:120]}) is the same at every token"
                 if same else f"it follows none of the host numbers of {ops[0]['name']} that change")
        what = (f"{at}: {', '.join(shown[:4])}{', …' if len(shown) > 4 else ''}, while {same_}: "
                + ("bytes no argument set" if why == UNSET else
                   "an address of the token's own temporaries in some tokens, no live address in the others"))
        return {**base, "call_class": why, "values": ", ".join(shown[:8]), "what": what, "fix": FIXES[why],
                "verdict": "allowed", "rule_source": UNSET_RULE if why == UNSET else f"{UNSET_RULE}; {POOL_RULE}",
                "evidence": f"{ops[0]['name']}'s host arguments are the same at every token", "strength": 0}
    if all(x is None for x in locs):
        shown = _scalar_text(pv)
        step = _position_like([int(s) for s in shown])
        what = (f"{at} by value: "
                f"{', '.join(shown[:6])}{', …' if len(shown) > 6 else ''}"
                + (f" ({step}: a position, a length or a write index)" if step else "")
                + _set_by(ops) + ": the graph replays the captured value")
        outside = "outside any PyTorch operator" if ops[0] is None else f"under {ops[0]['name']}"
        return {**base, "call_class": FROZEN_VALUE, "values": ", ".join(shown[:8]), "what": what,
                "fix": FIXES[FROZEN_VALUE], "verdict": "frozen",
                "evidence": f"by value {outside}: {', '.join(shown[:4])}" + (f" ({step})" if step else ""),
                "strength": STRENGTH["position"] if step else STRENGTH["value"]}
    hexes = ", ".join(f"0x{v:x}" for v in ints[:6]) + (", …" if len(ints) > 6 else "")
    loc0 = next(x for x in locs if x is not None)
    into = f"{loc0[0]} of {_size(loc0[2])} at 0x{loc0[1]:x}"
    stride = _position_like(ints)
    strength = 0
    if all(x == "own" for x in lives):
        cls, verdict = TEMPORARY, "allowed"
        what = (f"launch {i}, parameter {j} (byte {offset}): address {hexes}, each inside memory the token "
                f"itself allocated ({into}): a temporary, harmless under the graph's private pool")
        rule = POOL_RULE
        evidence = "inside the token's own allocations"
    elif "carried" in lives or "persistent" in lives:
        cls = RING_SLOT if stride and "persistent" in lives and "carried" not in lives else FROZEN_ADDRESS
        verdict = "frozen"
        if "carried" in lives:
            kind = ("memory allocated between tokens or by an earlier token and used by this one (a new input "
                    "tensor each step, a cache grown by concatenation): the graph reads the captured step's")
        else:
            kind = ("memory that exists before the tokens and outlives them (a KV cache, weights, a static "
                    "input buffer): the graph reads or writes the captured location")
        what = (f"launch {i}, parameter {j} (byte {offset}): address {hexes} into {into}, {kind}"
                + (f"; it moves by {stride} bytes (a ring buffer's slot, a write index as an address)"
                   if stride else ""))
        rule = NODE_RULE
        strength = STRENGTH["slot"] if cls == RING_SLOT else STRENGTH["address"]
        evidence = (f"an address into {into}" + (f" moving by {stride} bytes" if stride else "")
                    + (" (memory that outlives the step)" if "carried" not in lives else " (made between tokens)"))
    else:
        cls, verdict = UNKNOWN_ADDRESS, "unknown"
        what = (f"launch {i}, parameter {j} (byte {offset}): address {hexes} into memory of unknown lifetime "
                f"({into}; no block or allocation record places it)")
        rule = NODE_RULE
        evidence = f"an address into {into} of unknown lifetime"
    return {**base, "call_class": cls, "values": hexes, "what": what, "fix": FIXES[cls], "verdict": verdict,
            "rule_source": rule, "evidence": evidence, "strength": strength}


def _show(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _moving(ops: list) -> str:
    """The operator's host numbers that change between the calls, as ``label a … b`` (the first three)."""
    per = [dict((str(k), v) for k, v in o.get("vals", ())) for o in ops]
    moving = [k for k in per[0] if all(k in p for p in per[1:]) and len({p[k] for p in per}) > 1]
    if not moving:
        return "no number of them: their key differs elsewhere"
    return "; ".join(f"{k} {_show(per[0][k])} … {_show(per[-1][k])}" for k in moving[:3]) + (
        f"; {len(moving) - 3} more" if len(moving) > 3 else "")


def _merge(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (kernel, class, parameter, offset, where): alike launches in every layer read once."""
    if df.empty:
        return df
    out = []
    for _, g in df.groupby(["name", "call_class", "param", "byte_offset", "where"], sort=False):
        r = g.iloc[0].to_dict()
        idx = sorted(g["launch_index"].tolist())
        r["launches"] = compact_ranges(idx)
        r["launch_index"] = idx[0]
        if len(g) > 1:
            r["what"] += f" (and {len(g) - 1} more launch(es) of it alike: {compact_ranges(idx)})"
        out.append(r)
    order = {c: k for k, c in enumerate(CLASSES)}
    res = pd.DataFrame(out)
    # the strongest evidence first (STRENGTH), then the finding seen in more tokens, then by class and launch
    ntok = pd.to_numeric(res["tokens"], errors="coerce").fillna(0) if "tokens" in res else 0
    return res.assign(_o=res["call_class"].map(order), _s=-res["strength"], _t=-ntok).sort_values(
        ["_s", "_t", "_o", "launch_index"], kind="stable").drop(columns=["_o", "_s", "_t"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- reports and the verdict
#: How a report's note begins where the argument pass beside its recording was refused.
ARGUMENTS_NOT_USED = "argument pass not used:"


def attach(report, store_path=None, own_table=None, own_path=None, *, recorded=None) -> None:
    """Compare the argument pass at ``store_path`` onto ``report.arguments``, its frozen rows among
    ``report.findings``; the pass's table is the file the store names (``own_table`` when that is ``own_path``).
    ``recorded``: the recording's table (default ``own_table``), whose header names the program. A pass of
    another program (:func:`ds4lab.audit.pairing.check_same_program`), or, where the headers cannot tell, one
    whose tokens launch other kernel counts than the recording's, is refused: ``report.arguments`` stays None,
    ``report.arguments_refused`` and a note (:data:`ARGUMENTS_NOT_USED`) say why, and the verdict is unknown.
    No store: ``report.arguments`` stays None. Raises ValueError (SourceError) where the store or its table cannot
    be read, ``report.arguments_refused`` naming the damaged file and its defect first."""
    if store_path is None:
        return
    from ..trace.sources import read_events as read

    store_path = Path(store_path)
    src = None
    try:
        store = A.load(store_path)
        src = store_path.with_name(store.table) if store.table else None
        if own_table is not None and (src is None or _same(src, own_path)):
            table = own_table
        elif src is not None and src.is_file():
            table = read(src)
            table.source = str(src)
        else:
            table = None
    except ValueError as e:  # SourceError included: a damaged file, named with its defect
        name = Path(src).name if src is not None else store_path.name
        report.arguments_refused = f"{name} cannot be read: {_without_path(str(e), src or store_path)}"
        raise
    if table is None:
        report.arguments_refused = f"its event table {store.table or '?'} is missing beside {store_path.name}"
        report.notes.append(f"{store_path}: its event table {store.table or '?'} is missing: arguments not compared")
        return
    aa = compare(store, table, source=str(store_path))
    recorded = recorded if recorded is not None else own_table
    if recorded is not None and table is not own_table and not _paired(report, table, recorded, aa):
        return
    report.arguments = aa
    for rows, verdict_, severity in ((aa.refusals, "invalidates", 6), (aa.frozen, "frozen", 5)):
        if not len(rows):
            continue
        add = rows.copy()
        for m in report.modes:
            add[f"verdict_{m}"] = verdict_
            add[f"rule_{m}"] = ""
            add[f"error_{m}"] = ""
        add["severity"] = severity
        add = add.drop(columns=["verdict"])
        report.findings = pd.concat([x for x in (report.findings, add) if x is not None and len(x)], ignore_index=True)


def _without_path(msg: str, path) -> str:
    """``msg`` without a leading ``<path>: `` (the file is named apart)."""
    head = f"{path}: "
    return msg[len(head):] if msg.startswith(head) else msg


def _paired(report, table, recorded, aa) -> bool:
    """Whether the argument pass ``table`` (compared: ``aa``) may stand for ``report``'s recording ``recorded``;
    where not, ``report.arguments_refused`` and a note say why."""
    from .pairing import check_same_program, names_program

    try:
        check_same_program(table, recorded)
        if not names_program(table, recorded):
            _same_launches(report, table, aa)
    except ValueError as e:
        report.arguments_refused = f"refused, not a pass of this program: {e}"
        report.notes.append(f"{ARGUMENTS_NOT_USED} {e}")
        return False
    return True


def _same_launches(report, table, aa) -> None:
    """Refuse (ValueError) an argument pass none of whose compared tokens launches as many kernels as a token
    of ``report`` (a pass whose header does not name its program: its launches are all that can tell)."""
    from .tokens import launch_order
    from .variation import launches

    if report.unit is None or not aa.launches:
        return
    k = launches(report.unit.frame, launch_order(report.unit), report.tokens.token)
    ours = sorted({int(n) for n in k.groupby("token").size()})
    if aa.launches not in ours:
        raise ValueError(f"{table.source}: its tokens launch {aa.launches} kernels each where the recording's "
                         f"launch {', '.join(map(str, ours[:4]))}: not a pass of these tokens")


def _same(a, b) -> bool:
    try:
        return b is not None and Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def strength(row) -> int:
    """How strong a finding's evidence of a wrong replay is (:data:`STRENGTH`; docs/audit-arguments.md)."""
    st = row.get("strength") if hasattr(row, "get") else None
    if st is not None and st == st:
        return int(st)
    cls = str(row.get("call_class", ""))
    if cls in ("grid", "block", "launch count", "present in some tokens only"):
        return STRENGTH["structure"]
    if cls == "scalar argument":
        return STRENGTH["position"] if "position-like" in str(row.get("what", "")) else STRENGTH["value"]
    return STRENGTH["address"]


def _tokens(row) -> int:
    """In how many tokens a finding was seen (its ``tokens`` column; 0 where a table has none)."""
    n = row.get("tokens") if hasattr(row, "get") else None
    try:
        return int(n) if n == n else 0
    except (TypeError, ValueError):
        return 0


def cause(row) -> str:
    """One line naming a finding: what (kernel or call), which parameter, what moves and how, where."""
    kind, name = str(row.get("kind", "")), str(row.get("name", ""))[:80]
    if kind == "argument":
        ev = row.get("evidence") if isinstance(row.get("evidence"), str) else ""
        what = f"kernel {name}, parameter {_int(row['param'])} (byte {_int(row['byte_offset'])}): {row['call_class']}"
        what += f", {ev}" if ev else f", {row.get('values', '')}"
    else:
        detail = str(row.get("what", ""))
        what = f"{kind} {name} ({row['call_class']}" + (f": {detail[:140]}" if detail else "") + ")"
    return f"{what} at {row.get('where') or '—'}"


def _int(v):
    """A number a concatenated table turned into a float, shown as the integer it is."""
    return int(v) if isinstance(v, float) and v == v and v.is_integer() else v


def verdict(report, mode: str = "global") -> Verdict:
    """The replay verdict of ``report`` in capture ``mode`` (docs/audit-arguments.md, "The verdict")."""
    f = report.findings
    col = f"verdict_{mode}"
    if f is not None and len(f) and col in f:
        mask = f[col].isin(("invalidates", "refused"))
        if mask.any():
            r = f[mask].iloc[0]
            return Verdict(REFUSED, f"{r['kind']} {str(r['name'])[:80]} ({r['call_class']}) at {r['where'] or '—'}",
                           _evidence(report), lead=_lead(r))
        mask = f[col].isin(("not in graph", "frozen"))
        if mask.any() and getattr(report, "host_blind", False):
            return _blind(report, f[mask].iloc[0])
        if mask.any():
            rows = [r for _, r in f[mask].iterrows()]
            # the strongest evidence first; among equals the finding seen in more tokens (stable: then the table's order)
            ranked = sorted(range(len(rows)), key=lambda k: (-strength(rows[k]), -_tokens(rows[k])))
            lead = rows[ranked[0]]
            n = len(rows) - 1
            return Verdict(WRONG, cause(lead) + (f"; and {n} other finding(s)" if n else ""), _evidence(report),
                           lead=_lead(lead), others=n)
    if getattr(report, "host_blind", False):
        return _blind(report)
    aa = getattr(report, "arguments", None)
    tool = report.tool or "this trace"
    refused = getattr(report, "arguments_refused", "")
    if aa is None and refused:
        return Verdict(UNKNOWN, f"the argument pass beside it was not used ({refused})", "", RECORD_COMMAND)
    if aa is None:
        return Verdict(UNKNOWN, f"{tool} carries no kernel arguments: a step whose launch list repeats may still "
                                "pass a host value (a position, a write index, a slot's address) to its kernels",
                       "", RECORD_COMMAND)
    if len(aa.frozen):
        r = aa.frozen.iloc[0]
        n = len(aa.frozen) - 1
        return Verdict(WRONG, cause(r) + (f"; and {n} other finding(s)" if n else ""), _evidence(report),
                       lead=_lead(r), others=n)
    untracked = aa.findings[aa.findings["call_class"] == NOT_VALUE] if len(aa.findings) else aa.findings
    if not aa.complete or len(untracked):
        why = ([f"{aa.unread:,} launch(es) of {len(aa.unread_kernels)} kernel(s) could not be read "
                f"({', '.join(aa.unread_kernels[:4])})"] if aa.unread else [])
        if len(aa.compared) < 2:
            why.append("no two tokens with identical launch lists were compared")
        if len(aa.findings) and (aa.findings["call_class"] == UNKNOWN_ADDRESS).any():
            why.append(f"{int((aa.findings['call_class'] == UNKNOWN_ADDRESS).sum())} changing address(es) of unknown "
                       "lifetime")
        if len(untracked):
            ops = sorted({str(w).split("follows none of ", 1)[-1].split("'s", 1)[0] for w in untracked["evidence"]})
            why.append(f"{len(untracked)} word(s) of operators whose host numbers change follow none of them "
                       f"({', '.join(ops[:3])}): whether those numbers reach the graph is not shown")
        return Verdict(UNKNOWN, "; ".join(why), _evidence(report),
                       "an argument pass over more tokens, with the allocations recorded" if not aa.unread else "")
    return Verdict(RIGHT, "nothing frozen feeds the step", _evidence(report))


def _blind(report, row=None) -> Verdict:
    """The verdict of a report whose tokens hold no API call: no call capture would refuse can be seen, and a
    kernel's token is taken from its device start alone (``row``: a variation that may come of it)."""
    why = ("the trace holds no API calls for these tokens: synchronizations, allocations, host reads and the launch "
           "calls themselves are not seen, so whether the stream captures is not shown")
    if row is not None:
        why += (f"; and {cause(row)} rests on device start times alone (which token launched each kernel is not "
                "recorded: the loop's work between tokens can land in one)")
    return Verdict(BLIND, why, "", HOST_COMMAND)


def _lead(row) -> dict:
    """The fields of the finding a verdict names (kind, name, class, parameter, byte, where, evidence)."""
    keys = ("kind", "name", "call_class", "param", "byte_offset", "where", "evidence", "values", "strength")
    out = {}
    for k in keys:
        v = row.get(k) if hasattr(row, "get") else None
        if v is None or (isinstance(v, float) and v != v):
            continue
        out[k] = _int(v.item() if hasattr(v, "item") else v)
    return out


def _evidence(report) -> str:
    aa = getattr(report, "arguments", None)
    if aa is None:
        return ""
    harmless = int((aa.findings["call_class"] == TEMPORARY).sum()) if len(aa.findings) else 0
    unset = int((aa.findings["call_class"] == UNSET).sum()) if len(aa.findings) else 0
    notv = int((aa.findings["call_class"] == NOT_VALUE).sum()) if len(aa.findings) else 0
    inputs = int((aa.findings["call_class"] == INPUT).sum()) if len(aa.findings) else 0
    if aa.launches and aa.unread >= aa.launches * max(len(aa.compared), 1):
        # nothing was read: saying "compared argument by argument" would claim evidence there is none of
        return (f"{len(aa.compared)} tokens with identical launch lists, but no launch's arguments could be read "
                f"({aa.unread:,} unread): no argument value compared")
    return (f"{len(aa.compared)} tokens with identical launch lists compared argument by argument "
            f"({aa.launches:,} launches each, {aa.unread:,} unread); {len(aa.frozen)} frozen, {harmless} step "
            f"temporar{'y' if harmless == 1 else 'ies'} (harmless)"
            + (f", {unset} unset word(s) (no host argument of their operator set them)" if unset else "")
            + (f", {notv} word(s) not a value of the step (their operator's changing host numbers reach none of "
               "them; listed apart)" if notv else "")
            + (f"; {inputs} launch(es) at the head of the token write its inputs from the host (left out of the "
               "graph, written before each replay)" if inputs else ""))


def table(reports) -> pd.DataFrame:
    """``arguments.csv``: every report's argument findings, with ``source``, ``pid``, ``device``."""
    parts = []
    for r in reports:
        aa = getattr(r, "arguments", None)
        if aa is None or (aa.findings.empty and aa.refusals.empty):
            continue
        df = pd.concat([x for x in (aa.refusals, aa.findings) if len(x)], ignore_index=True)
        for k, (c, v) in enumerate((("source", r.source), ("pid", r.pid), ("device", r.device))):
            df.insert(k, c, v)
        parts.append(df)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def meta(report) -> dict:
    """What ``meta.json`` says of a report's replay verdict and its argument evidence."""
    v = verdict(report)
    aa = getattr(report, "arguments", None)
    out = {"verdict": v.verdict, "why": v.why, "evidence": v.evidence, "command": v.command, "lead": v.lead,
           "other_findings": v.others}
    if aa is not None:
        out.update({"arguments": aa.source, "compared_tokens": aa.compared, "launches_per_token": aa.launches,
                    "unread": aa.unread, "unread_kernels": aa.unread_kernels, "cost": aa.cost, "notes": aa.notes,
                    "operator_log": aa.op_log, "refused_copies": int(len(aa.refusals))})
    return out


__all__ = ["ArgumentAudit", "BLIND", "CLASSES", "FROZEN", "HOST_COPY", "INPUT", "NOT_VALUE", "NOT_VALUES", "REFUSED", "STRENGTH", "UNSET",
           "RIGHT", "UNKNOWN", "Verdict", "WRONG", "attach", "cause", "compare", "meta", "strength", "table", "verdict"]
