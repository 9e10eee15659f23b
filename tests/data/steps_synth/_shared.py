"""Shared code of the synthetic steps folder: not a family (its name starts with ``_``)."""
