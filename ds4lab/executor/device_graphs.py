"""The backend contract for what stream capture alone cannot express (stages ``3cc``, ``3p``, ``3cp``, ``3ccp``):
conditional nodes filled by capturing into their bodies, and programmatic launches kept as programmatic edges. ``cupy``
implements it through ``cuda-bindings`` (:mod:`ds4lab.backends.cupy_device_graphs`), the sim by
:mod:`ds4lab.sim.rules_device`; ``isinstance(be, DeviceGraphApi)`` is the test.

Next: ``docs/capture-stages.md``. Sources: CUDA Programming Guide, "Conditional Graph Nodes", "Programmatic Dependent
Launch and Synchronization"."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Conditional node types (``cudaGraphConditionalNodeType``: If 0, While 1, Switch 2; IF with two
#: bodies and SWITCH need CUDA 12.8, IF and WHILE 12.4).
COND_KINDS = {"if": 0, "while": 1, "switch": 2}

#: What ``predecessor=`` may say in :meth:`DeviceGraphApi.launch_programmatic`.
PREDECESSOR_RULES = ("kernel", "any")


def check_kind(kind: str) -> None:
    """Raise ValueError for a conditional node kind that is not one of :data:`COND_KINDS` (the body count is CUDA's to
    refuse: the backends pass it on, :func:`size_allowed`)."""
    if kind not in COND_KINDS:
        raise ValueError(f"conditional node kind {kind!r}: choose one of {', '.join(COND_KINDS)}")


def size_allowed(kind: str, size: int) -> bool:
    """Whether CUDA allows ``size`` bodies for a conditional node of ``kind`` (RT cudaConditionalNodeParams: 1 for
    WHILE, 1 or 2 for IF, any value greater than zero for SWITCH)."""
    return {"while": size == 1, "if": size in (1, 2), "switch": size >= 1}[kind]


@dataclass(frozen=True)
class CondHandle:
    """A conditional handle (``cudaGraphConditionalHandle``, 64 bits) on a GPU: ``raw`` is its value; ``arg`` the
    kernel argument a condition-setting kernel takes (by value)."""

    raw: int

    @property
    def arg(self) -> np.uint64:
        return np.uint64(self.raw)


class DeviceGraphApi(abc.ABC):
    """Conditional nodes and programmatic dependent launch. Graphs are the backend's (a body graph belongs to its
    node, never destroyed by ds4lab); every method raises :class:`ds4lab.errors.CudaError` with CUDA's error name."""

    @abc.abstractmethod
    def capture_dependencies(self, stream: Any) -> tuple[Any, list]:
        """``cudaStreamGetCaptureInfo``: the graph captured and the next work's dependencies (CudaError: none)."""

    @abc.abstractmethod
    def conditional_handle_create(self, graph: Any, default: int = 0, assign_default: bool = True) -> Any:
        """``cudaGraphConditionalHandleCreate(graph, default, flags)``; with ``assign_default`` every launch starts
        at ``default``. The handle's ``arg`` is what a condition-setting kernel takes."""

    @abc.abstractmethod
    def graph_add_conditional_node(self, graph: Any, deps: list, handle: Any, kind: str, size: int) -> tuple[Any, list]:
        """``cudaGraphAddNode`` of a conditional node (``"if"``, ``"while"``, ``"switch"``) with ``size`` empty
        bodies after ``deps``: returns ``(node, body graphs)`` (fill them with :meth:`begin_capture_to_graph`).
        Raises CudaError (cudaErrorInvalidValue for a size the kind does not allow)."""

    @abc.abstractmethod
    def stream_update_capture_dependencies(self, stream: Any, nodes: list, replace: bool = True) -> None:
        """``cudaStreamUpdateCaptureDependencies``: the next work depends on ``nodes`` (set, or added with
        ``replace=False``). Raises CudaError (cudaErrorIllegalState: not capturing)."""

    @abc.abstractmethod
    def begin_capture_to_graph(self, stream: Any, graph: Any, mode: str = "thread_local") -> None:
        """``cudaStreamBeginCaptureToGraph``: what ``stream`` issues from now on goes into ``graph`` (a node's body)."""

    @abc.abstractmethod
    def end_capture_to_graph(self, stream: Any) -> Any:
        """``cudaStreamEndCapture`` of :meth:`begin_capture_to_graph`: the graph captured into (no new owner)."""

    @abc.abstractmethod
    def launch_programmatic(self, stream: Any, name: str, grid: tuple, block: tuple, args: tuple, shared: int,
                            ref, nbytes: int = 0, *, predecessor: str = "kernel") -> bool:
        """Launch kernel ``name`` with programmatic stream serialization (``cuLaunchKernelEx``); a capture keeps it as a
        programmatic edge. Raises :class:`~ds4lab.executor.kernel_pdl.MissingDeviceHalf` (a ValueError) for a kernel
        without the device-side half, before CUDA is asked.

        ``predecessor="kernel"``: the attribute only when the next work depends on one kernel node (eagerly: always);
        ``"any"``: always. Returns whether the attribute was set."""

    @abc.abstractmethod
    def prepare_device_kernels(self, names=None, programmatic: bool = False) -> None:
        """Compile and load now the kernels a capture will launch (``names``, default all; ``programmatic``: their
        device-half build too), so no module loads while capturing; nothing on the sim."""

    @abc.abstractmethod
    def graph_node_kinds(self, graph: Any) -> list[str]:
        """The node kinds of ``graph`` (``cudaGraphNodeGetType``: kernel, memset, ...), in order; no bodies."""

    @abc.abstractmethod
    def graph_edges(self, graph: Any) -> list[tuple[str, str, str]]:
        """``cudaGraphGetEdges`` of ``graph``: ``(from kind, to kind, type)`` per edge, type ``"default"`` or
        ``"programmatic"`` (``cudaGraphEdgeData.type``, cudaGraphDependencyTypeProgrammatic)."""


__all__ = ["COND_KINDS", "CondHandle", "DeviceGraphApi", "PREDECESSOR_RULES", "check_kind", "size_allowed"]
