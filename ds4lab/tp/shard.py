"""What each rank of a tensor-parallel token holds (:class:`ShardPlan`) and the exact weight slices that give it
(heads, shared-expert rows, whole routed experts; the rest replicated); a model that does not split raises
:class:`~ds4lab.token.config.ConfigError`. Weight by weight: ``docs/tensor-parallel.md``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..token.config import Q8_0_BLOCK, ConfigError, ModelConfig
from ..token.weights import QTensor


def _share_of(field: str, doc: str) -> property:
    """A rank's equal share of the model's ``field`` (heads, groups, FFN rows, experts) as a range."""

    def share(self) -> range:
        k = getattr(self.cfg, field) // self.world
        return range(self.rank * k, (self.rank + 1) * k)

    return property(share, doc=doc)


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank``'s share of ``cfg`` over ``world`` ranks: ``heads``, ``groups``, ``ffn``, ``experts`` (ranges into
    the single-GPU model's attention heads, output groups, shared-expert rows and routed experts)."""

    cfg: ModelConfig
    rank: int
    world: int

    @classmethod
    def for_rank(cls, cfg: ModelConfig, rank: int, world: int = 2) -> "ShardPlan":
        """The plan of ``rank``; raises ConfigError naming the dimension that does not split."""
        p = cls(cfg, rank, world)
        p.validate()
        return p

    def validate(self) -> None:
        """Raise ConfigError naming the first dimension that does not split (module docstring)."""
        cfg, w = self.cfg, self.world
        if not isinstance(w, int) or w < 1:
            raise ConfigError(f"tensor parallel: world={w!r} must be a positive integer")
        if not 0 <= self.rank < w:
            raise ConfigError(f"tensor parallel: rank={self.rank} outside 0..{w - 1}")
        for what, n in (("n_heads", cfg.n_heads), ("out_groups", cfg.out_groups), ("n_experts", cfg.n_experts)):
            if n % w:
                raise ConfigError(f"{cfg.name}: {what}={n} does not split over {w} ranks")
        if cfg.expert_ffn % (Q8_0_BLOCK * w):
            raise ConfigError(f"{cfg.name}: expert_ffn={cfg.expert_ffn} does not split over {w} ranks in Q8_0 blocks "
                              f"of {Q8_0_BLOCK} (the shared expert's down projection is split by its columns)")
        if (cfg.out_groups // w * cfg.out_lora) % Q8_0_BLOCK:
            raise ConfigError(f"{cfg.name}: {cfg.out_groups // w} output groups x out_lora={cfg.out_lora} per rank is not "
                              f"a multiple of {Q8_0_BLOCK} (o_b is split by its columns)")
        if cfg.n_experts // w < 1:
            raise ConfigError(f"{cfg.name}: no routed expert left per rank")
        if cfg.moe_path != "ds4":
            raise ConfigError(f"{cfg.name}: expert_format={cfg.expert_format!r}: the tensor-parallel token follows ds4's "
                              "routed MoE (expert formats iq2_xxs+q2_k or q4_k)")

    heads = _share_of("n_heads", "The rank's attention heads (a range of the single-GPU model's).")
    groups = _share_of("out_groups", "The rank's output groups (a range of the single-GPU model's).")
    ffn = _share_of("expert_ffn", "The rank's shared-expert FFN rows (a range of the single-GPU model's).")
    experts = _share_of("n_experts", "The rank's routed experts (a range of the single-GPU model's).")

    def owner_of_expert(self, e: int) -> int:
        """The rank that holds routed expert ``e``."""
        return int(e) // (self.cfg.n_experts // self.world)

    def local_config(self) -> ModelConfig:
        """The rank's model dimensions: its heads and output groups; every other field the model's (the router still
        sees every expert; the routed bank holds the rank's, see :func:`expert_slice`)."""
        cfg = self.cfg
        return cfg.replace(n_heads=cfg.n_heads // self.world, out_groups=cfg.out_groups // self.world)

    def q_b_rows(self) -> list[range]:
        """The rank's rows of ``q_b`` (its heads' ``D`` rows each)."""
        D = self.cfg.head_dim
        return [range(self.heads.start * D, self.heads.stop * D)]

    def o_a_rows(self) -> list[range]:
        """The rank's rows of ``o_a`` (its groups' ``out_lora`` rows each)."""
        R = self.cfg.out_lora
        return [range(self.groups.start * R, self.groups.stop * R)]

    def o_b_cols(self) -> range:
        """The rank's columns of ``o_b`` (the ``o_a`` rows it computes)."""
        return self.o_a_rows()[0]

    def sh_gateup_rows(self) -> list[range]:
        """The rank's gate rows, then up rows, of ``sh_gateup``."""
        F = self.cfg.expert_ffn
        return [self.ffn, range(F + self.ffn.start, F + self.ffn.stop)]

    def sh_down_cols(self) -> range:
        """The rank's columns of ``sh_down`` (its FFN rows)."""
        return self.ffn

    def summary(self) -> dict:
        """The plan as plain data (for ``meta.json``)."""
        return {"rank": self.rank, "world": self.world, "heads": [self.heads.start, self.heads.stop],
                "groups": [self.groups.start, self.groups.stop], "shared_ffn": [self.ffn.start, self.ffn.stop],
                "experts": [self.experts.start, self.experts.stop]}


def _is_phantom(a) -> bool:
    from ..sim.memory import is_phantom

    return is_phantom(a)


def _take_rows(a, ranges: list[range], xp):
    """Rows ``ranges`` (concatenated) of a 2-D array, as a new contiguous array (a phantom stays one)."""
    n = sum(len(r) for r in ranges)
    if _is_phantom(a):
        from ..sim.memory import phantom

        return phantom((n,) + tuple(a.shape[1:]), a.dtype)
    parts = [a[r.start:r.stop] for r in ranges]
    return xp.ascontiguousarray(parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=0)).copy()


def _take_cols(a, cols: range, xp):
    if _is_phantom(a):
        from ..sim.memory import phantom

        return phantom((a.shape[0], len(cols)) + tuple(a.shape[2:]), a.dtype)
    return xp.ascontiguousarray(a[:, cols.start:cols.stop]).copy()


def row_slice(t: QTensor, ranges: list[range], xp=np) -> QTensor:
    """The rows ``ranges`` of a quantized matrix (concatenated, in order), any row format, on the array module ``xp``
    of its backend. Raises ValueError for a range past its rows."""
    for r in ranges:
        if not 0 <= r.start <= r.stop <= t.rows:
            raise ValueError(f"rows {r.start}..{r.stop} outside the {t.rows} rows")
    n = sum(len(r) for r in ranges)
    return QTensor(t.fmt, n, t.cols, _take_rows(t.qs, ranges, xp), None if t.d is None else _take_rows(t.d, ranges, xp))


def col_slice(t: QTensor, cols: range, xp=np) -> QTensor:
    """The columns ``cols`` of a Q8_0 matrix: whole blocks of 32 (quants and their scales). Raises ValueError for
    another format or columns off the block boundaries."""
    if t.fmt != "q8_0":
        raise ValueError(f"column slices of {t.fmt!r}: only q8_0 (one scale per 32 columns)")
    if cols.start % Q8_0_BLOCK or cols.stop % Q8_0_BLOCK or not 0 <= cols.start < cols.stop <= t.cols:
        raise ValueError(f"columns {cols.start}..{cols.stop} of {t.cols} are not whole Q8_0 blocks")
    b = range(cols.start // Q8_0_BLOCK, cols.stop // Q8_0_BLOCK)
    return QTensor(t.fmt, t.rows, len(cols), _take_cols(t.qs, cols, xp), _take_cols(t.d, b, xp))


class ExpertSlice:
    """Experts ``lo .. lo + n - 1`` of a routed bank (any backend's), numbered ``0 .. n - 1``; ``qs``/``d`` are the
    bank's slices, copied on a GPU so the rank does not keep the whole bank."""

    def __init__(self, bank, lo: int, n: int, *, copy: bool = False) -> None:
        self.bank, self.lo, self.n = bank, int(lo), int(n)
        self.rows, self.cols, self.fmt = bank.rows, bank.cols, bank.fmt
        qs, d = getattr(bank, "qs", None), getattr(bank, "d", None)
        self.qs = None if qs is None else (qs[lo:lo + n].copy() if copy else qs[lo:lo + n])
        self.d = None if d is None else (d[lo:lo + n].copy() if copy else d[lo:lo + n])
        if copy and self.qs is not None:
            self.bank = None  # the rank keeps only its copy

    def __getitem__(self, e: int):
        e = int(e)
        if not 0 <= e < self.n:
            raise IndexError(f"expert {e} outside this rank's 0..{self.n - 1}")
        if self.qs is not None:  # a stack in memory (GPU, phantom): the rank's own slice
            return QTensor(self.fmt, self.rows, self.cols, self.qs[e], None if self.d is None else self.d[e])
        return self.bank[self.lo + e]  # a bank made on demand (the NumPy reference's): its expert lo + e

    def __len__(self) -> int:
        return self.n


def expert_slice(bank, plan: ShardPlan, *, is_gpu: bool = False) -> ExpertSlice:
    """The rank's experts of ``bank`` (:class:`ExpertSlice`); on a GPU its own copy of them."""
    r = plan.experts
    return ExpertSlice(bank, r.start, len(r), copy=is_gpu)


__all__ = ["ExpertSlice", "ShardPlan", "col_slice", "expert_slice", "row_slice"]
