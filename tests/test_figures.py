"""docs/figures.md: written by scripts/figures.py from the committed records, never by hand.

The page must equal what the script writes now (a stale page fails), every figure must name its
record and where the record came from, and the figures must follow the records: a changed record
changes the page, a sim record reads MODELED, one line of the script's record table moves a figure
to another record.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "docs" / "measurements"


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("ds4lab_figures_script", ROOT / "scripts" / "figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sections(page: str) -> dict[str, str]:
    parts = page.split("\n## ")[1:]
    return {p.split("\n", 1)[0]: p for p in parts}


def copy_record(rel: str, root: Path) -> Path:
    src, dst = MEASUREMENTS / rel, root / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


def test_committed_page_is_what_the_script_writes(figures):
    page = (ROOT / "docs" / "figures.md").read_text()
    assert page == figures.render(), "docs/figures.md is stale: run python3 scripts/figures.py"


def test_every_figure_has_a_record_that_exists(figures):
    keys = [k for k, *_ in figures.FIGURES]
    assert sorted(keys) == sorted(figures.CURRENT), "a figure without a record, or a record without a figure"
    for key, rel in figures.CURRENT.items():
        assert (MEASUREMENTS / rel).exists(), f"{key}: {rel} is not under docs/measurements"


def test_every_figure_names_its_source_and_provenance(figures):
    secs = sections(figures.render())
    assert len(secs) == len(figures.FIGURES)
    for title, text in secs.items():
        src = [ln for ln in text.splitlines() if ln.startswith("Source: ")]
        assert len(src) == 1, f"{title}: no Source line"
        paths = re.findall(r"`(docs/measurements/[^`]+)`", src[0])
        assert paths, f"{title}: the Source line names no record"
        for p in paths:
            assert (ROOT / p).exists(), f"{title}: {p} does not exist"
        assert ("MODELED" in src[0]
                or re.search(r"· NVIDIA \S.* · driver \d[\d.]+ · (CuPy \d[\d.]+|ds4 [0-9a-f]{7,}) · "
                             r"\d{4}-\d\d-\d\d$", src[0])), \
            f"{title}: neither GPU, driver, CuPy and date nor MODELED: {src[0]}"


def test_figures_are_read_from_the_record(figures, tmp_path):
    rel = figures.CURRENT["ladder"]
    rec = copy_record(rel, tmp_path)
    before = figures.render({"ladder": rel}, root=tmp_path)
    rows = (rec / "ladder.csv").read_text().splitlines()
    head = rows[0].split(",")
    i = next(n for n, r in enumerate(rows) if r.startswith("3,"))
    cells = rows[i].split(",")
    cells[head.index("us_median")] = "1234.5"
    rows[i] = ",".join(cells)
    (rec / "ladder.csv").write_text("\n".join(rows) + "\n")
    after = figures.render({"ladder": rel}, root=tmp_path)
    assert "| 3 | 1 234 (" in after or "| 3 | 1 235 (" in after
    assert "| 3 | 1 23" not in before


def test_a_sim_record_reads_modeled(figures, tmp_path):
    rel = figures.CURRENT["ladder"]
    rec = copy_record(rel, tmp_path)
    meta = json.loads((rec / "meta.json").read_text())
    meta.update(backend="sim", modeled=True, measured=False, device="simulated GPU",
                calibration={"name": "a test calibration"})
    (rec / "meta.json").write_text(json.dumps(meta))
    src = next(ln for ln in figures.render({"ladder": rel}, root=tmp_path).splitlines() if ln.startswith("Source: "))
    assert "**MODELED** (simulated runtime, calibration a test calibration)" in src
    assert "driver" not in src


def test_one_line_of_the_record_table_moves_a_figure(figures):
    page = figures.render({"conformance": "h200-2026-11-30b/conformance"})
    text = sections(page)["Conformance: the GPU against the simulated runtime"]
    assert "| scenarios compared | 104 |" in text and "| steps compared | 848 |" in text
    assert "| scenarios skipped (not run on every backend, not compared) | 0 |" in text
    assert "docs/measurements/h200-2026-11-30b/conformance/meta.json" in text
    assert "h200-2026-12-01" not in text


def test_skipped_scenarios_are_not_counted_as_compared(figures):
    """The 2026-12-02 conformance skipped its 15 two-GPU scenarios on one GPU: neither steps nor
    agreements."""
    page = figures.render({"conformance": "h200-2026-12-02-ds4/conformance"})
    text = sections(page)["Conformance: the GPU against the simulated runtime"]
    assert "| scenarios compared | 180 |" in text and "| steps compared | 1 738 |" in text
    assert "| scenarios skipped (not run on every backend, not compared) | 15 |" in text


def test_a_job_without_meta_takes_the_rounds_env_log(figures):
    text = sections(figures.render({"hazards_island": "h200-2026-12-01/round1/hazards-island"}))  # no meta.json there
    src = next(ln for ln in next(iter(text.values())).splitlines() if ln.startswith("Source: "))
    assert "env.log`; the job wrote no meta.json" in src and "NVIDIA H200 · driver 580.159.04" in src


def test_an_unknown_figure_is_refused(figures):
    with pytest.raises(KeyError, match="no such figure"):
        figures.render({"no-such-figure": "h200-2026-11-30b/ladder"})
