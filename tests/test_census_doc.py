"""docs/model.md's launch census stays true to the code.

The ds4lab side of "Launches per token" is re-counted on the sim for every row whose preset exists
here and whose routed-MoE shape (launches per MoE layer) that preset has in this checkout; a preset
the document names must match at least one of its rows. The ds4 side is counted from ds4's source,
which is not here: its rows are checked for their arithmetic only.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from ds4lab.backends import make_backend
from ds4lab.token import reference as R
from ds4lab.token.config import COMPRESS_RATIOS, PRESETS, get_preset
from ds4lab.token.model import DecodeModel, TokenOptions

DOC = Path(__file__).resolve().parents[1] / "docs" / "model.md"
DS4LAB_MARK = "<!-- census: ds4lab per-token counts"
DS4_MARK = "<!-- census: ds4 per-token counts"


def _table(text: str, mark: str) -> list[list[str]]:
    """The body rows (cells stripped) of the Markdown table that follows the comment ``mark``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(mark)]
    assert len(starts) == 1, f"{DOC.name}: expected one {mark!r} comment, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(set(c) <= set("-: ") for c in cells):  # the header rule
            continue
        rows.append(cells)
    assert len(rows) > 1, f"{DOC.name}: no table after {mark!r}"
    return rows[1:]  # without the header


def _int(cell: str) -> int:
    return int(re.sub(r"[\s\u202f\u00a0]", "", cell))


def ds4lab_rows(text: str | None = None) -> list[dict]:
    """The ds4lab per-token rows of the document, as dicts."""
    rows = []
    for cells in _table(text if text is not None else DOC.read_text(), DS4LAB_MARK):
        preset, moe, long_ctx, pos, emit, launches = cells
        assert long_ctx in ("yes", "no"), f"long context must be yes or no, got {long_ctx!r}"
        rows.append({"preset": preset, "moe": _int(moe), "long_context": long_ctx == "yes",
                     "position": _int(pos), "emit": emit, "launches": _int(launches)})
    return rows


def ds4_rows(text: str | None = None) -> list[tuple[str, str, int]]:
    """The ds4 per-token rows: (token, derivation, launches)."""
    return [(c[0], c[1], _int(c[2])) for c in _table(text if text is not None else DOC.read_text(), DS4_MARK)]


@functools.lru_cache(maxsize=None)
def measured(preset: str, long_context: bool, position: int) -> tuple[int, int]:
    """ds4lab's census of one decode token on the sim (vocabulary on, as ``ds4lab run`` counts):
    (launches per token, routed-MoE launches per MoE layer)."""
    cfg = get_preset(preset, long_context=long_context)
    model = DecodeModel(cfg, make_backend("sim", timing_only=True), TokenOptions(vocab=True))
    model.token(position, 7)
    census = model.L.census
    assert census.tokens == 1
    frame = census.frame(per_token=False)
    moe = int(frame.loc[frame["cluster"] == "moe", "launches"].sum())
    assert moe % cfg.n_layers == 0, f"{preset}: {moe} routed-MoE launches over {cfg.n_layers} layers"
    return census.total(), moe // cfg.n_layers


def _id(row: dict) -> str:
    return f"{row['preset']}-moe{row['moe']}-{'long' if row['long_context'] else 'window'}-{row['position']}"


ROWS = ds4lab_rows()


def test_document_names_the_pinned_preset():
    assert any(r["preset"] == "ds4-flash" for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_ds4lab_count(row):
    if row["preset"] not in PRESETS:
        pytest.skip(f"preset {row['preset']!r} does not exist in this checkout")
    launches, moe = measured(row["preset"], row["long_context"], row["position"])
    if moe != row["moe"]:
        pytest.skip(f"{row['preset']} runs a {moe}-launch routed MoE here; the row is for {row['moe']}")
    assert launches == row["launches"], (
        f"docs/model.md says {row['launches']} launches per token for {_id(row)}; the census counts {launches}")


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_emit_column(row):
    """The emit column says which compressors emit at that position (ds4lab's rule, ds4's too)."""
    if not row["long_context"]:
        assert row["emit"] == "—"
        return
    emitting = [f"ratio {r}" for r in COMPRESS_RATIOS if R.is_emit(row["position"], r)]
    assert row["emit"] == (", ".join(emitting) or "none")


def test_every_named_preset_has_a_row_for_its_moe_shape():
    """A preset the document names, present here, must match at least one row: a change of its
    routed MoE with no row for the new shape is a stale document, not a skipped test."""
    for preset in sorted({r["preset"] for r in ROWS} & set(PRESETS)):
        rows = [r for r in ROWS if r["preset"] == preset]
        _, moe = measured(preset, rows[0]["long_context"], rows[0]["position"])
        assert any(r["moe"] == moe for r in rows), (
            f"docs/model.md has no per-token row for {preset} with its {moe}-launch routed MoE")


@pytest.mark.parametrize("token,derivation,launches", ds4_rows())
def test_ds4_count_arithmetic(token, derivation, launches):
    expr = derivation.replace("×", "*").replace("−", "-")
    assert re.fullmatch(r"[\d\s+*\-]+", expr), f"unexpected derivation {derivation!r}"
    assert eval(expr) == launches, f"{token}: {derivation} is {eval(expr)}, the table says {launches}"


def test_parser_reads_what_the_table_says():
    """The tables are read cell by cell (numbers with thousands spaces too), so an edited count is
    an edited expectation: a wrong number in the document fails test_ds4lab_count."""
    text = "\n".join([
        DS4LAB_MARK + " -->",
        "| preset | routed MoE launches per layer | long context | position | emit | launches |",
        "|---|---|---|---|---|---|",
        "| small | 5 | yes | 65 535 | ratio 4, ratio 128 | 1 234 |",
        "",
        DS4_MARK + " -->",
        "| token | derivation | launches |",
        "|---|---|---|",
        "| t | 1 + 2×3 − 1 | 6 |",
    ])
    assert ds4lab_rows(text) == [{"preset": "small", "moe": 5, "long_context": True, "position": 65535,
                                  "emit": "ratio 4, ratio 128", "launches": 1234}]
    assert ds4_rows(text) == [("t", "1 + 2×3 − 1", 6)]
    assert measured("small", True, 65535)[0] != 1234
