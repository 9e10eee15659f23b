"""Launch sites tensor parallelism adds to the decode token (``kernels/tp.cu``), each with its NumPy reference, as
:mod:`ds4lab.token.ops` writes them."""

from __future__ import annotations

import numpy as np

from ..token import reference as R
from ..token.ops import NULL, cdiv

i32 = np.int32


def tp_expand(L, site, h, mix, y, extra, S: int, E: int) -> None:
    """``h[s] += post_s * (y + extra)`` after the reduction (``h`` float32 ``[S, E]``, ``mix`` the mixing logits
    ``[2S]``, ``y`` and ``extra`` or None float32 ``[E]``): the epilogue of ``q8_matvec_expand``, bit for bit."""

    def ref():
        h[...] = R.expand(h, mix, np.asarray(y).reshape(-1)[:E],
                          None if extra is None else np.asarray(extra).reshape(-1)[:E])

    L.kernel(site, "tp_expand", (cdiv(E, 256), S), (256,),
             (h, mix, y, NULL if extra is None else extra, i32(E), i32(S)), ref, nbytes=4 * (2 * S * E + 2 * E + 2 * S))


def tp_localize_ids(L, site, ids, out, lo: int, n_local: int, P: int) -> None:
    """The router's expert ids ``ids`` (int32, ``P``) as the rank holding experts ``lo .. lo + n_local - 1`` numbers
    them: ``id - lo`` there, ``-1`` (adds nothing) elsewhere."""

    def ref():
        e = np.asarray(ids).reshape(-1)[:P].astype(np.int64) - lo
        out.reshape(-1)[:P] = np.where((e >= 0) & (e < n_local), e, -1).astype(np.int32)

    L.kernel(site, "tp_localize_ids", (cdiv(P, 256),), (256,), (ids, out, i32(lo), i32(n_local), i32(P)), ref,
             nbytes=8 * P)


def tp_add2(L, site, a, b, out, n: int) -> None:
    """``out = a + b`` in float32 (ds4's peer path: rank 0's partial sum first, on every rank; for two ranks the same
    bits as NCCL's sum)."""

    def ref():
        out.reshape(-1)[:n] = np.asarray(a, dtype=np.float32).reshape(-1)[:n] + np.asarray(b, dtype=np.float32).reshape(-1)[:n]

    L.kernel(site, "tp_add2", (cdiv(n, 256),), (256,), (a, b, out, i32(n)), ref, nbytes=12 * n)


__all__ = ["tp_add2", "tp_expand", "tp_localize_ids"]
