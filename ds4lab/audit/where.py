"""Where a finding comes from: the user's own code line when the trace has Python stacks, else the NVTX range path,
always with the API or kernel name. The place is the innermost frame of a row's ``stack`` that is not internal
(:data:`INTERNAL_FRAMES`: PyTorch, CuPy, the CUDA bindings, NVTX, Triton, ds4lab's machinery but
``audit/families.py``, the standard library's plumbing); edit it to move the boundary. ``transformers`` and every
other library are the code that made the call."""

from __future__ import annotations

import re

#: Frames that are never the place shown (module docstring): patterns searched in a frame's text.
INTERNAL_FRAMES = (
    r"(^|/)torch/", r"(^|/)cupy(x|_backends)?/", r"(^|/)cuda/(bindings|core|cudart|cuda)\b", r"(^|/)nvtx/",
    r"(^|/)triton/", r"(^|/)ds4lab/(audit/(?!families\.py)|(capture|backends|sim|report|cli|jobs|trace)/)", r"(^|/)contextlib\.py",
    r"(^|/)threading\.py", r"(^|/)runpy\.py", r"(^|/)functools\.py", r"<frozen ", r"^<built-in", r"built-in method",
    r"^\s*$",
)
_INTERNAL = re.compile("|".join(INTERNAL_FRAMES))


def frames(stack: str) -> list[str]:
    """The frames of a ``stack`` string, outermost first (empty ones dropped)."""
    return [f.strip() for f in stack.split(";") if f.strip()] if stack else []


def user_frame(stack: str) -> str:
    """The innermost frame of ``stack`` not in :data:`INTERNAL_FRAMES`, or ""."""
    for f in reversed(frames(stack)):
        if not _INTERNAL.search(f):
            return f
    return ""


def where(stack: str, nvtx_path: str) -> str:
    """The place of a call: its user frame (``file:line function``), else ``nvtx: a/b/c``, else ""."""
    f = user_frame(stack)
    if f:
        return f
    return f"nvtx: {nvtx_path}" if nvtx_path else ""
