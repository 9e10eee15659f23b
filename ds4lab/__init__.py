"""ds4lab: a profiling workbench for CUDA graph capture in LLM decode paths.

It rebuilds the shape of ds4's CUDA decode token (DeepSeek V4 Flash dimensions) in CuPy
kernels, with every launch routed through one thread-local stream accessor
(:mod:`ds4lab.capture.stream`) and annotated with NVTX ranges. Importing ds4lab needs neither CuPy nor
a GPU.
"""

from .token.config import PRESETS, ConfigError, ModelConfig, get_preset
from .capture.stream import capture_set_stream, current_stream, stream_override

from .version import __version__

__all__ = ["PRESETS", "ConfigError", "ModelConfig", "get_preset", "capture_set_stream",
           "current_stream", "stream_override", "__version__"]
