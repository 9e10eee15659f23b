"""Conformance scenarios: short programs over the runtime API, run on ``cupy`` and on ``sim``; both must produce the
same record (each call's outcome, the captured graph's nodes, buffer values after replays), and ``ds4lab conformance``
prints every disagreement.

Areas register in the order of ``SCENARIOS``: :mod:`.hazards`, :mod:`.streams`, :mod:`.queries`, :mod:`.graphs`,
:mod:`.updates`, :mod:`.islands`, :mod:`.memory`, :mod:`.host_calls`, :mod:`.device_graphs`, :mod:`.tp`.
:mod:`.framework` holds the recorder and the registry, :mod:`.runner` runs and compares."""

from __future__ import annotations

# Registration order is the order of SCENARIOS: keep these imports in this order.
from . import capture_hazards as hazards  # noqa: F401  isort: skip
from . import streams  # noqa: F401  isort: skip
from . import queries  # noqa: F401  isort: skip
from . import graphs  # noqa: F401  isort: skip
from . import updates  # noqa: F401  isort: skip
from . import islands  # noqa: F401  isort: skip
from . import memory  # noqa: F401  isort: skip
from . import host_calls  # noqa: F401  isort: skip
from . import device_graphs  # noqa: F401  isort: skip
from . import tp  # noqa: F401  isort: skip  (two devices: peer copies, NCCL; docs/tensor-parallel.md)
# _buf, _capture, _replay: the scenario helpers, as ds4lab.conformance._capture (tests write scenarios with them)
from .framework import MODES, N, SCENARIOS, Recorder, Scenario, _buf, _capture, _replay, scenario
from .runner import compare, run_scenarios

__all__ = ["MODES", "N", "SCENARIOS", "Recorder", "Scenario", "scenario", "run_scenarios", "compare"]
