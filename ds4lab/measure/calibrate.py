"""Forwarding module, to be removed: the sim's fits are :mod:`ds4lab.calibration` (on a GPU:
:mod:`ds4lab.calibration.gpu`; kernels: :mod:`~ds4lab.calibration.kernels`; from folders: its ``from_*``)."""

from ..calibration.fit import write_calibration  # noqa: F401
from ..calibration.from_ladder import HOST_FIT_STAGES, fit_host_from_ladder  # noqa: F401
from ..calibration.from_moe import TILED_KERNELS, fit_tiled_moe, tiled_kernels  # noqa: F401
from ..calibration.gpu import (LONG_CONTEXT_POSITIONS, calibrate, calibrate_long_context,  # noqa: F401
                               long_context_kernels)
from ..calibration.kernels import add_kernel_fits, refit_kernels  # noqa: F401
