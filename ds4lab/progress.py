"""Progress display for measuring jobs that does not disturb what they measure.

rich's ``Progress`` redraws from a background thread ten times a second by default. An eager
decode token is host-bound (ds4-flash: ~10 µs of Python and CuPy per launch, 1 121 launches), so a
thread that takes the GIL to render competes with the very launches being timed. Here the bar
never refreshes on its own: it redraws inline when the job advances it, at most every 0.2 s, and
the jobs advance it only between timed tokens (after the token's closing event and synchronize).

In a Jupyter kernel rich draws through ipywidgets; without them it only warns on every redraw, so
there the bar is replaced by a printed line at each quarter of the work.
"""

from __future__ import annotations

import time

_MIN_REDRAW_S = 0.2


def _jupyter_without_widgets(console) -> bool:
    import importlib.util

    return bool(getattr(console, "is_jupyter", False)) and importlib.util.find_spec("ipywidgets") is None


class JobProgress:
    """A progress bar for ``total`` steps on ``console``, used as a context manager.

    ``advance()`` and ``describe()`` are cheap when no redraw is due, and never run concurrently
    with the job (no refresh thread). ``eta=True`` adds a time-remaining column.
    """

    def __init__(self, console, description: str, total: int, eta: bool = False) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = console
        self.total = max(int(total), 1)
        self.description = description
        self.done = 0
        self._plain = _jupyter_without_widgets(console)
        self._next_quarter = 1
        cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
        if eta:
            cols.append(TimeRemainingColumn())
        self._bar = Progress(*cols, console=console, transient=True, auto_refresh=False, disable=self._plain)
        self._task = self._bar.add_task(description, total=self.total)
        self._last = 0.0

    def __enter__(self) -> "JobProgress":
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more steps done; redraw if the last redraw is 0.2 s old."""
        self.done += n
        self._bar.advance(self._task, n)
        if self._plain:
            while self._next_quarter <= 4 and self.done * 4 >= self._next_quarter * self.total:
                self.console.print(f"{self.description}: {self.done}/{self.total}")
                self._next_quarter += 1
            return
        self._redraw()

    def describe(self, description: str) -> None:
        """Change the text before the bar (the step being run)."""
        self.description = description
        self._bar.update(self._task, description=description)
        self._redraw()

    def _redraw(self) -> None:
        now = time.perf_counter()  # a host clock for a host-side redraw rate, nothing measured
        if now - self._last >= _MIN_REDRAW_S:
            self._last = now
            self._bar.refresh()


def make_console():
    """The rich console the jobs print to: the terminal's width on a terminal; 160 columns when
    the output goes to a file or a CI log (rich would wrap every table at 80 there); rich's own
    choice in Jupyter, without a colour system. Its output closed under it (``ds4lab ladder |
    head``) stops the job as a SIGPIPE would, as an interruption (:class:`ds4lab.errors.Terminated`:
    status ``interrupted (SIGPIPE)``, results so far kept, exit 141), not as rich's bare
    ``SystemExit(1)``.

    In Jupyter rich shows each print as styled HTML with a ``text/plain`` copy beside it, the text a
    saved notebook keeps (``ds4lab notebooks``' executed copies). rich renders that copy for
    truecolor there whatever ``NO_COLOR`` or ``TERM`` say (``NO_COLOR`` drops colours, not bold), so
    it would be full of ANSI escape codes; without a colour system it is plain text, and the HTML is
    styled as before."""
    import sys

    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            import os
            import signal

            from .errors import Terminated

            self.quiet = True
            devnull = os.open(os.devnull, os.O_WRONLY)  # nothing more reaches the closed pipe
            os.dup2(devnull, sys.stdout.fileno())
            raise Terminated(signal.SIGPIPE, "the output was closed (a pipe such as | head ended)")

    con = _Console()
    if con.is_jupyter:
        return _Console(color_system=None)
    if sys.stdout.isatty():
        return con
    return _Console(width=160)
