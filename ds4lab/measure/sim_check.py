"""Forwarding module, to be removed: a measured record and the sim's tolerance are :mod:`ds4lab.calibration.record`."""

from ..calibration.record import TOLERANCE, preset_changes, read_record  # noqa: F401
