"""The cupy backend's conditional-node, capture-into-graph and cuLaunchKernelEx calls
(``ds4lab/backends/cuda_graph_calls.py``, ``cupy_device_graphs.py``) against fakes of ``cuda.bindings``
(no GPU): which binding each call takes (12.3 … 12.9's suffixed names, 13's plain ones), what it passes,
that every status is checked and named, and the programmatic launch's decisions (after a kernel node:
the attribute; after another node: none; a kernel without the device-side half: refused before CUDA).
Where the real ``cuda.bindings`` imports, the launch configuration is built with its own structures."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ds4lab.backends import cuda_graph_calls as G
from ds4lab.executor.kernel_pdl import MissingDeviceHalf
from ds4lab.errors import CudaError


class H(int):
    """A handle or an enum member (``int()`` gives its value)."""

    def __new__(cls, v=0, _ptr=None):
        return super().__new__(cls, int(v))


class _Cond:
    def __init__(self):
        self.handle = self.type = self.size = None
        self.phGraph_out = None  # CUDA fills it (here: the fake cudaGraphAddNode)


class _Params:
    def __init__(self):
        self.type = None
        self.conditional = _Cond()


def _edge(t):
    return SimpleNamespace(type=t)


class FakeRuntime:
    """``cuda.bindings.runtime`` for the calls of cuda_graph_calls: records each call, answers from a
    small graph state; ``fail[name] = code`` makes that call return the status ``code``."""

    cudaStream_t = cudaGraph_t = cudaGraphNode_t = cudaGraphConditionalHandle = H
    cudaGraphConditionalHandleFlags = SimpleNamespace(cudaGraphCondAssignDefault=H(1))
    cudaGraphNodeType = SimpleNamespace(cudaGraphNodeTypeConditional=H(13))
    cudaStreamUpdateCaptureDependenciesFlags = SimpleNamespace(cudaStreamAddCaptureDependencies=H(0),
                                                               cudaStreamSetCaptureDependencies=H(1))
    cudaGraphNodeParams = _Params

    def __init__(self, suffixed: bool, status: int = 1):
        self.calls, self.fail = [], {}
        self.status, self.deps, self.edges = status, [H(0x50)], [_edge(0)]
        self.kinds = {0x50: 0, 0x60: 2, 0x70: 13}  # node handle -> cudaGraphNodeType (kernel, memset, conditional)
        names = {"cudaStreamGetCaptureInfo": "_v3", "cudaGraphAddNode": "_v2",
                 "cudaStreamUpdateCaptureDependencies": "_v2", "cudaGraphGetEdges": "_v2"}
        for base, suffix in names.items():
            impl = getattr(self, "_" + base)
            setattr(self, base + suffix if suffixed else base, self._rec(base, impl))
            if suffixed:  # the 12.x plain names have no edge data: calling them would be the bug
                setattr(self, base, self._wrong(base))
        for name in ("cudaGraphConditionalHandleCreate", "cudaStreamBeginCaptureToGraph", "cudaStreamEndCapture",
                     "cudaGraphNodeGetType", "cudaGraphGetNodes"):
            setattr(self, name, self._rec(name, getattr(self, "_" + name)))

    @staticmethod
    def cudaGraphConditionalNodeType(v):
        return H(v)

    @staticmethod
    def cudaStreamCaptureMode(v):
        return H(v)

    def _rec(self, name, impl):
        def call(*a):
            self.calls.append((name, a))
            if name in self.fail:
                return (H(self.fail[name]),) + impl(*a)[1:]
            return impl(*a)
        return call

    @staticmethod
    def _wrong(name):
        def call(*a):
            raise AssertionError(f"{name} without edge data called on 12.3+ bindings")
        return call

    def _cudaStreamGetCaptureInfo(self, stream):
        return H(0), H(self.status), 7, H(0x1000), self.deps, self.edges, len(self.deps)

    def _cudaGraphConditionalHandleCreate(self, graph, default, flags):
        return H(0), H(0xC0FFEE)

    def _cudaGraphAddNode(self, graph, deps, dep_data, n, params):
        params.conditional.phGraph_out = [H(0x2000 + i) for i in range(params.conditional.size)]
        return H(0), H(0x70)

    def _cudaStreamUpdateCaptureDependencies(self, stream, deps, dep_data, n, flags):
        return (H(0),)

    def _cudaStreamBeginCaptureToGraph(self, stream, graph, deps, dep_data, n, mode):
        return (H(0),)

    def _cudaStreamEndCapture(self, stream):
        return H(0), H(0x2000)

    def _cudaGraphNodeGetType(self, node):
        return H(0), H(self.kinds.get(int(node), 5))

    def _cudaGraphGetNodes(self, graph, n):
        nodes = [H(0x50), H(0x60), H(0x70)]
        return (H(0), [] if not n else nodes[:n], len(nodes))

    def _cudaGraphGetEdges(self, graph, n):
        frm, to, data = [H(0x50), H(0x60)], [H(0x60), H(0x70)], [_edge(1), _edge(0)]
        return (H(0), [] if not n else frm, [] if not n else to, [] if not n else data, 2)


@pytest.fixture(params=[True, False], ids=["bindings-12", "bindings-13"])
def rt(request):
    return FakeRuntime(suffixed=request.param)


def _names(rt):
    return [c[0] for c in rt.calls]


def test_capture_info_active_and_not(rt):
    assert G.capture_info(rt, 0xAB) == ("active", 0x1000, [0x50], ["default"])
    rt.status = 0
    assert G.capture_info(rt, 0xAB) == ("none", 0, [], [])
    rt.status, rt.edges = 1, [_edge(1)]
    assert G.capture_info(rt, 0xAB)[3] == ["programmatic"]
    assert _names(rt) == ["cudaStreamGetCaptureInfo"] * 3 and rt.calls[0][1] == (0xAB,)


def test_conditional_handle_and_node(rt):
    assert G.conditional_handle_create(rt, 0x1000, 0, True) == 0xC0FFEE
    assert rt.calls[-1][1] == (0x1000, 0, 1)
    G.conditional_handle_create(rt, 0x1000, 3, False)
    assert rt.calls[-1][1] == (0x1000, 3, 0)
    node, bodies = G.add_conditional_node(rt, 0x1000, [0x50], 0xC0FFEE, "switch", 3)
    assert node == 0x70 and bodies == [0x2000, 0x2001, 0x2002]
    graph, deps, dep_data, n, params = rt.calls[-1][1]
    assert (graph, deps, dep_data, n) == (0x1000, [0x50], None, 1)
    assert int(params.type) == 13 and int(params.conditional.handle) == 0xC0FFEE
    assert int(params.conditional.type) == 2 and params.conditional.size == 3
    with pytest.raises(ValueError, match="kind"):
        G.add_conditional_node(rt, 0x1000, [], 1, "unless", 1)


def test_update_begin_end_and_queries(rt):
    G.update_capture_dependencies(rt, 0xAB, [0x70], replace=True)
    assert rt.calls[-1][1][1:] == ([0x70], None, 1, 1)
    G.update_capture_dependencies(rt, 0xAB, [0x70], replace=False)
    assert rt.calls[-1][1][-1] == 0
    G.begin_capture_to_graph(rt, 0xCD, 0x2000, "relaxed")
    assert rt.calls[-1][1] == (0xCD, 0x2000, [], [], 0, 2)
    with pytest.raises(ValueError, match="capture mode"):
        G.begin_capture_to_graph(rt, 0xCD, 0x2000, "loose")
    assert G.end_capture(rt, 0xCD) == 0x2000
    assert G.graph_nodes(rt, 0x1000) == [0x50, 0x60, 0x70]
    assert [G.node_kind(rt, n) for n in (0x50, 0x60, 0x70)] == ["kernel", "memset", "conditional"]
    assert G.graph_edges(rt, 0x1000) == [(0x50, 0x60, "programmatic"), (0x60, 0x70, "default")]


@pytest.mark.parametrize("call,args,name", [
    ("cudaGraphConditionalHandleCreate", lambda rt: G.conditional_handle_create(rt, 1, 0, True), "cudaErrorNotSupported"),
    ("cudaGraphAddNode", lambda rt: G.add_conditional_node(rt, 1, [], 2, "if", 3), "cudaErrorInvalidValue"),
    ("cudaStreamUpdateCaptureDependencies", lambda rt: G.update_capture_dependencies(rt, 1, []), "cudaErrorIllegalState"),
    ("cudaStreamBeginCaptureToGraph", lambda rt: G.begin_capture_to_graph(rt, 1, 2), "cudaErrorStreamCaptureUnsupported"),
    ("cudaStreamGetCaptureInfo", lambda rt: G.capture_info(rt, 1), "cudaErrorStreamCaptureImplicit"),
    ("cudaStreamEndCapture", lambda rt: G.end_capture(rt, 1), "cudaErrorStreamCaptureInvalidated"),
])
def test_every_status_is_checked_and_named(rt, call, args, name):
    codes = {"cudaErrorNotSupported": 801, "cudaErrorInvalidValue": 1, "cudaErrorIllegalState": 401,
             "cudaErrorStreamCaptureUnsupported": 900, "cudaErrorStreamCaptureImplicit": 906,
             "cudaErrorStreamCaptureInvalidated": 901}
    rt.fail[call] = codes[name]
    with pytest.raises(CudaError) as ei:
        args(rt)
    assert ei.value.name == name and call in ei.value.call


def test_add_node_reads_no_body_after_a_failure():
    """phGraph_out is only read after cudaGraphAddNode succeeded (before, it is NULL: the real binding
    would dereference it)."""
    rt = FakeRuntime(suffixed=True)

    def refuse(graph, deps, dep_data, n, params):
        return H(1), None

    rt.cudaGraphAddNode_v2 = refuse
    with pytest.raises(CudaError, match="cudaErrorInvalidValue"):
        G.add_conditional_node(rt, 1, [], 2, "if", 1)


# ----------------------------------------------------------------------------- cuLaunchKernelEx
class FakeDriver:
    """``cuda.bindings.driver``: plain structures; cuLaunchKernelEx records what it is given and reads the
    kernel parameters back through the ``void**`` address it gets."""

    CUlaunchAttributeID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=H(6))

    class CUlaunchConfig:
        def __init__(self):
            self.attrs, self.numAttrs = None, None

    class CUlaunchAttribute:
        def __init__(self):
            self.id = None
            self.value = SimpleNamespace(programmaticStreamSerializationAllowed=0)

    CUstream = CUfunction = H

    def __init__(self, status=0):
        self.launches, self.status = [], status

    def cuLaunchKernelEx(self, cfg, f, params, extra):
        import ctypes

        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        self.launches.append((cfg, int(f), ctypes.cast(ptrs[0], ctypes.POINTER(ctypes.c_uint64))[0],
                              ctypes.cast(ptrs[1], ctypes.POINTER(ctypes.c_int32))[0], extra))
        return (H(self.status),)


class _Dev:
    """A device array as the launch packs it (``.data.ptr``)."""

    def __init__(self, ptr):
        self.data = SimpleNamespace(ptr=ptr)


def test_launch_kernel_ex_packs_the_configuration_and_the_arguments():
    drv = FakeDriver()
    G.launch_kernel_ex(drv, 0xF00, (3,), (32, 8), 1024, 0xAB, (_Dev(0xDEAD0), np.int32(-5)), programmatic=True)
    cfg, f, p0, p1, extra = drv.launches[0]
    assert f == 0xF00 and p0 == 0xDEAD0 and p1 == -5 and extra == 0
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (3, 1, 1, 32, 8, 1)
    assert cfg.sharedMemBytes == 1024 and int(cfg.hStream) == 0xAB and cfg.numAttrs == 1
    (a,) = cfg.attrs
    assert int(a.id) == 6 and a.value.programmaticStreamSerializationAllowed == 1
    G.launch_kernel_ex(drv, 0xF00, (1,), (32,), 0, 0, (None, np.int32(0)), programmatic=False)
    assert drv.launches[1][0].numAttrs == 0 and drv.launches[1][0].attrs is None
    assert drv.launches[1][2] == 0  # None: a NULL pointer, as CuPy passes it
    with pytest.raises(TypeError):
        G.launch_kernel_ex(drv, 0xF00, (1,), (32,), 0, 0, ("not an argument",), programmatic=False)
    with pytest.raises(ValueError, match="three dimensions"):
        G.launch_kernel_ex(drv, 0xF00, (1, 1, 1, 1), (32,), 0, 0, (), programmatic=False)
    bad = FakeDriver(status=701)
    with pytest.raises(CudaError) as ei:
        G.launch_kernel_ex(bad, 0xF00, (1,), (32,), 0, 0, (_Dev(1), np.int32(0)), programmatic=True)
    assert ei.value.call == "cuLaunchKernelEx" and ei.value.name.startswith("cudaError")


def test_launch_config_with_the_real_bindings():
    """The same configuration built from cuda.bindings' own structures (no driver is called)."""
    drv = pytest.importorskip("cuda.bindings.driver")
    cfg = G.launch_config(drv, (4, 2), (128,), 512, 0, programmatic=True)
    assert (cfg.gridDimX, cfg.gridDimY, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (4, 2, 128, 512, 1)
    assert cfg.attrs[0].id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert cfg.attrs[0].value.programmaticStreamSerializationAllowed == 1
    assert G.launch_config(drv, (1,), (32,), 0, 0, programmatic=False).numAttrs == 0


def test_conditional_params_with_the_real_bindings():
    """cudaGraphNodeParams.conditional is a view into the node parameters: what add_conditional_node sets
    there is what cudaGraphAddNode reads."""
    rt = pytest.importorskip("cuda.bindings.runtime")
    p = rt.cudaGraphNodeParams()
    p.type = rt.cudaGraphNodeType.cudaGraphNodeTypeConditional
    c = p.conditional
    c.handle = rt.cudaGraphConditionalHandle(77)
    c.type = rt.cudaGraphConditionalNodeType(2)
    c.size = 5
    assert int(p.conditional.handle) == 77 and int(p.conditional.type) == 2 and p.conditional.size == 5
    assert G.edge_variant(rt, "cudaGraphAddNode", "_v2") is (getattr(rt, "cudaGraphAddNode_v2", None)
                                                             or rt.cudaGraphAddNode)


# ----------------------------------------------------------------------------- the cupy mixin's decisions
class _Fn:
    ptr = 0xF1


class _Module:
    def get_function(self, name):
        return SimpleNamespace(kernel=SimpleNamespace(ptr=0xF2))


@pytest.fixture
def fake_cupy_backend(monkeypatch):
    """A CupyDeviceGraphsMixin over fakes: no CuPy, no GPU."""
    from pathlib import Path

    from ds4lab.backends import cupy_device_graphs as C

    rt, drv = FakeRuntime(suffixed=False), FakeDriver()
    monkeypatch.setattr(C, "_cudart", lambda: rt)
    monkeypatch.setattr(C, "_cudadrv", lambda: drv)

    class Backend(C.CupyDeviceGraphsMixin):
        cp = SimpleNamespace(RawModule=lambda **kw: _Module())
        _sources = {"tiny_add": Path("kernels/bench.cu"), "empty_kernel": Path("kernels/bench.cu")}

        def _ptr_stream(self, s):
            return 0xAB

        def function(self, name):
            return _Fn()

    return Backend(), rt, drv


def test_programmatic_launch_after_a_kernel_node_sets_the_attribute(fake_cupy_backend):
    be, rt, drv = fake_cupy_backend
    x = _Dev(0x10)
    assert be.launch_programmatic("s", "tiny_add", (4,), (256,), (x, np.int32(1024)), 0, None) is True
    assert drv.launches[-1][0].numAttrs == 1 and drv.launches[-1][1] == 0xF2  # the pdl build's function
    rt.deps = [H(0x60)]  # a memset before it
    assert be.launch_programmatic("s", "tiny_add", (4,), (256,), (x, np.int32(1024)), 0, None) is False
    assert drv.launches[-1][0].numAttrs == 0
    assert be.launch_programmatic("s", "tiny_add", (4,), (256,), (x, np.int32(1024)), 0, None,
                                  predecessor="any") is True
    rt.deps = [H(0x50), H(0x50)]  # two dependencies
    assert be.launch_programmatic("s", "tiny_add", (4,), (256,), (x, np.int32(1024)), 0, None) is False
    rt.status = 0  # not capturing: eager programmatic launch
    assert be.launch_programmatic("s", "tiny_add", (4,), (256,), (x, np.int32(1024)), 0, None) is True


def test_programmatic_launch_refused_without_the_device_half_before_cuda(fake_cupy_backend):
    be, rt, drv = fake_cupy_backend
    with pytest.raises(MissingDeviceHalf, match="empty_kernel"):
        be.launch_programmatic("s", "empty_kernel", (1,), (32,), (), 0, None)
    assert not drv.launches and not rt.calls


def test_capture_dependencies_and_bodies_are_not_owned(fake_cupy_backend):
    be, rt, drv = fake_cupy_backend
    graph, deps = be.capture_dependencies("s")
    assert graph.handle == 0x1000 and graph.destroyed and deps == [0x50]  # never destroyed by ds4lab
    h = be.conditional_handle_create(graph)
    assert h.raw == 0xC0FFEE and h.arg == np.uint64(0xC0FFEE)
    node, bodies = be.graph_add_conditional_node(graph, deps, h, "if", 2)
    assert node == 0x70 and [b.handle for b in bodies] == [0x2000, 0x2001] and all(b.destroyed for b in bodies)
    be.begin_capture_to_graph("s2", bodies[0])
    assert be.end_capture_to_graph("s2") is bodies[0]
    be.begin_capture_to_graph("s2", bodies[1])
    with pytest.raises(CudaError, match="cudaErrorInvalidValue"):  # the fake returns 0x2000, not 0x2001
        be.end_capture_to_graph("s2")
    rt.status = 2
    with pytest.raises(CudaError, match="cudaErrorStreamCaptureInvalidated"):
        be.capture_dependencies("s")
    rt.status = 0
    with pytest.raises(CudaError, match="cudaErrorIllegalState"):
        be.capture_dependencies("s")
    assert be.graph_node_kinds(graph) == ["kernel", "memset", "conditional"]
    assert be.graph_edges(graph) == [("kernel", "memset", "programmatic"), ("memset", "conditional", "default")]
