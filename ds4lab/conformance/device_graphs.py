"""Scenarios of graph construction inside a capture, conditional nodes and programmatic dependent launch: one per rule
of :mod:`ds4lab.sim.rules_device`; each ran on the H200 as expected and as the sim runs it. Probes in ``kernels/``:
``tiny_add``, ``fill_value``, ``cond_set_from``, ``cond_count_down``. Nodes are recorded as kinds
(``conditionalx1,kernelx2``), edges as ``from>to:type`` counts."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..capture import stream as S
from .framework import MODES, N, _RT, Recorder, _buf, _capture, i32, scenario

_COND = "CUDA Programming Guide, 'CUDA Graphs' → 'Conditional Graph Nodes'"
_PDL = "CUDA Programming Guide, 'Programmatic Dependent Launch and Synchronization'"
_ADD_GRID, _ADD_BLOCK = (N // 256,), (256,)


# ----------------------------------------------------------------------------- helpers
def _flag(r: Recorder, v: int):
    """An int32 [1] device buffer holding ``v`` (written synchronously)."""
    f = r.be.zeros((1,), np.int32)
    _set(r, f, v)
    return f


def _set(r: Recorder, f, v: int) -> None:
    r.be.copy_h2d(S.LEGACY_STREAM, f, np.array([v], np.int32))
    r.be.synchronize()


def _kinds(r: Recorder, step: str, graph) -> None:
    """A graph's node kinds, as sorted ``kindxN`` counts (``none`` for an empty graph)."""
    if graph is None:
        r.obs[step] = "no graph"
        return
    kinds = r.call(step, r.be.graph_node_kinds, graph)
    if kinds is not None:
        r.obs[step] = ",".join(f"{k}x{v}" for k, v in sorted(Counter(kinds).items())) or "none"


def _edges(r: Recorder, step: str, graph) -> None:
    """A graph's edges, as sorted ``from>to:typexN`` counts (``none`` without edges)."""
    if graph is None:
        r.obs[step] = "no graph"
        return
    edges = r.call(step, r.be.graph_edges, graph)
    if edges is not None:
        r.obs[step] = ",".join(f"{k}x{v}" for k, v in sorted(Counter(f"{a}>{b}:{t}" for a, b, t in edges).items())) \
            or "none"


def _setter(r: Recorder, step: str, stream, handle, flag) -> None:
    """``cond_set_from(handle, flag)`` on ``stream``: the handle takes ``flag[0]`` at each replay."""
    def ref():
        handle.set(int(np.asarray(flag)[0]))

    r.call(step, r.be.launch, stream, "cond_set_from", (1,), (32,), (handle.arg, flag), 0, ref, 8)


def _add_on(r: Recorder, step: str, x, stream, programmatic: bool = False, predecessor: str = "kernel"):
    """``x += 1`` on ``stream`` (``tiny_add``), plainly or with programmatic stream serialization; returns what the
    programmatic launch answered (whether the attribute was set) or None."""
    def ref():
        np.add(x, 1, out=x)

    args = (x, i32(N))
    if programmatic:
        return r.call(step, r.be.launch_programmatic, stream, "tiny_add", _ADD_GRID, _ADD_BLOCK, args, 0, ref, 8 * N,
                      predecessor=predecessor)
    r.call(step, r.be.launch, stream, "tiny_add", _ADD_GRID, _ADD_BLOCK, args, 0, ref, 8 * N)
    return None


def _fill_on(r: Recorder, step: str, x, v: float, stream) -> None:
    def ref():
        x[...] = v

    r.call(step, r.be.launch, stream, "fill_value", _ADD_GRID, _ADD_BLOCK, (x, i32(N), np.float32(v)), 0, ref, 4 * N)


def _conditional(r: Recorder, s, s2, handle, kind: str, bodies, mode: str = "thread_local", tag: str = ""):
    """In ``s``'s capture: the graph and dependencies (step ``capture_info``), a conditional node of ``kind`` after
    them (``add_node``), the capture made to depend on it (``update_deps``), each body filled by capturing ``s2``
    into it (``body<i>_begin``, ``body<i>_end``). Returns the body graphs."""
    be = r.be
    got = r.call(f"{tag}capture_info", be.capture_dependencies, s)
    if got is None:
        return []
    graph, deps = got
    made = r.call(f"{tag}add_node", be.graph_add_conditional_node, graph, deps, handle, kind, len(bodies))
    if made is None:
        return []
    node, graphs = made
    r.call(f"{tag}update_deps", be.stream_update_capture_dependencies, s, [node], True)
    for i, (g, body) in enumerate(zip(graphs, bodies)):
        r.call(f"{tag}body{i}_begin", be.begin_capture_to_graph, s2, g, mode)
        if r.obs[f"{tag}body{i}_begin"] != "ok":
            continue
        body(s2)
        r.call(f"{tag}body{i}_end", be.end_capture_to_graph, s2)
    return graphs


def _handle(r: Recorder, s, default: int = 0, assign: bool = True, step: str = "handle_create"):
    got = r.call("capture_graph", r.be.capture_dependencies, s)
    if got is None:
        return None
    return r.call(step, r.be.conditional_handle_create, got[0], default, assign)


def _replays(r: Recorder, ex, s, flag, values, x, tag: str = "x") -> None:
    """For each value: ``flag := value``, one replay, ``x`` recorded (``x_after_<value>``; a repeated value gets a
    ``b`` suffix)."""
    seen = Counter()
    for v in values:
        seen[v] += 1
        if flag is not None:
            _set(r, flag, v)
        r.call(f"replay_{v}{'b' * (seen[v] - 1)}", r.be.graph_launch, ex, s)
        r.call("replay_sync", r.be.stream_synchronize, s)
        r.value(f"{tag}_after_{v}{'b' * (seen[v] - 1)}", x)


_OK_BUILD = {"capture_info": "ok", "add_node": "ok", "update_deps": "ok", "body0_begin": "ok", "body0_end": "ok",
             "end_capture": "ok", "instantiate": "ok"}


# ----------------------------------------------------------------------------- the capture's graph
@scenario("cudaStreamGetCaptureInfo: the graph being captured and its dependencies",
          expect={"capture_info": "ok", "deps": "kernel", "end_capture": "ok", "same_graph": "True",
                  "idle_capture_info": "cudaErrorIllegalState"},
          source=f"{_RT}, cudaStreamGetCaptureInfo (graph_out: the graph being captured into, transferred at "
                 "cudaStreamEndCapture; dependencies_out: what the next captured node depends on)")
def capture_graph_query(r: Recorder) -> None:
    """One kernel captured, then the capture asked for its graph and dependency set: one node, the kernel; the graph
    cudaStreamEndCapture returns is that graph. On a stream that does not capture there is no graph (ds4lab's
    capture_dependencies raises cudaErrorIllegalState; CUDA answers the status None)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    held = {}

    def body():
        _add_on(r, "add", x, s)
        got = r.call("capture_info", be.capture_dependencies, s)
        if got is not None:
            held["graph"] = got[0]
            r.note("deps", ",".join(_kind_of(be, got[0], d) for d in got[1]))

    g = _capture(r, s, "thread_local", body)
    if g is not None and "graph" in held:
        r.note("same_graph", _handle_of(g) == _handle_of(held["graph"]))
    r.call("idle_capture_info", be.capture_dependencies, s)


def _handle_of(g):
    """A graph's identity on either backend (the CUDA handle, or the sim graph's id)."""
    return getattr(g, "handle", None) or getattr(g, "id", None)


def _kind_of(be, graph, node) -> str:
    """The kind of one node of ``graph`` (a sim Node, or a CUDA node handle)."""
    k = getattr(node, "kind", None)
    if k is not None:
        return k
    from ..backends.cuda_graph_calls import node_kind
    from ..backends.cupy_runtime import _cudart

    return node_kind(_cudart(), node)


# ----------------------------------------------------------------------------- IF, IF/ELSE, SWITCH, WHILE
def _if_expect(mode: str) -> dict:
    return {**_OK_BUILD, "handle_create": "ok", "set": "ok", "nodes": "conditionalx1,kernelx3", "body0_nodes": "kernelx1",
            "x_after_1": "1", "x_after_0": "1", "x_after_1b": "2", "y_after_1b": "6"}


@scenario("an IF node added to a capture, its body captured into it, its condition set by a kernel of the graph",
          MODES, expect=_if_expect,
          source=f"{_COND}; {_RT}, cudaGraphConditionalHandleCreate, cudaGraphAddNode (cudaConditionalNodeParams), "
                 "cudaStreamUpdateCaptureDependencies, cudaStreamBeginCaptureToGraph, cudaGraphSetConditional")
def conditional_if_in_capture(r: Recorder, mode: str) -> None:
    """y += 1; cond_set_from(h, flag); IF h { x += 1 }; y += 1 — replayed with flag 1, 0, 1: the body runs on the
    replays whose flag is 1, everything else on every replay. The stage-3cc recipe: the handle on the capture's
    graph, the node after the capture's dependencies, the capture made to depend on it."""
    be = r.be
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x, y = _buf(r), _buf(r)
    flag = _flag(r, 1)
    held = {}

    def body():
        _add_on(r, "add_y0", y, s)
        h = _handle(r, s)
        if h is None:
            return
        _setter(r, "set", s, h, flag)
        held["bodies"] = _conditional(r, s, s2, h, "if", [lambda st: _add_on(r, "body_add", x, st)], mode)
        _add_on(r, "add_y1", y, s)

    g = _capture(r, s, mode, body)
    _kinds(r, "nodes", g)
    if held.get("bodies"):
        _kinds(r, "body0_nodes", held["bodies"][0])
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        _replays(r, ex, s, flag, (1, 0, 1), x)
        r.value("y_after_1b", y)


@scenario("an IF node with two bodies (IF/ELSE, CUDA 12.8)",
          expect={**_OK_BUILD, "body1_begin": "ok", "body1_end": "ok", "x_after_0": "0", "y_after_0": "1",
                  "x_after_1": "1", "y_after_1": "1"},
          source=f"{_COND}; {_RT}, cudaConditionalNodeParams (IF with size 2: phGraph_out[1] runs on a zero value)")
def conditional_if_else(r: Recorder) -> None:
    """IF h { x += 1 } ELSE { y += 1 }, replayed with flag 0 then 1."""
    be = r.be
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x, y = _buf(r), _buf(r)
    flag = _flag(r, 0)
    held = {}

    def body():
        h = _handle(r, s)
        if h is None:
            return
        _setter(r, "set", s, h, flag)
        held["ok"] = _conditional(r, s, s2, h, "if", [lambda st: _add_on(r, "then_add", x, st),
                                                       lambda st: _add_on(r, "else_add", y, st)])

    g = _capture(r, s, "thread_local", body)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        for v in (0, 1):
            _set(r, flag, v)
            r.call(f"replay_{v}", be.graph_launch, ex, s)
            r.call("replay_sync", be.stream_synchronize, s)
            r.value(f"x_after_{v}", x)
            r.value(f"y_after_{v}", y)


@scenario("a SWITCH node: the body the value names, none past the last (CUDA 12.8)",
          expect={**_OK_BUILD, "body1_begin": "ok", "body1_end": "ok", "body2_begin": "ok", "body2_end": "ok",
                  "nodes": "conditionalx1,kernelx1", "x_after_2": "3", "x_after_0": "1", "x_after_7": "1",
                  "x_after_1": "2"},
          source=f"{_COND}; {_RT}, cudaConditionalNodeParams (SWITCH: phGraph_out[n] runs on the value n, no body "
                 "when the value >= size)")
def conditional_switch(r: Recorder) -> None:
    """SWITCH h { 0: x = 1 | 1: x = 2 | 2: x = 3 }, replayed with 2, 0, 7 (no body), 1: stage 3cc's top-k regime node
    (its 'every row attended' value runs no body)."""
    be = r.be
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x = _buf(r)
    flag = _flag(r, 0)

    def body():
        h = _handle(r, s)
        if h is None:
            return
        _setter(r, "set", s, h, flag)
        _conditional(r, s, s2, h, "switch", [lambda st, v=v: _fill_on(r, f"fill{v}", x, float(v + 1), st)
                                             for v in range(3)])

    g = _capture(r, s, "thread_local", body)
    _kinds(r, "nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        _replays(r, ex, s, flag, (2, 0, 7, 1), x)


@scenario("a WHILE node whose body clears its own condition",
          expect={**_OK_BUILD, "x_after_3": "3", "x_after_2": "5"},
          source=f"{_COND}; {_RT}, cudaConditionalNodeParams (WHILE: phGraph_out[0] runs as long as the value is "
                 "non-zero), cudaGraphConditionalHandleCreate (default 1, cudaGraphCondAssignDefault: every launch "
                 "enters the loop)")
def conditional_while(r: Recorder) -> None:
    """WHILE h { x += 1; counter -= 1; h := counter > 0 }, the handle's default 1 at each launch: the body runs counter
    times (3, then 2)."""
    be = r.be
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x = _buf(r)
    counter = _flag(r, 3)

    def count_down(st, h):
        def ref():
            counter[0] -= 1
            h.set(int(counter[0] > 0))

        r.call("count_down", be.launch, st, "cond_count_down", (1,), (32,), (h.arg, counter), 0, ref, 8)

    def body():
        h = _handle(r, s, default=1)
        if h is None:
            return
        _conditional(r, s, s2, h, "while", [lambda st: (_add_on(r, "body_add", x, st), count_down(st, h))])

    g = _capture(r, s, "thread_local", body)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        _replays(r, ex, s, counter, (3, 2), x)


def _default_expect(v: int) -> dict:
    return {**_OK_BUILD, "x_after_launch": str(v), "x_after_launchb": str(2 * v)}


for _d in (0, 1):
    def conditional_default_value(r: Recorder, d: int = _d) -> None:
        """An IF node whose handle no kernel sets: each launch starts with the default value
        (cudaGraphCondAssignDefault), so the body runs on every launch with default 1, never with 0."""
        be = r.be
        s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
        x = _buf(r)

        def body():
            h = _handle(r, s, default=d)
            if h is not None:
                _conditional(r, s, s2, h, "if", [lambda st: _add_on(r, "body_add", x, st)])

        g = _capture(r, s, "thread_local", body)
        ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
        if ex is not None:
            for i in range(2):
                r.call(f"replay{i}", be.graph_launch, ex, s)
                r.call("replay_sync", be.stream_synchronize, s)
                r.value("x_after_launch" + "b" * i, x)

    conditional_default_value.__name__ = f"conditional_default_value_{_d}"
    scenario("a conditional handle's default value at each launch (cudaGraphCondAssignDefault)",
             expect=_default_expect(_d),
             source=f"{_RT}, cudaGraphConditionalHandleCreate (defaultLaunchValue, applied at the beginning of each "
                    "graph execution if cudaGraphCondAssignDefault is set)")(conditional_default_value)


@scenario("conditional nodes with a body count their type does not allow",
          expect={"if_size3": "cudaErrorInvalidValue", "while_size2": "cudaErrorInvalidValue",
                  "switch_size0": "cudaErrorInvalidValue", "if_size1": "ok", "end_capture": "ok"},
          source=f"{_RT}, cudaConditionalNodeParams.size (1 for WHILE, 1 or 2 for IF, greater than zero for SWITCH); "
                 "cudaGraphAddNode returns cudaErrorInvalidValue. Checked on the H200 (h200-2026-12-02-ds4/conformance): the error name for a size")
def conditional_bad_size(r: Recorder) -> None:
    """IF with three bodies, WHILE with two, SWITCH with none: refused; then a valid IF (so the capture ends with a
    graph)."""
    be = r.be
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x = _buf(r)

    def body():
        got = r.call("capture_info", be.capture_dependencies, s)
        if got is None:
            return
        graph, deps = got
        for kind, size in (("if", 3), ("while", 2), ("switch", 0)):
            h = be.conditional_handle_create(graph, 0, True)
            r.call(f"{kind}_size{size}", be.graph_add_conditional_node, graph, deps, h, kind, size)
        h = be.conditional_handle_create(graph, 0, True)
        made = r.call("if_size1", be.graph_add_conditional_node, graph, deps, h, "if", 1)
        if made is not None:
            be.stream_update_capture_dependencies(s, [made[0]], True)
            be.begin_capture_to_graph(s2, made[1][0], "thread_local")
            _add_on(r, "body_add", x, s2)
            be.end_capture_to_graph(s2)

    _capture(r, s, "thread_local", body)


@scenario("a conditional node whose handle belongs to another graph",
          expect={"add_node": "cudaErrorInvalidValue", "end_capture": "ok"},
          source=f"{_RT}, cudaGraphConditionalHandleCreate ('must be associated with a conditional node in this graph "
                 "or one of its children'). Checked on the H200 (h200-2026-12-02-ds4/conformance): cudaGraphAddNode refuses it with cudaErrorInvalidValue")
def conditional_handle_other_graph(r: Recorder) -> None:
    """The handle is made on a graph from cudaGraphCreate, the node added to a capture's graph."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    other = r.call("graph_create", be.graph_create)
    h = r.call("handle_create", be.conditional_handle_create, other, 0, True) if other is not None else None

    def body():
        _add_on(r, "add", x, s)
        got = r.call("capture_info", be.capture_dependencies, s)
        if got is not None and h is not None:
            r.call("add_node", be.graph_add_conditional_node, got[0], got[1], h, "if", 1)

    _capture(r, s, "thread_local", body)


@scenario("cudaStreamUpdateCaptureDependencies on a stream that does not capture",
          expect={"update_deps": "cudaErrorIllegalState"},
          source=f"{_RT}, cudaStreamUpdateCaptureDependencies ('Returns cudaErrorIllegalState if the stream is not "
                 "capturing')")
def update_deps_not_capturing(r: Recorder) -> None:
    """An empty dependency set given to an idle stream."""
    s = r.be.new_stream(non_blocking=True)
    r.call("update_deps", r.be.stream_update_capture_dependencies, s, [], True)


@scenario("cudaStreamBeginCaptureToGraph into a graph from cudaGraphCreate",
          expect={"graph_create": "ok", "begin": "ok", "end": "ok", "same_graph": "True", "nodes": "kernelx2",
                  "instantiate": "ok", "x": "2", "begin_legacy": "cudaErrorStreamCaptureUnsupported"},
          source=f"{_RT}, cudaStreamBeginCaptureToGraph (new nodes placed into an existing graph, returned by "
                 "cudaStreamEndCapture; not on cudaStreamLegacy). Checked on the H200 (h200-2026-12-02-ds4/conformance): the legacy stream's error name, as for "
                 "cudaStreamBeginCapture (rule begin_legacy)")
def capture_to_graph(r: Recorder) -> None:
    """Two kernels captured into a created graph; it replays them. Capture cannot begin on the legacy stream."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    g = r.call("graph_create", be.graph_create)
    if g is None:
        return
    r.call("begin", be.begin_capture_to_graph, s, g, "thread_local")
    _add_on(r, "add0", x, s)
    _add_on(r, "add1", x, s)
    back = r.call("end", be.end_capture_to_graph, s)
    r.note("same_graph", back is not None and _handle_of(back) == _handle_of(g))
    _kinds(r, "nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)
    g2 = be.graph_create()
    r.call("begin_legacy", be.begin_capture_to_graph, S.LEGACY_STREAM, g2, "thread_local")


@scenario("a graph with a conditional node as a child graph",
          expect={"end_capture": "ok", "add_child": "cudaErrorNotSupported"},
          source=f"{_RT}, cudaGraphAddChildGraphNode ('If childGraph contains allocation nodes, free nodes, or "
                 "conditional nodes, this call will return an error'). Checked on the H200 (h200-2026-12-02-ds4/conformance): the error name, as measured for "
                 "memory nodes")
def child_graph_conditional(r: Recorder) -> None:
    """Stage 3cc's token graph could not become a child of another graph."""
    be = r.be
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x = _buf(r)

    def body():
        h = _handle(r, s, default=1)
        if h is not None:
            _conditional(r, s, s2, h, "if", [lambda st: _add_on(r, "body_add", x, st)], tag="c_")

    g = _capture(r, s, "thread_local", body)
    parent = r.call("graph_create", be.graph_create)
    if parent is not None and g is not None:
        r.call("add_child", be.graph_add_child, parent, g)


# ----------------------------------------------------------------------------- programmatic dependent launch
def _pdl_ready(r: Recorder) -> None:
    """The probes' programmatic build loaded before any capture."""
    r.call("prepare", r.be.prepare_device_kernels, ["tiny_add", "cond_set_from"], True)


@scenario("a programmatic launch after a kernel in a capture: a programmatic edge",
          expect={"prepare": "ok", "add0": "ok", "add1_programmatic": "True", "end_capture": "ok",
                  "edges": "kernel>kernel:programmaticx1", "instantiate": "ok", "x": "2"},
          source=f"{_PDL} (stream capture keeps the dependency as a programmatic edge); {_RT}, cudaGraphEdgeData "
                 "(type cudaGraphDependencyTypeProgrammatic), cudaGraphGetEdges; CUDA Driver API, cuLaunchKernelEx "
                 "(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)")
def programmatic_edge_in_capture(r: Recorder) -> None:
    """x += 1 twice, the second with programmatic stream serialization (its device-side half waits for the first before
    reading x): one programmatic edge; the replay adds 2."""
    be = r.be
    _pdl_ready(r)
    s = be.new_stream(non_blocking=True)
    x = _buf(r)

    def body():
        _add_on(r, "add0", x, s)
        r.note("add1_programmatic", _add_on(r, "add1", x, s, programmatic=True))

    g = _capture(r, s, "thread_local", body)
    _edges(r, "edges", g)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a programmatic launch after a memset in a capture",
          expect={"prepare": "ok", "memset": "ok", "add_programmatic": "True", "end_capture": "ok",
                  "edges": "memset>kernel:defaultx1", "x": "1"},
          source=f"{_RT}, cudaGraphEdgeData (only kernel nodes define programmatic ports). Checked on the H200 (h200-2026-12-02-ds4/conformance): the dependency on "
                 "a memset stays a default edge (ds4lab's launches never ask for this: they set the attribute "
                 "only after one kernel node)")
def programmatic_after_memset(r: Recorder) -> None:
    """memset x = 0, then x += 1 launched with the attribute whatever precedes it (predecessor='any')."""
    be = r.be
    _pdl_ready(r)
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 5.0)

    def body():
        r.call("memset", be.memset_async, s, x, 0)
        r.note("add_programmatic", _add_on(r, "add", x, s, programmatic=True, predecessor="any"))

    g = _capture(r, s, "thread_local", body)
    _edges(r, "edges", g)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("programmatic launches on a stream that does not capture",
          expect={"prepare": "ok", "add0": "ok", "add1": "ok", "add1_programmatic": "True", "add2": "ok", "x": "3"},
          source=f"{_PDL} (the kernel may start while its predecessor drains; its griddepcontrol.wait waits for the "
                 "predecessor's completion and memory flush)")
def programmatic_eager(r: Recorder) -> None:
    """x += 1 three times, the last two programmatic: x = 3 (each waits for the one before)."""
    be = r.be
    _pdl_ready(r)
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    _add_on(r, "add0", x, s)
    r.note("add1_programmatic", _add_on(r, "add1", x, s, programmatic=True))
    _add_on(r, "add2", x, s, programmatic=True)
    r.call("sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("programmatic edges inside a conditional node's body, and none across the node",
          expect={"prepare": "ok", **_OK_BUILD, "after_programmatic": "False", "body_edges": "kernel>kernel:programmaticx1",
                  "x_after_1": "2", "x_after_0": "2", "y_after_0": "2"},
          source=f"{_PDL}; {_COND}. Checked on the H200 (h200-2026-12-02-ds4/conformance): programmatic edges are allowed in a body (kernel nodes are); the kernel "
                 "after the conditional node depends on it through a default edge (ds4lab sets the attribute only "
                 "after one kernel node)")
def programmatic_in_conditional_body(r: Recorder) -> None:
    """IF h { x += 1; x += 1 (programmatic) }; y += 1 (programmatic launch asked: not set, a conditional node precedes
    it). Replayed with flag 1 then 0."""
    be = r.be
    _pdl_ready(r)
    s, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    x, y = _buf(r), _buf(r)
    flag = _flag(r, 1)
    held = {}

    def body():
        h = _handle(r, s)
        if h is None:
            return
        _setter(r, "set", s, h, flag)
        held["bodies"] = _conditional(r, s, s2, h, "if", [lambda st: (_add_on(r, "b_add0", x, st),
                                                                       _add_on(r, "b_add1", x, st, programmatic=True))])
        r.note("after_programmatic", _add_on(r, "after", y, s, programmatic=True))

    g = _capture(r, s, "thread_local", body)
    if held.get("bodies"):
        _edges(r, "body_edges", held["bodies"][0])
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        _replays(r, ex, s, flag, (1, 0), x)
        r.value("y_after_0", y)
