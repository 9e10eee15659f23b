"""Forwarding module, to be removed: what ``ds4lab compare`` collects and draws is
:mod:`ds4lab.report.compare_tables`."""

from .compare_tables import (FIGURES, TABLES, CompareError, Table, collect, figures,  # noqa: F401
                             load_result_meta, moe_fallbacks)
