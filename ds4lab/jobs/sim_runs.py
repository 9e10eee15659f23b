"""Forwarding module, to be removed: the sim's tables for a calibration are :mod:`ds4lab.calibration.modeled`."""

from ..calibration.modeled import sim_context  # noqa: F401
