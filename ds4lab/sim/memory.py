"""Simulated device memory: an arena allocator with exact-size LIFO reuse (a freed-and-reallocated buffer gets the
same memory, as on a GPU), and read-only phantom arrays for timing-only runs. Why: ``docs/sim.md``, "Device memory"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Allocation granularity in bytes (cudaMalloc returns 256-byte aligned pointers).
ALIGN = 256
#: Size of a fresh arena chunk (a bigger request gets a chunk of its own size).
CHUNK_BYTES = 16 << 20
#: Fake base address of the first chunk (so addresses look like device pointers, never 0).
BASE_ADDRESS = 0x7F0000000000


def phantom(shape, dtype) -> np.ndarray:
    """A read-only array with ``shape``/``dtype``/``nbytes`` of a real one and no memory behind it."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def is_phantom(a) -> bool:
    """True for an array made by :func:`phantom` (a zero-stride broadcast of one element)."""
    return isinstance(a, np.ndarray) and a.size > 1 and not a.flags.writeable and all(s == 0 for s in a.strides)


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN` (at least one unit: a 0-byte malloc still gets an address)."""
    return max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)


@dataclass
class Block:
    """One allocation: where it lives and whether it is live."""

    addr: int
    size: int  # aligned bytes
    chunk: int
    offset: int
    live: bool = True
    owner: str = ""  # who allocated it: "malloc", "empty", "graph:<id>", ...


class ArenaError(ValueError):
    """A bad free (unknown or already freed pointer); the backend maps it to cudaErrorInvalidValue."""


class Arena:
    """Chunked bump allocator with exact-size LIFO reuse (see module docstring).

    Not thread-safe by itself: the runtime calls it under its own lock."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = int(chunk_bytes)
        self.chunks: list[np.ndarray] = []
        self._chunk_base: list[int] = []
        self._top = 0  # bump offset in the last chunk
        self._free: dict[int, list[Block]] = {}
        self._blocks: dict[int, Block] = {}  # addr -> block
        self.live_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0

    # ------------------------------------------------------------------ allocation
    def _new_chunk(self, size: int) -> None:
        base = BASE_ADDRESS if not self.chunks else self._chunk_base[-1] + self.chunks[-1].nbytes + (1 << 20)
        self.chunks.append(np.empty(max(size, self.chunk_bytes), dtype=np.uint8))
        self._chunk_base.append(base)
        self._top = 0

    def alloc(self, nbytes: int, owner: str = "") -> Block:
        """A block of at least ``nbytes``: the last freed block of that aligned size, else fresh memory."""
        size = aligned(nbytes)
        bin_ = self._free.get(size)
        if bin_:
            b = bin_.pop()
            b.live, b.owner = True, owner
        else:
            if not self.chunks or self._top + size > self.chunks[-1].nbytes:
                self._new_chunk(size)
            ci = len(self.chunks) - 1
            b = Block(self._chunk_base[ci] + self._top, size, ci, self._top, True, owner)
            self._top += size
            self._blocks[b.addr] = b
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.allocations += 1
        return b

    def free(self, addr: int) -> Block:
        """Return the block at ``addr`` to its size bin. Raises :class:`ArenaError` on a bad pointer."""
        b = self._blocks.get(addr)
        if b is None:
            raise ArenaError(f"pointer {addr:#x} was not allocated by this arena")
        if not b.live:
            raise ArenaError(f"pointer {addr:#x} was already freed")
        b.live = False
        self.live_bytes -= b.size
        self._free.setdefault(b.size, []).append(b)
        return b

    # ------------------------------------------------------------------ views
    def view(self, b: Block, shape, dtype) -> np.ndarray:
        """The block as an array of ``shape``/``dtype`` (a view: no copy, shares the arena's memory)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) if shape != () else 1
        raw = self.chunks[b.chunk][b.offset: b.offset + n * dt.itemsize]
        return raw.view(dt).reshape(shape)

    def block_of(self, a: np.ndarray) -> Block | None:
        """The block whose memory starts at ``a``'s data pointer (None when ``a`` is not an arena array)."""
        addr = self.address(a)
        return None if addr is None else self._blocks.get(addr)

    def address(self, a: np.ndarray) -> int | None:
        """The simulated device address of ``a``'s first byte (None when not in the arena)."""
        if not isinstance(a, np.ndarray):
            return None
        ptr = a.__array_interface__["data"][0]
        for ci, c in enumerate(self.chunks):
            base = c.__array_interface__["data"][0]
            if base <= ptr < base + c.nbytes:
                return self._chunk_base[ci] + (ptr - base)
        return None
