"""The measuring jobs' progress display: no refresh thread beside timed work, plain lines in a
Jupyter kernel without ipywidgets, CUDA versions written as users read them."""

from __future__ import annotations

import importlib.util
import io
import threading
import warnings

import pytest
from rich.console import Console

from ds4lab.progress import JobProgress
from ds4lab.report.provenance import cuda_version


def test_bar_starts_no_thread():
    con = Console(file=io.StringIO(), force_terminal=True)
    before = threading.active_count()
    with JobProgress(con, "timing", 10) as p:
        inside = threading.active_count()
        for _ in range(10):
            p.advance()
    assert inside == before, "a redraw thread would compete with host-bound timed launches for the GIL"
    assert p.done == 10


@pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is not None, reason="ipywidgets installed")
def test_jupyter_without_widgets_prints_quarters_and_no_warnings():
    printed = []

    class Recording(Console):
        def print(self, *objects, **kw):
            printed.extend(map(str, objects))

    con = Recording(file=io.StringIO(), force_jupyter=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with JobProgress(con, "moe profile", 8) as p:
            for _ in range(8):
                p.advance()
            p.describe("deferred · uniform")
    assert printed == ["moe profile: 2/8", "moe profile: 4/8", "moe profile: 6/8", "moe profile: 8/8"]


def test_in_jupyter_the_text_a_saved_notebook_keeps_is_plain(monkeypatch):
    """In Jupyter rich shows HTML and keeps a text/plain copy beside it, the text a saved notebook
    (ds4lab notebooks' executed copies) stores: no ANSI codes there, the HTML still styled."""
    import rich.console
    import rich.jupyter

    from ds4lab.progress import make_console

    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)  # as in a notebook's kernel
    shown = []
    monkeypatch.setattr(rich.jupyter, "display",
                        lambda segments, text: shown.append((rich.jupyter._render_segments(segments), text)))
    make_console().print("[bold]ds4lab ladder[/] · wrote 3 files in results/ladder")
    (html, text), = shown
    assert text == "ds4lab ladder · wrote 3 files in results/ladder\n"
    assert "font-weight: bold" in html and "color:" in html


@pytest.mark.parametrize("v,want", [(13020, "13.2"), (12080, "12.8"), (11000, "11.0"), (None, "None"), ("13.2", "13.2")])
def test_cuda_version(v, want):
    assert cuda_version(v) == want
