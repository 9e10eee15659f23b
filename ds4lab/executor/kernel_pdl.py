"""Which kernels carry the device-side half of programmatic dependent launch (``DS4_PDL_ENTRY()`` first in the body,
``kernels/common.cuh``), read from ``kernels/*.cu``, so a backend refuses a programmatic launch of a kernel without
it (:func:`require_device_half`). Source: CUDA Programming Guide, "Programmatic Dependent Launch and
Synchronization". Imports no CUDA library."""

from __future__ import annotations

import functools
import re
from pathlib import Path

#: The device-side half's macro (``kernels/common.cuh``).
ENTRY_MACRO = "DS4_PDL_ENTRY"

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL = re.compile(r'__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
                     r'(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(')


def kernel_bodies(source: str) -> dict[str, str]:
    """``{kernel name: body}`` of every ``__global__`` function in CUDA ``source`` (comments removed, no braces)."""
    text = _COMMENTS.sub(" ", source)
    out: dict[str, str] = {}
    for m in _GLOBAL.finditer(text):
        i, depth = m.end(), 1
        while depth and i < len(text):  # the parameter list
            depth += (text[i] == "(") - (text[i] == ")")
            i += 1
        j = text.find("{", i)
        if j < 0 or text[i:j].strip().endswith(";"):
            continue  # a declaration, not a definition
        k, depth = j + 1, 1
        while depth and k < len(text):
            depth += (text[k] == "{") - (text[k] == "}")
            k += 1
        out[m.group(1)] = text[j + 1:k - 1]
    return out


def waits_first(body: str) -> bool:
    """Whether a kernel body's first statement is ``DS4_PDL_ENTRY();``."""
    return re.match(rf"\s*{ENTRY_MACRO}\s*\(\s*\)\s*;", body) is not None


def default_kernels_dir() -> Path:
    """The folder the ``cupy`` backend loads kernels from, found without importing it."""
    repo = Path(__file__).resolve().parents[2] / "kernels"
    if (repo / "common.cuh").is_file():
        return repo
    from importlib import resources

    return Path(str(resources.files("ds4lab.kernels")))


@functools.lru_cache(maxsize=None)
def device_half(kernels_dir: str | None = None) -> dict[str, bool]:
    """``{kernel: whether its first statement is DS4_PDL_ENTRY()}`` over ``kernels_dir/*.cu``."""
    if kernels_dir is None:
        kernels_dir = str(default_kernels_dir())
    out: dict[str, bool] = {}
    for f in sorted(Path(kernels_dir).glob("*.cu")):
        for name, body in kernel_bodies(f.read_text()).items():
            out[name] = waits_first(body)
    return out


class MissingDeviceHalf(ValueError):
    """A programmatic launch of a kernel without the device-side half (ds4lab's refusal, before CUDA is asked: CUDA
    would launch it, and it could read its predecessor's output before it is written)."""


def require_device_half(name: str) -> None:
    """Raise :class:`MissingDeviceHalf` unless kernel ``name`` begins with ``DS4_PDL_ENTRY()``."""
    ok = device_half().get(name)
    if ok is None:
        raise MissingDeviceHalf(f"no kernel named {name!r} in the kernel sources: cannot launch it programmatically")
    if not ok:
        raise MissingDeviceHalf(f"kernel {name!r} does not begin with {ENTRY_MACRO}() (kernels/common.cuh): launched "
                                "with programmatic stream serialization it could read its predecessor's output "
                                "before that kernel finished")


__all__ = ["ENTRY_MACRO", "MissingDeviceHalf", "default_kernels_dir", "device_half", "kernel_bodies",
           "require_device_half", "waits_first"]
