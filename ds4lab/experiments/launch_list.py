"""Launch lists, counted: one token's census (:func:`one_token`) and where the long-context token's launch list
changes with the position (:func:`scan`): compressor emits and the indexer's top-k regime (``docs/model.md``, "Long
context") are host decisions a captured graph freezes. Counts on a timing-only sim, the same on every backend; drawn
by :func:`ds4lab.report.plots.launches_figure`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..token import reference as LR


def shape(n_comp: int, top_k: int) -> tuple[str, int]:
    """``(top-k regime, top-k launches)`` of the ratio-4 layers at ``n_comp`` compressed rows."""
    return LR.topk_regime(n_comp, top_k), len(LR.topk_plan(n_comp, top_k)[0])


def shape_changes(max_context: int, top_k: int) -> list[int]:
    """Every ``n_comp`` below ``max_context`` after which the launch shape changes (at position ``4 n + 3``)."""
    last = LR.comp_count(max_context - 1, 4)
    return [n for n in range(1, last) if shape(n, top_k) != shape(n + 1, top_k)]


def anchor_positions(max_context: int, ratios, changes) -> list[int]:
    """Positions that show every launch shape below ``max_context``, ascending: ``a = P·j - 1`` (``P`` the largest
    ratio) at each power of two ≥ ``P`` and either side of each of ``changes``, with ``a - 1`` and (``P > 4``) ``a -
    4`` beside; none below 4."""
    P = max(ratios)

    def kinds(a):
        return [a - 1, a] + ([a - 4] if P > 4 else [])

    anchors = {P * (2 ** i // P) - 1 for i in range(2, 64) if P <= 2 ** i < max_context}
    for nb in changes:  # the last anchor before each change and the first after it
        a = P * (4 * nb // P) - 1
        if a >= P - 1:
            anchors.add(a)
        while min(LR.comp_count(q, 4) for q in kinds(a)) <= nb:
            a += P
        if a < max_context:
            anchors.add(a)
    return sorted({q for a in anchors for q in kinds(a) if 4 <= q < max_context})


@dataclass
class LaunchScan:
    """What :func:`scan` counted for ``preset`` with long context.

    Attributes:
        launches: one row per :func:`anchor_positions` position: ``position``, ``n_comp (ratio 4)``, ``regime``, ``top-k
            launches``, ``token``, ``kernels``, ``launches``.
        window: the same columns for consecutive tokens inside one regime.
        changes: :func:`shape_changes`."""

    preset: str
    top_k: int
    ratios: list
    max_context: int
    changes: list
    launches: object
    window: object
    _model: object = field(default=None, repr=False)

    def table(self):
        """Kernel launches per token by launch shape (rows) and emit (columns); ``a–b`` where positions differ."""
        order = {r: j for j, r in enumerate(LR.TOPK_REGIMES)}
        t = self.launches.pivot_table(index=["regime", "top-k launches"], columns="token", values="kernels",
                                      aggfunc=lambda v: "–".join(map(str, sorted({v.min(), v.max()}))))
        return t.sort_index(key=lambda i: i.map(order) if i.name == "regime" else i)

    def visible_changes(self) -> list:
        """The :attr:`changes` whose tokens either side lie below ``max_context``."""
        return [n for n in self.changes if 4 * n + 4 < self.max_context]

    def decisions_table(self, change: int | None = None):
        """:meth:`decisions_around` as a table: a row per host decision, a column per position."""
        import pandas as pd

        d = self.decisions_around(change)
        return pd.DataFrame({f"position {q}": pd.Series(dict(v), dtype=object).map(repr) for q, v in d.items()})

    def decisions_around(self, change: int | None = None) -> dict:
        """``{position: decisions}`` either side of the shape change after n_comp ``change``; ``{}`` for none."""
        if change is None:
            change = next(iter(self.visible_changes()), None)
        if change is None:
            return {}
        return {q: self._model.longctx_decisions(q, by_value=False) for q in (4 * change - 1, 4 * change + 3)}

    def title(self) -> str:
        return (f"{self.preset}, long context: top-k {self.top_k}, compressed layers of ratio "
                f"{', '.join(map(str, self.ratios))}; max_context {self.max_context}; counted by the launch census "
                "(no timing)")


def census(model, pos: int) -> dict:
    """Every launch of ``model``'s token at ``pos`` by census, with what decides its shape."""
    ratios = model.compressed_ratios()
    model.L.census.reset()
    model.token(pos, 7)
    d = dict(model.longctx_decisions(pos, by_value=False))
    emits = [r for r in ratios if d[f"compressor.emit.r{r}"]]
    return {"position": pos, "n_comp (ratio 4)": LR.comp_count(pos, 4), "regime": d.get("indexer.regime", "-"),
            "top-k launches": len(d.get("indexer.topk_plan", ())),
            "token": " + ".join(f"emit r{r}" for r in emits) or "no emit",
            "kernels": model.L.census.total("kernel"), "launches": model.L.census.total()}


@dataclass
class OneToken:
    """One decode token as the launch layer saw it: ``by_kind``, ``by_cluster``, :meth:`ranges`, ``label``."""

    model: object
    position: int
    by_kind: object
    by_cluster: object
    label: str = ""

    def ranges(self, layer: int = 0):
        """Each launch of ``layer`` in the next token with its NVTX ranges (``cluster``, ``op range``, ``kernel``)."""
        import pandas as pd

        with self.model.L.recording() as trace:
            self.model.token(self.position + 1, 8)
        return pd.DataFrame([(r.cluster, r.site, r.kernel) for r in trace if r.layer == layer],
                            columns=["cluster (NVTX category)", "op range", "kernel"])


def one_token(be, preset: str, position: int = 1000, label: str = "") -> OneToken:
    """``preset``'s token decoded once on ``be`` at ``position``, census taken; ConfigError for an unknown preset."""
    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions

    model = DecodeModel(get_preset(preset), be, TokenOptions(vocab=True))
    model.token(position, 7)
    be.synchronize()
    return OneToken(model, position, model.L.census.by_kind(), model.L.census.by_cluster(), label)


def scan(preset: str) -> LaunchScan:
    """Count ``preset``'s long-context token at :func:`anchor_positions` and over a window of consecutive tokens, on a
    timing-only sim.

    Raises:
        ds4lab.token.config.ConfigError: an unknown preset.
        ValueError: a preset without compressed layers at long context."""
    import pandas as pd

    from ..backends import make_backend
    from ..token.config import get_preset
    from ..token.model import DecodeModel, TokenOptions

    cfg = get_preset(preset, long_context=True)
    model = DecodeModel(cfg, make_backend("sim", timing_only=True), TokenOptions(vocab=True))
    k, ratios = cfg.index_top_k, model.compressed_ratios()
    if not ratios:
        raise ValueError(f"{preset}: no compressed layers at long context")
    changes = shape_changes(cfg.max_context, k)
    rows = [census(model, q) for q in anchor_positions(cfg.max_context, ratios, changes)]
    launches = pd.DataFrame(rows).drop_duplicates("position").sort_values("position", ignore_index=True)
    P = max(ratios)
    start = P * -(-4 * 5 * k // (2 * P))  # n_comp ≈ 2.5 top-k, on a multiple of P
    n = 2 * max(P, 16) + 8
    if start + n > cfg.max_context:
        start = 4
    window = pd.DataFrame([census(model, q) for q in range(start, min(start + n, cfg.max_context))])
    return LaunchScan(preset, k, ratios, cfg.max_context, changes, launches, window, model)


__all__ = ["LaunchScan", "OneToken", "anchor_positions", "census", "one_token", "scan", "shape", "shape_changes"]
