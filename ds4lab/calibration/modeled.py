"""The sim's context ladder run for a calibration given as a dict, timing only: the one place the
calibrations fitted without a GPU (``calibrate --from-ds4``, ``--from-context``) and the what-ifs
price ds4lab's token with candidate costs."""

from __future__ import annotations

from pathlib import Path


def sim_context(cal: dict, preset: str, stages: str, contexts, tokens: int):
    """The sim's ``ds4lab context`` table (``context.csv``'s rows) for calibration ``cal`` (a dict),
    timing only: per stage and context µs per token (MODELED), host enqueue µs, the modeled busy floor,
    launches. Seconds for ``ds4-flash`` at one context."""
    import io
    import tempfile

    import matplotlib.pyplot as plt
    import pandas as pd
    from rich.console import Console

    from .context import ContextConfig
    from .context import run as run_context
    from ..sim.backend import SimBackend

    be = SimBackend(timing_only=True, calibration=cal)
    before = set(plt.get_fignums())
    with tempfile.TemporaryDirectory(prefix="ds4lab-from-ds4-") as tmp:
        cfg = ContextConfig(stages=stages, preset=preset, contexts=sorted(contexts), tokens=tokens, warmup=2,
                            out=Path(tmp) / "context")
        try:
            run_context(cfg, be, Console(file=io.StringIO(), width=160))
        finally:
            for n in set(plt.get_fignums()) - before:
                plt.close(n)
        return pd.read_csv(Path(tmp) / "context" / "context.csv", dtype={"stage": str})
