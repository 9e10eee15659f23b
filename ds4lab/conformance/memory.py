"""Scenarios of host memory during a capture: asynchronous copies from and to pageable and pinned host memory on the
capturing stream, synchronous ``cudaMemcpy`` in both directions, and allocating or registering pinned host memory.
The audit (``ds4lab audit``) gives these calls their verdicts from the sim's rules; every scenario here ran on the
H200 and agreed with the sim (round3's record)."""

from __future__ import annotations

import numpy as np

from ..capture import stream as S
from .framework import (MODES, N, Recorder, _buf, _capture, _replay, call_in_capture, f32, refused_unless_relaxed,
                        scenario)

#: the H200 run that decided these scenarios' rules (0 disagreements with the sim)
_R3 = "H200 conformance 2026-12-01 (docs/measurements/h200-2026-12-01/round3)"

_ESCAPE = ("rule legacy_escape; " + _R3 + ": a synchronous cudaMemcpy runs on the legacy stream at once while a "
           "non-blocking stream captures, and is not in the graph")


def host_value(r: Recorder, step: str, arr: np.ndarray) -> None:
    """Record a host array's values as :meth:`Recorder.value` records a device buffer's."""
    r.be.synchronize()
    h = np.asarray(arr, dtype=np.float64).reshape(-1)
    r.note(step, f"{h[0]:g}" if np.all(h == h[0]) else "[" + " ".join(f"{v:g}" for v in h[:4]) + " ...]")


@scenario("host-to-device cudaMemcpyAsync from pageable memory on the capturing stream; replay reads the host "
          "memory then", MODES,
          expect={"copy_h2d": "ok", "end_capture": "ok", "nodes": "memcpyx1", "x_after_capture": "0",
                  "x_after_replay": "7"},
          source="H200 conformance 2026-11-30 (h2d_pageable_in_capture, relaxed): one memcpy node; " + _R3 + ": every "
                 "mode alike, and a replay copies what the host memory holds at the replay")
def h2d_async_pageable(r: Recorder, mode: str) -> None:
    """A pageable host array copied on the capturing stream, then rewritten on the host: what the replay copies is what
    that memory holds at the replay (the graph keeps the address)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    h = np.full(N, 4.0, dtype=f32)
    g = _capture(r, s, mode, lambda: r.call("copy_h2d", be.copy_h2d, s, x, h))
    r.value("x_after_capture", x)
    r.nodes("nodes", g)
    h[:] = 7.0
    _replay(r, g, s)
    r.value("x_after_replay", x)


@scenario("device-to-host cudaMemcpyAsync into pageable memory on the capturing stream", MODES,
          expect={"copy_d2h": "ok", "end_capture": "ok", "nodes": "memcpyx1", "h_after_capture": "0",
                  "h_after_replay": "5"},
          source="rule capture_node; " + _R3 + ": a device-to-host copy into pageable memory on the capturing "
                 "stream is "
                 "a memcpy node, as the host-to-device one is; each replay writes the host array")
def d2h_async_pageable(r: Recorder, mode: str) -> None:
    """A device buffer copied into a pageable host array on the capturing stream: not executed at capture; each replay
    writes the host array."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 3.0)
    h = np.zeros(N, dtype=f32)
    g = _capture(r, s, mode, lambda: r.call("copy_d2h", be.copy_d2h, s, h, x))
    host_value(r, "h_after_capture", h)
    r.nodes("nodes", g)
    r.fill("refill_x", x, 5.0, S.LEGACY_STREAM)
    _replay(r, g, s)
    host_value(r, "h_after_replay", h)


@scenario("copies from and to pinned host memory (cudaHostAlloc before the capture) on the capturing stream", MODES,
          expect={"copy_h2d": "ok", "copy_d2h": "ok", "end_capture": "ok", "nodes": "memcpyx2", "x_after_replay": "9",
                  "h_out_after_replay": "9"},
          source="PG 'Stream Capture' (work into a capturing stream becomes nodes: rule capture_node); RT "
                 "cudaMemcpyAsync (pinned memory: asynchronous)")
def pinned_copies(r: Recorder, mode: str) -> None:
    """Pinned host memory in and out of the captured graph: both copies are nodes and replay."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r)
    h_in = be.host_alloc((N,), f32)
    h_out = be.host_alloc((N,), f32)
    h_in[:] = 2.0
    g = _capture(r, s, mode, lambda: (r.call("copy_h2d", be.copy_h2d, s, x, h_in),
                                      r.call("copy_d2h", be.copy_d2h, s, h_out, x)))
    r.nodes("nodes", g)
    h_in[:] = 9.0
    _replay(r, g, s)
    r.value("x_after_replay", x)
    host_value(r, "h_out_after_replay", h_out)
    be.free_host(h_in)
    be.free_host(h_out)


def _sync_copy(r: Recorder, mode: str, h2d: bool) -> None:
    """A synchronous cudaMemcpy during a capture, then a replay: the copy's target as it was left by the capture
    (``*_after_capture``) and after the replay (``*_after_replay``)."""
    be = r.be
    s = be.new_stream(non_blocking=True)
    x = _buf(r, 0.0 if h2d else 3.0)
    y = _buf(r, 1.0)
    h = np.full(N, 6.0, dtype=f32) if h2d else np.zeros(N, dtype=f32)
    copy = (lambda: be.memcpy_h2d_sync(x, h)) if h2d else (lambda: be.memcpy_d2h_sync(h, x))
    g = _capture(r, s, mode, lambda: (r.call("memcpy_sync", copy), r.add("add_y", y, s)))
    after = (lambda step: r.value(step, x)) if h2d else (lambda step: host_value(r, step, h))
    after("x_after_capture" if h2d else "h_after_capture")
    r.nodes("nodes", g)
    if h2d:
        r.fill("refill_x", x, 5.0, S.LEGACY_STREAM)
    else:
        h[:] = 0.0
    _replay(r, g, s)
    after("x_after_replay" if h2d else "h_after_replay")


@scenario("synchronous cudaMemcpy host to device while a non-blocking stream captures", MODES,
          expect={"memcpy_sync": "ok", "end_capture": "ok", "nodes": "kernel:tiny_addx1", "x_after_capture": "6",
                  "x_after_replay": "5"},
          source=_ESCAPE)
def memcpy_sync_h2d_in_capture(r: Recorder, mode: str) -> None:
    """cudaMemcpy (host to device) during the capture: it runs now on the legacy stream; the replay does not copy
    again."""
    _sync_copy(r, mode, h2d=True)


@scenario("synchronous cudaMemcpy device to host while a non-blocking stream captures", MODES,
          expect={"memcpy_sync": "ok", "end_capture": "ok", "nodes": "kernel:tiny_addx1", "h_after_capture": "3",
                  "h_after_replay": "0"},
          source=_ESCAPE)
def memcpy_sync_d2h_in_capture(r: Recorder, mode: str) -> None:
    """cudaMemcpy (device to host) during the capture reads now, before any captured work ran; the replay does not read
    again."""
    _sync_copy(r, mode, h2d=False)


_UNSAFE = ("rule unsafe_host_call; " + _R3 + ": potentially unsafe as cudaMalloc is (RT "
           "cudaThreadExchangeStreamCaptureMode): refused and invalidating in global and thread-local mode, "
           "allowed in relaxed")


@scenario("pinned host allocation (cudaHostAlloc) inside a capture", MODES, expect=refused_unless_relaxed("host_alloc"),
          source=_UNSAFE)
def host_alloc_in_capture(r: Recorder, mode: str) -> None:
    """cudaHostAlloc while this thread captures."""
    call_in_capture(r, mode, "host_alloc", r.be.host_alloc, (N,), f32, release=r.be.free_host)


@scenario("host memory registration (cudaHostRegister) inside a capture", MODES,
          expect=refused_unless_relaxed("host_register"), source=_UNSAFE)
def host_register_in_capture(r: Recorder, mode: str) -> None:
    """cudaHostRegister of an ordinary host array while this thread captures."""
    h = np.zeros(N * 16, dtype=f32)  # 64 KiB: a whole number of pages on common page sizes
    call_in_capture(r, mode, "host_register", r.be.host_register, h, release=lambda _: r.be.host_unregister(h))
