"""Forwarding module, to be removed: ``calibrate --from-context``'s fit is :mod:`ds4lab.calibration.from_context`."""

from ..calibration.from_context import (FITTED, calibration_value, fit_capture_stages, measurable,  # noqa: F401
                                        read_context_gains, solve)
