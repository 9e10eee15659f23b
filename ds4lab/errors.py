"""Errors of the runtime API, named as CUDA and CuPy name them, raised alike by the ``cupy`` backend (translating)
and the ``sim`` (by CUDA's rules): ``err.name`` is the CUDA enum name, a ``cupy:`` label or a library status
(``cublas:CUBLAS_STATUS_ALLOC_FAILED``); and the jobs' error hierarchy (:class:`BadInput`, :class:`CheckFailed`,
:class:`Terminated`)."""

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
    "cudaErrorNotSupported",
)

#: CuPy-level refusals (not CUDA's): CuPy checks these itself before calling CUDA.
CUPY_ERRORS = ("cupy:D2HDisallowed", "cupy:CublasInCapture")

#: CUDA library statuses the capture rules speak of (cuBLAS library reference, cublasStatus_t).
LIBRARY_ERRORS = ("cublas:CUBLAS_STATUS_ALLOC_FAILED", "cublas:CUBLAS_STATUS_NOT_INITIALIZED")


class RuntimeApiError(RuntimeError):
    """A runtime-API call failed; ``name``: the CUDA error name, a ``cupy:`` label or a library status."""

    def __init__(self, name: str, call: str, detail: str = "") -> None:
        self.name = name
        self.call = call
        self.detail = detail
        super().__init__(f"{call}: {name}" + (f" ({detail})" if detail else ""))

    @property
    def source(self) -> str:
        """``"cuda"``, ``"cupy"`` or the library (``"cublas"``): who refused."""
        head = self.name.split(":", 1)[0] if ":" in self.name else ""
        return head if head in ("cupy", "cublas", "nccl") else "cuda"


class CudaError(RuntimeApiError):
    """An error CUDA returned (or, on ``sim``, would return) for a runtime-API call."""


class CupyRefusal(RuntimeApiError):
    """CuPy refused the call itself (device-to-host read or cuBLAS during capture)."""


class LibraryError(RuntimeApiError):
    """A CUDA library call failed with its own status (``cublas:CUBLAS_STATUS_*``)."""


# ----------------------------------------------------------------------------- job outcomes
class BadInput(ValueError):
    """Bad input found before any work (a job exits 2): the message names the value and the fix."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while a command ran: handled like Ctrl-C (a :class:`KeyboardInterrupt`), status
    ``interrupted (SIGTERM)``, exit 128 + ``signum`` (143, 129); ``signame`` its name."""

    def __init__(self, signum: int, msg: str = "") -> None:
        import signal

        self.signum = int(signum)
        self.signame = signal.Signals(self.signum).name
        super().__init__(msg or f"stopped by {self.signame}")


def interrupt_status(exc: BaseException) -> str:
    """``interrupted`` for Ctrl-C, ``interrupted (SIGTERM)`` / ``interrupted (SIGHUP)`` for a :class:`Terminated` (or
    an exception with its ``signame``)."""
    name = getattr(exc, "signame", None)
    return f"interrupted ({name})" if name else "interrupted"


class CheckFailed(RuntimeError):
    """A job ran and wrote its results, but a check it exists to make failed (exit 1)."""


class PartFailed(RuntimeError):
    """One of a job's parts failed (exit 1; a notebook stopped at a cell); the run's folder is kept as a failed run."""


#: ``cudaGraphExecUpdateResult`` values by number (CUDA Runtime API, "Data types used by CUDA
#: Runtime" → enum cudaGraphExecUpdateResult).
GRAPH_EXEC_UPDATE_RESULTS = {
    0: "cudaGraphExecUpdateSuccess",
    1: "cudaGraphExecUpdateError",
    2: "cudaGraphExecUpdateErrorTopologyChanged",
    3: "cudaGraphExecUpdateErrorNodeTypeChanged",
    4: "cudaGraphExecUpdateErrorFunctionChanged",
    5: "cudaGraphExecUpdateErrorParametersChanged",
    6: "cudaGraphExecUpdateErrorNotSupported",
    7: "cudaGraphExecUpdateErrorUnsupportedFunctionChange",
    8: "cudaGraphExecUpdateErrorAttributesChanged",
}


class GraphExecUpdateError(CudaError):
    """``cudaGraphExecUpdate`` refused (``cudaErrorGraphExecUpdateFailure``), with CUDA's reason.

    Attributes:
        result: the ``cudaGraphExecUpdateResult`` name (``cudaGraphExecUpdateErrorTopologyChanged``, ...).
        node_type: the ``errorNode``'s kind as ds4lab names node kinds (``kernel``, ``memset``, ...), or None when
            CUDA names none."""

    def __init__(self, call: str, result: str, node_type: str | None, detail: str = "",
                 name: str = "cudaErrorGraphExecUpdateFailure") -> None:
        self.result = result
        self.node_type = node_type
        where = f", node type {node_type}" if node_type else ""
        super().__init__(name, call, f"{result}{where}" + (f"; {detail}" if detail else ""))


class CalibrationError(BadInput):
    """A calibration file off the schema: ``path`` (or ``"<dict>"``), ``problems`` ``[(key_path, message), ...]``."""

    def __init__(self, path: str, problems: list[tuple[str, str]]) -> None:
        self.path = path
        self.problems = problems
        lines = "; ".join(f"{k or '(top level)'}: {m}" for k, m in problems)
        super().__init__(f"calibration {path}: {len(problems)} problem(s): {lines}")


# ----------------------------------------------------------------------------- collectives (tensor parallel)
#: What a collective between devices can end in, besides completing (``ds4lab.sim.devices``, the
#: ``nccl:`` rules of ``ds4lab/sim/rules.py``): the peer never executed its matching collective within
#: the sim's timeout; the ranks' collectives at the same position differ (operation, count, type); one
#: rank launched it from a graph and the other eagerly (NCCL requires capture to be uniform); NCCL's own
#: status for a call it refused (``ncclResult_t`` names).
COLLECTIVE_ERRORS = ("nccl:timeout", "nccl:mismatch", "nccl:nonuniform-capture", "nccl:ncclUnhandledCudaError",
                     "nccl:ncclInvalidUsage", "nccl:ncclInvalidArgument", "nccl:ncclSystemError",
                     "nccl:ncclInternalError", "nccl:ncclRemoteError", "nccl:ncclInProgress")


class CollectiveError(RuntimeApiError):
    """A collective between devices failed or would never complete (``name``: one of :data:`COLLECTIVE_ERRORS`); the
    sim raises it at once or after a timeout, a GPU's watchdog after aborting the communicator."""
