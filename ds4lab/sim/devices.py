"""Several simulated devices in one process: peer copies and NCCL collectives (tensor parallelism).

:class:`SimNode` holds one :class:`SimDeviceBackend` per device (each its own :class:`DeviceRuntime`); capture modes
and the unsafe-call rule are shared. :class:`SimComm` is one rank's ``ncclAllReduce``; a mismatch, a non-uniform
capture or a peer that never arrives is raised on every rank concerned. Costs: :class:`LinkModel` (GUESS). The rules
and the model: ``docs/tensor-parallel.md``, "The sim learns two devices"."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..capture.stream import LEGACY_STREAM
from ..errors import CollectiveError, CudaError
from ..executor.base import check_all_reduce
from .backend import SimBackend
from .costmodel import Calibration
from .objects import SimStream
from .rules import RULES
from .runtime import Runtime


@dataclass(frozen=True)
class LinkModel:
    """Modeled costs between two devices (GUESS until measured): ``peer_fixed_us`` and ``peer_GBps`` of one peer copy,
    ``nccl_fixed_us`` and ``nccl_GBps`` (bus bandwidth) of one all-reduce."""

    peer_fixed_us: float = 3.0
    peer_GBps: float = 300.0
    nccl_fixed_us: float = 8.0
    nccl_GBps: float = 200.0

    def peer_us(self, nbytes: int) -> float:
        """Device time of a peer copy of ``nbytes``."""
        return self.peer_fixed_us + nbytes / (self.peer_GBps * 1e3)

    def allreduce_us(self, nbytes: int, world: int) -> float:
        """Device time of an all-reduce of ``nbytes`` per rank over ``world`` ranks (a ring moves ``2 (world - 1) /
        world`` of the buffer per rank)."""
        return self.nccl_fixed_us + 2.0 * (world - 1) / world * nbytes / (self.nccl_GBps * 1e3)


class DeviceRuntime(Runtime):
    """The runtime of one device of a :class:`SimNode` (see module docstring): streams are the device's own; thread
    modes and the unsafe-call rule are the process's."""

    def __init__(self, cal: Calibration, node: "SimNode", device: int, **kw) -> None:
        super().__init__(cal, **kw)
        self.node = node
        self.device = device
        self._thread_mode = node._thread_mode  # per thread, shared by every device (one process)

    def _stream(self, stream: Any, call: str) -> SimStream:
        s = super()._stream(stream, call)
        if s is not self.legacy and s not in self._all:
            raise CudaError("cudaErrorInvalidResourceHandle", call,
                            f"{s.name} belongs to another device than device {self.device}")
        return s

    def new_stream(self, non_blocking: bool = True, name: str | None = None) -> SimStream:
        """As :meth:`Runtime.new_stream`, the device in the stream's name (``d1:s7``)."""
        s = super().new_stream(non_blocking, name)
        if name is None:
            s.name = f"d{self.device}:{s.name}"
        return s

    def _process_live(self) -> list:
        return self.node.all_live()  # the unsafe-call rule is the process's, whatever device a thread captures on


class SimDeviceBackend(SimBackend):
    """A :class:`~ds4lab.sim.backend.SimBackend` that is device ``device`` of ``node`` (its runtime a
    :class:`DeviceRuntime`). Everything else is the sim backend's."""

    def __init__(self, node: "SimNode", device: int, *, seed: int = 1234, timing_only: bool = False,
                 calibration=None, invalidated_ops: str = "raise") -> None:
        super().__init__(seed=seed, timing_only=timing_only, calibration=calibration,
                         invalidated_ops=invalidated_ops)
        self.node = node
        self.device = device
        self.rt = DeviceRuntime(self.cal, node, device, compute=not self.timing_only,
                                invalidated_ops=invalidated_ops)

    def info(self) -> dict:
        """As :meth:`SimBackend.info`, with the device's index among the node's."""
        d = super().info()
        d.update(device=f"simulated GPU {self.device} of {len(self.node.devices)} (calibration: {self.cal.name})",
                 device_index=self.device)
        return d


# ----------------------------------------------------------------------------- collectives
@dataclass
class _Arrival:
    sig: tuple
    graph: bool
    send: Any
    recv: Any
    t_us: float


@dataclass
class _Slot:
    """The k-th collective of a communicator: who arrived, and how it ended."""

    arrivals: dict = field(default_factory=dict)
    done: bool = False
    start_us: float = 0.0
    error: tuple | None = None  # (rule, error name, detail)


class SimCommGroup:
    """The shared state of one communicator's ranks (``ncclCommInitAll``): the slots collectives meet in, each rank's
    execution count, and whether an earlier failure broke the communicator."""

    def __init__(self, node: "SimNode", world: int) -> None:
        self.node = node
        self.world = world
        self.cond = threading.Condition()
        self.slots: dict[int, _Slot] = {}
        self.executed = [0] * world
        #: the first failure, after which every collective raises (as after ncclCommAbort)
        self.broken: tuple | None = None
        #: every pairing decided: ``(k, {rank: (sig, graph)}, outcome)`` for the audit and the tests
        self.log: list[tuple] = []

    def meet(self, rank: int, sig: tuple, graph: bool, send, recv, t_us: float, rt: Runtime, call: str) -> float:
        """Rank ``rank`` executes its next collective and waits for every rank's of the same position (rules nccl_pair,
        nccl_mismatch, nccl_nonuniform, nccl_timeout); returns the modeled start time. Raises CollectiveError:
        ``nccl:mismatch``, ``nccl:nonuniform-capture`` or ``nccl:timeout`` (also for every collective after the
        communicator broke)."""
        timeout = self.node.collective_timeout_s
        with self.cond:
            if self.broken is not None:
                rule, name, detail = self.broken
                rt._applied(rule, call)
                raise CollectiveError(name, call, f"rank {rank}: communicator broken earlier: {detail}")
            k = self.executed[rank]
            self.executed[rank] += 1
            slot = self.slots.setdefault(k, _Slot())
            slot.arrivals[rank] = _Arrival(sig, graph, send, recv, t_us)
            if len(slot.arrivals) == self.world:
                self._decide(k, slot)
                self.cond.notify_all()
            deadline = time.monotonic() + timeout
            while not slot.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = sorted(set(range(self.world)) - set(slot.arrivals))
                    detail = (f"rank {rank}'s collective #{k} ({_describe(sig, graph)}) waited {timeout:g} s for "
                              f"rank(s) {', '.join(map(str, waiting))}: on a GPU the stream never completes")
                    slot.done, slot.error = True, ("nccl_timeout", "nccl:timeout", detail)
                    self.broken = slot.error
                    self.log.append((k, {r: (a.sig, a.graph) for r, a in slot.arrivals.items()}, "nccl:timeout"))
                    self.cond.notify_all()
                    break
                self.cond.wait(left)
            if slot.error is not None:
                rule, name, detail = slot.error
                rt._applied(rule, call)
                raise CollectiveError(name, call, detail)
            rt._applied("nccl_pair", call)
            return slot.start_us

    def _decide(self, k: int, slot: _Slot) -> None:
        arr = slot.arrivals
        desc = "; ".join(f"rank {r}: {_describe(a.sig, a.graph)}" for r, a in sorted(arr.items()))
        if len({a.sig for a in arr.values()}) > 1:
            slot.error = ("nccl_mismatch", "nccl:mismatch",
                          f"collective #{k} differs between the ranks ({desc}): NCCL matches collectives in the "
                          "order each rank executes them; a GPU hangs or computes wrong data")
        elif len({a.graph for a in arr.values()}) > 1:
            slot.error = ("nccl_nonuniform", "nccl:nonuniform-capture",
                          f"collective #{k} is launched from a graph on some ranks and eagerly on others ({desc}): "
                          "NCCL requires graph capture to be uniform over the ranks; modeled as never completing")
        else:
            if not self.node.timing_only:
                acc = np.array(arr[0].send, dtype=np.float32, copy=True).reshape(-1)
                for r in range(1, self.world):
                    acc += np.asarray(arr[r].send, dtype=np.float32).reshape(-1)
                for a in arr.values():
                    a.recv[...] = acc.reshape(a.recv.shape)
            slot.start_us = max(a.t_us for a in arr.values())
        if slot.error is not None:
            self.broken = slot.error
        self.log.append((k, {r: (a.sig, a.graph) for r, a in arr.items()}, slot.error[1] if slot.error else "ok"))
        slot.done = True


def _describe(sig: tuple, graph: bool) -> str:
    op, red, dtype, count = sig
    return f"{op}({red}) of {count} {dtype}, {'from a graph' if graph else 'eager'}"


#: The name the sim gives an all-reduce's kernel, as NCCL names its float32 sum (``ncclDevKernel_<Op>_...``).
NCCL_KERNEL_NAME = "ncclDevKernel_AllReduce_Sum_f32"


class SimComm:
    """One rank's NCCL communicator (``ncclComm_t``) on the sim: :meth:`all_reduce` on its device."""

    def __init__(self, group: SimCommGroup, rank: int, backend: SimDeviceBackend) -> None:
        self.group, self.rank, self.be = group, rank, backend

    @property
    def world(self) -> int:
        """The communicator's number of ranks."""
        return self.group.world

    def all_reduce(self, send, recv, stream, op: str = "sum") -> None:
        """``ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream)`` (``recv`` may be ``send``).

        Eager: executes now (:meth:`SimCommGroup.meet`); captured: a kernel node (rule nccl_capture).

        Raises:
            ValueError: another element type than float32, or sizes that differ.
            CollectiveError: rule nccl_global_multithread, or how the collective ended (meet).
            CudaError: a stream of another device; legacy_implicit; after_invalidation."""
        call = "ncclAllReduce"
        check_all_reduce(send, recv, op)
        rt = self.be.rt
        sig = ("allreduce", op, "float32", int(send.size))
        dur = self.group.node.link.allreduce_us(int(send.nbytes), self.world)
        with rt.lock:
            s = rt._stream(stream, call)
            self.group.node._nccl_mode_rule(rt, call)
            if s.capture is not None:
                def replay():
                    start = self.group.meet(self.rank, sig, True, send, recv, rt.dev.free_us, rt, call)
                    rt.dev.free_us = max(rt.dev.free_us, start)  # the node starts when every rank is there

                rt.enqueue(s, "kernel", NCCL_KERNEL_NAME, replay, dur, call, info=("nccl", sig))
                rt._applied("nccl_capture", call)
                return
            if s is rt.legacy and rt.live:
                rt._legacy_use(call)  # raises while a blocking stream captures
                rt.escapes.append((call, "ncclAllReduce"))
                rt._applied("legacy_escape", call)
            elif rt.live:
                rt._applied("uncaptured_stream", call)
            submit = rt.dev.host(rt.cal.host_launch_us)
            earliest = rt._earliest(s, submit)
        start = self.group.meet(self.rank, sig, False, send, recv, earliest, rt, call)  # outside the lock: blocks
        with rt.lock:
            _, s.ready_us = rt.dev.run(s.name, NCCL_KERNEL_NAME, start, dur, "kernel")


def _check_contiguous(call: str, dst, src) -> None:
    if not (getattr(dst, "flags", None) is None or dst.flags.c_contiguous) or \
            not (getattr(src, "flags", None) is None or src.flags.c_contiguous):
        raise ValueError(f"{call}: the sim copies contiguous buffers only")


def _copy_bytes(dst, src) -> None:
    """``dst``'s bytes become ``src``'s (both C-contiguous, the same size)."""
    dst.reshape(-1).view(np.uint8)[...] = np.asarray(src).reshape(-1).view(np.uint8)


# ----------------------------------------------------------------------------- the node
class SimNode:
    """One host with ``n_devices`` simulated GPUs in one process (see module docstring).

    ``seed``, ``timing_only``, ``calibration``, ``invalidated_ops``: as :class:`~ds4lab.sim.backend.SimBackend`, for
    every device; ``collective_timeout_s``: host seconds a collective waits for its peers before ``nccl:timeout``;
    ``link``: :class:`LinkModel`. Raises ValueError: ``n_devices < 1`` or a timeout that is not positive."""

    name = "sim"

    def __init__(self, n_devices: int = 2, *, seed: int = 1234, timing_only: bool = False, calibration=None,
                 invalidated_ops: str = "raise", collective_timeout_s: float = 5.0,
                 link: LinkModel | None = None) -> None:
        if n_devices < 1:
            raise ValueError(f"n_devices={n_devices} must be >= 1")
        if not collective_timeout_s > 0:
            raise ValueError(f"collective_timeout_s={collective_timeout_s} must be > 0")
        self._thread_mode: dict[int, str] = {}
        self.timing_only = bool(timing_only)
        self.collective_timeout_s = float(collective_timeout_s)
        self.link = link or LinkModel()
        cal = Calibration.load(calibration)
        self.devices = [SimDeviceBackend(self, d, seed=seed, timing_only=timing_only, calibration=cal,
                                         invalidated_ops=invalidated_ops) for d in range(n_devices)]
        self.peer_access: set[tuple[int, int]] = set()
        self.groups: list[SimCommGroup] = []

    # ------------------------------------------------------------------ devices
    @property
    def n_devices(self) -> int:
        """How many devices the node has."""
        return len(self.devices)

    def backend(self, device: int) -> SimDeviceBackend:
        """Device ``device``'s backend (raises IndexError naming the devices there are)."""
        if not 0 <= device < len(self.devices):
            raise IndexError(f"device {device}: the node has devices 0..{len(self.devices) - 1}")
        return self.devices[device]

    def all_live(self) -> list:
        """Every live capture (active or invalidated) on every device."""
        return [q for be in self.devices for q in list(be.rt.live)]

    def on_device(self, device: int):
        """Make ``device`` the calling thread's current device (``cudaSetDevice``): nothing to do on the sim, where
        every call names its backend. Returns the backend."""
        return self.backend(device)

    def can_access_peer(self, device: int, peer: int) -> bool:
        """``cudaDeviceCanAccessPeer``: True between two distinct devices of the node."""
        self.backend(device), self.backend(peer)
        return device != peer

    def enable_peer_access(self, device: int, peer: int) -> None:
        """``cudaDeviceEnablePeerAccess(peer)`` on ``device``. Raises CudaError: cudaErrorPeerAccessAlreadyEnabled the
        second time, cudaErrorInvalidDevice for ``device == peer``."""
        call = "cudaDeviceEnablePeerAccess"
        if not self.can_access_peer(device, peer):
            raise CudaError("cudaErrorInvalidDevice", call, f"device {device} cannot access itself as a peer")
        if (device, peer) in self.peer_access:
            raise CudaError("cudaErrorPeerAccessAlreadyEnabled", call, f"device {device} → {peer}")
        self.backend(device).rt.host_query(call)
        self.peer_access.add((device, peer))

    # ------------------------------------------------------------------ peer copies
    def memcpy_peer_async(self, dst, dst_device: int, src, src_device: int, stream, device: int) -> None:
        """``cudaMemcpyPeerAsync`` on ``stream`` of ``device`` (either end): stream-ordered (rule peer_copy), a
        memcpy node when captured (rule peer_copy_capture, GUESS).

        Raises:
            ValueError: sizes differ, or ``device`` is neither end of the copy.
            CudaError: a stream of another device (cudaErrorInvalidResourceHandle), capture rules."""
        call = "cudaMemcpyPeerAsync"
        if dst.nbytes != src.nbytes:
            raise ValueError(f"{call}: {src.nbytes} bytes into a {dst.nbytes}-byte buffer")
        if device not in (dst_device, src_device):
            raise ValueError(f"{call}: the stream's device {device} is neither the source {src_device} nor the "
                             f"destination {dst_device}")
        self.backend(dst_device), self.backend(src_device)
        rt = self.backend(device).rt

        _check_contiguous(call, dst, src)

        def fn():
            _copy_bytes(dst, src)

        with rt.lock:
            s = rt._stream(stream, call)
            capturing = s.capture is not None
            rt.enqueue(s, "memcpy", "memcpy PtoP", None if self.timing_only else fn,
                       self.link.peer_us(int(src.nbytes)), call, rt.cal.host_api_us, (dst, src))
            rt._applied("peer_copy_capture" if capturing else "peer_copy", call)

    def memcpy_peer(self, dst, dst_device: int, src, src_device: int) -> None:
        """``cudaMemcpyPeer``: serialized with all work of both devices; the host waits. During a capture on either
        device: rules memcpy_peer_implicit and memcpy_peer_escape.

        Raises:
            ValueError: sizes differ.
            CudaError: cudaErrorStreamCaptureImplicit (rule memcpy_peer_implicit)."""
        call = "cudaMemcpyPeer"
        if dst.nbytes != src.nbytes:
            raise ValueError(f"{call}: {src.nbytes} bytes into a {dst.nbytes}-byte buffer")
        # the source device's captures first (the caller's own, in ds4's reduction), then the destination's
        rts = [self.backend(d).rt for d in dict.fromkeys((src_device, dst_device))]
        for rt in rts:
            bad = [q for q in rt.live if any(m.blocking for m in q.streams)]
            if bad:
                rt._fail("memcpy_peer_implicit", call, bad,
                         f"device {rt.device}: {bad[0].origin.name} (blocking) captures; cudaMemcpyPeer is "
                         "serialized with all of that device's work")
        for rt in rts:
            if rt.live:
                rt.escapes.append((call, "memcpy PtoP"))
                rt._applied("memcpy_peer_escape", call)
        _check_contiguous(call, dst, src)
        if not self.timing_only:
            _copy_bytes(dst, src)
        # serialized with every stream of both devices: it starts when they are all idle, and they wait for it
        start = max(max([r.dev.free_us, r.dev.host_us] + [st.ready_us for st in list(r._all)]) for r in rts)
        end = start + self.link.peer_us(int(src.nbytes))
        for rt in rts:
            with rt.lock:
                rt.dev.host(rt.cal.host_api_us)
                rt.dev.run(rt.legacy.name, "memcpy PtoP", start, end - start, "memcpy", occupies=False)
                for st in list(rt._all):
                    st.ready_us = max(st.ready_us, end)
                rt.dev.free_us = max(rt.dev.free_us, end)
        self.backend(src_device).rt.dev.wait_host(end)  # the calling thread's clock (GUESS: the source's)

    def wait_stream(self, device: int, stream, timeout_s: float | None = None) -> None:
        """``cudaStreamSynchronize`` of ``stream`` on ``device`` (a collective that never completes has raised already,
        in the call that executed it)."""
        self.backend(device).stream_synchronize(stream)

    def abort_all(self) -> list[str]:
        """``ncclCommAbort`` on every communicator: each breaks (its later collectives raise). Returns []."""
        for g in self.groups:
            with g.cond:
                if g.broken is None:
                    g.broken = ("nccl_timeout", "nccl:timeout", "the communicator was aborted")
                g.cond.notify_all()
        return []

    def close(self) -> list[str]:
        """Release the communicators (nothing to free on the sim). Returns []."""
        self.groups.clear()
        return []

    def __enter__(self) -> "SimNode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ NCCL
    def comm_init_all(self, devices: list[int] | None = None) -> list[SimComm]:
        """``ncclCommInitAll``: one communicator per device (rank = position in ``devices``, default every device of
        the node). Raises ValueError for a device named twice (NCCL: one rank per device)."""
        devs = list(range(self.n_devices)) if devices is None else list(devices)
        if len(set(devs)) != len(devs):
            raise ValueError(f"comm_init_all: devices {devs} name a device twice (NCCL: one rank per device)")
        g = SimCommGroup(self, len(devs))
        self.groups.append(g)
        return [SimComm(g, r, self.backend(d)) for r, d in enumerate(devs)]

    def _nccl_mode_rule(self, rt: DeviceRuntime, call: str) -> None:
        """Rule nccl_global_multithread for an NCCL call by the calling thread."""
        tid = rt._tid()
        if self._thread_mode.get(tid, "global") != "global":
            return
        other = [q for q in self.all_live() if q.thread != tid and q.mode == "global" and q.status == "active"]
        if other:
            rt._fail("nccl_global_multithread", call, other,
                     f"another thread has a global-mode capture on {other[0].origin.name}")

    def info(self) -> dict:
        """Provenance: the devices, and that every figure is MODELED."""
        return {"backend": self.name, "devices": [be.info() for be in self.devices], "modeled": True,
                "link": self.link.__dict__, "collective_timeout_s": self.collective_timeout_s}


__all__ = ["DeviceRuntime", "LinkModel", "SimComm", "SimCommGroup", "SimDeviceBackend", "SimNode", "RULES",
           "LEGACY_STREAM"]
