"""A notebook reader's choice (timeline layers, routing, regime change) made with a dropdown in JupyterLab with
ipywidgets, else (headless: ``DS4LAB_HEADLESS=1``, no ipywidgets, no kernel) drawn once with the notebook parameter's
value."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

HEADLESS_ENV = "DS4LAB_HEADLESS"


@dataclass(frozen=True)
class Choice:
    """One choice: ``value`` among ``options`` (values, or ``(label, value)`` pairs)."""

    value: Any
    options: Sequence

    def values(self) -> list:
        return [o[1] if isinstance(o, tuple) and len(o) == 2 else o for o in self.options]


def interactive() -> bool:
    """Whether a widget would be seen: not headless, in a Jupyter kernel, ipywidgets importable."""
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
    """``draw(**values)`` with a dropdown per choice where :func:`interactive`, else drawn once and returned (a
    Figure detached from pyplot); None with widgets. Raises ValueError naming a value not among its options."""
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
