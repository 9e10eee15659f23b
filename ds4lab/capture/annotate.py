"""NVTX ranges: one domain ``ds4lab``, one category per cluster, the layer (and position) as the integer payload;
annotation off makes no NVTX call at all (:class:`NullAnnotator`)."""

from __future__ import annotations

#: Clusters of one decode layer, in launch order (context file, "Anatomy of one decode layer").
CLUSTERS = ("token", "layer", "embed", "hc_attn", "query", "kv", "attention", "output",
            "hc_ffn", "router", "moe", "shared", "final", "profile")

_COLORS = {
    "token": 0x4C72B0, "layer": 0x8172B2, "embed": 0x937860, "hc_attn": 0xCCB974,
    "query": 0x64B5CD, "kv": 0x55A868, "attention": 0xC44E52, "output": 0xDD8452,
    "hc_ffn": 0xCCB974, "router": 0xDA8BC3, "moe": 0xD62728, "shared": 0x2CA02C,
    "final": 0x7F7F7F, "profile": 0x17BECF,
}


class NullAnnotator:
    """Annotation off: every method does nothing."""

    enabled = False

    def push(self, message: str, cluster: str, payload: int | None = None) -> None:
        pass

    def pop(self) -> None:
        pass


_MISSING = object()


def _noop_push(attributes, handle) -> None:
    pass


def _noop_pop(handle) -> None:
    pass


class NvtxAnnotator:
    """Pushes and pops NVTX ranges in the ``ds4lab`` domain; event attributes built once per (message, cluster,
    payload), the expensive part from Python. With no NVTX tool attached, push and pop do nothing. Raises ImportError:
    when the ``nvtx`` package is missing (it is a declared dependency)."""

    enabled = True
    DOMAIN = "ds4lab"

    def __init__(self) -> None:
        import nvtx  # a required dependency; imported here so a missing one names itself

        self._domain = nvtx.get_domain(self.DOMAIN)
        self._categories = {c: self._domain.get_category_id(c) for c in CLUSTERS}
        self._attrs: dict[tuple, object] = {}
        handle = getattr(self._domain, "handle", None)
        try:
            from nvtx._lib import lib as _lib

            push, pop = _lib.push_range, _lib.pop_range
        except (ImportError, AttributeError):  # another nvtx layout: the domain's own methods
            push = pop = None
        if handle is None:
            #: True when a tool attached and ranges are recorded.
            self.recording = False
            self._push, self._pop, self._h = _noop_push, _noop_pop, None
        elif push is None:
            self.recording = True
            d = self._domain
            self._push, self._pop, self._h = (lambda a, h: d.push_range(a)), (lambda h: d.pop_range()), handle
        else:
            self.recording = True
            self._push, self._pop, self._h = push, pop, handle

    def attributes(self, message: str, cluster: str, payload: int | None = None):
        """The cached event attributes of a range (``None`` from a disabled domain)."""
        key = (message, cluster, payload)
        a = self._attrs.get(key, _MISSING)
        if a is _MISSING:
            a = self._domain.get_event_attributes(
                message=message, color=_COLORS.get(cluster, 0x999999),
                category=self._categories.get(cluster), payload=payload)
            self._attrs[key] = a
        return a

    def push(self, message: str, cluster: str, payload: int | None = None) -> None:
        a = self._attrs.get((message, cluster, payload), _MISSING)
        if a is _MISSING:
            a = self.attributes(message, cluster, payload)
        self._push(a, self._h)

    def pop(self) -> None:
        self._pop(self._h)


def make_annotator(enabled: bool):
    """An :class:`NvtxAnnotator` when ``enabled``, else a :class:`NullAnnotator`."""
    return NvtxAnnotator() if enabled else NullAnnotator()
