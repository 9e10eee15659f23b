"""The routed MoE's scratch buffers (:class:`MoeScratch`): sized for a token count, grown on
demand (ds4's growing scratch, a real ``cudaMalloc``) or preallocated from the backend's pool.
"""

from __future__ import annotations

import numpy as np

from .config import MOE_TILE
from .reference import max_tiles


class MoeScratch:
    """Routed-MoE buffers sized for ``capacity`` tokens; grows on demand unless preallocated."""

    def __init__(self, model: "DecodeModel", capacity: int) -> None:
        self.model = model
        self.capacity = 0
        self.allocations = 0
        self._alloc(capacity)

    def _alloc(self, T: int) -> None:
        cfg, be = self.model.cfg, self.model.be
        E, F, k, N = cfg.embed, cfg.expert_ffn, cfg.n_used, cfg.n_experts
        P = T * k
        # On demand: a real cudaMalloc whenever the scratch grows (ds4's growing scratch);
        # preallocated: from the backend's pool, once, before anything is captured.
        mk = be.malloc if self.model.opts.scratch == "on-demand" else be.empty
        self.logits = mk((T, N), np.float32)
        self.ids = mk((T, k), np.int32)
        self.wts = mk((T, k), np.float32)
        self.xq = mk((T, E), np.int8)
        self.xd = mk((T, E // 256), np.float32)
        self.gate = mk((P, F), np.float32)
        self.up = mk((P, F), np.float32)
        self.mq = mk((P, F), np.int8)
        self.md = mk((P, F // 256), np.float32)
        self.out = mk((P, E), np.float32)
        self.y = mk((T, E), np.float32)
        self.counts = mk((N,), np.int32)
        self.offsets = mk((N,), np.int32)
        self.cursor = mk((N,), np.int32)
        self.sorted = mk((P,), np.int32)
        self.max_tiles = max_tiles(P, N, MOE_TILE)
        self.tiles = mk((self.max_tiles, 3), np.int32)
        self.n_tiles = mk((1,), np.int32)
        self.capacity = T
        self.allocations += 1
        self.model.generation += 1

    def ensure(self, T: int) -> None:
        """Make room for ``T`` tokens: a no-op when preallocated large enough, else (re)allocate."""
        if T > self.capacity:
            if self.model.opts.scratch == "prealloc":
                raise ValueError(f"T={T} tokens exceed the preallocated MoE scratch "
                                 f"(max_tokens={self.capacity}); raise max_tokens")
            self._alloc(T)
