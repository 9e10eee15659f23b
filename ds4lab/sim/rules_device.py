"""The simulator's rules for graph construction inside a capture, conditional nodes and programmatic dependent launch
(stages ``3cc``, ``3p``, ``3cp``, ``3ccp``), each with a conformance scenario in
``ds4lab/conformance/device_graphs.py``. Entries are :class:`ds4lab.sim.rules.Rule` fields; :mod:`ds4lab.sim.rules`
adds them to its ``RULES``. ``RT``, ``PG`` as there."""

from __future__ import annotations

_COND = "PG 'CUDA Graphs' → 'Conditional Graph Nodes'"

DEVICE_RULES: dict[str, tuple] = {
    "capture_graph_query": (
        "cudaStreamGetCaptureInfo of a stream in an active capture", "returns", None, "-",
        "RT cudaStreamGetCaptureInfo: graph_out is the graph being captured into ('all operations other than "
        "destroy and node removal are permitted on the graph while the capture sequence is in progress'); "
        "dependencies_out the nodes the next captured work depends on; valid only while the status is Active"),
    "conditional_handle": (
        "cudaGraphConditionalHandleCreate on a graph (a captured one: from cudaStreamGetCaptureInfo)", "returns",
        None, "-",
        "RT cudaGraphConditionalHandleCreate: the handle must be associated with a conditional node in this graph "
        "or one of its children; defaultLaunchValue is applied at the beginning of each graph execution when "
        f"flags holds cudaGraphCondAssignDefault; {_COND}"),
    "conditional_node": (
        "cudaGraphAddNode of a conditional node (IF with 1 or 2 bodies, WHILE with 1, SWITCH with n >= 1) into a "
        "graph, a captured one included, after given dependencies", "node", None, "-",
        "RT cudaGraphAddNode, cudaConditionalNodeParams: phGraph_out, a CUDA-owned array of the node's body graphs "
        "(valid for the node's lifetime), populated by the graph node APIs or cudaStreamBeginCaptureToGraph; "
        "allowed in a body: kernel, empty, child graph, memset, memcpy and conditional nodes. The capture does not "
        "depend on the node until cudaStreamUpdateCaptureDependencies says so"),
    "conditional_node_size": (
        "cudaGraphAddNode of a conditional node with a body count its type does not allow (IF 0 or more than 2, "
        "WHILE other than 1, SWITCH 0)", "raises", "cudaErrorInvalidValue", "none",
        "RT cudaConditionalNodeParams.size: 'Allowed values are 1 for cudaGraphCondTypeWhile, 1 or 2 for "
        "cudaGraphCondTypeIf, or any value greater than zero for cudaGraphCondTypeSwitch'; RT cudaGraphAddNode "
        "returns cudaErrorInvalidValue among its errors. Checked on the H200 (scenario conditional_bad_size): that is the error for a size"),
    "conditional_handle_other_graph": (
        "cudaGraphAddNode of a conditional node whose handle was created for another, unrelated graph", "raises",
        "cudaErrorInvalidValue", "none",
        "RT cudaGraphConditionalHandleCreate: 'The conditional handle must be associated with a conditional node "
        "in this graph or one of its children'. Checked on the H200 (scenario conditional_handle_other_graph): refused by cudaGraphAddNode with cudaErrorInvalidValue "
        "(not at instantiation)"),
    "capture_dependencies_update": (
        "cudaStreamUpdateCaptureDependencies on a capturing stream (set: cudaStreamSetCaptureDependencies, add: "
        "cudaStreamAddCaptureDependencies)", "joins", None, "-",
        "RT cudaStreamUpdateCaptureDependencies: modifies the dependency set of a capturing stream, the set that "
        "the next captured node depends on (replaced, or the nodes added to it)"),
    "capture_dependencies_update_idle": (
        "cudaStreamUpdateCaptureDependencies on a stream that is not capturing", "raises", "cudaErrorIllegalState",
        "none", "RT cudaStreamUpdateCaptureDependencies: 'Returns cudaErrorIllegalState if the stream is not "
        "capturing'"),
    "capture_to_graph": (
        "cudaStreamBeginCaptureToGraph(stream, graph): the stream's work captured into an existing graph (a "
        "conditional node's body) until cudaStreamEndCapture, which returns that graph", "node", None, "-",
        "RT cudaStreamBeginCaptureToGraph: 'placing new nodes into an existing graph ... which will be returned "
        "via cudaStreamEndCapture'; the begin/end rules of cudaStreamBeginCapture apply (not the legacy stream, "
        f"not a stream already capturing, same thread unless relaxed); {_COND}"),
    "set_conditional": (
        "a kernel of a launched graph calls cudaGraphSetConditional(handle, value); a conditional node after it "
        "reads the value when the graph reaches it", "updates", None, "-",
        "RT cudaGraphSetConditional (device function: 'Sets the condition value associated with a conditional "
        "node'); cudaConditionalNodeParams: IF runs body 0 on a non-zero value (body 1, when there are two, on "
        "zero), WHILE body 0 as long as the value is non-zero, SWITCH body n on the value n, none when the value "
        f">= size; {_COND}"),
    "conditional_default": (
        "a launch of a graph whose conditional handle was created with cudaGraphCondAssignDefault", "updates",
        None, "-",
        "RT cudaGraphConditionalHandleCreate: defaultLaunchValue 'Applied at the beginning of each graph "
        "execution if cudaGraphCondAssignDefault is set in flags'. Checked on the H200 (scenarios conditional_default_value_0, _1): without the flag the value a launch "
        "left stays for the next"),
    "child_graph_conditional": (
        "cudaGraphAddChildGraphNode with a child graph that holds a conditional node", "raises",
        "cudaErrorNotSupported", "none",
        "RT cudaGraphAddChildGraphNode: 'If childGraph contains allocation nodes, free nodes, or conditional "
        "nodes, this call will return an error' (RT cudaChildGraphNodeParams: 'The graph must not contain "
        "conditional nodes'). Checked on the H200 (scenario child_graph_conditional): the error name, as measured for memory nodes (rule child_graph_mem_nodes)"),
    "programmatic_edge": (
        "a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization into a capturing stream whose "
        "next work depends on exactly one node, a kernel node", "node", None, "-",
        "PG 'Programmatic Dependent Launch and Synchronization' → use in CUDA graphs: stream capture records the "
        "dependency as a programmatic edge; RT cudaGraphEdgeData (type cudaGraphDependencyTypeProgrammatic, "
        "from_port cudaGraphKernelNodePortProgrammatic: 'activates when all blocks of the kernel have performed "
        "cudaTriggerProgrammaticLaunchCompletion() or have terminated'; only kernel nodes define non-zero ports)"),
    "programmatic_after_other": (
        "a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization into a capturing stream whose "
        "dependency is not one kernel node (a memset, a conditional node, several nodes, none)", "node", None, "-",
        "RT cudaGraphEdgeData: only kernel nodes define non-zero (programmatic) ports. Checked on the H200 (scenario programmatic_after_memset): captured with "
        "default edges, the attribute without effect (ds4lab's launches never ask for it: launch_programmatic "
        "sets the attribute only after one kernel node)"),
    "programmatic_eager": (
        "a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization on a stream that is not "
        "capturing", "returns", None, "-",
        "PG 'Programmatic Dependent Launch and Synchronization': the kernel may start before the kernel before it "
        "in the stream completes, once every block of that kernel has triggered or exited; its "
        "cudaGridDependencySynchronize (griddepcontrol.wait) waits for that kernel's completion and memory "
        "flush. The sim computes the same numbers as a plain launch and prices no overlap outside a graph"),
}

__all__ = ["DEVICE_RULES"]
