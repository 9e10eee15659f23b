"""Forwarding module, to be removed: the check of a calibration against a record is
:mod:`ds4lab.calibration.check`."""

from ..calibration.check import TOLERANCE, modeled_vs_measured  # noqa: F401
