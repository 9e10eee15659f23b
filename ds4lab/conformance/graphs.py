"""Scenarios of the graph life cycle: launch and upload into capturing streams, instantiation (twice, with memory
nodes, flags), memory-allocation nodes across launches, destroy."""

from __future__ import annotations

from ..capture import stream as S
from .framework import MODES, N, _FACTS, _RT, Recorder, _buf, _capture, _launch_once, f32, scenario


# ----------------------------------------------------------------------------- graphs: launch and upload
_GM = f"{_RT}, 'Graph Management'"


def _add_graph(r: Recorder, x, n: int = 1, tag: str = "", mode: str = "thread_local"):
    """A graph of ``n`` ``x += 1`` kernels captured on a fresh stream (steps prefixed ``tag``)."""
    s = r.be.new_stream(non_blocking=True)
    return _capture(r, s, mode, lambda: [r.add(f"{tag}add{i}", x, s) for i in range(n)], tag=tag)


def _mem_graph(r: Recorder, free: bool, tag: str = "m_"):
    """A graph with a cudaMallocAsync node (and its cudaFreeAsync node when ``free``); returns (graph, buffer)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    held = {}

    def body():
        held["buf"] = r.call(f"{tag}malloc_async", be.malloc_async, s, (N,), f32)
        if free and held["buf"] is not None:
            r.call(f"{tag}free_async", be.free_async, s, held["buf"])

    g = _capture(r, s, "thread_local", body, tag=tag)
    return g, held.get("buf")


@scenario("graph launch into a stream that is capturing (every mode)", MODES,
          expect={"launch_into_capture": "cudaErrorStreamCaptureUnsupported", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated", "nodes": "no graph", "x": "0"},
          source=f"{_FACTS} (2026-11-30): cudaGraphLaunch into a capturing stream (global, relaxed) → 900, "
                 "invalidated, end → invalidated; GUESS: thread-local alike")
def graph_launch_into_capture(r: Recorder, mode: str) -> None:
    """Capturing a graph launch (a child-graph node in the sim before) is refused on the H200."""
    be = r.be
    x = _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s2 = be.new_stream(non_blocking=True)
    g = _capture(r, s2, mode, lambda: (r.call("launch_into_capture", be.graph_launch, ex, s2),
                                       r.note("status_in_capture", be.capture_status(s2))))
    r.nodes("nodes", g)
    r.value("x", x)


@scenario("graph launch into a stream whose capture is invalidated",
          expect={"device_synchronize": "cudaErrorStreamCaptureUnsupported",
                  "launch_into_invalidated": "cudaErrorStreamCaptureUnsupported",
                  "end_capture": "cudaErrorStreamCaptureInvalidated", "x": "0"},
          source="CUDA Programming Guide, 'Stream Capture' → 'Invalidation'; measured on the H200 (2026-11-30, docs/measurements/h200-2026-11-30b/conformance): the launch returns "
                 "cudaErrorStreamCaptureUnsupported")
def graph_launch_invalidated_capture(r: Recorder) -> None:
    """Every further use of a stream in an invalidated capture fails until the capture ends."""
    be = r.be
    x = _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s2 = be.new_stream(non_blocking=True)
    _capture(r, s2, "relaxed", lambda: (r.call("device_synchronize", be.synchronize),
                                        r.call("launch_into_invalidated", be.graph_launch, ex, s2)))
    r.value("x", x)


@scenario("graph launch on the legacy stream while a blocking stream captures",
          expect={"launch_legacy": "cudaErrorStreamCaptureImplicit", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated"},
          source="CUDA Programming Guide, 'Prohibited and Unhandled Operations' (legacy stream use during the "
                 "capture of a blocking stream)")
def graph_launch_legacy_blocking_capture(r: Recorder) -> None:
    """A graph launch is legacy-stream work like a kernel."""
    be = r.be
    x, y = _buf(r), _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s = be.new_stream(non_blocking=False)
    _capture(r, s, "relaxed", lambda: (r.add("add_s", y, s), r.call("launch_legacy", be.graph_launch, ex, S.LEGACY_STREAM),
                                       r.note("status_in_capture", be.capture_status(s))))


@scenario("graph upload, then launch",
          expect={"upload": "ok", "replay0": "ok", "x": "1"}, source=f"{_GM}, cudaGraphUpload")
def graph_upload_then_launch(r: Recorder) -> None:
    """cudaGraphUpload prepares the executable without running it; the launch runs it once."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    r.call("upload", be.graph_upload, ex, s)
    r.call("upload_sync", be.stream_synchronize, s)
    r.value("x_after_upload", x)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("graph upload into a stream that is capturing",
          expect={"upload_into_capture": "cudaErrorStreamCaptureUnsupported", "status_in_capture": "invalidated",
                  "end_capture": "cudaErrorStreamCaptureInvalidated"},
          source=f"{_GM}, cudaGraphUpload (stream-ordered); GUESS: refused as a launch is ({_FACTS})")
def graph_upload_into_capture(r: Recorder) -> None:
    """cudaGraphUpload into a capturing stream."""
    be = r.be
    x = _buf(r)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    s2 = be.new_stream(non_blocking=True)
    _capture(r, s2, "relaxed", lambda: (r.call("upload_into_capture", be.graph_upload, ex, s2),
                                        r.note("status_in_capture", be.capture_status(s2))))


@scenario("one executable launched on two streams back to back",
          expect={"replay_s1": "ok", "replay_s2": "ok", "x": "2"},
          source=f"{_GM}, cudaGraphLaunch: each launch is ordered behind any previous launches of the executable")
def graph_launch_two_streams(r: Recorder) -> None:
    """Two launches of one executable on two streams, no synchronization between them."""
    be = r.be
    x = _buf(r)
    s1, s2 = be.new_stream(non_blocking=True), be.new_stream(non_blocking=True)
    ex = r.call("instantiate", be.graph_instantiate, _add_graph(r, x, tag="g_"))
    r.call("replay_s1", be.graph_launch, ex, s1)
    r.call("replay_s2", be.graph_launch, ex, s2)
    r.call("sync_s1", be.stream_synchronize, s1)
    r.call("sync_s2", be.stream_synchronize, s2)
    r.value("x", x)


# ----------------------------------------------------------------------------- graphs: instantiation
@scenario("a graph without memory nodes instantiated twice",
          expect={"instantiate1": "ok", "instantiate2": "ok", "x": "2"},
          source=f"{_GM}, cudaGraphLaunch: to run a graph concurrently, instantiate it several times")
def instantiate_twice(r: Recorder) -> None:
    """Both executables replay the same nodes."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    g = _add_graph(r, x, tag="g_")
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    ex2 = r.call("instantiate2", be.graph_instantiate, g)
    r.call("replay1", be.graph_launch, ex1, s)
    r.call("replay2", be.graph_launch, ex2, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)


@scenario("a graph that allocates and frees, instantiated while its executable lives",
          expect={"m_nodes": "mem_allocx1,mem_freex1", "instantiate1": "ok", "instantiate2": "cudaErrorNotSupported"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (at most one executable in existence for a graph with "
                 "memory nodes)")
def instantiate_mem_nodes_twice(r: Recorder) -> None:
    """A graph with cudaMallocAsync and the matching cudaFreeAsync node, instantiated twice while the first executable
    is kept alive (in CuPy a dropped executable is destroyed at once)."""
    be = r.be
    g, _ = _mem_graph(r, free=True)
    r.nodes("m_nodes", g)
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    r.call("instantiate2", be.graph_instantiate, g)
    del ex1


@scenario("a graph with an unfreed allocation instantiated again, then after its executable is dropped",
          expect={"u_nodes": "mem_allocx1", "instantiate1": "ok", "instantiate2": "cudaErrorNotSupported",
                  "instantiate3": "ok"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (at most one executable in existence); {_FACTS} (2026-11-30) "
                 "and the H200 conformance run of 2026-11-30: cudaErrorNotSupported while the first executable "
                 "lives; once it is destroyed the slot is free")
def instantiate_unfreed_mem_nodes_twice(r: Recorder) -> None:
    """The graph allocates and does not free: a second executable while the first lives, then one after the first is
    destroyed."""
    be = r.be
    g, _ = _mem_graph(r, free=False, tag="u_")
    r.nodes("u_nodes", g)
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    r.call("instantiate2", be.graph_instantiate, g)
    if ex1 is not None:
        be.graph_exec_destroy(ex1)
    r.call("instantiate3", be.graph_instantiate, g)


@scenario("a graph with memory nodes instantiated again after its executable was destroyed",
          expect={"instantiate1": "ok", "exec_destroy": "ok", "instantiate2": "ok", "replay0": "ok"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags ('before destroying the first with cudaGraphExecDestroy')")
def instantiate_after_exec_destroy(r: Recorder) -> None:
    """cudaGraphExecDestroy frees the graph's one-executable slot."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=True)
    ex1 = r.call("instantiate1", be.graph_instantiate, g)
    r.call("exec_destroy", be.graph_exec_destroy, ex1)
    ex2 = r.call("instantiate2", be.graph_instantiate, g)
    r.call("replay0", be.graph_launch, ex2, s)
    r.call("replay_sync", be.stream_synchronize, s)


@scenario("relaunch of a graph whose allocation was never freed",
          expect={"m_nodes": "mem_allocx1", "replay0": "ok", "replay1": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphLaunch (unfreed allocations of a previous launch: cudaErrorInvalidValue); "
                 f"{_FACTS} (2026-11-30)")
def mem_alloc_unfreed_relaunch(r: Recorder) -> None:
    """A cudaMallocAsync node without a free: the first launch allocates; the second is refused."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=False)
    r.nodes("m_nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay0_sync", be.stream_synchronize, s)
    r.call("replay1", be.graph_launch, ex, s)
    r.call("replay1_sync", be.stream_synchronize, s)


@scenario("relaunch with cudaGraphInstantiateFlagAutoFreeOnLaunch",
          expect={"instantiate_auto_free": "ok", "replay0": "ok", "replay1": "ok"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (AutoFreeOnLaunch frees unfreed allocations before relaunch)")
def mem_alloc_auto_free_on_launch(r: Recorder) -> None:
    """The same graph instantiated with AutoFreeOnLaunch relaunches."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=False)
    ex = r.call("instantiate_auto_free", be.graph_instantiate, g, 1)
    for i in range(2):
        r.call(f"replay{i}", be.graph_launch, ex, s)
        r.call(f"replay{i}_sync", be.stream_synchronize, s)


@scenario("a graph's allocation freed outside the graph, then relaunch",
          expect={"replay0": "ok", "free_outside": "ok", "replay1": "ok"},
          source="CUDA Programming Guide, 'Graph Memory Nodes' (freeing graph memory outside the allocating graph); "
                 f"{_GM}, cudaGraphLaunch")
def mem_alloc_freed_outside(r: Recorder) -> None:
    """cudaFreeAsync of the graph's allocation after a launch makes the next launch legal."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, buf = _mem_graph(r, free=False)
    ex = r.call("instantiate", be.graph_instantiate, g)
    r.call("replay0", be.graph_launch, ex, s)
    if buf is not None:
        r.call("free_outside", be.free_async, s, buf)
    r.call("replay1", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)


@scenario("a graph that allocates and frees, launched three times",
          expect={"m_nodes": "mem_allocx1,mem_freex1", "replay0": "ok", "replay1": "ok", "replay2": "ok"},
          source=f"{_GM}, cudaGraphLaunch (no allocation left unfreed)")
def mem_alloc_freed_in_graph(r: Recorder) -> None:
    """An allocation freed inside the same graph never blocks a relaunch."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g, _ = _mem_graph(r, free=True)
    r.nodes("m_nodes", g)
    ex = r.call("instantiate", be.graph_instantiate, g)
    for i in range(3):
        r.call(f"replay{i}", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)


@scenario("instantiate with DeviceLaunch together with AutoFreeOnLaunch",
          expect={"instantiate_device_auto_free": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags ('cannot be used in conjunction')")
def instantiate_device_launch_auto_free(r: Recorder) -> None:
    """Two flags the reference says exclude each other."""
    x = _buf(r)
    r.call("instantiate_device_auto_free", r.be.graph_instantiate, _add_graph(r, x, tag="g_"), 4 | 1)


@scenario("instantiate for device launch a graph with memory nodes",
          expect={"instantiate_device": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (device graphs: kernel, memcpy, memset and child graph nodes "
                 "only; returns cudaErrorInvalidValue)")
def instantiate_device_launch_mem_nodes(r: Recorder) -> None:
    """A graph with memory nodes cannot be instantiated for device launch."""
    g, _ = _mem_graph(r, free=True)
    r.call("instantiate_device", r.be.graph_instantiate, g, 4)


@scenario("instantiate for device launch an empty graph",
          expect={"graph_create": "ok", "instantiate_device": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (a device graph cannot be empty)")
def instantiate_device_launch_empty(r: Recorder) -> None:
    """An empty graph cannot be instantiated for device launch."""
    g = r.call("graph_create", r.be.graph_create)
    if g is not None:
        r.call("instantiate_device", r.be.graph_instantiate, g, 4)


@scenario("instantiate for device launch a graph of kernels, launch it from the host",
          expect={"instantiate_device": "ok", "replay0": "ok", "x": "1"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (a device-launch executable launches from host and device)")
def instantiate_device_launch_kernels(r: Recorder) -> None:
    """A kernel-only graph instantiated for device launch also runs from the host."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    ex = r.call("instantiate_device", be.graph_instantiate, _add_graph(r, x, tag="g_"), 4)
    _launch_once(r, ex, s)
    r.value("x", x)


@scenario("cudaGraphInstantiateFlagUpload through cudaGraphInstantiateWithFlags",
          expect={"instantiate_upload_flag": "cudaErrorInvalidValue"},
          source=f"{_RT}, enum cudaGraphInstantiateFlags (Upload: only with cudaGraphInstantiateWithParams). "
                 "GUESS: the error")
def instantiate_flag_upload(r: Recorder) -> None:
    """The upload flag needs the stream that only cudaGraphInstantiateWithParams names."""
    x = _buf(r)
    r.call("instantiate_upload_flag", r.be.graph_instantiate, _add_graph(r, x, tag="g_"), 2)


@scenario("instantiate with an unknown flag bit",
          expect={"instantiate_bad_flag": "cudaErrorInvalidValue"},
          source=f"{_GM}, cudaGraphInstantiateWithFlags (valid flags; returns cudaErrorInvalidValue)")
def instantiate_unknown_flag(r: Recorder) -> None:
    """Flag bit 1 << 10 names nothing."""
    x = _buf(r)
    r.call("instantiate_bad_flag", r.be.graph_instantiate, _add_graph(r, x, tag="g_"), 1 << 10)


@scenario("an empty graph: create, instantiate, launch",
          expect={"graph_create": "ok", "instantiate": "ok", "replay0": "ok", "replay_sync": "ok"},
          source=f"{_GM}, cudaGraphCreate / cudaGraphInstantiate (an empty graph is valid for host launch)")
def empty_graph_launch(r: Recorder) -> None:
    """A graph with no nodes launches and does nothing."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    g = r.call("graph_create", be.graph_create)
    ex = r.call("instantiate", be.graph_instantiate, g) if g is not None else None
    _launch_once(r, ex, s)


@scenario("destroy the graph, launch its executable",
          expect={"graph_destroy": "ok", "replay0": "ok", "x": "1"},
          source=f"{_GM}, cudaGraphInstantiate / cudaGraphDestroy (the executable is independent of its graph)")
def graph_destroy_exec_lives(r: Recorder) -> None:
    """An executable graph keeps working after cudaGraphDestroy of the graph it came from."""
    be = r.be
    x = _buf(r)
    s = be.new_stream(non_blocking=True)
    g = _add_graph(r, x, tag="g_")
    ex = r.call("instantiate", be.graph_instantiate, g)
    if g is not None:
        r.call("graph_destroy", be.graph_destroy, g)
    r.call("replay0", be.graph_launch, ex, s)
    r.call("replay_sync", be.stream_synchronize, s)
    r.value("x", x)
