"""The ``sim`` backend: the decode token on a modeled GPU (CUDA stream/capture rules, modeled time).

``SimBackend`` computes numbers with the NumPy reference (or none, ``timing_only=True``), applies CUDA's stream, event,
stream-capture and graph rules (:data:`RULES`), and models time from a calibration file. Nothing it reports is
measured."""

from __future__ import annotations

from .backend import SimBackend
from .costmodel import Calibration, default_calibration_path
from .runtime import MODES, RULES, Graph, GraphExec, Rule, SimEvent, SimStream

__all__ = ["SimBackend", "Calibration", "default_calibration_path", "MODES", "RULES", "Rule",
           "Graph", "GraphExec", "SimEvent", "SimStream"]
