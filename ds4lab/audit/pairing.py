"""Whether a side pass (markers, capture path, kernel arguments) recorded beside a recording is a run of the same
program: one check for every pass, so that none is paired with another program's recording."""

from __future__ import annotations

from ..trace.recording import STEP_KEYS  # the header keys that name a recorded step


def check_same_program(table, recorded, what: str = "program") -> None:
    """Refuse the pass ``table`` where its header names another step than the recording ``recorded``'s (both
    read event tables, or None: a key missing on either side is not compared). ``what`` names the thing in the
    message (``program``, ``step``). Raises ValueError naming the pass's file and each key that differs, with
    both values."""
    theirs, ours = header(table), header(recorded)
    differ = [k for k in STEP_KEYS if k in theirs and k in ours and theirs[k] != ours[k]]
    if differ:
        raise ValueError(f"{getattr(table, 'source', '?')}: recorded from another {what} than the recording ("
                         + "; ".join(f"{k} {theirs[k]!r} against {ours[k]!r}" for k in differ) + ")")


def names_program(table, recorded) -> bool:
    """Whether the headers of ``table`` and ``recorded`` both name the step (a key of :data:`STEP_KEYS` in each),
    so that :func:`check_same_program` could tell another program's pass."""
    theirs, ours = header(table), header(recorded)
    return any(k in theirs and k in ours for k in STEP_KEYS)


def header(table) -> dict:
    """A read table's saved header (``{}`` for none: a Kineto or Nsight trace, or no table)."""
    return getattr(table, "header", None) or {}


__all__ = ["check_same_program", "header", "names_program"]
