"""The ``cupy`` backend's conditional nodes and programmatic launches (:class:`DeviceGraphApi`) through
``cuda-bindings`` (:mod:`ds4lab.backends.cuda_graph_calls`). Each kernel file has a second, ``pdl`` build
(``-DDS4_PDL=1``) launched with ``cuLaunchKernelEx``, loaded before any capture by
:meth:`CupyDeviceGraphsMixin.prepare_device_kernels`. Importing this module does not import CuPy or cuda-bindings."""

from __future__ import annotations

from typing import Any

from . import cuda_graph_calls as G
from .cupy_runtime import CupyGraph, _cudart
from ..executor.device_graphs import PREDECESSOR_RULES, CondHandle, DeviceGraphApi
from ..executor.kernel_pdl import require_device_half

#: The compile option of the ``pdl`` build (scripts/compile_kernels.py: VARIANTS["pdl"]).
PDL_OPTION = "-DDS4_PDL=1"


def _cudadrv():
    """``cuda.bindings.driver``; raises ImportError naming the package."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise ImportError("programmatic launches need the cuda-bindings package (pip install cuda-bindings)") from None
    return driver


class BodyGraph(CupyGraph):
    """A graph ds4lab does not own (a conditional node's body, or the graph a live capture fills): queried and captured
    into, never destroyed here (CUDA destroys it with its node or its capture)."""

    def __init__(self, cp, handle: int) -> None:
        super().__init__(cp, handle)
        self.destroyed = True  # nothing for destroy() or __del__ to do


class CupyDeviceGraphsMixin(DeviceGraphApi):
    """:class:`DeviceGraphApi` for :class:`~ds4lab.backends.cupy_backend.CupyBackend` (mixed in: it uses the backend's
    ``cp``, ``_sources``, ``_ptr_stream`` and ``function``)."""

    # ------------------------------------------------------------------ builds
    def _pdl_module(self, path):
        mods = self.__dict__.setdefault("_pdl_modules", {})
        m = mods.get(path)
        if m is None:
            m = self.cp.RawModule(code=path.read_text(), options=("-std=c++17", f"-I{path.parent}", PDL_OPTION),
                                  name_expressions=None)
            mods[path] = m
        return m

    def pdl_function_ptr(self, name: str) -> int:
        """The ``CUfunction`` of kernel ``name`` in its ``pdl`` build (compiled and loaded on first use). Raises
        KeyError naming the kernel when no ``.cu`` file defines it."""
        ptrs = self.__dict__.setdefault("_pdl_ptrs", {})
        p = ptrs.get(name)
        if p is None:
            try:
                path = self._sources[name]
            except KeyError:
                raise KeyError(f"no kernel named {name!r} in the kernel sources") from None
            from .cupy_runtime import _cuda_errors

            with _cuda_errors(f"cuModuleLoadData ({path.name}, {PDL_OPTION})"):
                p = int(self._pdl_module(path).get_function(name).kernel.ptr)
            ptrs[name] = p
        return p

    def prepare_device_kernels(self, names=None, programmatic: bool = False) -> None:
        """Compile and load, now, the kernels a capture will launch: ``names`` (default every kernel) in the plain
        build, and with ``programmatic`` their ``pdl`` build too (only kernels that carry the device-side half).
        """
        from ..executor.kernel_pdl import device_half

        half = device_half()
        for name in (names if names is not None else list(self._sources)):
            self.function(name)
            if programmatic and half.get(name):
                self.pdl_function_ptr(name)

    # ------------------------------------------------------------------ capture and conditional nodes
    def capture_dependencies(self, stream) -> tuple[Any, list]:
        from ..errors import CudaError

        st, graph, nodes, _ = G.capture_info(_cudart(), self._ptr_stream(stream))
        if st != "active":
            name = "cudaErrorStreamCaptureInvalidated" if st == "invalidated" else "cudaErrorIllegalState"
            raise CudaError(name, "cudaStreamGetCaptureInfo", f"capture status {st}: no graph to add to")
        return BodyGraph(self.cp, graph), nodes

    def conditional_handle_create(self, graph, default: int = 0, assign_default: bool = True) -> CondHandle:
        return CondHandle(G.conditional_handle_create(_cudart(), graph.handle, default, assign_default))

    def graph_add_conditional_node(self, graph, deps, handle, kind: str, size: int) -> tuple[Any, list]:
        node, bodies = G.add_conditional_node(_cudart(), graph.handle, [int(d) for d in deps], handle.raw, kind, size)
        return node, [BodyGraph(self.cp, b) for b in bodies]

    def stream_update_capture_dependencies(self, stream, nodes, replace: bool = True) -> None:
        G.update_capture_dependencies(_cudart(), self._ptr_stream(stream), [int(n) for n in nodes], replace)

    def begin_capture_to_graph(self, stream, graph, mode: str = "thread_local") -> None:
        G.begin_capture_to_graph(_cudart(), self._ptr_stream(stream), graph.handle, mode)
        self.__dict__.setdefault("_to_graph", {})[self._ptr_stream(stream)] = graph

    def end_capture_to_graph(self, stream):
        from ..errors import CudaError

        ptr = self._ptr_stream(stream)
        graph = self.__dict__.setdefault("_to_graph", {}).pop(ptr, None)
        raw = G.end_capture(_cudart(), ptr)
        if graph is None:
            return BodyGraph(self.cp, raw)
        if raw != graph.handle:
            raise CudaError("cudaErrorInvalidValue", "cudaStreamEndCapture",
                            f"returned graph {raw:#x}, the capture began into {graph.handle:#x}")
        return graph

    # ------------------------------------------------------------------ programmatic launch
    def launch_programmatic(self, stream, name, grid, block, args, shared, ref, nbytes=0, *,
                            predecessor: str = "kernel") -> bool:
        if predecessor not in PREDECESSOR_RULES:
            raise ValueError(f"predecessor={predecessor!r}: one of {', '.join(PREDECESSOR_RULES)}")
        require_device_half(name)
        rt = _cudart()
        ptr = self._ptr_stream(stream)
        programmatic = True
        if predecessor == "kernel":
            st, _g, nodes, _ = G.capture_info(rt, ptr)
            if st == "active":
                programmatic = len(nodes) == 1 and G.node_kind(rt, nodes[0]) == "kernel"
        G.launch_kernel_ex(_cudadrv(), self.pdl_function_ptr(name), grid, block, shared, ptr, args, programmatic)
        return programmatic

    # ------------------------------------------------------------------ queries
    def graph_node_kinds(self, graph) -> list[str]:
        rt = _cudart()
        return [G.node_kind(rt, n) for n in G.graph_nodes(rt, graph.handle)]

    def graph_edges(self, graph) -> list[tuple[str, str, str]]:
        rt = _cudart()
        kinds = {n: G.node_kind(rt, n) for n in G.graph_nodes(rt, graph.handle)}
        return [(kinds.get(a, "?"), kinds.get(b, "?"), t) for a, b, t in G.graph_edges(rt, graph.handle)]


__all__ = ["BodyGraph", "CupyDeviceGraphsMixin", "PDL_OPTION"]
