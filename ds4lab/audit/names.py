"""Kernel names as the audit shows them: a mangled C++ name demangled, then shortened for a table, a label or a
sentence (the files keep the full names)."""

from __future__ import annotations

#: The most characters a kernel name takes in a terminal table (the files keep the whole name).
SHORT_NAME_MAX = 72


def short_names(names) -> dict:
    """``{name: short}`` for the terminal's tables: demangled (:func:`ds4lab.trace.recording.demangle`), return type
    and parameters dropped, template arguments ``<…>``, at most :data:`SHORT_NAME_MAX` characters."""
    from ..trace.recording import demangle

    names = [str(n) for n in names]
    full = demangle(names)
    return {n: _abbreviate(full.get(n, n)) for n in names}


def _abbreviate(name: str) -> str:
    out = _collapse(name)
    return out if len(out) <= SHORT_NAME_MAX else out[:SHORT_NAME_MAX - 1] + "…"


def _collapse(name: str) -> str:
    """A demangled C++ name without its return type and parameter list, templates as ``<…>``; the name as it is where
    its brackets do not balance (an operator, a name that is not C++)."""
    s = name.strip()
    if s.endswith(")"):  # the parameter list: from its matching "(" on
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                if i > 0:  # "(anonymous namespace)" alone is not a parameter list
                    s = s[:i]
                break
    out, depth, start = [], 0, 0
    for i, c in enumerate(s):  # the last space outside every bracket ends the return type
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
            if depth < 0:
                return name
        elif c == " " and depth == 0:
            start = i + 1
    if depth:
        return name
    depth = 0
    for c in s[start:]:
        if c == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif c == ">":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def short_text(text: str) -> str:
    """``text`` (a sentence naming C++ kernels) with each template argument list written right after a name shown as
    ``<…>`` and the parameter list after it as ``(…)``; an unbalanced ``<`` stays."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "<" and i and (text[i - 1].isalnum() or text[i - 1] == "_"):
            j = _closing(text, i, "<", ">")
            if j is not None:
                out.append("<…>")
                i = j + 1
                if i < n and text[i] == "(":
                    k = _closing(text, i, "(", ")")
                    if k is not None:
                        out.append("(…)" if k > i + 1 else "()")
                        i = k + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _closing(text: str, i: int, open_: str, close: str) -> int | None:
    """Where the bracket ``open_`` at ``i`` closes (nesting counted), or None."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return None


def label(kernel: str, width: int = 40) -> str:
    """A kernel's name as a figure's label: its own name without namespaces, templates and parameters (a short one keeps
    its namespace: ``gemvx::kernel``), cut to ``width``."""
    base = _collapse(kernel).replace("<…>", "")
    parts = [p for p in base.split("::") if p]
    base = "::".join(parts[-2:]) if len(parts) > 1 and len(parts[-1]) < 8 else (parts[-1] if parts else kernel)
    return base if len(base) <= width else base[: width - 1] + "…"
