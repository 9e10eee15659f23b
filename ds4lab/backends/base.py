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
               shared: int, ref: Callable[[], None]) -> None:
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

    def info(self) -> dict:
        """Provenance: device name, driver, runtime and library versions."""
        return {"backend": self.name}

    def memory_used(self) -> int | None:
        """Device bytes held by ds4lab's allocations, or None where not meaningful."""
        return None
