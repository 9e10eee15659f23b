"""The sim's calibration: every fit of its cost model and the check of a calibration against a record.

* :mod:`.fit`: :func:`~ds4lab.calibration.fit.fit`, the one entry (a calibration from one source of measurements,
  :data:`~ds4lab.calibration.fit.SOURCES`), and the file writer;
* :mod:`.gpu`: measured on this GPU; :mod:`.kernels`: the per-kernel ``fixed + bytes / bandwidth`` fits;
* :mod:`.from_moe`, :mod:`.from_ladder`, :mod:`.from_ds4`, :mod:`.from_context`: fitted with no GPU from a measured
  folder of ``ds4lab moe``, ``ladder``/``context``, ``ds4`` and ``context``;
* :mod:`.record`: the one reader of a measured ladder or context record and the tolerance; :mod:`.check`: the sim
  against such a record; :mod:`.modeled`: the sim's tables for a calibration;
* :mod:`.tables`: what a console shows of each.

The file schema, the shipped files and their loading stay with the sim (:mod:`ds4lab.sim.calibration`), which reads a
calibration below every layer that fits one. ``docs/calibration.md`` explains the fits."""
