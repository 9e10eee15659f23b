"""Synthetic argument passes for the tests (no GPU): decode loops played through the stand-in CUPTI
(:mod:`fake_cupti`) with real parameter memory, so :mod:`ds4lab.audit.arguments` reads real bytes
through real pointers, and recorded with :func:`ds4lab.audit.arguments.recording`.

Every step, as a hand-written decoder would launch it:

* ``embed(ids, out)``: ``ids`` a static input buffer (the same address every token), ``out`` a
  temporary the step allocates and frees (a new address every token: harmless under the graph's pool);
* ``rope(x, pos)``: ``pos`` by value when the cache keeps its counter on the host (a frozen value),
  else the address of a device counter (the same every token);
* ``kv_write(slot, x)`` through ``cuLaunchKernel``: ``slot = cache + pos * 256`` when the write index
  is computed on the host (a ring-buffer slot into memory that exists before the tokens), else
  ``cache`` with the index read on the device;
* ``gemm(a, b)``: a runtime function whose CUDA runtime the capture cannot ask (unread) when
  ``unreadable`` is set;
* ``elementwise(out, calc)`` (``struct_of`` given): a TensorIterator-like kernel taking a 32-byte struct
  by value, its four 8-byte words ``struct_of(pos, token)`` (a rank that is set, slots left holding
  whatever the host stack held, a value the host computes).
"""

from __future__ import annotations

import os
import struct
from types import SimpleNamespace as R

import fake_cupti
from fake_cupti import ActivityKind as K

EMBED, ROPE, KV, GEMM, ELEM, FILL = 0x1000, 0x2000, 0xB000, 0x3000, 0x4000, 0x5000
CACHE, IDS, COUNTER = 0x7F00_0000_0000, 0x7F10_0000_0000, 0x7F20_0000_0000
TEMP = 0x7F30_0000_0000
LAYOUTS = {0xA000: [(0, 8), (8, 8)], 0xA100: [(0, 8), (8, 4)], KV: [(0, 8), (8, 8)], 0xA300: [(0, 8), (8, 8)],
           0xA400: [(0, 8), (8, 8)], 0xA500: [(0, 8), (8, 32)], 0xA600: [(0, 8), (8, 8)]}


def queries(unreadable: bool = False, rope_counter: bool = False):
    runtime = {EMBED: 0xA000, ROPE: 0xA400 if rope_counter else 0xA100, ELEM: 0xA500, FILL: 0xA600}
    if not unreadable:
        runtime[GEMM] = 0xA300
    return fake_cupti.FakeQueries(LAYOUTS, runtime, ranges=[(CACHE, 1 << 20), (IDS, 4096), (COUNTER, 512)])


def p64(v: int) -> bytes:
    return struct.pack("<Q", v)


def memory(m, op: int, addr: int, size: int) -> None:
    m.deliver([R(kind=K.MEMORY2, memory_operation_type=op, address=addr, bytes=size, timestamp=m.get_timestamp(),
                 device_id=0, stream_id=13, correlation_id=0, memory_kind=3)])


def marker(m, flags: int, name: str = "decode_step") -> None:
    m.deliver([R(kind=K.MARKER, flags_=flags, timestamp=m.get_timestamp(), id=7, name=name if flags == 2 else "",
                 domain="", object_id=R(pt=R(process_id=os.getpid(), thread_id=77)))])


FRESH = 0x7F40_0000_0000


def step(m, pos: int, token: int, *, host_counter: bool = True, host_slot: bool = True, gemm: bool = True,
         extra: bool = False, fresh_input: bool = False, slot_of=None, struct_of=None, fill_at=None) -> None:
    """One decode step at ``pos`` (module docstring); ``token`` picks the temporaries' addresses;
    ``fresh_input``: the token ids are a new buffer made between steps (not a static input); ``slot_of``:
    ``kv_write``'s first word as a function of the position (instead of the slot or the cache's base);
    ``struct_of``: ``elementwise``'s struct words as a function of (position, token) (None: no such launch);
    ``fill_at``: ``"head"`` or ``"middle"``: a ``fill(ids, pos)`` kernel writing the position into the static
    input buffer by value, first in the token or after ``embed``."""
    ids = IDS
    if fresh_input:  # made by the host between tokens, freed after the step
        ids = FRESH + token * 0x1000
        memory(m, 1, ids, 64)
    marker(m, 2)
    tmp = TEMP + token * 0x10000
    memory(m, 1, tmp, 4096)
    if fill_at == "head":
        m.launch("cudaLaunchKernel_v7000", FILL, [p64(IDS), p64(pos)], kernel="fill")
    m.launch("cudaLaunchKernel_v7000", EMBED, [p64(ids), p64(tmp)], kernel="embed")
    if fill_at == "middle":
        m.launch("cudaLaunchKernel_v7000", FILL, [p64(IDS), p64(pos)], kernel="fill")
    if host_counter:
        m.launch("cudaLaunchKernel_v7000", ROPE, [p64(tmp), struct.pack("<i", pos)], kernel="rope")
    else:
        m.launch("cudaLaunchKernel_v7000", ROPE, [p64(tmp), p64(COUNTER)], kernel="rope")
    slot = slot_of(pos) if slot_of is not None else CACHE + pos * 256 if host_slot else CACHE
    m.launch("cuLaunchKernel", KV, [p64(slot), p64(tmp)], domain="driver", kernel="kv_write", extra=extra)
    if gemm:
        m.launch("cudaLaunchKernel_v7000", GEMM, [p64(IDS), p64(CACHE)], kernel="gemm")
    if struct_of is not None:
        words = struct_of(pos, token)
        m.launch("cudaLaunchKernel_v7000", ELEM, [p64(tmp), b"".join(w if isinstance(w, bytes) else p64(w)
                                                                     for w in words)], kernel="elementwise")
    memory(m, 2, tmp, 4096)
    marker(m, 4)
    if fresh_input:
        memory(m, 2, ids, 64)
    m.call("cudaStreamSynchronize_v3020")
    m.clock += 50_000  # sampling on the host


def record(monkeypatch, tmp_path=None, *, tokens: int = 5, unreadable: bool = False, **kw):
    """An argument pass over ``tokens`` steps (positions 17, 18, …): the :class:`Recording` (saved to
    ``tmp_path/arguments.csv.gz`` with its store when ``tmp_path`` is given) and the fake."""
    from ds4lab.trace import arguments as A
    from ds4lab.audit import arguments as REC
    from ds4lab.trace import cupti as C

    m = fake_cupti.install(monkeypatch)
    monkeypatch.setattr(C, "current_context", lambda: 0x55)
    q = queries(unreadable, rope_counter=not kw.get("host_counter", True))
    monkeypatch.setattr(A, "CudaQueries", lambda: q)
    monkeypatch.setattr(A, "SKIP_FILES", (fake_cupti.__file__,))  # the fake plays the CUDA library's part
    with REC.recording(arguments=True, token_range="decode_step") as rec:
        if kw.get("fill_at"):  # the static input buffer the fill writes: allocated before the tokens
            memory(m, 1, IDS, 4096)
        m.launch("cudaLaunchKernel_v7000", EMBED, [p64(IDS), p64(TEMP)], kernel="embed")  # warm-up, outside
        for t in range(tokens):
            step(m, 17 + t, t, **kw)
    if tmp_path is not None:
        rec.save(tmp_path / "arguments.csv.gz")
    return rec, m, q


def tag_ops(rec, op_of_launch):
    """Give every launch of ``rec``'s argument pass an operator call of the op log: ``op_of_launch(token, kernel
    name)`` gives its fields (``t_ns`` 0 added). Returns the pass's store."""
    from ds4lab.audit import arguments as AA

    st = rec.arguments
    st.ops, st.op_of = {}, {}
    for t, launches in enumerate(AA.token_launches(rec.table(), "decode_step").tokens):
        for corr, kname, _ in launches:
            st.op_of[corr] = len(st.ops)
            st.ops[len(st.ops)] = {"t_ns": 0, **op_of_launch(t, kname)}
    return st

