"""One source of command-line defaults: every option of a job's command that sets a field of the job's
config dataclass defaults to that field's default (the command line reads them with
``cli.support.default``), so a notebook, ``jobs.execute`` and the command line run the same job."""

from __future__ import annotations

import dataclasses

import pytest

from ds4lab.cli import main
from ds4lab.jobs.bench import BenchConfig
from ds4lab.jobs.calibrate import CalibrateConfig
from ds4lab.jobs.context import ContextConfig
from ds4lab.jobs.exclusion import ExclusionConfig
from ds4lab.jobs.hazards import HazardsConfig
from ds4lab.jobs.ladder import LadderConfig
from ds4lab.jobs.moe import MoeConfig
from ds4lab.jobs.run import RunConfig
from ds4lab.jobs.trace import TraceConfig

#: command → (its config, {option's parameter name: the config field it sets, where the names differ}).
COMMANDS = {
    "run": (RunConfig, {"vocab": "options.vocab", "counts_clear": "options.counts_clear",
                        "scalars": "options.scalars", "scratch": "options.scratch",
                        "moe_profile": "options.moe_profile"}),
    "bench": (BenchConfig, {}),
    "ladder": (LadderConfig, {"repeats": "rounds"}),
    "context": (ContextConfig, {"repeats": "rounds"}),
    "hazards": (HazardsConfig, {}),
    "calibrate": (CalibrateConfig, {}),
    "trace": (TraceConfig, {}),
    "moe": (MoeConfig, {"tokens": "tokens_per_step", "modes": None, "routings": None}),  # "all": below
    "exclusion": (ExclusionConfig, {}),
}

#: Options whose command-line default is the job's rule, not a config value (``auto``: the backend).
NOT_CONFIG = {"backend", "hazard", "list_only", "names", "force", "from_ladder", "from_ds4"}


def _field_default(cfg_cls, path: str):
    obj = cfg_cls()
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def mismatches(command: str, cfg_cls, renames: dict) -> tuple[list[str], int]:
    """``(options whose default is not the config's, how many options were checked)``."""
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    bad, checked = [], 0
    for p in main.commands[command].params:
        name = renames.get(p.name, p.name)
        if p.name in NOT_CONFIG or name is None or name.split(".")[0] not in fields:
            continue
        want, got = _field_default(cfg_cls, name), p.default
        if getattr(p, "is_flag", False) and not isinstance(got, bool):
            got = False  # a plain flag is off unless given
        if p.name in ("out", "base") and got is not None:
            got, want = str(got), str(want)
        if not (got == want or (got is False and want is None and getattr(p, "is_flag", False))):
            bad.append(f"{command} --{p.name.replace('_', '-')}: {got!r}, config {name}={want!r}")
        checked += 1
    return bad, checked


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_defaults_to_its_config_field(command):
    bad, checked = mismatches(command, *COMMANDS[command])
    assert not bad, bad
    assert checked >= 2, f"{command}: no option checked against its config"


def test_moe_all_is_the_configs_default():
    """``--mode all`` and ``--routing all`` (the command line's defaults) are the config's default lists."""
    from ds4lab.moeprof import MODES, ROUTINGS

    assert list(MoeConfig().modes) == list(MODES) and list(MoeConfig().routings) == list(ROUTINGS)
    assert {p.name: p.default for p in main.commands["moe"].params}["modes"] == "all"


def test_the_check_names_a_default_that_differs():
    """The check can fail: a config whose default moved away from the command line's is named."""

    @dataclasses.dataclass
    class Moved(RunConfig):
        tokens: int = 65

    bad, _ = mismatches("run", Moved, COMMANDS["run"][1])
    assert bad == ["run --tokens: 64, config tokens=65"]
