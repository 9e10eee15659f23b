"""The sim's calibration: every fit of its cost model (:func:`.fit.fit`, one entry over :data:`~.fit.SOURCES`:
:mod:`.gpu`, :mod:`.from_moe`, :mod:`.from_ladder`, :mod:`.from_ds4`, :mod:`.from_context`; per-kernel lines in
:mod:`.kernels`), the check against a record (:mod:`.record`, :mod:`.check`, :mod:`.modeled`) and the console tables
(:mod:`.tables`). The file schema and loading stay with :mod:`ds4lab.sim.calibration`. Next: ``docs/calibration.md``."""
