"""Result files written as they are measured, so an interrupted run keeps what it finished."""

from __future__ import annotations

import csv
from pathlib import Path


class ResultsCSV:
    """An append-only tidy CSV (``metric, value, unit, token, source``), flushed after every row.

    ``source`` says where the number came from (``cuda-events``, ``host-clock``, ``analytic``,
    ``numpy-reference``; on the simulated runtime every row reads ``modeled (sim, calibration
    <name>)``), so no figure appears without its origin.
    """

    COLUMNS = ("metric", "value", "unit", "token", "source")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(self.COLUMNS)
        self._f.flush()

    def add(self, metric: str, value, unit: str, source: str, token: int | str = "") -> None:
        self._w.writerow((metric, value, unit, token, source))
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ResultsCSV":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
