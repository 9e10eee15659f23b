"""The scenario framework: the :class:`Recorder` (runs runtime-API calls and records what each did), :class:`Scenario`
and the ``SCENARIOS`` registry (``@scenario``), and the helpers every scenario module shares (probe buffers, capture
and replay through the graph cache's scope, another thread, the sources expectations cite)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..capture import stream as S
from ..errors import RuntimeApiError
from ..capture.launch import Launcher


from ..capture.stream import CAPTURE_MODES as MODES  # defined once
N = 1024
f32, i32 = np.float32, np.int32


class Recorder:
    """Runs runtime-API calls for one scenario and keeps what each one did, in order."""

    def __init__(self, be) -> None:
        self.be = be
        self.L = Launcher(be)
        self.obs: dict[str, str] = {}

    def call(self, step: str, fn: Callable, *args, **kw):
        """Run ``fn``; record ``ok`` or the error name. Returns the result (None on error)."""
        try:
            r = fn(*args, **kw)
        except RuntimeApiError as e:
            self.obs[step] = e.name
            return None
        self.obs[step] = "ok"
        return r

    def nodes(self, step: str, graph, be=None) -> None:
        """Record a graph's nodes (from ``be``, default the scenario's backend) as ``kind[:kernel]`` counts, sorted
        (empty graph: ``none``). NCCL's kernels are unnamed on a GPU (the backend names ds4lab's own only): here too."""
        if graph is None:
            self.obs[step] = "no graph"
            return
        named = lambda n: n["kind"] == "kernel" and n["name"] and not n["name"].startswith("nccl")  # noqa: E731
        c = Counter(f"{n['kind']}:{n['name']}" if named(n) else n["kind"] for n in (be or self.be).graph_nodes(graph))
        c.pop("empty", None)
        self.obs[step] = ",".join(f"{k}x{v}" for k, v in sorted(c.items())) or "none"

    def value(self, step: str, buf, be=None) -> None:
        """Record a buffer's values compactly (``7`` when uniform, else the first four). With ``be`` (a rank's
        device): read there, without a device synchronize, a refused read recorded as its error name."""
        if be is None:
            self.be.synchronize()
        try:
            h = np.asarray((be or self.be).to_host(buf), dtype=np.float64).reshape(-1)
        except RuntimeApiError as e:
            if be is None:
                raise
            self.obs[step] = e.name
            return
        self.obs[step] = f"{h[0]:g}" if np.all(h == h[0]) else "[" + " ".join(f"{v:g}" for v in h[:4]) + " ...]"

    def note(self, step: str, value) -> None:
        self.obs[step] = str(value)

    def update(self, step: str, graph_exec, graph) -> None:
        """``cudaGraphExecUpdate``: records the outcome, and for a refusal CUDA's update result (``<step>_result``) and
        the failing node's type (``<step>_node``, ``none`` when CUDA names none)."""
        from ..errors import GraphExecUpdateError

        if graph_exec is None or graph is None:
            self.obs[step] = "no graph"
            return
        try:
            self.be.graph_exec_update(graph_exec, graph)
        except GraphExecUpdateError as e:
            self.obs[step] = e.name
            self.obs[f"{step}_result"] = e.result
            self.obs[f"{step}_node"] = e.node_type or "none"
            return
        except RuntimeApiError as e:
            self.obs[step] = e.name
            return
        self.obs[step] = "ok"

    # --- probe launches (each with its NumPy effect for the CPU backends)
    def add(self, step: str, x, stream=None, legacy: bool = False) -> None:
        """``x += 1`` on ``stream`` (through the accessor) or on the legacy stream."""
        def ref():
            np.add(x, 1, out=x)

        def go():
            self.L.kernel("probe.add", "tiny_add", (N // 256,), (256,), (x, i32(N)), ref, nbytes=8 * N,
                          legacy=legacy)

        if stream is None or legacy:
            self.call(step, go)
        else:
            with S.stream_override(stream):
                self.call(step, go)

    def fill(self, step: str, x, v: float, stream) -> None:
        """``x[:] = v`` with ``v`` passed by value (frozen into a graph)."""
        def ref():
            x[...] = v

        with S.stream_override(stream):
            self.call(step, lambda: self.L.kernel("probe.fill", "fill_value", (N // 256,), (256,),
                                                  (x, i32(N), f32(v)), ref, nbytes=4 * N))

    def fill_from(self, step: str, x, vbuf, stream) -> None:
        """``x[:] = vbuf[0]`` read from device memory at execution (replay) time."""
        def ref():
            x[...] = vbuf[0]

        with S.stream_override(stream):
            self.call(step, lambda: self.L.kernel("probe.fill_from", "fill_from", (N // 256,), (256,),
                                                  (x, i32(N), vbuf), ref, nbytes=4 * N))


class ScenarioSkipped(Exception):
    """Raised by a scenario that cannot run here (a two-GPU scenario on a host with one GPU, one that could hang a GPU
    unless asked for): :func:`~ds4lab.conformance.runner.run_scenarios` records ``<skipped>`` with the message, and
    :func:`~ds4lab.conformance.runner.compare` does not count it as a disagreement."""


@dataclass
class Scenario:
    """A named program over the runtime API; ``covers`` names the hazard row or rule it checks.

    ``expect``: for scenarios written from the CUDA documentation before an H200 record of them exists, the outcome of
    the steps the documented rule is about (``{step: outcome}``), with ``source`` saying where it comes from. The sim
    is held to it until the H200 record replaces it."""

    name: str
    fn: Callable[[Recorder], None]
    covers: str
    doc: str = ""
    expect: dict | None = None
    source: str = ""


SCENARIOS: list[Scenario] = []


def scenario(covers: str, modes: tuple | None = None, expect=None, source: str = ""):
    """Register a scenario function; with ``modes``, one scenario per capture mode.

    ``expect``: a ``{step: outcome}`` dict, or (with ``modes``) a function of the mode returning one."""

    def deco(fn):
        if modes:
            for m in modes:
                e = expect(m) if callable(expect) else expect
                SCENARIOS.append(Scenario(f"{fn.__name__}[{m}]", (lambda r, m=m: fn(r, m)), covers,
                                          (fn.__doc__ or "").strip(), e, source))
        else:
            SCENARIOS.append(Scenario(fn.__name__, fn, covers, (fn.__doc__ or "").strip(), expect, source))
        return fn

    return deco


def _buf(r: Recorder, v: float = 0.0):
    x = r.be.zeros((N,), f32)
    if v:
        r.fill("init", x, v, S.LEGACY_STREAM)
    r.be.synchronize()
    return x


def _capture(r: Recorder, s, mode: str, body: Callable[[], None], tag: str = ""):
    """begin → body → end through :func:`ds4lab.capture.cache.capture_scope` (so the capture ends whatever the body
    raises); records begin/end outcomes; returns the graph or None."""
    from ..capture.scope import capture_scope

    with capture_scope(r.be, s, mode, begin=lambda st, m: r.call(f"{tag}begin_capture", r.be.begin_capture, st, m),
                       end=lambda st: r.call(f"{tag}end_capture", r.be.end_capture, st)) as cap:
        body()
    return cap.graph


def _replay(r: Recorder, g, stream, times: int = 1, tag: str = "") -> None:
    """Instantiate ``g`` (step ``instantiate``), launch it ``times`` times and synchronize."""
    ex = r.call(f"{tag}instantiate", r.be.graph_instantiate, g) if g is not None else None
    _launch_once(r, ex, stream, times, tag)


def _launch_once(r: Recorder, ex, stream, times: int = 1, tag: str = "") -> None:
    """Launch the executable ``ex`` ``times`` times (steps ``replay0``…) and synchronize (``replay_sync``); nothing
    when ``ex`` is None (its instantiation was refused)."""
    if ex is None:
        return
    for i in range(times):
        r.call(f"{tag}replay{i}", r.be.graph_launch, ex, stream)
    r.call(f"{tag}replay_sync", r.be.stream_synchronize, stream)



#: What a capture that a call invalidated records; what an intact one with one kernel records.
INVALIDATED = {"status_in_capture": "invalidated", "end_capture": "cudaErrorStreamCaptureInvalidated",
               "nodes": "no graph"}
INTACT = {"status_in_capture": "active", "end_capture": "ok", "nodes": "kernel:tiny_addx1"}


def refused_unless_relaxed(step: str, error: str = "cudaErrorStreamCaptureUnsupported"):
    """The ``expect`` of a potentially unsafe call (RT cudaThreadExchangeStreamCaptureMode): in global and thread-local
    mode step ``step`` fails with ``error`` and the capture is invalidated; relaxed mode allows it and the capture
    goes on."""
    def expect(mode: str) -> dict:
        if mode == "relaxed":
            return {step: "ok", **INTACT}
        return {step: error, **INVALIDATED}

    return expect


def call_in_capture(r: Recorder, mode: str, step: str, fn, *args, release=None):
    """One kernel, then ``fn(*args)`` as step ``step`` while a non-blocking stream captures in ``mode``, then the
    capture's status (step ``status_in_capture``) and the graph's nodes (``nodes``); after the capture,
    ``release(result)`` when the call succeeded (free what it made). Returns the result."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 1.0)
    held = {}

    def body():
        r.add("add_before", x, s)
        held["r"] = r.call(step, fn, *args)
        r.note("status_in_capture", be.capture_status(s))

    g = _capture(r, s, mode, body)
    r.nodes("nodes", g)
    if release is not None and r.obs.get(step) == "ok":
        release(held["r"])
    return held.get("r")


def _other_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out.get("r")


#: Sources the scenarios' expectations cite.
_FACTS = "shared/context/gpu-facts.md"
_RT = "CUDA Runtime API reference"
