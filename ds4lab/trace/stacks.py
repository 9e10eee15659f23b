"""Python stacks as the trace model holds them: ``file:line function`` frames, outermost first, joined by ``;`` (the
``stack`` column of the event table), from a live frame (:func:`python_stack`, what the CUPTI session records at a
watched call) or from a profiler's frames (:func:`short_path` of each file)."""

from __future__ import annotations

import os

_SHORT: dict[str, str] = {}
#: Frames of the runner around a recorded script (``runpy``, the recording, ``click``): :func:`trim_runner`.
RUNNER_FRAMES = ("<frozen runpy>", "runpy.py", "ds4lab/trace/recording.py", "click/")


def python_stack(frame, *, limit: int = 64, skip_files: tuple = ()) -> str:
    """The Python stack from ``frame`` outwards, outermost first, ``file:line function`` joined by ``;``, at most
    ``limit`` innermost frames (``...`` when cut), ``skip_files`` left out."""
    out = []
    f = frame
    while f is not None:
        co = f.f_code
        if not (skip_files and co.co_filename.endswith(skip_files)):
            out.append(f"{short_path(co.co_filename)}:{f.f_lineno} {co.co_name}")
        f = f.f_back
    cut = len(out) > limit
    out = out[:limit][::-1]
    return ";".join((["..."] if cut else []) + out)


def short_path(path: str) -> str:
    """A source path as shown: after ``site-packages/``, else relative to here, else as given."""
    s = _SHORT.get(path)
    if s is not None:
        return s
    s = path
    for marker in ("site-packages/", "dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            s = path[i + len(marker):]
            break
    else:
        try:
            cwd = os.getcwd()
            if path.startswith(cwd + os.sep):
                s = path[len(cwd) + 1:]
        except OSError:
            pass
    _SHORT[path] = s
    return s


def trim_runner(stack: str) -> str:
    """A recorded stack without the frames outside the user's script: everything up to the last frame of the runner
    (:data:`RUNNER_FRAMES`), so the script is the outermost frame."""
    frames = stack.split(";")
    last = -1
    for i, f in enumerate(frames):
        if f.startswith(RUNNER_FRAMES) or f.split(":")[0].endswith("runpy.py"):
            last = i
    return ";".join(frames[last + 1:])
