"""The README, for a reader with one minute: its first screen says what ds4lab is, what it answers
and the two commands; every command has a row of at most two lines; the long explanations are in
``docs/`` pages that exist; the figure it shows and the pages it links are there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LINES = README.splitlines()


def test_the_first_screen_says_what_it_is_what_it_answers_and_the_two_commands():
    first = "\n".join(LINES[:40])
    assert "bash scripts/ds4lab.sh ladder" in first and "bash scripts/test.sh" in first
    assert "## What it answers" in first and "CUDA-graph capture" in "\n".join(LINES[:10])
    assert re.search(r"test\.sh.*about [0-9–]+ minutes on two cores", first), "the tests' time is given"
    assert len(LINES) <= 120, f"{len(LINES)} lines: the long explanations belong in docs/"


#: Commands whose README row is still to be written (the README is edited apart from the code this
#: round); each has its row in docs/commands.md meanwhile. Empty it when the README gets the rows.
README_ROW_PENDING = {"tp"}


def test_every_command_has_a_short_row():
    from ds4lab.cli import main

    rows = [line for line in LINES if line.startswith("| `ds4lab ")]
    named = {re.match(r"\| `ds4lab ([a-z0-9-]+)", r).group(1) for r in rows}
    missing = set(main.commands) - named
    assert missing <= README_ROW_PENDING, f"commands without a row: {sorted(missing - README_ROW_PENDING)}"
    commands = (ROOT / "docs" / "commands.md").read_text()
    assert all(f"| `ds4lab {c} " in commands for c in missing), "a pending README row is not in docs/commands.md"
    for r in rows:
        assert len(r) <= 160, f"a row longer than two lines ({len(r)} characters): {r[:60]}..."


def test_the_pages_and_the_figure_it_links_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), target
    for page in ("install", "commands", "results", "audit", "nsight", "sim", "notebooks"):
        assert f"docs/{page}.md" in README and (ROOT / "docs" / f"{page}.md").is_file()


def test_the_current_figure_is_ds4s_own_ladder_and_says_how_to_run_it():
    i = next(n for n, line in enumerate(LINES) if line.startswith("## The current figure: ds4's own capture ladder"))
    section = "\n".join(LINES[i + 1:i + 30])
    assert "ds4lab ds4 --source" in section and "docs/ds4.md" in section and "h200-2026-12-04-ds4" in section
    assert "MODELED" in section, "a figure without a measurement says it is modeled"
    assert section.index("ds4lab ds4 --source") < section.index("ds4lab ladder"), "ds4 itself leads, the rebuild after"


def test_ci_runs_the_readmes_test_command():
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
