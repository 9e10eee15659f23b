"""Scenarios of executable updates (``cudaGraphExecUpdate``: what it accepts and refuses), child graphs and external
event nodes."""

from __future__ import annotations

from .framework import _FACTS, _RT, Recorder, _buf, _capture, _launch_once, scenario
from .graphs import _GM, _add_graph, _mem_graph


# ----------------------------------------------------------------------------- graphs: executable update
_UPD = f"{_GM}, cudaGraphExecUpdate (cudaGraphExecUpdateResultInfo)"


def _fill_graph(r: Recorder, x, v: float, tag: str):
    s = r.be.new_stream(non_blocking=True)
    return _capture(r, s, "thread_local", lambda: r.fill(f"{tag}fill", x, v, s), tag=tag)


@scenario("executable update with a topologically identical graph",
          expect={"update": "ok", "x": "2"}, source=f"{_UPD}; CUDA Programming Guide, 'Whole graph update'")
def exec_update_same_topology(r: Recorder) -> None:
    """A by-value argument captured again and given to the executable: the replay uses the new value."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _fill_graph(r, x, 1.0, "a_"))
    r.update("update", ex, _fill_graph(r, x, 2.0, "b_"))
    _launch_once(r, ex, s)
    r.value("x", x)


@scenario("executable update with one node more",
          expect={"update": "cudaErrorGraphExecUpdateFailure", "update_result": "cudaGraphExecUpdateErrorTopologyChanged",
                  "update_node": "none", "x": "1"},
          source=f"{_UPD} (node counts differ: TopologyChanged, errorNode NULL); {_FACTS} (2026-11-30)")
def exec_update_node_count(r: Recorder) -> None:
    """The refused update leaves the executable as it was: the replay runs the old graph."""
    be = r.be
    x, y = _buf(r), _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, 1, tag="a_"))
    r.update("update", ex, _add_graph(r, y, 2, tag="b_"))
    _launch_once(r, ex, s)
    r.value("x", x)


@scenario("executable update where a node's type changed",
          expect={"update": "cudaErrorGraphExecUpdateFailure", "update_result": "cudaGraphExecUpdateErrorNodeTypeChanged",
                  "update_node": "memset"},
          source=f"{_UPD} (NodeTypeChanged, errorNode the node from the new graph)")
def exec_update_node_type(r: Recorder) -> None:
    """A kernel node paired with a memset node."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, 1, tag="a_"))
    g2 = _capture(r, s, "thread_local", lambda: r.call("memset_async", be.memset_async, s, x, 0), tag="b_")
    r.update("update", ex, g2)


@scenario("executable update where a kernel node's function changed",
          expect={"update": "ok", "x": "3"},
          source=f"{_UPD} (FunctionChanged only for drivers < 11.2; none of the kernel-node limitations applies)")
def exec_update_function(r: Recorder) -> None:
    """``x += 1`` replaced by ``x = 3`` (another kernel, same context)."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, 1, tag="a_"))
    r.update("update", ex, _fill_graph(r, x, 3.0, "b_"))
    _launch_once(r, ex, s)
    r.value("x", x)


@scenario("executable update where the dependencies changed",
          expect={"update": "cudaErrorGraphExecUpdateFailure", "update_result": "cudaGraphExecUpdateErrorTopologyChanged",
                  "update_node": "kernel"},
          source=f"{_UPD} (a node with other dependencies, or more exit nodes: TopologyChanged, errorNode from hGraph)")
def exec_update_dependencies(r: Recorder) -> None:
    """Two kernels in a chain, updated with the same two kernels side by side (fork/join)."""
    be = r.be
    x, y = _buf(r), _buf(r)
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e1, e2 = be.new_event(), be.new_event()
    g1 = _capture(r, s1, "thread_local", lambda: (r.add("a_add_x", x, s1), r.add("a_add_y", y, s1)), tag="a_")
    ex = r.call("instantiate", be.graph_instantiate, g1)

    def forked():
        r.call("record_fork", be.event_record, s1, e1)
        r.call("s2_wait_fork", be.stream_wait_event, s2, e1)
        r.add("b_add_x", x, s1)
        r.add("b_add_y", y, s2)
        r.call("record_join", be.event_record, s2, e2)
        r.call("s1_wait_join", be.stream_wait_event, s1, e2)

    r.update("update", ex, _capture(r, s1, "thread_local", forked, tag="b_"))


@scenario("executable update of a graph with memory nodes",
          expect={"update": "ok"},
          source=f"{_GM}, cudaGraphExecNodeSetParams (memory allocation/free nodes: API unsupported for single-node "
                 "updates); measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): the whole-graph update of an identical graph succeeds")
def exec_update_mem_nodes(r: Recorder) -> None:
    """Allocation and free nodes, the same on both sides."""
    be = r.be
    g1, _ = _mem_graph(r, free=True, tag="a_")
    ex = r.call("instantiate", be.graph_instantiate, g1)
    g2, _ = _mem_graph(r, free=True, tag="b_")
    r.update("update", ex, g2)


# ----------------------------------------------------------------------------- graphs: composition and event nodes
@scenario("child graph nodes run as part of the parent",
          expect={"graph_create": "ok", "add_child1": "ok", "add_child2": "ok", "instantiate": "ok", "x": "2"},
          source=f"{_GM}, cudaGraphAddChildGraphNode")
def child_graph_runs(r: Recorder) -> None:
    """A captured ``x += 1`` graph added twice as a child of a created graph."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    child = _add_graph(r, x, tag="c_")
    parent = r.call("graph_create", be.graph_create)
    if parent is None or child is None:
        return
    r.call("add_child1", be.graph_add_child, parent, child)
    r.call("add_child2", be.graph_add_child, parent, child)
    ex = r.call("instantiate", be.graph_instantiate, parent)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a child graph is cloned: destroying it leaves the parent intact",
          expect={"add_child": "ok", "child_destroy": "ok", "instantiate": "ok", "replay0": "ok", "x": "1"},
          source=f"{_GM}, cudaGraphAddChildGraphNode (the child graph is cloned in this call)")
def child_graph_cloned(r: Recorder) -> None:
    """The child is destroyed right after it was added."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    child = _add_graph(r, x, tag="c_")
    parent = r.call("graph_create", be.graph_create)
    if parent is None or child is None:
        return
    r.call("add_child", be.graph_add_child, parent, child)
    r.call("child_destroy", be.graph_destroy, child)
    ex = r.call("instantiate", be.graph_instantiate, parent)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a child graph with memory nodes",
          expect={"add_child": "cudaErrorNotSupported"},
          source=f"{_GM}, cudaGraphAddChildGraphNode (a child with allocation or free nodes: an error); measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): "
                 "cudaErrorNotSupported")
def child_graph_mem_nodes(r: Recorder) -> None:
    """Graphs with memory nodes cannot be children."""
    be = r.be
    child, _ = _mem_graph(r, free=True)
    parent = r.call("graph_create", be.graph_create)
    if parent is not None and child is not None:
        r.call("add_child", be.graph_add_child, parent, child)


@scenario("event record node (cudaEventRecordExternal) in a capture",
          expect={"record_external": "ok", "nodes": "event_recordx1,kernel:tiny_addx1", "replay0": "ok",
                  "event_synchronize": "ok", "event_query": "ok"},
          source=f"{_RT}, cudaEventRecordWithFlags (cudaEventRecordExternal: an event record node)")
def event_record_external_node(r: Recorder) -> None:
    """Unlike a plain record in a capture, an external record is a node: each replay records the event, which the host
    can then wait for."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    g = _capture(r, s, "thread_local", lambda: (r.add("add", x, s), r.call("record_external", be.event_record_external, s, e)))
    r.nodes("nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    if ex is not None:
        r.call("replay0", be.graph_launch, ex, s)
        r.call("event_synchronize", be.event_synchronize, e)
        r.call("event_query", be.event_query, e)


@scenario("event wait node (cudaEventWaitExternal) on an event recorded outside the capture",
          expect={"wait_external": "ok", "nodes": "kernel:tiny_addx1,wait_eventx1", "end_capture": "ok"},
          source=f"{_RT}, cudaStreamWaitEvent (cudaEventWaitExternal); CUDA Programming Guide, 'Prohibited and "
                 "Unhandled Operations' (without the flag: refused)")
def wait_external_event_node(r: Recorder) -> None:
    """The wait that is refused without the flag (scenario wait_external_event) becomes a node."""
    be = r.be
    s1, s0 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    e = be.new_event()
    x = _buf(r)
    r.call("record_outside", be.event_record, s0, e)
    g = _capture(r, s1, "relaxed", lambda: (r.call("wait_external", be.stream_wait_event_external, s1, e),
                                            r.add("add", x, s1)))
    r.nodes("nodes", g)
