#!/usr/bin/env python3
"""What the argument pass costs the host per launch, part by part: a micro-benchmark on the CPU, no GPU.

HOST-ONLY. It times the Python work the argument pass adds at each kernel launch, which is host work, with
``time.perf_counter_ns`` over many launches: no device work is timed. It is no substitute for the paired
GPU measurement (``scripts/arguments_cost.py``): CUPTI's own callback machinery and the CUDA calls are
not in it, and the host is not the H200's.

The launches are played as CUPTI would hand them to ds4lab's session (the stand-in CUPTI of the tests,
``tests/fake_cupti.py``): a ``CUpti_CallbackData`` in memory whose ``functionParams`` points to a real
``cudaLaunchKernel``/``cuLaunchKernel`` parameter struct and argument array, the session's subscriber
called at the launch's entry and exit. Where ``cupti-python`` imports, each callback gets a real
``cupti.CallbackData`` made with ``CallbackData.from_ptr`` (what cupti-python's callback wrapper makes
before calling Python; its cost is the "trampoline" line); elsewhere a plain object with the same fields.

A token is a mix shaped on a PyTorch decode step (``--launches`` per token): TensorIterator kernels (an
``int`` and a 1 240-byte functor whose unused offset-calculator words change at every launch),
reductions (a 600-byte config, the same), cuBLAS GEMVs (a 320-byte struct that repeats), Triton
kernels through ``cuLaunchKernel`` (ten pointers and two ints, one of them the position) and CuPy
kernels (four parameters that repeat). The launching Python frame sits ``--depth`` frames deep (a
transformers step under ``ds4lab audit run``: 40 to 60). The first token is a warm-up (function lookups,
first stacks); the figures are the steady state over the tokens after it.

Where torch imports, the operator log's cost per operator is measured too (``ds4lab.trace.torch_ops``,
a ``TorchDispatchMode``) over a decoder layer's operators: on small CPU tensors, the operators alone, under
a dispatch mode that only calls them (PyTorch's Python dispatch) and under the log (whose host-tensor
branch reads the tensors' values: heavier than for CUDA tensors); and ``describe`` alone, the log's work
per operator, on the same calls with ``meta`` tensors (the branch CUDA tensors take).

Where ``ds4lab.trace.cupti.NativeCallbacks`` exists, the launches are also played through it: a ``ctypes``
callback called through its C thunk with the callback data's address (as CUPTI calls it, from Python here).

Usage::

    python scripts/bench_arguments_host.py [--tokens 30] [--launches 120] [--depth 50] [--repeats 5]

Prints one line per part: µs per launch (or per operator), median and minimum over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# (kind, API, function, layout [(offset, size)], share of a token's launches)
MIX = [("tensoriterator", "cudaLaunchKernel_v7000", 0x1100, [(0, 4), (8, 1240)], 0.55),
       ("reduce", "cudaLaunchKernel_v7000", 0x1200, [(0, 600)], 0.10),
       ("gemv", "cudaLaunchKernel_v7000", 0x1300, [(0, 320)], 0.20),
       ("triton", "cuLaunchKernel", 0xA500, [(8 * i, 8) for i in range(10)] + [(80, 4), (84, 4)], 0.10),
       ("cupy", "cuLaunchKernel", 0xA600, [(0, 8), (8, 8), (16, 8), (24, 4)], 0.05)]
FORMS = {"cudaLaunchKernel": (0, 32), "cuLaunchKernel": (0, 48)}  # function, argument array offsets


class _Patch:
    """The few ``monkeypatch`` calls ``fake_cupti.install`` makes, kept for the whole run."""

    def setitem(self, d, k, v):
        d[k] = v

    def setattr(self, o, k, v):
        setattr(o, k, v)


class Launch:
    """One launch site's memory: its parameters, argument array, params struct and the two
    ``CUpti_CallbackData`` (entry, exit), as CUPTI and the CUDA API would hold them."""

    def __init__(self, kind, api, fn, layout, index):
        self.kind, self.api, self.fn, self.layout = kind, api, fn, layout
        self.domain = "runtime" if api.startswith("cuda") else "driver"
        self.args = [ctypes.create_string_buffer(bytes((index * 7 + j) % 251 for j in range(size)), size)
                     for _, size in layout]
        self.argv = (ctypes.c_void_p * len(self.args))(*[ctypes.addressof(a) for a in self.args])
        self.params = ctypes.create_string_buffer(64)
        f_off, a_off = FORMS[api.split("_v")[0]]
        ctypes.c_uint64.from_address(ctypes.addressof(self.params) + f_off).value = fn
        ctypes.c_uint64.from_address(ctypes.addressof(self.params) + a_off).value = ctypes.addressof(self.argv)
        self.name = ctypes.create_string_buffer(f"{kind}_kernel_{index}".encode())
        self.cb = []
        for site in (0, 1):
            b = ctypes.create_string_buffer(72)
            base = ctypes.addressof(b)
            ctypes.c_int32.from_address(base).value = site
            ctypes.c_uint64.from_address(base + 16).value = ctypes.addressof(self.params)
            ctypes.c_uint64.from_address(base + 32).value = ctypes.addressof(self.name)
            self.cb.append(b)
        self.cb_addr = [ctypes.addressof(b) for b in self.cb]
        # the word that changes at every launch (an unused offset-calculator slot), or the position
        self.moving = {"tensoriterator": (0, 240), "reduce": (0, 96), "triton": (11, 0)}.get(kind)


def token_sites(launches: int) -> list[Launch]:
    out = []
    for kind, api, fn, layout, share in MIX:
        out += [Launch(kind, api, fn + i, layout, len(out) + i) for i in range(max(1, round(share * launches)))]
    # interleave the kinds as a step does
    return sorted(out, key=lambda s: (hash((s.kind, s.fn)) % 997))


class Player:
    """Plays tokens of launches into the session's subscriber (or not: the baseline)."""

    def __init__(self, fake, sites, make):
        from fake_cupti import CallbackDomain, driver_api_trace_cbid, runtime_api_trace_cbid

        self.fake, self.sites = fake, sites
        self.corr = 1000
        self.step = 0
        self.dom = {"runtime": CallbackDomain.RUNTIME_API, "driver": CallbackDomain.DRIVER_API}
        self.cbid = {s.api: int((runtime_api_trace_cbid if s.domain == "runtime" else driver_api_trace_cbid)[s.api])
                     for s in sites}
        self.make = make

    def token(self, *, call: bool, make: bool = True, native=None) -> None:
        """One token of launches; ``call``: into the subscriber, with a callback data object (``make``) or,
        ``native`` (a ``ctypes`` callback), with its address through a C thunk as CUPTI calls it."""
        u64, u32 = ctypes.c_uint64.from_address, ctypes.c_uint32.from_address
        subs = list(self.fake.subscribers.values()) if call and native is None else []
        self.step += 1
        make_ = self.make if (make or call) and native is None else None
        for s in self.sites:
            self.corr += 1
            u32(s.cb_addr[0] + 64).value = self.corr
            u32(s.cb_addr[1] + 64).value = self.corr
            if s.moving is not None:
                arg, off = s.moving
                if s.kind == "triton":
                    ctypes.c_int32.from_address(ctypes.addressof(s.args[arg])).value = self.step
                else:
                    u64(ctypes.addressof(s.args[1 if s.kind == "tensoriterator" else 0]) + off).value = self.corr
            if native is not None:
                native(None, int(self.dom[s.domain]), self.cbid[s.api], s.cb_addr[0])
                native(None, int(self.dom[s.domain]), self.cbid[s.api], s.cb_addr[1])
                continue
            if make_ is None:
                continue
            d0 = make_(s.cb_addr[0], 0, self.corr, s)
            for sub in subs:
                sub(None, self.dom[s.domain], self.cbid[s.api], d0)
            d1 = make_(s.cb_addr[1], 1, self.corr, s)
            for sub in subs:
                sub(None, self.dom[s.domain], self.cbid[s.api], d1)


def _cbdata_maker(kind: str):
    if kind == "cupti":
        from cupti import cupti

        from_ptr = cupti.CallbackData.from_ptr
        return lambda addr, site, corr, s: from_ptr(addr)

    class CallbackData:  # the fields ds4lab reads, as plain attributes
        __slots__ = ("callback_site", "correlation_id", "ptr", "symbol_name", "function_name")

        def __init__(self, addr, site, corr, s):
            self.ptr, self.callback_site, self.correlation_id = addr, site, corr
            self.symbol_name, self.function_name = s.name.value.decode(), s.api

    return CallbackData


def at_depth(depth: int, fn):
    """Call ``fn()`` ``depth`` frames below this one (a deep framework stack), and return what it returns."""
    if depth <= 0:
        return fn()
    return at_depth(depth - 1, fn)


def per_launch_us(player, tokens: int, *, call: bool, make: bool, depth: int, native=None) -> float:
    n = len(player.sites) * tokens

    def run():
        t0 = time.perf_counter_ns()
        for _ in range(tokens):
            player.token(call=call, make=make, native=native)
        return time.perf_counter_ns() - t0

    return at_depth(depth, run) / n / 1e3


def bench_handler(args, cbdata_kind: str) -> dict:
    import fake_cupti
    from ds4lab.trace import arguments as A
    from ds4lab.trace import cupti as C

    make = _cbdata_maker(cbdata_kind)  # before the stand-in takes cupti's place in sys.modules
    fake = fake_cupti.install(_Patch())
    C.current_context = lambda: 0x55
    sites = token_sites(args.launches)
    layouts = {s.fn: s.layout for s in sites}
    q = fake_cupti.FakeQueries(layouts, {s.fn: s.fn for s in sites if s.domain == "runtime"})
    session = C.CuptiSession.get()
    player = Player(fake, sites, make)
    variants = [("baseline (the stand-in's own loop)", dict(call=False, make=False), None, False)]
    if cbdata_kind == "cupti":
        variants.append(("+ cupti-python CallbackData per callback (trampoline stand-in)",
                         dict(call=False, make=True), None, False))
    variants += [("+ session dispatch to a handler that does nothing", dict(call=True, make=True), None, True),
                 ("+ argument capture, stacks off", dict(call=True, make=True),
                  lambda: A.ArgumentCapture(session, q, stacks=False), False),
                 ("+ argument capture (the pass: stacks on)", dict(call=True, make=True),
                  lambda: A.ArgumentCapture(session, q, stacks=True), False)]
    native = getattr(C, "NativeCallbacks", None)
    if native is not None:  # CUPTI's C API through ctypes: the handler gets the address from a C thunk
        lib = _ThunkLib()
        variants += [("native: ctypes callback, session dispatch to a no-op handler", dict(call=True, make=False),
                      None, True),
                     ("native: + argument capture (the pass: stacks on)", dict(call=True, make=False),
                      lambda: A.ArgumentCapture(session, q, stacks=True), False)]
    out: dict = {label: [] for label, *_ in variants}
    for r in range(args.repeats):  # the variants interleaved, their order rotated: a busy host falls on all alike
        k = r % len(variants)
        for label, how, capture, noop in variants[k:] + variants[:k]:
            cap = stop = None
            how = dict(how)
            if label.startswith("native"):
                session.api = native(lib)
                how["native"] = lambda *a: lib.fn(*a)
            else:
                session.api = None
            if noop:
                stop = session.watch_launches(frozenset(A.LAUNCH_LAYOUTS), lambda d, c, cb: None)
            if capture is not None:
                cap = capture()
                cap.start()
                # warm-up token: lookups, first stacks
                at_depth(args.depth, lambda: player.token(call=True, native=how.get("native")))
            try:
                out[label].append(per_launch_us(player, args.tokens, depth=args.depth, **how))
            finally:
                if cap is not None:
                    cap.stop()
                if stop is not None:
                    stop()
    return out


class _ThunkLib:
    """CUPTI's three callback calls as :class:`ds4lab.trace.cupti.NativeCallbacks` makes them: keeps the
    ``ctypes`` callback, which the player then calls with each callback data's address (through its C
    thunk; from Python, so a little more than CUPTI's call from C costs)."""

    fn = None

    def cuptiSubscribe(self, handle, fn, userdata):
        handle._obj.value, self.fn = 0x5000, fn
        return 0

    def cuptiEnableCallback(self, *a):
        return 0

    def cuptiUnsubscribe(self, handle):
        return 0


def bench_pieces(args) -> dict:
    from ds4lab.trace.stacks import python_stack

    blob = bytes(range(256)) * 5
    out = {}

    def loop(fn, n=20000):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / n / 1e3

    for _ in range(args.repeats):
        out.setdefault("blake2b digest of 1 244 bytes (hex)", []).append(
            loop(lambda: hashlib.blake2b(blob[:1244], digest_size=8).hexdigest()))
        out.setdefault(f"python_stack at depth {args.depth} (formatted frames)", []).append(
            at_depth(args.depth, lambda: loop(lambda: python_stack(sys._getframe(1)), 2000)))
        s = Launch(*MIX[0][:4], 0)
        u64 = ctypes.c_uint64.from_address
        a = ctypes.addressof(s.argv)

        def read():
            return b"".join([ctypes.string_at(u64(a + 8 * i).value, size) for i, (_, size) in enumerate(s.layout)])
        out.setdefault("reading a TensorIterator launch's parameters (ctypes)", []).append(loop(read))
    return out


def bench_op_log(args) -> dict:
    try:
        import torch
    except ImportError:
        return {}
    from torch.utils._python_dispatch import TorchDispatchMode

    from ds4lab.trace import torch_ops
    from ds4lab.trace.torch_ops import OpLog

    torch.set_num_threads(1)  # one thread: the operators' own time steady on a shared host

    def layer(x, w, cos, sin, kc):
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = (h * torch.rsqrt(var + 1e-6)).to(x.dtype) * w[0]
        q = torch.nn.functional.linear(h, w[1]).view(1, 1, 8, 64).transpose(1, 2)
        k = torch.nn.functional.linear(h, w[2]).view(1, 1, 8, 64).transpose(1, 2)
        rot = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)
        q = q * cos + rot * sin
        kc.index_copy_(2, torch.tensor([3], device=x.device), k)
        a = torch.nn.functional.scaled_dot_product_attention(q, kc, kc)
        o = torch.nn.functional.linear(a.transpose(1, 2).reshape(1, 1, 512), w[3])
        return x + o

    def tensors(dev):
        r = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)  # noqa: E731
        return r(1, 1, 512), [r(512)] + [r(512, 512) for _ in range(3)], r(1, 1, 1, 64), r(1, 1, 1, 64), \
            r(1, 8, 16, 64)

    class Plain(TorchDispatchMode):  # PyTorch's Python dispatch alone: the operator, nothing else
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Keep(TorchDispatchMode):  # one layer's operator calls, their arguments and results kept
        calls: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.calls.append((func, args, kwargs or {}, out))
            return out

    cpu, meta = tensors("cpu"), tensors("meta")
    with Keep() as keep:
        layer(*meta)
    calls = list(keep.calls)
    ops = len(calls)
    Keep.calls = []
    with Keep() as keep:
        layer(*cpu)
    cpu_ops = len(keep.calls)
    out: dict = {}

    def run(n=400):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            layer(*cpu)
        return (time.perf_counter_ns() - t0) / n / cpu_ops / 1e3

    def describe_all(n=200):
        describe, written = torch_ops.describe, torch_ops._written
        t0 = time.perf_counter_ns()
        for _ in range(n):
            for func, a, k, o in calls:
                describe(torch, a, k, written=written(func))
                describe(torch, (), {}, o)
        return (time.perf_counter_ns() - t0) / n / ops / 1e3

    try:  # describe(torch, args, kwargs, out, written) as the log calls it at every operator
        describe_all(1)
    except TypeError:  # a log that reads at the operator and describes after the pass: not this measurement
        describe_all = None

    for _ in range(args.repeats):
        plain = at_depth(args.depth, run)
        with Plain():
            mode = at_depth(args.depth, run)
        log = OpLog(torch, time.perf_counter_ns)
        log.start()
        try:
            logged = at_depth(args.depth, run)
        finally:
            log.stop()
        out.setdefault(f"operator on small CPU tensors, no mode ({cpu_ops} operators a layer)", []).append(plain)
        out.setdefault("+ PyTorch's Python dispatch (a TorchDispatchMode that only calls it)", []).append(mode - plain)
        out.setdefault("+ the operator log on CPU tensors (their values read: heavier than CUDA's)", []).append(
            logged - mode)
        if describe_all is not None:
            out.setdefault(f"describe() of an operator's arguments and results, meta tensors ({ops} a layer)",
                           []).append(describe_all())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=30, help="timed tokens per run (after one warm-up token)")
    ap.add_argument("--launches", type=int, default=120, help="launches per token")
    ap.add_argument("--depth", type=int, default=50, help="Python frames above the launching one")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each part (median and minimum shown)")
    ap.add_argument("--no-op-log", action="store_true", help="skip the operator log's part (torch)")
    args = ap.parse_args(argv)
    try:
        import cupti.cupti  # noqa: F401
        kind = "cupti"
    except Exception:  # noqa: BLE001 - no cupti-python: plain objects stand in for its CallbackData
        kind = "plain"
    print(f"HOST-ONLY micro-benchmark (perf_counter_ns; no GPU work timed): Python {sys.version.split()[0]}, "
          f"callback data: {'cupti-python ' + _version('cupti-python') if kind == 'cupti' else 'plain objects'}, "
          f"{args.launches} launches a token, depth {args.depth}, {args.tokens} tokens x {args.repeats} runs")
    res = bench_handler(args, kind)
    prev = None
    print("per launch (entry + exit callbacks), µs: median (min); the step over the line above")
    for label, vals in res.items():
        med = statistics.median(vals)
        step = "" if prev is None else f"  [+{med - prev:6.2f}]"
        print(f"  {label:<66} {med:7.2f} ({min(vals):6.2f}){step}")
        prev = med
    total = statistics.median(res["+ argument capture (the pass: stacks on)"]) - \
        statistics.median(res["baseline (the stand-in's own loop)"])
    print(f"  {'the argument pass over the baseline (cupti-python wrapper)':<66} {total:7.2f}")
    native = res.get("native: + argument capture (the pass: stacks on)")
    if native:
        base = statistics.median(res["baseline (the stand-in's own loop)"])
        print(f"  {'the argument pass over the baseline (native callbacks)':<66} {statistics.median(native) - base:7.2f}")
    print("pieces, µs each: median (min)")
    for label, vals in bench_pieces(args).items():
        print(f"  {label:<66} {statistics.median(vals):7.2f} ({min(vals):6.2f})")
    if not args.no_op_log:
        ops = bench_op_log(args)
        if ops:
            print(f"operator log (torch {_version('torch')}), µs per operator: median (min)")
            for label, vals in ops.items():
                print(f"  {label:<66} {statistics.median(vals):7.2f} ({min(vals):6.2f})")
        else:
            print("operator log: not measured (torch does not import)")
    return 0


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
