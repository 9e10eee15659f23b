"""The simulated runtime's handles: streams (:class:`SimStream`), events (:class:`SimEvent`), graph nodes
(:class:`Node`) and capture sequences (:class:`CaptureSeq`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class SimStream:
    """A simulated stream. ``kind``: ``legacy``, ``blocking``, ``non_blocking`` or ``per_thread``."""

    __slots__ = ("id", "name", "kind", "ready_us", "capture", "tail", "__weakref__")

    def __init__(self, sid: int, name: str, kind: str) -> None:
        self.id, self.name, self.kind = sid, name, kind
        self.ready_us = 0.0  # modeled time its last eager work ends
        self.capture: CaptureSeq | None = None
        self.tail: tuple = ()  # node indices the next captured item depends on

    @property
    def blocking(self) -> bool:
        """Synchronises implicitly with the legacy stream (everything but non-blocking streams)."""
        return self.kind != "non_blocking"

    def __repr__(self) -> str:
        return f"<sim stream {self.name}>"


class SimEvent:
    """A simulated event: its last eager record (time, stream) and, if any, the capture it was last recorded in."""

    __slots__ = ("id", "name", "time_us", "stream", "capture", "tail")

    def __init__(self, eid: int, name: str) -> None:
        self.id, self.name = eid, name
        self.time_us: float | None = None  # None: never recorded eagerly
        self.stream: SimStream | None = None
        self.capture: CaptureSeq | None = None
        self.tail: tuple = ()

    def __repr__(self) -> str:
        return f"<sim event {self.name}>"


@dataclass
class Node:
    """One graph node: ``kind`` (kernel, memset, memcpy, mem_alloc, mem_free, graph), the work, its deps."""

    idx: int
    kind: str
    name: str
    fn: Callable[[], None] | None
    deps: tuple
    gpu_us: float
    stream: str
    info: Any = None  # the launch as issued (grid, block, args, shared, nbytes) or the child graph
    #: edge type per dependency, parallel to ``deps`` ("default", "programmatic"); empty: all default
    edges: tuple = ()


@dataclass
class CaptureSeq:
    """One capture sequence (``cudaStreamBeginCapture`` … ``cudaStreamEndCapture``)."""

    id: int
    mode: str
    thread: int
    origin: SimStream
    status: str = "active"  # active, invalidated, ended
    streams: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    why: str = ""  # the first invalidating call
    #: the graph the capture fills, once one is asked for (cudaStreamGetCaptureInfo) or given
    #: (cudaStreamBeginCaptureToGraph); its node list is ``nodes`` itself, and end_capture returns it
    graph: Any = None

    @property
    def live(self) -> bool:
        return self.status != "ended"
