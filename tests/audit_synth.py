"""Synthetic event tables for the audit's tests: a host thread that issues API calls and a device
that runs their work, on one clock, as CUPTI or Nsight Systems would record them (rows of
:data:`ds4lab.trace.events.COLUMNS`, built with :func:`ds4lab.trace.events.make_frame`).

The host clock advances by each call's duration plus the gap before it; device work starts no
earlier than its call's end and the device's previous work (one queue); a synchronizing call waits
for the device. Durations come from the caller (drawn from the ``rng`` fixture in the tests).
"""

from __future__ import annotations

from ds4lab.trace.events import EventTable, make_frame


class TraceBuilder:
    """Builds one process's trace on one device (``pid``, ``tid``, ``device``)."""

    def __init__(self, pid: int = 100, tid: int = 1, device: int = 0, stream: int = 7, t0: int = 1_000_000,
                 corr0: int = 0) -> None:
        self.pid, self.tid, self.device, self.stream = pid, tid, device, stream
        self.t = t0          # host clock (ns)
        self.dev_t = t0      # when the device is free (ns)
        self.corr = corr0    # correlation ids are unique within a process (CUPTI)
        self.rows: list[dict] = []
        self.nvtx_open: list[tuple] = []

    # ------------------------------------------------------------------ host calls
    def _api(self, name: str, dur: int, gap: int, stream: int = -1, tid: int | None = None, **kw) -> dict:
        self.t += gap
        row = {"kind": "api", "name": name, "domain": "runtime", "pid": self.pid, "tid": self.tid if tid is None else tid,
               "stream": stream, "start_ns": self.t, "end_ns": self.t + dur,
               "nvtx_path": "/".join(n for n, _ in self.nvtx_open), **kw}
        self.t += dur
        self.rows.append(row)
        return row

    def launch(self, kernel: str, us: float = 2.0, *, stream: int | None = None, grid: str = "1,1,1",
               block: str = "256,1,1", args: str = "", call_ns: int = 4000, gap_ns: int = 1000, stack: str = "",
               api: str = "cudaLaunchKernel") -> None:
        """A kernel launch call and the kernel it runs (``us`` µs on the device)."""
        s = self.stream if stream is None else stream
        self.corr += 1
        self._api(api, call_ns, gap_ns, stream=s, correlation=self.corr, stack=stack)
        start = max(self.t, self.dev_t)
        self.dev_t = start + int(us * 1000)
        self.rows.append({"kind": "kernel", "name": kernel, "pid": self.pid, "device": self.device, "stream": s,
                          "start_ns": start, "end_ns": self.dev_t, "correlation": self.corr, "grid": grid,
                          "block": block, "args": args})

    def copy(self, api: str = "cudaMemcpyAsync", copy_kind: str = "HtoD", host_memory: str = "pageable",
             stream: int | None = None, us: float = 1.5, nbytes: int = 64, stack: str = "") -> None:
        """A copy call and its memcpy row (synchronous copies wait for the device)."""
        s = self.stream if stream is None else stream
        self.corr += 1
        sync = not api.endswith("Async")
        if sync:
            self.t = max(self.t, self.dev_t)
        self._api(api, 3000, 1000, stream=s, correlation=self.corr, stack=stack)
        start = max(self.t, self.dev_t)
        self.dev_t = start + int(us * 1000)
        self.rows.append({"kind": "memcpy", "name": f"memcpy {copy_kind}", "pid": self.pid, "device": self.device,
                          "stream": s, "start_ns": start, "end_ns": self.dev_t, "correlation": self.corr,
                          "copy_kind": copy_kind, "host_memory": host_memory, "bytes": nbytes})
        if sync:
            self.t = max(self.t, self.dev_t)

    def memset(self, api: str = "cudaMemsetAsync", stream: int | None = None, us: float = 1.0, stack: str = "") -> None:
        """A memset call and its memset row."""
        s = self.stream if stream is None else stream
        self.corr += 1
        self._api(api, 3000, 1000, stream=s, correlation=self.corr, stack=stack)
        start = max(self.t, self.dev_t)
        self.dev_t = start + int(us * 1000)
        self.rows.append({"kind": "memset", "name": "memset", "pid": self.pid, "device": self.device, "stream": s,
                          "start_ns": start, "end_ns": self.dev_t, "correlation": self.corr, "bytes": 1024})

    def call(self, name: str, *, stream: int = -1, event: int = -1, dur_ns: int = 2000, gap_ns: int = 1000,
             waits: bool = False, tid: int | None = None, stack: str = "") -> None:
        """Any other API call; ``waits``: the host waits for the device first (a synchronize)."""
        if waits:
            self.t += gap_ns
            start = self.t
            self.t = max(self.t, self.dev_t)
            row = {"kind": "api", "name": name, "domain": "runtime", "pid": self.pid,
                   "tid": self.tid if tid is None else tid, "stream": stream, "event": event, "start_ns": start,
                   "end_ns": self.t + dur_ns, "stack": stack, "nvtx_path": "/".join(n for n, _ in self.nvtx_open)}
            self.t += dur_ns
            self.rows.append(row)
            return
        self._api(name, dur_ns, gap_ns, stream=stream, tid=tid, event=event, stack=stack)

    def pause(self, ns: int) -> None:
        """Host work with no CUDA call (Python between steps)."""
        self.t += ns

    # ------------------------------------------------------------------ NVTX
    def push(self, name: str, domain: str = "") -> None:
        self.nvtx_open.append((name, (self.t, domain)))

    def pop(self) -> None:
        name, (start, domain) = self.nvtx_open.pop()
        self.rows.append({"kind": "nvtx", "name": name, "domain": domain, "pid": self.pid, "tid": self.tid,
                          "start_ns": start, "end_ns": self.t, "nvtx_path": "/".join(n for n, _ in self.nvtx_open)})

    def table(self, source: str = "synthetic.json", tool: str = "synthetic") -> EventTable:
        """The event table of everything built so far (open NVTX ranges: ``end_ns`` -1)."""
        rows = list(self.rows)
        for name, (start, domain) in self.nvtx_open:
            rows.append({"kind": "nvtx", "name": name, "domain": domain, "pid": self.pid, "tid": self.tid,
                         "start_ns": start, "end_ns": -1})
        return EventTable(make_frame(rows), source, tool)


def decode_step(b: TraceBuilder, rng, layers: int = 3, pos: int = 0, *, emit: bool = False, sync: bool = True,
                extra=None) -> None:
    """One decode step of a small model: embedding, per layer norm / qkv / rope (position by value) /
    attention (grid grows with the position) / o-proj / mlp, then norm, lm head, argmax, a device-to-
    host copy of the token and a stream synchronize; ``emit``: one more kernel in layer 1 (a
    compressor emitting every few tokens); ``extra(b, layer)``: more calls inside each layer."""
    us = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    b.launch("embed", us(1, 2))
    for layer in range(layers):
        b.launch("rms_norm", us(1, 2))
        b.launch("qkv_gemv", us(5, 8))
        b.launch("rope", us(1, 2), args=f"pos={pos}")
        b.launch("attention", us(3, 5), grid=f"{(pos // 4) + 1},1,1")
        if emit and layer == 1:
            b.launch("compress_emit", us(1, 2))
        if extra is not None:
            extra(b, layer)
        b.launch("o_proj", us(4, 6))
        b.launch("mlp", us(8, 12))
    b.launch("final_norm", us(1, 2))
    b.launch("lm_head", us(10, 14))
    b.launch("argmax", us(1, 2))
    if sync:
        b.copy("cudaMemcpyAsync", "DtoH", "pageable")
        b.call("cudaStreamSynchronize", stream=b.stream, waits=True)
        b.pause(int(rng.integers(40_000, 60_000)))  # sampling and the loop on the host


def user_loop(*, tokens: int = 8, inflate: float = 1.0, outside_us: float = 20.0, kernels: int = 10,
              kernel_us: float = 5.0, step_tail_us: float = 4.0, asks: bool = False, mask_us: float = 0.0,
              name: str = "decode_step", t0: int = 1_000_000) -> TraceBuilder:
    """A user's decode loop as ``ds4lab audit run`` records it: per token the loop writes the step's input (a
    ``fill_pos`` kernel of 1 µs), runs the step inside the NVTX range ``name`` (``kernels`` launches of
    ``kernel_us`` µs, then ``step_tail_us`` of the step's own Python after its last call), then launches its
    ``argmax`` (3 µs) and does its own Python; the loop never waits. ``outside_us``: the host µs from a range's
    end to the next range's start, untraced (at least 10: the two launches' calls and gaps). Every host time is
    multiplied by ``inflate`` (a tracer's cost on every call and around it: 1 is the loop untraced); device
    times are not. ``asks``: the step asks whether the stream captures (``cudaStreamIsCapturing``);
    ``mask_us``: one more kernel of that many µs in the step (a capture path's mask)."""
    b = TraceBuilder(t0=t0)
    x = inflate
    ns = lambda us: int(round(us * 1000 * x))  # noqa: E731
    rest = outside_us - 10.0
    for _ in range(tokens):
        b.launch("fill_pos", 1.0, call_ns=ns(3), gap_ns=ns(2))
        b.push(name)
        if asks:
            b.call("cudaStreamIsCapturing", stream=b.stream, dur_ns=ns(1), gap_ns=ns(1))
        for k in range(kernels):
            b.launch(f"k{k}", kernel_us, call_ns=ns(4), gap_ns=ns(1))
        if mask_us:
            b.launch("build_causal_mask", mask_us, call_ns=ns(4), gap_ns=ns(1))
        b.pause(ns(step_tail_us))
        b.pop()
        b.launch("argmax", 3.0, call_ns=ns(3), gap_ns=ns(2))
        b.pause(ns(rest))
    return b


def markers_pass(b: TraceBuilder, source: str = "recording.markers.csv.gz", argv=("decode.py",)) -> EventTable:
    """What the markers pass of the loop ``b`` (built untraced, ``inflate=1``) records: its NVTX ranges alone,
    with the header a markers pass writes (``pass``, ``argv``)."""
    t = b.table(source, tool="cupti")
    t.frame = t.frame[t.frame["kind"] == "nvtx"].reset_index(drop=True)
    t.header = {"pass": "markers", "argv": list(argv), "exit_status": 0}
    return t
