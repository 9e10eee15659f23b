"""The package's layout: no import cycle inside ``ds4lab``.

The import graph counts every ``import`` / ``from … import`` statement at any depth (inside
functions too), with relative imports resolved; ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. The check is tried on broken synthetic
packages too, so a check that can no longer fail does not pass silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ds4lab

ROOT = Path(ds4lab.__file__).resolve().parent


def modules(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``root`` (the package ``package``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out




def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: {modules of the package it imports}}``, every import statement at any depth."""
    mods = modules(root, package)
    graph: dict[str, set[str]] = {m: set() for m in mods}

    def inside(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    def known(name: str) -> str:
        """The longest prefix of ``name`` that is a module of the package."""
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if inside(a.name):
                        graph[mod].add(known(a.name))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if not inside(base):
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    graph[mod].add(sub if sub in mods else known(base))
    for mod, deps in graph.items():
        deps.discard(mod)  # a package naming one of its own attributes (``from . import name``)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, …, a]``) per strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [_cycle_in(graph, set(c)) for c in comps]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A cycle through the first module of a strongly connected component (breadth-first back to it)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component with more than one module has one


# ----------------------------------------------------------------------------- the checks


def test_no_import_cycle():
    cycles = find_cycles(import_graph(ROOT, "ds4lab"))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_the_package():
    """The walk finds the modules and the edges it should (a relative import inside a function too)."""
    g = import_graph(ROOT, "ds4lab")
    assert len(g) > 50 and "ds4lab.sim.runtime" in g and "ds4lab.conformance.framework" in g
    assert "ds4lab.sim.rules" in g["ds4lab.sim.runtime"]  # from .rules import …
    assert "ds4lab.capture.scope" in g["ds4lab.conformance.framework"]  # from ..capture import … inside a function
    assert "ds4lab.capture.stream" in g["ds4lab.conformance.framework"]  # from .. import stream as S: the module


# ----------------------------------------------------------------------------- the checks can fail
def test_cycle_finder_on_synthetic_graphs():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"a"}}) == [["a", "a"]]
    two = find_cycles({"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"z"}, "z": {"x", "a"}})
    assert two == [["a", "b", "a"], ["x", "y", "z", "x"]]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_import_graph_and_cycle_on_a_synthetic_package(tmp_path):
    """Relative and absolute imports, a module imported by name, a name that is not a module, an
    import inside a function and one two levels up: the graph has each edge, and the cycle they
    make is found and named."""
    root = tmp_path / "pkg"
    _write(root, {
        "__init__.py": "from .a import thing\n",
        "a.py": "from . import b\nthing = 1\n",
        "b.py": "def f():\n    from .sub.c import x\n    return x\n",
        "sub/__init__.py": "",
        "sub/c.py": "import os\nfrom .. import thing\nimport pkg.a\nx = 2\n",
        "sub/d.py": "from ..sub import c\nfrom pkg import a\n",
    })
    g = import_graph(root, "pkg")
    assert g == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": set(),
                 "pkg.sub.c": {"pkg", "pkg.a"}, "pkg.sub.d": {"pkg.sub.c", "pkg.a"}}
    assert find_cycles(g) == [["pkg", "pkg.a", "pkg.b", "pkg.sub.c", "pkg"]]
