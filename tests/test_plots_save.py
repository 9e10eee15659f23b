"""``plots.save``: the files, and no figure left open in pyplot."""

from __future__ import annotations

import matplotlib.pyplot as plt

from ds4lab.report import plots


def test_save_writes_every_format_and_closes_the_figure(tmp_path):
    before = set(plt.get_fignums())
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = plots.save(fig, tmp_path / "f")
    assert [p.name for p in paths] == ["f.png", "f.svg", "f.pdf"] and all(p.stat().st_size > 0 for p in paths)
    assert set(plt.get_fignums()) == before  # closed: a session of many jobs holds none of them
    assert fig.canvas is not None and fig.axes  # the object itself still draws (a notebook's last line)
