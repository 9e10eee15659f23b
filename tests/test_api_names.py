"""CUDA API names are read by one rule (``trace.records.api_base_name``) against one list of launch calls
(``KERNEL_LAUNCH_CALLS``, ``GRAPH_LAUNCH_CALLS``): the audit's call classes, ds4's recorded census and
the argument pass all use them, and no other module of ds4lab writes a normalizer or a launch list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pandas as pd
import pytest

import ds4lab
from ds4lab.trace import records as R

ROOT = Path(ds4lab.__file__).resolve().parent


@pytest.mark.parametrize("name,base", [
    ("cudaLaunchKernel_v7000", "cudaLaunchKernel"), ("cudaLaunchKernel_ptsz", "cudaLaunchKernel"),
    ("cudaMemcpyAsync_ptsz_v7000", "cudaMemcpyAsync"),  # version after the per-thread suffix
    ("cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD"), ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoDAsync"),
    ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"), ("cuLaunchKernel", "cuLaunchKernel"),
    ("cudaGraphLaunch_v10000", "cudaGraphLaunch"), ("cudaStreamIsCapturing_ptsz_v10000", "cudaStreamIsCapturing"),
    ("cudaPtszHelper", "cudaPtszHelper"),  # only a suffix is a suffix
])
def test_the_base_name(name, base):
    assert R.api_base_name(name) == base


def test_every_reader_of_api_names_uses_the_one_rule_and_list():
    from ds4lab.audit import calls
    from ds4lab.audit.calls import TokenContext, classify
    from ds4lab.ds4 import readout as results
    from ds4lab.trace import arguments

    assert calls.KERNEL_LAUNCH_CALLS is R.KERNEL_LAUNCH_CALLS and calls.GRAPH_LAUNCH_CALLS is R.GRAPH_LAUNCH_CALLS
    assert results.KERNEL_LAUNCH_CALLS is R.KERNEL_LAUNCH_CALLS and results.GRAPH_LAUNCH_CALLS is R.GRAPH_LAUNCH_CALLS
    assert set(arguments.LAUNCH_LAYOUTS) < R.KERNEL_LAUNCH_CALLS, "the argument pass reads launches of the list"
    ctx = TokenContext(capture=5, legacy=frozenset({0}), main_tid=1)
    for name in ("cudaLaunchKernel_ptsz_v7000", "cuLaunchKernelEx_ptsz", "cuLaunchGridAsync"):
        assert classify(name, 5, 1, -1, "", "", ctx) == "kernel@capture", name
        assert calls.is_launch(name)
    assert classify("cuGraphLaunch_ptsz", 5, 1, -1, "", "", ctx) == "graph_launch@capture"


def test_ds4s_census_counts_every_form_of_a_launch():
    """ds4's recorded tokens: a launch named with a version after its per-thread suffix is a launch (the
    census once missed ``cudaLaunchKernel_ptsz_v7000``), and so is every call of the one list."""
    from ds4lab.ds4.readout import trace_census
    from ds4lab.trace.events import COLUMNS

    rows = []

    def row(**kw):
        rows.append({**{c: miss for c, (_, miss) in COLUMNS.items()}, **kw})

    row(kind="nvtx", name="decode_step", domain="ds4lab", tid=7, start_ns=0, end_ns=1_000_000)
    names = ["cudaLaunchKernel_ptsz_v7000", "cuLaunchKernel_ptsz", "cudaLaunchCooperativeKernel_v9000",
             "cuLaunchKernelEx", "cudaGraphLaunch_ptsz_v10000", "cudaDeviceSynchronize_v3020"]
    for i, name in enumerate(names):
        row(kind="api", name=name, domain="runtime", tid=7, start_ns=1000 * i + 1, end_ns=1000 * i + 500,
            correlation=i + 1)
        row(kind="kernel", name=f"k{i}", start_ns=10_000 * (i + 1), end_ns=10_000 * (i + 1) + 100, correlation=i + 1,
            graph_id=3 if "Graph" in name else 0, grid="1,1,1", block="32,1,1")
    tokens, _ = trace_census(pd.DataFrame(rows))
    assert tokens.launch_calls.tolist() == [4] and tokens.graph_launches.tolist() == [1]
    assert tokens.kernels.tolist() == [5], "the synchronization's row is not a launch"


_SUFFIX_PATTERN = re.compile(r"_v\\d|_pt[(\[]")  # a regular expression's, not prose's ``_v2``


def offenders(tree: ast.AST, where: str) -> list[str]:
    """A regular expression for the ``_v<N>``/``_ptsz``/``_ptds`` suffixes, or a set, tuple or list naming
    two or more launch calls, in ``tree``."""
    launches = R.KERNEL_LAUNCH_CALLS | R.GRAPH_LAUNCH_CALLS
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SUFFIX_PATTERN.search(node.value):
            found.append(f"{where}:{node.lineno} a suffix pattern {node.value!r}")
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            named = {e.value for e in node.elts if isinstance(e, ast.Constant)} & launches
            if len(named) >= 2:
                found.append(f"{where}:{node.lineno} a launch list {sorted(named)}")
    return found


def test_no_other_module_writes_a_normalizer_or_a_launch_list():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] != "data" and rel != Path("trace/records.py"):
            found += offenders(ast.parse(path.read_text(), filename=str(path)), str(rel))
    assert not found, "\n".join(found)
    assert len(offenders(ast.parse((ROOT / "trace" / "records.py").read_text()), "records")) == 3


def test_the_scan_finds_a_planted_normalizer():
    """The scan can fail: the two shapes it looks for, as the old modules wrote them."""
    planted = ('import re\n_SUFFIX = re.compile(r"(_v\\d+|_pt(sz|ds))$")\n'
               'LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel")\n')
    assert sorted(f.split(" ", 1)[1][:8] for f in offenders(ast.parse(planted), "x")) == ["a launch", "a suffix"]
