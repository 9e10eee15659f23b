"""The evidence line of an argument comparison claims only what was compared."""
from __future__ import annotations

import pandas as pd

from ds4lab.audit.frozen import ArgumentAudit, _evidence


class _Report:
    def __init__(self, aa):
        self.arguments = aa


def test_nothing_read_is_not_called_a_comparison():
    aa = ArgumentAudit(pd.DataFrame(), compared=[1, 2, 3], launches=100, unread=300, unread_kernels=["k"])
    text = _evidence(_Report(aa))
    assert "no argument value compared" in text and "argument by argument" not in text


def test_a_partly_read_comparison_says_how_much_was_unread():
    aa = ArgumentAudit(pd.DataFrame(), compared=[1, 2, 3], launches=100, unread=30, unread_kernels=["k"])
    text = _evidence(_Report(aa))
    assert "compared argument by argument" in text and "30 unread" in text
