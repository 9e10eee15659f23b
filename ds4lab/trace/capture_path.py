"""The capture-path pass: the decode loop recorded once more while PyTorch answers "is the current stream capturing?"
with yes (:func:`as_if_capturing`), so the recording holds the work a graph of the step would hold; the plans of
a captured token are modeled on it (:mod:`ds4lab.audit.capture_path`). C/C++ code asking CUDA gets CUDA's answer;
a pass in which PyTorch was never asked (:data:`NOT_ASKED`) is not kept. Saved as ``capture-path.csv.gz`` or
``<stem>.capture-path.csv.gz`` (:func:`capture_path_beside`). Source: ``torch.cuda.is_current_stream_capturing``;
transformers ``is_tracing`` (looked up at each call, so replacing it on ``torch.cuda`` reaches it)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from .records import api_base_name

#: The file of the capture-path pass beside ``recording.csv.gz``.
CAPTURE_PATH_NAME = "capture-path.csv.gz"
#: Its suffix beside any other saved recording ``<stem>.csv.gz``.
CAPTURE_PATH_SUFFIX = ".capture-path.csv.gz"
#: Why a pass in which PyTorch was never asked is not kept (it ran the recorded path again).
NOT_ASKED = ("the step never asked torch.cuda.is_current_stream_capturing(): its questions come from C/C++ code "
             "(PyTorch's own copy and allocator checks), which gets CUDA's answer, so the pass ran the recorded "
             "path again")
#: The CUDA calls a step asks "does this stream capture?" with (runtime and driver API names).
CAPTURE_STATUS_CALLS = frozenset({"cudaStreamIsCapturing", "cudaStreamGetCaptureInfo", "cuStreamIsCapturing",
                                  "cuStreamGetCaptureInfo"})


@dataclass
class Asked:
    """How many times the step asked whether the stream captures inside :func:`as_if_capturing`."""

    count: int = 0


@contextlib.contextmanager
def as_if_capturing(torch=None):
    """Inside the block ``torch.cuda.is_current_stream_capturing()`` returns True; yields an :class:`Asked`
    counting the questions; put back at exit. ``torch``: None imports it. Raises ImportError without torch."""
    if torch is None:
        import torch  # noqa: PLC0415 - torch is no dependency of ds4lab
    cuda = torch.cuda
    graphs = getattr(cuda, "graphs", None)
    holders = [h for h in (cuda, graphs) if h is not None and hasattr(h, "is_current_stream_capturing")]
    if not holders:
        raise ImportError("this torch has no torch.cuda.is_current_stream_capturing: no capture path to take")
    asked = Asked()

    def capturing() -> bool:
        asked.count += 1
        return True

    saved = [(h, h.is_current_stream_capturing) for h in holders]
    for h, _ in saved:
        h.is_current_stream_capturing = capturing
    try:
        yield asked
    finally:
        for h, fn in saved:
            h.is_current_stream_capturing = fn


def asks_capture_status(frame) -> int:
    """How many calls in ``frame`` ask CUDA whether a stream captures (:data:`CAPTURE_STATUS_CALLS`)."""
    if frame is None or not len(frame) or "name" not in frame:
        return 0
    api = frame[frame["kind"] == "api"]["name"].astype(str)
    return int(sum(api_base_name(n) in CAPTURE_STATUS_CALLS for n in api))


#: Endings a trace file's stem is taken without (the longest that fits first).
TRACE_ENDINGS = (".csv.gz", ".json.gz", ".sqlite", ".csv", ".json", ".gz")


def trace_stem(recording: Path) -> str:
    """A trace file's name without its format's ending (``my.run.csv.gz`` → ``my.run``)."""
    name = Path(recording).name
    for end in TRACE_ENDINGS:
        if name.endswith(end) and len(name) > len(end):
            return name[:-len(end)]
    return Path(name).stem


def capture_path_name(recording: Path) -> Path:
    """Where the capture-path pass of ``recording`` goes (module docstring): ``capture-path.csv.gz`` beside
    ``recording.csv.gz``, else ``<stem>.capture-path.csv.gz`` (:func:`trace_stem`)."""
    recording = Path(recording)
    stem = trace_stem(recording)
    return recording.with_name(CAPTURE_PATH_NAME if stem == "recording" else stem + CAPTURE_PATH_SUFFIX)


def is_capture_path(path) -> bool:
    """Whether ``path`` names a capture-path pass (:data:`CAPTURE_PATH_NAME`, ``*``:data:`CAPTURE_PATH_SUFFIX`)."""
    name = Path(str(path)).name
    return name == CAPTURE_PATH_NAME or name.endswith(CAPTURE_PATH_SUFFIX)


def capture_path_beside(recording) -> Path | None:
    """The capture-path pass saved beside ``recording``, or None (also where ``recording`` is one)."""
    if recording is None:
        return None
    recording = Path(recording)
    if is_capture_path(recording):
        return None
    p = capture_path_name(recording)
    return p if p.is_file() else None


__all__ = ["Asked", "CAPTURE_PATH_NAME", "NOT_ASKED", "TRACE_ENDINGS", "is_capture_path", "trace_stem", "CAPTURE_PATH_SUFFIX", "CAPTURE_STATUS_CALLS", "as_if_capturing",
           "asks_capture_status", "capture_path_beside", "capture_path_name"]
