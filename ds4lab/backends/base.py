"""What a backend provides to the launch layer and the decode model.

A backend owns memory (arrays), streams and events, and turns each launch the
:class:`ds4lab.launch.Launcher` hands it into device work (``cupy``), a NumPy computation
(``numpy``) or, later, a modeled one. It never decides *which* stream: the launcher resolves
that through the accessor and passes the answer in (``LEGACY_STREAM`` or an override).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (no CuPy, no usable GPU); the message says which."""


class Backend:
    """Interface every backend implements. Arrays are the backend's own (``numpy``/``cupy``)."""

    #: Name used on the command line and in results.
    name: str = "base"
    #: Whether launches run on a GPU.
    is_gpu: bool = False
    #: Whether timings from this backend are measurements (False: none are claimed).
    measures_time: bool = False
    #: The array module (``numpy`` or ``cupy``).
    xp: Any = np

    # --- memory
    def empty(self, shape, dtype) -> Any:
        raise NotImplementedError

    def zeros(self, shape, dtype) -> Any:
        raise NotImplementedError

    def from_host(self, a: np.ndarray) -> Any:
        raise NotImplementedError

    def to_host(self, a: Any) -> np.ndarray:
        raise NotImplementedError

    # --- weights (see ds4lab.weights for the formats)
    def make_weight(self, spec) -> Any:
        """Materialize one :class:`ds4lab.weights.WeightSpec` (QTensor, bank or fp32 array)."""
        raise NotImplementedError

    def fill_f32(self, out: Any, name: str, scale: float, offset: float, seed: int) -> None:
        """Fill an existing fp32 buffer from the hash generator (KV cache prefill)."""
        raise NotImplementedError

    # --- launches (called by the Launcher only)
    def launch(self, stream: Any, name: str, grid: tuple, block: tuple, args: tuple,
               shared: int, ref: Callable[[], None], nbytes: int = 0) -> None:
        raise NotImplementedError

    def memset_async(self, stream: Any, buf: Any, value: int) -> None:
        raise NotImplementedError

    def memset_sync(self, buf: Any, value: int) -> None:
        raise NotImplementedError

    def copy_h2d(self, stream: Any, dst: Any, src: np.ndarray) -> None:
        raise NotImplementedError

    def event_record(self, stream: Any, event: Any) -> None:
        raise NotImplementedError

    # --- streams and events
    def new_stream(self, non_blocking: bool = True) -> Any:
        raise NotImplementedError

    def new_event(self) -> Any:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for all device work (``cudaDeviceSynchronize``; no-op on the CPU)."""

    # --- the runtime API used by capture, graphs and the conformance suite.
    # Errors: every method raises ds4lab.errors.CudaError (CUDA's error name) or CupyRefusal.
    # Streams are backend objects or LEGACY_STREAM. Capture modes: "global", "thread_local",
    # "relaxed" (CUDA Runtime API, cudaStreamBeginCapture / cudaStreamCaptureMode).
    def event_synchronize(self, event: Any) -> None:
        """``cudaEventSynchronize``."""
        raise NotImplementedError

    def event_query(self, event: Any) -> bool:
        """``cudaEventQuery``: True when complete (False for ``cudaErrorNotReady``)."""
        raise NotImplementedError

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        """``cudaEventElapsedTime`` in milliseconds."""
        raise NotImplementedError

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        """``cudaStreamWaitEvent``."""
        raise NotImplementedError

    def stream_synchronize(self, stream: Any) -> None:
        """``cudaStreamSynchronize``."""
        raise NotImplementedError

    def stream_query(self, stream: Any) -> bool:
        """``cudaStreamQuery``: True when all work is done."""
        raise NotImplementedError

    def malloc(self, shape, dtype) -> Any:
        """``cudaMalloc`` of a new array, outside any pool (a real allocation every call)."""
        raise NotImplementedError

    def free(self, buf: Any) -> None:
        """``cudaFree`` of an array from :meth:`malloc`."""
        raise NotImplementedError

    def malloc_async(self, stream: Any, shape, dtype) -> Any:
        """``cudaMallocAsync`` on ``stream`` (a memory node when captured)."""
        raise NotImplementedError

    def free_async(self, stream: Any, buf: Any) -> None:
        """``cudaFreeAsync`` on ``stream``."""
        raise NotImplementedError

    def read(self, buf: Any) -> np.ndarray:
        """A device-to-host read of ``buf`` as CuPy does it (``cupy.asnumpy``): synchronous,
        refused by CuPy while the current stream captures."""
        raise NotImplementedError

    def matmul(self, stream: Any, a: Any, b: Any) -> Any:
        """``a @ b`` through CuPy's array API (cuBLAS) on ``stream``; CuPy refuses it during capture."""
        raise NotImplementedError

    def begin_capture(self, stream: Any, mode: str = "thread_local") -> None:
        """``cudaStreamBeginCapture(stream, mode)``."""
        raise NotImplementedError

    def end_capture(self, stream: Any) -> Any:
        """``cudaStreamEndCapture``: returns the captured graph."""
        raise NotImplementedError

    def capture_status(self, stream: Any) -> str:
        """``cudaStreamGetCaptureInfo``: ``"none"``, ``"active"`` or ``"invalidated"``."""
        raise NotImplementedError

    def graph_nodes(self, graph: Any) -> list[dict]:
        """The nodes of a captured graph: dicts with ``kind`` (kernel, memset, memcpy,
        event_record, wait_event, mem_alloc, mem_free, empty) and ``name`` (kernel name or "")."""
        raise NotImplementedError

    def graph_instantiate(self, graph: Any) -> Any:
        """``cudaGraphInstantiate``: an executable graph."""
        raise NotImplementedError

    def graph_exec_update(self, graph_exec: Any, graph: Any) -> None:
        """``cudaGraphExecUpdate``: give an executable graph the arguments of ``graph``, which
        must have the same topology (CUDA Programming Guide, "Updating instantiated graphs")."""
        raise NotImplementedError

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        """``cudaGraphLaunch`` of an executable graph on ``stream`` (a replay)."""
        raise NotImplementedError

    def info(self) -> dict:
        """Provenance: device name, driver, runtime and library versions."""
        return {"backend": self.name}

    def memory_used(self) -> int | None:
        """Device bytes held by ds4lab's allocations, or None where not meaningful."""
        return None
