"""Where a finding comes from: the user's own code line when the trace has Python stacks, else the NVTX range path,
always with the API or kernel name.

A row's ``stack`` is outermost first, ``;``-separated ``file:line function`` frames. The place shown is the **innermost
frame that is not internal**: not in PyTorch, CuPy, the CUDA Python bindings, NVTX, Triton, ds4lab's own machinery (its
audit, trace recording and operator log, capture, launch layer, backends and sim; not ``audit/families.py``, where the
decode steps of recordings made before the steps folder lived and which stand for a user's code, as
``ds4lab/data/steps/`` does now) or the Python standard library's plumbing (``contextlib``, ``threading``, ``runpy``,
frozen modules, built-ins). The filter is :data:`INTERNAL_FRAMES`, regular expressions matched against the frame's
file; edit it to move the boundary. ``transformers``, ds4lab's token model and ops, and every other library are *not*
internal: in an engine's decode step they are the code that made the call."""

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
    """The innermost frame of ``stack`` that is not internal (:data:`INTERNAL_FRAMES`), or "" when every frame is
    internal or there is no stack."""
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
