"""The sim's rules of conditional nodes, capture into a graph and programmatic edges
(``ds4lab/sim/rules_device.py``): each is in the one rules table, cited, and applied by at least one
conformance scenario of ``ds4lab/conformance/device_graphs.py`` (the scenarios the H200 will run)."""

from __future__ import annotations

import pytest

from ds4lab.conformance import SCENARIOS, run_scenarios
from ds4lab.conformance import device_graphs as DG
from ds4lab.sim import SimBackend
from ds4lab.sim.rules import RULES
from ds4lab.sim.rules_device import DEVICE_RULES



def _device_scenarios():
    """The scenarios registered by ds4lab/conformance/device_graphs.py (registration order)."""
    # registration order follows the imports: device_graphs' scenarios from capture_graph_query up to
    # the first one of the next module (tp: the two-device scenarios)
    from ds4lab.conformance import tp as TP

    names = [s.name for s in SCENARIOS]
    start = names.index("capture_graph_query")
    later = [i for i, n in enumerate(names) if i > start and callable(getattr(TP, n.split("[")[0], None))]
    return SCENARIOS[start:later[0] if later else None]


@pytest.fixture(scope="module")
def fired():
    be = SimBackend()
    be.rt.record_rules = True
    names = [s.name for s in _device_scenarios()]
    res = run_scenarios(be, names)
    return res, {rule for rule, _ in be.rt.fired}


def test_device_rules_are_in_the_table():
    assert set(DEVICE_RULES) <= set(RULES)
    for name, fields in DEVICE_RULES.items():
        assert RULES[name].source == fields[4] and ("GUESS" in fields[4]) == ("GUESS" in RULES[name].source)


def test_every_device_rule_is_applied_by_a_scenario(fired):
    res, rules = fired
    assert len(res) == 18
    missing = sorted(set(DEVICE_RULES) - rules)
    assert not missing, f"rules no scenario applies: {missing}"


def test_device_scenarios_are_documented_and_match_on_the_sim(fired):
    res, _ = fired
    for sc in _device_scenarios():
        assert sc.expect and sc.source, sc.name  # written from the documentation until the H200 records them
        got = res[sc.name]
        assert not [k for k in got if k.startswith("<")], (sc.name, got)
        diffs = {k: (v, got.get(k)) for k, v in sc.expect.items() if got.get(k) != v}
        assert not diffs, (sc.name, diffs)
