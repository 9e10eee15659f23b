"""Forwarding module, to be removed: a stage run is :mod:`ds4lab.experiments.stage_run`."""

from .stage_run import OUTCOMES, ModelPatch, Span, StageRun, compare_runs, first_difference, outcome  # noqa: F401
