"""Conformance scenarios: short programs over the runtime API, run on ``cupy`` and on ``sim``.

Each scenario records, step by step, what each call did (``ok`` or the CUDA/CuPy error name), which operations ended up
in the captured graph (node kinds and kernel names), and the values buffers hold after replays. The same scenario on
the real GPU and on the simulated runtime must produce the same record; ``ds4lab conformance`` prints every
disagreement. Where CUDA's behaviour is surprising, the scenario stays and its docstring says what it shows.

The scenarios live by area and register in this order (the order of ``SCENARIOS``, which every record follows):
:mod:`.hazards`, :mod:`.streams`, :mod:`.queries`, :mod:`.graphs`, :mod:`.updates`, :mod:`.islands` (ds4's decode
islands), :mod:`.memory` (host memory: copies, cudaMemcpy, pinned memory), :mod:`.host_calls` (host queries, capture
status, pre-capture events, other streams, cuBLAS): the calls ``ds4lab audit`` gives verdicts for,
:mod:`.device_graphs` (conditional nodes, capture into a graph, programmatic dependent launch: stages 3cc, 3p, 3cp,
3ccp) and :mod:`.tp` (two devices: peer copies and NCCL all-reduce, each rank a thread; skipped where fewer than two
GPUs are). :mod:`.framework` holds the recorder and the registry, :mod:`.runner` runs and compares."""

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
