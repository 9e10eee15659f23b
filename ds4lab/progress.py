"""Progress display for measuring jobs that does not disturb what they measure: the bar never refreshes from a thread
(it would take the GIL from host-bound launches being timed); it redraws inline when advanced, at most every 0.2 s,
between timed tokens. Where rich draws nothing (off a terminal, Jupyter without ipywidgets) a line is printed at each
quarter of the work."""

from __future__ import annotations

import time

_MIN_REDRAW_S = 0.2
#: A phase this long (s) or longer says, off a terminal, how far it is and how long is left.
LONG_PHASE_S = 10.0


def _jupyter_without_widgets(console) -> bool:
    import importlib.util

    return bool(getattr(console, "is_jupyter", False)) and importlib.util.find_spec("ipywidgets") is None


def _no_live_display(console) -> bool:
    """Whether rich would draw no bar on ``console``: Jupyter without ipywidgets, or no terminal."""
    if getattr(console, "is_jupyter", False):
        return _jupyter_without_widgets(console)
    return not getattr(console, "is_terminal", True)


def duration(seconds: float) -> str:
    """A time span as a person reads it: ``45 s``, ``12 min``, ``3 h 10 min``, ``2 d 4 h``."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(round(s / 3600), 24)
    return f"{d} d {h} h" if h else f"{d} d"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 figure``, ``3 figures``: a count with its noun (``plural`` where adding ``s`` is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class JobProgress:
    """A progress bar for ``total`` steps on ``console`` (a context manager); ``advance()`` and ``describe()`` are
    cheap between redraws. ``eta``: a time-remaining column (and ``about <time> left`` in the quarter lines);
    ``quiet_s``: no quarter line before the phase has run that long; :meth:`remaining_s`: the estimate."""

    def __init__(self, console, description: str, total: int, eta: bool = False, quiet_s: float = 0.0) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = console
        self.quiet_s = quiet_s
        self._started = time.perf_counter()  # a host clock for when to speak, nothing measured
        self.total = max(int(total), 1)
        self.description = description
        self.done = 0
        self.eta = eta
        self._plain = _no_live_display(console)
        self._t0 = self._d0 = None  # when the first step ended, and the steps done then (the estimate's base)
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
        if self._t0 is None:  # the pace counts from the first step on: not the set-up before it
            self._t0, self._d0 = time.perf_counter(), self.done  # a host clock for the estimate, nothing measured
        self._bar.advance(self._task, n)
        if self._plain:
            while self._next_quarter <= 4 and self.done * 4 >= self._next_quarter * self.total:
                if time.perf_counter() - self._started < self.quiet_s:  # a short phase leaves no lines
                    self._next_quarter += 1
                    continue
                left = self.remaining_s()
                self.console.print(f"{self.description}: {self.done}/{self.total}" + (
                    f", about {duration(left)} left" if self.eta and left is not None and self.done < self.total
                    else ""))
                self._next_quarter += 1
            return
        self._redraw()

    def remaining_s(self) -> float | None:
        """Seconds left at the pace so far, from the end of the first step (None before the second)."""
        if self._t0 is None or self.done <= self._d0:
            return None
        return (time.perf_counter() - self._t0) * max(self.total - self.done, 0) / (self.done - self._d0)

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
    """The rich console the jobs print to: the terminal's width; to a file or CI log, unwrapped lines and tables in
    160 columns; in Jupyter rich's choice without a colour system (so the saved ``text/plain`` copy has no ANSI
    codes). A closed output stops the job as SIGPIPE would (:class:`ds4lab.errors.Terminated`, ``interrupted
    (SIGPIPE)``, exit 141)."""
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
    # a file or a log: a printed line stays one line (grep finds it whole); tables lay out at 160 columns
    return _Console(width=160, soft_wrap=True)
