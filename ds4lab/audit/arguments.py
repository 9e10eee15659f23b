"""The audit's side of the kernel-argument pass: the capture is :mod:`ds4lab.trace.arguments` (re-exported here), the
tokens are the audit's (:func:`token_launches`). :func:`recording` and ``python -m ds4lab.audit.arguments`` are
the trace's recording and runner with this token finder (``ds4lab audit run``'s argument pass)."""

from __future__ import annotations

import sys

from ..trace.arguments import (ArgumentCapture, ArgumentStore, CudaQueries, FunctionInfo, LAUNCH_LAYOUTS, MemoryTracker, OWN_CALLS, STORE_NAME, STORE_SUFFIX, TokenLaunches, cupti_allocations, digest, load, measure_overhead, prune, save, split, store_beside, varying_words, words)

__all__ = ["ArgumentCapture", "ArgumentStore", "CudaQueries", "FunctionInfo", "LAUNCH_LAYOUTS", "MemoryTracker", "OWN_CALLS", "STORE_NAME", "STORE_SUFFIX", "TokenLaunches", "cupti_allocations", "digest", "load", "main", "measure_overhead", "prune", "recording", "save", "split", "store_beside", "token_launches", "varying_words", "words"]


def token_launches(table, token_range: str | None = None) -> TokenLaunches:
    """The tokens of ``table`` and their launches, found as the audit finds them (the unit with the most kernels).
    Raises :class:`~ds4lab.audit.tokens.NoTokens` when there is none."""
    from .tokens import NoTokens, find_tokens, launch_order
    from .units import split_units
    from .variation import launches, token_shapes

    units, notes = split_units(table)
    if not units:
        raise NoTokens(f"{table.source}: no kernel: no token")
    u = max(units, key=lambda u: int((u.frame["kind"] == "kernel").sum()))
    tk = find_tokens(u, token_range)
    f = u.frame
    k = launches(f, launch_order(u), tk.token)
    shapes, _ = token_shapes(k, tk.n)
    toks: list = [[] for _ in range(tk.n)]
    src = k["call"].where(k["call"] >= 0, k["row"]).to_numpy()
    corr = f.loc[k["row"].to_numpy(), "correlation"].to_numpy()
    t_ns = f.loc[src, "start_ns"].to_numpy()
    for t, c, n, s in zip(k["token"].to_numpy(), corr, k["name"].to_numpy(), t_ns):
        toks[int(t)].append((int(c), str(n), int(s)))
    starts = [int(x) for x in tk.start_ns]
    ends = starts[1:] + [int(tk.end_ns[-1]) if len(tk.end_ns) else starts[-1]]
    return TokenLaunches(toks, list(shapes), starts, ends, tk.how, [*notes, *tk.notes], u.label)


def recording(**kw):
    """:func:`ds4lab.trace.recording.recording` (its keywords: ``stacks``, ``arguments``, ``token_range``) with the
    audit's token finder (:func:`token_launches`) for an argument pass."""
    from ..trace.recording import recording as _recording

    return _recording(tokens=token_launches, **kw)


def main(argv=None) -> int:
    """The recording runner (:func:`ds4lab.trace.recording.main`) with the audit's token finder."""
    from ..trace.recording import main as _main

    return _main(argv, tokens=token_launches)


if __name__ == "__main__":
    sys.exit(main())
