"""The package's layout: the layers of ``docs/architecture.md`` in order (no module imports from a layer
above its own), no two rooms importing each other, and no import cycle inside ``ds4lab``.

The import graph counts every ``import`` / ``from … import`` statement at any depth (inside
functions too), with relative imports resolved; ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. Each module's layer is that of the longest
prefix of its name in :data:`LAYERS` (that prefix is its room). Every check is tried on broken synthetic
packages too (an upward import planted, an import back between two rooms, a cycle), so a check that can
no longer fail does not pass silently. :data:`KNOWN_UPWARD` names the edges none of them governs yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ds4lab

ROOT = Path(ds4lab.__file__).resolve().parent


def modules(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``root`` (the package ``package``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[0] == "data":  # data files (the step scripts users' code stands for), never imported by ds4lab
            continue
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


#: The layers, lowest first: a module may import from its own layer and those below, never from one
#: above. Within a layer any order goes, but no two rooms import each other (:func:`room_pairs`), so the
#: rooms of a layer stand in an order too (the cycle check still holds). A room is a prefix below.
LAYERS = (
    ("foundation", ("ds4lab.errors", "ds4lab.progress", "ds4lab.version", "ds4lab.executor", "ds4lab.capture.stream",
                    "ds4lab.token.config", "ds4lab.token.weights")),  # the backend contract, the stream
    # accessor and the presets: what the runtime and the token need
    ("runtime", ("ds4lab.backends", "ds4lab.sim")),
    ("token", ("ds4lab.token", "ds4lab.capture", "ds4lab.timing")),
    ("trace", ("ds4lab.trace",)),
    ("analysis", ("ds4lab.experiments", "ds4lab.audit", "ds4lab.measure", "ds4lab.moeprof", "ds4lab.conformance",
                  "ds4lab.report", "ds4lab.tp", "ds4lab.calibration", "ds4lab.ds4")),  # tp: two ranks of stage
    # runs, their hazards, their audit; ds4: ds4 itself built, measured, recorded
    ("jobs", ("ds4lab.jobs",)),
    ("top", ("ds4lab.cli", "ds4lab.lab", "ds4lab")),  # the command line, and ds4lab.Lab for notebooks
)

#: Imports that still run up a layer (none: the check governs every module; the tests below plant one to
#: show it fails).
KNOWN_UPWARD: set = set()


def layer_of(module: str, layers=LAYERS) -> int:
    """The index in ``layers`` of ``module``'s layer: the layer naming the longest prefix of it."""
    best, at = -1, None
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, at = len(p), i
    if at is None:
        raise KeyError(f"{module}: in no layer; add its package to LAYERS")
    return at


def room_of(module: str, layers=LAYERS) -> str:
    """The room of ``module``: the longest prefix of it in ``layers``."""
    best = ""
    for _, prefixes in layers:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best = p
    if not best:
        raise KeyError(f"{module}: in no layer; add its package to LAYERS")
    return best


def upward_imports(graph: dict[str, set[str]], layers=LAYERS, known=frozenset()) -> list[str]:
    """``importer (layer) -> imported (layer)`` for every edge of ``graph`` that goes up a layer, but
    those of ``known``."""
    out = []
    for mod in sorted(graph):
        a = layer_of(mod, layers)
        for dep in sorted(graph[mod]):
            b = layer_of(dep, layers)
            if b > a and (mod, dep) not in known:
                out.append(f"{mod} ({layers[a][0]}) -> {dep} ({layers[b][0]})")
    return out


def room_pairs(graph: dict[str, set[str]], layers=LAYERS, known=frozenset()) -> list[str]:
    """``a <-> b (one edge each way)`` for every two rooms (:func:`room_of`) that import each other,
    the edges of ``known`` left out."""
    edges: dict[tuple[str, str], tuple[str, str]] = {}
    for mod in sorted(graph):
        for dep in sorted(graph[mod]):
            a, b = room_of(mod, layers), room_of(dep, layers)
            if a != b and (mod, dep) not in known:
                edges.setdefault((a, b), (mod, dep))
    return [f"{a} <-> {b} ({' -> '.join(edges[a, b])}; {' -> '.join(edges[b, a])})"
            for a, b in sorted(edges) if a < b and (b, a) in edges]


# ----------------------------------------------------------------------------- the checks
def test_no_import_from_a_layer_above():
    up = upward_imports(import_graph(ROOT, "ds4lab"), known=KNOWN_UPWARD)
    assert not up, "imports from a layer above:\n  " + "\n  ".join(up)


def test_no_two_rooms_import_each_other():
    pairs = room_pairs(import_graph(ROOT, "ds4lab"), known=KNOWN_UPWARD)
    assert not pairs, "rooms importing each other:\n  " + "\n  ".join(pairs)


def test_the_known_upward_imports_are_still_there():
    """Each edge the checks let pass exists and goes up (else it is gone: take it off the list)."""
    g = import_graph(ROOT, "ds4lab")
    for a, b in KNOWN_UPWARD:
        assert b in g[a] and layer_of(b) > layer_of(a), (a, b)


def test_every_module_is_in_a_layer():
    for mod in import_graph(ROOT, "ds4lab"):
        layer_of(mod)
        assert room_of(mod) != "ds4lab" or mod == "ds4lab", f"{mod}: in no room of its own; add it to LAYERS"


def test_the_trace_model_is_the_only_home_of_records_and_readers():
    """Trace records and readers live in ``ds4lab.trace`` alone: no other package holds a module of
    the old homes, and nothing outside it unpacks a CUPTI session record by position."""
    import re

    g = import_graph(ROOT, "ds4lab")
    for gone in ("ds4lab.ingest", "ds4lab.audit.sources", "ds4lab.audit.record", "ds4lab.audit.events",
                 "ds4lab.backends.cupti", "ds4lab.moeprof.traces", "ds4lab.report.trace_export",
                 "ds4lab.report.trace_api"):
        assert not any(m == gone or m.startswith(gone + ".") for m in g), gone
    positional = re.compile(r"""\br\[[0-9]\] *== *["'](kernel|memset|memcpy|api|sync|stream|cuda_event|marker|graph)["']""")
    for path in ROOT.rglob("*.py"):
        if "trace" in path.relative_to(ROOT).parts[:1]:
            continue
        assert not positional.search(path.read_text()), f"{path}: a trace record read by position"


def test_no_import_cycle():
    """No cycle but through an edge of :data:`KNOWN_UPWARD` (the audit job's ``from .. import __version__``
    closes one through the package's front door, which imports ``ds4lab.lab`` and with it the jobs)."""
    graph = {m: {d for d in deps if (m, d) not in KNOWN_UPWARD} for m, deps in import_graph(ROOT, "ds4lab").items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_the_package():
    """The walk finds the modules and the edges it should (a relative import inside a function too)."""
    g = import_graph(ROOT, "ds4lab")
    assert len(g) > 50 and "ds4lab.sim.runtime" in g and "ds4lab.conformance.framework" in g
    assert "ds4lab.sim.rules" in g["ds4lab.sim.runtime"]  # from .rules import …
    assert "ds4lab.capture.scope" in g["ds4lab.conformance.framework"]  # from ..capture import … inside a function
    assert "ds4lab.capture.stream" in g["ds4lab.conformance.framework"]  # from .. import stream as S: the module


# ----------------------------------------------------------------------------- the checks can fail
def test_an_upward_import_is_found_in_a_synthetic_package(tmp_path):
    """An upward import planted in a package laid out in layers: the check names it, in a function
    body too; the same package without it passes."""
    layers = (("low", ("pkg.low",)), ("mid", ("pkg", "pkg.mid")), ("top", ("pkg.top",)))
    root = tmp_path / "pkg"
    _write(root, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/base.py": "x = 1\n",
        "mid/__init__.py": "",
        "mid/work.py": "from ..low import base\n",
        "top/__init__.py": "",
        "top/cmd.py": "from ..mid import work\nfrom ..low.base import x\n",
    })
    assert upward_imports(import_graph(root, "pkg"), layers) == []
    (root / "low" / "base.py").write_text("x = 1\n\ndef f():\n    from ..top import cmd\n    return cmd\n")
    (root / "mid" / "work.py").write_text("from ..low import base\nimport pkg.top.cmd\n")
    assert upward_imports(import_graph(root, "pkg"), layers) == [
        "pkg.low.base (low) -> pkg.top.cmd (top)", "pkg.mid.work (mid) -> pkg.top.cmd (top)"]
    with pytest.raises(KeyError, match="in no layer"):
        layer_of("other.module", layers)


def test_two_rooms_importing_each_other_are_found_in_a_synthetic_package(tmp_path):
    """Two rooms of one layer, one importing the other: no pair; an import back (inside a function):
    the pair is named with an edge each way, unless that edge is a known one."""
    layers = (("low", ("pkg", "pkg.a", "pkg.b")),)
    root = tmp_path / "pkg"
    _write(root, {"__init__.py": "", "a/__init__.py": "", "a/x.py": "from ..b import y\n", "b/__init__.py": "",
                  "b/y.py": "z = 1\n"})
    assert room_pairs(import_graph(root, "pkg"), layers) == []
    (root / "b" / "y.py").write_text("z = 1\n\ndef f():\n    from ..a import x\n    return x\n")
    assert room_pairs(import_graph(root, "pkg"), layers) == ["pkg.a <-> pkg.b (pkg.a.x -> pkg.b.y; pkg.b.y -> pkg.a.x)"]
    assert room_pairs(import_graph(root, "pkg"), layers, known={("pkg.b.y", "pkg.a.x")}) == []


def test_the_package_check_fails_on_a_planted_upward_import(tmp_path):
    """ds4lab itself, copied with one upward import planted (the trace model importing a job, as
    ``report/trace_export.py`` once imported ``jobs.common``): the layering check names that edge."""
    import shutil

    root = tmp_path / "ds4lab"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__", "*.cu", "*.cuh", "*.json", "*.gz"))
    assert upward_imports(import_graph(root, "ds4lab"), known=KNOWN_UPWARD) == []
    assert room_pairs(import_graph(root, "ds4lab"), known=KNOWN_UPWARD) == []
    p = root / "trace" / "chrome.py"
    p.write_text(p.read_text() + "\n\ndef _planted():\n    from ..jobs.common import open_backend\n    return open_backend\n")
    assert upward_imports(import_graph(root, "ds4lab"), known=KNOWN_UPWARD) == [
        "ds4lab.trace.chrome (trace) -> ds4lab.jobs.common (jobs)"]
    q = root / "experiments" / "whatif.py"  # measure imports experiments: an import back closes a pair
    q.write_text(q.read_text() + "\n\ndef _planted():\n    from ..measure import bench\n    return bench\n")
    assert any(r.startswith("ds4lab.experiments <-> ds4lab.measure") for r in
               room_pairs(import_graph(root, "ds4lab"), known=KNOWN_UPWARD))


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


def test_the_step_scripts_and_the_library_stay_apart():
    """The decode-step scripts (``ds4lab/data/steps``) stand for users' code: they import nothing of ds4lab,
    and no ds4lab module imports them (the audit meets them only as programs it runs)."""
    steps = ROOT / "data" / "steps"
    scripts = sorted(steps.glob("*.py"))
    assert len(scripts) >= 10
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n == "ds4lab" or n.startswith("ds4lab.") for n in names), f"{path.name} imports {names}"
    for mod, deps in import_graph(ROOT, "ds4lab").items():
        assert not any(d.startswith("ds4lab.data") for d in deps), f"{mod} imports the step scripts"


#: the longest function and the longest module docstring the package keeps (``docs/architecture.md``)
MAX_FUNCTION_LINES = 100
MAX_MODULE_DOCSTRING_LINES = 20


def long_definitions(root: Path, package: str) -> tuple[list[str], list[str]]:
    """``(functions over MAX_FUNCTION_LINES, module docstrings over MAX_MODULE_DOCSTRING_LINES)`` under ``root``,
    each as ``module:name (lines)``."""
    functions, docstrings = [], []
    for mod, path in modules(root, package).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
        if doc is not None and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
            n = doc.end_lineno - doc.lineno + 1
            if n > MAX_MODULE_DOCSTRING_LINES:
                docstrings.append(f"{mod} ({n})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    functions.append(f"{mod}:{node.name} ({n})")
    return functions, docstrings


def test_no_function_over_100_lines_and_module_docstrings_a_screen_or_less():
    functions, docstrings = long_definitions(ROOT, "ds4lab")
    assert not functions, f"functions over {MAX_FUNCTION_LINES} lines: {functions}"
    assert not docstrings, f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines: {docstrings}"


def test_a_long_function_and_a_long_module_docstring_are_found_in_a_synthetic_package(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    doc = "\n".join(["\"\"\"first"] + ["line"] * MAX_MODULE_DOCSTRING_LINES + ["\"\"\""])
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "long.py").write_text(f"{doc}\n\ndef f():\n{body}\n\ndef g():\n    return 1\n")
    functions, docstrings = long_definitions(tmp_path, "pkg")
    assert functions == [f"pkg.long:f ({MAX_FUNCTION_LINES + 1})"]
    assert docstrings == [f"pkg.long ({MAX_MODULE_DOCSTRING_LINES + 2})"]
