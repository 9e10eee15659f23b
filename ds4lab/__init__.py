"""ds4lab: a profiling workbench for CUDA graph capture in LLM decode paths.

It rebuilds the shape of ds4's CUDA decode token (DeepSeek V4 Flash dimensions) in CuPy kernels, with every launch
routed through one thread-local stream accessor (:mod:`ds4lab.capture.stream`) and annotated with NVTX ranges.
Importing ds4lab needs neither CuPy nor a GPU. For notebooks, :class:`ds4lab.Lab` (:mod:`ds4lab.lab`) is the whole
workbench in one object; ``docs/architecture.md`` is the map of the package."""

from .token.config import PRESETS, ConfigError, ModelConfig, get_preset
from .capture.stream import capture_set_stream, current_stream, stream_override

from .version import __version__

__all__ = ["Lab", "PRESETS", "ConfigError", "ModelConfig", "get_preset", "capture_set_stream",
           "current_stream", "stream_override", "__version__"]


def __getattr__(name: str):
    """``ds4lab.Lab``, imported on first use (it imports every job: ``import ds4lab`` stays light)."""
    if name == "Lab":
        from .lab import Lab

        return Lab
    raise AttributeError(f"module 'ds4lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Lab"})
