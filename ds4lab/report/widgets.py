"""A choice a notebook reader makes with a widget rather than by editing a constant (which layers of a timeline, which
routing's distribution, which regime change), with the notebook's parameter as the value: in JupyterLab with
ipywidgets installed (the ``notebooks`` extra) a dropdown per choice redraws the view; headless (``ds4lab
notebooks``, papermill: ``DS4LAB_HEADLESS=1``), without ipywidgets or outside a Jupyter kernel, the view is drawn
once with the parameter's value and returned, so the notebook still runs top to bottom with its parameters."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

HEADLESS_ENV = "DS4LAB_HEADLESS"


@dataclass(frozen=True)
class Choice:
    """One choice: ``value`` (the notebook parameter's) among ``options`` (a sequence of values, or of ``(label,
    value)`` pairs, as ipywidgets' ``Dropdown`` takes them)."""

    value: Any
    options: Sequence

    def values(self) -> list:
        return [o[1] if isinstance(o, tuple) and len(o) == 2 else o for o in self.options]


def interactive() -> bool:
    """Whether a widget would be seen: not headless (:data:`HEADLESS_ENV`), inside a Jupyter kernel, with ipywidgets
    importable."""
    if os.environ.get(HEADLESS_ENV) == "1":
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    if shell is None or not hasattr(shell, "kernel"):
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def choose(draw: Callable[..., Any], **choices: Choice):
    """``draw(**values)`` with each choice's value, shown with a dropdown per choice where a reader can use one
    (:func:`interactive`); else drawn once with the parameters' values and returned.

    Returns the view when drawn once (a matplotlib Figure taken out of pyplot, :func:`ds4lab.report.plots.detach`, so
    Jupyter shows it once, or whatever ``draw`` returns); None with widgets (displayed already, their output the view).

    Raises:
        ValueError: a choice whose value is not among its options (naming it and the options)."""
    for name, c in choices.items():
        if c.value not in c.values():
            raise ValueError(f"{name}={c.value!r}: choose one of {', '.join(map(repr, c.values()))}")
    if not interactive():
        return _detached(draw(**{n: c.value for n, c in choices.items()}))
    import ipywidgets
    from IPython.display import display

    def show(**values):
        display(_detached(draw(**values)))

    controls = {n: ipywidgets.Dropdown(options=list(c.options), value=c.value, description=n)
                for n, c in choices.items()}
    ipywidgets.interact(show, **controls)
    return None


def _detached(view):
    from .plots import detach

    return detach(view)


__all__ = ["Choice", "HEADLESS_ENV", "choose", "interactive"]
