"""Errors of the runtime API, named as CUDA and CuPy name them.

Both the ``cupy`` backend (translating real CUDA and CuPy errors) and the ``sim`` backend
(raising them by CUDA's rules) raise these, so a scenario or a stage reads the same error name
on either: ``err.name`` is the CUDA error enum name (``cudaErrorStreamCaptureUnsupported``) or a
CuPy label (``cupy:D2HDisallowed``).
"""

from __future__ import annotations

#: CUDA error names the runtime API and the conformance suite speak of (CUDA Runtime API,
#: "Data types used by CUDA Runtime" → cudaError; "Graph Management" → stream capture).
CAPTURE_ERRORS = (
    "cudaErrorStreamCaptureUnsupported",
    "cudaErrorCapturedEvent",
    "cudaErrorStreamCaptureInvalidated",
    "cudaErrorStreamCaptureImplicit",
    "cudaErrorStreamCaptureUnjoined",
    "cudaErrorStreamCaptureIsolation",
    "cudaErrorStreamCaptureWrongThread",
    "cudaErrorStreamCaptureUnmatched",
    "cudaErrorStreamCaptureMerge",
    "cudaErrorGraphExecUpdateFailure",
    "cudaErrorIllegalState",
    "cudaErrorNotReady",
    "cudaErrorInvalidValue",
    "cudaErrorInvalidResourceHandle",
)

#: CuPy-level refusals (not CUDA's): CuPy checks these itself before calling CUDA.
CUPY_ERRORS = ("cupy:D2HDisallowed", "cupy:CublasInCapture")


class RuntimeApiError(RuntimeError):
    """A runtime-API call failed. ``name`` is the CUDA error name or a ``cupy:`` label."""

    def __init__(self, name: str, call: str, detail: str = "") -> None:
        self.name = name
        self.call = call
        self.detail = detail
        super().__init__(f"{call}: {name}" + (f" ({detail})" if detail else ""))

    @property
    def source(self) -> str:
        """``"cuda"`` or ``"cupy"``: who refused."""
        return "cupy" if self.name.startswith("cupy:") else "cuda"


class CudaError(RuntimeApiError):
    """An error CUDA returned (or, on ``sim``, would return) for a runtime-API call."""


class CupyRefusal(RuntimeApiError):
    """CuPy refused the call itself (device-to-host read or cuBLAS during capture)."""


# ----------------------------------------------------------------------------- job outcomes
class BadInput(ValueError):
    """Bad input found before any work (a job exits 2): the message names the value and the fix."""


class CheckFailed(RuntimeError):
    """A job ran and wrote its results, but a check it exists to make failed (exit 1): a stage
    not bit-identical to stage 0, a failed reference check, a GPU/sim disagreement."""
